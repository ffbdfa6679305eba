-- The bf16 working copy of a bf16 model's f32 master weights (docs/gpu.md, "bf16"): AdamW rounds
-- it in the same pass as it updates the masters, so the forward after an optimizer step converts
-- nothing, and computes exactly what a fresh conversion would; any other write to the masters
-- (copy_, fill_, set, uniform_, an op's output, a safetensors read) makes the next forward convert
-- them all again.
-- On the CPU (bf16 mixed precision) here; on "cuda" in the tests named so, which CI runs against
-- the CUDA emulation build (REMAX_LIB=build-emu/libremax.so busted --filter=cuda ...).
local ffi = require("ffi")
local remax = require("remax")
local model_mod = remax.model
local optim = require("remax.bind.optim")
local lora = require("remax.bind.lora")
local safetensors = require("remax.bind.safetensors")
local tensor = require("remax.bind.tensor")
local support = require("support")
local C = require("remax.bind.ffi").C

local PHASE = "bf16 working copy from the masters"

-- How many times a working copy was converted from its masters since the profile's reset.
local function conversions()
  local calls = ffi.new("int64_t[1]")
  for i = 0, C.rx_profile_phases() - 1 do
    local name = C.rx_profile_read(i, nil, calls)
    if name ~= nil and ffi.string(name) == PHASE then return tonumber(calls[0]) end
  end
  error("the profiler has no phase named '" .. PHASE .. "'")
end

local function tiny()
  return support.tiny_model({ vocab_size = 16, attention_bias = true, tie_word_embeddings = false })
end

local ROWS = { { 1, 5, 9, 2, 7, 3 }, { 4, 4, 8, 1, 6, 2, 9, 5 } }

-- One optimizer step on sum(sin-weighted log-probs), so that every weight moves.
local function train_step(m, opt)
  local lp = m:logprobs(ROWS, nil, { train = true })
  m:zero_grad()
  m:backward(support.wavy_dlogp(lp))
  opt:clip(1.0)
  opt:step()
end

local function logprobs(m) return m:logprobs(ROWS):totable() end

-- A second model of m's config and dtype holding m's master weights, copied: its forward converts
-- them afresh, the reference for what m's forward must compute.
local function twin_of(m, device)
  local t = model_mod.new(tiny(), { seed = 1, dtype = "bf16", device = device })
  for name, p in pairs(m:params()) do t:param(name):copy_(p) end
  return t
end

local was
local function profile_on()
  was = C.rx_profile_enabled()
  C.rx_profile_enable(1)
  C.rx_profile_reset()
end
local function profile_off() C.rx_profile_enable(was or 0); C.rx_profile_reset() end

local function suite(device, label)
  describe("a bf16 model's working copy on " .. label, function()
    before_each(profile_on)
    after_each(profile_off)

    for _, form in ipairs({ "flat", "per-tensor" }) do
      it(("is rounded by AdamW (%s form): the forward after a step converts nothing and equals a fresh conversion"):format(form), function()
        local m = model_mod.new(tiny(), { seed = 3, init_std = 0.1, dtype = "bf16", device = device })
        local opts = { lr = 1e-2, weight_decay = 0.1 }
        local opt = form == "flat" and optim.adamw(m, opts) or optim.adamw(m:params(), m:grads(), opts)
        local start = logprobs(m)
        assert.are.equal(1, conversions())   -- the new model's first forward
        for step = 1, 3 do
          train_step(m, opt)
          local n = conversions()
          local fused = logprobs(m)
          assert.are.equal(n, conversions(), "step " .. step .. ": the forward after AdamW converted the masters")
          -- a write that changes nothing still makes the copy stale: this forward converts afresh
          local p = m:param("model.norm.weight")
          p:set(1, p:get(1))
          local fresh = logprobs(m)
          assert.are.equal(n + 1, conversions(), "step " .. step)
          assert.are.same(fresh, fused, "step " .. step .. ": AdamW's working copy differs from a fresh conversion")
        end
        assert.are_not.same(start, logprobs(m))   -- the steps moved the weights
      end)
    end

    it("is converted again after any other write to the masters (copy_, fill_, set, uniform_, an op, a safetensors read)", function()
      local m = model_mod.new(tiny(), { seed = 3, init_std = 0.1, dtype = "bf16", device = device })
      local opt = optim.adamw(m, { lr = 1e-2 })
      local dir = support.tmpdir()
      local other = model_mod.new(tiny(), { seed = 9, init_std = 0.1, dtype = "bf16", device = device })
      safetensors.save(dir .. "/w.safetensors", { ["model.embed_tokens.weight"] = other:param("model.embed_tokens.weight") })
      local writers = {
        { "copy_", function() m:param("model.layers.0.mlp.up_proj.weight"):copy_(other:param("model.layers.0.mlp.up_proj.weight")) end },
        { "fill_", function() m:param("model.layers.1.self_attn.o_proj.weight"):fill_(0.01) end },
        { "set", function() m:param("lm_head.weight"):set(3, 1, 2.0) end },
        { "uniform_", function() m:param("model.layers.1.self_attn.k_proj.weight"):uniform_(5, 0, -1, 1) end },
        { "an op's output (add)", function()
          local p = m:param("model.layers.0.self_attn.v_proj.weight")
          assert.are.equal(0, C.rx_add(p, p, other:param("model.layers.0.self_attn.v_proj.weight")))
        end },
        { "an op's output (swiglu)", function()
          assert.are.equal(0, C.rx_swiglu_forward(m:param("model.layers.1.mlp.gate_proj.weight"),
            other:param("model.layers.1.mlp.gate_proj.weight"), other:param("model.layers.1.mlp.up_proj.weight")))
        end },
        { "a safetensors read", function()
          local st = safetensors.open(dir .. "/w.safetensors")
          st:read_into("model.embed_tokens.weight", m:param("model.embed_tokens.weight"))
          st:close()
        end },
      }
      -- weight matrices: the CPU's bf16 GEMMs read their copy (vectors stay f32 there)
      for _, w in ipairs(writers) do
        train_step(m, opt)   -- the copy is AdamW's, current
        local before = logprobs(m)
        w[2]()
        local after = logprobs(m)
        assert.are_not.same(before, after, w[1] .. " changed nothing the forward sees")
        assert.are.same(logprobs(twin_of(m, device)), after, w[1] .. ": the forward used a stale working copy")
      end
    end)

    it("mirrors nothing for an f32 model: AdamW and the forward never convert", function()
      local m = model_mod.new(tiny(), { seed = 3, init_std = 0.1, dtype = "f32", device = device })
      local opt = optim.adamw(m, { lr = 1e-2 })
      train_step(m, opt)
      logprobs(m)
      assert.are.equal(0, conversions())
    end)
  end)
end

suite("cpu", "the cpu")

if tensor.has_cuda() then
  suite("cuda", "cuda")

  describe("LoRA adapters' working copy on cuda", function()
    before_each(profile_on)
    after_each(profile_off)

    it("is rounded by AdamW over the adapters: the forward after a step converts nothing and equals a fresh conversion", function()
      local m = model_mod.new(tiny(), { seed = 3, init_std = 0.1, dtype = "bf16", device = "cuda" })
      lora.apply(m, { r = 2, alpha = 4, target_modules = "all-linear" })
      local opt = optim.adamw(m, { lr = 1e-2 })
      logprobs(m)
      for step = 1, 2 do
        train_step(m, opt)
        local n = conversions()
        local fused = logprobs(m)
        assert.are.equal(n, conversions(), "step " .. step .. ": the forward after AdamW converted the adapters")
        local names = m.lora.names
        local a = m:trainable()[names[1]]
        a:set(1, 1, a:get(1, 1))
        local fresh = logprobs(m)
        assert.is_true(conversions() > n, "step " .. step .. ": a write to an adapter left its copy current")
        assert.are.same(fresh, fused, "step " .. step)
      end
    end)
  end)
end

-- The training loop as users run it: rollouts, the KL reference, accumulation, AdamW. After the
-- first forward converts the new policy's copy, no step converts it again: nothing in the loop
-- writes the masters but AdamW.
local function loop_conversions(device, extra)
  local config = require("remax.settings.config")
  local trainer = require("remax.run.run")
  local dir = support.train_dir(8)
  local s = support.run_settings(dir, { model_config = support.tiny_model(), num_generations = 2,
    max_completion_length = 6, per_device_train_batch_size = 2, gradient_accumulation_steps = 2, max_steps = 3,
    seed = 7, beta = 0.05, dtype = "bf16", device = device, learning_rate = 1e-2 }, extra)
  profile_on()
  local ok, err = pcall(function() trainer.new(config.resolve(s), { quiet = true, signals = false }):train() end)
  local n = conversions()
  profile_off()
  assert(ok, err)
  return n
end

describe("a bf16 training run", function()
  it("converts the policy's working copy once, not once a step (cpu)", function()
    assert.are.equal(1, loop_conversions("cpu"))
  end)
  if tensor.has_cuda() then
    it("converts the policy's working copy once, not once a step (cuda)", function()
      assert.are.equal(1, loop_conversions("cuda"))
    end)
    it("converts LoRA adapters' working copy once, not once a step (cuda)", function()
      assert.are.equal(1, loop_conversions("cuda", { use_lora = true, lora_r = 2 }))
    end)
  end
end)
