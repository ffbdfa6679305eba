-- remax.run.setup: what a run trains with, made once when the Run starts, as one plain table of
-- pieces (M.pieces): the model (a Hugging Face folder, a checkpoint to resume, or a fresh random
-- one) and its tokenizer and stop tokens, the frozen reference of the KL term, the prompt
-- template, the training and held-out data, the reward functions, and AdamW. The Run keeps the
-- data; the Step (remax.step.step) gets the rest. Nothing here writes into a Run or a Step.
local model_mod = require("remax.bind.model")
local tokenizer = require("remax.bind.tokenizer")
local config = require("remax.settings.config")
local rewards = require("remax.step.rewards")
local data = require("remax.formats.data")
local chat = require("remax.text.chat")
local optim = require("remax.bind.optim")
local fs = require("remax.bind.fs")
local file_exists, mkdir = fs.exists, fs.mkdir_p

local M = {}

M.DEFAULT_MODEL = "models/tiny-gsm8k"

local function resolve_dir(path)
  if file_exists(path .. "/config.json") or file_exists(path .. "/adapter_config.json") then return path end
  local home = os.getenv("REMAX_HOME")
  if home and path:sub(1, 1) ~= "/" and file_exists(home .. "/" .. path .. "/config.json") then
    return home .. "/" .. path
  end
  return nil
end

-- The folder the model comes from: the model setting (a folder, or a Hugging Face name found in
-- the cache: Qwen/Qwen2.5-0.5B-Instruct), else the built-in base model; nil for a fresh random
-- model (model_config).
local function model_source(cfg)
  if cfg.model then return resolve_dir(cfg.model) or require("remax.formats.hf_cache").model_dir(cfg.model, "model") end
  if cfg.model_config then return nil end
  local source = resolve_dir(M.DEFAULT_MODEL)
  if not source then
    error(("the built-in base model %s is missing: run ./remax run recipes/tiny_sft.lua first " ..
      "(or pass --model DIR)"):format(M.DEFAULT_MODEL), 0)
  end
  return source
end

-- The byte-level tokenizer of a fresh random model, from a folder removed once it is loaded.
local function byte_level_tokenizer()
  local tmp = os.tmpname()
  os.remove(tmp)
  mkdir(tmp)
  local ok, tok = pcall(function()
    tokenizer.write_byte_level(tmp)
    return tokenizer.load(tmp)
  end)
  fs.remove_tree(tmp)
  if not ok then error(tok, 0) end
  return tok
end

-- The model, its tokenizer, stop tokens and template, into pieces p. ctx: run_dir, is_root,
-- eval_only, resume_model_dir.
local function setup_model(p, cfg, ctx)
  require("remax.bind.lora").register()   -- remax.model.load also reads LoRA adapter folders
  local mopts = { dtype = cfg.dtype, seed = cfg.seed, device = cfg.device }
  -- a model that is not trained (remax eval) or whose base is frozen (LoRA) may keep bf16 weights:
  -- bf16 matrices under f32 compute on the cpu; on cuda under bf16 compute a frozen bf16 model
  -- (every weight in bf16 alone, no f32 masters; LoRA's adapters keep theirs)
  if ctx.eval_only or cfg.use_lora then mopts.weight_dtype = M.frozen_weight_dtype(cfg) end
  -- a frozen base under bf16 on the cpu: bf16 storage is what the bf16 working copy would hold
  -- (the same GEMMs, half the memory of an f32 master beside it); the adapters train in f32
  if (ctx.eval_only or cfg.use_lora) and cfg.device == "cpu" and cfg.dtype == "bf16" then
    mopts.dtype, mopts.weight_dtype = "f32", "bf16"
  end
  local source = model_source(cfg)
  p.model_source = source
  -- with LoRA a checkpoint holds the adapters only: the base comes from where it always does
  local resume_dir = not cfg.use_lora and ctx.resume_model_dir or nil
  if source then
    p.model = model_mod.load(resume_dir or source, mopts)
    p.tok = tokenizer.load(source)
  else
    -- a fresh random model with the byte-level tokenizer, kept in the run folder
    local tok_dir = ctx.run_dir .. "/tokenizer"
    if ctx.is_root and not ctx.eval_only then
      mkdir(tok_dir)
      tokenizer.write_byte_level(tok_dir)
      p.tok = tokenizer.load(tok_dir)
    else   -- rank 0 alone writes the run folder (and remax eval none): a copy, removed once loaded
      p.tok = byte_level_tokenizer()
    end
    local mc = {}
    for k, v in pairs(cfg.model_config) do mc[k] = v end
    if mc.vocab_size == nil then mc.vocab_size = p.tok.vocab_size end
    if mc.vocab_size < p.tok.vocab_size then
      error(("model_config.vocab_size = %d is smaller than the tokenizer's %d tokens"):format(mc.vocab_size, p.tok.vocab_size), 0)
    end
    mc.eos_token_id = mc.eos_token_id or p.tok.eos_id
    p.fresh_config = mc
    if resume_dir then
      p.model = model_mod.load(resume_dir, mopts)
    else
      p.model = model_mod.new(mc, mopts)
    end
    p.model.source_dir = tok_dir
  end
  p.stop = tokenizer.stop_ids(p.tok, p.model_source, { chat_ends = true, names = cfg.stop })
  if cfg.use_lora then require("remax.bind.lora").setup(p.model, cfg, ctx.resume_model_dir) end
  p.model_opts = mopts
  p.template, p.template_name = M.template(cfg, p.tok)
end

-- The frozen reference model of pieces p (or of a Step, which has the same fields): the
-- starting weights (the model folder, or the same fresh random init). With LoRA: the same
-- model with its adapters off, no second copy.
function M.load_reference(p)
  local cfg = p.cfg
  if cfg.use_lora then return require("remax.bind.lora").reference(p.model) end
  local src = p.model_source
  -- on the policy's device. The cpu keeps frozen_dtype's bf16 weights under f32 compute. On
  -- cuda a bf16 reference is a frozen bf16 model (bf16 compute, every weight in bf16 alone: no
  -- f32 masters, gradients or working copy): for a bf16 policy unless frozen_dtype = f32, for
  -- an f32 policy when frozen_dtype = bf16 (its forward then computes in bf16 too)
  local ropts = {}
  for k, v in pairs(p.model_opts) do if k ~= "weight_dtype" then ropts[k] = v end end
  ropts.weight_dtype = M.reference_weight_dtype(cfg)
  if cfg.device ~= "cpu" and ropts.weight_dtype == "bf16" then ropts.dtype = "bf16" end
  -- a bf16 policy on the cpu: the reference stores its matrices in bf16, the numbers the policy's
  -- GEMMs read from its working copy (so the KL starts at 0), without an f32 master beside them
  if cfg.device == "cpu" and ropts.dtype == "bf16" then ropts.dtype, ropts.weight_dtype = "f32", "bf16" end
  return src and model_mod.load(src, ropts) or model_mod.new(p.fresh_config, ropts)
end

-- The prompt template of cfg for tokenizer tok, and its name for the start line.
function M.template(cfg, tok)
  local t = cfg.chat_template
  if t == "auto" and tok.chat_template_names then   -- templates, but none named default: not qa behind the user's back
    error(("chat_template = auto: %s; or set chat_template = qa, chatml, llama3 or plain"):format(chat.no_template(tok)), 0)
  end
  if t == "auto" then
    t = (tok.chat_template and tok.chat_template ~= "") and "tokenizer" or "qa"
  end
  local name = type(t) == "string" and t or "recipe function"
  local template
  local extra = { enable_thinking = cfg.enable_thinking, template_args = cfg.chat_template_kwargs }
  if t == "qa" then template = { template = "qa" }
  elseif t == "tokenizer" then template = { template = "tokenizer", tokenizer = tok }
  else template = { template = t, tokenizer = tok.chat_template and tok or nil } end
  for k, v in pairs(extra) do template[k] = v end
  return template, name
end

-- A dataset from a data setting: a file (every row), or a recipe's function(split, n, cfg) ->
-- rows (or a remax.formats.data dataset).
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

-- The training and held-out data into p (train_ds, eval_ds), map_row applied; with
-- num_train_epochs and no max_steps, sets cfg.max_steps from the data (ctx.prompts_per_step:
-- the global prompts per step).
local function setup_data(p, cfg, ctx)
  local map = { prompt = cfg.prompt_column, answer = cfg.answer_column }
  if not cfg.data then
    error("no training data: set data to a JSONL or JSON file (--data FILE), or in the recipe to a function(split, n, cfg) -> rows "
      .. "(remax.tasks.gsm8k.synthetic() makes GSM8K-style problems, as recipes/gsm8k.lua does)", 0)
  end
  p.train_ds = load_data(cfg.data, "train", cfg.train_size, cfg, map)
  if cfg.eval_size > 0 then
    local source = cfg.eval_data or (type(cfg.data) == "function" and cfg.data or nil)
    if source then p.eval_ds = load_data(source, "test", cfg.eval_size, cfg, map) end
  end
  if cfg.map_row then
    for _, ds in ipairs({ p.train_ds, p.eval_ds }) do
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
  p.notes = p.notes or {}   -- said by the Run once it starts
  if type(cfg.data) == "string" then   -- a TRL dataset's plain-string prompts (remax.settings.inert)
    for _, note in ipairs(require("remax.settings.inert").data_notes(p.train_ds.rows, p.template_name, cfg.data)) do
      p.notes[#p.notes + 1] = note
    end
  end
  if cfg.algo == "sft" then
    for _, ds in ipairs({ p.train_ds, p.eval_ds }) do
      local col = cfg.answer_column or "answer"
      local row = ds.rows[1]
      if type(row[col]) ~= "string" then
        error(("algo = sft needs an answer column '%s' (the target text) in %s; its columns: %s"):format(col,
          ds.source, table.concat(ds:columns(), ", ")), 0)
      end
    end
  end
  if cfg.steps_from_epochs then   -- num_train_epochs without max_steps: that many passes over the data
    cfg.max_steps = math.max(1, math.ceil(cfg.num_train_epochs * #p.train_ds.rows / ctx.prompts_per_step))
    p.max_steps_changed = true
  end
end

-- The reward functions into p (rewards, accuracy_name), each probed on the first rows.
-- ctx.recipe_dir: where relative reward files are found.
local function setup_rewards(p, cfg, ctx)
  -- reward models run on the policy's device (on cuda under bf16: frozen bf16 models)
  p.rewards = rewards.load_all(cfg.rewards, { base = ctx.recipe_dir, device = cfg.device,
    dtype = cfg.device ~= "cpu" and cfg.dtype or nil, max_line_bytes = cfg.reward_max_line_bytes })
  -- the first-rows check passes what a step passes (TRL-signature py: rewards, trainer_state)
  local probe_opts = { state = rewards.trainer_state(cfg, 0, rewards.state_info(cfg, p.train_ds, ctx.world)),
    encode_prompt = function(prompt) return (chat.encode(p.tok, prompt, p.template)) end,
    encode = function(text) return p.tok:encode(text, { add_special_tokens = false }) end }
  rewards.probe(p.rewards, p.train_ds.rows, p.train_ds.source, data.collate, rewards.limit(cfg.reward_timeout), probe_opts)
  if p.eval_ds then rewards.probe(p.rewards, p.eval_ds.rows, p.eval_ds.source, data.collate, rewards.limit(cfg.reward_timeout), probe_opts) end
  -- evaluation's accuracy: the first reward marked accuracy = true (right or wrong per
  -- completion, as gsm8k_accuracy), else the first reward
  p.accuracy_name = p.rewards[1] and p.rewards[1].name
  for i = #p.rewards, 1, -1 do
    if p.rewards[i].accuracy then p.accuracy_name = p.rewards[i].name end
  end
end

-- AdamW (ZeRO-1/2 under zero_stage > 0; no moments for remax eval) over p.model.
local function setup_optimizer(p, cfg, ctx)
  local opts = { lr = cfg.learning_rate, betas = { cfg.adam_beta1, cfg.adam_beta2 }, eps = cfg.adam_epsilon,
    weight_decay = cfg.weight_decay, stage = cfg.zero_stage }
  if ctx.eval_only then   -- remax eval trains nothing (its model may be frozen): no moments
    p.opt = optim.adamw({}, {}, opts)
  elseif cfg.zero_stage > 0 then   -- ZeRO-1/2: this rank's shard of the moments (docs/distributed.md)
    p.opt = optim.zero_adamw(p.world, p.model, opts)
  else
    p.opt = optim.adamw(p.model, opts)   -- over the model's flat buffers (bind/optim)
  end
end

-- Every piece of a run, in one plain table: model, tok, stop, template, template_name,
-- model_source, model_opts, fresh_config, ref (when the KL term needs it; otherwise
-- load_reference loads it on first need), load_reference, train_ds, eval_ds, rewards,
-- accuracy_name, opt, world, cfg (read only), max_steps_changed. ctx: world (remax.bind.dist),
-- run_dir, eval_only, resume_model_dir, recipe_dir, prompts_per_step (global).
function M.pieces(cfg, ctx)
  if cfg.algo == "reward" then return M.reward_pieces(cfg, ctx) end
  local p = { cfg = cfg, world = ctx.world, load_reference = M.load_reference, recipe_dir = ctx.recipe_dir }
  if ctx.is_root == nil then ctx.is_root = ctx.world.is_root end   -- rollout ranks: the Step's world is its rank alone
  setup_model(p, cfg, ctx)
  -- the frozen reference: the starting weights, loaded only when the KL term is used
  if cfg.needs_reference then p.ref = M.load_reference(p) end
  setup_data(p, cfg, ctx)
  setup_rewards(p, cfg, ctx)
  setup_optimizer(p, cfg, ctx)
  return p
end

-- What a run's prompts are made of, without loading the model (remax render): tok, template,
-- template_name, model_source, train_ds, eval_ds (map_row applied), cfg, recipe_dir. ctx:
-- recipe_dir, prompts_per_step.
function M.prompt_pieces(cfg, ctx)
  local p = { cfg = cfg, recipe_dir = ctx.recipe_dir }
  p.model_source = model_source(cfg)
  p.tok = p.model_source and tokenizer.load(p.model_source) or byte_level_tokenizer()
  p.template, p.template_name = M.template(cfg, p.tok)
  setup_data(p, cfg, ctx)
  return p
end

-- algo = reward: the pieces of remax.step.reward_model's Step: the reward model to train (the
-- model folder's decoder and a score head, remax.step.reward_model.load), preference pairs
-- (remax.step.preferences) from data / eval_data (files or data functions), AdamW over both.
function M.reward_pieces(cfg, ctx)
  local rm = require("remax.step.reward_model")
  local prefs = require("remax.step.preferences")
  require("remax.bind.lora").register()
  local mopts = { dtype = cfg.dtype, seed = cfg.seed, device = cfg.device }
  if cfg.use_lora then
    mopts.weight_dtype = M.frozen_weight_dtype(cfg)
    if cfg.device == "cpu" and cfg.dtype == "bf16" then mopts.dtype, mopts.weight_dtype = "f32", "bf16" end
  end
  local source = cfg.model and (resolve_dir(cfg.model) or require("remax.formats.hf_cache").model_dir(cfg.model, "model"))
  if not cfg.model and not cfg.model_config then source = resolve_dir(M.DEFAULT_MODEL) end
  local p = rm.load(cfg, source, { model_opts = mopts, resume_dir = ctx.resume_model_dir, world = ctx.world })
  p.cfg, p.world, p.model_source, p.model_opts, p.rewards = cfg, ctx.world, source, mopts, {}
  p.template_name, p.accuracy_name = "the reward model's", "pair accuracy"
  local map = { prompt = cfg.prompt_column, chosen = cfg.chosen_column, rejected = cfg.rejected_column,
    margin = cfg.margin_column }
  local function load(src, split, n)
    if type(src) == "string" then return prefs.load(src, map) end
    local ok, out = pcall(src, split, n, cfg)
    if not ok then error(("data (%s), split %s: %s"):format(config.show(src), split, tostring(out)), 0) end
    return prefs.from_rows(out, map, ("%s(%s)"):format(config.show(src), split))
  end
  if not cfg.data then error("algo = reward: no training data: set data to a JSONL or JSON file of preference pairs", 0) end
  p.train_ds = load(cfg.data, "train", cfg.train_size)
  if cfg.eval_size > 0 then
    local src = cfg.eval_data or (type(cfg.data) == "function" and cfg.data or nil)
    if src then p.eval_ds = load(src, "test", cfg.eval_size) end
  end
  -- every pair encoded now: those too long for the model are left out and said (p.notes)
  p.notes = {}
  for _, ds in ipairs({ p.train_ds, p.eval_ds }) do
    local note = rm.leave_out_long(p.rm, ds)
    if note then p.notes[#p.notes + 1] = note end
  end
  if cfg.steps_from_epochs then
    cfg.max_steps = math.max(1, math.ceil(cfg.num_train_epochs * #p.train_ds.rows / ctx.prompts_per_step))
    p.max_steps_changed = true
  end
  p.opt = rm.optimizer(p.model, p.head, p.dhead, { lr = cfg.learning_rate, betas = { cfg.adam_beta1, cfg.adam_beta2 },
    eps = cfg.adam_epsilon, weight_decay = cfg.weight_decay })
  return p
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

---------------------------------------------------------------------------- memory

-- The model's config without loading it: config.json of the model folder, or the recipe's
-- model_config, as the engine's rx_model_config (f32 on the cpu: the host memory the check is
-- against); nil when neither can be read or resolved (loading the model then says why).
local function model_config(cfg)
  local c = cfg.model_config
  if not c then
    local dir = cfg.model
    if not dir then dir = (os.getenv("REMAX_HOME") or ".") .. "/" .. M.DEFAULT_MODEL end
    local f = io.open(dir .. "/config.json", "rb")
    if not f then return nil end
    local text = f:read("*a")
    f:close()
    local ok, t = pcall(require("cjson").decode, text)
    if not ok or type(t) ~= "table" then return nil end
    c = t
  end
  local full = {}
  for k, v in pairs(c) do full[k] = v end
  if full.vocab_size == nil then full.vocab_size = 260 end   -- a fresh model takes the byte-level tokenizer's
  local ok, rc = pcall(model_mod.resolve_config, full, "model_config")
  return ok and rc or nil
end

-- The tokens a row's generation holds in the cache after its prompt: max_completion_length,
-- and for episodes (tools, environments) the observations' room too, up to max_episode_length
-- (default: the model's positions), as remax.step.episodes asks the engine for it.
local function new_tokens(cfg, c)
  local episodes = require("remax.step.episodes")
  if not episodes.wanted(cfg) then return cfg.max_completion_length end
  local positions = tonumber(c.max_position_embeddings)
  local _, room = episodes.episode_room(cfg, positions)
  local total = math.min(cfg.max_prompt_length + cfg.max_completion_length + room, positions)
  return math.max(cfg.max_completion_length, total - cfg.max_prompt_length)
end

-- The memory the generation of one micro-batch needs (rows rows of prompts prompts): the
-- engine's own count (rx_generate_memory_bytes, what rx_generate_begin checks), and the KV
-- cache's share; 0, 0 when the model's config cannot be read.
function M.generation_bytes(cfg, rows, prompts)
  local c = model_config(cfg)
  if not c then return 0, 0 end
  return require("remax.bind.generate").memory_bytes(c, rows, prompts or rows, cfg.max_prompt_length,
    new_tokens(cfg, c), cfg.repetition_penalty ~= 1)
end

-- Bytes of memory available now (MemAvailable), or nil (a field, so that a test can stand in for it).
M.available_bytes = require("remax.bind.generate").available_bytes

local function gib(b) return ("%.1f GiB"):format(b / 2 ^ 30) end

-- Refuses settings whose generation cannot fit in this machine's memory, before any model loads:
-- the rows one generation call of a step holds, and one evaluation batch's. The refusal names the
-- setting to blame (the first of the sizes not left at its default) with its source.
function M.check_memory(cfg)
  local show = require("remax.settings.schema").show
  local function source(k) return config.source(cfg, k) end
  local function bad(key, msg) error(("%s: %s = %s: %s"):format(source(key), key, show(cfg[key]), msg), 0) end
  local function setting(k) return ("%s = %s (%s)"):format(k, show(cfg[k]), source(k)) end
  local function first_set(keys)
    for _, k in ipairs(keys) do if source(k) ~= "default" then return k end end
    return keys[1]
  end
  local available = M.available_bytes()
  if not (available and available > 0) then return end
  local algorithm = require("remax.settings.registry").algorithm(cfg.algo)
  local rl = algorithm and algorithm.samples
  local greedy = (rl and cfg.generate_greedy) and 1 or 0
  local per_prompt = (rl and cfg.num_generations or 0) + greedy
  -- episodes: every row's cache also holds its observations, up to max_episode_length
  local episodic = require("remax.step.episodes").wanted(cfg)
  local function tokens()
    local t = ("%s + %s"):format(setting("max_prompt_length"), setting("max_completion_length"))
    if not episodic then return t end
    local c = model_config(cfg)
    local shown = cfg.max_episode_length and setting("max_episode_length")
      or ("max_episode_length = %d (default: the model's max_position_embeddings)"):format(tonumber(c.max_position_embeddings))
    return t .. " + observations, all within " .. shown
  end
  local function refuse(keys, msg)
    if episodic and cfg.max_episode_length == nil then   -- the cache of a row then holds the model's full positions
      error(("max_episode_length is not set: %s; set max_episode_length (a multi-turn episode's longest, prompt " ..
        "and observations included)"):format(msg), 0)
    end
    if episodic then table.insert(keys, 1, "max_episode_length") end
    bad(first_set(keys), msg)
  end
  local need = M.generation_bytes(cfg, cfg.per_device_train_batch_size * per_prompt, cfg.per_device_train_batch_size)
  if need > available then
    refuse({ "num_generations", "per_device_train_batch_size", "max_completion_length", "max_prompt_length" },
      ("one step's generation needs at least %s (the KV cache of every row and the activations), but %s of memory is " ..
      "available: %s prompts x (%s%s) rows x (%s) tokens; lower one of them"):format(gib(need), gib(available),
      setting("per_device_train_batch_size"), setting("num_generations"), greedy == 1 and " + 1 greedy" or "", tokens()))
  end
  need = M.generation_bytes(cfg, cfg.per_device_eval_batch_size)
  if cfg.eval_size > 0 and need > available then
    refuse({ "per_device_eval_batch_size", "max_completion_length", "max_prompt_length" },
      ("one evaluation batch's generation needs at least %s, but %s of memory is available: " ..
      "%s rows x (%s) tokens; lower one of them"):format(gib(need), gib(available),
      setting("per_device_eval_batch_size"), tokens()))
  end
end

return M
