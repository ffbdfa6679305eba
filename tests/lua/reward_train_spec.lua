-- Reward-model training (algo = "reward", remax.step.reward_model): the Bradley-Terry loss and
-- its gradient against a plain reference written here, the whole model's gradient (score head
-- included) against central finite differences on a tiny f64 model, the saved folder against
-- the layout the "model:" loader accepts and the scores the training forward gave, bad
-- preference data, and short runs (full, LoRA, bf16) that learn an easy preference.
local remax = require("remax")
local cjson = require("cjson")
local config = require("remax.settings.config")
local trainer = require("remax.run.run")
local rm_step = require("remax.step.reward_model")
local prefs = require("remax.step.preferences")
local reward_model = require("remax.step.model_reward")
local tensor = remax.tensor

local support = require("support")
local tmpdir, write, error_of = support.tmpdir, support.write, support.error_of

-- A random causal LM folder (byte-level tokenizer) of the tiny shape, in dtype.
local function causal_lm(dtype, extra)
  local dir = tmpdir()
  remax.tokenizer.write_byte_level(dir)
  local tok = remax.tokenizer.load(dir)
  local c = support.tiny_model({ vocab_size = tok.vocab_size, tie_word_embeddings = false }, extra)
  local m = remax.model.new(c, { seed = 3, dtype = dtype or "f32", init_std = 0.2 })
  m:save(dir)
  return dir
end

local function settings(extra)
  local s = { algo = "reward", chat_template = "plain", eval_size = 0, save_steps = 0, log_completions = 0,
    dtype = "f32", seed = 5, max_steps = 1, per_device_train_batch_size = 2, learning_rate = 0, output_dir = tmpdir() }
  for k, v in pairs(extra or {}) do s[k] = v end
  return s
end

local function new_step(dir, extra, dtype)
  local cfg = config.resolve(settings(extra), {})
  cfg.dtype = dtype or cfg.dtype   -- f64 is the gradient checks' alone: set past the settings' checks
  local p = rm_step.load(cfg, dir, { model_opts = { dtype = cfg.dtype, device = cfg.device, seed = 5 } })
  p.opt = rm_step.optimizer(p.model, p.head, p.dhead, { lr = 0 })
  p.model_source = dir
  return rm_step.new(p, cfg), cfg
end

-- Pairs whose hidden preference is a word: "good" over "bad", with prompts.
local function pair_rows(n, opts)
  opts = opts or {}
  local rows = {}
  for i = 1, n do
    local row = { prompt = ("item %d:"):format(i), chosen = ("good %d"):format(i % 7), rejected = ("bad %d"):format(i % 5) }
    if opts.margin then row.margin = (i % 3) * 0.25 end
    rows[i] = row
  end
  return rows
end

describe("reward model training", function()
  it("computes the Bradley-Terry loss and gradient of a plain reference, margins and centring included", function()
    local chosen, rejected, margins = { 0.3, -1.2, 2.5, 0.0 }, { -0.4, 0.7, 2.5, 30.0 }, { 0.5, 0, -1, 0.2 }
    for _, coef in ipairs({ 0, 0.01 }) do
      for _, m in ipairs({ false, true }) do
        local mg = m and margins or nil
        -- the reference: the mean of log(1 + exp(-(c - r - margin))) by math.log / math.exp
        -- directly, plus coef * mean((c + r)^2)
        local function ref(c, r)
          local s = 0
          for i = 1, #c do
            local z = c[i] - r[i] - (mg and mg[i] or 0)
            s = s - math.log(1 / (1 + math.exp(-z))) + coef * (c[i] + r[i]) ^ 2
          end
          return s / #c
        end
        local loss, dc, dr, right = rm_step.bradley_terry(chosen, rejected, mg, { coef = coef })
        assert.is_true(math.abs(loss - ref(chosen, rejected)) < 1e-12)
        assert.are.equal(1, right)   -- only pair 1 has chosen above rejected
        for i = 1, #chosen do
          local h = 1e-6
          local cp, cm, rp, rmn = {}, {}, {}, {}
          for j = 1, #chosen do cp[j], cm[j], rp[j], rmn[j] = chosen[j], chosen[j], rejected[j], rejected[j] end
          cp[i], cm[i], rp[i], rmn[i] = cp[i] + h, cm[i] - h, rp[i] + h, rmn[i] - h
          assert.is_true(math.abs(dc[i] - (ref(cp, rejected) - ref(cm, rejected)) / (2 * h)) < 1e-7)
          assert.is_true(math.abs(dr[i] - (ref(chosen, rp) - ref(chosen, rmn)) / (2 * h)) < 1e-7)
        end
      end
    end
    -- a large gap does not overflow: softplus form
    local loss = rm_step.bradley_terry({ -800 }, { 800 }, nil)
    assert.is_true(math.abs(loss - 1600) < 1e-9)
  end)

  it("back-propagates the loss through the score head and every layer (finite differences, f64)", function()
    local dir = causal_lm("f64")
    local step = new_step(dir, { center_rewards_coefficient = 0.05 }, "f64")
    local rows = pair_rows(3, { margin = true })
    rows[2].rejected = "a much longer rejected answer"   -- rows of different lengths: padding
    local function loss_now()
      local ids = {}
      for i, r in ipairs(rows) do ids[i], ids[#rows + i] = step:pair_ids(r) end
      local s = step:forward(ids, false)
      local c, r, m = {}, {}, {}
      for i = 1, #rows do c[i], r[i], m[i] = s[i], s[#rows + i], rows[i].margin end
      return (rm_step.bradley_terry(c, r, m, { coef = 0.05 }))
    end
    step.model:zero_grad()
    step.dhead:fill_(0)
    local st = step:micro_step(rows, #rows)
    assert.is_true(math.abs(st.loss - loss_now()) < 1e-12)
    local checks = {
      { "score.weight", step.head, step.dhead, { 1, 3 } },
      { "embed", step.model:param("model.embed_tokens.weight"), step.model:grad("model.embed_tokens.weight"), { 104, 2 } },
      { "q_proj", step.model:param("model.layers.0.self_attn.q_proj.weight"), step.model:grad("model.layers.0.self_attn.q_proj.weight"), { 5, 7 } },
      { "down_proj", step.model:param("model.layers.1.mlp.down_proj.weight"), step.model:grad("model.layers.1.mlp.down_proj.weight"), { 3, 11 } },
      { "final norm", step.model:param("model.norm.weight"), step.model:grad("model.norm.weight"), { 4 } },
    }
    for _, c in ipairs(checks) do
      local name, p, g, at = c[1], c[2], c[3], c[4]
      local function set(v)
        local args = { unpack(at) }
        args[#args + 1] = v
        p:set(unpack(args))
      end
      local v0, h = p:get(unpack(at)), 1e-5
      set(v0 + h)
      local up = loss_now()
      set(v0 - h)
      local down = loss_now()
      set(v0)
      local fd, an = (up - down) / (2 * h), g:get(unpack(at))
      assert(math.abs(fd - an) <= 1e-7 + 1e-5 * math.abs(fd), ("%s: finite difference %.10g, backward %.10g"):format(name, fd, an))
      assert(math.abs(an) > 1e-9, name .. ": the gradient is 0, the check proves nothing")
    end
  end)

  it("saves a sequence classifier that the model: loader accepts and that scores what training scored", function()
    local dir = causal_lm("f32")
    local step = new_step(dir)
    local rows = pair_rows(3)
    local ids, prompts, completions = {}, {}, {}
    for i, r in ipairs(rows) do
      ids[2 * i - 1], ids[2 * i] = step:pair_ids(r)
      prompts[2 * i - 1], prompts[2 * i], completions[2 * i - 1], completions[2 * i] = r.prompt, r.prompt, r.chosen, r.rejected
    end
    local trained = step:forward(ids, true)
    local out = tmpdir() .. "/rm"
    step:save(out)
    -- transformers' layout, read from the files themselves
    local cfg = cjson.decode(support.read(out .. "/config.json"))
    assert.are.same({ "Qwen2ForSequenceClassification" }, cfg.architectures)
    assert.are.equal(1, cfg.num_labels)
    assert.are.equal("LABEL_0", cfg.id2label["0"])
    assert.is_number(cfg.pad_token_id)
    local st = remax.safetensors.open(out)
    assert.are.same({ 1, 32 }, st:info("score.weight").shape)
    assert.is_false(st:has("lm_head.weight"))
    assert.is_false(st:has("score.bias"))
    st:close()
    -- loaded back as a reward and scored through its own path (render, encode, batch)
    local rm = reward_model.load(out)
    local scored = rm:score(prompts, completions, #completions)
    for k = 1, #ids do assert.are.equal(trained[k], scored[k]) end
    -- and it trains on from the classifier (its head kept)
    local again = new_step(out)
    local s2 = again:forward(ids, false)
    for k = 1, #ids do assert.are.equal(trained[k], s2[k]) end
  end)

  it("stops on bad preference data naming the file, line and column", function()
    local dir = tmpdir()
    local function bad(lines)
      local path = dir .. "/p.jsonl"
      write(path, table.concat(lines, "\n") .. "\n")
      return error_of(prefs.load, path)
    end
    local ok_line = '{"chosen": "yes", "rejected": "no"}'
    local e = bad({ ok_line, '{"chosen": "yes"}' })
    assert.truthy(e:find(dir .. "/p.jsonl:2: missing column 'rejected'", 1, true))
    e = bad({ ok_line, ok_line, '{"chosen": "  ", "rejected": "no"}' })
    assert.truthy(e:find("p.jsonl:3: column 'chosen' is only white space", 1, true))
    e = bad({ '{"chosen": "same", "rejected": "same"}' })
    assert.truthy(e:find("p.jsonl:1: columns 'chosen' and 'rejected' are identical", 1, true))
    e = bad({ '{"chosen": "a", "rejected": "b", "margin": "1.5"}' })
    assert.truthy(e:find("p.jsonl:1: column 'margin' is the string \"1.5\", expected a finite number", 1, true))
    e = bad({ '{"chosen": [{"role": "assistant", "content": ""}], "rejected": [{"role": "assistant", "content": "x"}]}' })
    assert.truthy(e:find("p.jsonl:1: column 'chosen': every message's content is empty", 1, true))
    e = bad({ '{"chosen": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}], ' ..
      '"rejected": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}' })
    assert.truthy(e:find("p.jsonl:1: columns 'chosen' and 'rejected' are identical", 1, true))
    -- mapped columns are named as mapped
    write(dir .. "/q.jsonl", '{"good": "a", "worse": "a"}\n')
    e = error_of(prefs.load, dir .. "/q.jsonl", { chosen = "good", rejected = "worse" })
    assert.truthy(e:find("q.jsonl:1: columns 'good' and 'worse' are identical", 1, true))
    -- conversational pairs with a shared prompt load
    write(dir .. "/c.jsonl", '{"prompt": [{"role": "user", "content": "q"}], "chosen": [{"role": "assistant", "content": "a"}], '
      .. '"rejected": [{"role": "assistant", "content": "b"}], "margin": 2}\n')
    local ds = prefs.load(dir .. "/c.jsonl")
    assert.are.equal(2, ds.rows[1].margin)
  end)

  it("leaves out pairs too long for the model, said at the start, instead of stopping at the step that draws one", function()
    local dir = causal_lm("f32")   -- max_position_embeddings = 256, one token per byte
    local data = tmpdir() .. "/pairs.jsonl"
    local lines = {}
    for i, r in ipairs(pair_rows(5)) do
      if i == 3 then r.chosen = ("long "):rep(80) end   -- 400 tokens
      lines[i] = cjson.encode(r)
    end
    write(data, table.concat(lines, "\n") .. "\n")
    local cfg = config.resolve(settings({ model = dir, data = data, max_steps = 3 }), {})
    local p = require("remax.run.setup").pieces(cfg, { world = require("remax.bind.dist").world(), prompts_per_step = 2 })
    assert.are.equal(4, #p.train_ds.rows)
    assert.are.equal(1, #p.notes)
    assert.truthy(p.notes[1]:find(("note: 1 of 5 preference pairs of %s are longer than the model's max_position_embeddings = 256 "
      .. "tokens and are left out, as TRL's RewardTrainer leaves out pairs past max_length (the first: %s:3: column 'chosen' is ")
      :format(data, data), 1, true), p.notes[1])
    -- three steps of two pairs draw every row: the run goes through
    local t = trainer.new(cfg, { quiet = true, signals = false })
    assert.are.equal(3, t:train().step)
    -- no pair that fits: refused at the start
    write(data, cjson.encode({ chosen = ("x"):rep(300), rejected = "no" }) .. "\n")
    local e = error_of(trainer.new, config.resolve(settings({ model = dir, data = data }), {}), { quiet = true, signals = false })
    assert.truthy(e:find(("every preference pair of %s is longer than the model's max_position_embeddings = 256 tokens (the first: %s:1: column 'chosen' is ")
      :format(data, data), 1, true), e)
  end)

  local function run_learns(extra)
    local dir = causal_lm("f32")
    local data = tmpdir() .. "/pairs.jsonl"
    local lines = {}
    for i, r in ipairs(pair_rows(48)) do lines[i] = cjson.encode(r) end
    write(data, table.concat(lines, "\n") .. "\n")
    local out = tmpdir() .. "/final"
    local s = settings({ model = dir, data = data, eval_data = data, eval_size = 16, max_steps = 12, learning_rate = 3e-3,
      per_device_train_batch_size = 4, gradient_accumulation_steps = 2, eval_steps = 6, save_final_model = out })
    for k, v in pairs(extra or {}) do s[k] = v end
    local t = trainer.new(config.resolve(s, {}), { quiet = true, signals = false })
    local res = t:train()
    local lines_out = {}
    for l in io.lines(res.run_dir .. "/metrics.jsonl") do lines_out[#lines_out + 1] = cjson.decode(l) end
    local last = lines_out[#lines_out]
    assert.is_number(last.eval_accuracy)
    assert.is_number(last.eval_margin)
    assert.is_number(lines_out[2].accuracy)
    assert.is_number(lines_out[2].margin)
    assert.is_true(res.after.accuracy >= 0.9, ("held-out pair accuracy %.2f"):format(res.after.accuracy))
    assert.is_true(res.after.margin > 0)
    assert.is_true(require("remax.bind.fs").exists(res.run_dir .. "/pairs.svg"))
    -- the final folder is a "model:" reward that prefers the chosen side
    local r = require("remax.step.rewards").load_all({ "model:" .. out }, {})[1]
    local sc = r.fn({ "good 3", "bad 3" }, { prompt = { "item 3:", "item 3:" } })
    assert.is_true(sc[1] > sc[2])
    return res
  end

  it("learns an easy preference in a short run and saves a model: reward", function()
    run_learns()
  end)

  it("learns with LoRA adapters (the head trains too) and saves them merged", function()
    run_learns({ use_lora = true, lora_r = 4, lora_alpha = 8, lora_dropout = 0, lora_target_modules = { "all-linear" },
      learning_rate = 1e-2 })
  end)

  it("learns in bf16", function()
    run_learns({ dtype = "bf16" })
  end)

  it("resumes from a checkpoint to the same weights and head as a run straight through (full and LoRA)", function()
    for _, lora in ipairs({ false, true }) do
      local dir = causal_lm("f32")
      local data = tmpdir() .. "/pairs.jsonl"
      local lines = {}
      for i, r in ipairs(pair_rows(24)) do lines[i] = cjson.encode(r) end
      write(data, table.concat(lines, "\n") .. "\n")
      local out = tmpdir()
      local function s(name, steps)
        return settings({ model = dir, data = data, max_steps = steps, learning_rate = 3e-3, output_dir = out,
          run_name = name, per_device_train_batch_size = 2, gradient_accumulation_steps = 2, use_lora = lora,
          lora_r = 2, lora_alpha = 4, lora_dropout = 0, lora_target_modules = { "q_proj" } })
      end
      local a = trainer.new(config.resolve(s("a", 4), {}), { quiet = true, signals = false })
      a:train()
      local b = trainer.new(config.resolve(s("b", 2), {}), { quiet = true, signals = false })
      b:train()   -- saves its checkpoint at the end
      local cfg = require("remax.run.resume").resolve(s("b", 2), { resume = out .. "/b", max_steps = 4 })
      local r = trainer.new(cfg, { quiet = true, signals = false })
      assert.are.equal(2, r.step)
      r:train()
      assert.are.same(a.stepper.head:values(), r.stepper.head:values())
      local pa, pr = a.model:trainable(), r.model:trainable()
      for name, t in pairs(pa) do assert.are.same(t:values(), pr[name]:values(), name) end
    end
  end)

  -- REMAX_LIB=build-emu/libremax.so busted --lua=luajit --filter=cuda tests/lua/reward_train_spec.lua
  if tensor.has_cuda() then
    it("on cuda computes the scores and gradients of the cpu (f32), and a bf16 run learns", function()
      local dir = causal_lm("f32")
      local rows = pair_rows(3, { margin = true })
      rows[1].chosen = "a longer chosen answer"
      local function grads(device)
        local step = new_step(dir, { device = device, center_rewards_coefficient = 0.1 })
        step.model:zero_grad()
        step.dhead:fill_(0)
        local st = step:micro_step(rows, #rows)
        local out = { loss = st.loss, head = step.dhead:totable()[1] }
        for _, name in ipairs({ "model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight", "model.norm.weight" }) do
          out[name] = step.model:grad(name):to("cpu"):values()
        end
        return out
      end
      local cpu, gpu = grads("cpu"), grads("cuda")
      assert.is_true(math.abs(cpu.loss - gpu.loss) < 1e-5)
      for k, v in pairs(cpu) do
        if type(v) == "table" then
          local scale, diff = 1e-8, 0
          for i = 1, #v do scale, diff = math.max(scale, math.abs(v[i])), math.max(diff, math.abs(v[i] - gpu[k][i])) end
          assert(diff <= 1e-4 * scale, ("%s: cuda differs from cpu by %g (scale %g)"):format(k, diff, scale))
        end
      end
      run_learns({ device = "cuda", dtype = "bf16" })
    end)
  end
end)
