-- remax.step.rl: the RL step (ReMax, GRPO, RLOO, REINFORCE and the others of remax.step.algos),
-- one update of the Policy from its own samples:
--
--   prompts -> render + tokenize -> generate (num_generations sampled rows + 1 greedy row per
--   prompt, one call: a remax.step.rollout) -> decode -> rewards -> advantage = r(sample) -
--   r(greedy) -> per-token loss weights (algos) -> logprobs + backward per micro-batch -> clip ->
--   AdamW -> metrics.
--
-- Generation, scoring and the update are the Policy's (remax.step.policy); this file owns what
-- makes it RL: the advantage (with the k1 KL folded into rewards, the running-mean baseline of
-- the estimators that keep one), the step's metrics, and the completions it logs. It implements
-- the Step interface of remax.step.step, and for recipe loops rollout, score, advantage, update
-- and rl_metrics.
--
-- A new estimator is a change to remax.step.algos; a new reward kind to remax.step.rewards; a
-- multi-turn environment replaces the Policy's generation (docs/architecture.md, "Where to add").
local algos = require("remax.step.algos")
local policy_mod = require("remax.step.policy")
local evaluate = require("remax.step.evaluate")
local episodes = require("remax.step.episodes")

local M = {}
local Step = {}
Step.__index = Step
M.Step = Step

local function mean(list) return algos.mean(list) end

-- pieces: remax.run.setup.pieces's table (the Policy's, remax.step.policy.new). hooks: say,
-- progress, on_failure (each optional).
function M.new(pieces, cfg, hooks)
  return setmetatable({ cfg = cfg, dist = pieces.world, accuracy_name = pieces.accuracy_name,
    policy = policy_mod.new(pieces, cfg, hooks), baseline_state = nil }, Step)
end

---------------------------------------------------------------------------- the step pieces

-- The Policy's generation and scoring (remax.step.policy), for recipe loops and tasks.
function Step:rollout(prompt_rows, opts) return self.policy:rollout(prompt_rows, opts) end
function Step:score(ro, opts) return self.policy:score(ro, opts) end
function Step:reward_inputs(ro) return self.policy:reward_inputs(ro) end   -- the completions and batch rewards get
function Step:encode_prompt(prompt) return self.policy:encode_prompt(prompt) end

-- Rewards -> advantages (and the k1 KL folded into rewards when kl_estimator = "k1"). Rows that
-- no reward scored enter as NaN: no baseline uses them and their advantage is 0 (as in TRL).
function Step:advantage(ro)
  local cfg, policy = self.cfg, self.policy
  local reward = {}
  for k = 1, #ro.rows do reward[k] = (ro.none and ro.none[k]) and 0 / 0 or ro.total[k] end
  if cfg.kl_mode == "k1" then
    local all = {}
    for k = 1, #ro.rows do all[k] = k end
    local lp = policy:row_logprobs(ro, all)
    local ref = policy:row_logprobs(ro, all, true)
    ro.kl_k1 = {}
    for k = 1, #ro.rows do
      local r, s = algos.fold_kl(reward[k], lp[k], ref[k], cfg.beta)
      reward[k] = r
      ro.kl_k1[k] = s
    end
  end
  ro.reward = reward
  local groups = ro:grouped(reward)
  local kind = cfg.advantage or cfg.algo
  local aopts = {
    clip = cfg.advantage_clip, scale_rewards = cfg.scale_rewards, baseline = cfg.reinforce_baseline,
    momentum = cfg.baseline_momentum, step = ro.step, global_sum = function(...) return self.dist:sum(...) end,
  }
  local adv, state
  local algorithm = type(kind) == "string" and algos.algorithm(kind) or nil
  if cfg.multi_objective_aggregation == "normalize_then_sum" and algorithm and algorithm.per_reward then
    local per = {}   -- each reward function's scores, for an estimator over them (grpo's GDPO)
    for k, rw in ipairs(policy:reward_functions()) do per[k] = ro:sample_table(ro.per[rw.name]) end
    adv = algorithm.per_reward(per, cfg.reward_weights)
    local c = cfg.advantage_clip or 0
    if c > 0 then
      for _, a in ipairs(adv) do for j = 1, #a do a[j] = math.max(-c, math.min(c, a[j])) end end
    end
  else
    adv, state = algos.advantages(kind, groups, aopts, self.baseline_state)
  end
  ro.groups, ro.adv, ro.new_baseline_state = groups, adv, state
  if cfg.gamma ~= nil then ro.returns, ro.kl_k1 = algos.rollout_returns(ro, cfg.kl_mode == "return" and function(w)
    return policy:row_logprobs(ro, w), policy:row_logprobs(ro, w, true) end, cfg.beta, cfg.gamma) end
  return ro
end

-- num_iterations optimizer updates from a scored rollout with advantages (the Policy's update
-- of its training rows); the baseline moves on when they were finite. Returns the update's
-- metrics (remax.step.policy's Policy:update).
function Step:update(ro)
  local cfg = self.cfg
  local rows = ro:training_rows(cfg.mask_truncated_completions)
  local up = self.policy:update(rows, { step = ro.step, iterations = cfg.num_iterations, entropy = true })
  if up.finite and ro.new_baseline_state ~= nil then self.baseline_state = ro.new_baseline_state end
  return up
end

---------------------------------------------------------------------------- metrics and logging

-- Metrics of an RL step from the scored rollout and the update's numbers.
function Step:rl_metrics(ro, up)
  local m = {}
  local samples, greedy = {}, {}
  local lens, truncated, maxlen, minlen, stopped = {}, 0, 0, math.huge, {}
  local none = ro.none or {}
  for k, r in ipairs(ro.rows) do
    if r.greedy then
      if not none[k] then greedy[#greedy + 1] = ro.total[k] end
    else
      if not none[k] then samples[#samples + 1] = ro.total[k] end   -- unscored rows: no reward (TRL)
      local len = episodes.row_tokens(r)   -- the model's tokens (an episode's observations are not counted, as TRL)
      lens[#lens + 1] = len
      maxlen, minlen = math.max(maxlen, len), math.min(minlen, len)
      if r.finish == "length" then truncated = truncated + 1 else stopped[#stopped + 1] = len end
    end
  end
  m.reward, m.reward_std = mean(samples), algos.std(samples)
  if #greedy > 0 then m.reward_greedy = mean(greedy) end
  -- groups whose sampled rewards have no spread (GRPO and RLOO give them no signal)
  local flat = 0
  for _, g in ipairs(ro.groups or {}) do
    local vals = {}
    for _, v in ipairs(g.samples) do if v == v then vals[#vals + 1] = v end end
    if math.abs(algos.std(vals)) <= 1e-8 then flat = flat + 1 end
  end
  if ro.groups and #ro.groups > 0 then m.frac_reward_zero_std = flat / #ro.groups end
  for _, name in ipairs(self:reward_names(ro)) do
    local s, g = {}, {}
    for k, r in ipairs(ro.rows) do
      local v = ro.per[name][k]
      if v ~= nil then
        if r.greedy then g[#g + 1] = v else s[#s + 1] = v end
      end
    end
    if #s > 0 then m["reward/" .. name] = mean(s) end
    if #g > 0 then m["reward_greedy/" .. name] = mean(g) end
  end
  local advs = {}
  for _, a in ipairs(ro.adv) do for _, v in ipairs(a) do advs[#advs + 1] = v end end
  m.advantage_mean, m.advantage_std = mean(advs), algos.std(advs)
  -- how much of the step can move the policy: rows with a non-zero advantage, prompts with any
  local rows_nz, prompts_nz = 0, 0
  for _, a in ipairs(ro.adv) do
    local any = false
    for _, v in ipairs(a) do if v ~= 0 then rows_nz, any = rows_nz + 1, true end end
    if any then prompts_nz = prompts_nz + 1 end
  end
  m.frac_rows_nonzero_adv = #advs > 0 and rows_nz / #advs or 0
  m.frac_prompts_nonzero_adv = #ro.adv > 0 and prompts_nz / #ro.adv or 0
  if ro.kl_k1 then
    local s, n = 0, 0
    for k, r in ipairs(ro.rows) do if not r.greedy then s = s + ro.kl_k1[k]; n = n + episodes.row_tokens(r) end end
    m.kl = n > 0 and s / n or 0
  else
    m.kl = up.kl
  end
  m.completion_length_mean, m.completion_length_max = mean(lens), maxlen
  m.completion_length_min = #lens > 0 and minlen or 0
  if #stopped > 0 then m.completion_length_terminated_mean = mean(stopped) end
  m.truncated_fraction = #lens > 0 and truncated / #lens or 0
  -- prompts over max_prompt_length, kept by their last tokens (this rank's prompts)
  m.prompts_truncated = ro.prompts_truncated or 0
  m.frac_prompts_truncated = #ro.prompts > 0 and m.prompts_truncated / #ro.prompts or 0
  m.entropy = up.entropy
  if up.clip_n and up.clip_n > 0 then
    m["clip_ratio/low_mean"] = up.clip_low / up.clip_n
    m["clip_ratio/high_mean"] = up.clip_high / up.clip_n
    m["clip_ratio/region_mean"] = (up.clip_low + up.clip_high) / up.clip_n
  end
  if up.iterations and self.cfg.num_iterations > 1 then m.iterations = up.iterations end
  m.tokens_per_s = ro.time_generate > 0 and ro.tokens_generated / ro.time_generate or 0
  m.time_generate, m.time_score = ro.time_generate, ro.time_score
  if ro.unscored > 0 then m.unscored = ro.unscored end
  if ro.episodes then for k, v in pairs(episodes.metrics(ro, self.cfg.tools ~= nil)) do m[k] = v end end
  for k, v in pairs(up.sampling or {}) do m[k] = v end   -- the off-policy correction's (TRL's sampling/*)
  return m
end

-- The reward columns of a scored rollout: the reward functions', then the environment's (its
-- per-turn rewards summed, remax.step.episodes) when it gave any.
function Step:reward_names(ro)
  local names = {}
  for _, rw in ipairs(self.policy:reward_functions()) do names[#names + 1] = rw.name end
  if ro.per and ro.per.environment then
    local known = false
    for _, n in ipairs(names) do known = known or n == "environment" end
    if not known then names[#names + 1] = "environment" end
  end
  return names
end

-- Stops the run (strict_episodes) when more than episodes.FAILING_SHARE of the step's
-- episodes, over every rank, failed; names the most frequent error of this rank's.
function Step:check_episodes(ro)
  local f = episodes.failures(ro)
  local failed, total = self.dist:sum(f.failed, f.total)
  local warning = episodes.failure_warning(failed, total, f.top)
  if warning and self.cfg.strict_episodes then
    local why = ("strict_episodes: step %d: %s"):format(ro.step or 0, warning)
    self.policy:failed(why)
    error(why, 0)
  end
end

---------------------------------------------------------------------------- the Step interface

-- One full step on this rank's prompts; returns its metrics and the rollout gathered on rank 0
-- (for the Run's completion log). ctx.step: the step's number; ctx.first: the place of batch[1]
-- in the step's whole batch (remax.bind.dist's share).
function Step:run(batch, ctx)
  local step = assert(ctx and ctx.step, "Step:run: ctx.step (the step number) is required")
  return self:learn(self:generate(batch, { step = step, first = ctx.first }))
end

-- The generate-and-score half of an RL step: this rank's prompts -> a scored rollout, its rows
-- stamped with the policy version that generated them. opts: step (whose seed generates), first
-- (as run's ctx.first), model (the generating weights: default the trained model), version
-- (their version, in updates: default none). Rollout ranks and remax.run.async's schedule call
-- it ahead of training.
function Step:generate(batch, opts)
  local ro = self:rollout(batch, { step = opts.step, model = opts.model, first = opts.first })
  if ro.episodes then self:check_episodes(ro) end
  ro.first, ro.policy_version = opts.first, opts.version
  for _, r in ipairs(ro.rows) do r.policy_version = opts.version end
  return self:score(ro)
end

-- The loss-and-update half: a scored rollout -> advantages, one update, metrics; returns the
-- metrics and, on rank 0, the whole step's rollout (for the Run's completion log).
function Step:learn(ro)
  self:advantage(ro)
  local up = self:update(ro)
  ro = ro:gather(self.dist)   -- rank 0: the whole step's rows, for metrics and logs
  local m = self:rl_metrics(ro, up)
  m.loss, m.grad_norm, m.lr, m.time_train = up.loss, up.grad_norm, up.lr, up.time_train
  if not up.finite then m.skipped, m.bad_loss, m.bad_norm = true, up.bad_loss, up.bad_norm end
  return m, ro
end

-- What completions.jsonl keeps of a (gathered) rollout: one record per row.
function Step:completion_records(ro)
  local list = {}
  for k, r in ipairs(ro.rows) do
    local per = {}
    for _, name in ipairs(self:reward_names(ro)) do per[name] = ro.per[name][k] end
    -- the prompt the model saw: an episode's first messages (its environment's reset), else the dataset's
    local prompt = ro.prompt_messages and ro.prompt_messages[r.prompt] or ro.prompts[r.prompt].prompt
    list[#list + 1] = episodes.record(r, { prompt = prompt, completion = r.text,   -- + an episode's messages
      reward = ro.total[k], rewards = per, advantage = ro:advantage(k), greedy = r.greedy and true or false })
  end
  return list
end

-- What an exact resume needs of the step: the optimizer (its moments as tensors; collective
-- under ZeRO unless without_moments) and the baseline of the running-mean estimators. RNG
-- seeds derive from (seed, step): no state.
function Step:state(without_moments)
  local st = self.policy:state(without_moments)
  return { optimizer_step = st.optimizer_step, tensors = st.tensors, baseline = self.baseline_state }
end

function Step:restore(state)
  self.policy:restore(state)
  self.baseline_state = state.baseline
end

-- Held-out evaluation of rows (remax.step.evaluate): greedy accuracy and reward, with
-- opts.samples = K sampled accuracy and pass@k too.
function Step:evaluate(rows, opts)
  return evaluate.run({ policy = self.policy, cfg = self.cfg, world = self.dist, accuracy_name = self.accuracy_name }, rows, opts)
end

-- The rest of the Step interface is the Policy's: ranks, memory, files, hot reload.
function Step:share_from_root() return self.policy:share_from_root() end
function Step:memory_mib() return self.policy:memory_mib() end
function Step:checkpoint_model() return self.policy:checkpoint_model() end
function Step:save(dir) return self.policy:save(dir) end
function Step:save_merged(dir) return self.policy:save_merged(dir) end
function Step:reward_functions() return self.policy:reward_functions() end
function Step:trial(r, train_rows) return self.policy:trial(r, train_rows) end
function Step:set_rewards(list) return self.policy:set_rewards(list) end
function Step:set_reward(i, r) return self.policy:set_reward(i, r) end
function Step:has_reference() return self.policy:has_reference() end
function Step:load_reference() return self.policy:load_reference() end

return M
