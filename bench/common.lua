-- bench/common.lua: what the Lua benchmarks share: the model shapes (as bench/torch_peer.py),
-- "--key value" arguments, and a random model and random prompts of a shape. Loaded with
--   local common = dofile(arg[0]:match("^(.-)[^/]*$") .. "common.lua")
local remax = require("remax")
local M = {}

M.shapes = {
  tiny = { hidden_size = 64, num_hidden_layers = 2, num_attention_heads = 4, num_key_value_heads = 2,
    intermediate_size = 160, vocab_size = 512, tie_word_embeddings = true },
  small = { hidden_size = 256, num_hidden_layers = 4, num_attention_heads = 8, num_key_value_heads = 2,
    intermediate_size = 688, vocab_size = 1024, tie_word_embeddings = false },
  ["qwen0.5b"] = { hidden_size = 896, num_hidden_layers = 24, num_attention_heads = 14, num_key_value_heads = 2,
    intermediate_size = 4864, vocab_size = 151936, tie_word_embeddings = true },
  ["qwen1.5b"] = { hidden_size = 1536, num_hidden_layers = 28, num_attention_heads = 12, num_key_value_heads = 2,
    intermediate_size = 8960, vocab_size = 151936, tie_word_embeddings = true },
}

-- "--key value" pairs over the defaults in opts (numbers where they parse), and "--flag" for
-- the keys whose default is false; unknown keys fail.
function M.options(opts, args)
  local known = {}
  for k in pairs(opts) do known[#known + 1] = "--" .. k end
  table.sort(known)
  local i = 1
  while i <= #args do
    local key = args[i]:match("^%-%-(.+)$")
    if not key or opts[key] == nil then
      error("unknown argument " .. args[i] .. " (known: " .. table.concat(known, " ") .. ")", 0)
    end
    if opts[key] == false then
      opts[key] = true
      i = i + 1
    else
      opts[key] = tonumber(args[i + 1]) or args[i + 1]
      i = i + 2
    end
  end
  return opts
end

-- A randomly initialised Qwen2 model of a named shape, and its config. weight_dtype: "f32"
-- (default) or "bf16" (the weight matrices stored in bf16, compute in f32).
-- extra: more model.new options (device, dtype).
function M.model(shape, weight_dtype, extra)
  local base = M.shapes[shape] or error("unknown shape " .. tostring(shape), 0)
  local cfg = {}
  for k, v in pairs(base) do cfg[k] = v end
  cfg.architectures = { "Qwen2ForCausalLM" }
  cfg.rope_theta, cfg.rms_norm_eps, cfg.max_position_embeddings = 1e6, 1e-6, 32768
  local opts = { seed = 0, weight_dtype = weight_dtype }
  for k, v in pairs(extra or {}) do opts[k] = v end
  return remax.model.new(cfg, opts), cfg
end

-- n prompts of len random token ids, the same for every run.
function M.prompts(cfg, n, len)
  local rng = remax.data.rng(0, 1)
  local prompts = {}
  for p = 1, n do
    local ids = {}
    for t = 1, len do ids[t] = rng:int(cfg.vocab_size) - 1 end
    prompts[p] = ids
  end
  return prompts
end

return M
