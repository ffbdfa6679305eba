-- bench/generate_varlen.lua: what finished rows cost. The same prompts decoded greedily twice,
-- every row to 128 tokens, then row i of each prompt's slots to 4*i tokens (about half as many
-- tokens in the same number of steps). Rows that finish leave the batch, so the second run should
-- take about half the time; decoding in lockstep to the end would take the same. Not a test.
--   ./remax run bench/generate_varlen.lua --shape small --prompts 8 --slots 32
local remax = require("remax")
local cjson = require("cjson")
local now = require("remax.progress").now

local shapes = {   -- as bench/generate.lua
  small = { hidden_size = 256, num_hidden_layers = 4, num_attention_heads = 8, num_key_value_heads = 2,
    intermediate_size = 688, vocab_size = 1024, tie_word_embeddings = false },
  ["qwen0.5b"] = { hidden_size = 896, num_hidden_layers = 24, num_attention_heads = 14, num_key_value_heads = 2,
    intermediate_size = 4864, vocab_size = 151936, tie_word_embeddings = true },
}
local opts = { shape = "small", prompts = 8, slots = 32, prompt = 64 }
local i = 1
while i <= #arg do
  local key = arg[i]:match("^%-%-(.+)$")
  if not key or opts[key] == nil then error("unknown argument " .. arg[i] .. " (known: --shape --prompts --slots --prompt)") end
  opts[key] = tonumber(arg[i + 1]) or arg[i + 1]
  i = i + 2
end
local cfg = shapes[opts.shape] or error("unknown shape " .. tostring(opts.shape))
cfg.architectures = { "Qwen2ForCausalLM" }
cfg.rope_theta, cfg.rms_norm_eps, cfg.max_position_embeddings = 1e6, 1e-6, 32768
local model = remax.model.new(cfg, { seed = 0 })
local rng = remax.data.rng(0, 1)
local prompts = {}
for p = 1, opts.prompts do
  local ids = {}
  for t = 1, opts.prompt do ids[t] = rng:int(cfg.vocab_size) - 1 end
  prompts[p] = ids
end
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
