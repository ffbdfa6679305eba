-- Reward models (sequence classifiers) against a float64 reference computed another way: the
-- score at position t is s = w . hidden_t, and a causal LM with the same decoder whose head has
-- w as row 0 and zeros elsewhere predicts token 0 after position t with
-- log p = s - log(e^s + V - 1); so s comes back from the already-tested logprobs path of an
-- unpadded row. Random checkpoints, right and left padding, a batch of mixed lengths.
local remax = require("remax")
local cjson = require("cjson")
local model_mod = remax.model
local reward_model = require("remax.step.model_reward")
local rewards = require("remax.step.rewards")
local tensor = remax.tensor

local support = require("support")
local tmpdir, write = support.tmpdir, support.write

local CHATML = [[{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}]]

-- A random Qwen2ForSequenceClassification / LlamaForSequenceClassification folder with the
-- byte-level tokenizer. Returns dir, the decoder's config table, the decoder (f64) and w.
local function make_rm(opts)
  local dir = tmpdir()
  remax.tokenizer.write_byte_level(dir)
  local tok = remax.tokenizer.load(dir)
  if opts.chatml then
    local cfg = cjson.decode(remax.tokenizer.byte_level_config_json())
    cfg.chat_template = CHATML
    write(dir .. "/tokenizer_config.json", cjson.encode(cfg))
  end
  local dec = { architectures = { opts.llama and "LlamaForCausalLM" or "Qwen2ForCausalLM" }, vocab_size = tok.vocab_size,
    hidden_size = 16, intermediate_size = 24, num_hidden_layers = 2, num_attention_heads = 4, num_key_value_heads = 2,
    rms_norm_eps = 1e-6, rope_theta = 10000, tie_word_embeddings = false, max_position_embeddings = 256 }
  local m = model_mod.new(dec, { seed = opts.seed, dtype = "f64", init_std = 0.3 })
  local w = tensor.new({ 1, 16 }, "f64"):normal_(opts.seed + 1, 0, 0, 0.5)
  local tensors = { ["score.weight"] = w }
  for name, p in pairs(m:params()) do
    if name ~= "lm_head.weight" then tensors[name] = opts.bf16 and p:to("bf16") or p end
  end
  remax.safetensors.save(dir .. "/model.safetensors", tensors, { format = "pt" })
  local cfg = {}
  for k, v in pairs(dec) do cfg[k] = v end
  cfg.architectures = { opts.llama and "LlamaForSequenceClassification" or "Qwen2ForSequenceClassification" }
  cfg.id2label = { ["0"] = "LABEL_0" }
  cfg.pad_token_id = tok.pad_id
  for k, v in pairs(opts.config or {}) do cfg[k] = v end
  write(dir .. "/config.json", cjson.encode(cfg))
  return dir, dec, m, w, tok
end

-- The reference score of one unpadded row at its position `at` (1-based), through logprobs.
local function reference_score(dec, m, w, ids, at)
  local V = dec.vocab_size
  local lm = model_mod.new(dec, { dtype = "f64" })
  for name, p in pairs(m:params()) do
    if name ~= "lm_head.weight" then lm:param(name):copy_(p) end
  end
  local head = lm:param("lm_head.weight")
  head:fill_(0)
  for j = 1, 16 do head:set(1, j, w:get(1, j)) end
  local seq = {}
  for t = 1, at do seq[t] = ids[t] end
  seq[at + 1] = 0
  local lp = lm:logprobs({ seq }):get(1, at + 1)
  local p = math.exp(lp)
  return math.log(V - 1) + lp - math.log(1 - p)
end

describe("reward model", function()
  for _, variant in ipairs({ { llama = false }, { llama = true, chatml = true } }) do
    local label = variant.llama and "Llama, chatml template" or "Qwen2, no template"
    it("scores at the last non-padding token like a float64 reference (" .. label .. ")", function()
      variant.seed = variant.llama and 11 or 5
      local dir, dec, m, w, tok = make_rm(variant)
      local rm = reward_model.load(dir, { dtype = "f64" })
      local prompts = { "What is 2+2?", { { role = "system", content = "Be brief." }, { role = "user", content = "Hi" } },
        "x", "A longer question, with more words in it?", "q" }
      local completions = { "4", "Hello there", "yy", "No.", "zz" .. tok.pad_token }   -- the last ends in the pad token
      local rows = {}
      for i = 1, #prompts do rows[i] = rm:encode(rm:render(prompts[i], completions[i])) end
      if variant.chatml then
        assert.are.equal("<|im_start|>user\nx<|im_end|>\n<|im_start|>assistant\nyy<|im_end|>\n", rm:render("x", "yy"))
      else
        assert.are.equal("x\n\nyy", rm:render("x", "yy"))
      end
      local want = {}
      for i, ids in ipairs(rows) do want[i] = reference_score(dec, m, w, ids, reward_model.score_index(ids, tok.pad_id)) end
      -- a completion ending in the pad token is scored before it (transformers' rule), unless the template follows it
      assert.are.equal(variant.chatml and #rows[5] or #rows[5] - 1, reward_model.score_index(rows[5], tok.pad_id))
      for _, pad_left in ipairs({ false, true }) do
        local got = rm:score_ids(rows, 3, pad_left)   -- batches of 3: mixed lengths, padded
        for i = 1, #rows do
          assert.is_true(math.abs(got[i] - want[i]) < 1e-9, ("row %d (pad_left %s): %.15g vs reference %.15g"):format(
            i, tostring(pad_left), got[i], want[i]))
        end
      end
      local via = rm:score(prompts, completions, 2)
      for i = 1, #rows do assert.is_true(math.abs(via[i] - want[i]) < 1e-9) end
      -- scores differ between completions (the check above is not comparing constants)
      assert.is_true(math.abs(want[1] - want[2]) > 1e-3)
    end)
  end

  it("is a reward: model:path and {model=, weight=, batch_size=}, mixed with Lua rewards", function()
    local dir = make_rm({ seed = 3 })
    local rm = reward_model.load(dir)
    local list = rewards.load_all({ "model:" .. dir, { model = dir, weight = 0.5, batch_size = 1, name = "rm_half" },
      { name = "one", fn = function(c) local s = {} for i = 1, #c do s[i] = 1 end return s end } })
    assert.are.equal("rm:" .. dir:match("([^/]+)$"), list[1].name)
    local completions = { "4", "five" }
    local batch = { prompt = { "2+2?", "2+3?" } }
    local per, total = rewards.score(list, nil, completions, batch, {})
    local direct = rm:score(batch.prompt, completions)
    for i = 1, 2 do
      assert.is_true(math.abs(per[list[1].name][i] - direct[i]) < 1e-5)
      assert.is_true(math.abs(per.rm_half[i] - direct[i]) < 1e-5)
      assert.is_true(math.abs(total[i] - (1.5 * direct[i] + 1)) < 1e-5)
    end
    -- reward_weights, when given, decide
    local _, total2 = rewards.score(list, { 2, 0, 0 }, completions, batch, {})
    assert.is_true(math.abs(total2[1] - 2 * direct[1]) < 1e-5)
    -- a recipe's rewards list accepts it
    local cfg = require("remax.settings.config").resolve({ rewards = { "gsm8k", { model = dir } } })
    assert.are.equal(dir, cfg.rewards[2].model)
  end)

  it("keeps a bf16 checkpoint's decoder in bf16 and scores as with f32 weights, within bf16's precision", function()
    local dir = make_rm({ seed = 21, bf16 = true })
    local auto = reward_model.load(dir)
    local f32 = reward_model.load(dir, { weight_dtype = "f32" })
    assert.are.equal("bf16", auto.model:weight_dtype())
    assert.are.equal("f32", f32.model:weight_dtype())
    local prompts, texts = { "p", "q", "r" }, { "a short one", "a somewhat longer text to score", "x" }
    local sa, sf = auto:score(prompts, texts), f32:score(prompts, texts)
    for i = 1, #texts do
      -- its matmuls round their inputs to bf16 (engine/cpu/matmul_bf16.c): about 1% here
      assert.is_true(math.abs(sa[i] - sf[i]) < 3e-2 * (1 + math.abs(sf[i])), ("%g vs %g"):format(sa[i], sf[i]))
    end
    -- an f32 checkpoint stays f32 under auto
    assert.are.equal("f32", reward_model.load(make_rm({ seed = 22 })).model:weight_dtype())
  end)

  it("names the folder in its errors", function()
    local dir = make_rm({ seed = 4, config = { id2label = { ["0"] = "A", ["1"] = "B" } } })
    local ok, err = pcall(reward_model.load, dir)
    assert.is_false(ok)
    assert.matches("reward model " .. dir:gsub("%p", "%%%0") .. ": num_labels = 2", err)
    local dir2 = make_rm({ seed = 4, config = { architectures = { "Qwen2ForCausalLM" } } })
    ok, err = pcall(reward_model.load, dir2)
    assert.is_false(ok)
    assert.matches("not a sequence classifier", err)
    ok, err = pcall(rewards.load_all, { "model:/nonexistent/rm" })
    assert.is_false(ok)
    assert.matches("reward model /nonexistent/rm: cannot read /nonexistent/rm/config.json", err)
  end)
end)
