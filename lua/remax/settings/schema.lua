-- remax.settings.schema: what a value of each setting may be, beyond its type (remax.settings.config
-- declares name, default, type and meaning): the range, whether it must be whole, a list's
-- length and its items' range, a string's form; and the checks across settings (num_generations
-- against the memory a step's generation needs, rewards for an RL run, ...). config.resolve runs
-- them once, before any model is loaded; every refusal names the setting, the value and where the
-- value came from (the recipe's file:line, the command line, or the default).
--
--   local problem = schema.value_problem(decl, v)     -- nil, or "expected a number in (0, 1]"
--   schema.cross_check(cfg, source)                   -- raises "SOURCE: key = value: ..."
--
-- A range is written as in mathematics: "[0, 1]", "(0, inf)", "[1, 2^31)". Defaults by type:
-- a number is finite, an integer is a whole number in [0, 2^31) (so 1e99 steps is refused, not
-- wrapped), a string is not empty. A setting declared without a limit here gets those.
local M = {}

local I31 = "[0, 2^31)"
-- setting -> range (a string), or a table: range, each (the range of a list's items), count
-- (a list's length), min_items, name (a single folder name), path (no NUL byte).
M.limits = {
  -- model and data
  model = { path = true }, data = { path = true }, eval_data = { path = true },
  -- a data function makes its rows up front: ten million is minutes and gigabytes already
  train_size = "[1, 1e7]", eval_size = "[0, 1e7]",
  stop = { min_items = 1 }, stop_strings = { min_items = 1 },
  -- algorithm
  num_generations = "[0, 2^24]", advantage_clip = "[0, inf)", baseline_momentum = "[0, 1)",
  beta = "[0, inf)", gamma = "[0, 1]", center_rewards_coefficient = "[0, inf)", num_iterations = "[1, 1024]", epsilon = "[0, 1]", epsilon_high = "[0, inf)",
  delta = "(1, inf)", top_entropy_quantile = "(0, 1]", entropy_coef = "(-inf, inf)",
  -- LoRA
  lora_r = "[1, 65536]", lora_alpha = "(0, inf)", lora_dropout = "[0, 1)",
  lora_target_modules = { min_items = 1 }, save_merged = { path = true },
  -- rewards
  reward_weights = { each = "(-inf, inf)", min_items = 1 }, reward_timeout = "[0, inf)",
  reward_max_line_bytes = "[1, 2^40]",
  -- generation
  max_prompt_length = "[1, 2^20]", max_completion_length = "[1, 2^20]",
  temperature = "[0, inf)", top_p = "(0, 1]", top_k = I31, min_p = "[0, 1]", repetition_penalty = "(0, inf)",
  -- episodes (multi-turn)
  max_turns = "[1, 1024]", max_episode_length = "[2, 2^20]", tool_timeout = "[0, inf)",
  -- asynchronous rollouts
  max_staleness = "[0, 1024]", rollout_ranks = "[0, 2^20]", weight_sync_steps = "[1, 2^20]", vllm_importance_sampling_cap = "(0, inf)",
  -- optimisation
  learning_rate = "[0, 1]", warmup_ratio = "[0, 1]", weight_decay = "[0, inf)",
  adam_beta1 = "[0, 1)", adam_beta2 = "[0, 1)", adam_epsilon = "(0, 1]", max_grad_norm = "[0, inf)",
  per_device_train_batch_size = "[1, 2^20]", gradient_accumulation_steps = "[1, 2^20]",
  max_tokens_per_microbatch = "[1, 2^31)",
  zero_stage = "[0, 2]", dist_timeout = "(0, 1e9]", num_train_epochs = "(0, 1e6]",
  max_steps = I31, max_time = "[0, inf)", max_bad_steps = I31,
  -- run
  seed = "[0, 2^32)", output_dir = { path = true }, run_name = { name = true }, resume = { path = true },
  logging_steps = "[1, 2^31)", log_completions = I31, eval_steps = I31,
  per_device_eval_batch_size = "[1, 2^20]", save_steps = I31, save_total_limit = "[1, 2^31)",
  save_final_model = { path = true },
}

---------------------------------------------------------------------------- ranges

local function bound(s)
  s = s:gsub("%s", "")
  if s == "inf" then return math.huge end
  if s == "-inf" then return -math.huge end
  local b, e = s:match("^(%d+)%^(%d+)$")
  if b then return tonumber(b) ^ tonumber(e) end
  return assert(tonumber(s), "schema: bad bound " .. s)
end

-- "[0, 1)" -> {lo = 0, hi = 1, lo_open = false, hi_open = true, text = "[0, 1)"}
local parsed = {}
function M.range(text)
  if parsed[text] then return parsed[text] end
  local l, a, b, r = text:match("^%s*([%[%(])([^,]+),([^%]%)]+)([%]%)])%s*$")
  assert(l, "schema: bad range " .. text)
  local out = { lo = bound(a), hi = bound(b), lo_open = l == "(", hi_open = r == ")", text = text }
  parsed[text] = out
  return out
end

local function in_range(v, rg)
  if rg.lo_open then if not (v > rg.lo) then return false end elseif not (v >= rg.lo) then return false end
  if rg.hi_open then if not (v < rg.hi) then return false end elseif not (v <= rg.hi) then return false end
  return true
end

-- The limit of a declaration: its entry in M.limits, with the defaults of its type.
function M.limit_of(decl)
  local l = M.limits[decl.name]
  if type(l) == "string" then l = { range = l } end
  l = l or {}
  if not l.range and decl.type == "integer" then l.range = I31 end
  return l
end

-- A number against a range: nil when it fits, else what was expected.
local function number_problem(v, rg, integer)
  local what = integer and "an integer" or "a number"
  if type(v) ~= "number" then return what end
  if v ~= v then return what .. " (not NaN)" end
  if (v == math.huge or v == -math.huge) then return ("a finite %s%s"):format(integer and "integer" or "number",
    rg and (" in " .. rg.text) or "") end
  if integer and v ~= math.floor(v) then return ("an integer%s"):format(rg and (" in " .. rg.text) or "") end
  if rg and not in_range(v, rg) then return ("%s in %s"):format(what, rg.text) end
  return nil
end

-- A single folder name (run_name): the run must stay inside output_dir.
local function name_problem(v)
  if v == "" then return "a folder name (not empty)" end
  if v:find("/", 1, true) or v:find("\\", 1, true) then return "a single folder name, without '/' (the run stays inside output_dir)" end
  if v == "." or v == ".." then return "a folder name other than '.' and '..' (the run stays inside output_dir)" end
  if v:find("%c") then return "a folder name without control characters" end
  return nil
end

-- What a value of decl must be, when it is not (nil when it is fine). The type was checked first.
function M.value_problem(decl, v)
  if v == nil then return nil end
  local l = M.limit_of(decl)
  local t = decl.type
  if t == "number" or t == "integer" then
    return number_problem(v, l.range and M.range(l.range), t == "integer")
  elseif t == "string" or (t == "data" and type(v) == "string") then
    if v == "" then return "a non-empty string" end
    if l.path and v:find("%z") then return "a path without NUL bytes" end
    if l.name then return name_problem(v) end
    if l.check then return l.check(v) end
  elseif t == "numbers" then
    if l.count and #v ~= l.count then return ("%d numbers"):format(l.count) end
    if l.min_items and #v < l.min_items then return "a non-empty list of numbers" end
    local rg = l.each and M.range(l.each)
    for i, x in ipairs(v) do
      local p = number_problem(x, rg, l.integer)
      if p then return ("a list of which item %d (%s) is %s"):format(i, tostring(x), p) end
    end
    if l.count == 2 and v[1] > v[2] then return "min,max with min <= max" end
  elseif t == "strings" then
    if l.min_items and #v < l.min_items then return "a non-empty list" end
    for i, x in ipairs(v) do
      if x == "" then return ("a list of non-empty strings (item %d is empty)"):format(i) end
    end
  end
  return nil
end

---------------------------------------------------------------------------- sources

-- The line of a recipe file where `key = ` is first written (nil when not found).
local texts = {}
function M.recipe_line(file, key)
  if type(file) ~= "string" then return nil end
  local text = texts[file]
  if text == nil then
    local f = io.open(file, "rb")
    text = f and f:read("*a") or false
    if f then f:close() end
    texts[file] = text
  end
  if not text then return nil end
  local n = 0
  for line in (text .. "\n"):gmatch("([^\n]*)\n") do
    n = n + 1
    if line:find("%f[%w_]" .. key .. "%s*=[^=]") or line:find("%[%s*[\"']" .. key .. "[\"']%s*%]%s*=[^=]") then return n end
  end
  return nil
end

-- Forget the recipe texts read (a hot reload reads the changed file again).
function M.forget_recipes() texts = {} end

---------------------------------------------------------------------------- values shown

local function show(v)
  if type(v) == "string" then return ("'%s'"):format(v) end
  if type(v) == "number" then
    if v ~= v then return "nan" end
    if v == math.huge then return "inf" end
    if v == -math.huge then return "-inf" end
    return tostring(v)
  end
  if type(v) == "table" then
    local parts = {}
    for i, x in ipairs(v) do parts[i] = type(x) == "table" and (x.name or "table") or tostring(x) end
    return "{" .. table.concat(parts, ", ") .. "}"
  end
  return tostring(v)
end
M.show = show

-- "SOURCE: key = value: expected WHAT"
function M.refusal(source, key, v, expected)
  return ("%s: %s = %s: expected %s"):format(source, key, show(v), expected)
end

-- TRL's loss_type -> the aggregation it implies here ("micro-token-mean" is TRL's bnpo: a token
-- mean inside each micro-batch, then the mean over micro-batches; not a loss_agg_mode):
-- config.derive sets cfg.aggregation from it, remax.step.algos computes each.
M.loss_types = {
  grpo = "seq-mean-token-mean",
  bnpo = "micro-token-mean",
  dr_grpo = "seq-mean-token-sum-norm",
  dapo = "token-mean",
}
M.loss_type_names = { "grpo", "bnpo", "dr_grpo", "dapo" }

-- report_to's entries (TRL's names): what remax writes (remax.run.report), and the services it
-- refuses, by their names in words.
M.report_to_choices = { tensorboard = true, csv = true, none = true, all = true }
M.report_to_services = { wandb = "Weights & Biases", mlflow = "MLflow", comet_ml = "Comet", neptune = "Neptune",
  clearml = "ClearML", dagshub = "DagsHub", dvclive = "DVCLive", swanlab = "SwanLab", trackio = "Trackio",
  azure_ml = "Azure ML", codecarbon = "CodeCarbon", flyte = "Flyte", aim = "Aim" }

-- The error for a report_to entry that is not offered, or nil when it is.
function M.report_to_refusal(name)
  if M.report_to_choices[name] then return nil end
  local service = M.report_to_services[name]
  if service then
    return ("report_to = %s: %s is not supported (the engine has no network dependency); every step's metrics are in "
      .. "runs/<name>/metrics.jsonl, and report_to = tensorboard writes event files TensorBoard reads "
      .. "(a script can forward metrics.jsonl to %s)"):format(name, service, service)
  end
  return ("report_to = %s: expected tensorboard, csv, none or all (a list: --report_to tensorboard,csv)"):format(name)
end

---------------------------------------------------------------------------- across settings

-- The model's config without loading it: config.json of the model folder, or the recipe's
-- model_config, as the engine's rx_model_config (f32 on the cpu: the host memory the check is
-- against); nil when neither can be read or resolved (loading the model then says why).
local function model_config(cfg)
  local c = cfg.model_config
  if not c then
    local dir = cfg.model
    if not dir then dir = (os.getenv("REMAX_HOME") or ".") .. "/models/tiny-gsm8k" end
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
  local ok, rc = pcall(require("remax.bind.model").resolve_config, full, "model_config")
  return ok and rc or nil
end

-- The memory the generation of one micro-batch needs (rows rows of prompts prompts): the
-- engine's own count (rx_generate_memory_bytes, what rx_generate_begin checks), and the KV
-- cache's share; 0, 0 when the model's config cannot be read.
function M.generation_bytes(cfg, rows, prompts)
  local c = model_config(cfg)
  if not c then return 0, 0 end
  return require("remax.bind.generate").memory_bytes(c, rows, prompts or rows, cfg.max_prompt_length,
    cfg.max_completion_length, cfg.repetition_penalty ~= 1)
end

local function gib(b) return ("%.1f GiB"):format(b / 2 ^ 30) end

-- Checks between settings. source(key) says where a key's value came from. Raises on the
-- first problem, naming the settings involved with their sources.
function M.cross_check(cfg, source, opts)
  local function bad(key, msg) error(("%s: %s = %s: %s"):format(source(key), key, show(cfg[key]), msg), 0) end
  local rl = cfg.algo ~= "sft" and cfg.algo ~= "reward"
  if rl and type(cfg.rewards) == "table" and #cfg.rewards == 0 and cfg.environment == nil then   -- an environment rewards
    bad("rewards", ("an RL run needs at least one reward function (algo = %s learns from nothing without one); " ..
      "give a name from rewards/, a file, or a function"):format(cfg.algo))
  end
  if rl and cfg.num_generations < 1 then bad("num_generations", "expected at least 1 completion per prompt for an RL run") end
  if cfg.learning_rate * cfg.weight_decay >= 1 then
    bad("weight_decay", ("with learning_rate = %s (%s) each step would scale the weights by 1 - %s <= 0")
      :format(show(cfg.learning_rate), source("learning_rate"), show(cfg.learning_rate * cfg.weight_decay)))
  end
  -- the rows one generation call holds, against the memory of this machine
  local function setting(k) return ("%s = %s (%s)"):format(k, show(cfg[k]), source(k)) end
  local function first_set(keys)   -- the setting to blame: the first one not left at its default
    for _, k in ipairs(keys) do if source(k) ~= "default" then return k end end
    return keys[1]
  end
  local available = M.available_bytes and M.available_bytes() or require("remax.bind.generate").available_bytes()
  if available and available > 0 and not (opts and opts.memory == false) then
    local greedy = (rl and cfg.generate_greedy) and 1 or 0
    local per_prompt = (rl and cfg.num_generations or 0) + greedy
    local need = M.generation_bytes(cfg, cfg.per_device_train_batch_size * per_prompt, cfg.per_device_train_batch_size)
    if need > available then
      local keys = { "num_generations", "per_device_train_batch_size", "max_completion_length", "max_prompt_length" }
      bad(first_set(keys), ("one step's generation needs at least %s (the KV cache of every row and the activations), but %s of memory is " ..
        "available: %s prompts x (%s%s) rows x (%s + %s) tokens; lower one of them"):format(gib(need), gib(available),
        setting("per_device_train_batch_size"), setting("num_generations"), greedy == 1 and " + 1 greedy" or "",
        setting("max_prompt_length"), setting("max_completion_length")))
    end
    need = M.generation_bytes(cfg, cfg.per_device_eval_batch_size)
    if cfg.eval_size > 0 and need > available then
      local keys = { "per_device_eval_batch_size", "max_completion_length", "max_prompt_length" }
      bad(first_set(keys), ("one evaluation batch's generation needs at least %s, but %s of memory is available: " ..
        "%s rows x (%s + %s) tokens; lower one of them"):format(gib(need), gib(available),
        setting("per_device_eval_batch_size"), setting("max_prompt_length"), setting("max_completion_length")))
    end
  end
end

return M
