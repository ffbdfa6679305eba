local remax = require("remax")
local tensor, optim = remax.tensor, remax.optim
local ffi = require("ffi")
pcall(ffi.cdef, "int memcmp(const void *a, const void *b, size_t n);")

describe("optim", function()
  it("chooses weight decay by parameter name", function()
    local names = { "model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.q_proj.bias",
      "model.layers.0.input_layernorm.weight", "model.norm.weight", "lm_head.weight" }
    local params, grads = {}, {}
    for _, n in ipairs(names) do
      params[n] = tensor.from({ 1, 1 }, "f64")
      grads[n] = tensor.from({ 0, 0 }, "f64")
    end
    local opt = optim.adamw(params, grads, { lr = 0.1, weight_decay = 0.5 })
    opt:step()
    assert.are.same({ 1 - 0.1 * 0.5, 1 - 0.1 * 0.5 }, params["model.layers.0.self_attn.q_proj.weight"]:totable())
    assert.are.same({ 1, 1 }, params["model.layers.0.self_attn.q_proj.bias"]:totable())
    assert.are.same({ 1, 1 }, params["model.layers.0.input_layernorm.weight"]:totable())
    assert.are.same({ 1, 1 }, params["model.norm.weight"]:totable())
    assert.is_true(params["lm_head.weight"]:get(1) < 1)
  end)

  it("minimises a quadratic and resumes exactly from its state", function()
    local function run(steps, resume_from)
      local p = { w = tensor.from({ 3, -2, 0.5 }, "f64") }
      local g = { w = tensor.new({ 3 }, "f64") }
      local opt = optim.adamw(p, g, { lr = 0.05 })
      if resume_from then
        p.w:copy_(resume_from.w)
        opt:load_state(resume_from.state)
      end
      for _ = 1, steps do
        for i = 1, 3 do g.w:set(i, 2 * p.w:get(i)) end     -- d/dw of sum w^2
        opt:step()
      end
      return p, opt
    end
    local p6 = run(6)
    local p3, opt3 = run(3)
    local saved = { w = p3.w:clone(), state = { step = opt3:state().step, tensors = {} } }
    for k, t in pairs(opt3:state().tensors) do saved.state.tensors[k] = t:clone() end
    local resumed = run(3, saved)
    assert.are.same(p6.w:totable(), resumed.w:totable())
    local far = run(200)
    for i = 1, 3 do assert.is_true(math.abs(far.w:get(i)) < 0.2) end
  end)

  it("clips the global gradient norm", function()
    local a, b = tensor.from({ 3, 0 }), tensor.from({ 0, 4 })
    assert.are.equal(5, optim.grad_norm({ a, b }))
    local before = optim.clip_grad_norm({ x = a, y = b }, 1.0)
    assert.are.equal(5, before)
    assert.is_true(math.abs(optim.grad_norm({ a, b }) - 1) < 1e-5)
  end)

  -- AdamW's model form (over the engine's flat buffers: a handful of calls) against the tensor by
  -- tensor form on an identical model: the same bits in the weights and the moments after steps
  -- with clipping and weight decay, the same gradient norm up to the order of the sum
  local function same_bits(a, b, what)
    local n = tonumber(a.numel) * tonumber(require("remax.bind.ffi").C.rx_dtype_size(a.dtype))
    assert.are.equal(tonumber(a.numel), tonumber(b.numel), what)
    assert.are.equal(0, ffi.C.memcmp(a.data, b.data, n), what)
  end
  local function flat_equals_tensors(opts, lora)
    local cfg = { architectures = { "Qwen2ForCausalLM" }, vocab_size = 300, hidden_size = 32, intermediate_size = 48,
      num_hidden_layers = 2, num_attention_heads = 4, num_key_value_heads = 2, rms_norm_eps = 1e-6,
      rope_theta = 10000, tie_word_embeddings = false, max_position_embeddings = 64 }
    local a, b = remax.model.new(cfg, { seed = 2 }), remax.model.new(cfg, { seed = 2 })
    if lora then
      for _, m in ipairs({ a, b }) do require("remax.bind.lora").apply(m, { r = 2, target_modules = { "q_proj", "v_proj", "down_proj" } }) end
    end
    local oa = optim.adamw(a, opts)
    local pb, gb = b:trainable()
    local ob = optim.adamw(pb, gb, opts)
    assert.is_true(#oa.runs < #ob.runs, "the flat form takes fewer calls")
    local pa, ga = a:trainable()
    for step = 1, 3 do
      for i, name in ipairs(oa.names) do
        ga[name]:normal_(step, i * 4096, 0, 0.5)
        gb[name]:normal_(step, i * 4096, 0, 0.5)
      end
      local na, nb = oa:clip(1.0), optim.clip_grad_norm(gb, 1.0)
      assert.is_true(nb > 1, "clipping happened")
      assert.is_true(math.abs(na - nb) <= 1e-12 * nb, ("norm %.17g over the flat buffer, %.17g over the tensors"):format(na, nb))
      oa:step(1e-2 * step)
      ob:step(1e-2 * step)
    end
    local sa, sb = oa:state(), ob:state()
    for _, name in ipairs(oa.names) do
      same_bits(pa[name], pb[name], name)
      for _, which in ipairs({ "m", "v" }) do
        same_bits(sa.tensors[which .. "." .. name], sb.tensors[which .. "." .. name], which .. "." .. name)
      end
    end
    -- a checkpoint of either form resumes the other
    local oc = optim.adamw(a, opts)
    oc:load_state(sb)
    for k, t in pairs(oc:state().tensors) do same_bits(t, sb.tensors[k], k) end
    return oa
  end

  it("updates a model over its flat buffers as tensor by tensor, bit for bit, in two calls", function()
    local opt = flat_equals_tensors({ weight_decay = 0.1 })
    -- the default no_decay: the matrices (decayed) first, then the norms and biases (not)
    assert.are.equal(2, #opt.runs)
    assert.are.same({ 1, 0 }, { opt.runs[1].decay, opt.runs[2].decay })
    assert.are.equal(opt.state_bytes(opt), 2 * 4 * opt.flat.n)
  end)

  it("keeps any no_decay choice over the flat buffer (one call per stretch of equal decay)", function()
    local opt = flat_equals_tensors({ weight_decay = 0.3, no_decay = { "embed_tokens", "norm%.weight$", "o_proj" } })
    assert.is_true(#opt.runs > 2)
  end)

  it("updates LoRA adapters over their flat buffer as tensor by tensor, bit for bit", function()
    local opt = flat_equals_tensors({ weight_decay = 0.1 }, true)
    assert.are.equal(1, #opt.runs)   -- adapters are matrices: all decayed
  end)

  it("accumulates gradients over the flat buffer: held + new equals the sum tensor by tensor", function()
    local m = remax.model.new({ architectures = { "Qwen2ForCausalLM" }, vocab_size = 50, hidden_size = 16,
      intermediate_size = 24, num_hidden_layers = 1, num_attention_heads = 2, num_key_value_heads = 1,
      rms_norm_eps = 1e-6, rope_theta = 10000, tie_word_embeddings = true, max_position_embeddings = 32 }, { seed = 1 })
    local g = m:grads()
    local first, want = {}, {}
    for i, name in ipairs(m.names) do
      g[name]:normal_(1, i * 4096, 0, 1)
      first[name] = g[name]:clone()
    end
    m:hold_grads()
    for _, name in ipairs(m.names) do assert.are.equal(0, optim.grad_norm({ g[name] }), name .. " zeroed") end
    for i, name in ipairs(m.names) do
      g[name]:normal_(2, i * 4096, 0, 1)
      want[name] = first[name]:clone()
      require("remax.bind.ffi").check(require("remax.bind.ffi").C.rx_add(want[name], want[name], g[name]))
    end
    m:add_held_grads()
    for _, name in ipairs(m.names) do same_bits(g[name], want[name], name) end
  end)

  it("computes warmup, linear and cosine schedules", function()
    assert.are.equal(0.5, optim.schedule("constant", 1, 5, 100, 10))
    assert.are.equal(1, optim.schedule("constant", 1, 50, 100, 10))
    -- decay counted as Hugging Face counts (0-based s = step - 1): step 61 of 110 is half way
    assert.are.equal(0.5, optim.schedule("linear", 1, 61, 110, 10))
    assert.is_true(math.abs(optim.schedule("cosine", 1, 61, 110, 10) - 0.5) < 1e-12)
    -- no step is wasted at lr 0: HF's get_linear_schedule_with_warmup(0, 5) gives 1, .8, .6, .4, .2
    for step, want in ipairs({ 1, 0.8, 0.6, 0.4, 0.2 }) do
      assert.is_true(math.abs(optim.schedule("linear", 1, step, 5, 0) - want) < 1e-15, "linear step " .. step)
      local cos = 0.5 * (1 + math.cos(math.pi * (step - 1) / 5))   -- HF's cosine at s = step - 1
      assert.is_true(math.abs(optim.schedule("cosine", 1, step, 5, 0) - cos) < 1e-15, "cosine step " .. step)
    end
    assert.is_true(optim.schedule("cosine", 1, 110, 110, 10) > 0, "the last cosine step trains")
    assert.is_true(math.abs(optim.schedule("linear", 1, 110, 110, 10) - 0.01) < 1e-15)
    -- warmup reaches the peak on its last step; the first decay step is still at the peak
    assert.are.equal(1, optim.schedule("linear", 1, 10, 110, 10))
    assert.are.equal(1, optim.schedule("linear", 1, 11, 110, 10))
    assert.has_error(function() optim.schedule("exp", 1, 1, 10) end,
      "unknown lr_scheduler_type 'exp' (valid: constant, linear, cosine)")
  end)
end)
