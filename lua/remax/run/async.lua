-- remax.run.async: the schedule of asynchronous rollouts (async_mode = one_step_off | async): which
-- weights generate which step's rows, and when rows are too old to train. The Run owns it; the
-- Step's two halves do the work (Step:generate: generate and score; Step:learn: advantage,
-- update, metrics).
--
-- Everything is decided by step count, never by wall clock, so a seed gives the same bits
-- whatever the timing. Versions count updates (0: the starting weights); the generating weights
-- are refreshed from the trained ones at the versions that are multiples of W =
-- weight_sync_steps, and generation runs up to L steps ahead (one_step_off: L = 1; async:
-- L = max_staleness):
--   v(s)   the version that generates step s: the first synced version no more than L updates
--          older than step s's training, W * ceil(max(0, s - 1 - L) / W); when no synced version
--          lies in [s - 1 - L, s - 1] (W > L + 1), the last one before, W * floor((s - 1) / W).
--   age    at training step s a row of version v is (s - 1) - v updates old. Rows older than
--          max_staleness are dropped, counted (async/rows_dropped), and their prompts generated
--          again, now, by the trained weights with the step's own seed (what a synchronous run
--          would have generated).
-- So async with max_staleness = 0 is the synchronous run, bit for bit; one_step_off trains step s
-- on rows of version s - 2. In one process the rows of every step whose version the trainer
-- holds are generated before its update (on ranks of their own that generation runs beside the
-- update: docs/distributed.md), so the generating weights are always the trained model itself at
-- that moment: no second copy of the weights.
--
-- The rows generated ahead are part of the run's state: a checkpoint keeps them (exactly, as
-- plain values) with the data position after them, so --resume trains on the same rows an
-- uninterrupted run would have.
--
--   local sched = async.new(cfg, { stepper = step, next_batch = function() ... end, world = world })
--   local m, ro = sched:step(s)           -- in place of stepper:run(batch, {step = s})
--   sched:state() / sched:restore(st)
local dist = require("remax.bind.dist")
local rollout = require("remax.step.rollout")

local M = {}
local Schedule = {}
Schedule.__index = Schedule

-- Whether cfg asks for the schedule.
function M.wanted(cfg) return cfg.async_mode ~= nil and cfg.async_mode ~= "off" end

-- The lag of cfg: how many steps ahead generation runs.
function M.lag(cfg)
  if cfg.async_mode == "one_step_off" then return 1 end
  if cfg.async_mode == "async" then return cfg.max_staleness end
  return 0
end

-- The policy version that generates step s under lag L and weight_sync_steps W.
function M.version(s, L, W)
  local v = W * math.ceil(math.max(0, s - 1 - L) / W)
  if v <= s - 1 then return v end
  return W * math.floor((s - 1) / W)
end

-- pieces: stepper (the Step), next_batch (function: this rank's prompts of the next step and the
-- place of its first in the step's whole batch, in
-- step order), world (remax.bind.dist's).
function M.new(cfg, pieces)
  return setmetatable({ cfg = cfg, stepper = pieces.stepper, next_batch = pieces.next_batch, world = pieces.world,
    pending = {}, ahead = 0 }, Schedule)
end

-- One training step s (the trainer holds version s - 1): generate the steps (up to max_steps)
-- whose version is the trainer's, then train step s on its rows (dropping them first if too old).
function Schedule:step(s)
  local cfg, L, W = self.cfg, M.lag(self.cfg), self.cfg.weight_sync_steps
  local now = s - 1
  self.restored = nil
  local model = self.stepper:checkpoint_model()
  while self.ahead < math.max(s, cfg.max_steps) do
    local j = self.ahead + 1
    if M.version(j, L, W) > now and j > s then break end
    -- (a resumed run whose settings changed may find a step's version gone: the trained weights generate it)
    local rows, first = self.next_batch()
    self.pending[j] = self.stepper:generate(rows, { step = j, model = model, version = now, first = first })
    self.ahead = j
  end
  local ro = assert(self.pending[s], "async: no rows for the step")
  self.pending[s] = nil
  local dropped = 0
  if now - ro.policy_version > cfg.max_staleness then
    dropped = #ro.rows
    ro = self.stepper:generate(ro.prompts, { step = s, model = model, version = now, first = ro.first })
  end
  local age = now - ro.policy_version
  local m, whole = self.stepper:learn(ro)
  m["async/staleness"] = age
  m["async/policy_version"] = ro.policy_version
  m["async/rows_dropped"] = (self.world and self.world.size > 1) and self.world:sum(dropped) or dropped
  m["async/steps_ahead"] = self.ahead - s
  return m, whole
end

-- The rows generated ahead, with everything the Step needs of them, as plain values.
local SKIP = { reward_args = true, completions = true, batch = true }
function M.plain(ro)
  local t = {}
  for k, v in pairs(ro) do if not SKIP[k] then t[k] = v end end
  return t
end

-- What a checkpoint keeps: the steps generated ahead and their rows (exact: remax.bind.dist's
-- encoding of plain values). A collective: rank 0 gets every rank's rows.
function Schedule:state()
  -- just restored (rank 0 read a checkpoint; the Run now shares it): every rank's rows as read
  if self.restored then return self.restored end
  local list = {}
  for _, ro in pairs(self.pending) do list[#list + 1] = M.plain(ro) end
  table.sort(list, function(a, b) return a.step < b.step end)
  -- every rank's rows (each generates its own share): rank 0's checkpoint keeps them all
  local parts = { list }
  if self.world and self.world.size > 1 then parts = self.world:gather(list) or {} end
  local st = { ahead = self.ahead, pending = {} }
  for r, p in ipairs(parts) do st.pending[r] = dist.encode(p) end
  return st
end

-- Back to a checkpoint's state (st: state()'s table).
function Schedule:restore(st)
  if not st then return end
  self.restored = st
  self.ahead = st.ahead or 0
  self.pending = {}
  local rank = self.world and self.world.rank or 0
  if type(st.pending) == "table" and #st.pending > 0 and #st.pending ~= (self.world and self.world.size or 1) then
    error(("--resume: the checkpoint holds the rows generated ahead by %d rank(s); this run has %d (resume with as many ranks)")
      :format(#st.pending, self.world and self.world.size or 1), 0)
  end
  local mine = type(st.pending) == "table" and st.pending[rank + 1] or "return {}"
  for _, t in ipairs(dist.decode(mine)) do
    self.pending[t.step] = setmetatable(t, rollout.Rollout)
  end
end

return M
