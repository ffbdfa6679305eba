-- The off-policy correction (remax.step.offpolicy, issue 46) against a plain-Lua reference written
-- from TRL's GRPOTrainer, step by step as its tensors go:
--   diff = (old_per_token_logps - sampling_per_token_logps) * mask
--   sequence_* modes: diff summed over the row; token_* modes: per token
--   ratio = exp(diff); *_truncate: clamp(ratio, max = cap); *_mask: ratio > cap -> 0
--   per_token_loss = per_token_loss * ratio, then + beta * per_token_kl (the KL is not weighted)
-- and the loss's gradient with respect to each token's log-probability compared with the
-- weights remax's loss hands the backward (algos.token_weights).
local offpolicy = require("remax.step.offpolicy")
local algos = require("remax.step.algos")
local support = require("support")

-- A small deterministic generator of numbers in [lo, hi).
local function numbers(seed)
  local x = seed
  return function(lo, hi)
    x = (1103515245 * x + 12345) % 2147483648
    return lo + (hi - lo) * x / 2147483648
  end
end

-- TRL's importance weights of one row, the reference.
local function trl_ratio(old, sampling, mode, cap)
  local diff = {}
  for t = 1, #old do diff[t] = old[t] - sampling[t] end
  local ratio = {}
  if mode == "sequence_mask" or mode == "sequence_truncate" then
    local s = 0
    for t = 1, #diff do s = s + diff[t] end
    for t = 1, #diff do ratio[t] = math.exp(s) end
  else
    for t = 1, #diff do ratio[t] = math.exp(diff[t]) end
  end
  for t = 1, #ratio do
    if mode == "sequence_truncate" or mode == "token_truncate" then ratio[t] = math.min(ratio[t], cap)
    elseif ratio[t] > cap then ratio[t] = 0 end
  end
  return ratio
end

local function close(a, b) return math.abs(a - b) <= 1e-12 * math.max(1, math.abs(a), math.abs(b)) end

describe("the off-policy correction", function()
  local rnd = numbers(46)
  -- rows: current log-probabilities near the sampler's, some far (ratios above the cap)
  local rows = {}
  for r = 1, 6 do
    local n = 2 + r % 4
    local cur, beh, ref = {}, {}, {}
    for t = 1, n do
      beh[t] = rnd(-4, -0.05)
      cur[t] = beh[t] + rnd(-0.4, 0.4) + ((r == 2 and t == 1) and 2.5 or 0)   -- row 2: one token 12x likelier now
      ref[t] = cur[t] + rnd(-0.2, 0.2)
    end
    rows[r] = { cur = cur, beh = beh, ref = ref, adv = rnd(-1, 1) }
  end

  for _, mode in ipairs({ "token_truncate", "token_mask", "sequence_truncate", "sequence_mask" }) do
    it(("%s: weights and gradients as TRL's formula gives them"):format(mode), function()
      local cap = 2.0
      local st = offpolicy.stats()
      local parts, ratios = {}, {}
      for r, row in ipairs(rows) do
        local w = offpolicy.row_weights(row.cur, row.beh, mode, cap, st)
        ratios[r] = trl_ratio(row.cur, row.beh, mode, cap)
        for t = 1, #w do assert.is_true(close(ratios[r][t], w[t]), ("row %d token %d: %s vs %s"):format(r, t, w[t], ratios[r][t])) end
        parts[r] = { adv = row.adv, logp = row.cur, ref = row.ref, is_weight = w }
      end
      -- the loss's gradient: seq-mean-token-mean, beta 0.1, k3 KL; num_iterations = 1 (no old):
      -- d/dlp_t of mean_rows(1/n sum_t (-A * ratio_t * lp_t + beta * k3(lp_t, ref_t)))
      local beta = 0.1
      local weights, stats = algos.token_weights(parts, { beta = beta, kl = "k3", agg = "seq-mean-token-mean" })
      local loss = 0
      for r, row in ipairs(rows) do
        local n = #row.cur
        for t = 1, n do
          local lp, ref = row.cur[t], row.ref[t]
          local k3 = math.exp(ref - lp) - (ref - lp) - 1
          loss = loss + (-row.adv * ratios[r][t] * lp + beta * k3) / n / #rows
          local grad = (-row.adv * ratios[r][t] + beta * (1 - math.exp(ref - lp))) / n / #rows
          assert.is_true(close(grad, weights[r][t]), ("row %d token %d gradient: %s vs %s"):format(r, t, weights[r][t], grad))
        end
      end
      assert.is_true(close(loss, stats.loss))
      -- the statistics TRL logs: mean, min, max of the (capped or masked) ratios; sequence modes one per row
      local list = {}
      for r = 1, #rows do
        if mode:sub(1, 8) == "sequence" then list[#list + 1] = ratios[r][1]
        else for t = 1, #ratios[r] do list[#list + 1] = ratios[r][t] end end
      end
      local sum, lo, hi, cut = 0, math.huge, -math.huge, 0
      for _, v in ipairs(list) do
        sum, lo, hi = sum + v, math.min(lo, v), math.max(hi, v)
        if v == cap or v == 0 then cut = cut + 1 end
      end
      local m = offpolicy.metrics(st, mode)
      assert.is_true(close(sum / #list, m["sampling/importance_sampling_ratio/mean"]))
      assert.are.equal(lo, m["sampling/importance_sampling_ratio/min"])
      assert.are.equal(hi, m["sampling/importance_sampling_ratio/max"])
      local frac = m["sampling/importance_sampling_ratio/clipped_fraction"] or m["sampling/importance_sampling_ratio/masked_fraction"]
      assert.is_true(cut > 0)   -- row 2's ratio is above the cap in every mode
      assert.is_true(close(cut / #list, frac))
      -- KL(sampler || current) from the sampler's tokens: the k3 estimate, mean over tokens
      local kl, n = 0, 0
      for _, row in ipairs(rows) do
        for t = 1, #row.cur do
          local d = row.cur[t] - row.beh[t]
          kl, n = kl + (math.exp(d) - 1 - d), n + 1
        end
      end
      assert.is_true(close(kl / n, m["sampling/kl"]))
    end)
  end

  it("refuses a row whose log-probabilities do not match its tokens, and an unknown mode", function()
    assert.matches("2 loss tokens but the sampler gave 1", support.error_of(offpolicy.row_weights, { -1, -1 }, { -1 }, "token_mask", 2), 1, true)
    assert.matches("unknown vllm_importance_sampling_mode 'x'", support.error_of(offpolicy.row_weights, { -1 }, { -1 }, "x", 2), 1, true)
  end)

  it("in a synchronous f32 run: the sampler and the training forward agree, the ratios are 1 within rounding", function()
    local config = require("remax.settings.config")
    local trainer = require("remax.run.run")
    local d = support.train_dir(16)
    local cfg = config.resolve(support.run_settings(d, { model_config = support.tiny_model(), num_generations = 3,
      max_completion_length = 6, per_device_train_batch_size = 2, learning_rate = 5e-2, max_steps = 3, run_name = "s",
      seed = 11, dtype = "f32", hot_reload = false, vllm_importance_sampling_correction = true,
      vllm_importance_sampling_mode = "token_truncate" }), {})
    assert.are.equal("off", cfg.async_mode)
    local t = trainer.new(cfg, { quiet = true, signals = false })
    local seen = 0
    for _ = 1, 3 do
      local m = t:train_step()
      if m["sampling/importance_sampling_ratio/mean"] then
        seen = seen + 1
        assert.is_true(math.abs(m["sampling/importance_sampling_ratio/mean"] - 1) < 1e-4)
        assert.is_true(m["sampling/sampling_logp_difference/max"] < 1e-4)
        assert.are.equal(0, m["sampling/importance_sampling_ratio/clipped_fraction"])
      end
    end
    assert.is_true(seen > 0)
  end)
end)
