-- bench/remax_step.lua: one whole ReMax step of the trainer (remax.run.run), timed by phase:
-- generation (every prompt's sampled rows and its greedy row in one batch), scoring (a Lua reward
-- and the advantages), the reference model's log-probabilities (beta > 0) and the update
-- (forward, backward, clipping and AdamW over the micro-batches). A random Qwen2 model of a
-- bench/common.lua shape with the byte-level tokenizer; prompts of random letters (one token per
-- byte). Prints one JSON line. bench/gpu_remax_step.sh runs it in the GPU window.
--   ./remax run bench/remax_step.lua --shape qwen1.5b --device cuda --dtype bf16
--   ./remax run bench/remax_step.lua --shape tiny --prompts 4 --samples 2 --prompt 16 --new 8 --device cpu --dtype f32
-- --steps N timed steps after --warmup W untimed ones; the JSON line has each phase's seconds
-- per step (mean over the timed steps), the generated tokens per second, and the step's total.
local cjson = require("cjson")
local ffi = require("ffi")
local now = require("remax.bind.clock").now   -- wall clock
local common = dofile(arg[0]:match("^(.-)[^/]*$") .. "common.lua")
local config = require("remax.settings.config")
local trainer = require("remax.run.run")
local fs = require("remax.bind.fs")

local opts = common.options({ shape = "qwen1.5b", prompts = 64, samples = 4, prompt = 256, new = 512, micro = 8,
  beta = 0.04, steps = 1, warmup = 0, device = "cuda", dtype = "bf16" }, arg)
if opts.prompts % opts.micro ~= 0 then
  error(("--prompts %d is not a multiple of --micro %d (prompts per micro-batch)"):format(opts.prompts, opts.micro), 0)
end
local C = require("remax.bind.ffi").C
local on_device = opts.device ~= "cpu"
local function sync() if on_device then assert(C.rx_cuda_synchronize() == 0, "cuda synchronize failed") end end

local model_config = { architectures = { "Qwen2ForCausalLM" }, rope_theta = 1e6, rms_norm_eps = 1e-6,
  max_position_embeddings = math.max(32768, opts.prompt + opts.new + 64) }
for k, v in pairs(common.shapes[opts.shape] or error("unknown shape " .. tostring(opts.shape), 0)) do model_config[k] = v end

-- prompts of exactly opts.prompt bytes (the byte-level tokenizer: one token each), the same every run
local function data(split, n)
  local rng = require("remax").data.rng(0, split == "train" and 3 or 4)
  local rows = {}
  for i = 1, n do
    local b = {}
    for t = 1, opts.prompt do b[t] = string.char(96 + rng:int(26)) end
    rows[i] = { prompt = table.concat(b), answer = "x" }
  end
  return rows
end

-- a cheap reward in Lua: the share of letters in the completion (random weights give noise)
local function letters(completions)
  local out = {}
  for i, c in ipairs(completions) do
    local _, n = c:gsub("%a", "")
    out[i] = #c > 0 and n / #c or 0
  end
  return out
end

local dir = os.tmpname()
os.remove(dir)
local recipe = {
  model_config = model_config, data = data, rewards = { letters }, chat_template = "plain", algo = "remax",
  num_generations = opts.samples, per_device_train_batch_size = opts.micro,
  gradient_accumulation_steps = opts.prompts / opts.micro, max_prompt_length = opts.prompt,
  max_completion_length = opts.new, beta = opts.beta, device = opts.device, dtype = opts.dtype,
  max_steps = opts.warmup + opts.steps, train_size = opts.prompts * (opts.warmup + opts.steps), eval_size = 0,
  output_dir = dir, run_name = "remax_step", save_steps = 0, log_completions = 0, hot_reload = false, seed = 1,
  learning_rate = 1e-6,
}
local ok, err = pcall(function()
  local t = trainer.new(config.resolve(recipe, {}, { where = "bench/remax_step.lua" }), { quiet = true, signals = false })
  -- the random model's vocabulary is the shape's (Qwen's 151936), the byte-level tokenizer's 260:
  -- ids past the tokenizer decode to nothing (the rewards still get a string per row)
  local decode, nvocab = t.tok.decode, t.tok.vocab_size
  t.tok.decode = function(self, ids, o)
    local kept = {}
    for _, id in ipairs(ids) do if id < nvocab then kept[#kept + 1] = id end end
    return decode(self, kept, o)
  end
  -- the reference's forwards, timed where the update makes them
  local ref_seconds = 0
  if t.stepper.policy.ref then   -- padded (logprobs) or packed (logprobs_packed, padding_free) forwards
    for _, name in ipairs({ "logprobs", "logprobs_packed" }) do
      local forward = t.stepper.policy.ref[name]
      t.stepper.policy.ref[name] = function(self, ...)
        local t0 = now()
        local a, b, c = forward(self, ...)   -- read back: synchronised
        ref_seconds = ref_seconds + now() - t0
        return a, b, c
      end
    end
  end
  local sums = { generate = 0, score = 0, ref_logprobs = 0, update = 0, step = 0 }
  local tokens, rows = 0, 0
  for step = 1, opts.warmup + opts.steps do
    ref_seconds = 0
    sync()
    local t0 = now()
    local ro = t:rollout(t:next_batch())
    local t1 = now()
    t:score(ro)
    t:advantage(ro)
    local t2 = now()
    t:update(ro)
    sync()
    local t3 = now()
    t.step = t.step + 1
    if step > opts.warmup then
      sums.generate = sums.generate + (t1 - t0)
      sums.score = sums.score + (t2 - t1)
      sums.ref_logprobs = sums.ref_logprobs + ref_seconds
      sums.update = sums.update + (t3 - t2 - ref_seconds)
      sums.step = sums.step + (t3 - t0)
      tokens, rows = tokens + ro.tokens_generated, #ro.rows
    end
  end
  local n = opts.steps
  local out = { side = "remax", bench = "remax_step", shape = opts.shape, device = opts.device, dtype = opts.dtype,
    prompts = opts.prompts, samples = opts.samples, rows = rows, prompt = opts.prompt, new = opts.new,
    micro = opts.micro, beta = opts.beta, steps = n, tokens_generated = tokens / n,
    generate_tokens_per_s = tokens / math.max(sums.generate, 1e-9) }
  for k, v in pairs(sums) do out[k .. "_s"] = v / n end
  print(cjson.encode(out))
end)
fs.remove_tree(dir)
if not ok then error(err, 0) end
