-- remax.step.policy: the Policy, the language model being trained and what acts on it, shared by
-- the step types that train it (remax.step.rl, remax.step.sft): the tokenizer and template that
-- encode prompts, generation (one call for a sampling plan's rows, or multi-turn episodes), the
-- reward functions that score what it generated, the frozen reference, and the update over
-- training rows (micro-batches, all-reduce, clipping, the learning-rate schedule, AdamW) with
-- the optimizer's state.
--
--   local policy = Policy.new(pieces, cfg, hooks)      -- pieces: remax.run.setup.pieces's table
--   local ro = policy:rollout(prompt_rows, {step = n}) -- a remax.step.rollout
--   policy:score(ro)                                   -- rewards per row
--   local up = policy:update(rows, {step = n, iterations = mu, entropy = true})   -- one step's updates
--   policy:state() / policy:restore(state)             -- the optimizer's
--
-- A step type owns a Policy and adds what makes it that type: the RL step its advantage and
-- metrics, the SFT step its target rows. The Policy knows no estimator and no step type; hooks
-- are the Run's (say, progress, on_failure), passed on by the step.
local rewards = require("remax.step.rewards")
local data = require("remax.formats.data")
local optim = require("remax.bind.optim")
local chat = require("remax.text.chat")
local micro = require("remax.step.micro")
local rollout = require("remax.step.rollout")
local episodes = require("remax.step.episodes")   -- multi-turn: tools and environments (issue 37)
local offpolicy = require("remax.step.offpolicy")   -- the sampler's importance weights (issue 46)
local now = require("remax.bind.clock").now

local M = {}
local Policy = {}
Policy.__index = Policy
M.Policy = Policy

-- pieces: model, tok, stop, template, template_name, model_source, model_opts, fresh_config,
-- ref (or nil: loaded on first need), load_reference, rewards, accuracy_name, opt, world
-- (remax.bind.dist), train_ds (for the rewards' trainer state), recipe_dir. hooks: say,
-- progress, on_failure (each optional).
function M.new(pieces, cfg, hooks)
  hooks = hooks or {}
  local self = setmetatable({ cfg = cfg, dist = pieces.world, model = pieces.model, tok = pieces.tok,
    stop = pieces.stop, template = pieces.template, template_name = pieces.template_name,
    model_source = pieces.model_source, model_opts = pieces.model_opts, fresh_config = pieces.fresh_config,
    ref = pieces.ref, load_ref = pieces.load_reference, rewards = pieces.rewards,
    accuracy_name = pieces.accuracy_name, opt = pieces.opt, hooks = hooks,
    recipe_dir = pieces.recipe_dir }, Policy)   -- recipe_dir: where py: tools and environments are also looked for
  -- the schedule counts optimizer updates: num_iterations of them per step
  self.reward_info = rewards.state_info(cfg, pieces.train_ds, pieces.world)   -- for reward_state
  self.total_updates = cfg.max_steps * cfg.num_iterations
  self.warmup_steps = math.ceil(cfg.warmup_ratio * self.total_updates)
  return self
end

function Policy:say(text) if self.hooks.say then self.hooks.say(text) end end
-- The run's state at a step under TRL's trainer_state names, for py: rewards.
function Policy:reward_state(step) return rewards.trainer_state(self.cfg, step, self.reward_info) end
function Policy:progress() return self.hooks.progress and self.hooks.progress() end
-- A reward or episodes failed: the Run saves the last finished step (hooks.on_failure).
function Policy:failed(why) if self.hooks.on_failure then self.hooks.on_failure(why) end end

-- Generation seeds depend only on (seed, step), so a resumed run samples the same completions.
function Policy:seed_for(step) return self.cfg.seed * 1048576 + step end

-- The frozen reference model: the starting weights (the model folder, or the same fresh random
-- init), loaded on first need (also when a hot reload raises beta from 0).
function Policy:load_reference()
  if not self.ref then self.ref = self.load_ref(self) end
  return self.ref
end
function Policy:has_reference() return self.ref ~= nil end

-- A prompt (string or messages) -> token ids, truncated to its last max_prompt_length tokens
-- (then also its length before, as a third value; the first one is announced once per run).
function Policy:encode_prompt(prompt)
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

-- An answer text -> its token ids (no special tokens), for targets (SFT).
function Policy:encode_text(text) return self.tok:encode(text, { add_special_tokens = false }) end
function Policy:eos_id() return self.tok.eos_id end

---------------------------------------------------------------------------- generation

-- The checked tools and environment of the run's episodes (made once, remax.step.episodes, from
-- the first prompt's row that asks: a Lua environment factory's product says its kind).
-- Made again when a hot reload put other tools, environment or parser in the settings
-- (remax.run.reload compares them by their code): the old ones' workers and servers are closed.
function Policy:episode_setup(sample)
  local cfg, made = self.cfg, self.episodes_ready
  if made and made.given_tools == cfg.tools and made.given_env == cfg.environment
    and made.given_format == cfg.tool_call_format then
    return made
  end
  if made and made.registry then made.registry:close() end
  self.episodes_ready = episodes.setup(self, sample)
  return self.episodes_ready
end

-- Generate the rows of a sampling plan (default: the step's, cfg.sampling: num_generations
-- sampled rows and, with generate_greedy, one greedy row per prompt) for prompt_rows. Returns a
-- remax.step.rollout. opts: plan, step (the step whose seed generates: its number), first (the
-- place of prompt_rows[1] in the step's whole batch, every rank's prompts counted; default 1):
-- a row's samples are keyed by its place and slot (rollout.row_keys), so repeated prompts differ;
-- model (the weights that generate: default the trained model; remax.run.async passes older ones).
function Policy:rollout(prompt_rows, opts)
  opts = opts or {}
  local cfg = self.cfg
  local step = assert(opts.step, "rollout: opts.step (the step number) is required")
  if episodes.wanted(cfg) then   -- multi-turn: tools, environments
    local o = { setup = self:episode_setup(prompt_rows[1]) }
    for k, v in pairs(opts) do o[k] = v end
    return episodes.rollout(self, prompt_rows, o)
  end
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

---------------------------------------------------------------------------- rewards

-- Score every row with every reward. Adds per-row total and per-reward scores. With more than
-- one rank, a reward that fails on any rank stops every rank (after rank 0 saves the last
-- finished step); opts.alone scores without asking the other ranks (evaluation).
function Policy:score(ro, opts)
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
function Policy:reward_inputs(ro)
  if not ro.reward_args then ro.reward_args = { ro:reward_inputs(data.collate) } end
  return ro.reward_args[1], ro.reward_args[2]
end

-- Hands a rollout to the reward workers and servers now, so that they score it while something
-- else runs (evaluation generates its next chunk); score(ro) then collects their answers.
function Policy:score_ahead(ro)
  local completions, batch = self:reward_inputs(ro)
  rewards.send(self.rewards, completions, batch, { step = ro.step, state = self:reward_state(ro.step), timeout = rewards.limit(self.cfg.reward_timeout, ro.time_generate) })
end

-- The reward functions in force, and their replacement (hot reload), each already tried with trial.
function Policy:reward_functions() return self.rewards end
function Policy:set_rewards(list) self.rewards = list end
function Policy:set_reward(i, r) self.rewards[i] = r end
-- The rollout scored last (nil before the first), for trials of new reward functions.
function Policy:last_scored_rollout() return self.last_scored end

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
function Policy:trial(r, train_rows)
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

---------------------------------------------------------------------------- the update

-- What remax.step.micro's functions train with: the model, the reference, the ranks, the
-- settings, and the loss's entropy terms (entropy: the top-entropy token mask and the entropy
-- bonus of the settings; without, neither: SFT).
function Policy:trainer(entropy)
  local cfg = self.cfg
  return { model = self.model, ref = self.ref, world = self.dist, cfg = cfg,
    top_entropy_quantile = entropy and cfg.top_entropy_quantile or 1, entropy_coef = entropy and cfg.entropy_coef or 0 }
end

-- The policy's log-probabilities of the completion tokens of rollout ro's rows which (indices),
-- without gradients, or with reference the frozen reference's (loaded on first need): padded,
-- or packed with padding_free (remax.step.micro's row_logprobs).
function Policy:row_logprobs(ro, which, reference)
  local model = reference and self:load_reference() or self.model
  local seqs, lens, starts = ro:sequences(which)
  local lp = micro.row_logprobs(self.cfg, model, seqs, starts, lens, ("step %d"):format(ro.step or 0))
  local out = {}
  for n = 1, #which do
    out[n] = episodes.model_only(lp[n], ro.rows[which[n]].loss_mask)   -- an episode: its model tokens only
  end
  return out
end

-- One micro-batch's forward(s) and backward(s), padded or packed (padding-free training), and the
-- old log-probabilities of num_iterations > 1 from the same layout: remax.step.micro. tr: the
-- update's Policy:trainer. The activation plan is sized for the largest pack (at most
-- max_tokens_per_microbatch), growing when a longer one comes.
function Policy:set_old_logprobs(tr, rows, what) return micro.old_logprobs(tr, rows, what) end
function Policy:micro_step(tr, rows, totals, chunk, acc)
  local what = ("step %d"):format(chunk and chunk.step or 0)
  local packs = micro.packs(self.cfg, rows, what)
  self.reserved = micro.reserve(self.model, self.cfg, self.reserved, packs, what)
  return micro.run(tr, rows, totals, chunk, acc, packs)
end

-- Micro-batches of whole prompts, per_device_train_batch_size of them each: a prompt's rows
-- never split, so every row's advantage sits with its own prompt's other rows. Returns
-- chunks[c] = {rows = rows to train, tokens = loss tokens of all its rows}. Rows left out of
-- the forward: masked rows (no loss), and with skip_zero_advantage (beta = 0, every token
-- trains) rows whose advantage is exactly 0 (no gradient); both still count in the averages.
-- With padding_free, Policy:update then balances the rows over every rank's micro-batches by
-- tokens, each keeping its micro-batch's normalisers (remax.step.micro's balance).
function Policy:micro_batches(rows)
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

-- The optimizer updates of one step on training rows (each {prompt, prompt_ids, completion,
-- adv, ...}: a rollout's training_rows, or SFT's target rows). opts: step (the step's number),
-- iterations (optimizer updates on the same rows: num_iterations, 1 for SFT), entropy (the
-- loss's entropy terms, Policy:trainer). Returns metrics: loss and grad_norm are means over the
-- iterations, kl and entropy those of the first (the policy that generated the rows), clip
-- counts sums; finite false (and bad_loss, bad_norm) when an update was skipped.
function Policy:update(rows, opts)
  local cfg = self.cfg
  local t0 = now()
  local step = assert(opts.step, "update: opts.step (the step number) is required")
  local tr = self:trainer(opts.entropy)
  local chunks = self:micro_batches(rows)
  local totals = { rows = #rows, tokens = 0, chunks = #chunks }
  for _, r in ipairs(rows) do if not r.masked then totals.tokens = totals.tokens + episodes.loss_tokens(r) end end
  -- the loss is over the global batch
  totals.rows, totals.tokens, totals.chunks = self.dist:sum(totals.rows, totals.tokens, totals.chunks)
  -- padding_free: the rows of every rank's micro-batches balanced by tokens (each keeps its
  -- micro-batch's normalisers; a collective)
  chunks = micro.balance(tr, chunks)
  local mu = opts.iterations
  if mu > 1 then
    for _, c in ipairs(chunks) do if #c.rows > 0 then self:set_old_logprobs(tr, c.rows, ("step %d"):format(step)) end end
  end
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
        local st = self:micro_step(tr, c.rows, totals, c, acc)
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
  out.clip_low, out.clip_high, out.clip_n = self.dist:sum(out.clip_low, out.clip_high, out.clip_n)
  out.loss, out.grad_norm = out.loss / out.iterations, out.grad_norm / out.iterations
  out.time_train = now() - t0
  return out
end

---------------------------------------------------------------------------- state, ranks, files

-- The optimizer's state for an exact resume: {optimizer_step, tensors} (the moments; collective
-- under ZeRO unless without_moments, which gives the step count alone).
function Policy:state(without_moments)
  local os_ = without_moments and { step = self.opt.step_count } or self.opt:state()
  return { optimizer_step = os_.step, tensors = os_.tensors }
end

-- Restores Policy:state's; without tensors the step count alone (the moments came from rank 0
-- through share_from_root).
function Policy:restore(state)
  self.opt:load_state({ step = state.optimizer_step, tensors = state.tensors })
end

-- Collective: every rank takes rank 0's weights and optimizer moments (under ZeRO each rank its
-- shard of them).
function Policy:share_from_root()
  if self.opt.zero then
    self.opt:share_from_root()
    self.dist:broadcast_model(self.model)
  else
    self.dist:broadcast_model(self.model, self.opt:state().tensors)
  end
end

-- What the engine holds for training, in MiB: the policy (weights, gradients, activations, head
-- chunk), AdamW's moments, and the reference model (none with LoRA: the adapters-off policy).
function Policy:memory_mib()
  local m = self.model:memory()
  local bytes = m.params + m.grads + m.activations + m.head
  bytes = bytes + (self.opt and self.opt:state_bytes() or 0)
  if self.ref and self.ref.memory then
    local r = self.ref:memory()
    bytes = bytes + r.params + r.activations + r.head
  end
  return bytes / 1048576
end

-- The model a checkpoint saves (Hugging Face layout, or LoRA's adapters), the final model
-- (save_final_model) and the merged one (save_merged: LoRA's adapters merged into the base).
function Policy:checkpoint_model() return self.model end
function Policy:save(dir) self.model:save(dir) end
function Policy:save_merged(dir) require("remax.bind.lora").save_merged(self.model, dir) end

return M
