-- TRL's loss types and clipped objective, checked against a reference written the way TRL's
-- GRPOTrainer writes them (per-token loss matrices, masks, one normaliser per loss type), with
-- gradients from forward-mode automatic differentiation (dual numbers), so weights agree to
-- 1e-12 without finite-difference noise. cispo and sapo (step/loss_types/, their own per-token
-- terms) are checked the same way, on hand-made and on random rollouts.
local algos = require("remax.step.algos")

---------------------------------------------------------------------------- dual numbers

local D = {}
D.__index = D
local function dual(v, d) return setmetatable({ v = v, d = d or 0 }, D) end
local function lift(x) return getmetatable(x) == D and x or dual(x, 0) end
D.__add = function(a, b) a, b = lift(a), lift(b) return dual(a.v + b.v, a.d + b.d) end
D.__sub = function(a, b) a, b = lift(a), lift(b) return dual(a.v - b.v, a.d - b.d) end
D.__mul = function(a, b) a, b = lift(a), lift(b) return dual(a.v * b.v, a.d * b.v + a.v * b.d) end
D.__div = function(a, b) a, b = lift(a), lift(b) return dual(a.v / b.v, (a.d * b.v - a.v * b.d) / (b.v * b.v)) end
D.__unm = function(a) return dual(-a.v, -a.d) end
local function dexp(a) a = lift(a) local e = math.exp(a.v) return dual(e, e * a.d) end
-- torch.clamp: the gradient passes where min <= x <= max
local function dclamp(a, lo, hi)
  a = lift(a)
  if a.v < lo then return dual(lo, 0) elseif a.v > hi then return dual(hi, 0) end
  return a
end
local function dclamp_max(a, hi) a = lift(a) if a.v > hi then return dual(hi, 0) end return a end
-- torch.sigmoid
local function dsigmoid(a) return 1 / (1 + dexp(-lift(a))) end
-- torch.minimum; the test data has no ties between different-gradient operands
local function dmin(a, b) a, b = lift(a), lift(b) if a.v <= b.v then return a end return b end

---------------------------------------------------------------------------- the reference

-- micro_batches[m] = list of rows {adv, logp (duals), old (numbers or nil: logp detached), ref,
-- masked, emask}. o: loss_type, beta, lo, hi, delta, level, L (max_completion_length), tau_pos,
-- tau_neg (sapo's temperatures).
-- Returns the step's loss as TRL accumulates it over the micro-batches.
local function trl_loss(micro_batches, o)
  local GA = #micro_batches
  local N = 0   -- num_items_in_batch: loss tokens of the whole step
  for _, mb in ipairs(micro_batches) do
    for _, row in ipairs(mb) do if not row.masked then N = N + #row.logp end end
  end
  local total = dual(0)
  for _, mb in ipairs(micro_batches) do
    local ptl, mask = {}, {}   -- per_token_loss[b][t], completion_mask[b][t]
    for b, row in ipairs(mb) do
      local n = #row.logp
      mask[b] = {}
      for t = 1, n do mask[b][t] = row.masked and 0 or 1 end
      local log_ratio = {}
      for t = 1, n do
        local old = row.old and row.old[t] or lift(row.logp[t]).v   -- .detach()
        log_ratio[t] = row.logp[t] - old
      end
      local coef = {}
      if o.level == "sequence" then
        local s, m = dual(0), 0
        for t = 1, n do s, m = s + log_ratio[t] * mask[b][t], m + mask[b][t] end
        local c = dexp(s / math.max(m, 1))
        for t = 1, n do coef[t] = c end
      else
        for t = 1, n do coef[t] = dexp(log_ratio[t]) end
      end
      ptl[b] = {}
      for t = 1, n do
        local l
        if o.loss_type == "cispo" then
          -- clamped_ratios = torch.clamp(coef_1, max=epsilon_high).detach()
          -- per_token_loss = -clamped_ratios * advantages * per_token_logps
          local clamped = lift(dclamp_max(coef[t], o.hi)).v
          l = -(row.logp[t] * (clamped * row.adv))
        elseif o.loss_type == "sapo" then
          -- temperatures = torch.where(advantages > 0, sapo_temperature_pos, sapo_temperature_neg)
          -- soft_coef_1 = torch.sigmoid(temperatures * (coef_1 - 1)) * 4 / temperatures
          -- per_token_loss = -soft_coef_1 * advantages
          local tau = row.adv > 0 and o.tau_pos or o.tau_neg
          local soft = dsigmoid((coef[t] - 1) * tau) * 4 / tau
          l = -(soft * row.adv)
        else
          local c1, c2 = coef[t], dclamp(coef[t], 1 - o.lo, 1 + o.hi)
          if o.delta then c1 = dclamp_max(c1, o.delta) end
          l = -dmin(c1 * row.adv, c2 * row.adv)
        end
        if row.emask then l = l * row.emask[t] end
        if o.beta ~= 0 then
          local d = row.ref[t] - row.logp[t]
          l = l + (dexp(d) - d - 1) * o.beta
        end
        ptl[b][t] = l
      end
    end
    local B = #mb
    local loss
    if o.loss_type == "grpo" or o.loss_type == "sapo" then
      loss = dual(0)
      for b = 1, B do
        local s, m = dual(0), 0
        for t = 1, #ptl[b] do s, m = s + ptl[b][t] * mask[b][t], m + mask[b][t] end
        loss = loss + s / math.max(m, 1)
      end
      loss = loss / B / GA
    else
      local s, m = dual(0), 0
      for b = 1, B do for t = 1, #ptl[b] do s, m = s + ptl[b][t] * mask[b][t], m + mask[b][t] end end
      if o.loss_type == "bnpo" then loss = s / math.max(m, 1) / GA
      elseif o.loss_type == "dr_grpo" then loss = s / (B * o.L) / GA
      elseif o.loss_type == "dapo" or o.loss_type == "cispo" then loss = s / math.max(N, 1) end
    end
    total = total + loss
  end
  return total
end

-- d loss / d logp of every token by forward-mode AD: one pass per token.
local function trl_grads(micro_batches, o)
  local grads = {}
  for m, mb in ipairs(micro_batches) do
    grads[m] = {}
    for b, row in ipairs(mb) do
      grads[m][b] = {}
      for t = 1, #row.logp do
        local saved = row.logp
        local seeded = {}
        for k, v in ipairs(saved) do seeded[k] = dual(v, k == t and 1 or 0) end
        row.logp = seeded
        grads[m][b][t] = trl_loss(micro_batches, o).d
        row.logp = saved
      end
    end
  end
  return grads
end

---------------------------------------------------------------------------- hand-made rollouts

-- Two micro-batches of three rows (the trainer's micro-batches of whole prompts all hold the
-- same number of rows, so TRL's per-micro-batch row means equal remax's step-wide ones) and
-- different token counts (bnpo's per-micro-batch token mean differs from dapo's step mean), positive and negative advantages, a row at ratio far above 1 + eps (clipped with
-- A > 0), one far below 1 - eps (clipped with A < 0), one inside, and a truncated row.
local function rollout(with_old)
  local mbs = {
    { { adv = 1.5, logp = { -0.7, -1.9, -0.2 }, old = { -0.9, -1.1, -0.25 }, ref = { -0.8, -1.5, -0.3 } },
      { adv = -0.8, logp = { -2.2, -0.4 }, old = { -1.1, -0.45 }, ref = { -2.0, -0.5 } },
      { adv = 0.3, logp = { -0.1 }, old = { -0.12 }, ref = { -0.2 } } },
    { { adv = 0.6, logp = { -1.0 }, old = { -1.05 }, ref = { -1.2 } },
      { adv = -1.2, logp = { -0.3, -0.6, -1.4, -0.9 }, old = { -0.35, -0.5, -1.3, -1.0 }, ref = { -0.4, -0.7, -1.1, -0.8 } },
      { adv = 2.0, logp = { -0.5, -0.5 }, old = { -0.6, -0.4 }, ref = { -0.5, -0.6 }, masked = true } },
  }
  if not with_old then
    for _, mb in ipairs(mbs) do for _, row in ipairs(mb) do row.old = nil end end
  end
  return mbs
end

local function counts(mbs)
  local rows, tokens = 0, 0
  for _, mb in ipairs(mbs) do
    for _, row in ipairs(mb) do
      rows = rows + 1
      if not row.masked then tokens = tokens + #row.logp end
    end
  end
  return rows, tokens
end

-- remax's weights for the same rollout, micro-batch by micro-batch, as the trainer calls them.
local function remax_weights(mbs, o)
  local R, N = counts(mbs)
  local out, loss, stats = {}, 0, { clip_low = 0, clip_high = 0, clip_n = 0 }
  for m, mb in ipairs(mbs) do
    local chunk_tokens = 0
    for _, row in ipairs(mb) do if not row.masked then chunk_tokens = chunk_tokens + #row.logp end end
    local w, st = algos.token_weights(mb, {
      beta = o.beta, kl = "k3", agg = algos.loss_type(o.loss_type).aggregation, num_rows = R, num_tokens = N,
      max_length = o.L, chunk_tokens = chunk_tokens, chunks = #mbs,
      epsilon = o.lo, epsilon_high = o.hi, delta = o.delta, level = o.level,
      loss_type = o.loss_type, sapo_temperature_pos = o.tau_pos, sapo_temperature_neg = o.tau_neg,
    })
    out[m], loss = w, loss + st.loss
    for k in pairs(stats) do stats[k] = stats[k] + st[k] end
  end
  return out, loss, stats
end

local function check_all(o, with_old, what, make)
  make = make or rollout
  local mbs = make(with_old)
  local w, loss = remax_weights(mbs, o)
  local g = trl_grads(make(with_old), o)
  for m = 1, #g do
    for b = 1, #g[m] do
      for t = 1, #g[m][b] do
        local a, e = w[m][b][t], g[m][b][t]
        assert.is_true(math.abs(a - e) <= 1e-12,
          ("%s: micro-batch %d row %d token %d: weight %.17g, TRL %.17g"):format(what, m, b, t, a, e))
      end
    end
  end
  if with_old or algos.loss_type(o.loss_type).token_loss then   -- at ratio 1 too: their loss is TRL's
    local ref = trl_loss(make(with_old), o).v
    assert.is_true(math.abs(loss - ref) <= 1e-12, ("%s: loss %.17g, TRL %.17g"):format(what, loss, ref))
  end
  return w
end

-- every loss type record (step/loss_types/), in rank order
local loss_types = {}
for i, r in ipairs(algos.loss_types()) do loss_types[i] = r.name end

describe("TRL loss types", function()
  it("are records, one file each: TRL's grpo, bnpo, dr_grpo, dapo, cispo and sapo", function()
    assert.are.same({ "grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo" }, loss_types)
  end)

  for _, lt in ipairs(loss_types) do
    for _, level in ipairs({ "token", "sequence" }) do
      for _, beta in ipairs({ 0, 0.04 }) do
        it(("%s, %s-level ratio, beta %s: weights and loss equal TRL's to 1e-12"):format(lt, level, beta), function()
          local o = { loss_type = lt, beta = beta, lo = 0.2, hi = 0.28, level = level, L = 6, tau_pos = 1.0, tau_neg = 1.05 }
          check_all(o, true, "old logprobs")
          check_all(o, false, "ratio 1 (num_iterations = 1)")
          o.delta = 1.5
          check_all(o, true, "two-sided clipping, delta 1.5")
        end)
      end
    end
  end

  it("with the ratio at exactly 1 gives the on-policy gradient bit for bit", function()
    for _, lt in ipairs(loss_types) do
      local o = { loss_type = lt, beta = 0.04, lo = 0.2, hi = 0.2, level = "token", L = 6, tau_pos = 1.0, tau_neg = 1.05 }
      local plain = remax_weights(rollout(false), o)
      local same = rollout(false)
      for _, mb in ipairs(same) do
        for _, row in ipairs(mb) do
          row.old = {}
          for t, v in ipairs(row.logp) do row.old[t] = v end
        end
      end
      local w, _, st = remax_weights(same, o)
      for m = 1, #w do
        for b = 1, #w[m] do
          for t = 1, #w[m][b] do
            assert.are.equal(plain[m][b][t], w[m][b][t], ("%s row %d token %d"):format(lt, b, t))
          end
        end
      end
      -- cispo's cap acts at ratio 1 (min(1, epsilon_high) = 0.2 here): counted where A > 0
      if lt ~= "cispo" then assert.are.equal(0, st.clip_low + st.clip_high) end
    end
  end)

  -- Random rollouts: micro-batches of equal row counts (as the trainer's), rows of 1 to 6 tokens,
  -- advantages of both signs (and 0), ratios far on both sides of the clip range, truncated rows
  -- and top-entropy masks, from a fixed seed.
  local function random_rollout(seed)
    local x = seed
    local function u() x = (x * 1103515245 + 12345) % 2147483648 return x / 2147483648 end
    local mbs = {}
    for m = 1, 3 do
      mbs[m] = {}
      for b = 1, 3 do
        local n = 1 + math.floor(u() * 6)
        local row = { adv = (u() < 0.1) and 0 or (u() * 4 - 2), logp = {}, old = {}, ref = {}, emask = {}, mask = {} }
        for t = 1, n do
          row.logp[t] = -0.05 - u() * 3
          row.old[t] = row.logp[t] + (u() - 0.5) * 1.2   -- ratios from about 0.55 to 1.8
          row.ref[t] = row.logp[t] + (u() - 0.5) * 0.6
          row.emask[t] = u() < 0.8 and 1 or 0
          row.mask[t] = row.emask[t]
        end
        row.masked = u() < 0.1 or nil
        mbs[m][b] = row
      end
    end
    return function(with_old, no_masks)   -- a fresh copy each time (the AD seeds write into rows)
      local out = {}
      for m, mb in ipairs(mbs) do
        out[m] = {}
        for b, row in ipairs(mb) do
          local c = {}
          for k, v in pairs(row) do
            if type(v) == "table" then c[k] = {} for i, y in ipairs(v) do c[k][i] = y end else c[k] = v end
          end
          if not with_old then c.old = nil end
          if no_masks then c.mask, c.emask = nil, nil end
          out[m][b] = c
        end
      end
      return out
    end
  end

  for _, lt in ipairs(loss_types) do
    it(("%s on random rollouts (token and sequence level, KL, entropy masks): weights and loss equal TRL's to 1e-12")
      :format(lt), function()
      for seed = 1, 12 do
        local make = random_rollout(seed)
        for _, level in ipairs({ "token", "sequence" }) do
          local o = { loss_type = lt, beta = seed % 3 == 0 and 0 or 0.04, lo = 0.2, hi = ({ 0.28, 0.2, 5, 0.6 })[seed % 4 + 1],
            level = level, L = 7, tau_pos = ({ 1.0, 0.5, 3 })[seed % 3 + 1], tau_neg = ({ 1.05, 2, 0.7 })[seed % 3 + 1] }
          check_all(o, true, ("seed %d, %s level"):format(seed, level), make)
          -- at ratio 1 the clipped objective is the plain -A * logp per token; TRL's sequence-level
          -- ratio spreads an entropy-masked row's gradient over all its tokens instead (a known
          -- difference of top_entropy_quantile < 1 with importance_sampling_level = sequence at
          -- num_iterations = 1): without masks they agree
          local plain = level == "sequence" and not algos.loss_type(lt).token_loss
          check_all(o, false, ("seed %d, %s level, ratio 1"):format(seed, level),
            function(with_old) return make(with_old, plain) end)
        end
      end
    end)
  end

  it("cispo counts a capped weight with A > 0 (TRL's cispo_clip_ratio); sapo clips nothing", function()
    local rows = { { adv = 1, logp = { math.log(6) }, old = { 0 } }, { adv = -1, logp = { math.log(6) }, old = { 0 } },
      { adv = 1, logp = { 0 }, old = { 0 } } }
    local _, st = algos.token_weights(rows, { agg = "token-mean", epsilon_high = 5, loss_type = "cispo" })
    assert.are.same({ 0, 1, 3 }, { st.clip_low, st.clip_high, st.clip_n })
    _, st = algos.token_weights(rows, { agg = "seq-mean-token-mean", epsilon = 0.2, loss_type = "sapo" })
    assert.are.same({ 0, 0, 0 }, { st.clip_low, st.clip_high, st.clip_n })
    -- the capped token still gets a gradient (PPO's clip would give it none): -5 * A / 3 tokens
    local w = algos.token_weights(rows, { agg = "token-mean", epsilon_high = 5, loss_type = "cispo" })
    assert.is_true(math.abs(w[1][1] - (-5 / 3)) < 1e-15)
  end)

  it("cuts the gradient to zero where the clipped term is the minimum", function()
    local lo, hi = 0.2, 0.2
    local function w_of(adv, logp, old)
      local w, st = algos.token_weights({ { adv = adv, logp = { logp }, old = { old } } },
        { agg = "token-mean", epsilon = lo, epsilon_high = hi })
      return w[1][1], st
    end
    local w, st = w_of(1, math.log(1.5), 0)     -- r = 1.5 > 1.2 with A > 0
    assert.are.equal(0, w)
    assert.are.equal(1, st.clip_high)
    w, st = w_of(-1, math.log(0.5), 0)          -- r = 0.5 < 0.8 with A < 0
    assert.are.equal(0, w)
    assert.are.equal(1, st.clip_low)
    w, st = w_of(1, math.log(0.5), 0)           -- r = 0.5 with A > 0: the unclipped term still pulls
    assert.is_true(math.abs(w - (-0.5)) < 1e-15)
    assert.are.equal(0, st.clip_low + st.clip_high)
    w = w_of(-1, math.log(1.5), 0)              -- r = 1.5 with A < 0: still pushed down
    assert.is_true(math.abs(w - 1.5) < 1e-15)
  end)

  it("leaves truncated rows out (mask_truncated_completions) and top-entropy masks the policy term", function()
    local rows = { { adv = 1, logp = { -1, -2 } }, { adv = 1, logp = { -1, -1, -1 }, masked = true } }
    local w, st = algos.token_weights(rows, { agg = "token-mean" })
    assert.are.same({ 0, 0, 0 }, w[2])
    assert.are.equal(2, st.tokens)
    assert.is_true(math.abs(w[1][1] + 0.5) < 1e-15, "token-mean over the 2 unmasked tokens")
    local masks = algos.entropy_masks({ { 0.1, 2.0 }, { 5, 5, 5 } }, { nil, true }, 0.5)
    assert.are.same({ { 0, 1 }, { 0, 0, 0 } }, masks)
    rows[1].mask = masks[1]
    w = algos.token_weights(rows, { agg = "token-mean", beta = 0 })
    assert.are.equal(0, w[1][1])
    assert.is_true(math.abs(w[1][2] + 0.5) < 1e-15)
  end)

  it("normalises the entropy bonus as TRL does (dapo: step tokens; others: micro-batch mean / micro-batches)", function()
    local ents = { { 1.0, 2.0 }, { 3.0 } }
    local d, loss = algos.entropy_bonus(ents, { coef = 0.1, agg = "token-mean", num_tokens = 6 })
    assert.are.same({ { -0.1 / 6, -0.1 / 6 }, { -0.1 / 6 } }, d)
    assert.is_true(math.abs(loss - (-0.1 * 6 / 6)) < 1e-15)
    d, loss = algos.entropy_bonus(ents, { coef = 0.1, agg = "seq-mean-token-mean", chunks = 2,
      masks = { { 1, 0 }, { 1 } }, masked = {} })
    assert.are.same({ { -0.1 / 4, 0 }, { -0.1 / 4 } }, d)
    assert.is_true(math.abs(loss - (-0.1 * (1 + 3) / 4)) < 1e-15)
  end)

  it("takes quantiles as torch.quantile does (linear interpolation)", function()
    assert.are.equal(2.5, algos.quantile({ 4, 1, 3, 2 }, 0.5))
    assert.are.equal(2.5, algos.quantile({ 0, 10 }, 0.25))
    assert.are.equal(10, algos.quantile({ 0, 10 }, 1))
    assert.are.equal(0, algos.quantile({ 0, 10 }, 0))
    assert.is_true(math.abs(algos.quantile({ 1, 2, 3, 4, 5 }, 0.8) - 4.2) < 1e-12)
  end)
end)

describe("TRL reward handling", function()
  local function near(a, b, what) assert.is_true(math.abs(a - b) <= 1e-12, ("%s: %.17g vs %.17g"):format(what, a, b)) end

  it("scale_rewards: group, batch and none (true and false as TRL reads them)", function()
    local groups = { { samples = { 1, 0, 0, 1 } }, { samples = { 3, 1, 2, 2 } } }
    local all = { 1, 0, 0, 1, 3, 1, 2, 2 }
    local bs = algos.std(all)
    local adv = algos.advantages("grpo", groups, { scale_rewards = "batch" })
    near(adv[1][1], 0.5 / (bs + 1e-4), "batch std, group mean")
    near(adv[2][1], 1 / (bs + 1e-4), "batch std, group 2")
    -- under data parallel training the batch is every rank's: a second rank holding the same
    -- groups (global_sum doubles every sum) gives the std of the 16 rewards
    local twice = {}
    for i = 1, 2 do for _, v in ipairs(all) do twice[#twice + 1] = v end end
    local dp = algos.advantages("grpo", groups, { scale_rewards = "batch", global_sum = function(...)
      local out = { ... }
      for i = 1, select("#", ...) do out[i] = 2 * out[i] end
      return unpack(out, 1, select("#", ...))
    end })
    near(dp[2][1], 1 / (algos.std(twice) + 1e-4), "batch std over ranks")
    local none = algos.advantages("grpo", groups, { scale_rewards = "none" })
    near(none[2][1], 1, "none")
    assert.are.same(none, algos.advantages("grpo", groups, { scale_rewards = false }))
    assert.are.same(algos.advantages("grpo", groups, { scale_rewards = "group" }),
      algos.advantages("grpo", groups, { scale_rewards = true }))
    assert.has_error(function() algos.advantages("grpo", groups, { scale_rewards = "row" }) end,
      "scale_rewards: unknown value 'row' (valid: group, batch, none)")
  end)

  it("rows no reward scored (NaN) stay out of the baselines and get advantage 0", function()
    local nan = 0 / 0
    local adv = algos.advantages("grpo", { { samples = { 1, nan, 0 } } })
    local s = algos.std({ 1, 0 })
    near(adv[1][1], 0.5 / (s + 1e-4), "grpo over the scored rows")
    assert.are.equal(0, adv[1][2])
    adv = algos.advantages("remax", { { samples = { 1, 0 }, greedy = nan }, { samples = { 1, nan }, greedy = 0.5 } })
    assert.are.same({ { 0, 0 }, { 0.5, 0 } }, adv)
    adv = algos.advantages("rloo", { { samples = { 1, nan } }, { samples = { 1, 0, nan } } })
    assert.are.same({ { 0, 0 }, { 1, -1, 0 } }, adv)
    local a2, st = algos.advantages("reinforce", { { samples = { 1, nan, 0 } } }, { baseline = "mean" })
    assert.are.same({ 0.5, 0, -0.5 }, a2[1])
    assert.are.equal(0.5, st.mean)
  end)

  it("normalize_then_sum normalises each reward in its group, sums, then normalises the batch", function()
    local nan = 0 / 0
    -- two reward functions, two prompts of two samples
    local per = { { { 1, 0 }, { 1, 1 } }, { { 0.2, 0.4 }, { nan, 0.3 } } }
    local adv = algos.normalize_then_sum(per, { 1, 2 })
    local s1 = algos.std({ 1, 0 })
    local s2 = algos.std({ 0.2, 0.4 })
    local sums = {
      0.5 / (s1 + 1e-4) + 2 * (-0.1 / (s2 + 1e-4)),
      -0.5 / (s1 + 1e-4) + 2 * (0.1 / (s2 + 1e-4)),
      0,            -- function 1: equal scores, z = 0; function 2: no score
      0 + 2 * 0,    -- function 2 alone in its group: z = 0
    }
    local m, s = algos.mean(sums), algos.std(sums)
    near(adv[1][1], (sums[1] - m) / (s + 1e-4), "p1 s1")
    near(adv[1][2], (sums[2] - m) / (s + 1e-4), "p1 s2")
    near(adv[2][1], (sums[3] - m) / (s + 1e-4), "p2 s1")
    near(adv[2][2], (sums[4] - m) / (s + 1e-4), "p2 s2")
    adv = algos.normalize_then_sum({ { { nan, 1 } } }, nil)
    assert.are.equal(0, adv[1][1], "no score at all: advantage 0")
  end)
end)
