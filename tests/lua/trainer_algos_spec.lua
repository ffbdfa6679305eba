-- The algorithm settings through the trainer, on a tiny random model with short completions:
-- estimators, loss aggregations and TRL's loss types, k1, num_iterations, reward handling,
-- micro-batches of whole prompts, evaluation, `remax eval`, hot reload of beta, plots.
local config = require("remax.settings.config")
local trainer = require("remax.run.run")
local algos = require("remax.step.algos")
local cli = require("remax.cli.main")
local ffi = require("ffi")

local support = require("support")
local write = support.write

local function exists(path)
  local f = io.open(path, "rb")
  if f then f:close() end
  return f ~= nil
end

local TINY = support.tiny_model({ hidden_size = 16, intermediate_size = 32, num_hidden_layers = 1, num_attention_heads = 2,
  num_key_value_heads = 2, max_position_embeddings = 64 })

local function setup() return support.train_dir(16, { prompt_format = '{"prompt": "q %d", "answer": "%d"}' }) end

local function settings(dir, extra)
  return support.run_settings(dir, {
    model_config = TINY, num_generations = 3, max_completion_length = 5, per_device_train_batch_size = 2,
    gradient_accumulation_steps = 2, learning_rate = 1e-2, max_steps = 2, seed = 11, hot_reload = false,
  }, extra)
end

local function new_trainer(dir, extra)
  return trainer.new(config.resolve(settings(dir, extra), {}), { quiet = true, signals = false })
end

-- One RL step by its pieces; returns the rollout and the update's numbers.
local function step_pieces(t)
  local ro = t:rollout(t:next_batch())
  t:score(ro)
  t:advantage(ro)
  local up = t:update(ro)
  return ro, up
end

local function grads_copy(model)
  local out = {}
  for name, g in pairs(model:grads()) do
    local p = ffi.cast("float*", g.data)
    local v = {}
    for i = 0, tonumber(g.numel) - 1 do v[i + 1] = p[i] end
    out[name] = v
  end
  return out
end

local function max_rel_diff(a, b)
  local worst = 0
  for name, va in pairs(a) do
    local vb = b[name]
    for i = 1, #va do
      local d = math.abs(va[i] - vb[i]) / math.max(1e-6, math.abs(va[i]), math.abs(vb[i]))
      if d > worst then worst = d end
    end
  end
  return worst
end

-- The rewards of the rollout's sampled rows grouped by prompt, read from the rows themselves.
local function groups_of(ro, reward)
  local groups = {}
  for k, r in ipairs(ro.rows) do
    groups[r.prompt] = groups[r.prompt] or { samples = {} }
    if r.greedy then groups[r.prompt].greedy = reward[k] else groups[r.prompt].samples[r.slot] = reward[k] end
  end
  return groups
end

describe("trainer algorithms", function()
  it("gives each estimator's advantages to the right rows (remax, grpo, rloo, reinforce)", function()
    local dir = setup()
    for _, algo in ipairs({ "remax", "grpo", "rloo", "reinforce" }) do
      local t = new_trainer(dir, { algo = algo, run_name = algo })
      local before = t.stepper.baseline_state
      local ro, up = step_pieces(t)
      local want = algos.advantages(algo, groups_of(ro, ro.total), { baseline = "mean", momentum = 0.9 }, before)
      assert.are.same(want, ro.adv, algo)
      assert.is_true(up.finite, algo)
      local m = t:rl_metrics(ro, up)
      assert.is_number(m.entropy, algo)
      assert.is_true(m.entropy > 0, algo .. ": a random model's entropy is positive")
    end
  end)

  it("trains micro-batches of whole prompts: every row's advantage belongs to its own prompt", function()
    local dir = setup()
    local t = new_trainer(dir, { skip_zero_advantage = false, per_device_train_batch_size = 1,
      gradient_accumulation_steps = 4 })
    local ro = t:rollout(t:next_batch())
    t:score(ro)
    t:advantage(ro)
    local seen, chunks = {}, 0
    local real = t.stepper.policy.micro_step
    t.stepper.policy.micro_step = function(self, tr, rows, totals, chunk)
      chunks = chunks + 1
      for _, row in ipairs(rows) do
        local r = ro.rows[row.key]
        assert.are.equal(r.prompt, row.prompt)
        assert.is_falsy(r.greedy)
        assert.are.equal(ro.adv[r.prompt][r.slot], row.adv, "advantage of its own prompt and slot")
        assert.are.same(r.tokens, row.completion)
        assert.are.same(ro.prompt_ids[r.prompt], row.prompt_ids)
        -- padding_free balances rows across micro-batches by tokens; each row keeps the micro-batch
        -- it was drawn into (row.unit) as its normalisation unit
        local unit = row.unit or chunks
        assert.is_true(seen[row.prompt] == nil or seen[row.prompt] == unit, "a prompt's rows share one normalisation unit")
        seen[row.prompt] = unit
      end
      return real(self, tr, rows, totals, chunk)
    end
    t:update(ro)
    assert.are.equal(4, chunks)
    for i = 1, 4 do assert.is_not_nil(seen[i], "prompt " .. i .. " trained") end
  end)

  it("aggregates losses independently of micro-batching; bnpo is dapo in one micro-batch", function()
    local dir = setup()
    local function grads(extra)
      extra.learning_rate, extra.max_grad_norm, extra.skip_zero_advantage = 0, 0, false
      extra.run_name = tostring(math.random(1e9))
      local t = new_trainer(dir, extra)
      step_pieces(t)
      return grads_copy(t.model)
    end
    local per_agg = {}
    for _, agg in ipairs(algos.aggregations) do
      local one = grads({ loss_agg_mode = agg, per_device_train_batch_size = 4, gradient_accumulation_steps = 1 })
      local two = grads({ loss_agg_mode = agg, per_device_train_batch_size = 2, gradient_accumulation_steps = 2 })
      -- f32 sums in another order (each micro-batch from zero, then added): rounding, not a
      -- normalisation error, which would be a factor of 2
      assert.is_true(max_rel_diff(one, two) < 1e-3, agg .. ": 1 x 4 prompts vs 2 x 2 prompts")
      per_agg[agg] = one
    end
    assert.is_true(max_rel_diff(per_agg["token-mean"], per_agg["seq-mean-token-sum"]) > 1e-3,
      "the aggregations differ")
    local bnpo = grads({ loss_type = "bnpo", per_device_train_batch_size = 4, gradient_accumulation_steps = 1 })
    local dapo = grads({ loss_type = "dapo", per_device_train_batch_size = 4, gradient_accumulation_steps = 1 })
    assert.are.same(dapo, bnpo)
    assert.are.same(per_agg["token-mean"], dapo)
    local drg = grads({ loss_type = "dr_grpo", per_device_train_batch_size = 4, gradient_accumulation_steps = 1 })
    assert.are.same(per_agg["seq-mean-token-sum-norm"], drg)
  end)

  it("folds k1 into the rewards of every row before the advantage", function()
    local dir = setup()
    local t = new_trainer(dir, { beta = 0.5, kl_estimator = "k1" })
    step_pieces(t)   -- one update, so the policy differs from the reference
    local ro, up = step_pieces(t)
    assert.is_not_nil(ro.kl_k1)
    local any = false
    for k = 1, #ro.rows do
      assert.is_true(math.abs(ro.reward[k] - (ro.total[k] - 0.5 * ro.kl_k1[k])) < 1e-12)
      if ro.kl_k1[k] ~= 0 then any = true end
    end
    assert.is_true(any, "the policy moved away from the reference")
    assert.are.same(algos.advantages("remax", groups_of(ro, ro.reward)), ro.adv)
    assert.is_number(t:rl_metrics(ro, up).kl)
  end)

  it("num_iterations: old logprobs match the training forward exactly (ratio 1 at lr 0)", function()
    local dir = setup()
    local base = { learning_rate = 0, max_grad_norm = 0, skip_zero_advantage = false, beta = 0.1 }
    local function run(extra)
      local s = {}
      for k, v in pairs(base) do s[k] = v end
      for k, v in pairs(extra) do s[k] = v end
      local t = new_trainer(dir, s)
      local ro, up = step_pieces(t)
      return up, grads_copy(t.model), t:rl_metrics(ro, up)
    end
    local one, g1 = run({ run_name = "mu1" })
    local three, g3, m3 = run({ run_name = "mu3", num_iterations = 3 })
    local seq, gs = run({ run_name = "seq", num_iterations = 2, importance_sampling_level = "sequence" })
    assert.are.equal(3, three.iterations)
    assert.are.equal(0, three.clip_low + three.clip_high)
    assert.is_true(three.clip_n > 0)
    assert.are.equal(0, m3["clip_ratio/region_mean"])
    assert.are.same(g1, g3, "every iteration's gradient equals the single update's, bit for bit")
    assert.is_true(math.abs(one.grad_norm - three.grad_norm) <= 1e-12 * one.grad_norm)
    assert.are.equal(one.kl, three.kl)
    assert.is_true(max_rel_diff(g1, gs) < 1e-4, "GSPO at ratio 1 is the on-policy gradient")
    assert.are.equal(0, seq.clip_low + seq.clip_high)
  end)

  it("num_iterations > 1 clips a policy that moved, and counts updates in the schedule", function()
    local dir = setup()
    local t = new_trainer(dir, { num_iterations = 4, learning_rate = 0.05, epsilon = 0.01, max_grad_norm = 0,
      lr_scheduler_type = "linear", algo = "grpo", skip_zero_advantage = false })
    local ro, up = step_pieces(t)
    assert.are.equal(4, up.iterations)
    assert.are.equal(4, t.stepper.policy.opt:state().step)
    assert.is_true(up.clip_low + up.clip_high > 0, "a 1% clip range is left after a few large updates")
    assert.is_true(math.abs(up.lr - 0.05 * (8 - 3) / 8) < 1e-15, "update 4 of 8 on the linear schedule")
    local m = t:rl_metrics(ro, up)
    for _, k in ipairs({ "clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean" }) do
      assert.is_true(m[k] >= 0 and m[k] <= 1, k)
    end
    -- (low + high) / n against low / n + high / n: equal up to the last bit's rounding
    local sum, region = m["clip_ratio/low_mean"] + m["clip_ratio/high_mean"], m["clip_ratio/region_mean"]
    assert.is_true(math.abs(sum - region) <= 4 * 2 ^ -52 * region, ("%.17g vs %.17g"):format(sum, region))
  end)

  it("entropy_coef adds a gradient through the entropy that raises (or, negative, lowers) it", function()
    local dir = setup()
    local const = { { name = "const", fn = function(c) local s = {} for i = 1, #c do s[i] = 0.5 end return s end } }
    local function grads(coef)
      local t = new_trainer(dir, { entropy_coef = coef, learning_rate = 0, max_grad_norm = 0, rewards = const,
        run_name = "g" .. coef })
      step_pieces(t)
      return grads_copy(t.model)
    end
    local g0, g1, g2 = grads(0), grads(1), grads(2)
    local worst, size = 0, 0
    for name, v0 in pairs(g0) do
      for i = 1, #v0 do
        size = math.max(size, math.abs(g1[name][i]))
        worst = math.max(worst, math.abs((g2[name][i] - v0[i]) - 2 * (g1[name][i] - v0[i])))
      end
    end
    assert.is_true(size > 0, "the bonus has a gradient when every advantage is 0")
    assert.is_true(worst <= 1e-5 * size, "the bonus's gradient is linear in entropy_coef")
    local function entropy_after(coef)
      local t = new_trainer(dir, { entropy_coef = coef, learning_rate = 3e-2, max_steps = 6, rewards = const,
        run_name = "e" .. coef })
      local out = t:train()
      return out.history[1].entropy, out.history[6].entropy
    end
    local up0, up1 = entropy_after(2)
    local down0, down1 = entropy_after(-2)
    assert.are.equal(up0, down0)
    assert.is_true(down1 < down0 - 0.05, ("entropy %.3f -> %.3f with a negative bonus"):format(down0, down1))
    assert.is_true(up1 > down1 + 0.05, ("entropy %.3f with the bonus, %.3f against it"):format(up1, down1))
  end)

  it("logs the step's statistics: non-zero advantages, zero-spread groups, lengths, entropy", function()
    local dir = setup()
    local t = new_trainer(dir, { algo = "grpo", max_steps = 1, rewards = { { name = "half", fn = function(c, batch)
      local s = {}
      -- only the first sample of the first prompt is rewarded: one group of four has a spread
      for i = 1, #c do s[i] = i == 1 and 1 or 0 end
      return s
    end } } })
    local out = t:train()
    local m = out.history[1]
    local ro = t.stepper.policy.last_scored
    local rows_nz, prompts_nz, flat, n = 0, 0, 0, 0
    for i, a in ipairs(ro.adv) do
      local any = false
      for _, v in ipairs(a) do
        n = n + 1
        if v ~= 0 then rows_nz, any = rows_nz + 1, true end
      end
      if any then prompts_nz = prompts_nz + 1 end
      if algos.std(ro.groups[i].samples) == 0 then flat = flat + 1 end
    end
    assert.are.equal(rows_nz / n, m.frac_rows_nonzero_adv)
    assert.are.equal(prompts_nz / #ro.adv, m.frac_prompts_nonzero_adv)
    assert.are.equal(flat / #ro.groups, m.frac_reward_zero_std)
    assert.are.equal(0.25, m.frac_prompts_nonzero_adv)
    assert.are.equal(0.75, m.frac_reward_zero_std)
    for _, k in ipairs({ "reward_std", "completion_length_min", "entropy", "truncated_fraction" }) do
      assert.is_number(m[k], k)
    end
    local rows = t.run:metrics()
    assert.are.equal(m.frac_rows_nonzero_adv, rows[#rows].frac_rows_nonzero_adv)
  end)

  it("mask_truncated_completions leaves rows that hit the length limit out of the loss", function()
    local dir = setup()
    local t = new_trainer(dir, { mask_truncated_completions = true, max_completion_length = 2,
      skip_zero_advantage = false })
    local ro, up = step_pieces(t)
    local truncated, tokens = 0, 0
    for _, r in ipairs(ro.rows) do
      if not r.greedy then
        if r.finish == "length" then truncated = truncated + 1 else tokens = tokens + #r.tokens end
      end
    end
    assert.is_true(truncated > 0, "a random model runs into a 2-token limit")
    assert.are.equal(tokens, up.tokens_total)
    assert.are.equal(12 - truncated, up.rows_trained)
  end)

  it("gives rows that no reward scored advantage 0 and leaves them out of the baseline", function()
    local dir = setup()
    local function maybe(keep)
      return function(c, batch)
        local s = {}
        for i = 1, #c do if keep(i, batch) then s[i] = 1 + (i % 3) end end
        return s
      end
    end
    local t = new_trainer(dir, { algo = "grpo", rewards = {
      { name = "a", fn = maybe(function(i) return i % 4 == 1 end) },
      { name = "b", fn = maybe(function(i) return i % 4 == 2 end) } } })
    local ro, up = step_pieces(t)
    assert.is_true(ro.unscored > 0)
    for k, r in ipairs(ro.rows) do
      if ro.none[k] and not r.greedy then assert.are.equal(0, ro.adv[r.prompt][r.slot]) end
    end
    local g = {}
    for i, grp in ipairs(groups_of(ro, ro.total)) do
      g[i] = { samples = {} }
      for j, v in ipairs(grp.samples) do g[i].samples[j] = ro.none[(i - 1) * ro.slots + j] and 0 / 0 or v end
    end
    assert.are.same(algos.advantages("grpo", g), ro.adv)
    local m = t:rl_metrics(ro, up)
    assert.are.equal(ro.unscored, m.unscored)
  end)

  it("normalize_then_sum and scale_rewards = batch reach the advantages", function()
    local dir = setup()
    local t = new_trainer(dir, { algo = "grpo", multi_objective_aggregation = "normalize_then_sum",
      rewards = { dir .. "/lower.lua", { name = "len", fn = function(c) local s = {} for i = 1, #c do s[i] = #c[i] end return s end } },
      reward_weights = { 1, 0.5 } })
    local ro = step_pieces(t)
    local per = {}
    for k, name in ipairs({ "lower", "len" }) do
      local grp = groups_of(ro, ro.per[name])
      per[k] = {}
      for i, g in ipairs(grp) do per[k][i] = g.samples end
    end
    assert.are.same(algos.normalize_then_sum(per, { 1, 0.5 }), ro.adv)
    local b = new_trainer(dir, { algo = "grpo", scale_rewards = "batch", run_name = "batch" })
    local rb = step_pieces(b)
    assert.are.same(algos.advantages("grpo", groups_of(rb, rb.total), { scale_rewards = "batch" }), rb.adv)
  end)

  it("runs each new setting end to end and logs its metrics", function()
    local dir = setup()
    for i, extra in ipairs({
      { loss_type = "dapo" }, { loss_type = "bnpo" }, { loss_type = "dr_grpo" }, { loss_type = "grpo" },
      { num_iterations = 2, epsilon_high = 0.28 }, { num_iterations = 2, importance_sampling_level = "sequence" },
      { top_entropy_quantile = 0.2 }, { mask_truncated_completions = true }, { algo = "grpo", scale_rewards = "none" },
      { entropy_coef = 0.01 }, { entropy_coef = 0.01, loss_type = "dapo", top_entropy_quantile = 0.5 },
    }) do
      extra.run_name, extra.max_steps = "s" .. i, 1
      local t = new_trainer(dir, extra)
      local out = t:train()
      local m = out.history[1]
      assert.is_true(m.loss == m.loss and m.grad_norm == m.grad_norm, "finite loss: run " .. i)
      if m.completion_length_min < 5 or not extra.mask_truncated_completions then
        assert.is_number(m.entropy, "entropy: run " .. i)   -- (over the rows that trained)
      end
      assert.is_number(m.frac_rows_nonzero_adv)
      if extra.num_iterations then assert.is_number(m["clip_ratio/region_mean"]) end
      assert.is_true(exists(out.run_dir .. "/index.html"))
    end
  end)
end)

describe("trainer settings checks", function()
  it("reads scale_rewards as TRL does and rejects conflicting settings", function()
    assert.are.equal("none", config.resolve({ scale_rewards = false }).scale_rewards)
    assert.are.equal("group", config.resolve({ scale_rewards = true }).scale_rewards)
    assert.are.equal("batch", config.resolve({}, config.parse_args({ "--scale_rewards", "batch" })).scale_rewards)
    assert.are.equal("none", config.resolve({}, config.parse_args({ "--scale_rewards", "false" })).scale_rewards)
    assert.has_error(function() config.resolve({ loss_type = "dapo", loss_agg_mode = "seq-mean-token-sum" }) end)
    assert.has_no_error(function() config.resolve({ loss_type = "dapo", loss_agg_mode = "token-mean" }) end)
    assert.has_error(function() config.resolve({ multi_objective_aggregation = "normalize_then_sum" }) end,
      "recipe: multi_objective_aggregation = normalize_then_sum is GRPO's advantage (TRL's GDPO): it needs algo = grpo and no recipe advantage function")
    assert.has_error(function() config.resolve({ num_iterations = 0 }) end, "recipe: num_iterations = 0: expected an integer in [1, 1024]")
    assert.has_error(function() config.resolve({ delta = 1.1 }) end)
    assert.has_error(function() config.resolve({ top_entropy_quantile = 0 }) end)
  end)
end)

describe("trainer loose ends", function()
  -- a reward that scores by the prompt, not the completion: even prompts 1, odd prompts 0
  local EVEN = [[
return { name = "even", fn = function(completions, batch)
  local s = {}
  for i = 1, #completions do s[i] = tonumber(batch.prompt[i]:match("%d+")) % 2 == 0 and 1 or 0 end
  return s
end }
]]

  it("evaluates the held-out prompts, each completion with its own prompt, before and after", function()
    local dir = setup()
    write(dir .. "/even.lua", EVEN)
    support.prompts(dir .. "/eval.jsonl", 5, '{"prompt": "e %d", "answer": "%d"}')
    local t = new_trainer(dir, { rewards = { dir .. "/even.lua" }, eval_data = dir .. "/eval.jsonl", eval_size = 5,
      reward_weights = { 2 }, per_device_eval_batch_size = 2, max_steps = 1 })
    local out = t:train()
    assert.are.equal(0.4, out.before.accuracy)   -- e 2 and e 4 of 5
    assert.are.equal(0.8, out.before.reward)
    assert.are.equal(5, out.after.n)
    local rows = t.run:metrics()
    assert.are.equal(0, rows[1].step)
    assert.are.equal(0.4, rows[1].eval_accuracy)
    assert.are.equal(0.4, rows[#rows].eval_accuracy)
  end)

  it("remax eval prints held-out accuracy and writes nothing", function()
    local dir = setup()
    write(dir .. "/even.lua", EVEN)
    support.prompts(dir .. "/eval.jsonl", 4, '{"prompt": "e %d", "answer": "%d"}')
    write(dir .. "/r.lua", ([[return { model_config = { hidden_size = 16, intermediate_size = 32, num_hidden_layers = 1,
      num_attention_heads = 2, max_position_embeddings = 64 }, data = %q, eval_data = %q, eval_size = 4,
      rewards = { %q }, chat_template = "plain", max_completion_length = 4, output_dir = %q }]]):format(
      dir .. "/p.jsonl", dir .. "/eval.jsonl", dir .. "/even.lua", dir .. "/runs"))
    local printed = {}
    local real = print
    _G.print = function(...) printed[#printed + 1] = table.concat({ ... }, " ") end
    local ok, rc = pcall(cli.eval, dir .. "/r.lua")
    _G.print = real
    assert.is_true(ok, tostring(rc))
    assert.are.equal(0, rc)
    local text = table.concat(printed, "\n")
    assert.matches("50.0%", text, 1, true)
    assert.is_false(exists(dir .. "/runs"), "remax eval writes no run folder")
  end)

  it("gives a reward file edited before the first step the same trial as later edits", function()
    local dir = setup()
    local t = new_trainer(dir, { hot_reload = true })
    write(dir .. "/lower.lua", "return { name = 'lower', fn = function(c) local s = {} for i = 1, #c do s[i] = 0/0 end return s end }")
    assert.are.equal(0, t:check_reload(), "a NaN reward is refused before the first step")
    write(dir .. "/lower.lua", "return { name = 'lower', fn = function(c) return 'no' end }")
    assert.are.equal(0, t:check_reload())
    write(dir .. "/lower.lua", "return { name = 'lower', fn = function(c) local s = {} for i = 1, #c do s[i] = 1 end return s end }")
    assert.are.equal(1, t:check_reload())
    assert.are.equal(1, t:train_step().reward)
  end)

  for _, kl in ipairs({ "k3", "k1" }) do
    it(("loads the reference model when a hot reload raises beta from 0 (%s)"):format(kl), function()
      local dir = setup()
      local recipe_mod = require("remax.settings.recipe")
      local path = dir .. "/recipe.lua"
      -- a reward with a spread in every group, so the first step moves the policy
      write(dir .. "/vary.lua", [[return { name = "vary", fn = function(c, batch)
        local s = {}
        for i = 1, #c do s[i] = ((batch.completion_ids[i][1] or 0) % 7) / 7 end
        return s
      end }]])
      local function recipe(beta)
        write(path, ([[return { model_config = { hidden_size = 16, intermediate_size = 32, num_hidden_layers = 1,
          num_attention_heads = 2, max_position_embeddings = 64 }, data = %q, rewards = { %q }, chat_template = "plain",
          num_generations = 2, max_completion_length = 4, per_device_train_batch_size = 2, max_steps = 3, eval_size = 0,
          output_dir = %q, save_steps = 0, log_completions = 0, learning_rate = 1e-2, kl_estimator = %q, beta = %s }]]):format(
          dir .. "/p.jsonl", dir .. "/vary.lua", dir .. "/runs", kl, beta))
      end
      recipe("0")
      local t = trainer.new(config.resolve(recipe_mod.load(path), {}), { quiet = true, signals = false, recipe_path = path })
      assert.is_nil(t.stepper.policy.ref)
      t:train_step()
      recipe("0.2")
      assert.are.equal(1, t:check_reload())
      assert.are.equal(0.2, t.cfg.beta)
      assert.is_not_nil(t.stepper.policy.ref)
      local m = t:train_step()
      assert.is_true(m.kl ~= 0, "the KL to the starting weights after one update")
      assert.is_true(m.loss == m.loss)
    end)
  end

  it("reports a failure while drawing plots, and an interrupted run still gets plots", function()
    local dir = setup()
    local t = new_trainer(dir, { max_steps = 1 })
    t.run.plot = function() error("disk full") end
    local said = {}
    local real = io.stderr
    io.stderr = { write = function(_, ...) said[#said + 1] = table.concat({ ... }) end }
    local ok, out = pcall(t.train, t)
    io.stderr = real
    assert.is_true(ok, tostring(out))
    assert.matches("disk full", out.plot_error, 1, true)
    assert.matches("drawing the plots of .* failed: .*disk full", table.concat(said))

    local u = new_trainer(dir, { max_steps = 50, run_name = "interrupted", rewards = { support.interrupting_reward() } })
    u.opts.signals = true
    local res = u:train()
    assert.is_true(res.interrupted)
    assert.is_true(exists(res.run_dir .. "/index.html"))
    assert.is_true(exists(res.run_dir .. "/reward.svg"))
  end)
end)
