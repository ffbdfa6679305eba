-- remax.cli.errors: what the user reads when a command stops. Every message the command line
-- prints comes through M.message: a user error (a file, key or value named by the code that
-- raised it) is printed as it is, without a Lua source position in front; a fault inside remax
-- (a Lua runtime error in remax's own sources, an empty message, an error that is not text)
-- says it is an internal error and asks for a report, with the position after the message.
-- While a command runs, os.exit is trapped (remax.step.guard): user code that calls it raises
-- instead, and the run stops through its normal failure path with a message naming the caller.
--
--   os.exit = errors.trapped_exit               -- installed by the command line
--   local ok, e = xpcall(f, errors.handler)     -- e: the text to print after "remax: "
local M = {}

M.REPORT = "this is a bug in remax: please report it with the command line and the files it read"

-- Lua's own runtime errors (and LuaJIT's FFI's): a message with one of these after a position in
-- remax's sources is a fault in remax, not a message written for the user.
M.FAULTS = {
  "^attempt to ", "^bad argument #", "^table overflow", "^not enough memory", "^stack overflow",
  "^C stack overflow", "^table index is ", "^invalid key to 'next'", "^'for' ", "^string length overflow",
  "^number has no integer representation", "^wrong number of arguments", "^invalid value %(at index",
  "^cannot convert ", "^cannot resolve symbol", "^loop or previous error", "^malformed pattern",
  "^invalid capture index", "^invalid pattern capture", "^unfinished capture", "^missing '%[' ",
  "^invalid option ", "^assertion failed!$", "^bad light userdata", "^cannot open file",
  "^error in error handling", "^too many ", "^size of C type is unknown", "^invalid C type",
  "^'%w+' expected", "^unexpected symbol", "^ambiguous syntax", "^unknown field", "^table too big",
  "has no member named", "^missing declaration for symbol", "^undeclared identifier", "^invalid C type",
}

local function is_fault(text)
  for _, p in ipairs(M.FAULTS) do if text:find(p) then return true end end
  return false
end

-- "lua/remax/formats/data.lua:164: text" -> "lua/remax/formats/data.lua:164", "text" (a position in
-- remax's own Lua sources), else nil.
function M.split_position(msg)
  local pos, rest = msg:match("^([^%s:]*remax/[^%s:]+%.lua:%d+): (.*)$")
  if not pos then pos, rest = msg:match("^([^%s:]*remax/[^%s:]+%.lua:%d+):?%s*$"), "" end
  return pos, rest
end

local function internal(text, pos)
  return ("internal error: %s%s; %s"):format(text, pos and (" (at " .. pos .. ")") or "", M.REPORT)
end

---------------------------------------------------------------------------- os.exit

local guard = require("remax.step.guard")
M.Exit, M.is_exit, M.trapped_exit, M.real_exit = guard.Exit, guard.is_exit, guard.trapped_exit, guard.real_exit

---------------------------------------------------------------------------- messages

-- The text to print for an error value (without the "remax: " the host puts in front).
-- `raised_at` (optional) is where the error was raised, for an error with nothing to say.
function M.message(e, raised_at)
  if M.is_exit(e) then return tostring(e) end
  if type(e) ~= "string" then
    local mt = getmetatable(e)
    if type(e) == "table" and mt and mt.__tostring then return M.message(tostring(e), raised_at) end
    if type(e) == "number" then return M.message(tostring(e), raised_at) end
    return internal(("an error value that is not text (a %s)"):format(type(e)), raised_at)
  end
  local text = e:gsub("%s+$", "")
  local pos, rest = M.split_position(text)
  if pos then
    rest = rest:gsub("^%s+", "")
    if rest == "" then return internal("an error with an empty message", pos) end
    -- a message raised with error(msg, level) by remax code is a user error with a position in
    -- front that says nothing to the user; a runtime error at that position is a fault
    if is_fault(rest) then return internal(rest, pos) end
    return rest
  end
  if text == "" then return internal("an error with an empty message", raised_at) end
  if text:find("^not enough memory") then
    return "out of memory (LuaJIT's heap is full: a file, a dataset or a batch is larger than this machine can hold)"
  end
  -- a bare "prefix:" with nothing after it: the code that raised it had an empty message to pass
  -- on. A longer message that ends in ':' was written for the user (it names a file, a key, a
  -- value) and only lacks its last detail: it is shown as it is, not called a bug in remax
  if text:find("^[^%s]*:$") then return internal(("an error with nothing after '%s'"):format(text), raised_at) end
  if text == "assertion failed!" then return internal(text, raised_at) end
  return text
end

-- An xpcall message handler: the message to print (REMAX_DEBUG=1 adds the Lua traceback).
function M.handler(e)
  local raised_at
  local info = debug.getinfo(2, "Sl")
  if info and info.currentline and info.currentline > 0 then raised_at = info.short_src .. ":" .. info.currentline end
  local msg = M.message(e, raised_at)
  -- once: the innermost catch (remax.step.guard's handler, the Run's) keeps where it was raised
  if os.getenv("REMAX_DEBUG") and not tostring(msg):find("stack traceback:", 1, true) then msg = debug.traceback(msg, 2) end
  return msg
end

-- Runs f(...) as a command: returns its results, or raises the message to print (level 0, a
-- string) for the host to print after "remax: ". os.exit is trapped while it runs.
function M.run(f, ...)
  os.exit = M.trapped_exit
  local results = { xpcall(f, M.handler, ...) }
  os.exit = M.real_exit
  if not results[1] then error(results[2], 0) end
  return unpack(results, 2, table.maxn(results))
end

return M
