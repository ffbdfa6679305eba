-- The original ReMax's options (docs/trainer.md, "The original ReMax"): gamma's per-token return
-- and advantage_clip as its clamp of r - r_greedy, against returns computed by hand on a small
-- rollout, and through the trainer on a tiny model (its own reference log-probabilities).
local algos = require("remax.step.algos")
local config = require("remax.settings.config")
local trainer = require("remax.run.run")
local support = require("support")

local function near(a, b, tol) return math.abs(a - b) <= (tol or 1e-12) end

describe("gamma (the original ReMax's return)", function()
  it("gives each token -beta * kl_t + gamma^(T - t) * A, written out by hand", function()
    -- T = 3 tokens, A = 2, beta = 0.1, gamma = 0.5; kl_t = logp_t - ref_t = 0.2, -0.1, 0.4
    local logp, ref = { -1.0, -2.0, -0.5 }, { -1.2, -1.9, -0.9 }
    local ret, kl = algos.gamma_returns(2, logp, ref, 0.1, 0.5)
    assert.is_true(near(ret[1], -0.1 * 0.2 + 0.25 * 2))
    assert.is_true(near(ret[2], -0.1 * -0.1 + 0.5 * 2))
    assert.is_true(near(ret[3], -0.1 * 0.4 + 1 * 2))
    assert.is_true(near(kl, 0.5))
    -- gamma = 1, beta = 0: every token gets A (remax's default, sequence-level advantage)
    local flat = algos.gamma_returns(-0.7, logp, nil, 0, 1)
    assert.are.same({ -0.7, -0.7, -0.7 }, flat)
    -- the loss weight of token t is -return_t / (rows * T) under seq-mean-token-mean
    local w = algos.token_weights({ { adv = 2, logp = logp, returns = ret } }, {})
    for t = 1, 3 do assert.is_true(near(w[1][t], -ret[t] / 3)) end
  end)

  it("clamps r - r_greedy with advantage_clip before discounting (the original's clip of 5)", function()
    local groups = { { samples = { 9.0, -1.0 }, greedy = 1.0 } }
    local adv = algos.advantages("remax", groups, { clip = 5 })
    assert.are.same({ 5, -2 }, adv[1])   -- 8 clamped to 5; -2 kept
    local ret = algos.gamma_returns(adv[1][1], { 0, 0 }, nil, 0, 0.9)
    assert.is_true(near(ret[1], 0.9 * 5) and near(ret[2], 5))
  end)

  it("runs through the trainer: returns from the policy's and the reference's log-probabilities", function()
    local dir = support.train_dir(8)
    local s = support.run_settings(dir, { model_config = support.tiny_model(), num_generations = 2,
      max_completion_length = 5, per_device_train_batch_size = 2, learning_rate = 1e-2, max_steps = 3, seed = 3,
      dtype = "f32", beta = 0.2, gamma = 0.8, advantage_clip = 0.05 })
    local t = trainer.new(config.resolve(s, {}), { quiet = true, signals = false })
    assert.are.equal("return", t.cfg.kl_mode)
    t:train_step()   -- the policy moves away from the reference: the KL term is not 0
    local ro = t:advantage(t:score(t:rollout(t:next_batch())))
    local checked, kl_seen = 0, false
    for k, r in ipairs(ro.rows) do
      if not r.greedy then
        local g = ro.rows[ro:index(r.prompt, ro.slots)]
        local A = math.max(-0.05, math.min(0.05, ro.total[k] - ro.total[ro:index(r.prompt, ro.slots)]))
        assert.is_true(g.greedy)
        local seq = {}
        for _, id in ipairs(ro.prompt_ids[r.prompt]) do seq[#seq + 1] = id end
        local start = #seq
        for _, id in ipairs(r.tokens) do seq[#seq + 1] = id end
        local lp, ref = t.model:logprobs({ seq }):totable()[1], t.stepper:load_reference():logprobs({ seq }):totable()[1]
        local T = #r.tokens
        for i = 1, T do
          local kl = lp[start + i] - ref[start + i]
          if math.abs(kl) > 1e-6 then kl_seen = true end
          local want = -0.2 * kl + 0.8 ^ (T - i) * A
          assert(near(ro.returns[k][i], want, 1e-6), ("row %d token %d: %g, by hand %g"):format(k, i, ro.returns[k][i], want))
        end
        checked = checked + 1
      end
    end
    assert.is_true(checked > 0 and kl_seen)
    local m = t:update(ro)
    assert.is_true(m.finite)
  end)
end)
