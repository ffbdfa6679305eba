local algos = require("remax.step.algos")

local function near(a, b, tol, what)
  assert.is_true(math.abs(a - b) <= (tol or 1e-12), ("%s: %.17g vs %.17g"):format(what or "value", a, b))
end

local function near_list(a, b, tol, what)
  assert.are.equal(#b, #a, (what or "list") .. " length")
  for i = 1, #b do near(a[i], b[i], tol, ("%s[%d]"):format(what or "list", i)) end
end

describe("advantage estimators", function()
  it("remax: sample reward minus the greedy reward of the same prompt, optionally clipped", function()
    local groups = { { samples = { 1, 0, 0.5 }, greedy = 0.5 }, { samples = { 0, 0, 1 }, greedy = 1 } }
    local adv = algos.advantages("remax", groups)
    near_list(adv[1], { 0.5, -0.5, 0 }, 0, "prompt 1")
    near_list(adv[2], { -1, -1, 0 }, 0, "prompt 2")
    adv = algos.advantages("remax", groups, { clip = 0.2 })
    near_list(adv[1], { 0.2, -0.2, 0 }, 0, "clipped")
    assert.has_error(function() algos.advantages("remax", { { samples = { 1 } } }) end,
      "remax advantage: prompt 1 has no greedy reward (generate_greedy must be true)")
  end)

  it("grpo: group mean and unbiased standard deviation", function()
    local groups = { { samples = { 1, 0, 0, 1 } }, { samples = { 2, 2 } } }
    local adv = algos.advantages("grpo", groups)
    local s = math.sqrt(1 / 3)   -- values 1,0,0,1: mean 0.5, sum of squares 4 * 0.25 over n - 1 = 3
    near_list(adv[1], { 0.5 / (s + 1e-4), -0.5 / (s + 1e-4), -0.5 / (s + 1e-4), 0.5 / (s + 1e-4) }, 1e-12, "grpo")
    near_list(adv[2], { 0, 0 }, 0, "equal rewards")
    adv = algos.advantages("grpo", groups, { scale_rewards = false })
    near_list(adv[1], { 0.5, -0.5, -0.5, 0.5 }, 0, "unscaled")
  end)

  it("rloo: reward minus the mean of the prompt's other samples", function()
    local adv = algos.advantages("rloo", { { samples = { 1, 0, 0.5 } } })
    near_list(adv[1], { 1 - 0.25, 0 - 0.75, 0.5 - 0.5 }, 1e-15, "rloo")
    assert.has_error(function() algos.advantages("rloo", { { samples = { 1 } } }) end)
  end)

  it("reinforce: no baseline, or a running mean carried in the state", function()
    local groups = { { samples = { 1, 0 } }, { samples = { 0.5, 0.5 } } }
    local adv = algos.advantages("reinforce", groups, { baseline = "none" })
    near_list(adv[1], { 1, 0 }, 0)
    near_list(adv[2], { 0.5, 0.5 }, 0)
    local a1, s1 = algos.advantages("reinforce", groups, { baseline = "mean", momentum = 0.9 })
    near_list(a1[1], { 0.5, -0.5 }, 0, "first batch uses its own mean")
    near(s1.mean, 0.5, 0)
    local g2 = { { samples = { 1, 1 } } }
    local a2, s2 = algos.advantages("reinforce", g2, { baseline = "mean", momentum = 0.9 }, s1)
    near_list(a2[1], { 0.5, 0.5 }, 1e-15, "second batch uses the running mean")
    near(s2.mean, 0.9 * 0.5 + 0.1 * 1, 1e-15)
  end)

  it("accepts any Lua function and checks what it returns", function()
    local adv = algos.advantages(function(groups)
      local out = {}
      for i, g in ipairs(groups) do out[i] = { g.samples[1] * 10 } end
      return out
    end, { { samples = { 0.3 } } }, { clip = 2 })
    near(adv[1][1], 2, 0)
    assert.has_error(function() algos.advantages(function() return { { 0 / 0 } } end, { { samples = { 1 } } }) end,
      "advantage function: prompt 1 sample 1 is nan, expected a number")
    assert.has_error(function() algos.advantages("ppo", {}) end,
      "unknown advantage estimator 'ppo' (valid: remax, grpo, rloo, reinforce, or a Lua function)")
  end)
end)

describe("KL and loss", function()
  it("computes k1 and k3 and the k3 gradient", function()
    near(algos.kl_k3(-1, -2), math.exp(-1) + 1 - 1, 1e-15, "k3")
    near(algos.kl_k3(-2, -2), 0, 0, "k3 at equal")
    near(algos.kl_k3_grad(-1, -2), 1 - math.exp(-1), 1e-15, "k3 grad")
    near(algos.kl_k1(-1, -2), 1, 0, "k1")
    local r, s = algos.fold_kl(1, { -1, -2 }, { -1.5, -2 }, 0.1)
    near(r, 0.95, 1e-15, "k1 folded into the reward")
    near(s, 0.5, 0, "k1 sum")
  end)

  -- Two rows: A = 2 with logp {-1, -2}; A = -1 with logp {-0.5}. 2 rows, 3 tokens.
  -- Token losses -A * logp: row 1: 2, 4; row 2: -0.5.
  local function rows(ref)
    return { { adv = 2, logp = { -1, -2 }, ref = ref and { -1.5, -2 } or nil },
      { adv = -1, logp = { -0.5 }, ref = ref and { -0.5 } or nil } }
  end

  it("aggregates seq-mean-token-mean, token-mean and seq-mean-token-sum", function()
    local w, st = algos.token_weights(rows(), { agg = "seq-mean-token-mean" })
    near_list(w[1], { -0.5, -0.5 }, 1e-15, "smtm row 1")   -- -A / (2 rows * 2 tokens)
    near_list(w[2], { 0.5 }, 1e-15, "smtm row 2")          -- -A / (2 rows * 1 token)
    near(st.loss, (2 + 4) / 4 + (-0.5) / 2, 1e-15, "smtm loss")
    w, st = algos.token_weights(rows(), { agg = "token-mean" })
    near_list(w[1], { -2 / 3, -2 / 3 }, 1e-15, "token-mean row 1")
    near_list(w[2], { 1 / 3 }, 1e-15, "token-mean row 2")
    near(st.loss, (2 + 4 - 0.5) / 3, 1e-15, "token-mean loss")
    w, st = algos.token_weights(rows(), { agg = "seq-mean-token-sum" })
    near_list(w[1], { -1, -1 }, 1e-15, "seq-mean-token-sum row 1")
    near_list(w[2], { 0.5 }, 1e-15, "seq-mean-token-sum row 2")
    near(st.loss, (2 + 4 - 0.5) / 2, 1e-15, "seq-mean-token-sum loss")
    assert.has_error(function() algos.token_weights(rows(), { agg = "mean" }) end)
  end)

  it("adds beta * k3 to the loss, or leaves the KL to the reward with k1", function()
    local k = math.exp(-0.5) + 0.5 - 1           -- k3 of logp -1, ref -1.5
    local g = 1 - math.exp(-0.5)
    local w, st = algos.token_weights(rows(true), { beta = 0.1, kl = "k3", agg = "seq-mean-token-mean" })
    near_list(w[1], { 0.25 * (-2 + 0.1 * g), 0.25 * -2 }, 1e-15, "k3 row 1")
    near_list(w[2], { 0.5 }, 1e-15, "k3 row 2")
    near(st.loss, 1.25 + 0.25 * 0.1 * k, 1e-15, "k3 loss")
    near(st.kl_sum, k, 1e-15, "k3 kl sum")
    w, st = algos.token_weights(rows(true), { beta = 0.1, kl = "k1", agg = "seq-mean-token-mean" })
    near_list(w[1], { -0.5, -0.5 }, 1e-15, "k1 leaves the loss alone")
    near(st.loss, 1.25, 1e-15, "k1 loss")
    near(st.kl_sum, 0.5, 1e-15, "k1 kl sum")
  end)

  it("gives weights equal to the loss gradient (central differences, every mode)", function()
    for _, agg in ipairs(algos.aggregations) do
      for _, kl in ipairs({ "k3", "k1" }) do
        local opts = { beta = 0.3, kl = kl, agg = agg, num_rows = 2, num_tokens = 3, max_length = 4 }
        local w = algos.token_weights(rows(true), opts)
        for r = 1, 2 do
          for t = 1, #rows()[r].logp do
            local h = 1e-6
            local plus, minus = rows(true), rows(true)
            plus[r].logp[t] = plus[r].logp[t] + h
            minus[r].logp[t] = minus[r].logp[t] - h
            local _, sp = algos.token_weights(plus, opts)
            local _, sm = algos.token_weights(minus, opts)
            near(w[r][t], (sp.loss - sm.loss) / (2 * h), 1e-8, ("%s %s row %d token %d"):format(agg, kl, r, t))
          end
        end
      end
    end
  end)

  it("splits into micro-batches without changing the step's loss or weights", function()
    for _, agg in ipairs(algos.aggregations) do
      local whole_w, whole = algos.token_weights(rows(true), { beta = 0.1, agg = agg, max_length = 4 })
      local all = rows(true)
      local opts = { beta = 0.1, agg = agg, num_rows = 2, num_tokens = 3, max_length = 4 }
      local w1, a = algos.token_weights({ all[1] }, opts)
      local w2, b = algos.token_weights({ all[2] }, opts)
      near(a.loss + b.loss, whole.loss, 1e-15, agg .. " loss")
      near_list(w1[1], whole_w[1], 1e-15, agg .. " row 1")
      near_list(w2[1], whole_w[2], 1e-15, agg .. " row 2")
    end
  end)

  it("makes SFT cross-entropy from adv = 1 and beta = 0", function()
    local w, st = algos.token_weights({ { adv = 1, logp = { -2, -1 } } }, { agg = "token-mean" })
    near(st.loss, 1.5, 1e-15, "mean cross-entropy")
    near_list(w[1], { -0.5, -0.5 }, 1e-15, "weights")
  end)
end)
