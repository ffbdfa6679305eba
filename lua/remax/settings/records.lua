-- remax.settings.records: every training setting, one record each, in the groups that --help and
-- docs/trainer.md show. Everything else about a setting is computed from its record by
-- remax.settings.config: parsing and the checks of a value, --help and the docs' tables, derived
-- values, the notes for settings that do nothing, what a resumed run may change, TRL's names. A new
-- setting is one record here plus the code that reads cfg.<name>.
--
-- A record (only name, type and help are required):
--
--   { name = "epsilon", type = "number", default = 0.2, range = "[0, 1]", hot = true,
--     inert = { when = function(c) return c.num_iterations > 1 end, note = "the ratio ... is 1" },
--     help = "lower clipping range of the importance ratio (1 - epsilon)" },
--
--   name      the key, TRL's name where the meaning is the same
--   type      number | integer | boolean | string | numbers (a list; "1,0.5" on the command line) |
--             strings | enum (with choices) | data (a file, or in a recipe a function); recipe-only
--             kinds: rewards, template, advantage, environment, call_format, table, function
--   default   the value when neither the recipe nor the command line gives one (nil: none; the help
--             says what nil means). default_of = function(cfg, name): a default that follows other
--             settings (it says nil: none)
--   help      one line: what it does, in --help and docs/trainer.md (false: made from the registry,
--             algo's lists the algorithms in their own words)
--   range     a number's: "[0, 1]", "(0, inf)", "[1, 2^31)" as in mathematics (an integer without
--             one is in [0, 2^31), a number is finite). Lists: each (the items' range), min_items,
--             count. Strings: path = true (no NUL byte), folder_name = true (one folder name)
--   choices   an enum's values, or the name of a registry the step fills ("algorithms",
--             "loss_types": remax.settings.registry); value_aliases = {[true] = "group"} other
--             values taken for one; unavailable = {f16 = "why"} values refused with the reason
--   aliases   other names taken for this setting: TRL's where TRL calls it otherwise (config.json
--             records the record's name); alias_values = { alias = { range =, value = function(v) } }
--             for an alias that counts otherwise (its value checked against range, then translated)
--   hot       true: a recipe reload may change it while the run runs
--   inert     { when = function(cfg, name) -> true where it acts, note = "why it does not here" }, or a
--             list of them (the first that fails speaks): a run that sets it, to a value other than
--             its default, where it does nothing says so once at the start. (An algorithm's or a
--             loss type's own settings are listed in their records: those notes are computed.)
--   check     function(cfg, source) -> nil, or the refusal and the key to blame (default: this
--             one): checks across settings, after every value passed its own
--   note      function(cfg, given, cli) -> a line said at the start, or nil (a value copied from
--             TRL that means something else here)
--   resume    what --resume does with it: nil, the run's config.json value, which the command line
--             may change; { fixed = "why" }, it cannot change; "opening", where the run is and how
--             it opens, never taken from config.json
--
-- The records sit in groups ({ name = "Algorithm", doc = a line for the docs, settings = {...} }), in
-- the order --help lists them; M.derived lists the values computed from the settings. A setting an
-- algorithm or a loss type alone reads is named in that record's settings list (step/algos/,
-- step/loss_types/), not here.
local registry = require("remax.settings.registry")
local schema = require("remax.settings.schema")

local M = {}

local show, text = schema.show, schema.text

-- "key = value: message", key: a refusal about that setting's own value
local function refuse(c, key, msg) return ("%s = %s: %s"):format(key, show(c[key]), msg), key end

local function algorithm(c) return registry.algorithm(c.algo) or {} end
local function loss_type(c) return registry.loss_type(c.loss_type) or {} end
local function rl(c) return algorithm(c).samples == true end   -- trains on sampled completions
local function member(list, x) for _, v in ipairs(list or {}) do if v == x then return true end end return false end

local NO_SAMPLES = { when = rl, note = "this algo (sft: the answers; reward: preference pairs) trains without sampled completions" }
-- the importance ratio moves only with several updates per rollout; a loss type may read a
-- setting even at ratio 1 (its on_policy list: cispo's cap)
local RATIO = { when = function(c, name) return rl(c) and (c.num_iterations > 1 or member(loss_type(c).on_policy, name)) end,
  note = "the ratio pi/pi_old is 1 with num_iterations = 1, so nothing is clipped (TRL's mu)" }
-- the agent settings: episodes exist only with tools or an environment (issue 45)
local EPISODES = { when = function(c) return c.tools ~= nil or c.environment ~= nil end,
  note = "there are no tools and no environment, so every completion is one turn (no episodes)" }
local TOOLS = { when = function(c) return c.tools ~= nil end, note = "there are no tools to call" }
-- the asynchronous modes' own settings, and the off-policy correction's
local ASYNC = { when = function(c) return c.async_mode ~= "off" end, note = "async_mode = off: every row comes from the current weights" }
local IS_CORRECTION = { when = function(c) return c.vllm_importance_sampling_correction == true end,
  note = "vllm_importance_sampling_correction is off" }
-- a shared setting of the ratio's objective that the chosen loss type does without
local function used_by_loss(c, name) return not (loss_type(c).ignores or {})[name] end
local LOSS_IGNORES = { when = used_by_loss,
  note = function(c, name) return ("loss_type = %s %s"):format(c.loss_type, loss_type(c).ignores[name]) end }
-- at ratio 1 the soft gate's slope is 1 whatever its temperature: the gradient is -A either way
local SAPO_RATIO = { when = function(c) return rl(c) and c.num_iterations > 1 end,
  note = "the ratio pi/pi_old is 1 with num_iterations = 1, where the gate's slope is the same at every temperature (TRL's mu)" }
-- a setting of one loss type takes that loss type's default (its record's defaults), and none otherwise
local function LOSS_DEFAULT(c, name) return (loss_type(c).defaults or {})[name] end
local RESHAPES = { fixed = "the adapters' shapes follow it" }
local DATA_POSITION = { fixed = "the checkpoint's data position is a position in this data" }
local WEIGHTS = { fixed = "the checkpoint holds this model's weights" }

M.groups = {
  { name = "Model and data", settings = {
    { name = "model", type = "string", path = true, resume = WEIGHTS,
      help = "model folder (Hugging Face layout); default: models/tiny-gsm8k, the built-in base model" },
    { name = "model_config", type = "table", resume = WEIGHTS,
      help = "recipe only: Hugging Face config table of a fresh random model, used when no model is given (with the byte-level tokenizer)" },
    { name = "dtype", type = "enum", choices = { "auto", "f32", "bf16" }, default = "auto",
      unavailable = { f16 = "f16 compute is not supported; compute in f32 or bf16",
        f64 = "f64 is for the engine's gradient checks, not training; use f32" },
      resume = { fixed = "the optimizer state was built for it" },
      help = "compute dtype of the trained model: bf16 is mixed precision (f32 master weights, gradients, AdamW moments, loss and statistics; a bf16 working copy of the weights for the GEMMs, f32 sums; on the cpu f32 activations, on cuda bf16 ones); auto = bf16 on a cpu whose bf16 GEMMs outrun f32 ones (AMX, or AMD with AVX-512 BF16, with oneDNN built in: `remax version` says), else f32; the resolved dtype is printed when a run starts and written to its config.json" },
    { name = "device", type = "enum", choices = { "cpu", "cuda" }, default = "cpu",
      -- a typo never falls back to the cpu: the choices catch it; cuda needs a device in this build
      check = function(c)
        if c.device == "cuda" and not require("remax.bind.tensor").has_cuda() then
          return "device = cuda: this remax has no CUDA device or was built without CUDA (rebuild where the CUDA toolkit is found); use device = cpu"
        end
      end,
      help = "where the model trains: cpu, or cuda (an NVIDIA GPU; needs remax built with CUDA): weights, gradients, optimizer state, the KL reference and the rollouts' KV cache live there, and generation runs there too" },
    { name = "frozen_dtype", type = "enum", choices = { "auto", "f32", "bf16" }, default = "auto",
      help = "storage of the weights of frozen copies: the KL reference model, the base under LoRA adapters, the model of remax eval; on the cpu bf16 halves their memory (compute stays f32), auto = bf16 when the checkpoint stores its weight matrices in bf16 (nothing lost), else f32; on cuda the KL reference of a dtype = bf16 run is a frozen bf16 model (bf16 weights alone, no f32 masters) unless f32, and bf16 makes an f32 run's reference one too (it then computes in bf16)" },
    { name = "data", type = "data", path = true, resume = DATA_POSITION,
      note = function(c, given, cli)
        if cli.data ~= nil and cli.eval_data == nil and c.eval_data == nil and type(c.data) == "string" and (c.eval_size or 0) > 0 then
          return ("note: --data %s without --eval_data: this run skips evaluation (a data file has no test split; "
            .. "the recipe's evaluation, if any, came from its own data); give --eval_data FILE to evaluate"):format(c.data)
        end
      end,
      help = "training data: a JSONL or JSON-array file, or in a recipe a function(split, n, cfg) -> rows that makes train_size rows of split \"train\" (and eval_size of \"test\"), such as remax.tasks.gsm8k.synthetic()" },
    { name = "eval_data", type = "data", path = true,
      help = "held-out data, a file or a function as data; default: a data function's \"test\" split (none when data is a file)" },
    { name = "prompt_column", type = "string", resume = DATA_POSITION,
      help = "dataset column holding the prompt (default: prompt, else question)" },
    { name = "answer_column", type = "string",
      help = "dataset column holding the reference answer (default: answer when present)" },
    -- a data function makes its rows up front: ten million is minutes and gigabytes already
    { name = "train_size", type = "integer", default = 20000, range = "[1, 1e7]", resume = DATA_POSITION,
      help = "rows a data function makes for training (a file's rows are all used)" },
    { name = "eval_size", type = "integer", default = 200, range = "[0, 1e7]",
      help = "number of held-out problems used for evaluation (0: no evaluation)" },
    { name = "map_row", type = "function",
      help = "recipe only: function(row) -> row applied to every dataset row (e.g. turn a question into chat messages)" },
    { name = "chat_template", type = "template", default = "auto",
      help = "prompt rendering: auto (the tokenizer's template, else qa), tokenizer (its chat_template, run as written), qa (\"Question: ...\\nAnswer: \"), chatml, llama3, plain, or a recipe function(messages, opts) -> string" },
    { name = "enable_thinking", type = "boolean",
      help = "chat template variable enable_thinking (Qwen3: false renders an empty <think> block; unset: the template's default)" },
    { name = "chat_template_kwargs", type = "table",
      help = "recipe only: extra variables for the tokenizer's chat template, e.g. { date_string = \"26 Jul 2024\" }" },
    { name = "stop", type = "strings", min_items = 1,
      help = "extra stop tokens (as written in tokenizer.json) besides EOS, <|im_end|>, <|endoftext|>, <|eot_id|>" },
    { name = "stop_strings", type = "strings", min_items = 1,
      help = "text that ends a completion where it appears in the completion's decoded text (vLLM's stop; any number of tokens): the tokens up to the one that completes it are kept, and the reward sees their text, as TRL with vLLM" },
  } },
  { name = "Episodes", doc = "See [environments.md](environments.md).", settings = {   -- multi-turn rollouts: tools and environments
    { name = "tools", type = "table",
      help = "recipe only: tools the model may call, name -> { description =, parameters = JSON schema, fn = function(args) -> result, or \"py:FILE.py:FUNCTION\" (schema from its signature and docstring), \"cmd:PROGRAM\", \"http://HOST:PORT/PATH\" (run while the other rows decode) }; listed through the chat template's tools variable; a turn with tool calls gets their results and the episode goes on" },
    { name = "environment", type = "environment", aliases = { "environment_factory" },
      help = "recipe only: { reset = function(sample, state) -> messages, step = function(state, assistant_text) -> messages, done, reward }, or a function(sample) -> one (a factory), or \"py:FILE.py:CLASS\" / \"cmd:PROGRAM\" / \"http://HOST:PORT/PATH\" (reset/step requests per episode id); per-turn rewards are summed into the reward \"environment\"; or TRL's kind, told apart by its methods: a class with reset and tool methods, whose public methods are the tools and whose instances rewards get as environments= (docs/environments.md); TRL's name environment_factory is taken for it" },
    { name = "max_turns", type = "integer", default = 4, range = "[1, 1024]", aliases = { "max_tool_calling_iterations" }, inert = EPISODES,
      -- TRL counts rounds of tool calls: N rounds are N + 1 assistant turns
      alias_values = { max_tool_calling_iterations = { range = "[0, 1023]", value = function(n) return n + 1 end } },
      help = "an episode ends after this many assistant turns (the tool calls of the last one are not run); TRL's max_tool_calling_iterations = N (rounds of tool calls) is max_turns = N + 1; TRL has no limit by default, remax's max_turns = 4 allows 3 rounds" },
    { name = "max_episode_length", type = "integer", range = "[2, 2^20]", inert = EPISODES,
      help = "an episode ends when the prompt, its turns and the next observation would reach this many tokens (the observation is not appended; episodes/truncated counts it); default and upper bound: the model's max_position_embeddings. The KV cache holds this many tokens per row, so a long-context model may want less (the start-up memory check counts it, and says to set this when it is unset and does not fit). max_completion_length bounds the model's tokens over all turns" },
    { name = "strict_episodes", type = "boolean", default = false, inert = EPISODES,
      help = "stop the run (keeping the last finished step's checkpoint) when more than half of a step's episodes fail (a tool or the environment failed, a malformed call); false: the progress line says so and names the most frequent error" },
    { name = "tool_timeout", type = "number", default = 10, range = "[0, inf)", inert = EPISODES,
      help = "seconds one tool call (or an environment's reset or step, or a recipe's tool-call parser) may take before the episode gets a timeout error as its result (0: no limit; Ctrl-C and SIGTERM still stop a Lua one)" },
    { name = "tool_call_format", type = "call_format", inert = TOOLS,
      help = "how tool calls are written: qwen (<tool_call>{json}</tool_call>), hermes (the same), qwen3_coder (<tool_call><function=NAME><parameter=ARG>VALUE</parameter></function></tool_call>: Qwen3-Coder, Qwen3.5), mistral ([TOOL_CALLS] then a JSON list, or NAME[ARGS]{json}), llama3 (JSON or <|python_tag|>), or in a recipe a function(text) -> calls; default: from the chat template" },
  } },
  { name = "Algorithm", settings = {
    -- the choices are the algorithm files of step/algos/; the help lists what each one is
    { name = "algo", type = "enum", choices = "algorithms", default = "remax",
      resume = { fixed = "the run's optimizer state and metrics belong to one algorithm" },
      help = false },
    { name = "advantage", type = "advantage", hot = true,
      help = "recipe only: function(groups, opts, state) -> advantages, overriding algo's estimator" },
    { name = "num_generations", type = "integer", default = 4, range = "[0, 2^24]", inert = NO_SAMPLES,
      check = function(c)
        local a = algorithm(c)
        if a.samples and c.num_generations < 1 then
          return refuse(c, "num_generations", "expected at least 1 completion per prompt for an RL run")
        end
        -- a recipe's advantage function replaces the estimator, and with it what the estimator needs
        if a.min_generations and c.num_generations < a.min_generations and not c.advantage then
          return ("algo = %s needs num_generations >= %d%s"):format(a.name, a.min_generations,
            a.min_generations_why and (" (" .. a.min_generations_why .. ")") or "")
        end
      end,
      help = "sampled completions per prompt (the greedy baseline row comes on top)" },
    -- only an algorithm that needs the greedy row (ReMax), or a recipe's own estimator (which may read it)
    { name = "generate_greedy", type = "boolean", inert = NO_SAMPLES,
      default_of = function(c) return algorithm(c).needs_greedy ~= nil or c.advantage ~= nil end,
      check = function(c)
        local why = algorithm(c).needs_greedy
        if why and not c.generate_greedy and not c.advantage then
          return ("algo = %s needs generate_greedy = true (%s)"):format(c.algo, why)
        end
      end,
      help = "also generate one greedy completion per prompt: the baseline of remax (default true there and with a recipe advantage function); under grpo, rloo and reinforce it only adds reward_greedy and costs a row per prompt (default false)" },
    { name = "advantage_clip", type = "number", default = 0, range = "[0, inf)", hot = true,
      help = "clip advantages to [-c, c] (0: no clipping)" },
    { name = "gamma", type = "number", range = "[0, 1]",
      check = function(c)
        if c.gamma == nil then return nil end
        if c.importance_sampling_level == "sequence" then
          return "gamma gives every token its own return; importance_sampling_level = sequence has one ratio per row (use token)"
        end
        if c.multi_objective_aggregation == "normalize_then_sum" then
          return "gamma discounts the estimator's advantage; multi_objective_aggregation = normalize_then_sum replaces it (use one of them)"
        end
      end,
      help = "a discounted per-token return after the original ReMax: the KL becomes a per-token penalty and token t of a T-token completion gets return_t = -beta * kl_t + gamma^(T-t) * (r - r_greedy) (the original discounts once more, gamma^(T-t+1): docs/trainer.md; nil: off, the sequence-level advantage of remax)" },
    { name = "scale_rewards", type = "enum", choices = { "group", "batch", "none" }, default = "group", hot = true,
      value_aliases = { [true] = "group", [false] = "none", ["true"] = "group", ["false"] = "none" },
      help = "grpo: divide by the group's standard deviation, the whole batch's, or not at all (true = group, false = none, as in TRL)" },
    { name = "multi_objective_aggregation", type = "enum", choices = { "sum_then_normalize", "normalize_then_sum" },
      default = "sum_then_normalize", hot = true,
      check = function(c)
        if c.multi_objective_aggregation ~= "normalize_then_sum" then return nil end
        if not algorithm(c).per_reward or c.advantage then
          return "multi_objective_aggregation = normalize_then_sum is GRPO's advantage (TRL's GDPO): it needs algo = grpo and no recipe advantage function"
        end
        if c.beta > 0 and c.kl_estimator == "k1" then
          return "multi_objective_aggregation = normalize_then_sum normalises each reward function; the k1 KL has no reward function to join: use kl_estimator = k3"
        end
      end,
      help = "grpo with several rewards: weighted sum then the group normalisation, or each reward normalised in its group, summed, then normalised over the batch (TRL's GDPO)" },
    { name = "reinforce_baseline", type = "enum", choices = { "none", "mean" }, default = "mean",
      help = "reinforce: no baseline, or a running mean of rewards" },
    { name = "baseline_momentum", type = "number", default = 0.9, range = "[0, 1)", hot = true,
      help = "reinforce: momentum of the running mean" },
    { name = "beta", type = "number", default = 0.0, range = "[0, inf)", hot = true, inert = NO_SAMPLES,
      help = "KL coefficient to the frozen reference model (0: no reference model is loaded)" },
    { name = "kl_estimator", type = "enum", choices = { "k3", "k1" }, default = "k3",
      inert = { when = function(c) return rl(c) and c.beta > 0 end, note = "beta = 0: there is no KL term" },
      help = "k3: per-token KL estimate in the loss; k1: log-ratio folded into the reward" },
    { name = "loss_agg_mode", type = "enum", choices = { "seq-mean-token-mean", "token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm" },
      default = "seq-mean-token-mean",
      help = "how token losses are averaged (seq-mean-token-sum-norm: sum over tokens / max_completion_length, mean over rows)" },
    -- the choices are the loss type files of step/loss_types/
    { name = "loss_type", type = "enum", choices = "loss_types", inert = NO_SAMPLES,
      check = function(c)
        if c.loss_type and c.loss_agg_mode ~= "seq-mean-token-mean" and loss_type(c).aggregation ~= c.loss_agg_mode then
          return ("loss_type = %s implies its own aggregation; it cannot be combined with loss_agg_mode = %s (set one of them)")
            :format(c.loss_type, c.loss_agg_mode)
        end
      end,
      help = "TRL's loss types, each with TRL's normalisation and per-token objective (overrides loss_agg_mode; see docs/trainer.md)" },
    { name = "num_iterations", type = "integer", default = 1, range = "[1, 1024]", inert = NO_SAMPLES,
      help = "optimizer updates per rollout (TRL's mu); above 1 the ratio pi/pi_old is clipped to [1 - epsilon, 1 + epsilon_high]" },
    { name = "epsilon", type = "number", default = 0.2, range = "[0, 1]", hot = true, inert = { RATIO, LOSS_IGNORES },
      help = "lower clipping range of the importance ratio (1 - epsilon)" },
    { name = "epsilon_high", type = "number", range = "[0, inf)", hot = true, inert = { RATIO, LOSS_IGNORES },
      help = "upper clipping range (1 + epsilon_high; default: epsilon); loss_type = cispo: the cap of its weight (TRL's epsilon_max; ScaleRL uses 5)" },
    { name = "delta", type = "number", range = "(1, inf)", hot = true, inert = { RATIO, LOSS_IGNORES },
      check = function(c)
        local hi = c.epsilon_high or c.epsilon
        if c.delta and c.delta <= 1 + hi then
          return ("delta = %s must be above 1 + epsilon_high = %s"):format(text(c.delta), text(1 + hi))
        end
      end,
      help = "two-sided clipping: cap the unclipped ratio at delta (> 1 + epsilon_high; default: none)" },
    { name = "importance_sampling_level", type = "enum", choices = { "token", "sequence" }, default = "token", inert = RATIO,
      help = "token: one ratio per token (PPO); sequence: one ratio per row, exp of the mean log-ratio (GSPO)" },
    { name = "sapo_temperature_pos", type = "number", range = "(0, inf)", hot = true, default_of = LOSS_DEFAULT,
      inert = SAPO_RATIO,
      help = "loss_type = sapo: temperature of the soft gate of tokens with a positive advantage (default: TRL's, 1.0)" },
    { name = "sapo_temperature_neg", type = "number", range = "(0, inf)", hot = true, default_of = LOSS_DEFAULT,
      inert = SAPO_RATIO,
      help = "loss_type = sapo: temperature of the soft gate of tokens with a negative or zero advantage (default: TRL's, 1.05)" },
    { name = "mask_truncated_completions", type = "boolean", default = false, hot = true,
      help = "rows that hit max_completion_length get no loss (they still count in the advantages)" },
    { name = "top_entropy_quantile", type = "number", default = 1.0, range = "(0, 1]", hot = true,
      help = "train only the tokens whose entropy is in this top fraction of each micro-batch (1: all)" },
    { name = "entropy_coef", type = "number", default = 0.0, range = "(-inf, inf)", hot = true,
      help = "entropy bonus: the loss subtracts entropy_coef * the mean per-token entropy (TRL's normalisation)" },
    { name = "skip_zero_advantage", type = "boolean", default = true,
      help = "with beta = 0, rows whose advantage is 0 skip the forward/backward (no gradient anyway)" },
  } },
  { name = "Reward model", settings = {
    { name = "chosen_column", type = "string", default = "chosen",
      help = "algo = reward: the preferred side of a pair (text or messages)" },
    { name = "rejected_column", type = "string", default = "rejected",
      help = "algo = reward: the other side" },
    { name = "margin_column", type = "string", default = "margin",
      help = "algo = reward: the optional per-pair margin (a number) of the loss -log sigmoid(r_chosen - r_rejected - margin)" },
    { name = "center_rewards_coefficient", type = "number", range = "[0, inf)",
      help = "algo = reward: adds coefficient * mean((r_chosen + r_rejected)^2) to the loss, keeping scores centred at 0 (TRL's; nil: off)" },
  } },
  { name = "LoRA", doc = "See [lora.md](lora.md).", settings = {
    { name = "use_lora", type = "boolean", default = false,
      resume = { fixed = "the checkpoint holds adapters or full weights, not the other" },
      help = "train low-rank adapters (PEFT's LoRA) on a frozen base; the reference model (beta > 0) is the base with adapters off" },
    { name = "lora_r", type = "integer", default = 16, range = "[1, 65536]", inert = { when = function(c) return c.use_lora end, note = "use_lora = false" },
      resume = RESHAPES,
      help = "LoRA rank r" },
    { name = "lora_alpha", type = "number", default = 32, range = "(0, inf)", inert = { when = function(c) return c.use_lora end, note = "use_lora = false" },
      resume = { fixed = "the adapters were trained at this scale" },
      help = "LoRA alpha: adapters scale by lora_alpha / lora_r" },
    { name = "lora_dropout", type = "number", default = 0.05, range = "[0, 1)", inert = { when = function(c) return c.use_lora end, note = "use_lora = false" },
      help = "dropout on the adapters' input in training forwards" },
    { name = "lora_target_modules", type = "strings", default = { "q_proj", "v_proj" }, min_items = 1,
      inert = { when = function(c) return c.use_lora end, note = "use_lora = false" }, resume = RESHAPES,
      check = function(c)
        if c.use_lora then require("remax.bind.lora").targets(c.lora_target_modules, "config: lora_target_modules") end
      end,
      help = "linear layers that get adapters: q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj, or all-linear" },
    { name = "save_merged", type = "string", path = true,
      check = function(c)
        if c.save_merged and not c.use_lora then
          return "save_merged needs use_lora = true (without adapters, save_final_model writes the whole model)"
        end
      end,
      help = "with use_lora: also write the final model with adapters merged (a full Hugging Face model) to this folder" },
  } },
  { name = "Rewards", settings = {
    { name = "rewards", type = "rewards", default = { "gsm8k" },
      check = function(c)
        if rl(c) and type(c.rewards) == "table" and #c.rewards == 0 and c.environment == nil then   -- an environment rewards
          return refuse(c, "rewards", ("an RL run needs at least one reward function (algo = %s learns from nothing without one); "
            .. "give a name from rewards/, a file, or a function"):format(c.algo))
        end
      end,
      help = "reward functions: names of rewards/*.lua files, paths, py:FILE.py (a Python function), cmd:PROGRAM, http://HOST:PORT/PATH (a reward server), model:DIR (a reward model), or (in a recipe) tables {name=, fn=} and functions" },
    { name = "reward_weights", type = "numbers", each = "(-inf, inf)", min_items = 1, hot = true,
      check = function(c)
        if c.reward_weights and rl(c) and #c.reward_weights ~= #c.rewards then
          return ("reward_weights has %d weights for %d reward functions (%s)"):format(#c.reward_weights, #c.rewards, text(c.rewards))
        end
      end,
      help = "weight of each reward function (default: all 1)" },
    { name = "hot_reload", type = "boolean", default = true,
      help = "between steps, reload a changed reward file or recipe" },
    { name = "reward_timeout", type = "number", range = "[0, inf)", hot = true,
      help = "seconds one reward function may take on one batch before the run stops, naming it (the last checkpoint is kept; 0: no limit; a blocking C call is only caught when it returns); default: 60, or 4 times the step's generation time when longer" },
    { name = "reward_max_line_bytes", type = "integer", default = 4194304, range = "[1, 2^40]",
      help = "most bytes of one answer of a py:, cmd: or http:// reward (a line, or a body); a longer one stops the run naming the reward and this limit" },
  } },
  { name = "Generation", settings = {
    { name = "max_prompt_length", type = "integer", default = 512, range = "[1, 2^20]",
      help = "prompts longer than this keep their last tokens" },
    { name = "max_completion_length", type = "integer", default = 256, range = "[1, 2^20]",
      help = "most tokens generated per completion" },
    { name = "temperature", type = "number", default = 1.0, range = "[0, inf)", hot = true,
      help = "sampling temperature of the sampled rows" },
    { name = "top_p", type = "number", default = 1.0, range = "(0, 1]", hot = true,
      help = "nucleus sampling threshold" },
    { name = "top_k", type = "integer", default = 0, hot = true,
      help = "sample among the k most likely tokens (0: all)" },
    { name = "min_p", type = "number", default = 0.0, range = "[0, 1]", hot = true,
      help = "drop tokens less likely than min_p times the most likely one, after top_k and top_p (0: off)" },
    { name = "repetition_penalty", type = "number", default = 1.0, range = "(0, inf)", hot = true,
      help = "CTRL's penalty on the tokens of a row's prompt and completion so far, before temperature (positive logits divided by it, negative ones multiplied; greedy rows too; 1: off)" },
  } },
  { name = "Asynchronous rollouts", doc = "See [distributed.md](distributed.md#asynchronous-rollouts).", settings = {   -- remax.run.async, remax.step.offpolicy
    { name = "async_mode", type = "enum", choices = { "off", "one_step_off", "async" }, default = "off",
      resume = { fixed = "the rows generated ahead and their schedule belong to one mode" },
      check = function(c)
        if c.async_mode ~= "off" and not rl(c) then
          return ("async_mode = %s needs sampled completions; algo = %s has none (use async_mode = off)"):format(c.async_mode, c.algo)
        end
      end,
      help = "off: each step trains on rows its own weights generated; one_step_off: step s's rows are generated by the weights before step s - 1 (generation of step s + 1 overlaps training of step s); async: generation runs max_staleness steps ahead. Which weights generate which step is decided by step count, never by wall clock: a seed gives the same bits whatever the timing" },
    { name = "max_staleness", type = "integer", default = 1, range = "[0, 1024]", inert = ASYNC,
      help = "the largest age, in updates, of the policy that generated a trained row: async generates this many steps ahead; rows older than this (one_step_off with 0, weight_sync_steps > 1) are dropped, counted (async/rows_dropped) and generated again by the current weights; async with 0 is the synchronous run, bit for bit (AReaL's max_head_offpolicyness, NeMo-RL's max_trajectory_age_steps)" },
    { name = "weight_sync_steps", type = "integer", default = 1, range = "[1, 2^20]", inert = ASYNC,
      help = "with async_mode: the generating weights are refreshed from the trained ones every this many updates (verl's fully async trigger_parameter_sync_step)" },
    { name = "rollout_ranks", type = "integer", default = 0, range = "[0, 2^20]",
      help = "with several ranks (mpirun -np P): the last this many ranks generate and score, the others train; the trainers broadcast the weights to them every weight_sync_steps updates and the rows come back as plain values (0: every rank does both; one trainer rank for now)" },
    { name = "vllm_importance_sampling_correction", type = "boolean", default_of = function(c) return c.async_mode ~= "off" end,
      help = "weight each token's loss by the ratio of the current policy's probability to the sampler's (TRL's name; the sampler here is remax's own generator): corrects rows generated by older weights, or by bf16 generation against the f32 training forward; default: on with async_mode, off otherwise" },
    { name = "vllm_importance_sampling_mode", type = "enum", choices = { "token_truncate", "token_mask", "sequence_truncate", "sequence_mask" },
      default = "sequence_mask", inert = IS_CORRECTION,
      help = "the correction's ratio per token or per row (exp of the summed log-ratio), and a ratio above vllm_importance_sampling_cap truncated to the cap or masked to 0 (TRL's modes and default)" },
    { name = "vllm_importance_sampling_cap", type = "number", default = 3.0, range = "(0, inf)", inert = IS_CORRECTION,
      help = "the largest importance-sampling ratio kept (TRL's default)" },
  } },
  { name = "Optimisation", settings = {
    { name = "learning_rate", type = "number", default = 1e-5, range = "[0, 1]", hot = true,
      help = "peak learning rate of AdamW" },
    { name = "lr_scheduler_type", type = "enum", choices = { "constant", "linear", "cosine" }, default = "constant",
      help = "learning-rate schedule after warmup" },
    { name = "warmup_ratio", type = "number", default = 0.0, range = "[0, 1]",
      help = "fraction of max_steps spent warming up linearly" },
    { name = "weight_decay", type = "number", default = 0.0, range = "[0, inf)",
      check = function(c, source)
        if c.learning_rate * c.weight_decay >= 1 then
          return refuse(c, "weight_decay", ("with learning_rate = %s (%s) each step would scale the weights by 1 - %s <= 0")
            :format(show(c.learning_rate), source("learning_rate"), show(c.learning_rate * c.weight_decay)))
        end
      end,
      help = "AdamW weight decay (not on biases and norms)" },
    { name = "adam_beta1", type = "number", default = 0.9, range = "[0, 1)",
      help = "AdamW beta1" },
    { name = "adam_beta2", type = "number", default = 0.999, range = "[0, 1)",
      help = "AdamW beta2" },
    { name = "adam_epsilon", type = "number", default = 1e-8, range = "(0, 1]",
      help = "AdamW epsilon" },
    { name = "max_grad_norm", type = "number", default = 1.0, range = "[0, inf)", hot = true,
      help = "clip the global gradient norm to this (0: no clipping)" },
    { name = "per_device_train_batch_size", type = "integer", default = 8, range = "[1, 2^20]",
      note = function(c, given)   -- TRL counts completions
        if not (given.per_device_train_batch_size and rl(c)) then return nil end
        local n, g = c.per_device_train_batch_size, c.num_generations or 1
        local greedy = c.generate_greedy and 1 or 0
        return ("note: per_device_train_batch_size = %d counts prompts (TRL counts completions): each micro-batch is "
          .. "%d prompts x %d rows (%d generations%s) = %d rows; TRL's per_device_train_batch_size = %d with num_generations = %d "
          .. "is per_device_train_batch_size = %s here"):format(n, n, g + greedy, g, greedy > 0 and " + 1 greedy" or "", n * (g + greedy),
          n, g, (n % g == 0) and tostring(math.floor(n / g)) or ("%d / %d (not a whole number of prompts)"):format(n, g))
      end,
      help = "prompts per micro-batch (each brings num_generations rows)" },
    { name = "gradient_accumulation_steps", type = "integer", default = 1, range = "[1, 2^20]",
      help = "micro-batches per optimizer step; prompts per step = this * per_device_train_batch_size" },
    { name = "gradient_checkpointing", type = "boolean", default = false,
      help = "recompute activations in the backward pass (less memory)" },
    { name = "padding_free", type = "boolean", default = true,
      help = "train on packed rows: each micro-batch's rows end to end, attention within each row, no padding (verl's use_remove_padding); false pads every row to the micro-batch's longest (docs/trainer.md, Padding-free training)" },
    { name = "max_tokens_per_microbatch", type = "integer", range = "[1, 2^31)",
      inert = { when = function(c) return c.padding_free end, note = "padding_free = false pads each micro-batch instead of packing it" },
      help = "with padding_free: a micro-batch's rows are split into packs of at most this many tokens (prompt + completion), balanced, one forward and backward each, so activation memory is set by this budget (verl's ppo_max_token_len_per_gpu); unset: one pack per micro-batch; a row longer than it is refused" },
    { name = "zero_stage", type = "integer", default = 0, range = "[0, 2]",
      help = "with several ranks (mpirun/srun): 1 shards AdamW's moments and the master weights over the ranks (ZeRO-1), 2 also reduce-scatters the gradients (ZeRO-2); 0: every rank holds everything (docs/distributed.md)" },
    { name = "dist_timeout", type = "number", default = 1800, range = "(0, 1e9]",
      help = "with several ranks: seconds a collective waits for the other ranks before every rank that waits stops, naming the ranks that did not come and the step (NCCL's collectives too); 1800 is torch.distributed's 30 minutes (docs/distributed.md)" },
    { name = "max_steps", type = "integer", default = 100,
      help = "optimizer steps to train" },
    { name = "num_train_epochs", type = "number", range = "(0, 1e6]",
      help = "passes over the training data: without max_steps, max_steps = ceil(epochs * rows / prompts per step) (with both, max_steps wins, as in TRL)" },
    { name = "max_time", type = "number", default = 0, range = "[0, inf)", hot = true,
      help = "also stop after the step that brings the training time (evaluation excluded) past this many seconds (0: no limit)" },
    { name = "max_bad_steps", type = "integer", default = 5,
      help = "stop after this many steps with a non-finite loss or gradient (each is skipped)" },
  } },
  { name = "Run", settings = {
    { name = "seed", type = "integer", default = 42, range = "[0, 2^32)",
      resume = { fixed = "the data order and the sampling seeds derive from it" },
      help = "seed of data order, synthetic data and sampling (seeds derive from (seed, step))" },
    { name = "output_dir", type = "string", default = "runs", path = true, resume = "opening",
      help = "folder holding runs" },
    { name = "run_name", type = "string", folder_name = true, resume = "opening",
      help = "the run's folder name under output_dir (default: the recipe's name and the start time, e.g. gsm8k-20260101-120000)" },
    { name = "resume", type = "string", path = true, resume = "opening",
      help = "continue runs/<name> from its last checkpoint, with the run's own config.json (settings given again on the command line change it; see docs/runs.md)" },
    { name = "overwrite_output_dir", type = "boolean", default = false, resume = "opening",
      help = "start afresh in a run folder (--run_name) that already holds a run, removing its metrics, checkpoints and charts" },
    { name = "report_to", type = "strings", default = { "none" },
      check = function(c)
        for _, r in ipairs(c.report_to or {}) do
          local why = schema.report_to_refusal(r)
          if why then return why end
        end
        -- issue 35: "none" (or "all") beside other entries says two things at once
        if c.report_to and #c.report_to > 1 then
          for _, r in ipairs(c.report_to) do
            if r == "none" or r == "all" then
              return ("report_to = %s: %s cannot be combined with other entries (give none, all, or a list of tensorboard and csv)")
                :format(table.concat(c.report_to, ","), r)
            end
          end
        end
      end,
      help = "where metrics go besides metrics.jsonl (always written): tensorboard (event files in runs/<name>/tensorboard/), csv (runs/<name>/metrics.csv), all (both), none; wandb and other services are refused (no network dependency in the engine)" },
    { name = "logging_steps", type = "integer", default = 1, range = "[1, 2^31)",
      help = "print a log line every this many steps (metrics are written every step)" },
    { name = "log_completions", type = "integer", default = 10,
      help = "write completions.jsonl every this many steps (0: never)" },
    { name = "eval_steps", type = "integer", default = 50,
      help = "evaluate every this many steps (0: only before and after training)" },
    { name = "eval_on_start", type = "boolean", default = true,
      help = "evaluate before the first step" },
    { name = "per_device_eval_batch_size", type = "integer", default = 64, range = "[1, 2^20]",
      help = "prompts per generation call during evaluation" },
    { name = "save_steps", type = "integer", default = 100,
      help = "save a checkpoint every this many steps (and at the end; 0: only at the end)" },
    { name = "save_total_limit", type = "integer", default = 2, range = "[1, 2^31)",
      help = "keep this many newest checkpoints" },
    { name = "save_final_model", type = "string", path = true,
      help = "also write the final model (Hugging Face layout) to this folder" },
    { name = "loop", type = "function",
      help = "recipe only: function(trainer) that drives the steps itself (rollout, score, advantage, update)" },
  } },
  { name = "Engine", settings = {   -- engine/core/options.c's switches, set through bind/options.lua
    { name = "bf16_gemm", type = "enum", choices = { "auto", "onednn", "sgemm" }, default = "auto",
      help = "the cpu's bf16 training GEMMs: auto (oneDNN where it outruns sgemm: AMX, or AMD with AVX-512 BF16), onednn, or sgemm on widened bf16 weights (REMAX_BF16_GEMM overrides; `remax version` says what runs)" },
    { name = "bf16_dot", type = "boolean", default = true,
      help = "the AVX-512 BF16 decode kernel for bf16 weights where the cpu has it (false widens them to f32; REMAX_NO_BF16_DOT=1 overrides)" },
    { name = "cuda_graphs", type = "boolean", default = true,
      help = "cuda: decode steps replayed as CUDA graphs (REMAX_CUDA_GRAPHS=0 overrides)" },
    { name = "host_sampler", type = "boolean", default = false,
      help = "cuda: sample each row's next token on the host instead of the device (REMAX_HOST_SAMPLER=1 overrides)" },
    { name = "cuda_alloc", type = "enum", choices = { "caching", "plain" }, default = "caching",
      help = "cuda: the caching device allocator, or one cudaMalloc per tensor (plain: for memory checkers); fixed at the first device allocation (REMAX_CUDA_ALLOC overrides)" },
    { name = "cuda_sync", type = "boolean", default = false,
      help = "cuda: synchronise after every kernel so a fault is reported by the op that made it (slow; REMAX_CUDA_SYNC=1 overrides)" },
    { name = "threads_adapt", type = "boolean", default = true,
      help = "cpu: before each decode step and forward/backward, use only the cores other busy processes leave (between 1 and OMP_NUM_THREADS or every core; REMAX_THREADS_ADAPT=0 overrides)" },
  } },
}

-- Values derived from the settings, decided once by config.derive (and again when a hot reload
-- changes a setting they depend on); the trainer reads these and never re-tests their inputs.
-- Fields of cfg outside the settings: config.json and --help show the settings, not these.
M.derived = {
  -- "none" (beta = 0, or no sampled completions), "k3" (a per-token KL estimate in the loss), "k1"
  -- (the log-ratio folded into the reward) or "return" (gamma set: the per-token log-ratio in each
  -- token's return, algos.gamma_returns)
  { name = "kl_mode", value = function(c)
    return (rl(c) and c.beta > 0) and (c.gamma ~= nil and "return" or c.kl_estimator) or "none" end },
  -- whether the frozen reference model is loaded
  { name = "needs_reference", value = function(c) return c.kl_mode ~= "none" end },
  -- the generation plan of a step (remax.bind.generate.plan): num_generations sampled rows at
  -- temperature, plus the greedy row with generate_greedy
  { name = "sampling", value = function(c)
    return require("remax.bind.generate").plan(c.num_generations, c.generate_greedy, c.temperature) end },
  -- how token losses are averaged: the loss type's (TRL's names), else loss_agg_mode
  { name = "aggregation", value = function(c) return c.loss_type and loss_type(c).aggregation or c.loss_agg_mode end },
  -- rows whose advantage is 0 skip the forward and backward: only when the advantage is all that
  -- reaches the loss (no KL, entropy mask or bonus) and skip_zero_advantage is on
  { name = "skip_zero_rows", value = function(c)
    return rl(c) and c.beta == 0 and c.skip_zero_advantage and c.top_entropy_quantile >= 1 and c.entropy_coef == 0 end },
  -- how dtype = auto was resolved (dtype itself then holds bf16 or f32, so that config.json
  -- records what the run computes in and a resume keeps it)
  { name = "dtype_reason", value = function(c)
    if c.dtype ~= "auto" then return c.dtype_reason end
    local dtype, why = M.auto_dtype(c.device, c.bf16_gemm)
    c.dtype = dtype
    return why
  end },
}

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

-- Settings of TRL's GRPOConfig / transformers' TrainingArguments that remax does not have, with
-- the reason and what to use instead (a TRL user brings them; "did you mean" would mislead).
-- TRL's names for settings remax has under another name are those records' aliases.
M.not_in_remax = {
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

return M
