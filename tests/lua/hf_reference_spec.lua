-- The model folders remax writes, read by the ecosystem's own code (tests/lua/hf_model_ref.py,
-- float32 on the CPU): transformers' AutoModelForCausalLM for full checkpoints and --save_merged
-- folders, PEFT's PeftModel.from_pretrained for LoRA adapters, transformers'
-- AutoModelForSequenceClassification for reward models; and the other way, an adapter PEFT
-- writes (get_peft_model + save_pretrained) loaded by remax. Per token row: every token's
-- log-probability and the whole next-token distribution (or the reward model's score) equal
-- remax's within float32 rounding. Qwen2 (q/k/v bias), Llama (Llama 3.1 rope_scaling) and Qwen3
-- (q/k norm), tiny; the checkpoints come from short trainer runs and from remax.model's save.
-- Every folder is made first and the reference reads them all in one Python process.
local remax = require("remax")
local cjson = require("cjson")
local config = require("remax.settings.config")
local trainer = require("remax.run.run")
local lora = require("remax.bind.lora")
local reward_model = require("remax.bind.reward_model")
local fs = require("remax.bind.fs")
local model_mod = remax.model

local support = require("support")
local tmpdir, write = support.tmpdir, support.write

-- float32 on both sides, summed in different orders: log-probabilities (up to 15 here) agree
-- to about 1e-5 relative
local TOL = 5e-5

-- Rows of byte-level token ids (the byte-level tokenizer: ids below 256 are bytes), one of them
-- longer than the Llama 3.1 case's original context of 64 positions.
local ROWS = { { 72, 101, 108, 108, 111 }, { 7, 200 }, {}, { 33, 64, 250, 17, 99, 3, 180, 42, 42, 77, 120, 5 } }
for i = 1, 80 do ROWS[3][i] = (i * 37 + 11) % 256 end

-- Every parameter random: matrices N(0, 0.3) (logits far from uniform), norms N(1, 0.3), biases
-- N(0, 0.3), so a tensor read under the wrong name or not read at all moves the logits.
local function randomize(m, seed)
  for i, name in ipairs(m.names) do
    local p = m:param(name)
    if name:match("norm%.weight$") then p:normal_(seed, i * 2 ^ 40, 1, 0.3)
    else p:normal_(seed, i * 2 ^ 40, 0, 0.3) end
  end
  return m
end

-- A model folder written by remax.model's save: the tiny model with `extra` config fields,
-- every parameter random, the byte-level tokenizer beside it. Returns dir, model.
local function saved_model(extra, seed)
  local dir = tmpdir()
  remax.tokenizer.write_byte_level(dir)
  local vocab = remax.tokenizer.load(dir).vocab_size
  local m = randomize(model_mod.new(support.tiny_model({ vocab_size = vocab, tie_word_embeddings = false }, extra),
    { seed = seed }), seed)
  m:save(dir)
  return dir, m
end

-- remax's numbers for ROWS: per-token log-probabilities and the next-token log-softmax.
local function remax_outputs(m, rows)
  rows = rows or ROWS
  local lp = m:logprobs(rows):totable()
  local nxt = {}
  for b, row in ipairs(rows) do
    local logits = m:next_logits({ row }):totable()[1]
    local mx = -math.huge
    for _, v in ipairs(logits) do mx = math.max(mx, v) end
    local s = 0
    for _, v in ipairs(logits) do s = s + math.exp(v - mx) end
    local lse = mx + math.log(s)
    nxt[b] = {}
    for k, v in ipairs(logits) do nxt[b][k] = v - lse end
  end
  return { logprobs = lp, next = nxt }
end

-- The largest |a - b| / max(1, |b|) over rows (a's rows may be padded longer than b's).
local function max_diff(a, b)
  local worst = 0
  for i, row in ipairs(b) do
    for t, v in ipairs(row) do worst = math.max(worst, math.abs(a[i][t] - v) / math.max(1, math.abs(v))) end
  end
  return worst
end

-- remax's outputs equal the reference's within TOL, on a model the reference recognised whole.
local function same_outputs(mine, ref, what)
  local d1, d2 = max_diff(mine.logprobs, ref.logprobs), max_diff(mine.next, ref.next)
  assert(d1 <= TOL, ("%s: per-token log-probabilities differ from the reference's by %g"):format(what, d1))
  assert(d2 <= TOL, ("%s: next-token log-softmax differs from the reference's by %g"):format(what, d2))
end

local function clean_load(ref, what)
  for k, list in pairs(ref.loading) do
    assert(#list == 0, ("%s: transformers reports %s: %s"):format(what, k, table.concat(list, ", ")))
  end
end

-- A check that can fail: `other` (a model that is wrong in one respect) is far from the reference.
local function differs(other, ref, what)
  local d = max_diff(other.logprobs, ref.logprobs)
  assert(d > 100 * TOL, ("%s: only %g apart; the comparison could not tell them apart"):format(what, d))
end

local function train(settings)
  local t = trainer.new(config.resolve(settings), { quiet = true, signals = false })
  t:train()
  return t
end

---------------------------------------------------------------------------- the cases

-- Each case makes its folders and remax's numbers, returns the reference's jobs and a check of
-- their results.
local cases = {}

cases[#cases + 1] = { "a trainer's full checkpoint (Qwen2, tied embeddings, q/k/v bias) loads in AutoModelForCausalLM", function()
  local d = support.train_dir(8)
  local t = train(support.run_settings(d, { model_config = support.tiny_model({ initializer_range = 0.3 }), dtype = "f32",
    num_generations = 2, max_completion_length = 6, per_device_train_batch_size = 2, learning_rate = 2e-2, max_steps = 2,
    save_steps = 1, run_name = "full", seed = 7 }))
  local ckpt = d .. "/runs/full/checkpoints/step-2"
  assert.is_true(fs.exists(ckpt .. "/model.safetensors"))
  local mine = remax_outputs(t.model)
  return { { kind = "causal", model = ckpt, rows = ROWS } }, function(r)
    assert.are.equal("Qwen2ForCausalLM", r[1].class)
    clean_load(r[1], ckpt)
    same_outputs(mine, r[1], ckpt)
  end
end }

cases[#cases + 1] = { "a LoRA run's adapters load in PEFT on the base, and its --save_merged folder in AutoModelForCausalLM", function()
  local d = support.train_dir(8)
  local base = saved_model({}, 11)
  local t = train(support.run_settings(d, { model = base, dtype = "f32", num_generations = 2, max_completion_length = 6,
    per_device_train_batch_size = 2, learning_rate = 5e-2, max_steps = 2, save_steps = 1, run_name = "lora", seed = 7,
    use_lora = true, lora_r = 4, lora_alpha = 8, lora_dropout = 0.1, lora_target_modules = { "all-linear" },
    save_merged = d .. "/merged" }))
  local ckpt = d .. "/runs/lora/checkpoints/step-2"
  assert.is_true(fs.exists(ckpt .. "/adapter_model.safetensors"))
  local mine = remax_outputs(t.model)
  return {
    { kind = "causal", model = base, adapter = ckpt, rows = ROWS },
    { kind = "causal", model = d .. "/merged", rows = ROWS },
    { kind = "causal", model = base, rows = ROWS },
  }, function(r)
    assert.are.equal(2 * 7, r[1].lora_modules)   -- every linear layer of both blocks
    clean_load(r[2], "merged")
    same_outputs(mine, r[1], ckpt)
    same_outputs(mine, r[2], d .. "/merged")
    differs(r[3], r[1], "the base without its adapters")
  end
end }

cases[#cases + 1] = { "an adapter remax.model saves (some modules, r = 2) loads in PEFT with the same logits", function()
  local base, m = saved_model({}, 12)
  lora.apply(m, { r = 2, alpha = 5, dropout = 0.1, target_modules = { "q_proj", "v_proj", "down_proj" } })
  for name, p in pairs(lora.params(m)) do
    if name:match("lora_B") then p:normal_(13, #name * 2 ^ 32, 0, 0.3) end   -- B starts at 0
  end
  local out = tmpdir()
  m:save(out)
  assert.is_nil(io.open(out .. "/model.safetensors", "rb"))   -- the base stays where it is
  local mine, without = remax_outputs(m), remax_outputs(model_mod.load(base))
  return { { kind = "causal", model = base, adapter = out, rows = ROWS } }, function(r)
    assert.are.equal(2 * 3, r[1].lora_modules)
    same_outputs(mine, r[1], out)
    differs(without, r[1], "the base without its adapters")
  end
end }

-- PEFT writes the adapter (A and B random) on a base remax wrote; remax loads it.
local function peft_written(arch, lora_cfg, seed)
  return function()
    local base = saved_model(arch, seed)
    local out = tmpdir() .. "/peft"
    return { { kind = "peft_write", model = base, out = out, seed = seed, lora = lora_cfg, rows = ROWS } }, function(r)
      local m = lora.load(model_mod.load(base), out)
      same_outputs(remax_outputs(m), r[1], out)
      assert.are.equal(lora_cfg.r, m.lora.r)
      -- a PEFT folder alone: the base from its base_model_name_or_path
      assert.are.equal(base, cjson.decode(support.read(out .. "/adapter_config.json")).base_model_name_or_path)
      same_outputs(remax_outputs(model_mod.load(out)), r[1], out .. " (loaded whole)")
      differs(remax_outputs(model_mod.load(base)), r[1], "the base without the adapters")
    end
  end
end

cases[#cases + 1] = { "an adapter PEFT writes (all-linear) on a remax Qwen2 loads in remax with PEFT's logits",
  peft_written({}, { r = 4, lora_alpha = 8, lora_dropout = 0.1, target_modules = "all-linear", task_type = "CAUSAL_LM" }, 14) }

cases[#cases + 1] = { "an adapter PEFT writes (some modules, r = 3, alpha = 5) on a remax Llama loads in remax with PEFT's logits",
  peft_written({ architectures = { "LlamaForCausalLM" }, tie_word_embeddings = true },
    { r = 3, lora_alpha = 5, target_modules = { "q_proj", "k_proj", "o_proj", "up_proj" }, task_type = "CAUSAL_LM" }, 15) }

cases[#cases + 1] = { "a Llama with Llama 3.1 rope_scaling that remax.model saves loads in AutoModelForCausalLM", function()
  -- head_dim 8, theta 10000: wavelengths 6.3, 63, 628 and 6283 positions; with an original
  -- context of 64, low_freq_factor 1 and high_freq_factor 8 the first is kept, the second
  -- smoothed and the last two divided by the factor: every branch of the scaling
  local scaling = { rope_type = "llama3", factor = 4, low_freq_factor = 1, high_freq_factor = 8,
    original_max_position_embeddings = 64 }
  local arch = { architectures = { "LlamaForCausalLM" }, tie_word_embeddings = true, rope_theta = 10000 }
  local dir, m = saved_model({ architectures = arch.architectures, tie_word_embeddings = true, rope_theta = 10000,
    rope_scaling = scaling }, 16)
  local plain = model_mod.new(support.tiny_model({ vocab_size = tonumber(m:cfg().vocab_size) }, arch), {})
  for name, p in pairs(m:params()) do plain:param(name):copy_(p) end
  local mine, unscaled = remax_outputs(m), remax_outputs(plain)
  return { { kind = "causal", model = dir, rows = ROWS } }, function(r)
    assert.are.equal("LlamaForCausalLM", r[1].class)
    clean_load(r[1], dir)
    same_outputs(mine, r[1], dir)
    differs(unscaled, r[1], "the same weights without rope_scaling")
  end
end }

cases[#cases + 1] = { "a Qwen3 (q/k norm, head_dim 16 of hidden 32) that remax.model saves loads in AutoModelForCausalLM", function()
  local dir, m = saved_model({ architectures = { "Qwen3ForCausalLM" }, model_type = "qwen3", head_dim = 16,
    attention_bias = false, rope_theta = 1000000 }, 17)
  local mine = remax_outputs(m)
  local flat = model_mod.load(dir)
  for _, name in ipairs({ "model.layers.0.self_attn.q_norm.weight", "model.layers.1.self_attn.k_norm.weight" }) do
    flat:param(name):fill_(1)
  end
  local unnormed = remax_outputs(flat)
  return { { kind = "causal", model = dir, rows = ROWS } }, function(r)
    assert.are.equal("Qwen3ForCausalLM", r[1].class)
    clean_load(r[1], dir)
    same_outputs(mine, r[1], dir)
    differs(unnormed, r[1], "the same weights with two q/k norms at 1")
  end
end }

-- A reward model trained by algo = "reward" for one step from a causal LM remax wrote (its new
-- score head drawn with initializer_range 0.3: scores of order 1); scored by
-- AutoModelForSequenceClassification and by remax's "model:" reward on the same rows.
local function reward_case(arch, extra, seed)
  return function()
    local base = saved_model({ architectures = arch.architectures, initializer_range = 0.3 }, seed)
    local data = tmpdir() .. "/pairs.jsonl"
    local lines = {}
    for i = 1, 8 do
      lines[i] = cjson.encode({ prompt = ("item %d:"):format(i), chosen = ("good %d"):format(i), rejected = ("bad %d"):format(i) })
    end
    write(data, table.concat(lines, "\n") .. "\n")
    local out = tmpdir() .. "/rm"
    local s = { algo = "reward", model = base, data = data, chat_template = "plain", eval_size = 0, save_steps = 0,
      log_completions = 0, dtype = "f32", seed = seed, max_steps = 1, per_device_train_batch_size = 4,
      learning_rate = 1e-2, output_dir = tmpdir(), save_final_model = out }
    for k, v in pairs(extra or {}) do s[k] = v end
    train(s)
    local rm = reward_model.load(out)
    local pad = rm.pad_id
    -- rows ending in the pad token and holding one inside: both sides score the last token
    -- that is not padding
    local rows = { { 72, 101, 108, 108, 111 }, { 7, 200, pad }, { 9, pad, 30, 31, pad, pad }, ROWS[3], { 5 } }
    local scores = { rm:score_ids(rows, 2, false), rm:score_ids(rows, 3, true) }
    return { { kind = "seqcls", model = out, rows = rows } }, function(r)
      assert.are.equal(arch.architectures and "LlamaForSequenceClassification" or "Qwen2ForSequenceClassification", r[1].class)
      assert.are.equal(1, r[1].num_labels)
      clean_load(r[1], out)
      for _, got in ipairs(scores) do
        for i = 1, #rows do
          assert(math.abs(got[i] - r[1].scores[i]) <= TOL * math.max(1, math.abs(r[1].scores[i])),
            ("%s row %d: remax scores %.9g, transformers %.9g"):format(out, i, got[i], r[1].scores[i]))
        end
      end
      assert.is_true(math.abs(r[1].scores[1] - r[1].scores[2]) > 0.1)   -- not comparing constants
    end
  end
end

cases[#cases + 1] = { "a reward model (Qwen2) trained by remax loads in AutoModelForSequenceClassification with remax's scores",
  reward_case({}, nil, 18) }
cases[#cases + 1] = { "a reward model (Llama, LoRA merged into it) trained by remax loads in AutoModelForSequenceClassification with remax's scores",
  reward_case({ architectures = { "LlamaForCausalLM" } }, { use_lora = true, lora_r = 4, lora_alpha = 8, lora_dropout = 0,
    lora_target_modules = { "all-linear" } }, 19) }

---------------------------------------------------------------------------- one reference run

-- Makes every case's folders and numbers, then runs the reference once on all their jobs.
-- Returns {i: {check =, results =} or {err =}}.
local function prepare_all()
  local out, jobs, at = {}, {}, {}
  for i, case in ipairs(cases) do
    local ok, case_jobs, check = pcall(case[2])
    if not ok then
      out[i] = { err = case_jobs }
    else
      at[i] = { first = #jobs + 1, n = #case_jobs }
      for _, j in ipairs(case_jobs) do jobs[#jobs + 1] = j end
      out[i] = { check = check }
    end
  end
  local path = tmpdir() .. "/jobs.json"
  write(path, cjson.encode(jobs))
  local results = cjson.decode(support.run_reference("tests/lua/hf_model_ref.py", path))
  for i, a in pairs(at) do out[i].results = { unpack(results, a.first, a.first + a.n - 1) } end
  return out
end

local prepared, prepare_error
local function prepare()
  if not prepared and not prepare_error then
    local ok, res = pcall(prepare_all)
    if ok then prepared = res else prepare_error = res end
  end
  if prepare_error then error(prepare_error, 0) end
  return prepared
end

describe("the reference (transformers, PEFT) reads what remax writes", function()
  for i, case in ipairs(cases) do
    it(case[1], function()
      local py = support.reference("torch", "transformers", "peft")
      if not py then return end
      local p = prepare()[i]
      if p.err then error(p.err, 0) end
      p.check(p.results)
    end)
  end
end)
