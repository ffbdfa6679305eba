-- remax.step.reward_worker: rewards computed outside Lua, by a long-lived worker process or a
-- reward server, over the channels (remax.step.channels). See docs/rewards.md ("Rewards in
-- Python, or any program").
--
--   "py:rewards/verify.py"        the function `reward` of a Python file, called as TRL calls a
--                                 reward function: reward(prompts=[...], completions=[...],
--                                 completion_ids=[...], trainer_state=..., **columns), prompts
--                                 and completions as messages for conversational data and
--                                 episodes, strings otherwise (the harness shapes them), and
--                                 environments=[...] when the run has an environment
--   "py:rewards/verify.py:name"   another function of that file
--   "cmd:PROGRAM ARGS..."         any program (run by /bin/sh) speaking the wire format
--   "http://HOST:PORT/PATH"       a reward server: one POST of the same JSON per batch
--   { worker = "<one of those>", name = "verify", weight = 0.5, accuracy = true }   (accuracy: evaluation's accuracy)
--
-- Per batch one request {"id": N, "type": "reward", "name": ..., "step": N, "trainer_state":
-- {...}, "completions": [...], "batch": {"prompt": [...], ...every column the Lua rewards
-- get...}}; the answer {"id": N, "scores": [number|null, ...]}, or {"id": N, "error": "message"}.
-- Each reward has a worker (or server) of its own. A worker that dies is started again once per
-- run and gets the batches it had on their way again (same ids); a second death, a timeout
-- (reward_timeout: the worker is stopped), any fault of the channel, or an answer that is not
-- the scores stops the run with the reward's name (after a checkpoint, as a failing Lua reward
-- does).
--
-- A Python reward in the same file as a py: environment is served by the environment's worker
-- (the batch goes over its channel), so that it can be handed the episodes' instances: the
-- request's "environments" lists their episode ids. A reward elsewhere gets "environments_missing"
-- (why it cannot have them), which the harness says if the reward reads them.
local channels = require("remax.step.channels")
local json = require("remax.formats.json")
local wire = require("remax.step.channels.wire")
local py = require("remax.step.channels.py")
local cmd = require("remax.step.channels.cmd")

local M = {}

M.MAX_LINE_BYTES = channels.MAX_LINE_BYTES   -- 4 MiB: reward_max_line_bytes' default

function M.is_spec(spec)
  if type(spec) == "table" then return type(spec.worker) == "string" end
  return channels.is_spec(spec)
end

local function basename(p) return (p:match("([^/]+)$") or p) end

-- The request of one batch. state: the run's state under TRL's trainer_state names
-- (rewards.trainer_state), nil when there is none. The batch's environments (Lua objects and
-- remote episodes) are not columns: route says what the request gets of them.
local function request(completions, batch, opts, name, route)
  local cols = {}
  for k, v in pairs(batch or {}) do
    if type(k) == "string" and type(v) == "table" and k ~= "environments" then cols[k] = v end
  end
  local st = {}
  for k, v in pairs(opts and opts.state or {}) do st[k] = v end
  local step = opts and opts.step
  if st.global_step == nil then st.global_step = step or 0 end
  return { type = "reward", name = name, step = step or wire.null, trainer_state = st, completions = completions,
    batch = next(cols) and cols or json.object(), probe = opts and opts.probe or nil,
    environments = route and route.ids or nil, environments_missing = route and route.missing or nil }
end

local EXPECTED = "expected {\"id\": N, \"scores\": [number|null, ...]}"

-- An answer (decoded, nulls kept) -> the scores of n completions (nil for null), or raises.
local function scores_of(v, n)
  local scores = v.scores
  if type(scores) ~= "table" or (next(scores) ~= nil and scores[1] == nil) then
    error(("answered %s; %s"):format(json.encode(v):sub(1, 200), EXPECTED), 0)
  end
  local count = 0
  for k in pairs(scores) do if type(k) == "number" and k > count then count = k end end
  if count ~= n then error(("answered %d scores for %d completions"):format(count, n), 0) end
  local out = {}
  for i = 1, n do
    local s = scores[i]
    if s == wire.null then s = nil end
    if type(s) == "string" then s = ({ NaN = 0 / 0, nan = 0 / 0, inf = math.huge, Infinity = math.huge,
      ["-inf"] = -math.huge, ["-Infinity"] = -math.huge })[s] or s end
    out[i] = s   -- numbers, nil, or whatever else came (rewards.run_one names a non-number)
  end
  return out
end

local Reward = {}
-- impl.proc: the worker's process while one runs (nil for a server, or when none runs)
Reward.__index = function(t, k)
  if k == "proc" then return t.channel.proc end
  return Reward[k]
end

-- Where a py: reward's batch goes, given its environments: { registry, channel, ids } when they
-- live in this reward's file's worker (the environment's), { missing = why } when it cannot have
-- them, nil when the run has none.
function Reward:route(batch, n)
  local list = type(batch) == "table" and batch.environments
  if not self.python or type(list) ~= "table" or next(list) == nil then return nil end
  local ids, registry, channel, elsewhere, lua = {}, nil, nil, nil, false
  for k = 1, n do
    local e = list[k]
    if type(e) == "table" and e.remote then
      if e.remote.channel.spec == self.channel.spec then
        ids[k], registry, channel = e.episode, e.remote.registry, e.remote.channel
      else
        elsewhere = e.remote.spec
      end
    elseif e ~= nil then
      lua = true
    end
  end
  if elsewhere then
    return { missing = ("the environments are instances of %s, which live in that file's worker; a reward that reads " ..
      "them must be defined in the same file (it is then run by the same worker)"):format(channels.display(elsewhere)) }
  end
  if lua then return { missing = "the environments are Lua objects (the recipe's environment is in Lua): a Python reward cannot read them" } end
  for k = 1, n do if ids[k] == nil then ids[k] = wire.null end end
  return { ids = ids, registry = registry, channel = channel }
end

-- Sends a batch without waiting for the answer (receive reads it), so the worker scores while
-- the other rewards run, or while the next batch generates. Several batches may be on their way.
-- Never raises: what goes wrong is raised by receive. A batch already sent (the same
-- completions table) is not sent again.
function Reward:send(completions, batch, opts)
  for _, q in ipairs(self.queue) do if q.key == completions then return end end
  local p = { key = completions, n = #completions, timeout = opts and opts.timeout, registry = self.registry, channel = self.channel }
  self.queue[#self.queue + 1] = p
  local ok, err = pcall(function()
    local route = self:route(batch, #completions)
    if route and route.channel then p.registry, p.channel = route.registry, route.channel end
    p.obj = request(completions, batch, opts, self.fname, route)
    p.h = p.registry:request(p.channel, p.obj, p.timeout, { keep_null = true, idempotent = true })
  end)
  if not ok then p.error = err end
end

-- The batches that died with the worker go to the new one, in order, under their ids.
function Reward:resend(death)
  for _, q in ipairs(self.queue) do
    if q.h and q.channel == self.channel and q.h.kind == "died" and q.h.death == death then
      q.h = self.registry:request(self.channel, q.obj, q.timeout, { id = q.h.id, keep_null = true, idempotent = true })
    end
  end
end

-- The channel's message without its name (the reward's message names it already).
function Reward:why(h)
  local label = self.channel.label
  local err = tostring(h.err)
  if err:sub(1, #label + 1) == label .. " " then err = err:sub(#label + 2) end
  return err
end

-- Reads the answer to p.
function Reward:answer(p)
  if p.error then error(p.error, 0) end
  while true do
    local h = p.registry:wait(p.h)
    if h.value then return scores_of(h.value, p.n) end
    if h.kind ~= "error" and p.channel ~= self.channel then   -- served by the environment's worker
      error(("the environment's worker, which runs this reward beside the episodes' instances, failed: %s")
        :format(h.kind == "timeout" and ("no answer within reward_timeout = %g s"):format(p.timeout) or tostring(h.err)), 0)
    end
    if h.kind == "timeout" then
      if self.url then
        error(("took over reward_timeout = %g s scoring %d completions (make the server faster, or raise reward_timeout, 0: no limit)")
          :format(p.timeout, p.n), 0)
      end
      -- a worker answers its batches in order: one stuck holds up every later one
      self.channel:stop(("a batch took over reward_timeout = %g s"):format(p.timeout))
      error(("took over reward_timeout = %g s scoring %d completions (the worker is stopped; make it faster, or raise reward_timeout, 0: no limit)")
        :format(p.timeout, p.n), 0)
    elseif h.kind == "died" then
      if h.death > self.death_seen then   -- a new death (batches that died with it are re-sent with the first)
        if self.restarts >= 1 then
          error(("the worker died again (%s) after it was restarted once; its error output is above"):format(h.exit), 0)
        end
        self.restarts, self.death_seen = self.restarts + 1, h.death
        io.stderr:write(("reward '%s': the worker died (%s); starting it again (once per run)\n"):format(self.name, h.exit))
        p.h = self.registry:request(self.channel, p.obj, p.timeout, { id = h.id, keep_null = true, idempotent = true })
        self:resend(h.death)
      else
        p.h = self.registry:request(self.channel, p.obj, p.timeout, { id = h.id, keep_null = true, idempotent = true })
      end
    elseif h.kind == "error" then
      error(("reported an error: %s"):format(h.traceback or h.err), 0)
    else
      error(self:why(h), 0)
    end
  end
end

-- The scores of the batch sent with these completions (batches sent before it that nobody asked
-- for, after an earlier failure, are dropped).
function Reward:receive(key)
  local p
  repeat
    p = table.remove(self.queue, 1)
    if not p then error("internal: no batch was sent to this reward", 0) end
    if p.key ~= key and p.h then p.registry:forget(p.h) end
  until p.key == key
  return self:answer(p)
end

-- One batch: the scores (the answer to an earlier send of the same completions, when there is
-- one). opts.timeout: seconds (nil or 0: no limit); opts.step, opts.state go into the request.
function Reward:call(completions, batch, opts)
  self:send(completions, batch, opts)   -- (nothing when it is on its way already)
  return self:receive(completions)
end

function Reward:stop()
  self.registry:close()
  self.queue = {}
end

-- spec (string or {worker =, name =, weight =}) -> a reward {name=, fn=, where=, external=true,
-- close=, reload=}. opts.base: the recipe's folder; opts.max_line_bytes: reward_max_line_bytes.
function M.reward(spec, opts)
  opts = opts or {}
  local s, name, weight, accuracy = spec, nil, nil, nil
  if type(spec) == "table" then s, name, weight, accuracy = spec.worker, spec.name, spec.weight, spec.accuracy end
  local r = { where = s, weight = weight, external = true, accuracy = accuracy }
  -- restarts = 1: the reward decides (once per run); the channel refuses a third start
  local registry = channels.registry({ base = opts.base, max_line = opts.max_line_bytes or M.MAX_LINE_BYTES, restarts = 1,
    unnamed_py = true })
  local channel = registry:channel(s, "reward %s")
  local impl = setmetatable({ registry = registry, channel = channel, queue = {}, restarts = 0, death_seen = 0 }, Reward)
  if s:match("^py:") then
    local _, fname = py.parse(s)
    local file = channel.spec:sub(4)
    r.name = name or fname or basename(file):gsub("%.py$", "")
    r.path = file
    impl.fname = fname or "reward"
    impl.python = true
  elseif s:match("^cmd:") then
    r.name = name or cmd.program_name(s:sub(5):match("^%s*(.-)%s*$"))
  else
    r.name = name or ((channel.path:match("([^/]+)/*$") or channel.host):gsub("[^%w_%-%.]", "_"))
    r.url, impl.url = s, s
  end
  if type(r.name) ~= "string" or r.name == "" then error(("reward %s: name must be a non-empty string"):format(s), 0) end
  impl.name = r.name
  if not impl.fname then impl.fname = r.name end
  r.impl = impl
  -- fn is what every reward has: (completions, batch) -> scores; a third argument carries the
  -- timeout and step (rewards.run_one passes them)
  r.fn = function(completions, batch, o) return impl:call(completions, batch, o) end
  -- send: start scoring now, fn collects the answer (rewards.score sends to every worker first)
  r.send = function(completions, batch, o) impl:send(completions, batch, o) end
  r.close = function() impl:stop() end
  r.reload = function() return M.reward(spec, opts) end
  return r
end

return M
