local remax = require("remax")
local cjson = require("cjson")
local tensor, model_mod, optim = remax.tensor, remax.model, remax.optim

local support = require("support")
local tmpdir, write = support.tmpdir, support.write

local function tiny(extra)
  return support.tiny_model({ vocab_size = 40, hidden_size = 16, intermediate_size = 24, max_position_embeddings = 128,
    tie_word_embeddings = false }, extra)
end

local rows = { { 1, 5, 9, 13, 2 }, { 7, 3 }, { 30, 31, 32, 33, 34, 35 } }

describe("model", function()
  it("creates Hugging Face parameter names for both architectures", function()
    local q = model_mod.new(tiny(), { seed = 1 })
    assert.is_not_nil(q.index["model.layers.1.self_attn.k_proj.bias"])
    assert.is_not_nil(q.index["lm_head.weight"])
    local l = model_mod.new(tiny({ architectures = { "LlamaForCausalLM" }, tie_word_embeddings = true }), { seed = 1 })
    assert.is_nil(l.index["model.layers.1.self_attn.k_proj.bias"])
    assert.is_nil(l.index["lm_head.weight"])
    assert.are.equal(40 * 16, l:param("model.embed_tokens.weight"):nelement())
  end)

  it("refuses a device it does not know, or a dtype the device cannot do, by name", function()
    local ok, err = pcall(model_mod.new, tiny(), { device = "tpu" })
    assert.is_false(ok)
    assert.matches("device 'tpu' is not a device remax knows", err)
    ok, err = pcall(model_mod.new, tiny(), { device = "cuda", dtype = "f64" })
    assert.is_false(ok)
    assert.matches("compute dtype f64 is not supported on device cuda", err)
  end)

  it("gives the same log-probabilities with left and right padding", function()
    local m = model_mod.new(tiny(), { seed = 2 })
    local right = m:logprobs(rows):totable()
    local left = m:logprobs(rows, nil, { pad_left = true }):totable()
    for b, row in ipairs(rows) do
      local T = #right[b]
      for t = 2, #row do
        local r, l = right[b][t], left[b][T - #row + t]
        assert.is_true(r < 0)
        assert.is_true(math.abs(r - l) < 1e-5, ("row %d token %d: %g vs %g"):format(b, t, r, l))
      end
      assert.are.equal(0, right[b][1])
    end
  end)

  it("lowers the loss over 20 AdamW steps on a fixed batch", function()
    local m = model_mod.new(tiny(), { seed = 3 })
    local opt = optim.adamw(m:params(), m:grads(), { lr = 1e-2, weight_decay = 0.01 })
    local function loss()
      local lp = m:logprobs(rows, nil, { train = true })
      local s, n = 0, 0
      for _, row in ipairs(lp:totable()) do for _, v in ipairs(row) do if v ~= 0 then s, n = s - v, n + 1 end end end
      return s / n, lp
    end
    local first
    for step = 1, 20 do
      local l, lp = loss()
      first = first or l
      local d = {}
      for b, row in ipairs(lp:totable()) do
        d[b] = {}
        for t, v in ipairs(row) do d[b][t] = v ~= 0 and -1 or 0 end
      end
      m:zero_grad()
      m:backward(d)
      optim.clip_grad_norm(m:grads(), 1.0)
      opt:step()
    end
    local last = loss()
    assert.is_true(last < first * 0.7, ("loss went from %g to %g"):format(first, last))
  end)

  it("saves and loads back bit-exactly, as a Hugging Face folder", function()
    for _, extra in ipairs({ {}, { architectures = { "LlamaForCausalLM" }, tie_word_embeddings = true } }) do
      local m = model_mod.new(tiny(extra), { seed = 4 })
      local dir = tmpdir()
      m:save(dir)
      local cfg = cjson.decode(io.open(dir .. "/config.json"):read("*a"))
      assert.are.equal(extra.architectures and "LlamaForCausalLM" or "Qwen2ForCausalLM", cfg.architectures[1])
      assert.are.equal("float32", cfg.torch_dtype)
      local st = remax.safetensors.open(dir .. "/model.safetensors")
      assert.are.same((function() local n = {} for k in pairs(m:params()) do n[#n + 1] = k end table.sort(n) return n end)(),
        st:names())
      local back = model_mod.load(dir)
      for name, p in pairs(m:params()) do
        assert.are.same(p:values(), back:param(name):values(), name)
      end
      assert.are.same(m:logprobs(rows):totable(), back:logprobs(rows):totable())
      os.execute("rm -rf " .. dir)
    end
  end)

  it("reports each config/checkpoint mismatch with the tensor or key and both values", function()
    local m = model_mod.new(tiny(), { seed = 5 })
    local dir = tmpdir()
    m:save(dir)
    local good = io.open(dir .. "/config.json"):read("*a")
    local function with_config(changes)
      local cfg = cjson.decode(good)
      for k, v in pairs(changes) do cfg[k] = v end
      write(dir .. "/config.json", cjson.encode(cfg))
      local ok, err = pcall(model_mod.load, dir)
      write(dir .. "/config.json", good)
      assert.is_false(ok)
      return err
    end
    assert.matches("tensor 'model.layers.0.mlp.gate_proj.weight' has shape %[24,16%] in the checkpoint, config.json wants %[32,16%]",
      with_config({ intermediate_size = 32 }))
    assert.matches("tensor 'model.layers.2.input_layernorm.weight' is missing", with_config({ num_hidden_layers = 3 }))
    assert.matches("tensor 'model%.layers%.%d%.self_attn%.[qkv]_proj%.bias' is in the checkpoint but not in a LlamaForCausalLM model",
      with_config({ architectures = { "LlamaForCausalLM" } }))
    assert.matches("architecture 'GPT2LMHeadModel' is not supported", with_config({ architectures = { "GPT2LMHeadModel" } }))
    assert.matches("rope_scaling of type 'yarn' is not supported %(supported: none, 'default', 'llama3'%)",
      with_config({ rope_scaling = { rope_type = "yarn", factor = 4 } }))
    assert.matches("rope_scaling of type 'dynamic' is not supported", with_config({ rope_scaling = { type = "dynamic", factor = 2 } }))
    assert.matches("rope_scaling.low_freq_factor is missing, expected a number %(rope_type 'llama3'%)",
      with_config({ rope_scaling = { rope_type = "llama3", factor = 8 } }))
    assert.matches("use_sliding_window = true is not supported", with_config({ use_sliding_window = true }))
    assert.matches("key 'hidden_size' is string, expected a number", with_config({ hidden_size = "16" }))
    assert.matches("not a multiple of num_key_value_heads = 3", with_config({ num_key_value_heads = 3 }))
    write(dir .. "/config.json", "{not json")
    local ok, err = pcall(model_mod.load, dir)
    assert.is_false(ok)
    assert.matches("config.json is not a JSON object", err)
    os.execute("rm -rf " .. dir)
    ok, err = pcall(model_mod.load, "/nonexistent/model")
    assert.matches("cannot read /nonexistent/model/config.json", err)
  end)

  it("loads a Qwen3 checkpoint laid out as the hub ships it: sharded bf16, generation_config, chat_template.jinja", function()
    local cfg = tiny({ architectures = { "Qwen3ForCausalLM" }, model_type = "qwen3", head_dim = 8, attention_bias = false,
      tie_word_embeddings = true, vocab_size = 300, torch_dtype = "bfloat16", use_sliding_window = false,
      rope_scaling = cjson.null, rope_theta = 1000000 })
    local m = model_mod.new(cfg, { seed = 6 })
    assert.is_not_nil(m.index["model.layers.0.self_attn.q_norm.weight"])
    assert.is_not_nil(m.index["model.layers.1.self_attn.k_norm.weight"])
    assert.is_nil(m.index["model.layers.0.self_attn.q_proj.bias"])
    assert.are.equal(4 * 8 * 16, m:param("model.layers.0.self_attn.q_proj.weight"):nelement())   -- heads * head_dim, hidden
    -- round the weights to bf16 (what the checkpoint holds), then write two shards and an index
    for _, p in pairs(m:params()) do p:copy_(p:to("bf16")) end
    local dir = tmpdir()
    local names = {}
    for name in pairs(m:params()) do names[#names + 1] = name end
    table.sort(names)
    local shards, map = { {}, {} }, {}
    for i, name in ipairs(names) do
      local k = i <= #names / 2 and 1 or 2
      shards[k][name] = m:param(name):to("bf16")
      map[#map + 1] = ("%s: %s"):format(cjson.encode(name), cjson.encode(("model-%05d-of-00002.safetensors"):format(k)))
    end
    for k = 1, 2 do remax.safetensors.save(("%s/model-%05d-of-00002.safetensors"):format(dir, k), shards[k], { format = "pt" }) end
    write(dir .. "/model.safetensors.index.json", '{"metadata": {"total_size": 1}, "weight_map": {' .. table.concat(map, ", ") .. "}}")
    write(dir .. "/config.json", cjson.encode(cfg))
    write(dir .. "/generation_config.json", '{"bos_token_id": 256, "eos_token_id": [257, 256], "do_sample": true, "temperature": 0.6}')
    remax.tokenizer.write_byte_level(dir)
    local template = io.open("tests/fixtures/chat_templates/qwen3.jinja"):read("*a")
    write(dir .. "/chat_template.jinja", template)
    local st = remax.safetensors.open(dir)
    assert.are.same({ dtype = "bf16", format = "BF16", shape = { 300, 16 } }, st:info("model.embed_tokens.weight"))
    local back = model_mod.load(dir)
    assert.are.same(m:logprobs(rows):totable(), back:logprobs(rows):totable())
    local tok = remax.tokenizer.load(dir)
    assert.are.equal(template, tok.chat_template)
    assert.are.equal(dir .. "/chat_template.jinja", tok.chat_template_path)
    local ids, text = remax.chat.encode(tok, "2+2?", { enable_thinking = false })
    assert.are.equal("<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n", text)
    assert.are.same(tok:encode(text, { add_special_tokens = false }), ids)
    -- generation runs on it, and saving keeps the architecture and head_dim
    local out = back:generate({ ids }, { max_new_tokens = 3, temperature = 0 })
    assert.are.equal(3, #out.rows[1].tokens)
    local dir2 = tmpdir()
    back:save(dir2)
    local saved = cjson.decode(io.open(dir2 .. "/config.json"):read("*a"))
    assert.are.equal("Qwen3ForCausalLM", saved.architectures[1])
    assert.are.equal(8, saved.head_dim)
    assert.are.same(back:logprobs(rows):totable(), model_mod.load(dir2):logprobs(rows):totable())
    os.execute("rm -rf " .. dir .. " " .. dir2)
  end)

  it("reads Llama 3.1 rope_scaling and keeps it through a save", function()
    local scaling = { rope_type = "llama3", factor = 8, low_freq_factor = 1, high_freq_factor = 4,
      original_max_position_embeddings = 16 }
    local cfg = tiny({ architectures = { "LlamaForCausalLM" }, rope_scaling = scaling, rope_theta = 500000,
      tie_word_embeddings = true })
    local m = model_mod.new(cfg, { seed = 7 })
    local c = m:cfg()
    assert.are.equal(remax.ffi.C.RX_ROPE_LLAMA3, c.rope_scaling)
    assert.are.equal(8, c.rope_factor)
    assert.are.equal(16, tonumber(c.rope_original_max_position_embeddings))
    assert.are.equal(500000, c.rope_theta)
    -- the scaling changes what the model computes past the original context
    local plain = model_mod.new(tiny({ architectures = { "LlamaForCausalLM" }, rope_theta = 500000, tie_word_embeddings = true }), { seed = 7 })
    local long = { {} }
    for i = 1, 40 do long[1][i] = (i * 7) % 40 end
    local a, b = m:logprobs(long):totable()[1], plain:logprobs(long):totable()[1]
    assert.is_true(math.abs(a[40] - b[40]) > 1e-6)
    local dir = tmpdir()
    m:save(dir)
    local saved = cjson.decode(io.open(dir .. "/config.json"):read("*a"))
    assert.are.same(scaling, saved.rope_scaling)
    assert.are.same(m:logprobs(long):totable(), model_mod.load(dir):logprobs(long):totable())
    os.execute("rm -rf " .. dir)
  end)
end)
