-- Padding-free training (remax.step.pack, issue 38): packed rows give what padded rows give, for
-- every loss type, KL mode and estimator, with LoRA and num_iterations 2; a row's values do not
-- depend on its neighbours; a budget below the longest row is refused, naming the numbers.
local config = require("remax.settings.config")
local trainer = require("remax.run.run")
local pack = require("remax.step.pack")
local remax = require("remax")
local ffi = require("ffi")

local support = require("support")

local TINY = support.tiny_model({ hidden_size = 16, intermediate_size = 32, num_hidden_layers = 2, num_attention_heads = 2,
  num_key_value_heads = 1, max_position_embeddings = 64 })

local function new_trainer(dir, extra)
  local s = support.run_settings(dir, {
    model_config = TINY, num_generations = 3, max_completion_length = 6, per_device_train_batch_size = 2,
    gradient_accumulation_steps = 2, learning_rate = 0, max_grad_norm = 0, max_steps = 2, seed = 5, hot_reload = false,
    skip_zero_advantage = false, temperature = 1.5, dtype = "f32",   -- f32: the bounds below are f32's (auto picks bf16 where oneDNN has it)
  }, extra)
  return trainer.new(config.resolve(s, {}), { quiet = true, signals = false })
end

-- The trained tensors' gradients (the adapters' with LoRA) as one list of numbers.
local function grads_of(model)
  local out = {}
  for _, g in ipairs(model:trainable_grads()) do
    local p = ffi.cast("float*", g.data)
    for i = 0, tonumber(g.numel) - 1 do out[#out + 1] = p[i] end
  end
  return out
end

local function rel(a, b)
  local num, den = 0, 0
  assert.are.equal(#a, #b)
  for i = 1, #a do num, den = num + (a[i] - b[i]) ^ 2, den + b[i] ^ 2 end
  return math.sqrt(num / math.max(den, 1e-300))
end

-- One RL step's update on a trainer; returns the update's numbers and the gradients left.
local function step(t)
  local ro = t:rollout(t:next_batch())
  t:score(ro)
  t:advantage(ro)
  local up = t:update(ro)
  return up, grads_of(t.model), ro
end

describe("padding-free training", function()
  local dir = support.train_dir(8, { prompt_format = '{"prompt": "question %d", "answer": "%d"}' })

  it("splits rows into balanced packs under the budget, and refuses a row longer than it", function()
    local packs = pack.split({ 9, 3, 7, 5, 4, 2 }, 12)
    local seen, loads = {}, {}
    for p, idx in ipairs(packs) do
      loads[p] = 0
      for j, i in ipairs(idx) do
        seen[i] = (seen[i] or 0) + 1
        loads[p] = loads[p] + ({ 9, 3, 7, 5, 4, 2 })[i]
        if j > 1 then assert.is_true(idx[j - 1] < i, "rows in their order") end
      end
      assert.is_true(loads[p] <= 12)
    end
    for i = 1, 6 do assert.are.equal(1, seen[i], "every row in exactly one pack") end
    assert.are.equal(3, #packs, "30 tokens in packs of 12: 3")
    assert.are.same({ { 1, 2, 3 } }, pack.split({ 5, 6, 7 }, nil))
    local ok, msg = pcall(pack.split, { 4, 13, 2 }, 12, "step 3")
    assert.is_false(ok)
    assert.matches("step 3: max_tokens_per_microbatch = 12 is smaller than row 2's 13 tokens", msg, 1, true)
    assert.are.equal(0.5, pack.padding_share({ 1, 3 }) + 1 / 6)
  end)

  it("gives a row the same logprobs and entropies whatever its neighbours (packed = padded, alone)", function()
    local c = {}
    for k, v in pairs(TINY) do c[k] = v end
    c.vocab_size = 300
    local m = remax.model.new(c, { seed = 3 })
    local rows = { { 5, 9, 11, 2 }, { 7 }, { 3, 3, 3, 8, 1, 200, 4 }, { 42, 17 } }
    local lp, ent, starts = m:logprobs_packed(rows, { entropy = true })
    local plp, pent = m:logprobs(rows, nil, { entropy = true })
    local a, e = lp:totable()[1], ent:totable()[1]
    local pa, pe = plp:totable(), pent:totable()
    local worst = 0
    for r, row in ipairs(rows) do
      local alone = m:logprobs({ row }):totable()[1]
      assert.are.equal(0, a[starts[r] + 1], "a row's first token has no log-probability")
      for t = 1, #row do
        local x = a[starts[r] + t]
        worst = math.max(worst, math.abs(x - pa[r][t]), math.abs(x - alone[t]), math.abs(e[starts[r] + t] - pe[r][t]))
      end
    end
    assert.is_true(worst < 1e-5, "packed differs from padded / alone by " .. worst)
    -- the rows in another order, another grouping: the same values
    local lp2, _, st2 = m:logprobs_packed({ rows[3], rows[1] })
    local b = lp2:totable()[1]
    for t = 1, #rows[1] do assert.is_true(math.abs(b[st2[2] + t] - a[starts[1] + t]) < 1e-6) end
  end)

  it("trains packed as padded: every loss type, KL mode and estimator, LoRA, num_iterations 2", function()
    local cases = {
      { loss_type = "grpo", algo = "grpo" }, { loss_type = "bnpo", algo = "grpo" }, { loss_type = "dr_grpo", algo = "grpo" },
      { loss_type = "dapo", algo = "grpo" }, { loss_agg_mode = "seq-mean-token-sum" },
      { beta = 0.1, kl_estimator = "k3" }, { beta = 0.1, kl_estimator = "k1" },
      { use_lora = true, lora_r = 2, lora_dropout = 0, beta = 0.1 },
      { num_iterations = 2, learning_rate = 1e-3, max_grad_norm = 1.0 },
      { num_iterations = 2, importance_sampling_level = "sequence", learning_rate = 1e-3 },
      { top_entropy_quantile = 0.5, entropy_coef = 0.05 },
      { top_entropy_quantile = 0.5, entropy_coef = 0.05, loss_type = "dapo", algo = "grpo" },
    }
    local worst = 0
    for i, extra in ipairs(cases) do
      local function run(free, budget)
        local s = { run_name = ("c%d-%s-%s"):format(i, tostring(free), tostring(budget)), padding_free = free,
          max_tokens_per_microbatch = budget }
        for k, v in pairs(extra) do s[k] = v end
        return step(new_trainer(dir, s))
      end
      local up0, g0 = run(false)
      local up1, g1 = run(true)        -- one pack per micro-batch
      local up2, g2, ro = run(true, 24)  -- micro-batches split into several packs
      local longest = 0
      for _, r in ipairs(ro.rows) do longest = math.max(longest, #ro.prompt_ids[r.prompt] + #r.tokens) end
      assert.is_true(longest <= 24, "the budget holds the longest row")
      local e1, e2 = rel(g1, g0), rel(g2, g0)
      worst = math.max(worst, e1, e2)
      local label = ("case %d (%s)"):format(i, table.concat((function()
        local l = {} for k, v in pairs(extra) do l[#l + 1] = k .. "=" .. tostring(v) end return l end)(), " "))
      assert.is_true(e1 < 1e-6 and e2 < 1e-6, ("%s: gradients differ by %.3g / %.3g (relative)"):format(label, e1, e2))
      for _, k in ipairs({ "loss", "kl", "entropy", "grad_norm" }) do
        if up0[k] then
          local d = math.max(math.abs(up1[k] - up0[k]), math.abs(up2[k] - up0[k])) / math.max(math.abs(up0[k]), 1e-12)
          assert.is_true(d < 1e-5, ("%s: %s differs by %.3g"):format(label, k, d))
        end
      end
      assert.are.equal(up0.tokens_trained, up2.tokens_trained)
    end
    print(("packed = padded: worst relative gradient difference %.3g"):format(worst))
  end)

  -- docs/trainer.md (Padding-free training): packed and padded runs agree to rounding, not bit for
  -- bit. The weight gradients sum over the forward's tokens (dW += dout^T x, K = tokens) in slices
  -- of 256 that start at other tokens when padding lies between the rows, and the attention's
  -- GEMMs run on tiles of 64 queries whose shape follows the layout. On the 16-wide model the
  -- weights come out bit for bit; 256 wide (models/tiny-gsm8k's width), as measured there.
  for _, width in ipairs({ 16, 256 }) do
    it(("ends 3 steps of the default recipe's settings with the same weights packed and padded to rounding (hidden %d)"):format(width), function()
      -- recipes/gsm8k.lua's algorithm settings (ReMax, 4 samples + greedy, lr 1e-4, clipping at 1,
      -- no KL), 3 steps; docs/trainer.md states the bound measured here
      local cfg = width == 16 and TINY or support.tiny_model({ hidden_size = 256, intermediate_size = 688, num_hidden_layers = 2,
        num_attention_heads = 8, num_key_value_heads = 2, max_position_embeddings = 64 })
      local function run(free)
        local t = new_trainer(dir, { run_name = ("recipe-%d-%s"):format(width, tostring(free)), padding_free = free, algo = "remax",
          num_generations = 4, temperature = 1.0, learning_rate = 1e-4, max_grad_norm = 1.0, beta = 0, max_steps = 3,
          per_device_train_batch_size = 4, gradient_accumulation_steps = 1, model_config = cfg })
        local init = {}
        for name, p in pairs(t.model:params()) do init[name] = p:totable() end
        t:train()
        return t, init
      end
      local a, init = run(false)
      local b = run(true)
      local num, den, moved, differ = 0, 0, 0, 0
      local pa, pb = a.model:params(), b.model:params()
      for name, p in pairs(pa) do
        local x, y, w0 = p:totable(), pb[name]:totable(), init[name]
        local function walk(u, v, z)
          if type(u) == "table" then for i = 1, #u do walk(u[i], v[i], z[i]) end return end
          num, den, moved = num + (u - v) ^ 2, den + u ^ 2, moved + (u - z) ^ 2
          if u ~= v then differ = differ + 1 end
        end
        walk(x, y, w0)
      end
      local rel_w, rel_move = math.sqrt(num / den), math.sqrt(num / moved)
      print(("3 steps packed vs padded, hidden %d: weights differ by %.3g of their norm, %.3g of how far they moved (%d values)")
        :format(width, rel_w, rel_move, differ))
      assert.is_true(moved > 0, "the weights moved")
      assert.is_true(rel_w < 1e-7 and rel_move < 1e-4, ("weights differ by %.3g (%.3g of the move)"):format(rel_w, rel_move))
    end)
  end

  it("balances the step's rows over every rank's micro-batches by tokens, each keeping its normalisers", function()
    local micro = require("remax.step.micro")
    local function row(p, n, tag) local ids = {} for i = 1, p do ids[i] = 1 end local c = {} for i = 1, n do c[i] = 2 end
      return { prompt_ids = ids, completion = c, adv = 1, tag = tag } end
    -- rank 0: two micro-batches of long rows; rank 1: one of short rows (3 slots in all)
    local chunks = {
      [0] = { { rows = { row(4, 20, "a1"), row(4, 18, "a2") }, tokens = 38 + 7 }, { rows = { row(4, 16, "b1"), row(4, 14, "b2") }, tokens = 30 } },
      [1] = { { rows = { row(2, 3, "c1"), row(2, 3, "c2") }, tokens = 6 + 2 } },
    }
    local dist = require("remax.bind.dist")
    local sent = {}
    local function as_rank(rank, gather)
      local world = { size = 2, rank = rank, concat = function(_, list)
        if not gather then sent[rank] = dist.encode(list[1]); error("sent", 0) end
        return { dist.decode(sent[0]), dist.decode(sent[1]) }   -- what every rank receives
      end }
      local tr = { cfg = { padding_free = true }, top_entropy_quantile = 1, world = world }   -- remax.step.policy's trainer
      return micro.balance(tr, chunks[rank])
    end
    pcall(as_rank, 0)
    pcall(as_rank, 1)
    local out = as_rank(0, true)
    assert.are.equal(2, #out, "rank 0 keeps as many micro-batches as it had")
    local loads, where = {}, {}
    for c, ch in ipairs(out) do
      loads[c] = 0
      for _, r in ipairs(ch.rows) do loads[c] = loads[c] + #r.prompt_ids + #r.completion; where[r.tag] = r end
    end
    -- rows of 24, 22, 20, 18 tokens on rank 0 and 5, 5 on rank 1 over 3 slots, the longest first
    -- into the emptiest: {a1, c2} 29, {a2, c1} 27 (rank 0), {b1, b2} 38 (rank 1); before: 84 and 10
    assert.are.same({ 29, 27 }, loads)
    assert.is_nil(where.b1)
    assert.are.same({ tokens = 45, count = 38 }, where.a1.unit)   -- bnpo's and the entropy bonus's counts of its micro-batch
    assert.are.same({ tokens = 45, count = 38 }, where.a2.unit)
    assert.are.same({ tokens = 8, count = 6 }, where.c2.unit)     -- moved from rank 1 with rank 1's counts
    -- rank 1 computes the same assignment from the same global list: its slot holds the rest
    local back = as_rank(1, true)
    local tags = {}
    for _, r in ipairs(back[1].rows) do tags[#tags + 1] = r.tag end
    assert.are.same({ "b1", "b2" }, tags)
    assert.are.same({ tokens = 30, count = 30 }, back[1].rows[1].unit)
    -- padded, or a top-entropy mask (a quantile over a micro-batch's entropies): rows stay
    local same = micro.balance({ cfg = { padding_free = false }, top_entropy_quantile = 1, world = { size = 2 } }, chunks[0])
    assert.are.equal(chunks[0], same)
    assert.are.equal(chunks[0], micro.balance({ cfg = { padding_free = true }, top_entropy_quantile = 0.5, world = { size = 2 } }, chunks[0]))
    assert.are.same({ { 1 }, { 2 }, { 3, 4 } }, pack.assign({ 9, 5, 4, 2 }, 3))
    assert.are.same({ { 1, 4 }, { 2, 3 } }, pack.assign({ 9, 5, 4, 2 }, 2))
  end)

  it("computes the k1 KL-in-reward packed as padded", function()
    local t = new_trainer(dir, { run_name = "k1", beta = 0.2, kl_estimator = "k1", learning_rate = 1e-2, max_grad_norm = 1,
      per_device_train_batch_size = 4, gradient_accumulation_steps = 1 })
    step(t)   -- one update, so the policy is no longer the reference
    local ro = t:rollout(t:next_batch())
    t:score(ro)
    local cfg = t.cfg
    local res = {}
    local packed_calls = 0
    for _, model in ipairs({ t.model, t.stepper:load_reference() }) do
      local real = model.logprobs_packed
      model.logprobs_packed = function(...) packed_calls = packed_calls + 1; return real(...) end
    end
    local all = {}
    for k = 1, #ro.rows do all[k] = k end
    local function run(free, budget)
      cfg.padding_free, cfg.max_tokens_per_microbatch = free, budget
      local before = packed_calls
      t:advantage(ro)
      local n = packed_calls - before   -- the policy's and the reference's forwards packed: one pack each, or several
      assert.is_true((not free and n == 0) or (free and not budget and n == 2) or (budget and n > 2), ("%d packed forwards"):format(n))
      return { kl = ro.kl_k1, reward = ro.reward, lp = t.stepper.policy:row_logprobs(ro, all),
        ref = t.stepper.policy:row_logprobs(ro, all, true) }
    end
    local pad, free, budget = run(false), run(true), run(true, 24)   -- 24: one row per pack
    -- the log-probabilities within 1e-6 relative; the KL (a difference of nearly equal sums)
    -- within 1e-6 of the sum of its terms' sizes; the rewards it is folded into likewise
    local worst_lp, worst_kl, any = 0, 0, false
    for k = 1, #ro.rows do
      local scale = 0
      for tt, v in ipairs(pad.lp[k]) do
        scale = scale + math.abs(v) + math.abs(pad.ref[k][tt])
        for _, o in ipairs({ free, budget }) do
          worst_lp = math.max(worst_lp, math.abs(o.lp[k][tt] - v) / math.abs(v), math.abs(o.ref[k][tt] - pad.ref[k][tt]) / math.abs(pad.ref[k][tt]))
        end
      end
      if pad.kl[k] ~= 0 then any = true end
      for _, o in ipairs({ free, budget }) do
        worst_kl = math.max(worst_kl, math.abs(o.kl[k] - pad.kl[k]) / scale,
          math.abs(o.reward[k] - pad.reward[k]) / (cfg.beta * scale))
      end
    end
    print(("k1 KL-in-reward packed vs padded: log-probabilities %.3g relative, KL and reward %.3g of their terms"):format(worst_lp, worst_kl))
    assert.is_true(any, "the policy moved away from the reference")
    assert.is_true(worst_lp < 1e-6, ("log-probabilities packed differ from padded by %.3g"):format(worst_lp))
    assert.is_true(worst_kl < 1e-6, ("k1 KL packed differs from padded by %.3g"):format(worst_kl))
  end)

  it("scores with a reward model packed as padded", function()
    local reward_model = require("remax.step.model_reward")
    local rewards = require("remax.step.rewards")
    local cjson = require("cjson")
    local rdir = support.tmpdir()
    remax.tokenizer.write_byte_level(rdir)
    local tok = remax.tokenizer.load(rdir)
    local dec = { architectures = { "Qwen2ForCausalLM" }, vocab_size = tok.vocab_size, hidden_size = 16, intermediate_size = 24,
      num_hidden_layers = 2, num_attention_heads = 4, num_key_value_heads = 2, rms_norm_eps = 1e-6, rope_theta = 10000,
      tie_word_embeddings = false, max_position_embeddings = 256 }
    local m = remax.model.new(dec, { seed = 9, init_std = 0.3 })
    local tensors = { ["score.weight"] = remax.tensor.new({ 1, 16 }, "f32"):normal_(10, 0, 0, 0.5) }
    for name, p in pairs(m:params()) do if name ~= "lm_head.weight" then tensors[name] = p end end
    remax.safetensors.save(rdir .. "/model.safetensors", tensors, { format = "pt" })
    local c = {}
    for k, v in pairs(dec) do c[k] = v end
    c.architectures, c.id2label, c.pad_token_id = { "Qwen2ForSequenceClassification" }, { ["0"] = "LABEL_0" }, tok.pad_id
    support.write(rdir .. "/config.json", cjson.encode(c))
    local prompts = { "What is 2+2?", "x", "A longer question, with more words in it?", "q", "Hi" }
    local completions = { "4", "yy", "No, it is five.", "zz" .. tok.pad_token, "Hello there" }
    local batch = { prompt = prompts }
    -- f64: the layouts differ only in summation order (1e-12); f32: within f32's (1e-5)
    for _, case in ipairs({ { dtype = "f64", bound = 1e-12 }, { dtype = "f32", bound = 1e-5 } }) do
      local r = reward_model.reward("model:" .. rdir, { dtype = case.dtype })
      local rm = r.reward_model
      assert.is_true(rm.padding_free, "packed by default")
      local calls = { packed = 0, padded = 0 }
      rm.score_ids_packed = function(...) calls.packed = calls.packed + 1; return reward_model.RewardModel.score_ids_packed(...) end
      rm.score_ids = function(...) calls.padded = calls.padded + 1; return reward_model.RewardModel.score_ids(...) end
      local packed = rewards.run_one(r, completions, batch, { padding_free = true })
      assert.are.same({ packed = 1, padded = 0 }, calls)
      local padded = rewards.run_one(r, completions, batch, { padding_free = false })
      assert.are.same({ packed = 1, padded = 1 }, calls)
      assert.is_false(rm.padding_free, "the run's padding_free reaches the reward model")
      local rows = {}
      for i = 1, #prompts do rows[i] = rm:encode(rm:render(prompts[i], completions[i])) end
      local in_twos = rm:score_ids_packed(rows, 2)
      local worst = 0
      for i = 1, #prompts do
        worst = math.max(worst, math.abs(packed[i] - padded[i]) / math.abs(padded[i]),
          math.abs(in_twos[i] - padded[i]) / math.abs(padded[i]))
      end
      print(("reward model packed vs padded (%s): %.3g relative"):format(case.dtype, worst))
      assert.is_true(worst < case.bound, ("%s: reward model scores packed differ from padded by %.3g"):format(case.dtype, worst))
      assert.are_not.equal(packed[1], packed[2])
    end
  end)

  it("refuses a budget below the longest row, naming the setting, the length and the budget", function()
    local t = new_trainer(dir, { run_name = "tight", max_tokens_per_microbatch = 4 })
    local ok, msg = pcall(step, t)
    assert.is_false(ok)
    assert.matches("max_tokens_per_microbatch = 4 is smaller than row %d+'s %d+ tokens", tostring(msg))
  end)
end)
