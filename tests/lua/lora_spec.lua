-- LoRA from Lua: save/load round trips, merged checkpoints, the reference model with adapters
-- off, and LoRA training in the trainer (frozen base, exact resume). PEFT itself reads the
-- adapters remax writes, and remax reads the ones PEFT writes: tests/lua/hf_reference_spec.lua.
local remax = require("remax")
local cjson = require("cjson")
local ffi = require("ffi")
local lora = require("remax.bind.lora")
local model_mod = remax.model
local config = require("remax.settings.config")
local trainer = require("remax.run.run")

local support = require("support")
local tmpdir = support.tmpdir

local read = support.read

local TINY = support.tiny_model({ vocab_size = 40, hidden_size = 16, intermediate_size = 24, max_position_embeddings = 128,
  tie_word_embeddings = false })

local rows = { { 1, 5, 9, 13, 2 }, { 7, 3 }, { 30, 31, 32, 33, 34, 35 } }

local function bytes(t) return ffi.string(t.data, tonumber(t.numel) * tonumber(remax.ffi.C.rx_dtype_size(t.dtype))) end

-- B is zero at init; give it values so the adapters change the model
local function perturb(m, seed)
  local p = lora.params(m)
  for name, t in pairs(p) do
    if name:match("lora_B") then t:normal_(seed, #name * 2 ^ 32, 0, 0.3) end
  end
end

describe("lora", function()
  it("starts equal to the base, round-trips its adapters bit for bit, and refuses mismatched ones", function()
    local base = model_mod.new(TINY, { seed = 3 })
    local m = model_mod.new(TINY, { seed = 3 })
    lora.apply(m, { r = 2, alpha = 4, target_modules = { "q_proj", "v_proj", "down_proj" } })
    assert.are.equal(bytes(base:logprobs(rows)), bytes(m:logprobs(rows)))
    perturb(m, 5)
    local lp = m:logprobs(rows)
    assert.are_not.equal(bytes(base:logprobs(rows)), bytes(lp))
    local dir = tmpdir()
    m:save(dir)
    assert.is_nil(io.open(dir .. "/model.safetensors", "rb"))   -- the base stays where it is
    local again = model_mod.new(TINY, { seed = 3 })
    lora.load(again, dir)
    assert.are.equal(bytes(lp), bytes(again:logprobs(rows)))
    assert.are.same({ "down_proj", "q_proj", "v_proj" }, again.lora.target_modules)
    -- a PEFT folder loads whole (base from base_model_name_or_path) through model.load
    local base_dir = tmpdir()
    base:save(base_dir)
    local from = model_mod.load(base_dir)
    lora.apply(from, { r = 2, alpha = 4, target_modules = { "q_proj", "v_proj", "down_proj" } })
    for name, t in pairs(lora.params(m)) do lora.params(from)[name]:copy_(t) end
    local adir = tmpdir()
    from:save(adir)
    assert.are.equal(base_dir, cjson.decode(read(adir .. "/adapter_config.json")).base_model_name_or_path)
    assert.are.equal(bytes(lp), bytes(model_mod.load(adir):logprobs(rows)))
    local other = model_mod.new(TINY, { seed = 3 })
    local ok, err = pcall(lora.load, other, dir, { r = 4, alpha = 4, target_modules = { "q_proj", "v_proj", "down_proj" } })
    assert.is_false(ok)
    assert.matches("adapter_config.json: r = 2", err)
    assert.matches("lora_r = 4", err)
    local ok2, err2 = pcall(lora.apply, model_mod.new(TINY), { target_modules = { "q_proj", "qkv" } })
    assert.is_false(ok2)
    assert.matches("'qkv' is not a linear layer of this model %(valid: q_proj", err2)
    -- target_modules as PEFT saves all-linear on a small model: full module paths, read as the
    -- module names when every layer is named, refused when a layer is missing
    local cfg = cjson.decode(read(dir .. "/adapter_config.json"))
    cfg.target_modules = { "model.layers.1.self_attn.v_proj", "model.layers.0.mlp.down_proj", "model.layers.0.self_attn.q_proj",
      "model.layers.1.mlp.down_proj", "model.layers.1.self_attn.q_proj", "model.layers.0.self_attn.v_proj" }
    support.write(dir .. "/adapter_config.json", cjson.encode(cfg))
    assert.are.equal(bytes(lp), bytes(lora.load(model_mod.new(TINY, { seed = 3 }), dir):logprobs(rows)))
    table.remove(cfg.target_modules, 1)
    support.write(dir .. "/adapter_config.json", cjson.encode(cfg))
    local ok3, err3 = pcall(lora.load, model_mod.new(TINY, { seed = 3 }), dir)
    assert.is_false(ok3)
    assert.matches("target_modules names v_proj in some layers only %(not in layer 1%); remax puts adapters on every layer", err3)
  end)

  it("saves a merged full model that a plain load reproduces", function()
    local m = model_mod.new(TINY, { seed = 4, dtype = "f64" })
    lora.apply(m, { r = 3, alpha = 5, target_modules = "all-linear" })
    perturb(m, 6)
    local dir = tmpdir()
    lora.save_merged(m, dir)
    local plain = model_mod.load(dir, { dtype = "f64" })
    local a, b = m:logprobs(rows):totable(), plain:logprobs(rows):totable()
    for i = 1, #a do
      for t = 1, #a[i] do assert.is_true(math.abs(a[i][t] - b[i][t]) < 1e-12, ("row %d pos %d: %g vs %g"):format(i, t, a[i][t], b[i][t])) end
    end
    -- the merged weights differ from the base where adapters were
    assert.are_not.equal(bytes(plain:param("model.layers.0.mlp.up_proj.weight")), bytes(m:param("model.layers.0.mlp.up_proj.weight")))
    assert.are.equal(bytes(plain:param("model.norm.weight")), bytes(m:param("model.norm.weight")))
  end)

  it("gives the base model's log-probs as the reference, with no second copy, and keeps the adapters on", function()
    local base = model_mod.new(TINY, { seed = 8 })
    local m = model_mod.new(TINY, { seed = 8 })
    lora.apply(m, { r = 2, alpha = 4, target_modules = "all-linear" })
    perturb(m, 9)
    local with = bytes(m:logprobs(rows))
    local ref = lora.reference(m)
    assert.are.equal(bytes(base:logprobs(rows)), bytes(ref:logprobs(rows)))
    assert.are.equal(with, bytes(m:logprobs(rows)))
    -- trainable: the adapters only; memory: gradients for them only
    local params, grads = m:trainable()
    local n = 0
    for name, g in pairs(grads) do
      n = n + 1
      assert.is_truthy(name:match("%.lora_[AB]%.weight$"))
      assert.is_not_nil(params[name])
      assert.are.same(params[name]:size(), g:size())
    end
    assert.are.equal(2 * 2 * 7, n)
    local dl = m:logprobs(rows):totable()
    m:logprobs(rows, nil, { train = true })
    m:backward(dl)
    assert.is_true(m:memory().grads < m:memory().params / 4)
  end)

  describe("in the trainer", function()
    local MODEL = support.tiny_model()
    local function setup() return support.train_dir(24) end
    local function new_trainer(dir, extra)
      local s = support.run_settings(dir, { model_config = MODEL, num_generations = 4, max_completion_length = 10,
        per_device_train_batch_size = 4, gradient_accumulation_steps = 1, learning_rate = 2e-2, max_steps = 4, seed = 7,
        use_lora = true, lora_r = 4, lora_alpha = 8, lora_dropout = 0.1, lora_target_modules = { "all-linear" },
        beta = 0.05 }, extra)
      return trainer.new(config.resolve(s), { quiet = true, signals = false })
    end

    it("trains adapters only, takes the reference from the adapters-off model, and resumes bit for bit", function()
      local dir = setup()
      local a = new_trainer(dir, { run_name = "straight", save_merged = dir .. "/merged" })
      assert.is_true(a.stepper.policy.ref.is_lora_reference)
      local base_before = bytes(a.model:param("model.layers.0.self_attn.q_proj.weight"))
      a:train()
      assert.are.equal(base_before, bytes(a.model:param("model.layers.0.self_attn.q_proj.weight")))
      local ma = a.run:metrics()
      assert.is_true(ma[#ma].kl ~= 0, "the adapters moved the policy away from its reference")
      -- checkpoint: PEFT files, no full model
      local ckpt = a.run:latest_checkpoint()
      assert.is_not_nil(io.open(ckpt .. "/adapter_model.safetensors", "rb"))
      assert.is_nil(io.open(ckpt .. "/model.safetensors", "rb"))
      assert.is_not_nil(io.open(dir .. "/merged/model.safetensors", "rb"))

      local b = new_trainer(dir, { run_name = "split" })
      for _ = 1, 2 do b:train_step() end
      b:save_checkpoint()
      local c = new_trainer(dir, { resume = dir .. "/runs/split" })
      assert.are.equal(2, c.step)
      c:train()
      local pa, pc = lora.params(a.model), lora.params(c.model)
      for name, t in pairs(pa) do assert.is_true(bytes(t) == bytes(pc[name]), name .. " differs after resume") end
      local mc = c.run:metrics()
      assert.are.equal(ma[4].loss, mc[4].loss)
      assert.are.equal(ma[4].kl, mc[4].kl)
    end)

    it("holds less memory than full fine-tuning with its reference model (train_memory_mib)", function()
      local dir = setup()
      local full = new_trainer(dir, { run_name = "full", use_lora = false, max_steps = 1 })
      full:train()
      local lo = new_trainer(dir, { run_name = "lora", max_steps = 1 })
      lo:train()
      local mf, ml = full.run:metrics(), lo.run:metrics()
      local f, l = mf[#mf].train_memory_mib, ml[#ml].train_memory_mib
      assert.is_true(f > 0 and l > 0)
      -- the weights (and activations) are the same; gradients, moments and the reference copy are not
      local w = full.model:memory().params / 1048576
      assert.is_true(f - l > 3 * w, ("full %.3f MiB, LoRA %.3f MiB, weights %.3f MiB"):format(f, l, w))
    end)

    it("refuses a LoRA resume of a run whose checkpoint has no adapters, and save_merged without LoRA", function()
      local ok, err = pcall(config.resolve, { save_merged = "x" })
      assert.is_false(ok)
      assert.matches("save_merged needs use_lora = true", err)
      local ok2, err2 = pcall(config.resolve, { use_lora = true, lora_target_modules = { "qkv_proj" } })
      assert.is_false(ok2)
      assert.matches("lora_target_modules: 'qkv_proj' is not a linear layer", err2)
    end)
  end)
end)
