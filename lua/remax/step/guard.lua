-- remax.step.guard: how remax runs a recipe's Lua code (a reward, a tool, an environment's reset
-- and step, a tool-call parser, a script run by `remax run`), so that none of it can hold or end
-- the run.
--
--   local ok, a, b = guard.call(fn, { limit = 10, what = "the tool 'calc'" }, args)
--       -- true, fn's results; or false, why (guard.TIMEOUT, a guard.Exit, the error), seconds
--   local ok, v = guard.pcall(fn, ...)      -- pcall with os.exit trapped (no limit, no hook)
--
-- guard.call is the one mechanism behind every time limit on Lua code (reward_timeout,
-- tool_timeout) and behind Ctrl-C / SIGTERM while such code runs:
--   * a time limit: LuaJIT has no preemption, so a count hook (debug.sethook) looks at a
--     monotonic clock every HOOK_COUNT VM instructions and raises once the limit has passed.
--     LuaJIT's compiled traces do not call hooks, so the JIT is flushed and off while the code
--     runs (on again after, when it was on); LuaJIT's hooks are global, so coroutines the code
--     starts are watched too;
--   * a signal: the same hook looks at remax.bind.signals; code still running SIGNAL_GRACE
--     seconds after Ctrl-C or SIGTERM came is stopped and guard.call raises a guard.Interrupt,
--     which the Run turns into "save the last finished step and stop" (code that returns within
--     the grace lets the step finish, and the Run stops after it as before);
--   * code that catches every error (a retry loop around pcall) cannot swallow either: while it
--     runs, the global pcall, xpcall and coroutine.resume hand the stop on once it is due;
--   * os.exit raises a guard.Exit naming the caller's file:line and what was running, instead of
--     ending the process without a word or a checkpoint;
--   * the code runs in a coroutine of its own: one that yields is an error, not a jump into the
--     caller's coroutine.
-- Limits: a C function that blocks or loops (a socket read, os.execute, a reward model's forward
-- pass, one huge string.rep) cannot be interrupted; a call that overran is reported as a timeout
-- when it returns. A pcall saved before the call (`local pcall = pcall` at the top of a file) can
-- swallow a stop once, but the hook raises it again at its next look.
local M = {}

local raw_pcall, raw_xpcall, raw_resume, raw_create, raw_status = pcall, xpcall, coroutine.resume, coroutine.create,
  coroutine.status

---------------------------------------------------------------------------- os.exit

local Exit = {}
Exit.__index = Exit
Exit.__tostring = function(e)
  return ("%s called os.exit(%s)%s: remax does not let recipe code end the process (the run would stop without a " ..
    "word or a checkpoint); return a value, or raise error(\"why\") to stop with a message")
    :format(e.where, e.code == nil and "" or tostring(e.code), e.what and (" in " .. e.what) or "")
end
M.Exit = Exit

function M.is_exit(e) return getmetatable(e) == Exit end

M.real_exit = os.exit

local active   -- the innermost guard.call running: { deadline, what, stop, outer }

-- Stands in for os.exit: raises M.Exit naming the caller's file:line (and what was running).
function M.trapped_exit(code)
  local info = debug.getinfo(2, "Sl")
  local where = info and info.currentline and info.currentline > 0 and (info.short_src .. ":" .. info.currentline)
    or (info and info.short_src) or "a C function"
  error(setmetatable({ code = code, where = where, what = active and active.what }, Exit), 0)
end

---------------------------------------------------------------------------- stops

-- The time limit passed (guard.call returns it as its second value).
M.TIMEOUT = setmetatable({}, { __tostring = function() return "the time limit passed" end })

-- Ctrl-C or SIGTERM came while recipe code ran (raised by guard.call, never returned).
local Interrupt = {}
Interrupt.__index = Interrupt
Interrupt.__tostring = function(e)
  return ("interrupted (Ctrl-C or SIGTERM) while %s ran"):format(e.what or "recipe code")
end
M.Interrupt = Interrupt
function M.is_interrupt(e) return getmetatable(e) == Interrupt end

M.HOOK_COUNT = 10000    -- VM instructions between two looks at the clock and the signals
M.SIGNAL_GRACE = 1      -- seconds recipe code may still run after Ctrl-C or SIGTERM

-- Fields, so that a test can stand in a clock or a signal of its own.
M.clock = require("remax.bind.clock").now
M.signal_pending = require("remax.bind.signals").pending

local signal_seen   -- when a pending signal was first seen (nil: none pending)

-- Whether a signal came over SIGNAL_GRACE seconds ago.
local function signal_due()
  if not M.signal_pending() then signal_seen = nil; return false end
  local t = M.clock()
  signal_seen = signal_seen or t
  return t - signal_seen >= M.SIGNAL_GRACE
end

-- The stop due for call a (or an outer call), or nil.
local function due(a)
  if a.stop then return a.stop end
  local t = M.clock()
  local c = a
  while c do
    if c.deadline and t > c.deadline then
      c.stop = M.TIMEOUT
      return c.stop
    end
    c = c.outer
  end
  if signal_due() then
    signal_seen = nil   -- acted on: a signal still pending later gets its own grace
    a.stop = setmetatable({ what = a.what }, Interrupt)
    return a.stop
  end
end

-- For a wait outside guard.call (remax.step.channels waiting on a worker or a server, which
-- no hook can see): raises a guard.Interrupt naming what is waited for ("the worker py:x.py")
-- once Ctrl-C or SIGTERM came SIGNAL_GRACE seconds ago, as guard.call does for Lua code.
function M.check_signal(what)
  if signal_due() then
    signal_seen = nil
    error(setmetatable({ what = what }, Interrupt), 0)
  end
end

local function hook()
  local a = active
  if not a then return end
  local stop = due(a)
  if stop then error(stop, 0) end
end

-- pcall, xpcall and coroutine.resume while guarded code runs: as Lua's, but once a stop is due
-- they pass it on instead of returning it to the code that would swallow it.
local function pass(...)
  local a = active
  if a then
    local c = a
    while c do
      if c.stop then error(c.stop, 0) end
      c = c.outer
    end
  end
  return ...
end
local function guarded_pcall(f, ...) return pass(raw_pcall(f, ...)) end
local function guarded_xpcall(f, h, ...) return pass(raw_xpcall(f, h, ...)) end
local function guarded_resume(co, ...) return pass(raw_resume(co, ...)) end

-- With REMAX_DEBUG set, an error caught here keeps the Lua traceback of where it was raised
-- (an xpcall handler; the Run's own catches use it too).
local function handler(e)
  if type(e) == "string" and os.getenv("REMAX_DEBUG") and not e:find("stack traceback:", 1, true) then
    return debug.traceback(e, 2)
  end
  return e
end
M.traceback = handler

local function pack(...) return { n = select("#", ...), ... } end

-- fn(...) under the limits above. opts.limit: seconds (nil or 0: none; Ctrl-C and SIGTERM are
-- still honoured); opts.what: what runs, for messages ("the tool 'calc'"). Returns true and
-- fn's results; or false, why, seconds: why is M.TIMEOUT (the limit passed, or a C call overran
-- it), a M.Exit (fn called os.exit), or fn's error. Raises a M.Interrupt when a signal stopped fn.
function M.call(fn, opts, ...)
  opts = opts or {}
  local limit = opts.limit
  local t0 = M.clock()
  local outer = active
  local a = { deadline = (limit and limit > 0) and (t0 + limit) or nil, what = opts.what, outer = outer }
  if signal_due() then
    signal_seen = nil
    error(setmetatable({ what = opts.what }, Interrupt), 0)
  end
  local saved
  if not outer then   -- the outermost call installs the hook and the stand-ins; nested ones share them
    local h, mask, count = debug.gethook()
    saved = { hook = h, mask = mask, count = count, jit = jit.status(), pcall = _G.pcall, xpcall = _G.xpcall,
      resume = coroutine.resume }
    jit.flush()
    jit.off()
    debug.sethook(hook, "", M.HOOK_COUNT)
    _G.pcall, _G.xpcall, coroutine.resume = guarded_pcall, guarded_xpcall, guarded_resume
  end
  local exit_before = os.exit
  os.exit = M.trapped_exit
  active = a
  local co = raw_create(function(...) return raw_xpcall(fn, handler, ...) end)
  local res = pack(raw_resume(co, ...))
  active = outer
  os.exit = exit_before
  if saved then
    _G.pcall, _G.xpcall, coroutine.resume = saved.pcall, saved.xpcall, saved.resume
    if saved.hook then debug.sethook(saved.hook, saved.mask, saved.count) else debug.sethook() end
    if saved.jit then jit.on() end
  end
  local seconds = M.clock() - t0
  local ok, err
  if not res[1] then ok, err = false, res[2]                     -- the hook raised outside fn's xpcall
  elseif raw_status(co) ~= "dead" then
    ok, err = false, ("%s yielded (coroutine.yield outside a coroutine of its own); it must return its result")
      :format(opts.what or "the function")
  else ok, err = res[2], res[3] end
  if M.is_interrupt(err) or M.is_interrupt(a.stop) then error(M.is_interrupt(err) and err or a.stop, 0) end
  pass()   -- an enclosing call's stop (its own limit passed meanwhile) goes on up to that call
  if err == M.TIMEOUT or a.stop == M.TIMEOUT or (a.deadline and seconds > limit) then
    return false, M.TIMEOUT, seconds
  end
  if not ok then return false, err, seconds end
  return true, unpack(res, 3, res.n)
end

-- f(...) under pcall with os.exit trapped (and put back after, whatever it was); no limit.
function M.pcall(f, ...)
  local before = os.exit
  os.exit = M.trapped_exit
  local results = { xpcall(f, handler, ...) }
  os.exit = before
  return unpack(results, 1, table.maxn(results))
end

return M
