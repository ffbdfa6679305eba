-- remax.settings.recipe: loading a recipe file. A recipe is plain Lua returning a table of settings (see
-- remax.config) plus functions (rewards, chat_template, advantage, loop):
--
--   return {
--     model = "models/tiny-gsm8k", rewards = {"gsm8k"}, learning_rate = 2e-5,
--     advantage = function(groups, opts, state) ... end,        -- optional
--   }
local M = {}

-- Runs the file with args; returns its first result (a recipe when it is a table), and the rest.
-- A syntax error or a runtime error stops with the file:line it happened at.
function M.run_file(path, ...)
  local chunk, err = loadfile(path)
  if not chunk then
    if not io.open(path, "rb") then error(("cannot open recipe %s"):format(path), 0) end
    error(("recipe %s"):format(err), 0)   -- err is "path:line: message"
  end
  local results = { xpcall(chunk, function(e) return e end, ...) }
  if not results[1] then error(("recipe %s failed: %s"):format(path, tostring(results[2])), 0) end
  return unpack(results, 2)
end

-- Load a recipe file that must return a table.
function M.load(path, ...)
  local r = M.run_file(path, ...)
  if type(r) ~= "table" then
    error(("recipe %s returned a %s; a recipe returns a table of settings"):format(path, type(r)), 0)
  end
  return r
end

-- "recipes/gsm8k.lua" -> "gsm8k"
function M.name(path)
  return (path:match("([^/]+)%.lua$") or path:match("([^/]+)$") or "run")
end

return M
