-- remax.step.channels: the one channel stack between remax and other programs. Rewards
-- (remax.step.reward_worker), tools (remax.step.tools) and environments (remax.step.environment)
-- outside Lua all reach them through it, with one wire format (channels/wire.lua: JSON objects
-- with ids, one per line or HTTP body), one Python harness (channels/harness.py), the same
-- limits and the same messages. A fault fails the request it concerns, names it, and nothing
-- more; docs/reliability.md lists what is bounded and how.
--
--   "py:FILE.py[:NAME]"      a function or class of a Python file, in a worker running the harness
--   "cmd:PROGRAM ARGS"       any program speaking the wire format on stdin/stdout
--   "http://HOST:PORT/PATH"  a server: one POST of the same JSON per request
--
--   local reg = channels.registry({ base = recipe_dir, max_line = bytes, restarts = 3 })
--   local ch = reg:channel("py:tools.py:calc", "tools.calc.fn")   -- one per file / command / URL
--   local h = reg:request(ch, { type = "tool", ... }, timeout)     -- never blocks long, never raises
--   reg:poll(block_until)   -- reads what arrived; h.done, h.value | h.err, h.kind (channels.wire)
--   reg:wait(h)             -- until h is done
--   A blocking poll or wait raises a remax.step.guard Interrupt naming the worker or server
--   once Ctrl-C or SIGTERM came guard.SIGNAL_GRACE seconds ago (the Run then saves the last
--   finished step and stops), instead of waiting out the request's own timeout.
--
-- A kind of channel is one file here, named in KINDS by its prefix, with
--   key(spec, opts) -> the key of its channel (raises a message when spec is not of its form)
--   open(spec, opts) -> a channel: new_id(), send(h), poll() (never waits), forget(h), busy(),
--                       waitables() (the processes or connections to wait on for reading, and
--                       those to wait on for writing), stop(why), close()
-- and opts = { base, max_line, restarts }.
local ipc = require("remax.bind.ipc")
local guard = require("remax.step.guard")
local wire = require("remax.step.channels.wire")
local worker = require("remax.step.channels.worker")

local M = {}

local KINDS = {
  py = require("remax.step.channels.py"),
  cmd = require("remax.step.channels.cmd"),
  http = require("remax.step.channels.http"),
  https = require("remax.step.channels.http"),   -- refused with a message saying why
}

-- The most bytes of one answer (a line, or an HTTP body) when the registry is given no limit:
-- reward_max_line_bytes' default.
M.MAX_LINE_BYTES = 4 * 1024 * 1024
-- Seconds a worker may take to start (import its file).
M.START_TIMEOUT = worker.START_TIMEOUT
-- How many times a worker that died is started again in a run (each death fails only the
-- requests then on their way).
M.MAX_RESTARTS = 3
-- The longest wait between two looks at the workers' pids and the retries that are due.
M.SLICE = 0.1

local function kind_of(spec)
  local prefix = type(spec) == "string" and spec:match("^(%a+):")
  return prefix and KINDS[prefix:lower()]
end

-- Whether spec is a string naming a channel (py:, cmd:, http://).
function M.is_spec(spec) return kind_of(spec) and true or false end

-- spec as messages show it (an URL's user name and password cut out).
M.display = KINDS.http.display

local Registry = {}
Registry.__index = Registry

-- opts: base (the recipe's folder: py: files are looked for there too), max_line, restarts,
-- unnamed_py (a py: spec may leave out its function: a reward's is `reward`).
function M.registry(opts)
  opts = opts or {}
  return setmetatable({ opts = { base = opts.base, max_line = opts.max_line or M.MAX_LINE_BYTES,
    restarts = opts.restarts or M.MAX_RESTARTS }, unnamed_py = opts.unnamed_py, channels = {}, handles = {},
    serial = 0 }, Registry)
end

-- The channel of a spec (made on first use). where: how errors name it: "tools.calc.fn" gives
-- "tools.calc.fn = py:x.py: no such file ..."; a where with %s is a format for the spec.
function Registry:channel(spec, where)
  where = where or "%s"
  local function fail(err)
    local shown = M.display(tostring(spec))
    error(("%s: %s"):format(where:find("%s", 1, true) and where:format(shown) or (where .. " = " .. shown), err), 0)
  end
  local kind = kind_of(spec)
  if not kind then fail("expected py:FILE.py:NAME, cmd:PROGRAM or http://HOST:PORT/PATH") end
  if kind == KINDS.py and not self.unnamed_py and not spec:match("%.py:[%a_][%w_]*$") then
    fail("expected py:FILE.py:NAME (a function or class of the file)")
  end
  local ok, key = pcall(kind.key, spec, self.opts)
  if not ok then fail(key) end
  local ch = self.channels[key]
  if not ch then
    ch = kind.open(spec, self.opts)
    self.channels[key] = ch
  end
  return ch
end

-- Sends obj (a table; its id is set here) on ch: the handle. timeout: seconds (nil or 0: none).
-- opts.id: send again under an earlier request's id (a reward re-sent to a restarted worker);
-- opts.keep_null: keep the answer's nulls; opts.idempotent: it may be sent twice (an HTTP
-- connection lost after the request went out is tried once more).
function Registry:request(ch, obj, timeout, opts)
  opts = opts or {}
  obj.id = opts.id or ch:new_id()
  local h = { id = obj.id, t0 = ipc.now(), ch = ch, timeout = timeout, keep_null = opts.keep_null,
    idempotent = opts.idempotent }
  h.deadline = timeout and timeout > 0 and (h.t0 + timeout) or nil
  self.serial = self.serial + 1
  self.handles[self.serial] = h
  local line, why = wire.encode(obj)
  if not line then
    wire.finish(h, nil, why, "error")
    return h
  end
  h.line = line
  local ok, err = pcall(ch.send, ch, h)
  if not ok then
    ch:forget(h)
    wire.finish(h, nil, tostring(err), "worker")
  end
  if not h.done then   -- a worker's start-up is not the call's time
    h.t0 = ipc.now()
    if h.deadline then h.deadline = h.t0 + timeout end
  end
  return h
end

-- Nobody waits for h any more: its answer, if one comes, is dropped.
function Registry:forget(h)
  if not h.done then
    h.ch:forget(h)
    wire.finish(h, nil, "not waited for", "worker")
  end
end

-- Reads what has arrived on every channel and times out what is past its deadline. block_until:
-- when given and nothing has resolved yet, waits (until that time at the latest) for an answer
-- or a deadline. Returns the handles resolved by this call.
function Registry:poll(block_until)
  local resolved = {}
  local function sweep()
    local t = ipc.now()
    for k, h in pairs(self.handles) do
      if not h.done and h.deadline and t >= h.deadline then
        h.ch:forget(h)
        wire.finish(h, nil, "timeout", "timeout")
      end
      if h.done then resolved[#resolved + 1] = h; self.handles[k] = nil end
    end
  end
  local function poll_all()
    for _, ch in pairs(self.channels) do if ch:busy() then ch:poll() end end
    sweep()
  end
  poll_all()
  while block_until and #resolved == 0 and next(self.handles) do
    local t = ipc.now()
    if t >= block_until then break end
    local until_ = math.min(block_until, t + M.SLICE)
    for _, h in pairs(self.handles) do if h.deadline and h.deadline < until_ then until_ = h.deadline end end
    local readers, writers = {}, {}
    for _, ch in pairs(self.channels) do
      if ch:busy() then
        local r, w = ch:waitables()
        for _, x in ipairs(r) do readers[#readers + 1] = x end
        for _, x in ipairs(w or {}) do writers[#writers + 1] = x end
      end
    end
    ipc.wait_ready(readers, writers, until_)
    poll_all()
    if #resolved == 0 then   -- Ctrl-C or SIGTERM while a worker or server computes: stop after the grace
      local _, h = next(self.handles)
      if h then guard.check_signal(h.ch.label or "a worker") end
    end
  end
  return resolved
end

-- Waits for one handle (a blocking call: a reward, describe, reset, the last step).
function Registry:wait(h)
  while not h.done do self:poll(ipc.now() + 3600) end
  return h
end

function Registry:busy() return next(self.handles) ~= nil end

function Registry:close()
  for _, ch in pairs(self.channels) do pcall(ch.close, ch) end
  self.channels, self.handles = {}, {}
end

return M
