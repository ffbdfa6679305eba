-- remax.run.rollout_ranks: rollouts on ranks of their own (--rollout_ranks N, issue 46). Of an
-- mpirun/srun world of P ranks, rank 0 trains and the last N generate and score; the Run's loop is
-- the same, this module is its step (in place of remax.run.async's Schedule; the same schedule:
-- remax.run.async's version and lag decide which weights generate which step, so a run gives the
-- bits of the one-process async run with the same settings, whatever the timing).
--
-- One round per training step s, the same collectives in the same order on every rank:
--   plan       the steps whose rows are generated this round (every rank computes the same list
--              from s, the lag and weight_sync_steps); every rank draws their prompts from the
--              sampler (the data order is global), each generator generates its share
--   overlap    generators generate and score the plan with the weights they hold while the
--              trainer trains step s on rows generated earlier; when step s itself is in the plan
--              (lag 0) the trainer waits for it first
--   transfer   the rows go to the trainer as plain values (remax.bind.dist's gather), with each
--              generator's busy time and any error it met
--   status     rank 0 says to every rank whether to go on (a generator's error stops every rank,
--              named), and with a weight sync (every weight_sync_steps updates) broadcasts the
--              weights (MPI on CPUs, NCCL on GPUs: remax.bind.dist's broadcast_model)
-- A generator that dies or stalls leaves the trainer waiting in a collective: after dist_timeout
-- every rank stops, naming it (engine/dist). Ctrl-C: the Run's loop asks every rank between rounds
-- and saves; the rows generated ahead live on the trainer between rounds and travel in its
-- checkpoint, so --resume goes on as an uninterrupted run would.
--
-- For now: one trainer rank (the trainers would need a communicator of their own for their
-- gradient sums), so every rank's Step sees a world of one (M.alone).
local dist = require("remax.bind.dist")
local async = require("remax.run.async")
local rollout = require("remax.step.rollout")
local now = require("remax.bind.clock").now

local M = {}
local Driver = {}
Driver.__index = Driver

-- Whether cfg asks for ranks of their own.
function M.wanted(cfg) return (cfg.rollout_ranks or 0) > 0 end

-- The world a rank's Step sees: this rank alone (its collectives return at once).
function M.alone(world)
  return setmetatable({ rank = 0, size = 1, is_root = true, local_rank = world.local_rank, local_size = world.local_size,
    backend = "this rank alone (rollout ranks)" }, dist.World)
end

-- The ranks that train (numbered first) for cfg in world; refuses what does not work yet.
function M.trainers(cfg, world)
  local n = cfg.rollout_ranks
  if n >= world.size then
    error(("rollout_ranks = %d: the world has %d rank(s); at least one must train (mpirun -np %d or more)")
      :format(n, world.size, n + 1), 0)
  end
  if world.size - n ~= 1 then
    error(("rollout_ranks = %d of %d ranks leaves %d trainers; one trainer rank is supported for now (mpirun -np %d)")
      :format(n, world.size, world.size - n, n + 1), 0)
  end
  if cfg.zero_stage > 0 then error("rollout_ranks: zero_stage shards over trainer ranks; with one trainer use zero_stage = 0", 0) end
  return world.size - n
end

-- pieces: stepper, world (the whole world), sampler (the Run's: the global batch of each step),
-- trainers (how many ranks train: the first ones).
function M.new(cfg, pieces)
  local world = pieces.world
  local self = setmetatable({ cfg = cfg, stepper = pieces.stepper, world = world, sampler = pieces.sampler,
    trainers = pieces.trainers, pending = {}, ahead = 0 }, Driver)
  self.role = world.rank < self.trainers and "trainer" or "generator"
  -- the generators' own numbering, for their shares of each step's prompts
  self.gen_world = setmetatable({ rank = world.rank - self.trainers, size = world.size - self.trainers }, dist.World)
  self.held_version = 0
  return self
end

-- Every rank starts from rank 0's weights, those of version `version` (a resumed run: rank 0
-- alone read the checkpoint).
function Driver:start(version)
  self.world:broadcast_model(self.stepper:checkpoint_model())
  self.held_version = version
end

-- A generator's share of a step's prompts.
-- This generator's share of a step's global batch, and the place of its first prompt there.
function Driver:my_prompts(batch)
  return self.gen_world:share(batch)
end

-- The parts generators sent for one step, in rank order -> one rollout over all its prompts.
local function merge(parts)
  if #parts == 1 then return parts[1] end
  local whole = {}
  for k, v in pairs(parts[1]) do whole[k] = v end
  whole.prompts, whole.prompt_ids, whole.rows, whole.total, whole.none = {}, {}, {}, {}, {}
  whole.per = {}
  for name in pairs(parts[1].per or {}) do whole.per[name] = {} end
  for _, k in ipairs({ "prompts_truncated", "tokens_generated", "unscored", "observation_tokens" }) do
    if whole[k] then whole[k] = 0 end
  end
  whole.time_generate, whole.time_score = 0, 0
  for _, p in ipairs(parts) do
    local offset, base = #whole.prompts, #whole.rows
    for i, x in ipairs(p.prompts) do whole.prompts[offset + i], whole.prompt_ids[offset + i] = x, p.prompt_ids[i] end
    for k, r in ipairs(p.rows) do
      r.prompt = r.prompt + offset
      whole.rows[base + k], whole.total[base + k] = r, p.total[k]
      if p.none then whole.none[base + k] = p.none[k] end
      for name, list in pairs(whole.per) do list[base + k] = p.per[name][k] end
    end
    for _, k in ipairs({ "prompts_truncated", "tokens_generated", "unscored", "observation_tokens" }) do
      if whole[k] then whole[k] = whole[k] + (p[k] or 0) end
    end
    whole.time_generate = math.max(whole.time_generate, p.time_generate or 0)
    whole.time_score = math.max(whole.time_score, p.time_score or 0)
  end
  return whole
end

-- Round s (the trainer holds version s - 1). Returns the step's metrics (the trainer's; a
-- generator returns what it did) and, on the trainer, the whole step's rollout.
function Driver:step(s)
  local cfg, L, W = self.cfg, async.lag(self.cfg), self.cfg.weight_sync_steps
  local version = s - 1
  self.restored = nil
  local plan, batches = {}, {}
  local j = self.ahead + 1
  while j <= math.max(s, cfg.max_steps) and (async.version(j, L, W) <= version or j <= s) do
    plan[#plan + 1] = j
    batches[#plan] = self.sampler:next_batch()
    j = j + 1
  end
  if #plan > 0 then self.ahead = plan[#plan] end
  local waits_for_own = plan[1] ~= nil and plan[1] <= s   -- lag 0: step s's rows come this round

  if self.role == "generator" then
    local t0, parts, err = now(), {}, nil
    local ok, e = pcall(function()
      if #plan > 0 and self.held_version ~= version then
        error(("rollout rank %d holds the weights of version %d; step %d needs version %d"):format(self.world.rank,
          self.held_version, plan[1], version), 0)
      end
      for i, step in ipairs(plan) do
        local rows, first = self:my_prompts(batches[i])
        local ro = self.stepper:generate(rows, { step = step, version = version, first = first })
        parts[i] = async.plain(ro)
      end
    end)
    if not ok then err = tostring(e) end
    local busy = now() - t0
    local t1 = now()
    self.world:gather({ parts = parts, busy = busy, err = err, rank = self.world.rank })
    self:finish_round(s)
    return { ["async/generator_busy"] = busy, ["async/generator_idle"] = now() - t1, time_generate = busy }, nil
  end

  -- the trainer
  local m, whole
  local function train()
    local ro = assert(self.pending[s], "rollout ranks: no rows for the step")
    self.pending[s] = nil
    local dropped = 0
    if version - ro.policy_version > cfg.max_staleness then   -- too old: the trainer generates them again
      dropped = #ro.rows
      ro = self.stepper:generate(ro.prompts, { step = s, version = version, first = ro.first })
    end
    m, whole = self.stepper:learn(ro)
    m["async/staleness"] = version - ro.policy_version
    m["async/policy_version"] = ro.policy_version
    m["async/rows_dropped"] = dropped
  end
  local function receive()
    local t0 = now()
    local got = self.world:gather({ parts = {}, rank = 0 })
    local idle = now() - t0
    local busy, bad = 0, nil
    for r = 2, #got do
      busy = math.max(busy, got[r].busy or 0)
      if got[r].err and not bad then bad = ("rollout rank %d: %s"):format(got[r].rank, got[r].err) end
    end
    for i, step in ipairs(plan) do
      local parts = {}
      for r = 2, #got do if got[r].parts[i] then parts[#parts + 1] = got[r].parts[i] end end
      if #parts > 0 then self.pending[step] = setmetatable(merge(parts), rollout.Rollout) end
    end
    return idle, busy, bad
  end
  local idle, busy, bad
  local t0 = now()
  if waits_for_own then
    idle, busy, bad = receive()
    if not bad then train() end
  else
    train()
    idle, busy, bad = receive()
  end
  self:finish_round(s, bad)
  m["async/steps_ahead"] = self.ahead - s
  m["async/trainer_idle"] = idle
  m["async/generator_busy"] = busy
  m["async/trainer_busy"] = now() - t0 - idle
  return m, whole
end

-- The end of round s on every rank: rank 0 says whether to go on (a generator's error stops
-- every rank, naming it) and, at a weight sync, broadcasts the weights.
function Driver:finish_round(s, bad)
  local status = self.world:broadcast({ bad = bad })
  if status.bad then error(status.bad, 0) end
  if s % self.cfg.weight_sync_steps == 0 then
    self.world:broadcast_model(self.stepper:checkpoint_model())
    self.held_version = s
  end
end

-- What a checkpoint keeps (rank 0's: the rows generated ahead, all on the trainer between rounds).
function Driver:state()
  if self.restored then return self.restored end
  local list = {}
  for _, ro in pairs(self.pending) do list[#list + 1] = async.plain(ro) end
  table.sort(list, function(a, b) return a.step < b.step end)
  return { ahead = self.ahead, pending = { dist.encode(list) }, rollout_ranks = self.cfg.rollout_ranks }
end

function Driver:restore(st)
  if not st then return end
  self.restored = st
  self.ahead = st.ahead or 0
  self.pending = {}
  if self.role == "trainer" then
    for _, t in ipairs(dist.decode((st.pending or {})[1] or "return {}")) do
      self.pending[t.step] = setmetatable(t, rollout.Rollout)
    end
  end
end

return M
