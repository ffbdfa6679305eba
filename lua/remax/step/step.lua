-- remax.step.step: the Step, one RL (or SFT) update, and nothing of the run around it:
--
--   prompts -> render + tokenize -> generate (num_generations sampled rows + 1 greedy row per
--   prompt, one call: a remax.step.rollout) -> decode -> rewards -> advantage = r(sample) -
--   r(greedy) -> per-token loss weights (algos) -> logprobs + backward per micro-batch -> clip ->
--   AdamW -> metrics.
--
-- The Run (remax.run.run) owns the loop, the step counter, the data order, checkpoints, logs and
-- hot reload, and talks to the Step through a few methods:
--
--   local step = Step.new(pieces, cfg, hooks)   -- pieces: remax.run.setup.pieces's table
--   local m, ro = step:run(batch, {step = n})   -- one update on this rank's prompts: metrics
--   step:state() / step:restore(state)          -- what an exact resume needs of the Step
--   step:evaluate(rows, {samples = K})          -- held-out accuracy (remax.step.evaluate)
--   step:completion_records(ro)                 -- what completions.jsonl keeps of a rollout
--
-- The Step never reads the run folder, the schedule or the logs; hooks are how it speaks:
-- hooks.say(text) (a line for the user), hooks.progress() (the live progress line or nil) and
-- hooks.on_failure(why) (a reward failed: the Run saves the last finished step). cfg is the
-- resolved settings, read here, written only by the Run (hot reload).
--
-- A new estimator is a file in step/algos/ (remax.step.algos), a new loss type one in
-- step/loss_types/; a new reward kind is a change to remax.step.rewards; a multi-turn environment
-- replaces Step:rollout's generation (docs/architecture.md, "Where to add").
local algos = require("remax.step.algos")
local rewards = require("remax.step.rewards")
local data = require("remax.formats.data")
local tensor = require("remax.bind.tensor")
local optim = require("remax.bind.optim")
local chat = require("remax.text.chat")
local fit = require("remax.step.fit")
local micro = require("remax.step.micro")
local rollout = require("remax.step.rollout")
local evaluate = require("remax.step.evaluate")
local episodes = require("remax.step.episodes")   -- multi-turn: tools and environments (issue 37)
local offpolicy = require("remax.step.offpolicy")   -- the sampler's importance weights (issue 46)
local now = require("remax.bind.clock").now

local M = {}
local Step = {}
Step.__index = Step
M.Step = Step

local function mean(list) return algos.mean(list) end

-- pieces: model, tok, stop, template, template_name, model_source, model_opts, fresh_config,
-- ref (or nil: loaded on first need), rewards, opt, world (remax.bind.dist), setup (the module
-- that loads a reference later). hooks: say, progress, on_failure (each optional).
function M.new(pieces, cfg, hooks)
  hooks = hooks or {}
  local self = setmetatable({ cfg = cfg, dist = pieces.world, model = pieces.model, tok = pieces.tok,
    stop = pieces.stop, template = pieces.template, template_name = pieces.template_name,
    model_source = pieces.model_source, model_opts = pieces.model_opts, fresh_config = pieces.fresh_config,
    ref = pieces.ref, load_ref = pieces.load_reference, rewards = pieces.rewards,
    accuracy_name = pieces.accuracy_name, opt = pieces.opt, hooks = hooks, baseline_state = nil,
    recipe_dir = pieces.recipe_dir }, Step)   -- recipe_dir: where py: tools and environments are also looked for
  -- the schedule counts optimizer updates: num_iterations of them per step
  self.reward_info = rewards.state_info(cfg, pieces.train_ds, pieces.world)   -- for reward_state
  self.total_updates = cfg.max_steps * cfg.num_iterations
  self.warmup_steps = math.ceil(cfg.warmup_ratio * self.total_updates)
  return self
end

function Step:say(text) if self.hooks.say then self.hooks.say(text) end end
-- The run's state at a step under TRL's trainer_state names, for py: rewards.
function Step:reward_state(step) return rewards.trainer_state(self.cfg, step, self.reward_info) end
function Step:progress() return self.hooks.progress and self.hooks.progress() end

-- Generation seeds depend only on (seed, step), so a resumed run samples the same completions.
function Step:seed_for(step) return self.cfg.seed * 1048576 + step end

-- The frozen reference model: the starting weights (the model folder, or the same fresh random
-- init), loaded on first need (also when a hot reload raises beta from 0).
function Step:load_reference()
  if not self.ref then self.ref = self.load_ref(self) end
  return self.ref
end

-- A prompt (string or messages) -> token ids, truncated to its last max_prompt_length tokens
-- (then also its length before, as a third value; the first one is announced once per run).
function Step:encode_prompt(prompt)
  local ids, text = chat.encode(self.tok, prompt, self.template)
  local max = self.cfg.max_prompt_length
  local before
  if #ids > max then
    before = #ids
    local cut = {}
    for i = #ids - max + 1, #ids do cut[#cut + 1] = ids[i] end
    ids = cut
    if not self.said_prompt_truncated then
      self.said_prompt_truncated = true
      self:say(("a prompt of %d tokens is longer than max_prompt_length = %d: it keeps its last %d tokens " ..
        "(every step counts such prompts in the prompts_truncated and frac_prompts_truncated metrics)"):format(before, max, max))
    end
  end
  return ids, text, before
end

---------------------------------------------------------------------------- the step pieces

-- Generate the rows of a sampling plan (default: the step's, cfg.sampling: num_generations
-- sampled rows and, with generate_greedy, one greedy row per prompt) for prompt_rows. Returns a
-- remax.step.rollout. opts: plan, step (the step whose seed generates: its number), first (the
-- place of prompt_rows[1] in the step's whole batch, every rank's prompts counted; default 1):
-- a row's samples are keyed by its place and slot (rollout.row_keys), so repeated prompts differ;
-- model (the weights that generate: default the trained model; remax.run.async passes older ones).
function Step:rollout(prompt_rows, opts)
  opts = opts or {}
  local cfg = self.cfg
  local step = assert(opts.step, "Step:rollout: opts.step (the step number) is required")
  if episodes.wanted(cfg) then return episodes.rollout(self, prompt_rows, opts) end   -- multi-turn: tools, environments
  local plan = opts.plan or cfg.sampling
  local prompt_ids, prompts_truncated = {}, 0
  for i, row in ipairs(prompt_rows) do
    local ids, _, before = self:encode_prompt(row.prompt)
    prompt_ids[i] = ids
    if before then prompts_truncated = prompts_truncated + 1 end
  end
  local t0 = now()
  local out = (opts.model or self.model):generate(prompt_ids, {
    max_new_tokens = cfg.max_completion_length, rows_per_prompt = plan.slots, temperature = plan.temperatures, top_p = cfg.top_p, top_k = cfg.top_k,
    min_p = cfg.min_p, repetition_penalty = cfg.repetition_penalty, stop_strings = cfg.stop_strings,
    detokenize = cfg.stop_strings and function(ids) return self.tok:decode(ids, { skip_special_tokens = true }) end,
    stop = self.stop, seed = self:seed_for(step), row_keys = rollout.row_keys(plan.slots, #prompt_ids, opts.first),
    on_token = self:progress() and self:progress():ticker("generating: token %d/%d"),
  })
  local seconds = now() - t0
  for _, r in ipairs(out.rows) do r.text = self.tok:decode(r.tokens, { skip_special_tokens = true }) end
  return rollout.new(plan, { prompts = prompt_rows, prompt_ids = prompt_ids, prompts_truncated = prompts_truncated,
    rows = out.rows, tokens_generated = out.tokens_generated, time_generate = seconds, step = step })
end

-- Score every row with every reward. Adds per-row total and per-reward scores. With more than
-- one rank, a reward that fails on any rank stops every rank (after rank 0 saves the last
-- finished step); opts.alone scores without asking the other ranks (evaluation).
function Step:score(ro, opts)
  local t0 = now()
  local rows = ro.rows
  local completions, batch = self:reward_inputs(ro)
  local per, total, unscored, none
  if self.dist.size == 1 or (opts and opts.alone) then
    per, total, unscored, none = rewards.score(self.rewards, self.cfg.reward_weights, completions, batch, {
      step = ro.step, state = self:reward_state(ro.step), timeout = rewards.limit(self.cfg.reward_timeout, ro.time_generate), on_failure = function() self:failed() end,
      padding_free = self.cfg.padding_free,   -- reward models: packed or padded forwards
    })
  else
    local ok, a, b, c, d = pcall(rewards.score, self.rewards, self.cfg.reward_weights, completions, batch,
      { step = ro.step, state = self:reward_state(ro.step), timeout = rewards.limit(self.cfg.reward_timeout, ro.time_generate),
        padding_free = self.cfg.padding_free })
    local all_ok, msg, rank = self.dist:agree(ok, a)
    if not all_ok then
      self:failed()
      self.dist:barrier()   -- the checkpoint is on disk before any rank exits
      error(("%s (on rank %d)"):format(msg, rank), 0)
    end
    per, total, unscored, none = a, b, c, d
  end
  if ro.episodes then per, total, unscored, none = episodes.add_environment_reward(ro, per, total, unscored, none) end
  ro.completions, ro.batch, ro.per, ro.total, ro.unscored, ro.none = completions, batch, per, total, unscored, none
  if unscored > 0 and ro.G > 0 and (ro.step or 0) > 0 then
    for k = 1, #rows do
      if none[k] then
        -- as TRL warns: such a row gets advantage 0 and stays out of the baselines
        self:say(("step %d: no reward function scored %d of %d completions (they get advantage 0), e.g. completion %d: %q")
          :format(ro.step, unscored, #rows, k, completions[k]:sub(1, 200)))
        break
      end
    end
  end
  ro.time_score = now() - t0
  self.last_scored = ro
  return ro
end

-- The completions and batch columns the rewards get for a rollout (made once per rollout).
function Step:reward_inputs(ro)
  if not ro.reward_args then ro.reward_args = { ro:reward_inputs(data.collate) } end
  return ro.reward_args[1], ro.reward_args[2]
end

-- Hands a rollout to the reward workers and servers now, so that they score it while something
-- else runs (evaluation generates its next chunk); score(ro) then collects their answers.
function Step:score_ahead(ro)
  local completions, batch = self:reward_inputs(ro)
  rewards.send(self.rewards, completions, batch, { step = ro.step, state = self:reward_state(ro.step), timeout = rewards.limit(self.cfg.reward_timeout, ro.time_generate) })
end

-- Policy (and reference) log-probabilities of the completion tokens of rows, without gradients:
-- padded, or packed with padding_free (remax.step.micro's row_logprobs).
function Step:row_logprobs(model, ro, which)
  local seqs, lens, starts = ro:sequences(which)
  local lp = micro.row_logprobs(self, model, seqs, starts, lens, ("step %d"):format(ro.step or 0))
  local out = {}
  for n = 1, #which do
    out[n] = episodes.model_only(lp[n], ro.rows[which[n]].loss_mask)   -- an episode: its model tokens only
  end
  return out
end

-- Rewards -> advantages (and the k1 KL folded into rewards when kl_estimator = "k1"). Rows that
-- no reward scored enter as NaN: no baseline uses them and their advantage is 0 (as in TRL).
function Step:advantage(ro)
  local cfg = self.cfg
  local reward = {}
  for k = 1, #ro.rows do reward[k] = (ro.none and ro.none[k]) and 0 / 0 or ro.total[k] end
  if cfg.kl_mode == "k1" then
    local all = {}
    for k = 1, #ro.rows do all[k] = k end
    local lp = self:row_logprobs(self.model, ro, all)
    local ref = self:row_logprobs(self:load_reference(), ro, all)
    ro.kl_k1 = {}
    for k = 1, #ro.rows do
      local r, s = algos.fold_kl(reward[k], lp[k], ref[k], cfg.beta)
      reward[k] = r
      ro.kl_k1[k] = s
    end
  end
  ro.reward = reward
  local groups = ro:grouped(reward)
  local kind = self.advantage_fn or cfg.advantage or cfg.algo
  local aopts = {
    clip = cfg.advantage_clip, scale_rewards = cfg.scale_rewards, baseline = cfg.reinforce_baseline,
    momentum = cfg.baseline_momentum, step = ro.step, global_sum = function(...) return self.dist:sum(...) end,
  }
  local adv, state
  local algorithm = type(kind) == "string" and algos.algorithm(kind) or nil
  if cfg.multi_objective_aggregation == "normalize_then_sum" and algorithm and algorithm.per_reward then
    local per = {}   -- each reward function's scores, for an estimator over them (grpo's GDPO)
    for k, rw in ipairs(self.rewards) do per[k] = ro:sample_table(ro.per[rw.name]) end
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
    return self:row_logprobs(self.model, ro, w), self:row_logprobs(self:load_reference(), ro, w) end, cfg.beta, cfg.gamma) end
  return ro
end

-- One micro-batch's forward(s) and backward(s), padded or packed (padding-free training), and the
-- old log-probabilities of num_iterations > 1 from the same layout: remax.step.micro.
function Step:set_old_logprobs(rows, what) return micro.old_logprobs(self, rows, what) end
function Step:micro_step(rows, totals, chunk, acc) return micro.run(self, rows, totals, chunk, acc) end

-- Micro-batches of whole prompts, per_device_train_batch_size of them each: a prompt's rows
-- never split, so every row's advantage sits with its own prompt's other rows. Returns
-- chunks[c] = {rows = rows to train, tokens = loss tokens of all its rows}. Rows left out of
-- the forward: masked rows (no loss), and with skip_zero_advantage (beta = 0, every token
-- trains) rows whose advantage is exactly 0 (no gradient); both still count in the averages.
-- With padding_free, Step:update then balances the rows over every rank's micro-batches by
-- tokens, each keeping its micro-batch's normalisers (remax.step.micro's balance).
function Step:micro_batches(rows)
  local cfg = self.cfg
  local skip = cfg.skip_zero_rows
  local by_prompt, order = {}, {}
  for _, r in ipairs(rows) do
    if not by_prompt[r.prompt] then by_prompt[r.prompt] = {}; order[#order + 1] = r.prompt end
    table.insert(by_prompt[r.prompt], r)
  end
  local per, chunks = cfg.per_device_train_batch_size, {}
  for i, p in ipairs(order) do
    local c = math.floor((i - 1) / per) + 1
    chunks[c] = chunks[c] or { rows = {}, tokens = 0 }
    for _, r in ipairs(by_prompt[p]) do
      if not r.masked then chunks[c].tokens = chunks[c].tokens + episodes.loss_tokens(r) end
      if not (r.masked or (skip and r.adv == 0)) then table.insert(chunks[c].rows, r) end
    end
  end
  return chunks
end

-- One optimizer update per iteration (num_iterations of them) from a scored rollout (RL), or one
-- from a list of SFT rows. Returns metrics: loss and grad_norm are means over the iterations,
-- kl and entropy those of the first (the policy that generated the rollout), clip counts sums.
function Step:update(ro)
  local cfg = self.cfg
  local t0 = now()
  local rows = ro.train_rows or ro:training_rows(cfg.mask_truncated_completions)
  local chunks = self:micro_batches(rows)
  local totals = { rows = #rows, tokens = 0, chunks = #chunks }
  for _, r in ipairs(rows) do if not r.masked then totals.tokens = totals.tokens + episodes.loss_tokens(r) end end
  -- the loss is over the global batch
  totals.rows, totals.tokens, totals.chunks = self.dist:sum(totals.rows, totals.tokens, totals.chunks)
  -- padding_free: the rows of every rank's micro-batches balanced by tokens (each keeps its
  -- micro-batch's normalisers; a collective)
  chunks = micro.balance(self, chunks)
  local mu = (ro.train_rows or cfg.algo == "sft") and 1 or cfg.num_iterations
  if mu > 1 then
    for _, c in ipairs(chunks) do if #c.rows > 0 then self:set_old_logprobs(c.rows, ("step %d"):format(ro.step or 0)) end end
  end
  local step = assert(ro.step, "Step:update: the rollout's step number is required")
  local out = { loss = 0, grad_norm = 0, iterations = 0, clip_low = 0, clip_high = 0, clip_n = 0, finite = true,
    rows_trained = 0, tokens_trained = 0, tokens_total = totals.tokens, rows_total = totals.rows }
  for it = 1, mu do
    self.model:zero_grad()
    local loss, kl_sum, tokens, trained, ent_sum, ent_n = 0, 0, 0, 0, 0, 0
    -- micro_step holds and adds the gradients of each pack; sampling: the correction's statistics
    local acc = { earlier = false, sampling = it == 1 and cfg.vllm_importance_sampling_correction and offpolicy.stats() or nil }
    for _, c in ipairs(chunks) do
      if #c.rows > 0 then
        c.step = step
        local st = self:micro_step(c.rows, totals, c, acc)
        loss, kl_sum, tokens = loss + st.loss, kl_sum + st.kl_sum, tokens + st.tokens
        ent_sum, ent_n = ent_sum + st.entropy_sum, ent_n + st.entropy_n
        out.clip_low, out.clip_high, out.clip_n = out.clip_low + st.clip_low, out.clip_high + st.clip_high,
          out.clip_n + st.clip_n
        trained = trained + #c.rows
      end
    end
    -- each rank's gradient is its share of the global loss: their sum is the whole batch's
    loss, kl_sum, tokens, trained, ent_sum, ent_n = self.dist:sum(loss, kl_sum, tokens, trained, ent_sum, ent_n)
    local norm
    if self.opt.zero then   -- ZeRO: the optimizer sums (stage 2: scatters) the gradients and clips
      norm = self.opt:reduce_grads(cfg.max_grad_norm)
    else
      self.dist:allreduce_grads(self.model)
      norm = self.opt:clip(cfg.max_grad_norm)   -- over the flat gradient buffer
    end
    local lr = optim.schedule(cfg.lr_scheduler_type, cfg.learning_rate, (step - 1) * mu + it, self.total_updates,
      self.warmup_steps)
    if it == 1 then
      out.sampling = acc.sampling and offpolicy.metrics(offpolicy.reduce(self.dist, acc.sampling), cfg.vllm_importance_sampling_mode)
      out.kl = tokens > 0 and kl_sum / tokens or 0
      out.entropy = ent_n > 0 and ent_sum / ent_n or nil
      out.rows_trained, out.tokens_trained = trained, tokens
    end
    out.lr, out.iterations = lr, it
    out.loss, out.grad_norm = out.loss + loss, out.grad_norm + norm
    local finite = loss == loss and math.abs(loss) ~= math.huge and norm == norm and norm ~= math.huge
    if finite then
      self.opt:step(lr)
    else
      -- the Run counts such steps (max_bad_steps) and says so
      out.finite, out.bad_loss, out.bad_norm = false, loss, norm
      self.model:zero_grad()
      break
    end
  end
  if out.finite and ro.new_baseline_state ~= nil then self.baseline_state = ro.new_baseline_state end
  out.clip_low, out.clip_high, out.clip_n = self.dist:sum(out.clip_low, out.clip_high, out.clip_n)
  out.loss, out.grad_norm = out.loss / out.iterations, out.grad_norm / out.iterations
  out.time_train = now() - t0
  return out
end

-- SFT rows for prompts: target = the answer column + EOS; only target tokens count.
function Step:sft_rows(prompt_rows)
  local col = self.cfg.answer_column or "answer"
  local list = {}
  for i, row in ipairs(prompt_rows) do
    local p = self:encode_prompt(row.prompt)
    local target = row[col]
    if type(target) ~= "string" then
      error(("algo = sft: row %d has no string '%s' column (the target)"):format(i, col), 0)
    end
    local ids = self.tok:encode(target, { add_special_tokens = false })
    ids[#ids + 1] = self.tok.eos_id
    if #ids > self.cfg.max_completion_length then
      local cut = {}
      for t = 1, self.cfg.max_completion_length do cut[t] = ids[t] end
      ids = cut
    end
    list[i] = { prompt = i, prompt_ids = p, completion = ids, adv = 1 }
  end
  return list
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
  for _, rw in ipairs(self.rewards) do names[#names + 1] = rw.name end
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
    self:failed(why)
    error(why, 0)
  end
end

---------------------------------------------------------------------------- the Step's interface

-- One full step (RL or SFT) on this rank's prompts; returns its metrics and, for RL, the
-- rollout gathered on rank 0 (for the Run's completion log). ctx.step: the step's number;
-- ctx.first: the place of batch[1] in the step's whole batch (remax.bind.dist's share).
function Step:run(batch, ctx)
  local cfg = self.cfg
  local step = assert(ctx and ctx.step, "Step:run: ctx.step (the step number) is required")
  local m, ro
  if cfg.algo == "sft" then
    local rows = self:sft_rows(batch)
    local up = self:update({ train_rows = rows, step = step })
    m = { loss = up.loss, grad_norm = up.grad_norm, lr = up.lr, time_train = up.time_train,
      tokens_per_s = up.tokens_trained / math.max(up.time_train, 1e-9),
      completion_length_mean = up.tokens_total / up.rows_total, time_generate = 0, time_score = 0 }
    local maxlen = 0
    for _, r in ipairs(rows) do maxlen = math.max(maxlen, #r.completion) end
    m.completion_length_max = maxlen
    if not up.finite then m.skipped, m.bad_loss, m.bad_norm = true, up.bad_loss, up.bad_norm end
  else
    m, ro = self:learn(self:generate(batch, { step = step, first = ctx.first }))
  end
  return m, ro
end

-- The generate-and-score half of an RL step: this rank's prompts -> a scored rollout, its rows
-- stamped with the policy version that generated them. opts: step (whose seed generates), model
-- (the generating weights: default the trained model), version (their version, in updates:
-- default none). Rollout ranks and remax.run.async's schedule call it ahead of training.
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

-- What an exact resume needs of the Step: the optimizer (its moments as tensors; collective
-- under ZeRO unless without_moments) and the baseline of the running-mean estimators. RNG
-- seeds derive from (seed, step): no state.
function Step:state(without_moments)
  local os_ = without_moments and { step = self.opt.step_count } or self.opt:state()
  return { optimizer_step = os_.step, tensors = os_.tensors, baseline = self.baseline_state }
end

function Step:restore(state)
  self.opt:load_state({ step = state.optimizer_step, tensors = state.tensors })
  self.baseline_state = state.baseline
end

-- The optimizer's moments without the step count (for ranks that broadcast them).
function Step:optimizer_tensors() return self.opt:state().tensors end

-- Every rank starts from rank 0's weights and optimizer: the model (and, without ZeRO, the
-- moments in `tensors`) broadcast from rank 0.
function Step:share_from_root(tensors)
  if self.opt.zero then self.opt:share_from_root() end   -- ZeRO: each rank gets its shard of the moments
  self.dist:broadcast_model(self.model, tensors)
end

-- Held-out evaluation of rows (remax.step.evaluate): greedy accuracy and reward, with
-- opts.samples = K sampled accuracy and pass@k too.
function Step:evaluate(rows, opts) return evaluate.run(self, rows, opts) end

-- Replace the reward functions (hot reload), each already tried with Step:trial.
function Step:set_rewards(list) self.rewards = list end
function Step:set_reward(i, r) self.rewards[i] = r end

-- Before the first step there are no completions yet: the trial runs on the first training
-- rows, with their answers (or "0") standing in for completions, as the start-up probe does.
local function probe_scored(self, train_rows)
  local n = math.min(#train_rows, 4)
  local rows, completions = {}, {}
  for i = 1, n do
    rows[i] = train_rows[i]
    local a = rows[i][self.cfg.answer_column or "answer"]
    completions[i] = type(a) == "string" and a or "0"
  end
  local batch = data.collate(rows)
  batch.prompt_ids, batch.completion_ids, batch.greedy, batch.finish = {}, {}, {}, {}
  for i = 1, n do
    batch.prompt_ids[i] = self:encode_prompt(rows[i].prompt)
    batch.completion_ids[i] = self.tok:encode(completions[i], { add_special_tokens = false })
    batch.greedy[i], batch.finish[i] = false, "stop"
    if type(rows[i].prompt) == "table" then
      batch.completion_messages = batch.completion_messages or {}
      batch.completion_messages[i] = { { role = "assistant", content = completions[i] } }
    end
  end
  return { completions = completions, batch = batch }
end

-- A reward must run on (a few of) the last completions (before the first step: the first
-- training rows) and give finite numbers or nil.
function Step:trial(r, train_rows)
  local ro = self.last_scored or probe_scored(self, train_rows)
  local n = math.min(#ro.completions, 4)
  local comps, batch = {}, {}
  for i = 1, n do comps[i] = ro.completions[i] end
  for k, col in pairs(ro.batch) do
    if type(col) == "table" then
      batch[k] = {}
      for i = 1, n do batch[k][i] = col[i] end
    end
  end
  rewards.run_one(r, comps, batch, { timeout = rewards.limit(self.cfg.reward_timeout), state = self:reward_state(ro.step or 0),
    padding_free = self.cfg.padding_free })
end

-- What the engine holds for training, in MiB: the policy (weights, gradients, activations, head
-- chunk), AdamW's moments, and the reference model (none with LoRA: the adapters-off policy).
function Step:memory_mib()
  local m = self.model:memory()
  local bytes = m.params + m.grads + m.activations + m.head
  bytes = bytes + (self.opt and self.opt:state_bytes() or 0)
  if self.ref and self.ref.memory then
    local r = self.ref:memory()
    bytes = bytes + r.params + r.activations + r.head
  end
  return bytes / 1048576
end

-- A reward failed: the Run saves the last finished step (hooks.on_failure).
function Step:failed(why) if self.hooks.on_failure then self.hooks.on_failure(why) end end

return M
