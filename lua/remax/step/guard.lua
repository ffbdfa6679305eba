-- remax.step.guard: user code (a reward, a recipe function, a script run by `remax run`) may not
-- end the process: os.exit is replaced while it runs by trapped_exit, which raises M.Exit naming
-- the caller's file:line and the code. The run then stops through its normal failure path (a
-- failing reward saves the checkpoint of the last finished step), with a message, instead of
-- ending with status 0, no word and no checkpoint.
--
--   local ok, v = guard.pcall(fn, ...)      -- pcall with os.exit trapped
local M = {}

local Exit = {}
Exit.__index = Exit
Exit.__tostring = function(e)
  return ("%s called os.exit(%s): remax does not let a reward, a recipe or a script end the process " ..
    "(the run would stop without a word or a checkpoint); return a value, or raise error(\"why\") to stop with a message")
    :format(e.where, e.code == nil and "" or tostring(e.code))
end
M.Exit = Exit

function M.is_exit(e) return getmetatable(e) == Exit end

M.real_exit = os.exit

-- Stands in for os.exit: raises M.Exit naming the caller's file:line.
function M.trapped_exit(code)
  local info = debug.getinfo(2, "Sl")
  local where = info and info.currentline and info.currentline > 0 and (info.short_src .. ":" .. info.currentline)
    or (info and info.short_src) or "a C function"
  error(setmetatable({ code = code, where = where }, Exit), 0)
end

-- With REMAX_DEBUG set, an error caught here keeps the Lua traceback of where it was raised
-- (an xpcall handler; the Run's own catches use it too).
local function handler(e)
  if type(e) == "string" and os.getenv("REMAX_DEBUG") and not e:find("stack traceback:", 1, true) then
    return debug.traceback(e, 2)
  end
  return e
end
M.traceback = handler

-- f(...) under pcall with os.exit trapped (and put back after, whatever it was).
function M.pcall(f, ...)
  local before = os.exit
  os.exit = M.trapped_exit
  local results = { xpcall(f, handler, ...) }
  os.exit = before
  return unpack(results, 1, table.maxn(results))
end

return M
