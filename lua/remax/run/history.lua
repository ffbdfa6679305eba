-- remax.run.history: the record of settings changed while a run ran (hot reloads), kept in the
-- run folder as settings_history.jsonl, one line per reload that changed settings:
--
--   {"step": 16, "source": "recipes/hot.lua", "changes": [{"key": "learning_rate", "was": 1e-06, "now": 5e-06}]}
--
-- "step" is the first step that ran with the new values. config.json always holds the settings
-- in force after the newest reload; a resume undoes the changes of steps past its checkpoint, so
-- it continues with the settings in force at the checkpoint. See docs/runs.md.
local json = require("remax.formats.json")   -- the run folder's JSON lines (remax.run.folder uses the same)
local fs = require("remax.bind.fs")

local M = {}

M.FILE = "settings_history.jsonl"

function M.path(dir) return dir .. "/" .. M.FILE end

-- The rows of a run folder's history, oldest first ({} when there is none).
function M.read(dir)
  if not fs.exists(M.path(dir)) then return {} end
  return json.read_jsonl(M.path(dir))
end

-- Appends one reload's changes {{key =, was =, now =}, ...} that take effect at `step`.
function M.append(dir, step, source, changes)
  local list = {}
  for i, c in ipairs(changes) do list[i] = { key = c.key, was = c.was, now = c.now } end
  local line = json.encode({ step = step, source = source, changes = list }, { precision = "shortest", where = M.FILE })
  local f, err = io.open(M.path(dir), "ab")
  if not f then error(("hot reload: cannot append to %s (%s)"):format(M.path(dir), tostring(err)), 0) end
  f:write(line, "\n")
  f:close()
end

-- `saved` (config.json's table) as it was at the end of step `step`: every change that took
-- effect after it undone, newest first. Returns the table and the list of undone changes.
function M.at_step(saved, rows, step)
  local out, undone = {}, {}
  for k, v in pairs(saved) do out[k] = v end
  for i = #rows, 1, -1 do
    local row = rows[i]
    if type(row.step) == "number" and row.step > step then
      for j = #(row.changes or {}), 1, -1 do
        local c = row.changes[j]
        out[c.key] = c.was
        undone[#undone + 1] = { key = c.key, was = c.now, now = c.was, step = row.step }
      end
    end
  end
  return out, undone
end

-- Drops the rows of steps past `step` (a resumed run decides those again).
function M.truncate(dir, step)
  local rows = M.read(dir)
  local kept = {}
  for _, row in ipairs(rows) do
    if not (type(row.step) == "number" and row.step > step) then kept[#kept + 1] = row end
  end
  if #kept == #rows then return end
  local lines = {}
  for i, row in ipairs(kept) do lines[i] = json.encode(row, { precision = "shortest", where = M.FILE }) .. "\n" end
  fs.write_atomic(M.path(dir), table.concat(lines))
end

return M
