-- bench/train_step.lua: remax's side of the training-step benchmark (forward + backward +
-- AdamW on random tokens). Prints one JSON line. Run through bench/train_step.sh, which runs
-- the PyTorch peer in the same session and prints the ratio.
--   ./remax run bench/train_step.lua --shape small --batch 8 --seq 256 --steps 3 [--checkpoint] [--profile]
-- --dtype bf16|f32: bf16 mixed precision (f32 master weights and moments, a bf16 working copy of
-- the weights for the GEMMs; on the cpu f32 activations, on --device cuda bf16 ones);
-- bench/gpu_train_step.sh runs the cuda side beside transformers. REMAX_BF16_GEMM=onednn|sgemm
-- picks the CPU's bf16 GEMM kernel (remax version says which one runs by default).
-- --profile: the engine's per-phase timer over the timed steps (engine/core/profile.c), a table
-- per step on stderr and the phases in the JSON line.
local remax = require("remax")
local cjson = require("cjson")
local ffi = require("ffi")
local now = require("remax.bind.clock").now   -- wall clock
local common = dofile(arg[0]:match("^(.-)[^/]*$") .. "common.lua")

local opts = common.options({ shape = "small", batch = 8, seq = 256, steps = 3, warmup = 1, checkpoint = false,
  profile = false, device = "cpu", dtype = "f32" }, arg)
local C = require("remax.bind.ffi").C
local on_device = opts.device ~= "cpu"
local model, cfg
model, cfg = common.model(opts.shape, nil, { device = opts.device, dtype = opts.dtype })
local opt = remax.optim.adamw(model, { lr = 1e-5, weight_decay = 0.0 })   -- over the flat buffers

local B, T = opts.batch, opts.seq
local tokens = remax.tensor.new({ B, T }, "i32")
local tp = ffi.cast("int32_t*", tokens.data)
local rng = remax.data.rng(0, 0)
for k = 0, B * T - 1 do tp[k] = rng:int(cfg.vocab_size) - 1 end
local dlogp = remax.tensor.new({ B, T }, "f32")
for b = 1, B do for t = 2, T do dlogp:set(b, t, -1 / (B * (T - 1))) end end

local times = {}
for step = 1, opts.warmup + opts.steps do
  if opts.profile and step == opts.warmup + 1 then C.rx_profile_enable(1); C.rx_profile_reset() end
  local t0 = now()
  model:zero_grad()
  model:logprobs(tokens, nil, { train = true, checkpoint = opts.checkpoint })
  model:backward(dlogp)
  opt:step()
  if on_device then assert(C.rx_cuda_synchronize() == 0, "cuda synchronize failed") end   -- launches are queued
  if step > opts.warmup then times[#times + 1] = now() - t0 end
end
local sum, best = 0, math.huge
for _, t in ipairs(times) do sum, best = sum + t, math.min(best, t) end
local per_step = sum / #times

local peak = 0
for line in io.lines("/proc/self/status") do
  local kb = line:match("^VmHWM:%s+(%d+)")
  if kb then peak = tonumber(kb) / 1024 end
end
local profile
if opts.profile then   -- per step: each phase's ms, its share of the step, and what no phase timed
  C.rx_profile_enable(0)
  profile = {}
  local secs, calls, timed = ffi.new("double[1]"), ffi.new("int64_t[1]"), 0
  io.stderr:write(("%-28s %10s %7s %7s\n"):format("phase", "ms/step", "%", "calls"))
  for i = 0, C.rx_profile_phases() - 1 do
    local name = ffi.string(C.rx_profile_read(i, secs, calls))
    local s = secs[0] / #times
    timed = timed + s
    if calls[0] > 0 then
      profile[#profile + 1] = { phase = name, ms = s * 1e3, calls = tonumber(calls[0]) / #times }
      io.stderr:write(("%-28s %10.1f %6.1f%% %7d\n"):format(name, s * 1e3, 100 * s / per_step, tonumber(calls[0]) / #times))
    end
  end
  local rest = per_step - timed
  profile[#profile + 1] = { phase = "untimed (Lua, FFI, glue)", ms = rest * 1e3 }
  io.stderr:write(("%-28s %10.1f %6.1f%%\n%-28s %10.1f\n"):format("untimed (Lua, FFI, glue)", rest * 1e3,
    100 * rest / per_step, "step", per_step * 1e3))
  -- The step's share of this machine's FP32 peak, as sgemm measures it here now (a 2048^3 product
  -- through remax's matmul, best of 5): the model's FLOPs are 6 per weight per token for the
  -- linear layers and the head (forward, and backward's two products; the head's recomputed
  -- logits not counted), and 3x the causal attention forward's 2 B H T^2 D.
  local n = 2048
  local a, w, y = remax.tensor.new({ n, n }, "f32"), remax.tensor.new({ n, n }, "f32"), remax.tensor.new({ n, n }, "f32")
  a:normal_(1, 0, 0, 1); w:normal_(2, 0, 0, 1)
  local fastest = math.huge
  for _ = 1, 6 do
    local t0 = now()
    assert(C.rx_matmul_forward(y, a, w, nil) == 0)
    fastest = math.min(fastest, now() - t0)
  end
  local peak = 2 * n ^ 3 / fastest
  local Cn, I, L, V = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers, cfg.vocab_size
  local H, KV = cfg.num_attention_heads, cfg.num_key_value_heads
  local D = Cn / H
  local linear = L * (2 * Cn * H * D + 2 * Cn * KV * D + 3 * Cn * I)
  local flops = 6 * B * T * (linear + Cn * V) + 3 * 2 * B * H * T * T * D * L
  io.stderr:write(("sgemm peak %.1f GFLOP/s; step %.1f GFLOP of model FLOPs at %.1f GFLOP/s = %.1f%% of it\n"):format(
    peak / 1e9, flops / 1e9, flops / per_step / 1e9, 100 * flops / per_step / peak))
  profile[#profile + 1] = { phase = "sgemm peak GFLOP/s", value = peak / 1e9 }
  profile[#profile + 1] = { phase = "model GFLOP per step", value = flops / 1e9 }
end
local mem = model:memory()
local device_peak = on_device and remax.tensor.cuda_memory().peak / 2 ^ 20 or nil
print(cjson.encode({ engine = "remax", mode = "train", device = opts.device, dtype = opts.dtype, shape = opts.shape,
  gemm_dtype = model:gemm_dtype(), bf16_gemm = opts.dtype == "bf16" and remax.bf16_train_kernels() or nil,
  batch = B, seq = T, device_peak_mib = device_peak,
  checkpoint = opts.checkpoint, seconds_per_step = per_step, tokens_per_s = B * T / per_step,
  best_seconds_per_step = best, best_tokens_per_s = B * T / best,
  peak_rss_mib = peak, activation_mib = mem.activations / 2 ^ 20, params = model:num_parameters(),
  profile = profile }))
