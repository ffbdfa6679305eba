-- bench/train_step.lua: remax's side of the training-step benchmark (forward + backward +
-- AdamW on random tokens). Prints one JSON line. Run through bench/train_step.sh, which runs
-- the PyTorch peer in the same session and prints the ratio.
--   ./remax run bench/train_step.lua --shape small --batch 8 --seq 256 --steps 3 [--checkpoint]
local remax = require("remax")
local cjson = require("cjson")
local ffi = require("ffi")
local now = require("remax.progress").now   -- wall clock
local common = dofile(arg[0]:match("^(.-)[^/]*$") .. "common.lua")

local opts = common.options({ shape = "small", batch = 8, seq = 256, steps = 3, warmup = 1, checkpoint = false }, arg)
local model, cfg = common.model(opts.shape)
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
