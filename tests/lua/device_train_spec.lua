-- The training step on device "cuda": a GPU, or in CI the CPU emulation of CUDA (docs/gpu.md):
--   REMAX_LIB=build-emu/libremax.so busted --lua=luajit --filter=cuda tests/lua/device_train_spec.lua
-- (./remax test runs it that way when build-emu exists). Rollouts come from the CPU copy of the
-- weights until generation runs on the device; everything else of the step runs on "cuda".
local config = require("remax.settings.config")
local trainer = require("remax.run.run")
local tensor = require("remax.bind.tensor")
local ffi = require("ffi")
local support = require("support")

if not tensor.has_cuda() then
  describe("training on cuda", function()
    pending("skipped: no CUDA device in this build (run these against the emulator build, build-emu)")
  end)
  return
end

local function setup() return support.train_dir(8) end

-- KL to a reference (beta > 0), two micro-batches (accumulation), clipping, weight decay and a
-- schedule: every part of the update runs. No attention biases: the k_proj bias has an exactly
-- zero gradient (it shifts every score of a query alike, which softmax ignores), so AdamW steps
-- it by rounding noise scaled up to the learning rate, which no two devices share. AdamW divides
-- each gradient element by its own scale, so where a gradient is close to zero (q and k at init,
-- while attention is near uniform) the devices' different summation orders become a relative
-- difference of the step itself: learning_rate 1e-3 keeps three steps' drift near 2e-6 (at
-- 1e-2, q and k reach 1e-5).
local function settings(dir, extra)
  return support.run_settings(dir, {
    model_config = support.tiny_model({ num_hidden_layers = 1, attention_bias = false }), num_generations = 2,
    max_completion_length = 6, per_device_train_batch_size = 1, gradient_accumulation_steps = 2, learning_rate = 1e-3,
    max_steps = 3, seed = 7, beta = 0.05,
    dtype = "f32",   -- the cpu side in f32 whatever the CPU (auto may pick bf16): compared with cuda's
    weight_decay = 0.01, max_grad_norm = 0.5, lr_scheduler_type = "cosine", warmup_ratio = 0.34,
  }, extra)
end

local function new_trainer(dir, extra)
  return trainer.new(config.resolve(settings(dir, extra)), { quiet = true, signals = false })
end

-- Two runs of the same settings: one straight through max_steps ("straight"), one that stops
-- after `split` steps, saves a checkpoint and is resumed to the end ("split"). Returns the
-- straight trainer and the resumed one (after its own train()), and the step it resumed at.
local function straight_and_resumed(dir, extra, split)
  local s = {}
  for k, v in pairs(extra) do s[k] = v end
  s.run_name = "straight"
  local a = new_trainer(dir, s)
  a:train()
  s.run_name = "split"
  local b = new_trainer(dir, s)
  for _ = 1, split do b:train_step() end
  b:save_checkpoint()
  s.run_name, s.resume = nil, dir .. "/runs/split"
  local c = new_trainer(dir, s)
  local resumed_at = c.step
  c:train()
  return a, c, resumed_at
end

-- name -> host copy of each parameter
local function host_params(model)
  local out = {}
  for name, p in pairs(model:params()) do out[name] = p:to("cpu") end
  return out
end

local function bytes(t) return ffi.string(t.data, tonumber(t.numel) * 4) end

-- Squared L2 norms over tables name -> host f32 tensor of what two runs' steps from `start`
-- differ by (a - b) and of what run a's steps changed (a - start): sqrt(d2 / n2) is the
-- relative L2 of the change.
local function change_norms(start, a, b)
  local d2, n2 = 0, 0
  for name, t in pairs(a) do
    local va, vb, vs = ffi.cast("float*", t.data), ffi.cast("float*", b[name].data), ffi.cast("float*", start[name].data)
    for i = 0, tonumber(t.numel) - 1 do
      d2 = d2 + (va[i] - vb[i]) ^ 2
      n2 = n2 + (va[i] - vs[i]) ^ 2
    end
  end
  return d2, n2
end

describe("training on cuda", function()
  it("cuda: three f32 steps equal three on the cpu within 1e-5 relative on every weight", function()
    local dir = setup()
    local cpu = new_trainer(dir, { run_name = "cpu", device = "cpu" })
    local gpu = new_trainer(dir, { run_name = "cuda", device = "cuda" })
    assert.are.equal("cuda", gpu.model:device_name())
    assert.are.equal("cuda", gpu.stepper.policy.ref:device_name())
    for _, name in ipairs(gpu.stepper.policy.opt.names) do
      assert.are.equal("cuda", gpu.stepper.policy.opt.m[name]:device_name())
      assert.are.equal("cuda", gpu.stepper.policy.opt.v[name]:device_name())
    end
    -- AdamW over the flat buffers: the moments in two device buffers, two update launches
    -- (matrices with weight decay, norms and biases without) and one clip
    assert.are.equal("cuda", gpu.stepper.policy.opt.m_flat:device_name())
    assert.are.equal(2, #gpu.stepper.policy.opt.runs)
    local start = host_params(cpu.model)
    for step = 1, 3 do
      local mc, mg = cpu:train_step(), gpu:train_step()
      -- the same rollouts (generated from the same weights) and nearly the same update
      assert.are.equal(mc.reward, mg.reward, "step " .. step .. ": reward")
      assert.is_true(math.abs(mc.loss - mg.loss) <= 1e-5 * math.max(1, math.abs(mc.loss)),
        ("step %d: loss %.9g on cpu, %.9g on cuda"):format(step, mc.loss, mg.loss))
    end
    local pc, pg = host_params(cpu.model), host_params(gpu.model)
    local moved = 0
    for name, a in pairs(pc) do
      local b, s = pg[name], start[name]
      local va, vb, vs = ffi.cast("float*", a.data), ffi.cast("float*", b.data), ffi.cast("float*", s.data)
      local diff, scale = 0, 0
      for i = 0, tonumber(a.numel) - 1 do
        diff = math.max(diff, math.abs(va[i] - vb[i]))
        scale = math.max(scale, math.abs(va[i]))
        if va[i] ~= vs[i] then moved = moved + 1 end
      end
      assert.is_true(diff <= 1e-5 * scale, ("%s: max |cpu - cuda| = %.3g, max |cpu| = %.3g"):format(name, diff, scale))
    end
    assert.is_true(moved > 0, "the steps changed no weight")
  end)

  it("cuda: a LoRA run resumed on the device is bit-identical to an uninterrupted one", function()
    local dir = setup()
    local a, c, resumed_at = straight_and_resumed(dir, { device = "cuda", max_steps = 2, use_lora = true, lora_r = 2 }, 1)
    assert.are.equal(1, resumed_at)
    local pa, pc = a.model:trainable(), c.model:trainable()
    for name, t in pairs(pa) do
      assert.is_true(bytes(t:to("cpu")) == bytes(pc[name]:to("cpu")), "adapter " .. name .. " differs after resume")
    end
  end)

  it("cuda: a resume on the device is bit-identical to an uninterrupted run", function()
    local dir = setup()
    local a, c, resumed_at = straight_and_resumed(dir, { device = "cuda", max_steps = 4 }, 2)
    assert.are.equal(2, resumed_at)
    assert.are.equal("cuda", c.model:device_name())
    assert.are.equal(4, c.step)
    local pa, pc = host_params(a.model), host_params(c.model)
    for name, t in pairs(pa) do
      assert.is_true(bytes(t) == bytes(pc[name]), "parameter " .. name .. " differs after resume")
    end
    local sa, sc = a.stepper.policy.opt:state(), c.stepper.policy.opt:state()
    assert.are.equal(sa.step, sc.step)
    for name, t in pairs(sa.tensors) do
      assert.is_true(bytes(t:to("cpu")) == bytes(sc.tensors[name]:to("cpu")), "optimizer state " .. name .. " differs")
    end
    local ma, mc = a.run:metrics(), c.run:metrics()
    assert.are.equal(ma[4].loss, mc[4].loss)
    -- device memory is reported: at least the policy's weights and AdamW's two moments
    local m = c.model:memory()
    assert.is_true(ma[4].peak_device_memory_mib * 1048576 >= m.params * 3, "peak_device_memory_mib")
  end)

  it("cuda: three bf16 SFT steps move the weights as f32 steps on the cpu do (relative L2 of the change <= 3e-2)", function()
    -- SFT: no rollouts, so both devices train on the same rows; the comparison is of what the
    -- steps changed (start -> after), bf16's rounding of activations against f32 on the cpu
    local dir = setup()
    local extra = { algo = "sft", beta = 0, max_grad_norm = 0, learning_rate = 1e-3 }
    extra.run_name = "cpu"
    local cpu = new_trainer(dir, extra)
    extra.run_name, extra.device, extra.dtype = "bf16", "cuda", "bf16"
    local gpu = new_trainer(dir, extra)
    assert.are.equal(tonumber(require("remax.bind.ffi").C.RX_BF16), tonumber(gpu.model:cfg().dtype))
    local start = host_params(cpu.model)
    for _ = 1, 3 do
      local mc, mg = cpu:train_step(), gpu:train_step()
      assert.is_true(math.abs(mc.loss - mg.loss) <= 3e-2 * math.abs(mc.loss), ("loss %.6g on cpu, %.6g bf16"):format(mc.loss, mg.loss))
    end
    local d2, n2 = change_norms(start, host_params(cpu.model), host_params(gpu.model))
    assert.is_true(n2 > 0, "the steps changed no weight")
    assert.is_true(math.sqrt(d2 / n2) <= 3e-2, ("relative L2 of the change: %.3g"):format(math.sqrt(d2 / n2)))
  end)

  it("cuda: a bf16 run's KL reference is a frozen bf16 model, and trains as one whose reference keeps f32 masters", function()
    local dir = setup()
    local extra = { device = "cuda", dtype = "bf16", max_steps = 2, beta = 0.1, run_name = "frozen" }
    local a = new_trainer(dir, extra)
    extra.run_name, extra.frozen_dtype = "masters", "f32"
    local b = new_trainer(dir, extra)
    assert.are.equal("bf16", a.stepper.policy.ref:weight_dtype())   -- every weight in bf16 alone
    assert.are.equal("f32", b.stepper.policy.ref:weight_dtype())    -- f32 masters and a bf16 working copy
    local ma, mb, mp = a.stepper.policy.ref:memory(), b.stepper.policy.ref:memory(), a.model:memory()
    assert.are.equal(0, ma.grads)
    assert.is_true(3 * ma.params <= mb.params + 64 * 3 * #a.model.names, ("frozen %d bytes, with masters %d"):format(ma.params, mb.params))
    assert.is_true(3 * ma.params <= mp.params + 64 * 3 * #a.model.names)
    for step = 1, 2 do
      local sa, sb = a:train_step(), b:train_step()
      -- the frozen weights are the masters' working copy: the same log-probabilities, bit for bit
      assert.are.equal(sb.kl, sa.kl, "step " .. step .. ": kl")
      assert.are.equal(sb.loss, sa.loss, "step " .. step .. ": loss")
      if step == 1 then assert.is_true(math.abs(sa.kl) < 1e-6, "kl " .. sa.kl .. " before the first update") end
    end
    local pa, pb = host_params(a.model), host_params(b.model)
    for name, t in pairs(pa) do assert.is_true(bytes(t) == bytes(pb[name]), name) end
  end)

  it("cuda: a device model generates the cpu's tokens, greedy and sampled, after its weights change", function()
    local model = require("remax.bind.model")
    local cfg = support.tiny_model({ vocab_size = 64 })
    local g, c = model.new(cfg, { device = "cuda", seed = 3 }), model.new(cfg, { device = "cpu", seed = 3 })
    local prompts, opts = { { 1, 2, 3 }, { 9, 8 } }, { max_new_tokens = 6, temperature = { 0, 1.0 }, seed = 5 }
    local function same()
      local a, b = g:generate(prompts, opts), c:generate(prompts, opts)
      for i, row in ipairs(a.rows) do
        assert.are.same(b.rows[i].tokens, row.tokens, "row " .. i)
      end
    end
    same()
    -- a changed weight (an optimizer step) reaches the next generation
    for _, m in ipairs({ g, c }) do m:param("model.norm.weight"):fill_(3) end
    same()
  end)

  it("cuda: a reward model on the device scores as on the cpu, also as a trainer's reward", function()
    local remax = require("remax")
    local dir = support.tmpdir()
    remax.tokenizer.write_byte_level(dir)
    local tok = remax.tokenizer.load(dir)
    local dec = support.tiny_model({ vocab_size = tok.vocab_size, tie_word_embeddings = false })
    local m = remax.model.new(dec, { seed = 4, init_std = 0.3 })
    local tensors = { ["score.weight"] = tensor.new({ 1, dec.hidden_size }, "f32"):normal_(5, 0, 0, 0.5) }
    for name, p in pairs(m:params()) do if name ~= "lm_head.weight" then tensors[name] = p end end
    remax.safetensors.save(dir .. "/model.safetensors", tensors, { format = "pt" })
    local cfg = {}
    for k, v in pairs(dec) do cfg[k] = v end
    cfg.architectures, cfg.id2label, cfg.pad_token_id = { "Qwen2ForSequenceClassification" }, { ["0"] = "LABEL_0" }, tok.pad_id
    support.write(dir .. "/config.json", require("cjson").encode(cfg))
    local reward_model = require("remax.step.model_reward")
    local on_cpu, on_gpu = reward_model.load(dir), reward_model.load(dir, { device = "cuda" })
    assert.are.equal("cuda", on_gpu.model:device_name())
    local prompts, completions = { "2+2?", "a longer question, 3+5?" }, { "4", "eight" }
    local a, b = on_cpu:score(prompts, completions), on_gpu:score(prompts, completions)
    for i = 1, 2 do assert.is_true(math.abs(a[i] - b[i]) <= 1e-5 * math.max(1, math.abs(a[i])), ("row %d: %g, %g"):format(i, a[i], b[i])) end
    -- under bf16 a frozen bf16 decoder (bf16 weights alone), the score head in f32
    local on_bf16 = reward_model.load(dir, { device = "cuda", dtype = "bf16" })
    assert.are.equal("bf16", on_bf16.model:weight_dtype())
    assert.are.equal(0, on_bf16.model:memory().grads)
    local c = on_bf16:score(prompts, completions)
    -- the same bits as a bf16 decoder with f32 masters (its working copy is these weights)
    local d = reward_model.load(dir, { device = "cuda", dtype = "bf16", weight_dtype = "f32" }):score(prompts, completions)
    assert.are.same(d, c)
    -- near the cpu's: a score is a dot product over hidden 32 with head weights ~ N(0, 0.5), so its
    -- scale is about 2.8 while these scores are ~0.2; bf16's ~1% error on the hidden state is ~0.03
    for i = 1, 2 do assert.is_true(math.abs(a[i] - c[i]) <= 0.1, ("bf16 row %d: %g, %g"):format(i, a[i], c[i])) end
    -- a run on cuda loads its reward models there
    local data = setup()
    local t = new_trainer(data, { device = "cuda", rewards = { { model = dir, name = "rm" } }, beta = 0 })
    assert.are.equal("cuda", t.stepper:reward_functions()[1].reward_model.model:device_name())
    local tb = new_trainer(data, { device = "cuda", dtype = "bf16", rewards = { { model = dir, name = "rm" } }, beta = 0,
      run_name = "bf16" })
    assert.are.equal("bf16", tb.stepper:reward_functions()[1].reward_model.model:weight_dtype())
  end)

  it("cuda: LoRA on the device (dropout included) equals LoRA on the cpu (A within 1e-5, B within 1e-4 relative)", function()
    local dir = setup()
    local extra = { use_lora = true, lora_r = 4, lora_dropout = 0.1, lora_target_modules = { "all-linear" },
      learning_rate = 1e-3 }
    extra.run_name = "cpu"
    local cpu = new_trainer(dir, extra)
    extra.run_name, extra.device = "cuda", "cuda"
    local gpu = new_trainer(dir, extra)
    assert.are.equal("cuda", gpu.model:device_name())
    for step = 1, 3 do
      local mc, mg = cpu:train_step(), gpu:train_step()
      assert.are.equal(mc.reward, mg.reward, "step " .. step .. ": reward")
    end
    local pc, pg = cpu.model:trainable(), gpu.model:trainable()
    local n, moved = 0, 0
    for name, t in pairs(pc) do
      local a, b = t:to("cpu"), pg[name]:to("cpu")
      assert.are.equal("cuda", pg[name]:device_name())
      local va, vb = ffi.cast("float*", a.data), ffi.cast("float*", b.data)
      local diff, scale = 0, 0
      for i = 0, tonumber(a.numel) - 1 do
        diff, scale = math.max(diff, math.abs(va[i] - vb[i])), math.max(scale, math.abs(va[i]))
      end
      if name:match("lora_B") and scale > 0 then moved = moved + 1 end
      -- B starts at 0: after 3 steps it is 3 AdamW steps, each element divided by its own
      -- gradient scale, which lifts the devices' rounding in near-zero gradient elements (seen
      -- <= 3e-5); A starts random and moves little (seen <= 3e-7)
      local tol = name:match("lora_B") and 1e-4 or 1e-5
      assert.is_true(diff <= tol * scale, ("%s: max |cpu - cuda| = %.3g, max |cpu| = %.3g"):format(name, diff, scale))
      n = n + 1
    end
    assert.is_true(n > 0 and moved > 0, "no adapter trained")
  end)

  it("cuda: LoRA under bf16 on a frozen bf16 base moves the adapters as f32 LoRA on the cpu does, and resumes bit for bit", function()
    -- SFT: both devices train on the same rows; dropout on (the device draws the cpu's masks)
    local dir = setup()
    local extra = { algo = "sft", beta = 0, max_grad_norm = 0, learning_rate = 1e-3, use_lora = true, lora_r = 4,
      lora_dropout = 0.1, lora_target_modules = { "all-linear" }, run_name = "cpu" }
    local cpu = new_trainer(dir, extra)
    extra.run_name, extra.device, extra.dtype = "bf16", "cuda", "bf16"
    local gpu = new_trainer(dir, extra)
    assert.are.equal("bf16", gpu.model:weight_dtype())   -- the base: bf16 weights alone
    local pg = gpu.model:trainable()
    for _, t in pairs(pg) do assert.are.equal("f32", t:dtype_name()) end   -- the adapters' masters
    local start = {}
    for name, t in pairs(cpu.model:trainable()) do start[name] = t:to("cpu") end
    for _ = 1, 3 do
      local mc, mg = cpu:train_step(), gpu:train_step()
      assert.is_true(math.abs(mc.loss - mg.loss) <= 1e-2 * math.abs(mc.loss), ("loss %.6g on cpu, %.6g bf16"):format(mc.loss, mg.loss))
    end
    local pc, pg_host = {}, {}
    for name, t in pairs(cpu.model:trainable()) do pc[name], pg_host[name] = t:to("cpu"), pg[name]:to("cpu") end
    local d2, n2 = change_norms(start, pc, pg_host)
    assert.is_true(n2 > 0, "the steps changed no adapter")
    -- seen 6e-2 (f32 LoRA on cuda: 2e-6): AdamW divides each element by its own gradient scale,
    -- so bf16's rounding in small gradient elements (A's, which grow from B = 0) becomes a
    -- relative difference of the step itself; the losses agree within 1e-4
    assert.is_true(math.sqrt(d2 / n2) <= 1e-1, ("relative L2 of the change: %.3g"):format(math.sqrt(d2 / n2)))
    -- a resume: two steps straight equal one, a checkpoint, and one more
    local a, c = straight_and_resumed(dir, { algo = "sft", beta = 0, device = "cuda", dtype = "bf16", use_lora = true,
      lora_r = 2, lora_dropout = 0.1, max_steps = 2 }, 1)
    local pa, pc = a.model:trainable(), c.model:trainable()
    for name, t in pairs(pa) do
      assert.is_true(bytes(t:to("cpu")) == bytes(pc[name]:to("cpu")), "adapter " .. name .. " differs after resume")
    end
  end)
end)
