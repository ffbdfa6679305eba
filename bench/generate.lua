-- bench/generate.lua: remax's side of the generation benchmark: greedy KV-cache decoding of
-- `rows` random prompts of `prompt` tokens, `new` tokens each, on a random model of a
-- bench/train_step.lua shape. Prints one JSON line. Run through bench/generate.sh, which runs
-- the PyTorch peer (bench/torch_peer.py generate) in the same session and prints the ratio.
--   ./remax run bench/generate.lua --shape small --rows 8 --prompt 64 --new 128
local remax = require("remax")
local cjson = require("cjson")
local now = require("remax.progress").now   -- wall clock

local shapes = {   -- as bench/train_step.lua and bench/torch_peer.py
  small = { hidden_size = 256, num_hidden_layers = 4, num_attention_heads = 8, num_key_value_heads = 2,
    intermediate_size = 688, vocab_size = 1024, tie_word_embeddings = false },
  ["qwen0.5b"] = { hidden_size = 896, num_hidden_layers = 24, num_attention_heads = 14, num_key_value_heads = 2,
    intermediate_size = 4864, vocab_size = 151936, tie_word_embeddings = true },
}

local opts = { shape = "small", rows = 8, prompt = 64, new = 128, warmup = 1 }
local i = 1
while i <= #arg do
  local key = arg[i]:match("^%-%-(.+)$")
  if not key or opts[key] == nil then error("unknown argument " .. arg[i] .. " (known: --shape --rows --prompt --new --warmup)") end
  opts[key] = tonumber(arg[i + 1]) or arg[i + 1]
  i = i + 2
end

local cfg = shapes[opts.shape] or error("unknown shape " .. tostring(opts.shape))
cfg.architectures = { "Qwen2ForCausalLM" }
cfg.rope_theta, cfg.rms_norm_eps, cfg.max_position_embeddings = 1e6, 1e-6, 32768
local model = remax.model.new(cfg, { seed = 0 })

local rng = remax.data.rng(0, 1)
local prompts = {}
for r = 1, opts.rows do
  local p = {}
  for t = 1, opts.prompt do p[t] = rng:int(cfg.vocab_size) - 1 end
  prompts[r] = p
end
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
print(cjson.encode({ engine = "remax", mode = "generate", shape = opts.shape, rows = opts.rows, prompt = opts.prompt,
  new = opts.new, seconds = seconds, tokens_per_s = out.tokens_generated / seconds, decode_steps = out.decode_steps,
  cache_mib = out.cache_bytes / 2 ^ 20, peak_rss_mib = peak }))
