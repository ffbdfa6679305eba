-- remax.settings.inert: settings that do nothing under the others a run chose (scale_rewards under
-- ReMax, epsilon with num_iterations = 1, lora_r without use_lora, ...). A run given one says so
-- once, at the start, instead of silently ignoring it. See docs/trainer.md. It also says where a
-- value copied from TRL means something else here (a record's note; M.data_notes once the data is
-- loaded): see docs/trainer.md, "Coming from TRL".
--
--   local lines = inert.notes(cfg, given, cli)   -- given[key] = true for keys the recipe or command line set
--
-- All of it comes from the records: a setting's inert rules (remax.settings.records), and the
-- settings an algorithm or a loss type alone reads (their records' settings lists).
local records = require("remax.settings.records")
local registry = require("remax.settings.registry")
local schema = require("remax.settings.schema")

local M = {}

local function same(a, b)
  if type(a) == "table" and type(b) == "table" then
    if #a ~= #b then return false end
    for i = 1, #a do if a[i] ~= b[i] then return false end end
    return true
  end
  return a == b
end

-- The records of a registry ("algorithms", "loss_types") whose settings list holds name.
local function owners(kind, name)
  local out = {}
  for _, r in ipairs(registry.list(kind)) do
    for _, s in ipairs(r.settings or {}) do if s == name then out[#out + 1] = r end end
  end
  return out
end

local function names(list)
  local out = {}
  for i, r in ipairs(list) do out[i] = r.name end
  return table.concat(out, " or ")
end

-- Why decl does nothing under cfg, or nil when it acts: an algorithm's own setting under another
-- algorithm (or under a recipe's advantage function, which replaces the estimator), a loss type's
-- own setting under another loss type, then the record's inert rules, the first that fails.
function M.why(cfg, decl)
  local by = owners("algorithms", decl.name)
  if #by > 0 then
    local acts = false
    for _, a in ipairs(by) do
      if a.name == cfg.algo and not (a.estimator and cfg.advantage) then acts = true end
    end
    if not acts then return ("only algo = %s uses it"):format(names(by)) end
  end
  by = owners("loss_types", decl.name)
  if #by > 0 then
    local acts = false
    for _, l in ipairs(by) do if l.name == cfg.loss_type then acts = true end end
    if not acts then return ("only loss_type = %s uses it"):format(names(by)) end
  end
  local rules = decl.inert
  if rules and rules.when then rules = { rules } end
  for _, rule in ipairs(rules or {}) do
    if not rule.when(cfg, decl.name) then
      return type(rule.note) == "function" and rule.note(cfg, decl.name) or rule.note
    end
  end
  return nil
end

-- The lines to say at the start: one per setting that was given a value other than its default
-- and does nothing under this config, then the records' notes (TRL values that mean otherwise
-- here). given: keys the recipe or command line set; cli: the command line's settings.
function M.notes(cfg, given, cli)
  local out = {}
  for _, group in ipairs(records.groups) do
    for _, decl in ipairs(group.settings) do
      local k = decl.name
      if given[k] and not same(cfg[k], decl.default) then
        local why = M.why(cfg, decl)
        -- given under another project's name (TRL's): say that name, as the user wrote it
        local as = type(given[k]) == "string" and given[k] ~= k and (" (%s)"):format(k) or ""
        if why then out[#out + 1] = ("note: %s%s = %s has no effect here: %s"):format(type(given[k]) == "string" and given[k] or k,
          as, schema.text(cfg[k]), why) end
      end
    end
  end
  for _, group in ipairs(records.groups) do
    for _, decl in ipairs(group.settings) do
      local line = decl.note and decl.note(cfg, given, cli or {})
      if line then out[#out + 1] = line end
    end
  end
  return out
end

-- Notes about the training rows of a data file, once they are loaded: plain-string prompts
-- (TRL's standard, non-conversational format, which TRL passes to the model as written) are
-- rendered here as one user message through the chat template. Nothing to say under
-- chat_template = "plain", which leaves a string as it is. (A recipe's data function makes rows
-- for its own template: not said.)
function M.data_notes(rows, template_name, source)
  local first = rows and rows[1]
  if not first or type(first.prompt) ~= "string" or template_name == "plain" then return {} end
  local line = ("note: the prompts of %s are plain strings (TRL's standard format, which TRL passes to the model as "
    .. "written); remax renders each as one user message through the chat template '%s'. For the text as written, "
    .. "set chat_template = \"plain\""):format(source or "the data", tostring(template_name))
  if template_name == "qa" and first.prompt:match("^%s*Question:") then
    line = line .. (" (the prompts already start with \"Question:\", and the qa template adds another)")
  end
  return { line }
end

return M
