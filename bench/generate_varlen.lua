-- bench/generate_varlen.lua: what finished rows cost. The same prompts decoded greedily twice,
-- every row to 128 tokens, then row i of each prompt's slots to 4*i tokens (about half as many
-- tokens in the same number of steps). Rows that finish leave the batch, so the second run should
-- take about half the time; decoding in lockstep to the end would take the same. Not a test.
--   ./remax run bench/generate_varlen.lua --shape small --prompts 8 --slots 32
local cjson = require("cjson")
local now = require("remax.bind.clock").now

local common = dofile(arg[0]:match("^(.-)[^/]*$") .. "common.lua")

local opts = common.options({ shape = "small", prompts = 8, slots = 32, prompt = 64 }, arg)
local model, cfg = common.model(opts.shape)
local prompts = common.prompts(cfg, opts.prompts, opts.prompt)
local full, spread = {}, {}
for s = 1, opts.slots do full[s], spread[s] = 128, math.max(1, math.floor(128 * s / opts.slots)) end

local function run(budgets)
  local t0 = now()
  local out = model:generate(prompts, { temperature = 0, max_new_tokens = budgets })
  return now() - t0, out.tokens_generated
end
run(full)   -- warm-up
local t_full, n_full = run(full)
local t_spread, n_spread = run(spread)
print(cjson.encode({ shape = opts.shape, rows = opts.prompts * opts.slots, full_tokens = n_full, full_seconds = t_full,
  spread_tokens = n_spread, spread_seconds = t_spread, token_ratio = n_spread / n_full, time_ratio = t_spread / t_full }))
