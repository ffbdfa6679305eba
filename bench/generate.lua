-- bench/generate.lua: remax's side of the generation benchmark: greedy KV-cache decoding of
-- `rows` random prompts of `prompt` tokens, `new` tokens each, on a random model of a
-- bench/train_step.lua shape. Prints one JSON line. Run through bench/generate.sh, which runs
-- the PyTorch peer (bench/torch_peer.py generate) in the same session and prints the ratio.
--   ./remax run bench/generate.lua --shape small --rows 8 --prompt 64 --new 128 [--dtype bf16]
-- --device cuda puts the model, KV cache and sampler on the GPU (--dtype is then the compute dtype:
-- f32, or bf16 on f32 master weights); bench/gpu_generate.sh runs it so.
local cjson = require("cjson")
local now = require("remax.bind.clock").now   -- wall clock

local common = dofile(arg[0]:match("^(.-)[^/]*$") .. "common.lua")

local opts = common.options({ shape = "small", rows = 8, prompt = 64, new = 128, warmup = 1, dtype = "f32",
  device = "cpu" }, arg)
local model, cfg
if opts.device == "cpu" then
  model, cfg = common.model(opts.shape, opts.dtype)
else   -- on the device the dtype is the compute dtype (bf16: f32 master weights)
  model, cfg = common.model(opts.shape, nil, { device = opts.device, dtype = opts.dtype })
end
local prompts = common.prompts(cfg, opts.rows, opts.prompt)
-- one greedy row per prompt, no stop ids: every row decodes exactly `new` tokens, as the peer
local gen = { temperature = 0, max_new_tokens = opts.new }

for _ = 1, opts.warmup do model:generate(prompts, gen) end
local t0 = now()
local out = model:generate(prompts, gen)
local seconds = now() - t0
assert(out.tokens_generated == opts.rows * opts.new, "a row ended early")

local peak = 0
for line in io.lines("/proc/self/status") do
  local kb = line:match("^VmHWM:%s+(%d+)")
  if kb then peak = tonumber(kb) / 1024 end
end
print(cjson.encode({ engine = "remax", mode = "generate", device = opts.device, dtype = opts.dtype, shape = opts.shape, rows = opts.rows, prompt = opts.prompt,
  new = opts.new, seconds = seconds, tokens_per_s = out.tokens_generated / seconds, decode_steps = out.decode_steps,
  cache_mib = out.cache_bytes / 2 ^ 20, peak_rss_mib = peak }))
