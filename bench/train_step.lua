-- bench/train_step.lua: remax's side of the training-step benchmark (forward + backward +
-- AdamW on random tokens). Prints one JSON line. Run through bench/train_step.sh, which runs
-- the PyTorch peer in the same session and prints the ratio.
--   ./remax run bench/train_step.lua --shape small --batch 8 --seq 256 --steps 3 [--checkpoint] [--profile]
-- --profile: the engine's per-phase timer over the timed steps (engine/core/profile.c), a table
-- per step on stderr and the phases in the JSON line.
local remax = require("remax")
local cjson = require("cjson")
local ffi = require("ffi")
local now = require("remax.progress").now   -- wall clock
local common = dofile(arg[0]:match("^(.-)[^/]*$") .. "common.lua")

local opts = common.options({ shape = "small", batch = 8, seq = 256, steps = 3, warmup = 1, checkpoint = false,
  profile = false }, arg)
local C = require("remax.ffi").C
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
  if opts.profile and step == opts.warmup + 1 then C.rx_profile_enable(1); C.rx_profile_reset() end
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
end
local mem = model:memory()
print(cjson.encode({ engine = "remax", mode = "train", shape = opts.shape, batch = B, seq = T,
  checkpoint = opts.checkpoint, seconds_per_step = per_step, tokens_per_s = B * T / per_step,
  peak_rss_mib = peak, activation_mib = mem.activations / 2 ^ 20, params = model:num_parameters(),
  profile = profile }))
