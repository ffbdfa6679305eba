-- bench/packing.lua: the training step padded against packed (padding-free, issue 38), same rows,
-- same micro-batches, measured in one process: tokens/s (real tokens only), the activation
-- plan's peak bytes (what the layout changes; parameters and gradients are the same), and the
-- share of the padded step that was padding. Not a test.
--   ./remax run bench/packing.lua --shape small --rows 32 --dist uniform
--   ./remax run bench/packing.lua --shape qwen0.5b --layers 4 --rows 8 --dist uniform
--   ./remax run bench/packing.lua --shape small --dist recipe    # lengths of recipes/gsm8k.lua's first rollout
-- The 0.5B measurement (--shape 0.5b = qwen0.5b, all 24 layers; a quiet machine, ~1 h on 2 cores):
--   ./remax run bench/packing.lua --shape 0.5b --dist uniform --rows 16 --steps 2
--   ./remax run bench/packing.lua --shape 0.5b --dist uniform --rows 16 --steps 2 --budget 2048
--   ./remax run bench/packing.lua --shape 0.5b --dist recipe --take 40 --steps 1
-- --dist uniform: prompt --prompt tokens + completions uniform in [--min, --max] (seeded);
-- --dist recipe: the (prompt + completion) lengths of one rollout of recipes/gsm8k.lua (its
-- default model, models/tiny-gsm8k; generated here first, ~40 s). --mb: rows per micro-batch
-- (default all); --take N: the recipe's first N rows (default all); --budget: max_tokens_per_microbatch for the packed side (default none: one
-- pack per micro-batch). A step is zero_grad + every micro-batch's forward and backward (the
-- optimizer step is the same for both layouts and left out). Best of --steps after a warm-up.
local remax = require("remax")
local pack = require("remax.step.pack")
local now = require("remax.bind.clock").now
local common = dofile(arg[0]:match("^(.-)[^/]*$") .. "common.lua")

local opts = common.options({ shape = "small", layers = 0, rows = 32, prompt = 64, min = 16, max = 512, dist = "uniform",
  mb = 0, budget = 0, steps = 2, checkpoint = false, take = 0 }, arg)
if opts.shape == "0.5b" then opts.shape = "qwen0.5b" end

local lens = {}
if opts.dist == "recipe" then
  local config = require("remax.settings.config")
  local trainer = require("remax.run.run")
  local s = dofile("recipes/gsm8k.lua")
  s.eval_size, s.hot_reload, s.output_dir = 0, false, os.tmpname() .. ".d"
  local t = trainer.new(config.resolve(s, {}), { quiet = true, signals = false })
  local ro = t:rollout(t:next_batch())
  for _, r in ipairs(ro.rows) do
    if opts.take == 0 or #lens < opts.take then lens[#lens + 1] = #ro.prompt_ids[r.prompt] + #r.tokens end
  end
  os.execute("rm -rf '" .. s.output_dir .. "'")
elseif opts.dist == "uniform" then
  local rng = remax.data.rng(0, 7)
  for i = 1, opts.rows do lens[i] = opts.prompt + opts.min + rng:int(opts.max - opts.min + 1) - 1 end
else
  error("--dist: uniform or recipe", 0)
end

local base = common.shapes[opts.shape] or error("unknown shape " .. tostring(opts.shape), 0)
if opts.layers > 0 then base.num_hidden_layers = opts.layers end
local model, cfg = common.model(opts.shape)
local rng = remax.data.rng(0, 3)
local rows = {}
for i, n in ipairs(lens) do
  local r = {}
  for t = 1, n do r[t] = rng:int(cfg.vocab_size) - 1 end
  rows[i] = r
end
local mb = opts.mb > 0 and opts.mb or #rows
local batches = {}
for i = 1, #rows, mb do
  local b = {}
  for j = i, math.min(#rows, i + mb - 1) do b[#b + 1] = rows[j] end
  batches[#batches + 1] = b
end
local real, padded_tokens = 0, 0
for _, b in ipairs(batches) do
  local T = 0
  for _, r in ipairs(b) do real, T = real + #r, math.max(T, #r) end
  padded_tokens = padded_tokens + #b * T
end

local fo = { train = true, checkpoint = opts.checkpoint }
local function padded_step(peak)
  model:zero_grad()
  for _, b in ipairs(batches) do
    local lp = model:logprobs(b, nil, fo)
    local d = {}
    for r = 1, lp:size(1) do
      local row = {}
      for t = 1, lp:size(2) do row[t] = t <= #b[r] and -1e-3 or 0 end
      d[r] = row
    end
    model:backward(remax.tensor.from(d, "f32"))
    local m = model:memory()
    peak[1] = math.max(peak[1], m.activations + m.head)
  end
end
local function packed_step(peak)
  model:zero_grad()
  for _, b in ipairs(batches) do
    local lb = {}
    for i, r in ipairs(b) do lb[i] = #r end
    for _, idx in ipairs(pack.split(lb, opts.budget > 0 and opts.budget or nil)) do
      local sub = {}
      for j, i in ipairs(idx) do sub[j] = b[i] end
      local lp = model:logprobs_packed(sub, fo)
      local N = lp:size(2)
      local d = {}
      for t = 1, N do d[t] = -1e-3 end
      model:backward(remax.tensor.from({ d }, "f32"))
      local m = model:memory()
      peak[1] = math.max(peak[1], m.activations + m.head)
    end
  end
end

local function best(step)
  local peak = { 0 }
  step(peak)   -- warm-up: the plan grows to its size here
  local b = math.huge
  for _ = 1, opts.steps do
    local t0 = now()
    step(peak)
    b = math.min(b, now() - t0)
  end
  return b, peak[1]
end

local tp, mp = best(padded_step)
local tk, mk = best(packed_step)
local mib = 2 ^ 20
print(("shape %s (%d layers), %d rows in %d micro-batch(es), lengths %s [%d, %d], %d real tokens, padded to %d: padding %.1f%% of the padded step's tokens")
  :format(opts.shape, base.num_hidden_layers, #rows, #batches, opts.dist, math.min(unpack(lens)), math.max(unpack(lens)), real,
    padded_tokens, 100 * (1 - real / padded_tokens)))
print(("padded: %8.1f tokens/s  %7.1f MiB activations (peak plan)"):format(real / tp, mp / mib))
print(("packed: %8.1f tokens/s  %7.1f MiB activations (peak plan)%s"):format(real / tk, mk / mib,
  opts.budget > 0 and (" budget %d tokens"):format(opts.budget) or ""))
print(("packed / padded: %.2fx tokens/s, %.2fx memory"):format(tp / tk, mk / mp))
