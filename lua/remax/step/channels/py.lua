-- remax.step.channels.py: "py:FILE.py[:NAME]", a function (a reward, a tool) or a class (an
-- environment) of a Python file, served by remax's one Python harness (harness.py beside this
-- file) in a long-lived worker process: one per file and registry. $REMAX_PYTHON names another
-- interpreter than python3. The file is found as given, or beside the recipe (opts.base).
local fs = require("remax.bind.fs")
local worker = require("remax.step.channels.worker")

local M = {}

-- "py:FILE.py[:NAME]" -> FILE.py, NAME (nil when not given); raises when it is not that form.
function M.parse(spec)
  local rest = spec:sub(4)
  local file, name = rest:match("^(.-%.py):([%a_][%w_]*)$")
  file = file or rest
  if not file:match("%.py$") then error("expected py:FILE.py or py:FILE.py:NAME (a function or class of the file)", 0) end
  return file, name
end

-- A file given relative to the recipe is found there too (beside it, or one folder up): the
-- path found, or nil and the paths tried.
function M.find_file(path, base)
  if fs.exists(path) then return path end
  local tried = { path }
  for _, p in ipairs(base and { base .. "/" .. path, base .. "/../" .. path } or {}) do
    if fs.exists(p) then return p end
    tried[#tried + 1] = p
  end
  return nil, tried
end

local function file_of(spec, base)
  local file = M.parse(spec)
  local found, tried = M.find_file(file, base)
  if not found then error(("no such file (looked at %s)"):format(table.concat(tried, ", ")), 0) end
  return found
end

-- The key of the spec's channel: its file's worker serves every name of the file.
function M.key(spec, o) return "py:" .. file_of(spec, o.base) end

local harness
local function harness_text()
  if not harness then
    local here = debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or "."
    harness = fs.read_text(here .. "/harness.py")
    if not harness then error(("the Python harness %s/harness.py is missing from this remax"):format(here), 0) end
  end
  return harness
end

-- o: base, max_line, restarts.
function M.open(spec, o)
  local file = file_of(spec, o.base)
  return worker.new({ spec = "py:" .. file, label = "the worker py:" .. file, hello = true, max_line = o.max_line,
    restarts = o.restarts, argv = { os.getenv("REMAX_PYTHON") or "python3", "-u", "-c", harness_text(), file } })
end

return M
