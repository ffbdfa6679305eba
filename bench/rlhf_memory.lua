-- bench/rlhf_memory.lua: the bytes an RLHF step holds, ReMax against PPO (docs/benchmarks.md,
-- "Memory: ReMax against PPO"), measured with the engine's own accounting on random models of a
-- shape (bench/common.lua), one role at a time (each freed before the next):
--   policy      parameters + gradients (the flat buffers) + AdamW moments: full fine-tuning; or
--               with LoRA the frozen base (bf16 storage) + the adapters, their gradients and moments
--   reference   a frozen copy (bf16 storage); with LoRA none (the base with adapters off)
--   reward      a frozen sequence classifier: the decoder (bf16 storage) + score head [1, hidden]
--   kv cache    of one step's generation: prompts x (num_generations + 1) rows of prompt_len +
--               max_new tokens, measured by model:generate (every row stops after one token)
-- PPO adds a critic of the policy's shape (full: its own parameters, gradients and AdamW, plus a
-- value head; LoRA: its own frozen base and adapters) and the values. Prints one JSON object.
--   build/remax run bench/rlhf_memory.lua --shape qwen0.5b [--prompts 32] [--generations 4]
local remax = require("remax")
local cjson = require("cjson")
local optim = require("remax.bind.optim")
local common = dofile(arg[0]:match("^(.-)[^/]*$") .. "common.lua")

local opts = common.options({ shape = "qwen0.5b", prompts = 32, generations = 4, prompt_len = 128, max_new = 320,
  lora_r = 16 }, arg)
local MiB = 2 ^ 20
local out = { shape = opts.shape, prompts = opts.prompts, rows_per_prompt = opts.generations + 1,
  prompt_len = opts.prompt_len, max_new_tokens = opts.max_new }

local function full_bytes(m) local u = m:memory() return u.params + u.grads end
local function free() collectgarbage(); collectgarbage() end

-- the policy, full fine-tuning (f32 parameters, gradients, moments)
do
  local m, cfg = common.model(opts.shape)
  out.params = m:num_parameters()
  out.hidden = cfg.hidden_size
  local opt = optim.adamw(m, { lr = 1e-6 })
  local u = m:memory()
  out.policy_full = { params = u.params, grads = u.grads, adamw = opt:state_bytes() }
  -- the KV cache of one step's generation (the policy's compute dtype)
  -- rx_generate_begin sizes each row's cache for the longest prompt + max_new_tokens
  -- (engine/generate/generate.c): 1-token prompts with prompt_len - 1 more new tokens ask for
  -- the same cache without a prefill of prompt_len tokens per prompt
  local prompts = common.prompts(cfg, opts.prompts, 1)
  local stop = {}
  for id = 0, cfg.vocab_size - 1 do stop[#stop + 1] = id end
  local temps = {}
  for s = 1, opts.generations + 1 do temps[s] = s <= opts.generations and 1.0 or 0.0 end
  local g = m:generate(prompts, { max_new_tokens = opts.prompt_len + opts.max_new - 1, temperature = temps, stop = stop, seed = 1 })
  out.kv_cache = g.cache_bytes
  m, opt = nil, nil
end
free()

-- the policy with LoRA on every linear layer: a frozen bf16-stored base and the adapters
do
  local m = common.model(opts.shape, "bf16")
  require("remax.bind.lora").apply(m, { r = opts.lora_r, alpha = 2 * opts.lora_r, dropout = 0, target_modules = { "all-linear" }, seed = 1 })
  local opt = optim.adamw(m, { lr = 1e-6 })
  local n_adapter = m:num_trainable()
  out.adapter_params = n_adapter
  out.policy_lora = { base = m:memory().params, adapters = 4 * n_adapter, adapter_grads = 4 * n_adapter, adamw = opt:state_bytes() }
  m, opt = nil, nil
end
free()

-- a frozen copy in bf16 storage: the reference, the reward model's decoder, the LoRA critic's base
do
  local m = common.model(opts.shape, "bf16")
  out.frozen_bf16 = m:memory().params
  m = nil
end
free()

local head = 4 * out.hidden   -- a score / value head [1, hidden] in f32
local pf, pl = out.policy_full, out.policy_lora
local policy_full = pf.params + pf.grads + pf.adamw
local policy_lora = pl.base + pl.adapters + pl.adapter_grads + pl.adamw
local adapters_only = pl.adapters + pl.adapter_grads + pl.adamw
local rm = out.frozen_bf16 + head
local values = 4 * opts.prompts * opts.generations * (opts.prompt_len + opts.max_new)   -- f32 per token
out.remax_full = policy_full + out.frozen_bf16 + rm + out.kv_cache
out.ppo_full = out.remax_full + policy_full + 3 * head + values    -- critic: params, grads, moments + value head
out.remax_lora = policy_lora + rm + out.kv_cache
out.ppo_lora = out.remax_lora + out.frozen_bf16 + adapters_only + 3 * head + values
out.saving_full = 1 - out.remax_full / out.ppo_full
out.saving_lora = 1 - out.remax_lora / out.ppo_lora
-- per parameter (bytes), for other sizes
out.per_param = { policy_full = policy_full / out.params, frozen_bf16 = out.frozen_bf16 / out.params,
  lora_adapters = adapters_only / out.params }
print(cjson.encode(out))
for _, k in ipairs({ "remax_full", "ppo_full", "remax_lora", "ppo_lora" }) do
  io.stderr:write(("%-10s %8.0f MiB\n"):format(k, out[k] / MiB))
end
