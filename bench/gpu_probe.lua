-- bench/gpu_probe.lua: whether this build of remax can put a model on the device, for the GPU
-- benchmarks (bench/gpu_*.sh): a tiny random Qwen2 model made with {device = "cuda", dtype =
-- "bf16"} must have its parameters on the device (no silent fallback to the CPU). Prints "ok", or
-- one line saying why not; exits 0 either way.
--   ./remax run bench/gpu_probe.lua
local remax = require("remax")

local function why_not()
  if not remax.tensor.has_cuda() then
    return "no CUDA device usable by this build (remax built without CUDA, or no device here)"
  end
  local cfg = { architectures = { "Qwen2ForCausalLM" }, hidden_size = 64, num_hidden_layers = 1,
    num_attention_heads = 4, num_key_value_heads = 2, intermediate_size = 128, vocab_size = 256,
    tie_word_embeddings = true, rope_theta = 1e6, rms_norm_eps = 1e-6, max_position_embeddings = 128 }
  local ok, model = pcall(remax.model.new, cfg, { device = "cuda", dtype = "bf16", seed = 0 })
  if not ok then return "remax.model.new{device = \"cuda\", dtype = \"bf16\"}: " .. tostring(model) end
  for name, p in pairs(model:params()) do
    if p:device_name() ~= "cuda" then
      return ("remax.model.new{device = \"cuda\"} left %s on %s"):format(name, p:device_name())
    end
  end
  return nil
end

local why = why_not()
print(why and ("not available: " .. why:gsub("\n", " ")) or "ok")
