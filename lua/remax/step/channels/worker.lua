-- remax.step.channels.worker: a long-lived process that speaks the wire format on its stdin and
-- stdout (a py: worker running the Python harness, a cmd: program). Requests go out as lines
-- through an outbox that never waits on a worker that is not reading (one busy with a request
-- cannot stall the rollout or the next send); answers come back as lines, each at most max_line
-- bytes (counted before they are kept), matched to their requests by id in any order.
--
-- What it does when something goes wrong (each fails the requests it concerns, named):
--   the process ended   seen by its pid, not by the end of its pipe (a process it started may
--                       still hold that open): what it wrote is read, then the requests on
--                       their way fail as "died"; the next request starts it again, at most
--                       `restarts` times a run
--   a bad answer        too long, not JSON, no id, an id never sent, an id answered already:
--                       the worker is stopped (its answers can no longer be matched) and the
--                       requests on their way fail with that fault; when none was, the next
--                       request does (a worker must not turn bad unnoticed)
--   a late answer       (to a request past its deadline) is dropped
local ipc = require("remax.bind.ipc")
local wire = require("remax.step.channels.wire")

local M = {}

-- Seconds a worker may take to start (import its file) and say it is ready.
M.START_TIMEOUT = 120

local Worker = {}
Worker.__index = Worker

-- o: spec, label (how messages name it: "the worker py:tools.py"), argv, hello (wait for its
-- {"ready": true} line), max_line, restarts (how many times a dead worker is started again).
function M.new(o)
  return setmetatable({ spec = o.spec, label = o.label, argv = o.argv, hello = o.hello, max_line = o.max_line,
    restarts = o.restarts or 3, deaths = 0, pending = {}, abandoned = {}, last_id = 0, outbox = {}, out_from = 1 }, Worker)
end

function Worker:new_id()
  self.last_id = self.last_id + 1
  return self.last_id
end

local function fail_all(self, err, kind, fields)
  for id, h in pairs(self.pending) do
    self.pending[id] = nil
    for k, v in pairs(fields or {}) do h[k] = v end
    wire.finish(h, nil, err, kind)
  end
end

-- Ends the process at once (what is left of its group too) and forgets what was to be sent.
local function kill(self)
  if self.proc then self.proc:kill(); self.proc:close(0); self.proc = nil end
  self.outbox, self.out_from = {}, 1
end

-- The first line of a starting worker: {"ready": true}, or why it is not ready.
local function read_hello(self, p)
  local deadline = ipc.now() + M.START_TIMEOUT
  while true do
    local line, why = p:read_line(math.min(deadline, ipc.now() + 0.1), self.max_line)
    if line then
      local v = wire.decode(line)
      if type(v) == "table" and v.ready == true then return true end
      if type(v) == "table" and v.error ~= nil then return nil, tostring(v.error) end
      return nil, ("it started with %s"):format(wire.clip(line, 200))
    end
    if why == "timeout" and ipc.now() >= deadline then
      return nil, ("it did not say it was ready within %g s"):format(M.START_TIMEOUT)
    end
    if why ~= "timeout" or not p:running() then
      if why == "too long" then return nil, "it started with a line longer than reward_max_line_bytes" end
      p:wait(1)
      local _, exit = p:running()
      return nil, ("it exited%s before it was ready; its error output is above"):format(exit and (" (" .. exit .. ")") or "")
    end
  end
end

-- Starts the process when none runs: true, or nil and why not.
function Worker:start()
  if self.proc then return true end
  if self.start_error then return nil, self.start_error end
  if self.deaths > self.restarts then
    return nil, ("it died %d times; it is not started again in this run"):format(self.deaths)
  end
  local ok, p = pcall(ipc.spawn, self.argv)
  if not ok then return nil, tostring(p) end
  self.proc, self.outbox, self.out_from = p, {}, 1
  if self.hello then
    local ready, why = read_hello(self, p)
    if not ready then
      kill(self)
      self.start_error = why   -- a file that does not load will not load next time either
      return nil, why
    end
  end
  return true
end

-- Writes what the pipe takes of the outbox now; a pipe whose reader is gone means the worker
-- died. patience: seconds to wait for room while the worker keeps reading (a large batch goes
-- whole to a worker that is idle, before the model generates the next one); a worker that
-- reads nothing for that long gets the rest at later polls.
function Worker:flush(patience)
  while self.proc and self.outbox[1] do
    local data = self.outbox[1]
    local n, why = self.proc:write_now(data, self.out_from)
    if not n then return self:died(why) end
    self.out_from = self.out_from + n
    if self.out_from <= #data then   -- the pipe is full
      if not patience or not ipc.wait_ready({}, { self.proc }, ipc.now() + patience) then return end
    else
      table.remove(self.outbox, 1)
      self.out_from = 1
    end
  end
end

-- Sends h (its id and line set). Never raises; a failure finishes h.
function Worker:send(h)
  if self.broken then   -- a bad answer came while no request was on its way
    local why = self.broken
    self.broken = nil
    return wire.finish(h, nil, why, "worker")
  end
  if self.proc and not self.proc:running() then self:died() end   -- it ended while idle: counted, started afresh
  local ok, why = self:start()
  if not ok then return wire.finish(h, nil, ("cannot start %s: %s"):format(self.label, why), "worker") end
  self.pending[h.id] = h
  self.outbox[#self.outbox + 1] = h.line .. "\n"
  self:flush(0.05)
end

-- The process ended (or its pipe broke): the requests on their way fail as "died".
function Worker:died(why)
  local exit = why
  if self.proc then
    self.proc:wait(1)
    local _, e = self.proc:running()
    exit = e or why
  end
  kill(self)
  self.deaths = self.deaths + 1
  fail_all(self, ("%s died (%s); its error output is above"):format(self.label, tostring(exit)), "died",
    { exit = tostring(exit), death = self.deaths })
end

-- A bad answer: the worker is stopped, and what was on its way fails with it.
function Worker:fault(why)
  kill(self)
  if next(self.pending) then
    fail_all(self, ("%s %s (the worker is stopped)"):format(self.label, why), "worker")
  else
    self.broken = ("%s %s (the worker is stopped; that answer came while no request was on its way)"):format(self.label, why)
  end
end

local function take(self, line)
  local v, why = wire.decode(line)
  if not v then return self:fault(why) end
  local h, wrong = wire.owner(v, self, line)
  if h then return wire.resolve(h, v) end
  if wrong then return self:fault(wrong) end
end

-- Reads every answer that has arrived, without waiting; sends what the outbox holds.
function Worker:poll()
  if not self.proc then return end
  self:flush()
  while self.proc do
    local line, why = self.proc:read_line(ipc.now(), self.max_line)
    if line then
      take(self, line)
    elseif why == "timeout" then
      break
    elseif why == "too long" then
      return self:fault(("answered a line longer than reward_max_line_bytes = %d bytes without ending it; raise reward_max_line_bytes if the answers are meant to be that long")
        :format(self.max_line))
    else
      return self:died(why)
    end
  end
  if self.proc and not self.proc:running() then
    -- it ended, though its pipe may be open (held by a process it started, now killed with its
    -- group): what it wrote before is read, then it is dead
    while self.proc do
      local line = self.proc:read_line(ipc.now(), self.max_line)
      if not line then break end
      take(self, line)
    end
    if self.proc then self:died() end
  end
end

-- Nobody waits for h any more (past its deadline, or not wanted): its answer will be dropped.
function Worker:forget(h)
  if self.pending[h.id] == h then
    self.pending[h.id] = nil
    self.abandoned[h.id] = true
  end
end

function Worker:busy() return next(self.pending) ~= nil or self.outbox[1] ~= nil end

-- What to wait on: answers to read, and (while the outbox holds a request) room to write.
function Worker:waitables()
  if not self.proc then return {}, {} end
  return { self.proc }, self.outbox[1] and { self.proc } or {}
end

-- Kills the process now; what was on its way fails with `why`.
function Worker:stop(why)
  kill(self)
  fail_all(self, ("%s was stopped: %s"):format(self.label, why or "stopped"), "worker")
end

-- Ends the process (EOF on its stdin, killed after 0.2 s): the run is done with it.
function Worker:close()
  if self.proc then self.proc:close(0.2); self.proc = nil end
  self.outbox, self.out_from = {}, 1
  fail_all(self, ("%s was closed"):format(self.label), "worker")
end

return M
