-- remax.trainer: the training loop. One ReMax step:
--
--   prompts -> render + tokenize -> generate (num_generations sampled rows + 1 greedy row per
--   prompt, one call) -> decode -> rewards -> advantage = r(sample) - r(greedy) -> per-token
--   loss weights (algos) -> logprobs + backward per micro-batch -> clip -> AdamW -> metrics.
--
--   local t = trainer.new(cfg, {recipe_path = "recipes/gsm8k.lua"})
--   t:train()
--
-- A recipe can drive the steps itself with the same pieces:
--   local rows = t:next_batch(); local ro = t:rollout(rows); local sc = t:score(ro)
--   local adv = t:advantage(sc); local m = t:update(adv); t:finish_step(m)
local ffi = require("ffi")
local remax = require("remax")
local config = require("remax.config")
local algos = require("remax.algos")
local rewards = require("remax.rewards")
local recipe_mod = require("remax.recipe")
local data = require("remax.data")
local chat = require("remax.chat")
local tensor = require("remax.tensor")
local optim = require("remax.optim")
local dist = require("remax.dist")
local fit = require("remax.fit")

local M = {}
local Trainer = {}
Trainer.__index = Trainer
M.Trainer = Trainer

M.DEFAULT_MODEL = "models/tiny-gsm8k"

---------------------------------------------------------------------------- small helpers

pcall(ffi.cdef, "typedef struct { long tv_sec; long tv_nsec; } rx_trainer_timespec;" ..
  "int clock_gettime(int clk_id, rx_trainer_timespec *tp);")
local ts = ffi.new("rx_trainer_timespec")
local function now()
  if pcall(ffi.C.clock_gettime, 1, ts) then return tonumber(ts.tv_sec) + tonumber(ts.tv_nsec) * 1e-9 end
  return os.time()
end
M.now = now

local fs = require("remax.fs")
local file_exists, read_file, mkdir = fs.exists, fs.read_text, fs.mkdir_p

-- Peak resident memory of this process in MiB (Linux), else the model's own accounting.
local function peak_memory_mib(model)
  local status = read_file("/proc/self/status")
  local kb = status and tonumber(status:match("VmHWM:%s*(%d+)"))
  if kb then return kb / 1024 end
  local m = model:memory()
  return (m.params + m.grads + m.activations + m.head) / 1048576
end

-- What the engine holds for training, in MiB: the policy (weights, gradients, activations, head
-- chunk), AdamW's moments, and the reference model (none with LoRA: the adapters-off policy).
local function train_memory_mib(self)
  local m = self.model:memory()
  local bytes = m.params + m.grads + m.activations + m.head
  bytes = bytes + (self.opt and self.opt:state_bytes() or 0)
  if self.ref and self.ref.memory then
    local r = self.ref:memory()
    bytes = bytes + r.params + r.activations + r.head
  end
  return bytes / 1048576
end

local function mean(list) return algos.mean(list) end

local function resolve_dir(path)
  if file_exists(path .. "/config.json") or file_exists(path .. "/adapter_config.json") then return path end
  local home = os.getenv("REMAX_HOME")
  if home and path:sub(1, 1) ~= "/" and file_exists(home .. "/" .. path .. "/config.json") then
    return home .. "/" .. path
  end
  return nil
end

-- The "qa" template of the built-in byte-level models: "Question: ...\nAnswer: ".
local function qa_template(messages, opts)
  local out = {}
  for _, m in ipairs(messages) do
    if m.role == "assistant" then out[#out + 1] = "Answer: " .. m.content .. "\n"
    elseif m.role == "system" then out[#out + 1] = m.content .. "\n"
    else out[#out + 1] = "Question: " .. m.content .. "\n" end
  end
  if opts.add_generation_prompt ~= false then out[#out + 1] = "Answer: " end
  return table.concat(out)
end
M.qa_template = qa_template

local function say(self, text)
  if self.quiet then return end
  if self.progress then self.progress:log(text) else print(text) end
end

---------------------------------------------------------------------------- setup

-- cfg: a resolved config (remax.config.resolve). opts: recipe_path, overrides (for hot reload),
-- quiet, signals (install the Ctrl-C handler; default true), run_dir.
function M.new(cfg, opts)
  opts = opts or {}
  if not cfg.model and not cfg.model_config and not cfg.resume and not resolve_dir(M.DEFAULT_MODEL) then
    error(("the built-in base model %s is missing: run ./remax run recipes/tiny_sft.lua first " ..
      "(or pass --model DIR)"):format(M.DEFAULT_MODEL), 0)
  end
  local world = dist.world()   -- a world of one unless an MPI launcher started this process
  local self = setmetatable({ cfg = cfg, opts = opts, quiet = opts.quiet or not world.is_root, step = 0,
    bad_steps = 0, reloads = 0, baseline_state = nil, history = {}, watch = {}, dist = world }, Trainer)
  self.recipe_path = opts.recipe_path
  self.recipe_dir = self.recipe_path and rewards.dirname(self.recipe_path) or nil
  self:setup_run()
  self:setup_model()
  self:setup_data()
  self:setup_rewards()
  self:setup_optimizer()
  if self.resume_state then self:restore(self.resume_state) end
  self:share_state()
  return self
end

-- Every rank starts from rank 0's weights, optimizer state and counters: rank 0 alone reads the
-- run folder (which other machines may not see), and the ranks must take identical steps.
function Trainer:share_state()
  local d = self.dist
  if d.size == 1 then return end
  if self.opt.zero then   -- ZeRO (remax.optim): each rank gets its shard of the moments
    self.opt:share_from_root()
    d:broadcast_model(self.model)
    local s = d:broadcast(self:state(true))
    if not d.is_root then self:restore(s) end
    return
  end
  local s = self:state()
  d:broadcast_model(self.model, s.tensors)
  s.tensors = nil
  s = d:broadcast(s)
  if not d.is_root then
    s.tensors = self.opt:state().tensors
    self:restore(s)
  end
end

-- A run that writes nothing (remax eval).
local NullRun = {}
NullRun.__index = NullRun
for _, f in ipairs({ "log_metrics", "log_completions", "save_checkpoint", "plot" }) do NullRun[f] = function() end end
function NullRun:latest_checkpoint() return nil end
function NullRun:metrics() return {} end

function Trainer:setup_run()
  if self.opts.eval_only then
    self.run = setmetatable({}, NullRun)
    self.run_dir = os.tmpname()
    os.remove(self.run_dir)
    self.run_name = "eval"
    return
  end
  if self.dist.size == 1 then return self:open_run() end
  -- rank 0 alone names, writes (and on resume reads) runs/<name>/; the others learn its name
  local ok, err = true, nil
  if self.dist.is_root then ok, err = pcall(self.open_run, self) end
  local shared = self.dist:broadcast({ ok = ok, err = not ok and tostring(err) or nil, dir = self.run_dir })
  if not shared.ok then error(shared.err, 0) end
  if not self.dist.is_root then
    self.run_dir, self.run_name = shared.dir, shared.dir:match("([^/]+)$")
    self.run = setmetatable({}, NullRun)
  end
end

function Trainer:open_run()
  local cfg = self.cfg
  local runs = require("remax.runs")
  local dir
  if cfg.resume then
    dir = cfg.resume:gsub("/+$", "")
    if not file_exists(dir .. "/config.json") then
      error(("--resume %s: no run there (no config.json)"):format(cfg.resume), 0)
    end
  else
    local name = cfg.run_name
    if not name then
      name = (self.recipe_path and recipe_mod.name(self.recipe_path) or "run") .. "-" .. os.date("%Y%m%d-%H%M%S")
      local base, k = name, 1
      while file_exists(cfg.output_dir .. "/" .. name .. "/config.json") do
        k = k + 1
        name = base .. "-" .. k
      end
    end
    dir = cfg.output_dir .. "/" .. name
  end
  self.run_dir = dir
  self.run_name = dir:match("([^/]+)$")
  self.run = runs.open(dir, { config = config.serializable(cfg), resume = cfg.resume ~= nil })
  if cfg.resume then
    local ckpt = self.run:latest_checkpoint()
    if not ckpt then error(("--resume %s: the run has no checkpoint yet"):format(cfg.resume), 0) end
    local state, tensors, model_dir = self.run:load_checkpoint(ckpt)
    state.tensors = tensors
    self.resume_state, self.resume_model_dir, self.resume_ckpt = state, model_dir, ckpt
  end
end

function Trainer:stop_ids()
  local ids, seen = {}, {}
  local function add(id)
    if id and not seen[id] then seen[id] = true; ids[#ids + 1] = id end
  end
  add(self.tok.eos_id)
  for _, s in ipairs({ "<|im_end|>", "<|endoftext|>", "<|eot_id|>" }) do add(self.tok:token_to_id(s)) end
  -- generation_config.json's eos_token_id (Llama 3.2 Instruct also stops on <|eom_id|>)
  if self.model_source then
    for _, id in ipairs(require("remax.generate_cli").stop_ids(self.model_source, nil)) do add(id) end
  end
  for _, s in ipairs(self.cfg.stop or {}) do
    local id = self.tok:token_to_id(s)
    if not id then error(("stop: '%s' is not a token of this tokenizer"):format(s), 0) end
    add(id)
  end
  return ids
end

function Trainer:setup_model()
  local cfg = self.cfg
  local mopts = { dtype = cfg.dtype, seed = cfg.seed }
  -- a model that is not trained (remax eval) or whose base is frozen (LoRA) may keep bf16 weights
  if self.opts.eval_only or cfg.use_lora then mopts.weight_dtype = cfg.frozen_dtype end
  local source
  if cfg.model then
    source = resolve_dir(cfg.model)
    if not source then error(("model %s: no config.json there"):format(cfg.model), 0) end
  elseif not cfg.model_config then
    source = resolve_dir(M.DEFAULT_MODEL)
    if not source then
      error(("the built-in base model %s is missing: run ./remax run recipes/tiny_sft.lua first " ..
        "(or pass --model DIR)"):format(M.DEFAULT_MODEL), 0)
    end
  end
  self.model_source = source
  -- with LoRA a checkpoint holds the adapters only: the base comes from where it always does
  local resume_dir = not cfg.use_lora and self.resume_model_dir or nil
  if source then
    self.model = remax.model.load(resume_dir or source, mopts)
    self.tok = remax.tokenizer.load(source)
  else
    -- a fresh random model with the byte-level tokenizer, kept in the run folder
    local tok_dir = self.run_dir .. "/tokenizer"
    if not self.dist.is_root then   -- rank 0 alone writes the run folder
      tok_dir = os.tmpname()
      os.remove(tok_dir)
    end
    mkdir(tok_dir)
    remax.tokenizer.write_byte_level(tok_dir)
    self.tok = remax.tokenizer.load(tok_dir)
    local mc = {}
    for k, v in pairs(cfg.model_config) do mc[k] = v end
    if mc.vocab_size == nil then mc.vocab_size = self.tok.vocab_size end
    if mc.vocab_size < self.tok.vocab_size then
      error(("model_config.vocab_size = %d is smaller than the tokenizer's %d tokens"):format(mc.vocab_size, self.tok.vocab_size), 0)
    end
    mc.eos_token_id = mc.eos_token_id or self.tok.eos_id
    self.fresh_config = mc
    if resume_dir then
      self.model = remax.model.load(resume_dir, mopts)
    else
      self.model = remax.model.new(mc, mopts)
    end
    self.model.source_dir = tok_dir
  end
  self.stop = self:stop_ids()
  if cfg.use_lora then require("remax.lora").setup(self.model, cfg, self.resume_model_dir) end
  self.model_opts = mopts
  -- the frozen reference: the starting weights, loaded only when the KL term is used (with
  -- LoRA: the same model with its adapters off, no second copy)
  if cfg.beta > 0 and cfg.algo ~= "sft" then self:load_reference() end
  self:resolve_template()
end

-- The frozen reference model: the starting weights (the model folder, or the same fresh random
-- init), also when a hot reload raises beta from 0.
function Trainer:load_reference()
  if self.ref then return self.ref end
  if self.cfg.use_lora then
    self.ref = require("remax.lora").reference(self.model)
    return self.ref
  end
  local src = self.model_source
  local ropts = { weight_dtype = self.cfg.frozen_dtype }
  for k, v in pairs(self.model_opts) do if k ~= "weight_dtype" then ropts[k] = v end end
  self.ref = src and remax.model.load(src, ropts) or remax.model.new(self.fresh_config, ropts)
  return self.ref
end

function Trainer:resolve_template()
  local t = self.cfg.chat_template
  if t == "auto" then
    t = (self.tok.chat_template and self.tok.chat_template ~= "") and "tokenizer" or "qa"
  end
  self.template_name = type(t) == "string" and t or "recipe function"
  local extra = { enable_thinking = self.cfg.enable_thinking, template_args = self.cfg.chat_template_kwargs }
  if t == "qa" then self.template = { template = qa_template }
  elseif t == "tokenizer" then self.template = { template = "tokenizer", tokenizer = self.tok }
  else self.template = { template = t, tokenizer = self.tok.chat_template and self.tok or nil } end
  for k, v in pairs(extra) do self.template[k] = v end
end

-- A prompt (string or messages) -> token ids, truncated to its last max_prompt_length tokens
-- (then also its length before, as a third value; the first one is announced once per run).
function Trainer:encode_prompt(prompt)
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
      say(self, ("a prompt of %d tokens is longer than max_prompt_length = %d: it keeps its last %d tokens " ..
        "(every step counts such prompts in the prompts_truncated and frac_prompts_truncated metrics)"):format(before, max, max))
    end
  end
  return ids, text, before
end

function Trainer:setup_data()
  local cfg = self.cfg
  local synth = require("remax.tasks.gsm8k_synth")
  local sopts = { seed = cfg.seed, steps = cfg.synth_steps, max_number = cfg.synth_max_number,
    style = cfg.synth_style }
  local map = { prompt = cfg.prompt_column, answer = cfg.answer_column }
  if cfg.data then
    self.train_ds = data.load(cfg.data, map)
  else
    sopts.split = "train"
    self.train_ds = data.from_rows(synth.generate(cfg.train_size, sopts), { name = "gsm8k_synth(train)" })
  end
  if cfg.eval_size > 0 then
    if cfg.eval_data then
      self.eval_ds = data.load(cfg.eval_data, map)
    elseif not cfg.data then
      sopts.split = "test"
      self.eval_ds = data.from_rows(synth.generate(cfg.eval_size, sopts), { name = "gsm8k_synth(test)" })
    end
  end
  if cfg.map_row then
    for _, ds in ipairs({ self.train_ds, self.eval_ds }) do
      for i, row in ipairs(ds.rows) do
        local ok, new = pcall(cfg.map_row, row)
        if not ok or type(new) ~= "table" then
          error(("map_row (%s) on row %d of %s: %s"):format(config.show(cfg.map_row), i, ds.source,
            ok and ("returned a " .. type(new) .. ", expected the row table") or tostring(new)), 0)
        end
        if type(new.prompt) ~= "string" then
          local okm, err = chat.check_messages(new.prompt)
          if not okm then error(("map_row on row %d of %s: prompt: %s"):format(i, ds.source, err), 0) end
        end
        ds.rows[i] = new
      end
    end
  end
  if cfg.algo == "sft" then
    for _, ds in ipairs({ self.train_ds, self.eval_ds }) do
      local col = cfg.answer_column or "answer"
      local row = ds.rows[1]
      if type(row[col]) ~= "string" then
        error(("algo = sft needs an answer column '%s' (the target text) in %s; its columns: %s"):format(col,
          ds.source, table.concat(ds:columns(), ", ")), 0)
      end
    end
  end
  -- prompts_per_step: this rank's; the sampler draws the global batch and each rank takes its share
  self.prompts_per_step = cfg.per_device_train_batch_size * cfg.gradient_accumulation_steps
  self.global_prompts_per_step = self.prompts_per_step * self.dist.size
  self.sampler = self.train_ds:sampler({ seed = cfg.seed, shuffle = true, batch_size = self.global_prompts_per_step })
end

function Trainer:setup_rewards()
  self.rewards = rewards.load_all(self.cfg.rewards, { base = self.recipe_dir })
  rewards.probe(self.rewards, self.train_ds.rows, self.train_ds.source, data.collate, self.cfg.reward_timeout)
  if self.eval_ds then rewards.probe(self.rewards, self.eval_ds.rows, self.eval_ds.source, data.collate, self.cfg.reward_timeout) end
  self.accuracy_name = self.rewards[1] and self.rewards[1].name
  for _, r in ipairs(self.rewards) do
    if r.name == "gsm8k_accuracy" then self.accuracy_name = r.name end
  end
  if self.cfg.hot_reload then self:snapshot_watch() end
end

function Trainer:setup_optimizer()
  local cfg = self.cfg
  local params, grads = self.model:trainable()
  local opts = { lr = cfg.learning_rate, betas = { cfg.adam_beta1, cfg.adam_beta2 }, eps = cfg.adam_epsilon,
    weight_decay = cfg.weight_decay, stage = cfg.zero_stage }
  if cfg.zero_stage > 0 then   -- ZeRO-1/2: this rank's shard of the moments (docs/distributed.md)
    self.opt = optim.zero_adamw(self.dist, self.model, opts)
  else
    self.opt = optim.adamw(params, grads, opts)
  end
  -- the schedule counts optimizer updates: num_iterations of them per step
  self.total_updates = cfg.max_steps * cfg.num_iterations
  self.warmup_steps = math.ceil(cfg.warmup_ratio * self.total_updates)
end

-- Everything an exact resume needs: data position, optimizer, counters (RNG seeds derive
-- from (seed, step), so they need no state). Collective under ZeRO (the moments are gathered)
-- unless without_moments.
function Trainer:state(without_moments)
  local os_ = without_moments and { step = self.opt.step_count } or self.opt:state()
  return {
    step = self.step, sampler = self.sampler:state(), optimizer_step = os_.step,
    bad_steps = self.bad_steps, reloads = self.reloads, baseline = self.baseline_state,
    eval_history = self.eval_history, train_seconds = self.train_seconds, tensors = os_.tensors,
    world_size = self.dist.size, global_prompts_per_step = self.global_prompts_per_step,
  }
end

function Trainer:restore(state)
  local g = state.global_prompts_per_step
  if g and g ~= self.global_prompts_per_step then
    local w = state.world_size or 1
    error(("--resume %s: its checkpoint was written by %d rank(s) x %d prompts per step (%d in all); this run has "
      .. "%d rank(s) x %d = %d. The data order is global, so resume with %d prompts per step in all: the same "
      .. "number of ranks (mpirun -np %d), or per_device_train_batch_size x gradient_accumulation_steps x ranks = %d")
      :format(self.run_dir, w, g / w, g, self.dist.size, self.prompts_per_step, self.global_prompts_per_step, g, w, g), 0)
  end
  self.step = state.step
  self.sampler:restore(state.sampler)
  self.opt:load_state({ step = state.optimizer_step, tensors = state.tensors })
  self.bad_steps, self.reloads = state.bad_steps or 0, state.reloads or 0
  self.baseline_state = state.baseline
  self.eval_history = state.eval_history
  self.train_seconds = state.train_seconds
  say(self, ("resumed %s from %s (step %d)"):format(self.run_dir, self.resume_ckpt or "?", self.step))
end

function Trainer:save_checkpoint(why)
  self.dist:check_same_weights(self.model, ("step %d"):format(self.step))
  local s = self:state()
  self.run:save_checkpoint(self.step, self.model, s)
  self.last_saved = self.step
  if why then say(self, ("checkpoint step-%d saved (%s)"):format(self.step, why)) end
end

-- Generation seeds depend only on (seed, step), so a resumed run samples the same completions.
function Trainer:seed_for(step) return self.cfg.seed * 1048576 + step end

---------------------------------------------------------------------------- the step pieces

-- This rank's share (whole prompts) of the step's global batch.
function Trainer:next_batch() return (self.dist:share(self.sampler:next_batch())) end

-- Generate num_generations sampled rows and (generate_greedy) one greedy row per prompt.
-- Returns {prompts = dataset rows, prompt_ids, rows = generate's rows with text, slots, G, ...}.
function Trainer:rollout(prompt_rows, opts)
  opts = opts or {}
  local cfg = self.cfg
  local step = opts.step or (self.step + 1)
  local prompt_ids, prompts_truncated = {}, 0
  for i, row in ipairs(prompt_rows) do
    local ids, _, before = self:encode_prompt(row.prompt)
    prompt_ids[i] = ids
    if before then prompts_truncated = prompts_truncated + 1 end
  end
  local G = opts.greedy_only and 0 or (opts.num_generations or cfg.num_generations)
  local temps = {}
  for s = 1, G do temps[s] = cfg.temperature end
  local greedy = opts.greedy_only or opts.with_greedy or cfg.generate_greedy
  if greedy then temps[#temps + 1] = 0 end
  local t0 = now()
  local out = self.model:generate(prompt_ids, {
    max_new_tokens = cfg.max_completion_length, temperature = temps, top_p = cfg.top_p, top_k = cfg.top_k,
    stop = self.stop, seed = self:seed_for(step),
  })
  local seconds = now() - t0
  for _, r in ipairs(out.rows) do
    r.text = self.tok:decode(r.tokens, { skip_special_tokens = true })
    r.greedy = greedy and r.slot == #temps
  end
  return { prompts = prompt_rows, prompt_ids = prompt_ids, prompts_truncated = prompts_truncated, rows = out.rows, slots = #temps, G = G,
    greedy = greedy, tokens_generated = out.tokens_generated, time_generate = seconds, step = step }
end

-- Score every row with every reward. Adds per-row total and per-reward scores. With more than
-- one rank, a reward that fails on any rank stops every rank (after rank 0 saves the last
-- finished step); opts.alone scores without asking the other ranks (evaluation).
function Trainer:score(ro, opts)
  local t0 = now()
  local rows, completions, expanded = ro.rows, {}, {}
  for k, r in ipairs(rows) do
    completions[k] = r.text
    expanded[k] = ro.prompts[r.prompt]
  end
  local batch = data.collate(expanded)
  batch.prompt_ids, batch.completion_ids, batch.greedy, batch.finish = {}, {}, {}, {}
  for k, r in ipairs(rows) do
    batch.prompt_ids[k] = ro.prompt_ids[r.prompt]
    batch.completion_ids[k] = r.tokens
    batch.greedy[k] = r.greedy
    batch.finish[k] = r.finish
    if type(expanded[k].prompt) == "table" then   -- conversational data: the reply as messages too
      batch.completion_messages = batch.completion_messages or {}
      batch.completion_messages[k] = { { role = "assistant", content = r.text } }
    end
  end
  local per, total, unscored, none
  if self.dist.size == 1 or (opts and opts.alone) then
    per, total, unscored, none = rewards.score(self.rewards, self.cfg.reward_weights, completions, batch, {
      step = ro.step, timeout = self.cfg.reward_timeout, on_failure = function() self:save_on_failure() end,
    })
  else
    local ok, a, b, c, d = pcall(rewards.score, self.rewards, self.cfg.reward_weights, completions, batch,
      { step = ro.step, timeout = self.cfg.reward_timeout })
    local all_ok, msg, rank = self.dist:agree(ok, a)
    if not all_ok then
      self:save_on_failure()
      self.dist:barrier()   -- the checkpoint is on disk before any rank exits
      error(("%s (on rank %d)"):format(msg, rank), 0)
    end
    per, total, unscored, none = a, b, c, d
  end
  ro.completions, ro.batch, ro.per, ro.total, ro.unscored, ro.none = completions, batch, per, total, unscored, none
  if unscored > 0 and ro.G > 0 and (ro.step or 0) > 0 then
    for k = 1, #rows do
      if none[k] then
        -- as TRL warns: such a row gets advantage 0 and stays out of the baselines
        say(self, ("step %d: no reward function scored %d of %d completions (they get advantage 0), e.g. completion %d: %q")
          :format(ro.step, unscored, #rows, k, completions[k]:sub(1, 200)))
        break
      end
    end
  end
  ro.time_score = now() - t0
  self.last_scored = ro
  return ro
end

-- The checkpoint a failing reward leaves behind (the state after the last finished step), and
-- the plots of the steps so far.
function Trainer:save_on_failure()
  if self.step > 0 and self.last_saved ~= self.step then
    local ok, err = pcall(self.save_checkpoint, self, "a reward failed")
    if not ok then io.stderr:write("remax: could not save a checkpoint: ", tostring(err), "\n") end
  end
  if self.step > 0 then self:draw_plots() end
end

-- The charts and index.html of the run. A failure is reported on stderr and kept in
-- self.plot_error (train() returns it); it never loses the run's other files.
function Trainer:draw_plots()
  local ok, err = pcall(self.run.plot, self.run)
  if not ok then
    self.plot_error = tostring(err)
    io.stderr:write(("remax: drawing the plots of %s failed: %s\n"):format(self.run_dir, self.plot_error))
  end
  return ok
end

-- Policy (and reference) log-probabilities of the completion tokens of rows, without gradients.
function Trainer:row_logprobs(model, ro, which)
  local seqs, lens, starts = {}, {}, {}
  for n, k in ipairs(which) do
    local r = ro.rows[k]
    local p = ro.prompt_ids[r.prompt]
    local s = {}
    for i = 1, #p do s[i] = p[i] end
    for i = 1, #r.tokens do s[#p + i] = r.tokens[i] end
    seqs[n], lens[n], starts[n] = s, #r.tokens, #p
  end
  local lp = model:logprobs(seqs):totable()
  local out = {}
  for n = 1, #which do
    local v = {}
    for t = 1, lens[n] do v[t] = lp[n][starts[n] + t] end
    out[n] = v
  end
  return out
end

-- Rewards -> advantages (and the k1 KL folded into rewards when kl_estimator = "k1"). Rows that
-- no reward scored enter as NaN: no baseline uses them and their advantage is 0 (as in TRL).
function Trainer:advantage(ro)
  local cfg = self.cfg
  local S, G = ro.slots, ro.G
  local reward = {}
  for k = 1, #ro.rows do reward[k] = (ro.none and ro.none[k]) and 0 / 0 or ro.total[k] end
  if cfg.beta > 0 and cfg.kl_estimator == "k1" then
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
  local groups = {}
  for i = 1, #ro.prompts do
    local g = { samples = {} }
    for s = 1, G do g.samples[s] = reward[(i - 1) * S + s] end
    if ro.greedy then g.greedy = reward[(i - 1) * S + S] end
    groups[i] = g
  end
  local kind = self.advantage_fn or cfg.advantage or cfg.algo
  local aopts = {
    clip = cfg.advantage_clip, scale_rewards = cfg.scale_rewards, baseline = cfg.reinforce_baseline,
    momentum = cfg.baseline_momentum, step = ro.step, global_sum = function(...) return self.dist:sum(...) end,
  }
  local adv, state
  if cfg.multi_objective_aggregation == "normalize_then_sum" and kind == "grpo" then
    local per = {}
    for k, rw in ipairs(self.rewards) do
      local scores = ro.per[rw.name]
      per[k] = {}
      for i = 1, #ro.prompts do
        per[k][i] = {}
        for s = 1, G do
          local v = scores[(i - 1) * S + s]
          per[k][i][s] = v == nil and 0 / 0 or v
        end
      end
    end
    adv = algos.normalize_then_sum(per, cfg.reward_weights)
    local c = cfg.advantage_clip or 0
    if c > 0 then
      for _, a in ipairs(adv) do for j = 1, #a do a[j] = math.max(-c, math.min(c, a[j])) end end
    end
  else
    adv, state = algos.advantages(kind, groups, aopts, self.baseline_state)
  end
  ro.groups, ro.adv, ro.new_baseline_state = groups, adv, state
  return ro
end

-- Training rows of a rollout: each sampled row as {prompt = i, prompt_ids, completion, adv = A,
-- masked = true when mask_truncated_completions leaves it out of the loss}.
local function train_rows(ro, cfg)
  local list = {}
  for k, r in ipairs(ro.rows) do
    if not r.greedy then
      local p = ro.prompt_ids[r.prompt]
      list[#list + 1] = { prompt = r.prompt, prompt_ids = p, completion = r.tokens,
        adv = ro.adv and ro.adv[r.prompt][r.slot] or 1, key = k,
        masked = (cfg.mask_truncated_completions and r.finish == "length") or nil }
    end
  end
  return list
end

-- The aggregation of token losses: loss_type's (TRL's names) or loss_agg_mode.
function Trainer:aggregation()
  local lt = self.cfg.loss_type
  return lt and algos.loss_types[lt] or self.cfg.loss_agg_mode
end

-- prompt .. completion token lists of rows, and where each completion starts.
local function row_seqs(rows)
  local seqs, starts = {}, {}
  for n, row in ipairs(rows) do
    local s = {}
    for i = 1, #row.prompt_ids do s[i] = row.prompt_ids[i] end
    for i = 1, #row.completion do s[#row.prompt_ids + i] = row.completion[i] end
    seqs[n], starts[n] = s, #row.prompt_ids
  end
  return seqs, starts
end

-- The completion part of each row of a [B, T] tensor (logprobs, entropies) as Lua lists.
local function completion_values(x, rows, starts)
  local T = x:size(2)
  local f32 = x:dtype_name() == "f32"
  local p = f32 and ffi.cast("float*", x.data) or nil
  local tab = not f32 and x:totable() or nil
  local out = {}
  for n, row in ipairs(rows) do
    local v = {}
    for t = 1, #row.completion do
      local pos = starts[n] + t   -- 1-based column of completion token t
      v[t] = f32 and p[(n - 1) * T + pos - 1] or tab[n][pos]
    end
    out[n] = v
  end
  return out
end

-- The log-probabilities of rows under the current weights, from a forward that computes what
-- the training forward computes on the same micro-batch (same rows, same padding), so the
-- first of num_iterations updates sees a ratio of exactly 1. Stored as row.old.
function Trainer:set_old_logprobs(rows)
  local seqs, starts = row_seqs(rows)
  local logp = self.model:logprobs(seqs, nil, { train = true, checkpoint = self.cfg.gradient_checkpointing })
  local old = completion_values(logp, rows, starts)
  for n, row in ipairs(rows) do row.old = old[n] end
end

-- Forward, loss weights and backward for one micro-batch of rows; returns stats.
-- chunk.tokens: the loss tokens of the micro-batch (bnpo's normaliser, skipped rows included).
function Trainer:micro_step(rows, totals, chunk)
  local cfg = self.cfg
  chunk = chunk or {}
  local seqs, starts = row_seqs(rows)
  local sft = cfg.algo == "sft"
  local use_ref = self.ref and cfg.kl_estimator == "k3" and not sft
  -- the reference first: with LoRA it is the policy's own model, whose last forward before the
  -- backward must be the training one
  local refs
  if use_ref then
    if rows[1].ref_lp then
      refs = {}
      for n, row in ipairs(rows) do refs[n] = row.ref_lp end
    else
      refs = completion_values(self.ref:logprobs(seqs), rows, starts)
      if cfg.num_iterations > 1 then for n, row in ipairs(rows) do row.ref_lp = refs[n] end end
    end
  end
  local T = 0
  for _, s in ipairs(seqs) do if #s > T then T = #s end end
  fit.check_train(self.model, #seqs, T, { checkpoint = cfg.gradient_checkpointing, what = ("step %d"):format(self.step + 1) })
  local logp, ent = self.model:logprobs(seqs, nil, { train = true, checkpoint = cfg.gradient_checkpointing,
    entropy = true })
  local B, T = logp:size(1), logp:size(2)
  local lps, ents = completion_values(logp, rows, starts), completion_values(ent, rows, starts)
  local masks
  if cfg.top_entropy_quantile < 1 and not sft then
    local masked = {}
    for n, row in ipairs(rows) do masked[n] = row.masked end
    masks = algos.entropy_masks(ents, masked, cfg.top_entropy_quantile)
  end
  local parts = {}
  local ent_sum, ent_n = 0, 0
  for n, row in ipairs(rows) do
    parts[n] = { adv = row.adv, logp = lps[n], ref = refs and refs[n], old = row.old, mask = masks and masks[n],
      masked = row.masked }
    if not row.masked then
      for _, e in ipairs(ents[n]) do ent_sum, ent_n = ent_sum + e, ent_n + 1 end
    end
  end
  local weights, stats = algos.token_weights(parts, {
    beta = sft and 0 or cfg.beta, kl = cfg.kl_estimator, agg = self:aggregation(),
    num_rows = totals.rows, num_tokens = totals.tokens, max_length = cfg.max_completion_length,
    chunk_tokens = chunk.tokens, chunks = totals.chunks,
    epsilon = cfg.epsilon, epsilon_high = cfg.epsilon_high, delta = cfg.delta, level = cfg.importance_sampling_level,
  })
  stats.entropy_sum, stats.entropy_n = ent_sum, ent_n
  local dent
  if cfg.entropy_coef ~= 0 and not sft then
    local masked = {}
    for n, row in ipairs(rows) do masked[n] = row.masked end
    local bonus
    dent, bonus = algos.entropy_bonus(ents, { coef = cfg.entropy_coef, masks = masks, masked = masked,
      agg = self:aggregation(), num_tokens = totals.tokens, chunks = totals.chunks })
    stats.loss = stats.loss + bonus
  end
  self.model:backward(M.completion_tensor(weights, starts, B, T, logp:dtype_name()),
    dent and M.completion_tensor(dent, starts, B, T, logp:dtype_name()) or nil)
  return stats
end

-- Gradient accumulation: each micro-batch's gradient is computed from zero and then added to
-- the sum of the earlier ones (G1 + G2 + ...), so one process with two micro-batches and two
-- ranks with one each (summed by the all-reduce) give the same bits. hold_grads moves the sum so
-- far aside (one gradient-sized buffer, made once) and zeroes the gradients.
function Trainer:hold_grads()
  local grads = self.model:trainable_grads()
  if not self.held then
    self.held = {}
    for i, g in ipairs(grads) do self.held[i] = tensor.new(g:size(), g:dtype_name()) end
  end
  for i, g in ipairs(grads) do self.held[i]:copy_(g) end
  self.model:zero_grad()
end

function Trainer:add_held_grads()
  local rx = require("remax.ffi")
  for i, g in ipairs(self.model:trainable_grads()) do rx.check(rx.C.rx_add(g, g, self.held[i])) end
end

-- Per-row completion values (weights) placed at their columns of a [B, T] tensor (zeros
-- elsewhere), as model:backward takes them.
function M.completion_tensor(values, starts, B, T, dtype)
  if dtype == "f32" then
    local x = tensor.new({ B, T }, "f32")
    local p = ffi.cast("float*", x.data)
    for n = 1, B do
      for t, w in ipairs(values[n]) do p[(n - 1) * T + starts[n] + t - 1] = w end
    end
    return x
  end
  local x = {}
  for n = 1, B do
    local r = {}
    for t = 1, T do r[t] = 0 end
    for t, w in ipairs(values[n]) do r[starts[n] + t] = w end
    x[n] = r
  end
  return x
end

-- Micro-batches of whole prompts, per_device_train_batch_size of them each: a prompt's rows
-- never split, so every row's advantage sits with its own prompt's other rows. Returns
-- chunks[c] = {rows = rows to train, tokens = loss tokens of all its rows}. Rows left out of
-- the forward: masked rows (no loss), and with skip_zero_advantage (beta = 0, every token
-- trains) rows whose advantage is exactly 0 (no gradient); both still count in the averages.
function Trainer:micro_batches(rows)
  local cfg = self.cfg
  local skip = cfg.algo ~= "sft" and cfg.beta == 0 and cfg.skip_zero_advantage and cfg.top_entropy_quantile >= 1
    and cfg.entropy_coef == 0
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
      if not r.masked then chunks[c].tokens = chunks[c].tokens + #r.completion end
      if not (r.masked or (skip and r.adv == 0)) then table.insert(chunks[c].rows, r) end
    end
  end
  return chunks
end

-- One optimizer update per iteration (num_iterations of them) from a scored rollout (RL), or one
-- from a list of SFT rows. Returns metrics: loss and grad_norm are means over the iterations,
-- kl and entropy those of the first (the policy that generated the rollout), clip counts sums.
function Trainer:update(ro)
  local cfg = self.cfg
  local t0 = now()
  local rows = ro.train_rows or train_rows(ro, cfg)
  local chunks = self:micro_batches(rows)
  local totals = { rows = #rows, tokens = 0, chunks = #chunks }
  for _, r in ipairs(rows) do if not r.masked then totals.tokens = totals.tokens + #r.completion end end
  -- the loss is over the global batch
  totals.rows, totals.tokens, totals.chunks = self.dist:sum(totals.rows, totals.tokens, totals.chunks)
  local mu = (ro.train_rows or cfg.algo == "sft") and 1 or cfg.num_iterations
  if mu > 1 then
    for _, c in ipairs(chunks) do if #c.rows > 0 then self:set_old_logprobs(c.rows) end end
  end
  local step = ro.step or (self.step + 1)
  local out = { loss = 0, grad_norm = 0, iterations = 0, clip_low = 0, clip_high = 0, clip_n = 0, finite = true,
    rows_trained = 0, tokens_trained = 0, tokens_total = totals.tokens, rows_total = totals.rows }
  for it = 1, mu do
    self.model:zero_grad()
    local loss, kl_sum, tokens, trained, ent_sum, ent_n = 0, 0, 0, 0, 0, 0
    local earlier = false
    for _, c in ipairs(chunks) do
      if #c.rows > 0 then
        if earlier then self:hold_grads() end
        local st = self:micro_step(c.rows, totals, c)
        if earlier then self:add_held_grads() end
        earlier = true
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
      local _, grads = self.model:trainable()
      norm = cfg.max_grad_norm > 0 and optim.clip_grad_norm(grads, cfg.max_grad_norm) or optim.grad_norm(grads)
    end
    local lr = optim.schedule(cfg.lr_scheduler_type, cfg.learning_rate, (step - 1) * mu + it, self.total_updates,
      self.warmup_steps)
    if it == 1 then
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
      out.finite = false
      self.bad_steps = self.bad_steps + 1
      self.model:zero_grad()
      say(self, ("step %d: non-finite loss (%s) or gradient norm (%s): update skipped (%d of max_bad_steps = %d)"):format(
        step, tostring(loss), tostring(norm), self.bad_steps, cfg.max_bad_steps))
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
function Trainer:sft_rows(prompt_rows)
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
function Trainer:rl_metrics(ro, up)
  local m = {}
  local samples, greedy = {}, {}
  local lens, truncated, maxlen, minlen, stopped = {}, 0, 0, math.huge, {}
  local none = ro.none or {}
  for k, r in ipairs(ro.rows) do
    if r.greedy then
      if not none[k] then greedy[#greedy + 1] = ro.total[k] end
    else
      if not none[k] then samples[#samples + 1] = ro.total[k] end   -- unscored rows: no reward (TRL)
      lens[#lens + 1] = #r.tokens
      maxlen, minlen = math.max(maxlen, #r.tokens), math.min(minlen, #r.tokens)
      if r.finish == "length" then truncated = truncated + 1 else stopped[#stopped + 1] = #r.tokens end
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
  for _, rw in ipairs(self.rewards) do
    local s, g = {}, {}
    for k, r in ipairs(ro.rows) do
      local v = ro.per[rw.name][k]
      if v ~= nil then
        if r.greedy then g[#g + 1] = v else s[#s + 1] = v end
      end
    end
    if #s > 0 then m["reward/" .. rw.name] = mean(s) end
    if #g > 0 then m["reward_greedy/" .. rw.name] = mean(g) end
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
    for k, r in ipairs(ro.rows) do if not r.greedy then s = s + ro.kl_k1[k]; n = n + #r.tokens end end
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
  return m
end

-- Record a finished step: metrics, completions, evaluation, checkpoint.
function Trainer:finish_step(m, ro)
  local cfg = self.cfg
  self.step = self.step + 1
  m.loss = m.loss
  m.bad_steps, m.reloads = self.bad_steps, self.reloads
  m.peak_memory_mib = peak_memory_mib(self.model)
  m.train_memory_mib = train_memory_mib(self)
  if self.pending_reloads then m.reloaded = self.pending_reloads; self.pending_reloads = nil end
  if self.eval_ds and ((cfg.eval_steps > 0 and self.step % cfg.eval_steps == 0) or self.step == cfg.max_steps) then
    local e = self:evaluate()
    m.eval_accuracy, m.eval_reward = e.accuracy, e.reward
  end
  self.run:log_metrics(self.step, m)
  self.history[#self.history + 1] = m
  if ro and cfg.log_completions > 0 and self.step % cfg.log_completions == 0 then
    local list = {}
    for k, r in ipairs(ro.rows) do
      local per = {}
      for _, rw in ipairs(self.rewards) do per[rw.name] = ro.per[rw.name][k] end
      list[#list + 1] = { step = self.step, prompt = ro.prompts[r.prompt].prompt, completion = r.text,
        reward = ro.total[k], rewards = per, advantage = (not r.greedy and ro.adv) and ro.adv[r.prompt][r.slot] or nil,
        greedy = r.greedy and true or false }
    end
    self.run:log_completions(self.step, list)
  end
  if self.progress and (self.step % cfg.logging_steps == 0 or self.step == cfg.max_steps) then
    self.progress:update(self.step, { reward = m.reward, kl = m.kl, tokens_per_s = m.tokens_per_s, loss = m.loss })
  end
  if not self.quiet and not self.progress and (self.step % cfg.logging_steps == 0) then
    print(("step %d/%d  reward %.4f  loss %.4f  kl %.4f  grad_norm %.3f  lr %.2e"):format(self.step, cfg.max_steps,
      m.reward or 0, m.loss or 0, m.kl or 0, m.grad_norm or 0, m.lr or 0))
  end
  if self.bad_steps > cfg.max_bad_steps then
    self:save_checkpoint("too many bad steps")
    self:draw_plots()
    error(("stopping: %d steps had a non-finite loss or gradient (max_bad_steps = %d); last checkpoint %s"):format(
      self.bad_steps, cfg.max_bad_steps, self.run_dir), 0)
  end
  if cfg.save_steps > 0 and self.step % cfg.save_steps == 0 and self.step < cfg.max_steps then
    self:save_checkpoint()
  end
end

-- pass@k of one prompt with c right answers among n samples: the chance that k samples drawn
-- without replacement include a right one, 1 - C(n-c, k) / C(n, k) (Chen et al., 2021).
local function pass_at_k(n, c, k)
  if n - c < k then return 1 end
  local miss = 1
  for i = n - c + 1, n do miss = miss * (1 - k / i) end
  return 1 - miss
end
M.pass_at_k = pass_at_k

-- Greedy completions of the eval set: accuracy (the gsm8k_accuracy reward, else the first
-- reward) and the mean combined reward. opts.samples = K > 0 also samples K completions per
-- prompt (at the recipe's temperature) in the same generation call and adds sampled accuracy,
-- pass@k for k = 1, 2, 4, ..., K, and the share of prompts whose greedy answer is wrong while
-- some sample is right (the headroom a reward can use).
function Trainer:evaluate(opts)
  if not self.eval_ds then return {} end
  opts = opts or {}
  local cfg = self.cfg
  local K = opts.samples or 0
  local t0 = now()
  local rows = self.eval_ds.rows
  local n = math.min(#rows, cfg.eval_size)
  local acc, rew, count, glen = 0, 0, 0, 0
  local right = {}   -- per prompt: right samples (K > 0)
  local sacc, headroom, greedy_wrong = 0, 0, 0
  local bs = cfg.per_device_eval_batch_size
  if K > 0 then bs = math.max(1, math.floor(bs / (K + 1))) end
  local lo, hi = self.dist:share_range(n)   -- each rank evaluates its share; the sums are gathered
  for first = lo, hi, bs do
    local chunk = {}
    for i = first, math.min(hi, first + bs - 1) do chunk[#chunk + 1] = rows[i] end
    local ro = K > 0 and self:rollout(chunk, { num_generations = K, with_greedy = true, step = 0 })
      or self:rollout(chunk, { greedy_only = true, step = 0 })
    self:score(ro, { alone = true })
    local prompt_right, prompt_greedy = {}, {}
    for k, r in ipairs(ro.rows) do
      local a = self.accuracy_name and ro.per[self.accuracy_name][k] or 0
      if r.greedy then
        rew = rew + ro.total[k]
        acc = acc + a
        glen = glen + #r.tokens
        count = count + 1
        prompt_greedy[r.prompt] = a
      else
        sacc = sacc + a
        prompt_right[r.prompt] = (prompt_right[r.prompt] or 0) + (a >= 1 and 1 or 0)
      end
    end
    if K > 0 then
      for i = 1, #chunk do
        local c = prompt_right[i] or 0
        right[#right + 1] = c
        if (prompt_greedy[i] or 0) < 1 then
          greedy_wrong = greedy_wrong + 1
          if c > 0 then headroom = headroom + 1 end
        end
      end
    end
  end
  acc, rew, count, glen, sacc, greedy_wrong, headroom = self.dist:sum(acc, rew, count, glen, sacc, greedy_wrong, headroom)
  right = self.dist:concat(right)
  local e = { accuracy = count > 0 and acc / count or 0, reward = count > 0 and rew / count or 0, n = count,
    greedy_length_mean = count > 0 and glen / count or 0, seconds = now() - t0, step = self.step }
  self.eval_seconds = (self.eval_seconds or 0) + e.seconds
  if K > 0 and count > 0 then
    e.samples = K
    e.sampled_accuracy = sacc / (count * K)
    e.pass_at = {}
    local k = 1
    while k <= K do
      local s = 0
      for _, c in ipairs(right) do s = s + pass_at_k(K, c, k) end
      e.pass_at[#e.pass_at + 1] = { k = k, value = s / #right }
      if k < K and 2 * k > K then k = K else k = 2 * k end
    end
    e.greedy_wrong = greedy_wrong / count
    e.headroom = headroom / count
  end
  self.last_eval = e
  self.eval_history = self.eval_history or {}
  table.insert(self.eval_history, { step = self.step, accuracy = e.accuracy, reward = e.reward })
  say(self, ("eval at step %d: greedy %s %.1f%%, reward %.4f (%d held-out prompts, %.1fs)"):format(self.step,
    self.accuracy_name or "accuracy", 100 * e.accuracy, e.reward, count, e.seconds))
  return e
end

local function source_of(r)
  if r.path then return r.path end
  return r.file
end

function Trainer:snapshot_watch()
  self.watch = {}
  local function add(path)
    if path and not self.watch[path] and file_exists(path) then self.watch[path] = read_file(path) end
  end
  if self.recipe_path then add(self.recipe_path) end
  for _, r in ipairs(self.rewards) do add(source_of(r)) end
end

-- Reload changed reward files (and the recipe), each checked on the last step's completions;
-- a version that fails keeps the old one. Returns how many reloads succeeded.
function Trainer:check_reload()
  if not self.cfg.hot_reload or self.dist.size > 1 then return 0 end   -- ranks could see a change at different steps
  local changed = {}
  for path, text in pairs(self.watch) do
    local now_text = read_file(path)
    if now_text and now_text ~= text then
      changed[#changed + 1] = path
      self.watch[path] = now_text
    end
  end
  if #changed == 0 then return 0 end
  table.sort(changed)
  local done = {}
  local recipe_changed = false
  for _, path in ipairs(changed) do
    local by_name = false
    for i, r in ipairs(self.rewards) do
      if r.path == path then
        by_name = true
        local ok, new = pcall(function()
          local nr = rewards.load_file(path)
          self:trial(nr)
          return nr
        end)
        if ok then
          self.rewards[i] = new
          self:note_reload(path)
          done[#done + 1] = path
        else
          say(self, ("hot reload: %s changed but failed its check, keeping the previous version: %s"):format(path, tostring(new)))
        end
      end
    end
    if not by_name then recipe_changed = true end
  end
  if recipe_changed and self.recipe_path then
    local ok, err = pcall(self.reload_recipe, self)
    if ok then
      self:note_reload(self.recipe_path)
      done[#done + 1] = self.recipe_path
    else
      say(self, ("hot reload: %s changed but failed to load, keeping the previous version: %s"):format(self.recipe_path, tostring(err)))
    end
  end
  -- new reward functions may live in new files
  for _, r in ipairs(self.rewards) do
    local p = source_of(r)
    if p and self.watch[p] == nil and file_exists(p) then self.watch[p] = read_file(p) end
  end
  return #done
end

function Trainer:note_reload(path)
  self.reloads = self.reloads + 1
  self.pending_reloads = self.pending_reloads or {}
  table.insert(self.pending_reloads, path)
  say(self, ("hot reload: %s reloaded (reload %d)"):format(path, self.reloads))
end

-- Before the first step there are no completions yet: the trial runs on the first training
-- rows, with their answers (or "0") standing in for completions, as the start-up probe does.
function Trainer:probe_scored()
  local n = math.min(#self.train_ds.rows, 4)
  local rows, completions = {}, {}
  for i = 1, n do
    rows[i] = self.train_ds.rows[i]
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
function Trainer:trial(r)
  local ro = self.last_scored or self:probe_scored()
  local n = math.min(#ro.completions, 4)
  local comps, batch = {}, {}
  for i = 1, n do comps[i] = ro.completions[i] end
  for k, col in pairs(ro.batch) do
    if type(col) == "table" then
      batch[k] = {}
      for i = 1, n do batch[k][i] = col[i] end
    end
  end
  rewards.run_one(r, comps, batch, {})
end

-- Re-run the recipe with the same command-line overrides; take its rewards, advantage and the
-- settings marked hot. Other changed settings need a restart (printed, ignored).
function Trainer:reload_recipe()
  local rtab = recipe_mod.load(self.recipe_path)
  local cfg = config.resolve(rtab, self.opts.overrides, { where = self.recipe_path })
  local list = rewards.load_all(cfg.rewards, { base = self.recipe_dir })
  for _, r in ipairs(list) do self:trial(r) end
  if cfg.reward_weights and #cfg.reward_weights ~= #list then
    error("reward_weights does not match the rewards", 0)
  end
  local ignored = {}
  for _, k in ipairs(config.order) do
    local decl = config.keys[k]
    if k ~= "rewards" and not decl.hot and type(cfg[k]) ~= "function" and type(cfg[k]) ~= "table" and cfg[k] ~= self.cfg[k]
      and k ~= "resume" and k ~= "run_name" then
      ignored[#ignored + 1] = k
    end
  end
  if cfg.beta > 0 and not self.ref and self.cfg.algo ~= "sft" then
    -- the KL term needs the frozen reference model, which a run started with beta = 0 lacks
    local ok, err = pcall(self.load_reference, self)
    if ok then
      say(self, ("hot reload: beta = %s: reference model loaded from %s"):format(tostring(cfg.beta),
        self.model_source or "the fresh model's initial weights"))
    else
      say(self, ("hot reload: beta = %s needs the reference model, which failed to load (%s); keeping beta = %s")
        :format(tostring(cfg.beta), tostring(err), tostring(self.cfg.beta)))
      cfg.beta = self.cfg.beta
    end
  end
  for _, k in ipairs(config.order) do
    if config.keys[k].hot then self.cfg[k] = cfg[k] end
  end
  self.cfg.rewards = cfg.rewards
  self.rewards = list
  if #ignored > 0 then
    say(self, "hot reload: changes to " .. table.concat(ignored, ", ") .. " take effect only after a restart")
  end
end

---------------------------------------------------------------------------- the loop

-- One full step (RL or SFT); returns its metrics.
function Trainer:train_step()
  local cfg = self.cfg
  local t0 = now()
  local batch = self:next_batch()
  local m, ro
  if cfg.algo == "sft" then
    local rows = self:sft_rows(batch)
    local up = self:update({ train_rows = rows, step = self.step + 1 })
    m = { loss = up.loss, grad_norm = up.grad_norm, lr = up.lr, time_train = up.time_train,
      tokens_per_s = up.tokens_trained / math.max(up.time_train, 1e-9),
      completion_length_mean = up.tokens_total / up.rows_total, time_generate = 0, time_score = 0 }
    local maxlen = 0
    for _, r in ipairs(rows) do maxlen = math.max(maxlen, #r.completion) end
    m.completion_length_max = maxlen
  else
    ro = self:rollout(batch)
    self:score(ro)
    self:advantage(ro)
    local up = self:update(ro)
    ro = self.dist:gather_rollout(ro)   -- rank 0: the whole step's rows, for metrics and logs
    m = self:rl_metrics(ro, up)
    m.loss, m.grad_norm, m.lr, m.time_train = up.loss, up.grad_norm, up.lr, up.time_train
    if not up.finite then m.skipped = true end
  end
  m.time_step = now() - t0
  self.train_seconds = (self.train_seconds or 0) + m.time_step
  m.time_elapsed_train = self.train_seconds
  self:finish_step(m, ro)
  return m
end

local function signal_pending()
  local ok, v = pcall(function() return require("remax.ffi").C.rx_signal_pending() end)
  return ok and v ~= 0
end

-- The whole run: evaluation before, steps (or the recipe's loop), evaluation after, checkpoint.
function Trainer:train(loop)
  local cfg = self.cfg
  if self.opts.signals ~= false then pcall(function() require("remax.ffi").C.rx_signal_install() end) end
  local okp, progress_mod = pcall(require, "remax.progress")
  if okp and not self.quiet then
    self.progress = progress_mod.new({ total = cfg.max_steps, label = self.run_name })
  end
  say(self, ("run %s: %s, model %s (%d parameters), %d prompts per step, template %s"):format(self.run_dir,
    cfg.algo, self.model_source or "random init", self.model:num_parameters(), self.global_prompts_per_step, self.template_name))
  if self.dist.size > 1 then
    say(self, ("%d ranks (%s), %d prompts each per step%s"):format(self.dist.size, self.dist.backend,
      self.prompts_per_step, cfg.hot_reload and "; hot reload is off with more than one rank" or ""))
  end
  local before
  if self.eval_ds and cfg.eval_on_start and self.step == 0 then
    before = self:evaluate()
    self.run:log_metrics(0, { eval_accuracy = before.accuracy, eval_reward = before.reward })
  end
  local interrupted = false
  local function one()
    self:check_reload()
    return self:train_step()
  end
  if loop then
    loop(self)
    interrupted = self.dist:any(signal_pending())
  else
    while self.step < cfg.max_steps and not self:out_of_time() do
      one()
      if self.dist:any(signal_pending()) then interrupted = true break end
    end
  end
  if interrupted then
    self:save_checkpoint("interrupted")
    self:draw_plots()
    if self.progress then self.progress:finish() end
    say(self, ("interrupted at step %d; resume with: --resume %s"):format(self.step, self.run_dir))
    pcall(function() require("remax.ffi").C.rx_signal_clear() end)
    return { interrupted = true, step = self.step, run_dir = self.run_dir, plot_error = self.plot_error }
  end
  local after = self.last_eval
  if self.eval_ds and (not after or after.step ~= self.step) then
    after = self:evaluate()
    self.run:log_metrics(self.step, { eval_accuracy = after.accuracy, eval_reward = after.reward,
      time_elapsed_train = self.train_seconds })
  end
  if self.last_saved ~= self.step then self:save_checkpoint() end
  if cfg.save_final_model and self.dist.is_root then
    self.model:save(cfg.save_final_model)
    say(self, "final model saved to " .. cfg.save_final_model)
  end
  if cfg.save_merged then
    require("remax.lora").save_merged(self.model, cfg.save_merged)
    say(self, "merged model saved to " .. cfg.save_merged)
  end
  if self.progress then self.progress:finish() end
  self:draw_plots()
  if after and not self.quiet then
    local first = self.eval_history and self.eval_history[1]
    print(("held-out greedy accuracy: %.1f%% at step %d -> %.1f%% at step %d (%d prompts)"):format(
      100 * (first and first.accuracy or after.accuracy), first and first.step or self.step,
      100 * after.accuracy, self.step, after.n))
  end
  return { before = before, after = after, step = self.step, run_dir = self.run_dir, history = self.history,
    plot_error = self.plot_error }
end

-- For recipe loops: run one standard step (with hot reload) and say whether to go on.
function Trainer:should_continue()
  return self.step < self.cfg.max_steps and not self:out_of_time() and not self.dist:any(signal_pending())
end

-- max_time: the training time so far (steps only, evaluation excluded) has passed the budget
-- (on any rank: the ranks stop together).
function Trainer:out_of_time()
  local budget = self.cfg.max_time
  return self.dist:any(budget > 0 and (self.train_seconds or 0) >= budget)
end

return M
