-- remax.settings.config: a run's settings resolved: a recipe's table merged with `--key value`
-- command-line overrides, each value checked against its record (remax.settings.records, where
-- every setting is declared once), then the checks across settings, the derived values and the
-- notes at the start, all computed from the records; `--help` and config.json's copy too.
--
--   local cfg = config.resolve(recipe_table, config.parse_args({"--learning_rate", "3e-5"}), {where = "recipes/x.lua"})
--   print(config.help(cfg))
--
-- The choices of `algo` and `loss_type` are the step's records (remax.settings.registry), handed
-- over by remax.step.algos.register() before the first resolve.
local records = require("remax.settings.records")
local schema = require("remax.settings.schema")
local registry = require("remax.settings.registry")

local M = {}

M.groups, M.derived = records.groups, records.derived
M.keys, M.order, M.alias_of = {}, {}, {}   -- name -> record, the names in order, alias -> name
for _, group in ipairs(M.groups) do
  for _, decl in ipairs(group.settings) do
    assert(not M.keys[decl.name], "settings: " .. decl.name .. " has two records")
    M.keys[decl.name] = decl
    M.order[#M.order + 1] = decl.name
    for _, a in ipairs(decl.aliases or {}) do M.alias_of[a] = decl.name end
  end
end
-- settings whose file paths config.json records as absolute paths (data files)
M.recorded_paths = {}
for _, k in ipairs(M.order) do if M.keys[k].type == "data" then M.recorded_paths[k] = true end end

M.not_supported = records.not_in_remax
M.show = schema.text
local show = schema.text

---------------------------------------------------------------------------- suggestions

function M.edit_distance(a, b)
  local prev = {}
  for j = 0, #b do prev[j] = j end
  for i = 1, #a do
    local cur = { [0] = i }
    for j = 1, #b do
      local cost = a:sub(i, i) == b:sub(j, j) and 0 or 1
      cur[j] = math.min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + cost)
    end
    prev = cur
  end
  return prev[#b]
end

function M.closest(name)
  local best, bd = nil, math.huge
  for _, k in ipairs(M.order) do
    local d = M.edit_distance(name, k)
    -- a key that contains the typed name (or the reverse) is a better guess than its distance says
    if k:find(name, 1, true) or name:find(k, 1, true) then d = math.min(d, math.abs(#k - #name) * 0.5) end
    if d < bd then best, bd = k, d end
  end
  return best
end

local function unknown(name, where)
  local prefix = where and (where .. ": ") or ""
  local why = M.not_supported[name] or (name:match("^vllm_") and M.not_supported.use_vllm)
  if why then return ("%s%s is not a remax setting: %s"):format(prefix, name, why) end
  -- a suggestion only when it is close: an unrelated key would mislead
  local guess = M.closest(name)
  if guess and M.edit_distance(name, guess) <= math.max(2, math.floor(#name / 3)) then
    return ("%sunknown setting '%s'; did you mean '%s'? (remax run RECIPE.lua --help lists every setting)")
      :format(prefix, name, guess)
  end
  return ("%sunknown setting '%s' (remax run RECIPE.lua --help lists every setting)"):format(prefix, name)
end


-- A setting given in one place under its own name and an alias (TRL's) too: one is enough.
-- seen[name] = the name it was given as.
local function given_twice(seen, as, decl, where)
  local earlier = seen[decl.name]
  if earlier and earlier ~= as then
    local alias = earlier == decl.name and as or earlier
    error(("%s: %s and %s are the same setting (%s is TRL's name for it); give one of them"):format(where, decl.name,
      alias, alias), 0)
  end
  seen[decl.name] = as
end

---------------------------------------------------------------------------- records

-- A setting's type in words: an enum's choices (remax|grpo|...), else its type.
function M.type_text(decl)
  if decl.type == "enum" then return table.concat(schema.choices_of(decl), "|") end
  return decl.type
end

-- A setting's help. `algo`'s lists the algorithms, each in its own words (its record's choice),
-- those with the same words together: "remax, grpo (...), sft (...), or reward (...)".
function M.help_of(decl)
  if decl.help then return decl.help end
  local groups = {}
  for _, a in ipairs(registry.list("algorithms")) do
    local last = groups[#groups]
    if last and last.words == a.choice then last.names[#last.names + 1] = a.name
    else groups[#groups + 1] = { names = { a.name }, words = a.choice } end
  end
  local parts = {}
  for i, g in ipairs(groups) do
    parts[i] = ("%s%s (%s)"):format((i == #groups and i > 1) and "or " or "", table.concat(g.names, ", "), g.words)
  end
  return table.concat(parts, ", ")
end

local RECIPE_ONLY = { table = true, ["function"] = true, advantage = true, environment = true }

-- Parse a command-line string into the key's type.
function M.parse(decl, s)
  local t = decl.type
  local function bad(expected)
    error(("--%s %s: expected %s"):format(decl.name, s == nil and "(no value)" or ("'" .. s .. "'"), expected), 0)
  end
  if RECIPE_ONLY[t] then
    error(("--%s: %s can only be set in the recipe"):format(decl.name, decl.name), 0)
  end
  if s == nil then bad("a value") end
  if t == "number" or t == "integer" then
    local v = tonumber(s)
    if not v or v ~= v then bad(t == "number" and "a number" or "an integer") end
    if t == "integer" and (v ~= math.floor(v) or v < 0) then bad("an integer >= 0") end
    return v
  elseif t == "boolean" then
    local l = s:lower()
    if l == "true" or l == "1" or l == "yes" then return true end
    if l == "false" or l == "0" or l == "no" then return false end
    bad("true or false")
  elseif t == "numbers" then
    local out = {}
    for part in (s .. ","):gmatch("([^,]*),") do
      local v = tonumber(part)
      if not v then bad("a comma-separated list of numbers (e.g. 1,0.5)") end
      out[#out + 1] = v
    end
    return out
  elseif t == "strings" or t == "rewards" then
    local out = {}
    for part in s:gmatch("[^,]+") do out[#out + 1] = part end
    if #out == 0 then bad("a comma-separated list") end
    return out
  end
  return schema.check_type(decl, s, "command line")
end

-- A value given under an alias that counts otherwise (a record's alias_values): checked against the
-- alias's own range, then translated into the setting's value.
local function from_alias(decl, key, v, source)
  local conv = decl.alias_values and decl.alias_values[key]
  if not conv then return v end
  local as_given = { name = key, type = decl.type, range = conv.range }
  v = schema.check_type(as_given, v, source)
  local problem = schema.value_problem(as_given, v)
  if problem then error(schema.refusal(source, key, v, problem), 0) end
  return conv.value(v)
end

-- Command-line arguments -> {key = value}, in order. `--key value`, `--key=value`, and a bare
-- `--flag` for booleans. Returns overrides, help_requested.
function M.parse_args(argv)
  local out, help, i, seen = {}, false, 1, {}
  while i <= #argv do
    local a = argv[i]
    if a == "--help" or a == "-h" then
      help = true
      i = i + 1
    else
      local key, value = a:match("^%-%-([%w_%-]+)=(.*)$")
      if not key then key = a:match("^%-%-([%w_%-]+)$") end
      if not key then
        error(("unexpected argument '%s' (settings are given as --key value)"):format(a), 0)
      end
      key = key:gsub("%-", "_")   -- --max-steps is --max_steps
      local decl = M.keys[key] or M.keys[M.alias_of[key]]
      if not decl then error(unknown(key, "command line"), 0) end
      given_twice(seen, key, decl, "command line")
      if value == nil then
        local nxt = argv[i + 1]
        if decl.type == "boolean" and (nxt == nil or nxt:match("^%-%-")) then
          value = "true"
          i = i + 1
        else
          value = nxt
          i = i + 2
        end
      else
        i = i + 1
      end
      out[decl.name] = from_alias(decl, key, M.parse(decl, value), "command line")
    end
  end
  return out, help
end

-- recipe table + overrides -> resolved config (a table with every key; defaults filled in).
-- Recipe keys that are not settings stop with the closest valid name. opts.where names the recipe.
-- Every value is checked here once, before anything is loaded: its type, then what its record
-- allows, then the checks across settings (records' check). A refusal names the setting, the
-- value and its source: "recipes/x.lua:7", "command line" or "default". (The memory a step's
-- generation needs is checked by the Run, which reads the model's config: remax.run.setup.)
function M.resolve(recipe, overrides, opts)
  opts = opts or {}
  recipe = recipe or {}
  registry.list("algorithms")   -- the step's records are there (a clear error when not)
  local cfg, sources = {}, {}
  local where = opts.where or "recipe"
  schema.forget_recipes()
  local function recipe_source(k)
    local line = schema.recipe_line(opts.where, k)
    return line and (where .. ":" .. line) or where
  end
  local function take(k, v, source, seen)
    local decl = M.keys[k] or M.keys[M.alias_of[k]]
    if not decl then error(unknown(k, source), 0) end
    given_twice(seen, k, decl, source)
    v = schema.check_type(decl, from_alias(decl, k, v, source), source)
    local problem = schema.value_problem(decl, v)
    if problem then error(schema.refusal(source, k, v, problem), 0) end
    cfg[decl.name], sources[decl.name] = v, source
  end
  local in_recipe, on_command_line = {}, {}
  for k, v in pairs(recipe) do
    if type(k) ~= "string" then
      error(("%s: the recipe table has a non-string key %s; settings are name = value"):format(where, tostring(k)), 0)
    end
    take(k, v, recipe_source(k), in_recipe)
  end
  for k, v in pairs(overrides or {}) do take(k, v, "command line", on_command_line) end
  for _, k in ipairs(M.order) do
    local d = M.keys[k].default
    if cfg[k] == nil and d ~= nil then
      sources[k] = "default"
      if type(d) == "table" then
        local c = {}
        for i, x in ipairs(d) do c[i] = x end
        d = c
      end
      cfg[k] = d
    end
  end
  for _, k in ipairs(M.order) do   -- defaults that follow other settings
    local decl = M.keys[k]
    if cfg[k] == nil and decl.default_of then
      cfg[k] = decl.default_of(cfg, k)
      if cfg[k] ~= nil then sources[k] = "default" end
    end
  end
  M.sources[cfg] = sources
  M.validate(cfg)
  M.derive(cfg)
  local given = {}
  -- given[name] = true, or the other name it was given under (an alias: said in the notes)
  for k in pairs(recipe) do given[M.alias_of[k] or k] = M.alias_of[k] and k or true end
  for k in pairs(overrides or {}) do given[M.alias_of[k] or k] = M.alias_of[k] and k or true end
  -- num_train_epochs without max_steps: the trainer sets max_steps once it knows the data's size
  cfg.steps_from_epochs = cfg.num_train_epochs ~= nil and not given.max_steps
  -- printed once when a run starts: settings that do nothing here, TRL values that mean otherwise
  cfg.inert_notes = require("remax.settings.inert").notes(cfg, given, overrides or {})
  return cfg
end

-- The values derived from the settings (records.derived: kl_mode, needs_reference, sampling,
-- aggregation, skip_zero_rows, dtype_reason), decided here once and again by a hot reload that
-- changes a setting they depend on. Fields of cfg outside M.order.
function M.derive(cfg)
  for _, d in ipairs(M.derived) do cfg[d.name] = d.value(cfg) end
  return cfg
end

-- Where the value of a key of a resolved cfg came from: "recipes/x.lua:7", "command line",
-- "default" (a cfg that config.resolve did not make: "config").
M.sources = setmetatable({}, { __mode = "k" })
function M.source(cfg, key)
  local s = M.sources[cfg]
  return s and s[key] or "config"
end

-- The checks across settings, each its record's (records' check), in the records' order. A
-- refusal starts with the source of the setting it blames.
function M.validate(cfg)
  local function source(k) return M.source(cfg, k) end
  for _, k in ipairs(M.order) do
    local check = M.keys[k].check
    if check then
      local msg, key = check(cfg, source)
      if msg then error(("%s: %s"):format(source(key or k), msg), 0) end
    end
  end
end

-- A JSON-safe copy (functions become "function (file:line)", reward tables their names).
-- Data files are recorded with absolute paths (a relative one is resolved from the current
-- folder, as the run read it), so that --resume works from any folder.
function M.serializable(cfg)
  local out = {}
  for _, k in ipairs(M.order) do
    local v = cfg[k]
    if M.recorded_paths[k] and type(v) == "string" then v = require("remax.bind.fs").absolute(v)
    elseif type(v) == "function" then v = show(v)
    elseif k == "rewards" and type(v) == "table" then
      local names = {}
      for i, x in ipairs(v) do names[i] = type(x) == "string" and x or show({ x }) end
      v = names
    end
    out[k] = v
  end
  return out
end

-- The --help text: every setting with its resolved value, default and meaning.
function M.help(cfg, title)
  local lines = { title or "settings (recipe values, then --key value overrides):" }
  for _, group in ipairs(M.groups) do
    lines[#lines + 1] = ""
    lines[#lines + 1] = group.name .. ":"
    for _, decl in ipairs(group.settings) do
      local value, default = show(cfg and cfg[decl.name]), show(decl.default)
      local mark = value ~= default and " *" or ""
      local range = schema.range_of(decl)
      lines[#lines + 1] = ("  --%-28s %s%s  (default %s; %s%s)"):format(decl.name, value, mark, default,
        M.type_text(decl), range and (" in " .. range) or "")
      lines[#lines + 1] = "      " .. M.help_of(decl)
    end
  end
  lines[#lines + 1] = ""
  lines[#lines + 1] = "* = differs from the default. Lists: --reward_weights 1,0.5. Booleans: true/false."
  return table.concat(lines, "\n")
end

return M
