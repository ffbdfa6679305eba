local remax = require("remax")
local tensor, optim = remax.tensor, remax.optim

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
