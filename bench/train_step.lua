-- bench/train_step.lua: remax's side of the training-step benchmark (forward + backward +
-- AdamW on random tokens). Prints one JSON line. Run through bench/train_step.sh, which runs
-- the PyTorch peer in the same session and prints the ratio.
--   ./remax run bench/train_step.lua --shape small --batch 8 --seq 256 --steps 3 [--checkpoint]
local remax = require("remax")
local cjson = require("cjson")
local ffi = require("ffi")

ffi.cdef [[ struct rx_timespec { long tv_sec; long tv_nsec; };
            int clock_gettime(int clk, struct rx_timespec *ts); ]]
local function now()
  local ts = ffi.new("struct rx_timespec")
  ffi.C.clock_gettime(1, ts)
  return tonumber(ts.tv_sec) + tonumber(ts.tv_nsec) * 1e-9
end

local shapes = {
  small = { hidden_size = 256, num_hidden_layers = 4, num_attention_heads = 8, num_key_value_heads = 2,
    intermediate_size = 688, vocab_size = 1024, tie_word_embeddings = false },
  ["qwen0.5b"] = { hidden_size = 896, num_hidden_layers = 24, num_attention_heads = 14, num_key_value_heads = 2,
    intermediate_size = 4864, vocab_size = 151936, tie_word_embeddings = true },
}

local opts = { shape = "small", batch = 8, seq = 256, steps = 3, warmup = 1, checkpoint = false }
local i = 1
while i <= #arg do
  local key = arg[i]:match("^%-%-(.+)$")
  if not key or opts[key] == nil then error("unknown argument " .. arg[i]) end
  if type(opts[key]) == "boolean" then opts[key] = true; i = i + 1
  else opts[key] = tonumber(arg[i + 1]) or arg[i + 1]; i = i + 2 end
end

local cfg = shapes[opts.shape] or error("unknown shape " .. tostring(opts.shape))
cfg.architectures = { "Qwen2ForCausalLM" }
cfg.rope_theta, cfg.rms_norm_eps, cfg.max_position_embeddings = 1e6, 1e-6, 32768
local model = remax.model.new(cfg, { seed = 0 })
local opt = remax.optim.adamw(model:params(), model:grads(), { lr = 1e-5, weight_decay = 0.0 })

local B, T = opts.batch, opts.seq
local tokens = remax.tensor.new({ B, T }, "i32")
local tp = ffi.cast("int32_t*", tokens.data)
local rng = remax.data.rng(0, 0)
for k = 0, B * T - 1 do tp[k] = rng:int(cfg.vocab_size) - 1 end
local dlogp = remax.tensor.new({ B, T }, "f32")
for b = 1, B do for t = 2, T do dlogp:set(b, t, -1 / (B * (T - 1))) end end

local times = {}
for step = 1, opts.warmup + opts.steps do
  local t0 = now()
  model:zero_grad()
  model:logprobs(tokens, nil, { train = true, checkpoint = opts.checkpoint })
  model:backward(dlogp)
  opt:step()
  if step > opts.warmup then times[#times + 1] = now() - t0 end
end
local sum = 0
for _, t in ipairs(times) do sum = sum + t end
local per_step = sum / #times

local peak = 0
for line in io.lines("/proc/self/status") do
  local kb = line:match("^VmHWM:%s+(%d+)")
  if kb then peak = tonumber(kb) / 1024 end
end
local mem = model:memory()
print(cjson.encode({ engine = "remax", mode = "train", shape = opts.shape, batch = B, seq = T,
  checkpoint = opts.checkpoint, seconds_per_step = per_step, tokens_per_s = B * T / per_step,
  peak_rss_mib = peak, activation_mib = mem.activations / 2 ^ 20, params = model:num_parameters() }))
