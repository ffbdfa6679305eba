-- remax.step.preferences: preference pairs for a reward model (algo = "reward"), in TRL's
-- format: each row has a chosen and a rejected side, as plain text or as lists of
-- {role=, content=} messages (conversational), an optional shared prompt (a string or
-- messages; without one each side is the whole text or conversation) and an optional numeric
-- margin (the Bradley-Terry loss then wants r_chosen - r_rejected >= margin). Column names map
-- as the prompt datasets' do (prompt_column, chosen_column, rejected_column, margin_column).
--
--   {"chosen": "The sky is blue.", "rejected": "The sky is green."}
--   {"prompt": "What color is the sky?", "chosen": "Blue.", "rejected": "Green.", "margin": 1.5}
--   {"chosen": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}],
--    "rejected": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Go away."}]}
--
-- A bad row stops with its file, line and column: a missing side, an empty side, both sides the
-- same, a margin that is not a number.
local cjson = require("cjson")
local chat = require("remax.text.chat")
local data = require("remax.formats.data")

local M = {}


-- A canonical text of a side (string or messages), to tell identical sides apart.
local function canonical(v)
  if type(v) == "string" then return "s:" .. v end
  local parts = {}
  for i, m in ipairs(v) do parts[i] = tostring(m.role) .. "\0" .. tostring(m.content) end
  return "m:" .. table.concat(parts, "\1")
end

local function check_side(v, where, what)
  if v == nil or v == cjson.null then return ("%s: %s is %s"):format(where, what, v == nil and "missing" or "null") end
  if type(v) == "string" then
    if not v:find("%S") then return ("%s: %s is %s; a pair needs text on both sides"):format(where, what,
      v == "" and "empty" or "only white space") end
    data.check_utf8(v, where, what)
    return nil
  end
  local ok, err = chat.check_messages(v)
  if not ok then return ("%s: %s: %s"):format(where, what, err) end
  local said = false
  for m, msg in ipairs(v) do
    data.check_utf8(msg.content, where, ("%s, message %d"):format(what, m))
    said = said or msg.content:find("%S") ~= nil
  end
  if not said then return ("%s: %s: every message's content is empty; a pair needs text on both sides"):format(where, what) end
  return nil
end

-- Rows {prompt=, chosen=, rejected=, margin=, where=} from records {value=, where=}. map:
-- prompt, chosen, rejected, margin (column names; defaults prompt, chosen, rejected, margin).
function M.build(records, map, source)
  map = map or {}
  local pc, cc, rc, mc = map.prompt or "prompt", map.chosen or "chosen", map.rejected or "rejected", map.margin or "margin"
  if #records == 0 then error(("remax.preferences: %s has no rows"):format(source), 0) end
  local rows = {}
  for i, rec in ipairs(records) do
    local raw, where = rec.value, rec.where
    if type(raw) ~= "table" or (next(raw) ~= nil and #raw > 0) then
      error(("%s: expected a JSON object per row (a preference pair)"):format(where), 0)
    end
    for _, col in ipairs({ cc, rc }) do
      if raw[col] == nil then
        error(("%s: missing column '%s' (every pair needs '%s' and '%s'); columns: %s"):format(where, col, cc, rc,
          data.column_list(raw)), 0)
      end
    end
    local err = check_side(raw[cc], where, ("column '%s'"):format(cc)) or check_side(raw[rc], where, ("column '%s'"):format(rc))
    if err then error(err, 0) end
    if type(raw[cc]) ~= type(raw[rc]) then
      error(("%s: column '%s' is %s and column '%s' is %s; both sides are text or both are messages"):format(where, cc,
        type(raw[cc]) == "string" and "text" or "messages", rc, type(raw[rc]) == "string" and "text" or "messages"), 0)
    end
    if canonical(raw[cc]) == canonical(raw[rc]) then
      error(("%s: columns '%s' and '%s' are identical; a pair needs two different answers"):format(where, cc, rc), 0)
    end
    local prompt = raw[pc]
    if prompt == cjson.null then prompt = nil end
    if prompt ~= nil then
      local perr = check_side(prompt, where, ("column '%s'"):format(pc))
      if perr then error(perr, 0) end
    end
    local margin = raw[mc]
    if margin == cjson.null then margin = nil end
    if margin ~= nil and (type(margin) ~= "number" or margin ~= margin or math.abs(margin) == math.huge) then
      error(("%s: column '%s' is %s, expected a finite number (the pair's margin)"):format(where, mc,
        type(margin) == "string" and ("the string %q"):format(margin) or tostring(margin)), 0)
    end
    local row = {}
    for k, v in pairs(raw) do if v ~= cjson.null then row[k] = v end end
    row.prompt, row.chosen, row.rejected, row.margin, row.where = prompt, raw[cc], raw[rc], margin, where
    rows[i] = row
  end
  return rows
end

-- A dataset of pairs (remax.formats.data's, with its sampler) from a JSONL / JSON file.
function M.load(path, map)
  if type(path) ~= "string" then error("remax.preferences.load: path must be a string, got " .. type(path), 2) end
  return data.dataset(M.build(data.read_records(path), map, path), path)
end

-- The same checks on rows in memory (a recipe's data function); name says where they came from.
function M.from_rows(rows, map, name)
  name = name or "rows"
  if type(rows) ~= "table" then error(("%s: expected a list of preference pairs, got %s"):format(name, type(rows)), 0) end
  local records = {}
  for i, v in ipairs(rows) do records[i] = { value = v, where = ("%s[%d]"):format(name, i) } end
  return data.dataset(M.build(records, map, name), name)
end

return M
