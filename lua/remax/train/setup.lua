-- remax.train.setup: what a run trains with, made once when the Trainer starts: the model (a
-- Hugging Face folder, a checkpoint to resume, or a fresh random one) and its tokenizer and stop
-- tokens, the frozen reference of the KL term, the prompt template, the training and held-out
-- data, the reward functions, and AdamW with its schedule's length.
local remax = require("remax")
local config = require("remax.train.config")
local rewards = require("remax.train.rewards")
local data = require("remax.train.data")
local chat = require("remax.text.chat")
local optim = require("remax.bind.optim")
local fs = require("remax.bind.fs")
local file_exists, mkdir = fs.exists, fs.mkdir_p

local M = {}
local methods = {}   -- installed on remax.train.trainer's Trainer
M.methods = methods

M.DEFAULT_MODEL = "models/tiny-gsm8k"

local function resolve_dir(path)
  if file_exists(path .. "/config.json") or file_exists(path .. "/adapter_config.json") then return path end
  local home = os.getenv("REMAX_HOME")
  if home and path:sub(1, 1) ~= "/" and file_exists(home .. "/" .. path .. "/config.json") then
    return home .. "/" .. path
  end
  return nil
end

function methods.setup_model(self)
  local cfg = self.cfg
  local mopts = { dtype = cfg.dtype, seed = cfg.seed, device = cfg.device }
  -- a model that is not trained (remax eval) or whose base is frozen (LoRA) may keep bf16 weights:
  -- bf16 matrices under f32 compute on the cpu; on cuda under bf16 compute a frozen bf16 model
  -- (every weight in bf16 alone, no f32 masters; LoRA's adapters keep theirs)
  if self.opts.eval_only or cfg.use_lora then mopts.weight_dtype = M.frozen_weight_dtype(cfg) end
  -- a frozen base under bf16 on the cpu: bf16 storage is what the bf16 working copy would hold
  -- (the same GEMMs, half the memory of an f32 master beside it); the adapters train in f32
  if (self.opts.eval_only or cfg.use_lora) and cfg.device == "cpu" and cfg.dtype == "bf16" then
    mopts.dtype, mopts.weight_dtype = "f32", "bf16"
  end
  local source
  if cfg.model then
    -- a folder, or a Hugging Face name found in the cache (Qwen/Qwen2.5-0.5B-Instruct)
    source = resolve_dir(cfg.model) or require("remax.bind.hf_cache").model_dir(cfg.model, "model")
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
    if self.dist.is_root and not self.opts.eval_only then
      mkdir(tok_dir)
      remax.tokenizer.write_byte_level(tok_dir)
      self.tok = remax.tokenizer.load(tok_dir)
    else   -- rank 0 alone writes the run folder (and remax eval none): a copy, removed once loaded
      local tmp = os.tmpname()
      os.remove(tmp)
      mkdir(tmp)
      local ok, err = pcall(function()
        remax.tokenizer.write_byte_level(tmp)
        self.tok = remax.tokenizer.load(tmp)
      end)
      fs.remove_tree(tmp)
      if not ok then error(err, 0) end
    end
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
  self.stop = remax.tokenizer.stop_ids(self.tok, self.model_source, { chat_ends = true, names = cfg.stop })
  if cfg.use_lora then require("remax.bind.lora").setup(self.model, cfg, self.resume_model_dir) end
  self.model_opts = mopts
  -- the frozen reference: the starting weights, loaded only when the KL term is used (with
  -- LoRA: the same model with its adapters off, no second copy)
  if cfg.needs_reference then self:load_reference() end
  self:resolve_template()
end

-- The frozen reference model: the starting weights (the model folder, or the same fresh random
-- init), also when a hot reload raises beta from 0.
function methods.load_reference(self)
  if self.ref then return self.ref end
  if self.cfg.use_lora then
    self.ref = require("remax.bind.lora").reference(self.model)
    return self.ref
  end
  local src = self.model_source
  -- on the policy's device. The cpu keeps frozen_dtype's bf16 weights under f32 compute. On
  -- cuda a bf16 reference is a frozen bf16 model (bf16 compute, every weight in bf16 alone: no
  -- f32 masters, gradients or working copy): for a bf16 policy unless frozen_dtype = f32, for
  -- an f32 policy when frozen_dtype = bf16 (its forward then computes in bf16 too)
  local ropts = {}
  for k, v in pairs(self.model_opts) do if k ~= "weight_dtype" then ropts[k] = v end end
  ropts.weight_dtype = M.reference_weight_dtype(self.cfg)
  if self.cfg.device ~= "cpu" and ropts.weight_dtype == "bf16" then ropts.dtype = "bf16" end
  -- a bf16 policy on the cpu: the reference stores its matrices in bf16, the numbers the policy's
  -- GEMMs read from its working copy (so the KL starts at 0), without an f32 master beside them
  if self.cfg.device == "cpu" and ropts.dtype == "bf16" then ropts.dtype, ropts.weight_dtype = "f32", "bf16" end
  self.ref = src and remax.model.load(src, ropts) or remax.model.new(self.fresh_config, ropts)
  return self.ref
end

function methods.resolve_template(self)
  local t = self.cfg.chat_template
  if t == "auto" then
    t = (self.tok.chat_template and self.tok.chat_template ~= "") and "tokenizer" or "qa"
  end
  self.template_name = type(t) == "string" and t or "recipe function"
  local extra = { enable_thinking = self.cfg.enable_thinking, template_args = self.cfg.chat_template_kwargs }
  if t == "qa" then self.template = { template = "qa" }
  elseif t == "tokenizer" then self.template = { template = "tokenizer", tokenizer = self.tok }
  else self.template = { template = t, tokenizer = self.tok.chat_template and self.tok or nil } end
  for k, v in pairs(extra) do self.template[k] = v end
end

-- A prompt (string or messages) -> token ids, truncated to its last max_prompt_length tokens
-- (then also its length before, as a third value; the first one is announced once per run).
function methods.encode_prompt(self, prompt)
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

-- A dataset from a data setting: a file (every row), or a recipe's function(split, n, cfg) ->
-- rows (or a remax.train.data dataset).
local function load_data(source, split, n, cfg, map)
  if type(source) == "string" then return data.load(source, map) end
  local ok, out = pcall(source, split, n, cfg)
  if not ok then error(("data (%s), split %s: %s"):format(config.show(source), split, tostring(out)), 0) end
  if type(out) ~= "table" then
    error(("data (%s), split %s: returned a %s, expected a list of rows"):format(config.show(source), split, type(out)), 0)
  end
  if out.rows then return out end
  return data.from_rows(out, { name = ("%s(%s)"):format(config.show(source), split) })
end

function methods.setup_data(self)
  local cfg = self.cfg
  local map = { prompt = cfg.prompt_column, answer = cfg.answer_column }
  if not cfg.data then
    error("no training data: set data to a JSONL or JSON file (--data FILE), or in the recipe to a function(split, n, cfg) -> rows "
      .. "(remax.tasks.gsm8k.synthetic() makes GSM8K-style problems, as recipes/gsm8k.lua does)", 0)
  end
  self.train_ds = load_data(cfg.data, "train", cfg.train_size, cfg, map)
  if type(cfg.data) == "string" then   -- a TRL dataset's plain-string prompts (remax.train.inert)
    for _, note in ipairs(require("remax.train.inert").data_notes(self.train_ds.rows, self.template_name, cfg.data)) do self:say(note) end
  end
  if cfg.eval_size > 0 then
    local source = cfg.eval_data or (type(cfg.data) == "function" and cfg.data or nil)
    if source then self.eval_ds = load_data(source, "test", cfg.eval_size, cfg, map) end
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
  if cfg.steps_from_epochs then   -- num_train_epochs without max_steps: that many passes over the data
    cfg.max_steps = math.max(1, math.ceil(cfg.num_train_epochs * #self.train_ds.rows / self.global_prompts_per_step))
    if self.run.write_config then self.run:write_config(config.serializable(cfg)) end
  end
  self.sampler = self.train_ds:sampler({ seed = cfg.seed, shuffle = true, batch_size = self.global_prompts_per_step })
end

function methods.setup_rewards(self)
  -- reward models run on the policy's device (on cuda under bf16: frozen bf16 models)
  self.rewards = rewards.load_all(self.cfg.rewards, { base = self.recipe_dir, device = self.cfg.device,
    dtype = self.cfg.device ~= "cpu" and self.cfg.dtype or nil })
  rewards.probe(self.rewards, self.train_ds.rows, self.train_ds.source, data.collate, rewards.limit(self.cfg.reward_timeout))
  if self.eval_ds then rewards.probe(self.rewards, self.eval_ds.rows, self.eval_ds.source, data.collate, rewards.limit(self.cfg.reward_timeout)) end
  -- evaluation's accuracy: the first reward marked accuracy = true (right or wrong per
  -- completion, as gsm8k_accuracy), else the first reward
  self.accuracy_name = self.rewards[1] and self.rewards[1].name
  for i = #self.rewards, 1, -1 do
    if self.rewards[i].accuracy then self.accuracy_name = self.rewards[i].name end
  end
  if self.cfg.hot_reload then self:snapshot_watch() end
end

function methods.setup_optimizer(self)
  local cfg = self.cfg
  local opts = { lr = cfg.learning_rate, betas = { cfg.adam_beta1, cfg.adam_beta2 }, eps = cfg.adam_epsilon,
    weight_decay = cfg.weight_decay, stage = cfg.zero_stage }
  if self.opts.eval_only then   -- remax eval trains nothing (its model may be frozen): no moments
    self.opt = optim.adamw({}, {}, opts)
  elseif cfg.zero_stage > 0 then   -- ZeRO-1/2: this rank's shard of the moments (docs/distributed.md)
    self.opt = optim.zero_adamw(self.dist, self.model, opts)
  else
    self.opt = optim.adamw(self.model, opts)   -- over the model's flat buffers (bind/optim)
  end
  -- the schedule counts optimizer updates: num_iterations of them per step
  self.total_updates = cfg.max_steps * cfg.num_iterations
  self.warmup_steps = math.ceil(cfg.warmup_ratio * self.total_updates)
end

-- The weight_dtype of a frozen policy (remax eval, the base under LoRA adapters): frozen_dtype
-- on the cpu; on cuda "bf16" under bf16 compute unless frozen_dtype = f32 (a frozen bf16 model),
-- else nil (the compute dtype: bf16 storage under f32 compute is the cpu's).
function M.frozen_weight_dtype(cfg)
  if cfg.device == "cpu" then return cfg.frozen_dtype end
  if cfg.dtype == "bf16" and cfg.frozen_dtype ~= "f32" then return "bf16" end
  return nil
end

-- The weight_dtype of the separate reference model (remax.bind.model's option): frozen_dtype on
-- the cpu; on cuda "bf16" (a frozen bf16 model) for a bf16 policy unless frozen_dtype = f32, or
-- when frozen_dtype = bf16; else nil (the policy's storage).
function M.reference_weight_dtype(cfg)
  if cfg.device == "cpu" then return cfg.frozen_dtype end
  if cfg.frozen_dtype == "bf16" or (cfg.dtype == "bf16" and cfg.frozen_dtype ~= "f32") then return "bf16" end
  return nil
end

-- Stops before anything is made when no model is given and the built-in base model is missing.
function M.check_base_model(cfg)
  if not cfg.model and not cfg.model_config and not cfg.resume and not resolve_dir(M.DEFAULT_MODEL) then
    error(("the built-in base model %s is missing: run ./remax run recipes/tiny_sft.lua first " ..
      "(or pass --model DIR)"):format(M.DEFAULT_MODEL), 0)
  end
end

return M
