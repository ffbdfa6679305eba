-- bench/dist_memory.lua: per-rank memory and step time of data-parallel training with
-- zero_stage 0, 1 or 2 (docs/distributed.md). One training step here is a forward + backward
-- of random tokens, the gradient collective, clipping and AdamW (the trainer's update without
-- generation), on a random model of a shape from bench/common.lua. Run under mpirun by
-- bench/dist_memory.sh; rank 0 prints one JSON line with every rank's numbers.
--   mpirun -np 4 build/remax run bench/dist_memory.lua --shape qwen0.5b --stage 1 [--layers N] [--vocab V]
local remax = require("remax")
local cjson = require("cjson")
local ffi = require("ffi")
local now = require("remax.run.progress").now
local dist = require("remax.bind.dist")
local optim = require("remax.bind.optim")
local common = dofile(arg[0]:match("^(.-)[^/]*$") .. "common.lua")

local opts = common.options({ shape = "qwen0.5b", stage = 0, layers = 0, vocab = 0, batch = 2, seq = 64, steps = 3,
  warmup = 1 }, arg)
local world = dist.world()
local base = common.shapes[opts.shape] or error("unknown shape " .. tostring(opts.shape), 0)
if opts.layers > 0 then base.num_hidden_layers = opts.layers end   -- a smaller model of the same width
if opts.vocab > 0 then base.vocab_size = opts.vocab end

local function rss_mib(key)
  for line in io.lines("/proc/self/status") do
    local kb = line:match("^" .. key .. ":%s+(%d+)")
    if kb then return tonumber(kb) / 1024 end
  end
  return 0
end

local model, cfg = common.model(opts.shape)
local adam = { lr = 1e-5, weight_decay = 0.0, stage = opts.stage }
local opt = opts.stage > 0 and optim.zero_adamw(world, model, adam) or optim.adamw(model, adam)

local B, T = opts.batch, opts.seq
local tokens = remax.tensor.new({ B, T }, "i32")
local tp = ffi.cast("int32_t*", tokens.data)
local rng = remax.data.rng(world.rank, 0)   -- each rank its own share of the batch
for k = 0, B * T - 1 do tp[k] = rng:int(cfg.vocab_size) - 1 end
local dlogp = remax.tensor.new({ B, T }, "f32")
for b = 1, B do for t = 2, T do dlogp:set(b, t, -1 / (B * (T - 1) * world.size)) end end

local times = {}
for step = 1, opts.warmup + opts.steps do
  world:barrier()
  local t0 = now()
  model:zero_grad()
  model:logprobs(tokens, nil, { train = true })
  model:backward(dlogp)
  if opt.zero then
    opt:reduce_grads(1.0)
  else
    world:allreduce_grads(model)
    opt:clip(1.0)
  end
  opt:step()
  world:barrier()
  if step > opts.warmup then times[#times + 1] = now() - t0 end
end
local sum = 0
for _, t in ipairs(times) do sum = sum + t end

local m = model:memory()
local mine = {
  rank = world.rank, peak_rss_mib = rss_mib("VmHWM"),
  params_mib = m.params / 1048576, grads_mib = m.grads / 1048576, activations_mib = (m.activations + m.head) / 1048576,
  optimizer_mib = opt:state_bytes() / 1048576,
}
local all = world:gather(mine)
if world.is_root then
  local n = 0
  for _, p in pairs(model:trainable()) do n = n + tonumber(p.numel) end
  print(cjson.encode({ shape = opts.shape, layers = base.num_hidden_layers, vocab = base.vocab_size, parameters = n,
    ranks = world.size, stage = opts.stage, step_s = sum / #times, batch = B, seq = T, per_rank = all }))
end
