-- remax.settings.config: every training setting, declared once with its default, type and meaning;
-- merging a recipe's table with `--key value` command-line overrides; `--help`.
--
--   local cfg, fns = config.resolve(recipe_table, {"--learning_rate", "3e-5"}, {where = "recipes/x.lua"})
--   print(config.help(cfg))
--
-- Names follow TRL's where the meaning is the same.
local schema = require("remax.settings.schema")

local M = {}

-- {name, default, type, meaning}. Types: number, integer, boolean, string, numbers (a list,
-- "1,0.5" on the command line), strings, enum:a|b|c, data (a file, or in a recipe a function),
-- and recipe-only kinds: rewards (a list of
-- reward names, files, tables or functions), template (a name or a function), advantage (a name
-- or a function), table, function. hot = true: a recipe reload may change it during a run.
M.groups = {
  { "Model and data", {
    { "model", nil, "string", "model folder (Hugging Face layout); default: models/tiny-gsm8k, the built-in base model" },
    { "model_config", nil, "table", "recipe only: Hugging Face config table of a fresh random model, used when no model is given (with the byte-level tokenizer)" },
    { "dtype", "auto", "enum:auto|f32|bf16", "compute dtype of the trained model: bf16 is mixed precision (f32 master weights, gradients, AdamW moments, loss and statistics; a bf16 working copy of the weights for the GEMMs, f32 sums; on the cpu f32 activations, on cuda bf16 ones); auto = bf16 on a cpu whose bf16 GEMMs outrun f32 ones (AMX, or AMD with AVX-512 BF16, with oneDNN built in: `remax version` says), else f32; the resolved dtype is printed when a run starts and written to its config.json",
      unavailable = { f16 = "f16 compute is not supported; compute in f32 or bf16",
        f64 = "f64 is for the engine's gradient checks, not training; use f32" } },
    { "device", "cpu", "enum:cpu|cuda", "where the model trains: cpu, or cuda (an NVIDIA GPU; needs remax built with CUDA): weights, gradients, optimizer state, the KL reference and the rollouts' KV cache live there, and generation runs there too" },
    { "frozen_dtype", "auto", "enum:auto|f32|bf16", "storage of the weights of frozen copies: the KL reference model, the base under LoRA adapters, the model of remax eval; on the cpu bf16 halves their memory (compute stays f32), auto = bf16 when the checkpoint stores its weight matrices in bf16 (nothing lost), else f32; on cuda the KL reference of a dtype = bf16 run is a frozen bf16 model (bf16 weights alone, no f32 masters) unless f32, and bf16 makes an f32 run's reference one too (it then computes in bf16)" },
    { "data", nil, "data", "training data: a JSONL or JSON-array file, or in a recipe a function(split, n, cfg) -> rows that makes train_size rows of split \"train\" (and eval_size of \"test\"), such as remax.tasks.gsm8k.synthetic()" },
    { "eval_data", nil, "data", "held-out data, a file or a function as data; default: a data function's \"test\" split (none when data is a file)" },
    { "prompt_column", nil, "string", "dataset column holding the prompt (default: prompt, else question)" },
    { "answer_column", nil, "string", "dataset column holding the reference answer (default: answer when present)" },
    { "train_size", 20000, "integer", "rows a data function makes for training (a file's rows are all used)" },
    { "eval_size", 200, "integer", "number of held-out problems used for evaluation (0: no evaluation)" },
    { "map_row", nil, "function", "recipe only: function(row) -> row applied to every dataset row (e.g. turn a question into chat messages)" },
    { "chat_template", "auto", "template", "prompt rendering: auto (the tokenizer's template, else qa), tokenizer (its chat_template, run as written), qa (\"Question: ...\\nAnswer: \"), chatml, llama3, plain, or a recipe function(messages, opts) -> string" },
    { "enable_thinking", nil, "boolean", "chat template variable enable_thinking (Qwen3: false renders an empty <think> block; unset: the template's default)" },
    { "chat_template_kwargs", nil, "table", "recipe only: extra variables for the tokenizer's chat template, e.g. { date_string = \"26 Jul 2024\" }" },
    { "stop", nil, "strings", "extra stop tokens (as written in tokenizer.json) besides EOS, <|im_end|>, <|endoftext|>, <|eot_id|>" },
    { "stop_strings", nil, "strings", "text that ends a completion where it appears in the completion's decoded text (vLLM's stop; any number of tokens): the tokens up to the one that completes it are kept, and the reward sees their text, as TRL with vLLM" },
  } },
  { "Episodes", {   -- multi-turn rollouts: tools and environments (docs/environments.md)
    { "tools", nil, "table", "recipe only: tools the model may call, name -> { description =, parameters = JSON schema, fn = function(args) -> result, or \"py:FILE.py:FUNCTION\" (schema from its signature and docstring), \"cmd:PROGRAM\", \"http://HOST:PORT/PATH\" (run while the other rows decode) }; listed through the chat template's tools variable; a turn with tool calls gets their results and the episode goes on" },
    { "environment", nil, "environment", "recipe only: { reset = function(sample, state) -> messages, step = function(state, assistant_text) -> messages, done, reward }, or a function(sample) -> one (a factory), or \"py:FILE.py:CLASS\" / \"cmd:PROGRAM\" / \"http://HOST:PORT/PATH\" (reset/step requests per episode id); per-turn rewards are summed into the reward \"environment\"" },
    { "max_turns", 4, "integer", "an episode ends after this many assistant turns (the tool calls of the last one are not run)" },
    { "max_tool_calling_iterations", nil, "integer", "TRL's name for the rounds of tool calls in an episode: N sets max_turns = N + 1 (each round of tool results is followed by another assistant turn); TRL has no limit by default, remax's max_turns = 4 allows 3 rounds", alias_of = "max_turns" },
    { "max_episode_length", nil, "integer", "an episode ends when the prompt, its turns and the next observation would reach this many tokens (the observation is not appended; episodes/truncated counts it); default and upper bound: the model's max_position_embeddings. The KV cache holds this many tokens per row, so a long-context model may want less. max_completion_length bounds the model's tokens over all turns" },
    { "strict_episodes", false, "boolean", "stop the run (keeping the last finished step's checkpoint) when more than half of a step's episodes fail (a tool or the environment failed, a malformed call); false: the progress line says so and names the most frequent error" },
    { "tool_timeout", 10, "number", "seconds one tool call (or an environment's reset or step, or a recipe's tool-call parser) may take before the episode gets a timeout error as its result (0: no limit; Ctrl-C and SIGTERM still stop a Lua one)" },
    { "tool_call_format", nil, "call_format", "how tool calls are written: qwen (<tool_call>{json}</tool_call>), llama3 (JSON or <|python_tag|>), or in a recipe a function(text) -> calls; default: from the chat template" },
  } },
  { "Algorithm", {
    { "algo", "remax", "enum:remax|grpo|rloo|reinforce|sft|reward", "remax, grpo, rloo, reinforce (RL with that advantage estimator), sft (cross-entropy on prompt -> answer), or reward (a reward model from preference pairs: Bradley-Terry, as TRL's RewardTrainer)" },
    { "advantage", nil, "advantage", "recipe only: function(groups, opts, state) -> advantages, overriding algo's estimator", hot = true },
    { "num_generations", 4, "integer", "sampled completions per prompt (the greedy baseline row comes on top)" },
    { "generate_greedy", nil, "boolean", "also generate one greedy completion per prompt: the baseline of remax (default true there and with a recipe advantage function); under grpo, rloo and reinforce it only adds reward_greedy and costs a row per prompt (default false)" },
    { "advantage_clip", 0, "number", "clip advantages to [-c, c] (0: no clipping)", hot = true },
    { "gamma", nil, "number", "a discounted per-token return after the original ReMax: the KL becomes a per-token penalty and token t of a T-token completion gets return_t = -beta * kl_t + gamma^(T-t) * (r - r_greedy) (the original discounts once more, gamma^(T-t+1): docs/trainer.md; nil: off, the sequence-level advantage of remax)" },
    { "scale_rewards", "group", "enum:group|batch|none", "grpo: divide by the group's standard deviation, the whole batch's, or not at all (true = group, false = none, as in TRL)", hot = true, aliases = { [true] = "group", [false] = "none", ["true"] = "group", ["false"] = "none" } },
    { "multi_objective_aggregation", "sum_then_normalize", "enum:sum_then_normalize|normalize_then_sum", "grpo with several rewards: weighted sum then the group normalisation, or each reward normalised in its group, summed, then normalised over the batch (TRL's GDPO)", hot = true },
    { "reinforce_baseline", "mean", "enum:none|mean", "reinforce: no baseline, or a running mean of rewards" },
    { "baseline_momentum", 0.9, "number", "reinforce: momentum of the running mean", hot = true },
    { "beta", 0.0, "number", "KL coefficient to the frozen reference model (0: no reference model is loaded)", hot = true },
    { "kl_estimator", "k3", "enum:k3|k1", "k3: per-token KL estimate in the loss; k1: log-ratio folded into the reward" },
    { "loss_agg_mode", "seq-mean-token-mean", "enum:seq-mean-token-mean|token-mean|seq-mean-token-sum|seq-mean-token-sum-norm", "how token losses are averaged (seq-mean-token-sum-norm: sum over tokens / max_completion_length, mean over rows)" },
    { "loss_type", nil, "enum:grpo|bnpo|dr_grpo|dapo", "TRL's loss types, each with TRL's normalisation (overrides loss_agg_mode; see docs/trainer.md)" },
    { "num_iterations", 1, "integer", "optimizer updates per rollout (TRL's mu); above 1 the ratio pi/pi_old is clipped to [1 - epsilon, 1 + epsilon_high]" },
    { "epsilon", 0.2, "number", "lower clipping range of the importance ratio (1 - epsilon)", hot = true },
    { "epsilon_high", nil, "number", "upper clipping range (1 + epsilon_high; default: epsilon)", hot = true },
    { "delta", nil, "number", "two-sided clipping: cap the unclipped ratio at delta (> 1 + epsilon_high; default: none)", hot = true },
    { "importance_sampling_level", "token", "enum:token|sequence", "token: one ratio per token (PPO); sequence: one ratio per row, exp of the mean log-ratio (GSPO)" },
    { "mask_truncated_completions", false, "boolean", "rows that hit max_completion_length get no loss (they still count in the advantages)", hot = true },
    { "top_entropy_quantile", 1.0, "number", "train only the tokens whose entropy is in this top fraction of each micro-batch (1: all)", hot = true },
    { "entropy_coef", 0.0, "number", "entropy bonus: the loss subtracts entropy_coef * the mean per-token entropy (TRL's normalisation)", hot = true },
    { "skip_zero_advantage", true, "boolean", "with beta = 0, rows whose advantage is 0 skip the forward/backward (no gradient anyway)" },
  } },
  { "Reward model", {
    { "chosen_column", "chosen", "string", "algo = reward: the preferred side of a pair (text or messages)" },
    { "rejected_column", "rejected", "string", "algo = reward: the other side" },
    { "margin_column", "margin", "string", "algo = reward: the optional per-pair margin (a number) of the loss -log sigmoid(r_chosen - r_rejected - margin)" },
    { "center_rewards_coefficient", nil, "number", "algo = reward: adds coefficient * mean((r_chosen + r_rejected)^2) to the loss, keeping scores centred at 0 (TRL's; nil: off)" },
  } },
  { "LoRA", {
    { "use_lora", false, "boolean", "train low-rank adapters (PEFT's LoRA) on a frozen base; the reference model (beta > 0) is the base with adapters off" },
    { "lora_r", 16, "integer", "LoRA rank r" },
    { "lora_alpha", 32, "number", "LoRA alpha: adapters scale by lora_alpha / lora_r" },
    { "lora_dropout", 0.05, "number", "dropout on the adapters' input in training forwards" },
    { "lora_target_modules", { "q_proj", "v_proj" }, "strings", "linear layers that get adapters: q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj, or all-linear" },
    { "save_merged", nil, "string", "with use_lora: also write the final model with adapters merged (a full Hugging Face model) to this folder" },
  } },
  { "Rewards", {
    { "rewards", { "gsm8k" }, "rewards", "reward functions: names of rewards/*.lua files, paths, py:FILE.py (a Python function), cmd:PROGRAM, http://HOST:PORT/PATH (a reward server), model:DIR (a reward model), or (in a recipe) tables {name=, fn=} and functions" },
    { "reward_weights", nil, "numbers", "weight of each reward function (default: all 1)", hot = true },
    { "hot_reload", true, "boolean", "between steps, reload a changed reward file or recipe" },
    { "reward_timeout", nil, "number", "seconds one reward function may take on one batch before the run stops, naming it (the last checkpoint is kept; 0: no limit; a blocking C call is only caught when it returns); default: 60, or 4 times the step's generation time when longer", hot = true },
    { "reward_max_line_bytes", 4194304, "integer", "most bytes of one answer of a py:, cmd: or http:// reward, tool or environment (a line, or a body), counted before it is kept; a longer one fails that call naming this limit (for a reward: stops the run)" },
  } },
  { "Generation", {
    { "max_prompt_length", 512, "integer", "prompts longer than this keep their last tokens" },
    { "max_completion_length", 256, "integer", "most tokens generated per completion" },
    { "temperature", 1.0, "number", "sampling temperature of the sampled rows", hot = true },
    { "top_p", 1.0, "number", "nucleus sampling threshold", hot = true },
    { "top_k", 0, "integer", "sample among the k most likely tokens (0: all)", hot = true },
    { "min_p", 0.0, "number", "drop tokens less likely than min_p times the most likely one, after top_k and top_p (0: off)", hot = true },
    { "repetition_penalty", 1.0, "number", "CTRL's penalty on the tokens of a row's prompt and completion so far, before temperature (positive logits divided by it, negative ones multiplied; greedy rows too; 1: off)", hot = true },
  } },
  { "Optimisation", {
    { "learning_rate", 1e-5, "number", "peak learning rate of AdamW", hot = true },
    { "lr_scheduler_type", "constant", "enum:constant|linear|cosine", "learning-rate schedule after warmup" },
    { "warmup_ratio", 0.0, "number", "fraction of max_steps spent warming up linearly" },
    { "weight_decay", 0.0, "number", "AdamW weight decay (not on biases and norms)" },
    { "adam_beta1", 0.9, "number", "AdamW beta1" },
    { "adam_beta2", 0.999, "number", "AdamW beta2" },
    { "adam_epsilon", 1e-8, "number", "AdamW epsilon" },
    { "max_grad_norm", 1.0, "number", "clip the global gradient norm to this (0: no clipping)", hot = true },
    { "per_device_train_batch_size", 8, "integer", "prompts per micro-batch (each brings num_generations rows)" },
    { "gradient_accumulation_steps", 1, "integer", "micro-batches per optimizer step; prompts per step = this * per_device_train_batch_size" },
    { "gradient_checkpointing", false, "boolean", "recompute activations in the backward pass (less memory)" },
    { "padding_free", true, "boolean", "train on packed rows: each micro-batch's rows end to end, attention within each row, no padding (verl's use_remove_padding); false pads every row to the micro-batch's longest (docs/trainer.md, Padding-free training)" },
    { "max_tokens_per_microbatch", nil, "integer", "with padding_free: a micro-batch's rows are split into packs of at most this many tokens (prompt + completion), balanced, one forward and backward each, so activation memory is set by this budget (verl's ppo_max_token_len_per_gpu); unset: one pack per micro-batch; a row longer than it is refused" },
    { "zero_stage", 0, "integer", "with several ranks (mpirun/srun): 1 shards AdamW's moments and the master weights over the ranks (ZeRO-1), 2 also reduce-scatters the gradients (ZeRO-2); 0: every rank holds everything (docs/distributed.md)" },
    { "dist_timeout", 1800, "number", "with several ranks: seconds a collective waits for the other ranks before every rank that waits stops, naming the ranks that did not come and the step (NCCL's collectives too); 1800 is torch.distributed's 30 minutes (docs/distributed.md)" },
    { "max_steps", 100, "integer", "optimizer steps to train" },
    { "num_train_epochs", nil, "number", "passes over the training data: without max_steps, max_steps = ceil(epochs * rows / prompts per step) (with both, max_steps wins, as in TRL)" },
    { "max_time", 0, "number", "also stop after the step that brings the training time (evaluation excluded) past this many seconds (0: no limit)", hot = true },
    { "max_bad_steps", 5, "integer", "stop after this many steps with a non-finite loss or gradient (each is skipped)" },
  } },
  { "Run", {
    { "seed", 42, "integer", "seed of data order, synthetic data and sampling (seeds derive from (seed, step))" },
    { "output_dir", "runs", "string", "folder holding runs" },
    { "run_name", nil, "string", "the run's folder name under output_dir (default: the recipe's name and the start time, e.g. gsm8k-20260101-120000)" },
    { "resume", nil, "string", "continue runs/<name> from its last checkpoint, with the run's own config.json (settings given again on the command line change it; see docs/runs.md)" },
    { "overwrite_output_dir", false, "boolean", "start afresh in a run folder (--run_name) that already holds a run, removing its metrics, checkpoints and charts" },
    { "report_to", { "none" }, "strings", "where metrics go besides metrics.jsonl (always written): tensorboard (event files in runs/<name>/tensorboard/), csv (runs/<name>/metrics.csv), all (both), none; wandb and other services are refused (no network dependency in the engine)" },
    { "logging_steps", 1, "integer", "print a log line every this many steps (metrics are written every step)" },
    { "log_completions", 10, "integer", "write completions.jsonl every this many steps (0: never)" },
    { "eval_steps", 50, "integer", "evaluate every this many steps (0: only before and after training)" },
    { "eval_on_start", true, "boolean", "evaluate before the first step" },
    { "per_device_eval_batch_size", 64, "integer", "prompts per generation call during evaluation" },
    { "save_steps", 100, "integer", "save a checkpoint every this many steps (and at the end; 0: only at the end)" },
    { "save_total_limit", 2, "integer", "keep this many newest checkpoints" },
    { "save_final_model", nil, "string", "also write the final model (Hugging Face layout) to this folder" },
    { "loop", nil, "function", "recipe only: function(trainer) that drives the steps itself (rollout, score, advantage, update)" },
  } },
  { "Engine", {
    { "bf16_gemm", "auto", "enum:auto|onednn|sgemm", "the cpu's bf16 training GEMMs: auto (oneDNN where it outruns sgemm: AMX, or AMD with AVX-512 BF16), onednn, or sgemm on widened bf16 weights (REMAX_BF16_GEMM overrides; `remax version` says what runs)" },
    { "bf16_dot", true, "boolean", "the AVX-512 BF16 decode kernel for bf16 weights where the cpu has it (false widens them to f32; REMAX_NO_BF16_DOT=1 overrides)" },
    { "cuda_graphs", true, "boolean", "cuda: decode steps replayed as CUDA graphs (REMAX_CUDA_GRAPHS=0 overrides)" },
    { "host_sampler", false, "boolean", "cuda: sample each row's next token on the host instead of the device (REMAX_HOST_SAMPLER=1 overrides)" },
    { "cuda_alloc", "caching", "enum:caching|plain", "cuda: the caching device allocator, or one cudaMalloc per tensor (plain: for memory checkers); fixed at the first device allocation (REMAX_CUDA_ALLOC overrides)" },
    { "cuda_sync", false, "boolean", "cuda: synchronise after every kernel so a fault is reported by the op that made it (slow; REMAX_CUDA_SYNC=1 overrides)" },
    { "threads_adapt", true, "boolean", "cpu: before each decode step and forward/backward, use only the cores other busy processes leave (between 1 and OMP_NUM_THREADS or every core; REMAX_THREADS_ADAPT=0 overrides)" },
  } },
}

M.keys, M.order = {}, {}
for _, group in ipairs(M.groups) do
  for _, d in ipairs(group[2]) do
    local decl = { name = d[1], default = d[2], type = d[3], help = d[4], hot = d.hot, group = group[1],
      unavailable = d.unavailable, aliases = d.aliases, alias_of = d.alias_of }
    if decl.type:match("^enum:") then
      decl.choices = {}
      for c in decl.type:sub(6):gmatch("[^|]+") do decl.choices[#decl.choices + 1] = c end
    end
    M.keys[decl.name] = decl
    M.order[#M.order + 1] = decl.name
  end
end

---------------------------------------------------------------------------- suggestions

function M.edit_distance(a, b)
  local prev = {}
  for j = 0, #b do prev[j] = j end
  for i = 1, #a do
    local cur = { [0] = i }
    for j = 1, #b do
      local cost = a:sub(i, i) == b:sub(j, j) and 0 or 1
      cur[j] = math.min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + cost)
    end
    prev = cur
  end
  return prev[#b]
end

function M.closest(name)
  local best, bd = nil, math.huge
  for _, k in ipairs(M.order) do
    local d = M.edit_distance(name, k)
    -- a key that contains the typed name (or the reverse) is a better guess than its distance says
    if k:find(name, 1, true) or name:find(k, 1, true) then d = math.min(d, math.abs(#k - #name) * 0.5) end
    if d < bd then best, bd = k, d end
  end
  return best
end

-- Settings of TRL's GRPOConfig / transformers' TrainingArguments that remax does not have, with
-- the reason and what to use instead (a TRL user brings them; "did you mean" would mislead).
M.not_supported = {
  use_peft = "remax's name is use_lora (--use_lora true; lora_r, lora_alpha, lora_dropout and lora_target_modules as in PEFT's LoraConfig)",
  peft_config = "give the LoRA settings as keys: use_lora = true, lora_r, lora_alpha, lora_dropout, lora_target_modules",
  use_vllm = "remax generates with its own engine (batched decode with a KV cache); there is no vLLM",
  bf16 = "use --dtype bf16 (bf16 mixed precision; the default, auto, picks it where the CPU's bf16 GEMMs pay)",
  fp16 = "f16 compute is not supported; use --dtype bf16 (or f32)",
  tf32 = "a CUDA matmul setting; the CPU trains in f32 or bf16 (--dtype)",
  logging_dir = "TensorBoard event files go to runs/<name>/tensorboard/ (--report_to tensorboard)",
  push_to_hub = "the engine has no network code: upload runs/<name>/checkpoints/step-N with `hf upload`",
  hub_model_id = "the engine has no network code: upload runs/<name>/checkpoints/step-N with `hf upload`",
  deepspeed = "data parallel runs under mpirun (docs/distributed.md); ZeRO and DeepSpeed configs are not read",
  fsdp = "data parallel runs under mpirun (docs/distributed.md); FSDP is not supported",
  steps_per_generation = "one rollout per step: each step generates its own prompts' completions",
  generation_batch_size = "one rollout per step: the step's prompts are generated in one call",
  sync_ref_model = "the reference model stays the starting model",
  ref_model_mixup_alpha = "the reference model stays the starting model",
  ref_model_sync_steps = "the reference model stays the starting model",
  resume_from_checkpoint = "use --resume runs/<name>: it continues from the run's newest checkpoint with its own settings",
  eval_strategy = "remax counts steps: eval_steps (0: only before and after training)",
  evaluation_strategy = "remax counts steps: eval_steps (0: only before and after training)",
  save_strategy = "remax counts steps: save_steps (0: only at the end)",
  logging_strategy = "remax counts steps: logging_steps",
  optim = "the optimizer is AdamW (adam_beta1, adam_beta2, adam_epsilon, weight_decay)",
  warmup_steps = "give warmup_ratio (a fraction of max_steps)",
  generation_kwargs = "the sampler's settings are their own keys: temperature, top_p, top_k, min_p, repetition_penalty (and stop)",
  remove_unused_columns = "every dataset column reaches the rewards already (TRL's False)",
  shuffle_dataset = "the training data is always shuffled (seeded by seed, resumable)",
  data_seed = "seed drives the data order",
  model_init_kwargs = "the model loads as its folder says; --dtype and --frozen_dtype choose the storage",
  disable_dropout = "remax's models have no dropout (only LoRA's lora_dropout)",
  num_completions_to_print = "completions go to runs/<name>/completions.jsonl every log_completions steps",
  torch_compile = "not applicable: no PyTorch",
  use_liger_kernel = "not applicable: no PyTorch",
  use_liger_loss = "not applicable: no PyTorch",
  dataloader_num_workers = "not applicable: the data is read once, in the trainer",
  gradient_checkpointing_kwargs = "gradient_checkpointing takes no options",
}

local function unknown(name, where)
  local prefix = where and (where .. ": ") or ""
  local why = M.not_supported[name] or (name:match("^vllm_") and M.not_supported.use_vllm)
  if why then return ("%s%s is not a remax setting: %s"):format(prefix, name, why) end
  -- a suggestion only when it is close: an unrelated key would mislead
  local guess = M.closest(name)
  if guess and M.edit_distance(name, guess) <= math.max(2, math.floor(#name / 3)) then
    return ("%sunknown setting '%s'; did you mean '%s'? (remax run RECIPE.lua --help lists every setting)")
      :format(prefix, name, guess)
  end
  return ("%sunknown setting '%s' (remax run RECIPE.lua --help lists every setting)"):format(prefix, name)
end

---------------------------------------------------------------------------- values

local function show(v)
  if v == nil then return "nil" end
  if type(v) == "string" then return v end
  if type(v) == "function" then
    local info = debug.getinfo(v, "S")
    return ("function (%s:%d)"):format(info.short_src, info.linedefined)
  end
  if type(v) == "table" then
    if #v > 0 then
      local parts = {}
      for i, x in ipairs(v) do
        parts[i] = type(x) == "table" and (x.name or (x.model and ("model:" .. tostring(x.model))) or "table") or show(x)
      end
      return table.concat(parts, ",")
    end
    return next(v) == nil and "{}" or "table"
  end
  return tostring(v)
end
M.show = show

-- Check a value of a key (from a recipe or after parsing); returns the value or raises.
local function check(decl, v, where)
  if v == nil then return nil end
  if decl.aliases and decl.aliases[v] ~= nil then v = decl.aliases[v] end
  local t = decl.type
  local function bad(expected)
    error(("%s%s = %s: expected %s"):format(where and (where .. ": ") or "", decl.name,
      type(v) == "string" and ("'" .. v .. "'") or show(v), expected), 0)
  end
  if t == "number" then
    if type(v) ~= "number" or v ~= v then bad("a number") end
  elseif t == "integer" then
    if type(v) ~= "number" or v ~= math.floor(v) then bad("an integer") end
    if v < 0 then bad("an integer >= 0") end
  elseif t == "boolean" then
    if type(v) ~= "boolean" then bad("true or false") end
  elseif t == "string" then
    if type(v) ~= "string" then bad("a string") end
  elseif t == "numbers" then
    if type(v) == "number" then v = { v } end
    if type(v) ~= "table" then bad("a list of numbers") end
    for _, x in ipairs(v) do if type(x) ~= "number" then bad("a list of numbers") end end
  elseif t == "strings" then
    if type(v) == "string" then v = { v } end
    if type(v) ~= "table" then bad("a list of strings") end
    for _, x in ipairs(v) do if type(x) ~= "string" then bad("a list of strings") end end
  elseif decl.choices then
    if decl.unavailable and decl.unavailable[v] then
      error(("%s%s = '%s' is not available: %s"):format(where and (where .. ": ") or "", decl.name, tostring(v),
        decl.unavailable[v]), 0)
    end
    local ok = false
    for _, c in ipairs(decl.choices) do if v == c then ok = true end end
    if not ok then bad("one of " .. table.concat(decl.choices, ", ")) end
  elseif t == "rewards" then
    if type(v) == "string" or type(v) == "function" or (type(v) == "table" and (v.fn or v.model or v.worker)) then v = { v } end
    if type(v) ~= "table" then bad("a list of reward names, files, tables {name=, fn=}, reward models {model=} or functions") end
    for _, x in ipairs(v) do
      local tx = type(x)
      if not (tx == "string" or tx == "function" or (tx == "table" and (type(x.fn) == "function" or type(x.model) == "string" or type(x.worker) == "string"))) then
        bad("a list of reward names, files, tables {name=, fn=}, reward models {model=} or functions")
      end
    end
  elseif t == "data" then
    if type(v) ~= "string" and type(v) ~= "function" then bad("a file path, or (in a recipe) a function(split, n, cfg) -> rows") end
  elseif t == "template" then
    local names = "auto, tokenizer, qa, chatml, llama3, plain"
    if type(v) ~= "string" and type(v) ~= "function" then
      bad(("a template name (%s: a string) or (in a recipe) a function(messages, opts) -> string; got a %s"):format(names, type(v)))
    end
    if type(v) == "string" and not ({ auto = 1, tokenizer = 1, qa = 1, chatml = 1, llama3 = 1, plain = 1 })[v] then
      bad(("%s or a function(messages, opts)%s"):format(names, v:find("{[{%%]") and
        "; a Jinja template is the tokenizer's: put it in chat_template.jinja beside tokenizer.json and use chat_template = tokenizer" or ""))
    end
  elseif t == "environment" then
    if type(v) ~= "table" and type(v) ~= "function" and not (type(v) == "string" and (v:match("^py:") or v:match("^cmd:") or v:match("^https?://"))) then
      bad("a table {reset=, step=}, a function(sample) -> one, py:FILE.py:CLASS, cmd:PROGRAM or http://HOST:PORT/PATH")
    end
  elseif t == "call_format" then
    if type(v) ~= "function" and v ~= "qwen" and v ~= "llama3" then bad("qwen, llama3 or a function(text) -> calls") end
  elseif t == "advantage" then
    if type(v) ~= "function" then bad("a function(groups, opts, state) -> advantages (use algo for a name)") end
  elseif t == "table" then
    if type(v) ~= "table" then bad("a table") end
  elseif t == "function" then
    if type(v) ~= "function" then bad("a function") end
  end
  return v
end

local RECIPE_ONLY = { table = true, ["function"] = true, advantage = true, environment = true }

-- Parse a command-line string into the key's type.
function M.parse(decl, s)
  local t = decl.type
  local function bad(expected)
    error(("--%s %s: expected %s"):format(decl.name, s == nil and "(no value)" or ("'" .. s .. "'"), expected), 0)
  end
  if RECIPE_ONLY[t] then
    error(("--%s: %s can only be set in the recipe"):format(decl.name, decl.name), 0)
  end
  if s == nil then bad("a value") end
  if t == "number" or t == "integer" then
    local v = tonumber(s)
    if not v or v ~= v then bad(t == "number" and "a number" or "an integer") end
    if t == "integer" and (v ~= math.floor(v) or v < 0) then bad("an integer >= 0") end
    return v
  elseif t == "boolean" then
    local l = s:lower()
    if l == "true" or l == "1" or l == "yes" then return true end
    if l == "false" or l == "0" or l == "no" then return false end
    bad("true or false")
  elseif t == "numbers" then
    local out = {}
    for part in (s .. ","):gmatch("([^,]*),") do
      local v = tonumber(part)
      if not v then bad("a comma-separated list of numbers (e.g. 1,0.5)") end
      out[#out + 1] = v
    end
    return out
  elseif t == "strings" or t == "rewards" then
    local out = {}
    for part in s:gmatch("[^,]+") do out[#out + 1] = part end
    if #out == 0 then bad("a comma-separated list") end
    return out
  end
  return check(decl, s, "command line")
end

-- Command-line arguments -> {key = value}, in order. `--key value`, `--key=value`, and a bare
-- `--flag` for booleans. Returns overrides, help_requested.
function M.parse_args(argv)
  local out, help, i = {}, false, 1
  while i <= #argv do
    local a = argv[i]
    if a == "--help" or a == "-h" then
      help = true
      i = i + 1
    else
      local key, value = a:match("^%-%-([%w_%-]+)=(.*)$")
      if not key then key = a:match("^%-%-([%w_%-]+)$") end
      if not key then
        error(("unexpected argument '%s' (settings are given as --key value)"):format(a), 0)
      end
      key = key:gsub("%-", "_")   -- --max-steps is --max_steps
      local decl = M.keys[key]
      if not decl then error(unknown(key, "command line"), 0) end
      if value == nil then
        local nxt = argv[i + 1]
        if decl.type == "boolean" and (nxt == nil or nxt:match("^%-%-")) then
          value = "true"
          i = i + 1
        else
          value = nxt
          i = i + 2
        end
      else
        i = i + 1
      end
      out[key] = M.parse(decl, value)
    end
  end
  return out, help
end

-- recipe table + overrides -> resolved config (a table with every key; defaults filled in).
-- Recipe keys that are not settings stop with the closest valid name. opts.where names the recipe;
-- opts.running: a hot reload of a running run (its memory is already in use: not checked again).
-- Every value is checked here once, before anything is loaded: its type (check), then what
-- remax.settings.schema says it may be, then the checks across settings. A refusal names the
-- setting, the value and its source: "recipes/x.lua:7", "command line" or "default".
function M.resolve(recipe, overrides, opts)
  opts = opts or {}
  recipe = recipe or {}
  local cfg, sources = {}, {}
  local where = opts.where or "recipe"
  schema.forget_recipes()
  local function recipe_source(k)
    local line = schema.recipe_line(opts.where, k)
    return line and (where .. ":" .. line) or where
  end
  local function take(k, v, source)
    local decl = M.keys[k]
    if not decl then error(unknown(k, source), 0) end
    v = check(decl, v, source)
    local problem = schema.value_problem(decl, v)
    if problem then error(schema.refusal(source, k, v, problem), 0) end
    cfg[k], sources[k] = v, source
  end
  for k, v in pairs(recipe) do
    if type(k) ~= "string" then
      error(("%s: the recipe table has a non-string key %s; settings are name = value"):format(where, tostring(k)), 0)
    end
    take(k, v, recipe_source(k))
  end
  for k, v in pairs(overrides or {}) do take(k, v, "command line") end
  M.apply_aliases(cfg, sources)
  for _, k in ipairs(M.order) do
    if cfg[k] == nil and M.keys[k].default ~= nil then
      sources[k] = "default"
      local d = M.keys[k].default
      if type(d) == "table" then
        local c = {}
        for i, x in ipairs(d) do c[i] = x end
        d = c
      end
      cfg[k] = d
    end
  end
  -- only ReMax (and a recipe's own estimator, which may read it) needs the greedy row
  if cfg.generate_greedy == nil then
    cfg.generate_greedy = cfg.algo == "remax" or cfg.advantage ~= nil
    sources.generate_greedy = sources.generate_greedy or "default"
  end
  M.sources[cfg] = sources
  schema.cross_check(cfg, function(k) return M.source(cfg, k) end, { memory = not opts.running })
  M.validate(cfg)
  M.derive(cfg)
  local given = {}
  for k in pairs(recipe) do given[k] = true end
  for k in pairs(overrides or {}) do given[k] = true end
  -- num_train_epochs without max_steps: the trainer sets max_steps once it knows the data's size
  cfg.steps_from_epochs = cfg.num_train_epochs ~= nil and not given.max_steps
  cfg.inert_notes = require("remax.settings.inert").check(cfg, given, M.keys, M.show)   -- printed once when a run starts
  for _, note in ipairs(require("remax.settings.inert").trl_notes(cfg, given, overrides)) do   -- TRL values that mean otherwise here
    cfg.inert_notes[#cfg.inert_notes + 1] = note
  end
  return cfg
end

-- Settings known under another project's name (alias_of): their value goes to the setting they
-- name, translated (TRL's max_tool_calling_iterations counts rounds of tool calls: N of them are
-- N + 1 assistant turns), and the alias itself is left unset. Both given, disagreeing: refused.
M.alias_value = { max_tool_calling_iterations = function(n) return n + 1 end }
function M.apply_aliases(cfg, sources)
  for _, name in ipairs(M.order) do
    local decl = M.keys[name]
    if decl.alias_of and cfg[name] ~= nil then
      local target = decl.alias_of
      local v = (M.alias_value[name] or function(x) return x end)(cfg[name])
      if cfg[target] ~= nil and cfg[target] ~= v then
        error(("%s: %s = %s means %s = %s, but %s sets %s = %s; give one of them"):format(sources[name], name,
          show(cfg[name]), target, show(v), sources[target], target, show(cfg[target])), 0)
      end
      local problem = schema.value_problem(M.keys[target], v)
      if problem then error(schema.refusal(sources[name], name, cfg[name], ("a value that makes %s %s"):format(target, problem)), 0) end
      cfg[target], sources[target] = v, sources[name]
      cfg[name], sources[name] = nil, nil
    end
  end
end

-- Settings derived from the others, decided here once (and again by M.derive when a hot reload
-- changes a setting they depend on). The trainer reads these and never re-tests their inputs:
--   kl_mode          "none" (beta = 0, or sft), "k3" (a per-token KL estimate in the loss), "k1"
--                    (the log-ratio folded into the reward) or "return" (gamma set: the per-token
--                    log-ratio in each token's return)
--   needs_reference  whether the frozen reference model is loaded (kl_mode ~= "none")
--   sampling         the generation plan of a step (remax.bind.generate.plan): num_generations
--                    sampled rows at temperature, plus the greedy row with generate_greedy
--   aggregation      how token losses are averaged: loss_type's (TRL's names), else loss_agg_mode
--   dtype_reason     how dtype = auto was resolved (dtype itself then holds bf16 or f32, so that
--                    config.json records what the run computes in and a resume keeps it)
--   skip_zero_rows   rows whose advantage is 0 skip the forward and backward: only when the
--                    advantage is all that reaches the loss (no KL, entropy mask or bonus) and
--                    skip_zero_advantage is on
-- They are fields of cfg outside M.order: config.json and --help show the settings, not these.
function M.derive(cfg)
  local rl = cfg.algo ~= "sft" and cfg.algo ~= "reward"
  -- gamma (the original ReMax's return): the KL is a per-token term of the return (algos.gamma_returns)
  cfg.kl_mode = (rl and cfg.beta > 0) and (cfg.gamma ~= nil and "return" or cfg.kl_estimator) or "none"
  cfg.needs_reference = cfg.kl_mode ~= "none"
  cfg.sampling = require("remax.bind.generate").plan(cfg.num_generations, cfg.generate_greedy, cfg.temperature)
  cfg.aggregation = cfg.loss_type and schema.loss_types[cfg.loss_type] or cfg.loss_agg_mode
  cfg.skip_zero_rows = rl and cfg.beta == 0 and cfg.skip_zero_advantage and cfg.top_entropy_quantile >= 1
    and cfg.entropy_coef == 0
  if cfg.dtype == "auto" then cfg.dtype, cfg.dtype_reason = M.auto_dtype(cfg.device, cfg.bf16_gemm) end
  M.check_device(cfg.device, M.source(cfg, "device"), cfg)
  return cfg
end

-- dtype = auto: bf16 on a cpu whose bf16 GEMMs are expected to outrun f32 ones (the engine's
-- rx_bf16_train_pays: AMX, or AMD's AVX-512 BF16, through oneDNN), else f32; on cuda f32 (bf16
-- there is asked for by name). Returns the dtype and the reason, in words.
function M.auto_dtype(device, bf16_gemm)
  if device == "cuda" then return "f32", "auto: f32 on cuda unless --dtype bf16" end
  if bf16_gemm == "sgemm" then return "f32", "auto: f32, as bf16_gemm = sgemm (bf16 would not be faster)" end
  local build = require("remax.bind.build")
  if build.bf16_train_pays() then return "bf16", "auto: " .. build.bf16_train_kernels() end
  return "f32", "auto: f32, as bf16 would not be faster here; its GEMMs would be " .. build.bf16_train_kernels()
end

-- device = cuda needs a CUDA device in this build (a typo never falls back to the CPU: the enum
-- catches it).
function M.check_device(device, source, cfg)
  if device ~= "cuda" then return end
  if not require("remax.bind.tensor").has_cuda() then
    error(("%s: device = cuda: this remax has no CUDA device or was built without CUDA (rebuild where the CUDA toolkit is found); use device = cpu")
      :format(source or "config"), 0)
  end
end

-- Where the value of a key of a resolved cfg came from: "recipes/x.lua:7", "command line",
-- "default" (a cfg that config.resolve did not make: "config").
M.sources = setmetatable({}, { __mode = "k" })
function M.source(cfg, key)
  local s = M.sources[cfg]
  return s and s[key] or "config"
end

-- Checks across keys (remax.settings.schema.cross_check has the ones that need no other module).
-- A refusal starts with the source of the setting it names first.
function M.validate(cfg)
  local function bad(msg, key) error(("%s: %s"):format(M.source(cfg, key), msg), 0) end
  if cfg.algo == "remax" and not cfg.generate_greedy and not cfg.advantage then
    bad("algo = remax needs generate_greedy = true (the greedy row is its baseline)", "generate_greedy")
  end
  if cfg.gamma ~= nil and cfg.importance_sampling_level == "sequence" then
    bad("gamma gives every token its own return; importance_sampling_level = sequence has one ratio per row (use token)", "gamma")
  end
  if cfg.gamma ~= nil and cfg.multi_objective_aggregation == "normalize_then_sum" then
    bad("gamma discounts the estimator's advantage; multi_objective_aggregation = normalize_then_sum replaces it (use one of them)", "gamma")
  end
  if cfg.algo == "rloo" and cfg.num_generations < 2 and not cfg.advantage then
    bad("algo = rloo needs num_generations >= 2", "num_generations")
  end
  if cfg.algo == "grpo" and cfg.num_generations < 2 and not cfg.advantage then
    bad("algo = grpo needs num_generations >= 2 (a group of one has no spread)", "num_generations")
  end
  if cfg.delta and cfg.delta <= 1 + (cfg.epsilon_high or cfg.epsilon) then
    bad(("delta = %s must be above 1 + epsilon_high = %s"):format(show(cfg.delta), show(1 + (cfg.epsilon_high or cfg.epsilon))), "delta")
  end
  if cfg.loss_type and cfg.loss_agg_mode ~= M.keys.loss_agg_mode.default then
    local implied = schema.loss_types[cfg.loss_type]
    if implied ~= cfg.loss_agg_mode then
      bad(("loss_type = %s implies its own aggregation; it cannot be combined with loss_agg_mode = %s (set one of them)")
        :format(cfg.loss_type, cfg.loss_agg_mode), "loss_type")
    end
  end
  if cfg.multi_objective_aggregation == "normalize_then_sum" then
    if cfg.algo ~= "grpo" or cfg.advantage then
      bad("multi_objective_aggregation = normalize_then_sum is GRPO's advantage (TRL's GDPO): it needs algo = grpo and no recipe advantage function", "multi_objective_aggregation")
    end
    if cfg.beta > 0 and cfg.kl_estimator == "k1" then
      bad("multi_objective_aggregation = normalize_then_sum normalises each reward function; the k1 KL has no reward function to join: use kl_estimator = k3", "multi_objective_aggregation")
    end
  end
  for _, r in ipairs(cfg.report_to or {}) do
    local why = schema.report_to_refusal(r)
    if why then bad(why, "report_to") end
  end
  -- issue 35: "none" (or "all") beside other entries says two things at once
  if cfg.report_to and #cfg.report_to > 1 then
    for _, r in ipairs(cfg.report_to) do
      if r == "none" or r == "all" then
        bad(("report_to = %s: %s cannot be combined with other entries (give none, all, or a list of tensorboard and csv)")
          :format(table.concat(cfg.report_to, ","), r), "report_to")
      end
    end
  end
  if cfg.num_train_epochs and not (cfg.num_train_epochs > 0) then bad("num_train_epochs must be > 0", "num_train_epochs") end
  if cfg.use_lora then
    require("remax.bind.lora").targets(cfg.lora_target_modules, "config: lora_target_modules")
  elseif cfg.save_merged then
    bad("save_merged needs use_lora = true (without adapters, save_final_model writes the whole model)", "save_merged")
  end
  if cfg.reward_weights and cfg.algo ~= "sft" and cfg.algo ~= "reward" and #cfg.reward_weights ~= #cfg.rewards then
    bad(("reward_weights has %d weights for %d reward functions (%s)"):format(#cfg.reward_weights, #cfg.rewards,
      show(cfg.rewards)), "reward_weights")
  end
end

-- A JSON-safe copy (functions become "function (file:line)", reward tables their names).
-- Data files are recorded with absolute paths (a relative one is resolved from the current
-- folder, as the run read it), so that --resume works from any folder.
M.recorded_paths = { data = true, eval_data = true }

function M.serializable(cfg)
  local out = {}
  for _, k in ipairs(M.order) do
    local v = cfg[k]
    if M.recorded_paths[k] and type(v) == "string" then v = require("remax.bind.fs").absolute(v)
    elseif type(v) == "function" then v = show(v)
    elseif k == "rewards" and type(v) == "table" then
      local names = {}
      for i, x in ipairs(v) do names[i] = type(x) == "string" and x or show({ x }) end
      v = names
    end
    out[k] = v
  end
  return out
end

-- The --help text: every setting with its resolved value, default and meaning.
function M.help(cfg, title)
  local lines = { title or "settings (recipe values, then --key value overrides):" }
  for _, group in ipairs(M.groups) do
    lines[#lines + 1] = ""
    lines[#lines + 1] = group[1] .. ":"
    for _, d in ipairs(group[2]) do
      local decl = M.keys[d[1]]
      local value, default = show(cfg and cfg[decl.name]), show(decl.default)
      local mark = value ~= default and " *" or ""
      local range = schema.limit_of(decl).range
      lines[#lines + 1] = ("  --%-28s %s%s  (default %s; %s%s)"):format(decl.name, value, mark, default,
        (decl.type:gsub("^enum:", "")), range and (" in " .. range) or "")
      lines[#lines + 1] = "      " .. decl.help
    end
  end
  lines[#lines + 1] = ""
  lines[#lines + 1] = "* = differs from the default. Lists: --reward_weights 1,0.5. Booleans: true/false."
  return table.concat(lines, "\n")
end

return M
