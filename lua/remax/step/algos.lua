-- remax.step.algos: advantage estimators and the per-token loss, as pure functions of plain Lua values.
--
-- A step's rewards come grouped by prompt: groups[i] = {samples = {r_1, ..., r_G}, greedy = r_g}
-- (greedy: the reward of the prompt's greedy completion; nil when none was generated).
--
--   local adv, state = algos.advantages("remax", groups, {clip = 0})      -- adv[i][j]
--   local w, stats = algos.token_weights(rows, {beta = 0.01, kl = "k3", agg = "seq-mean-token-mean",
--                                              num_rows = R, num_tokens = N})
--   -- w[r][t] = d loss / d logp of completion token t of row r: what model:backward takes.
local M = {}

local function mean(list)
  local s = 0
  for _, v in ipairs(list) do s = s + v end
  return #list > 0 and s / #list or 0
end

-- Unbiased standard deviation (n - 1), as torch.std and TRL's GRPO use; 0 for one value.
local function std(list)
  local n = #list
  if n < 2 then return 0 end
  local m, s = mean(list), 0
  for _, v in ipairs(list) do s = s + (v - m) ^ 2 end
  return math.sqrt(s / (n - 1))
end
M.mean, M.std = mean, std

local function each_group(groups, f)
  local adv = {}
  for i, g in ipairs(groups) do adv[i] = f(g, i) end
  return adv
end

M.estimators = {}

-- ReMax: the baseline is the reward of the same prompt's greedy completion.
function M.estimators.remax(groups)
  return each_group(groups, function(g, i)
    if type(g.greedy) ~= "number" then
      error(("remax advantage: prompt %d has no greedy reward (generate_greedy must be true)"):format(i), 0)
    end
    local a = {}
    for j, r in ipairs(g.samples) do a[j] = r - g.greedy end
    return a
  end)
end

-- GRPO: (r - group mean) / (std + eps), TRL's scale_rewards: "group" (default, true) divides by
-- the group's standard deviation, "batch" by the standard deviation of every sample reward of
-- the step, "none" (false) keeps r - mean.
local function scale_kind(v)
  if v == nil or v == true or v == "group" then return "group" end
  if v == false or v == "none" then return "none" end
  if v == "batch" then return "batch" end
  error(("scale_rewards: unknown value '%s' (valid: group, batch, none)"):format(tostring(v)), 0)
end
M.scale_kind = scale_kind

function M.estimators.grpo(groups, opts)
  local eps = opts.eps or 1e-4
  local kind = scale_kind(opts.scale_rewards)
  local batch_std
  if kind == "batch" then
    -- the step's samples on every rank (opts.global_sum under data parallel training): two
    -- passes, as std() does, so one process gets the same bits either way
    local gsum = opts.global_sum or function(...) return ... end
    local sum, n = 0, 0
    for _, g in ipairs(groups) do for _, r in ipairs(g.samples) do sum, n = sum + r, n + 1 end end
    sum, n = gsum(sum, n)
    local m, dev = n > 0 and sum / n or 0, 0
    for _, g in ipairs(groups) do for _, r in ipairs(g.samples) do dev = dev + (r - m) ^ 2 end end
    dev = gsum(dev)
    batch_std = n >= 2 and math.sqrt(dev / (n - 1)) or 0
  end
  return each_group(groups, function(g)
    local m = mean(g.samples)
    local s = batch_std or std(g.samples)
    local a = {}
    for j, r in ipairs(g.samples) do
      a[j] = kind == "none" and (r - m) or (r - m) / (s + eps)
    end
    return a
  end)
end

-- RLOO: the baseline of each sample is the mean of the other samples of its prompt.
function M.estimators.rloo(groups)
  return each_group(groups, function(g, i)
    local n = #g.samples
    if n < 2 then error(("rloo advantage: prompt %d has %d sample(s); rloo needs num_generations >= 2"):format(i, n), 0) end
    local s = 0
    for _, r in ipairs(g.samples) do s = s + r end
    local a = {}
    for j, r in ipairs(g.samples) do a[j] = r - (s - r) / (n - 1) end
    return a
  end)
end

-- REINFORCE: no baseline (baseline = "none"), or a running mean of past batch rewards
-- (baseline = "mean"): A = r - b, where b is the running mean before this batch (this batch's
-- mean on the first step); then b <- momentum * b + (1 - momentum) * batch mean.
function M.estimators.reinforce(groups, opts, state)
  local kind = opts.baseline or "none"
  if kind == "none" then
    return each_group(groups, function(g)
      local a = {}
      for j, r in ipairs(g.samples) do a[j] = r end
      return a
    end), state
  elseif kind ~= "mean" then
    error(("reinforce advantage: unknown baseline '%s' (valid: none, mean)"):format(tostring(kind)), 0)
  end
  local sum, count = 0, 0
  for _, g in ipairs(groups) do for _, r in ipairs(g.samples) do sum, count = sum + r, count + 1 end end
  -- with several ranks, the batch is every rank's share: opts.global_sum(...) sums over ranks
  if opts.global_sum then sum, count = opts.global_sum(sum, count) end
  local batch_mean = count > 0 and sum / count or 0
  local b = state and state.mean
  if b == nil then b = batch_mean end
  local m = opts.momentum or 0.9
  local adv = each_group(groups, function(g)
    local a = {}
    for j, r in ipairs(g.samples) do a[j] = r - b end
    return a
  end)
  local prev = state and state.mean
  return adv, { mean = prev == nil and batch_mean or m * prev + (1 - m) * batch_mean }
end

M.estimator_names = { "remax", "grpo", "rloo", "reinforce" }

local function isnan(v) return v ~= v end

-- Rows no reward scored (every reward returned nil) arrive as NaN, as in TRL: they are left out
-- of every baseline and statistic and get advantage 0. A group keeps its scored samples; it is
-- left out whole (advantages 0) when none is scored, when remax has no scored greedy row, or
-- when rloo keeps fewer than two samples. Returns the groups the estimator sees and, for each,
-- {prompt index, sample indices}.
local function scored_groups(groups, kind)
  local any = false
  for _, g in ipairs(groups) do
    if g.greedy ~= nil and isnan(g.greedy) then any = true end
    for _, r in ipairs(g.samples) do if isnan(r) then any = true end end
  end
  if not any then return groups, nil end
  local out, back = {}, {}
  for i, g in ipairs(groups) do
    local samples, idx = {}, {}
    for j, r in ipairs(g.samples) do
      if not isnan(r) then samples[#samples + 1], idx[#idx + 1] = r, j end
    end
    local greedy = g.greedy
    if greedy ~= nil and isnan(greedy) then greedy = nil end
    local keep = #samples > 0 and not (kind == "remax" and greedy == nil) and not (kind == "rloo" and #samples < 2)
    if keep then
      local ng = {}
      for k, v in pairs(g) do ng[k] = v end
      ng.samples, ng.greedy = samples, greedy
      out[#out + 1] = ng
      back[#back + 1] = { i, idx }
    end
  end
  return out, back
end

-- Advantages for every sample: kind is a name above or function(groups, opts, state) ->
-- adv[, state]. opts.clip > 0 clips every advantage to [-clip, clip]. Rewards that are NaN
-- (unscored rows) get advantage 0 and stay out of the baselines (see scored_groups). Returns
-- adv, state. opts.global_sum(a, b, ...), when given, returns each number summed over every
-- rank's groups (data parallel training): statistics over the whole batch (the REINFORCE running
-- mean) use it.
function M.advantages(kind, groups, opts, state)
  opts = opts or {}
  local f = type(kind) == "function" and kind or M.estimators[kind]
  if not f then
    error(("unknown advantage estimator '%s' (valid: %s, or a Lua function)"):format(
      tostring(kind), table.concat(M.estimator_names, ", ")), 0)
  end
  local seen, back = scored_groups(groups, kind)
  local adv, new_state
  if #seen > 0 then
    adv, new_state = f(seen, opts, state)
  else
    adv, new_state = {}, state
  end
  if type(adv) ~= "table" then
    error(("advantage function returned a %s, expected a list (one list per prompt)"):format(type(adv)), 0)
  end
  local clip = opts.clip or 0
  for i, g in ipairs(seen) do
    local a = adv[i]
    if type(a) ~= "table" then
      error(("advantage function: entry %d is a %s, expected a list of %d numbers"):format(i, type(a), #g.samples), 0)
    end
    for j = 1, #g.samples do
      local v = a[j]
      if type(v) ~= "number" or v ~= v then
        error(("advantage function: prompt %d sample %d is %s, expected a number"):format(i, j, tostring(v)), 0)
      end
      if clip > 0 then a[j] = math.max(-clip, math.min(clip, v)) end
    end
  end
  if back then
    local full = {}
    for i, g in ipairs(groups) do
      full[i] = {}
      for j = 1, #g.samples do full[i][j] = 0 end
    end
    for k, map in ipairs(back) do
      for n, j in ipairs(map[2]) do full[map[1]][j] = adv[k][n] end
    end
    adv = full
  end
  return adv, new_state
end

-- TRL's multi_objective_aggregation = "normalize_then_sum" (GDPO): each reward function's
-- scores are normalised within each prompt's group, (s - mean) / (std + 1e-4), then summed with
-- the weights; the sums are normalised over the whole batch. per[k][i][j]: score of function k
-- for sample j of prompt i (NaN: no score; left out of its means and stds and of the sum; a
-- sample with no score at all gets advantage 0). Returns adv[i][j].
function M.normalize_then_sum(per, weights, eps)
  eps = eps or 1e-4
  local K = #per
  local P = K > 0 and #per[1] or 0
  local sums, all = {}, {}
  for i = 1, P do
    sums[i] = {}
    for j = 1, #per[1][i] do sums[i][j] = 0 / 0 end
  end
  for k = 1, K do
    local w = weights and weights[k] or 1
    for i = 1, P do
      local vals = {}
      for _, v in ipairs(per[k][i]) do if not isnan(v) then vals[#vals + 1] = v end end
      local m, s = mean(vals), std(vals)
      for j, v in ipairs(per[k][i]) do
        if not isnan(v) then
          local z = (v - m) / (s + eps)
          sums[i][j] = (isnan(sums[i][j]) and 0 or sums[i][j]) + w * z
        end
      end
    end
  end
  for i = 1, P do for _, v in ipairs(sums[i]) do if not isnan(v) then all[#all + 1] = v end end end
  local m, s = mean(all), std(all)
  local adv = {}
  for i = 1, P do
    adv[i] = {}
    for j, v in ipairs(sums[i]) do adv[i][j] = isnan(v) and 0 or (v - m) / (s + eps) end
  end
  return adv
end

---------------------------------------------------------------------------- KL estimators

-- Per-token KL(pi || ref) estimators from logp = log pi(token), ref = log ref(token).
-- k1 = logp - ref (unbiased, high variance; folded into the reward);
-- k3 = exp(ref - logp) - (ref - logp) - 1 (>= 0, low variance; added to the loss).
function M.kl_k1(logp, ref) return logp - ref end
function M.kl_k3(logp, ref)
  local d = ref - logp
  return math.exp(d) - d - 1
end
-- d k3 / d logp
function M.kl_k3_grad(logp, ref) return 1 - math.exp(ref - logp) end

-- k1 folded into a sequence's reward: r - beta * sum_t (logp_t - ref_t).
function M.fold_kl(reward, logp, ref, beta)
  local s = 0
  for t = 1, #logp do s = s + logp[t] - ref[t] end
  return reward - beta * s, s
end

-- The original ReMax's per-token return (liziniu/ReMax, whose trainer is DeepSpeed-Chat's; remax's
-- gamma setting): for a completion of T tokens with advantage A (r - r_greedy, clipped by
-- advantage_clip), token t (1-based) gets
--   return_t = -beta * (logp_t - ref_t) + gamma^(T - t) * A
-- the KL a per-token penalty at its own token (not summed over the later ones: the original's
-- cumulative_kl is overwritten at every position), A discounted from the last token back. ref
-- nil (beta = 0): no KL term. Returns the list of returns and the sum of logp_t - ref_t.
function M.gamma_returns(A, logp, ref, beta, gamma)
  local out, kl_sum, disc = {}, 0, 1
  for t = #logp, 1, -1 do
    local kl = ref and (logp[t] - ref[t]) or 0
    kl_sum = kl_sum + kl
    out[t] = -beta * kl + disc * A
    disc = disc * gamma
  end
  return out, kl_sum
end

-- M.gamma_returns of every sampled row of a rollout (its advantage ro.adv[prompt][slot]);
-- fetch(which) -> the policy's and the reference's log-probabilities of the completion tokens
-- of rows `which` (row indices), or fetch nil (beta = 0: no KL term). Returns returns[k] and
-- kl_k1[k] (the summed log-ratio of row k; nil without fetch), by row index.
function M.rollout_returns(ro, fetch, beta, gamma)
  local which = {}
  for k, r in ipairs(ro.rows) do if not r.greedy then which[#which + 1] = k end end
  local lp, ref
  if fetch then lp, ref = fetch(which) end
  local returns, kl = {}, lp and {} or nil
  for n, k in ipairs(which) do
    local r = ro.rows[k]
    local logp = lp and lp[n]
    if not logp then
      logp = {}
      for t = 1, #r.tokens do logp[t] = 0 end
    end
    local s
    returns[k], s = M.gamma_returns(ro.adv[r.prompt][r.slot], logp, ref and ref[n], lp and beta or 0, gamma)
    if kl then kl[k] = s end
  end
  return returns, kl
end

---------------------------------------------------------------------------- loss

-- loss_agg_mode values. seq-mean-token-sum-norm is verl's name for Dr. GRPO's normalisation.
M.aggregations = { "seq-mean-token-mean", "token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm" }

-- TRL's loss_type -> the aggregation it implies here, and the names in order: the settings'
-- table (remax.settings.schema), which derives cfg.aggregation from it.
local schema = require("remax.settings.schema")
M.loss_types, M.loss_type_names = schema.loss_types, schema.loss_type_names

local function valid_aggs()
  return table.concat(M.aggregations, ", ")
end

-- The factor each token of a row with n loss tokens carries in the step's loss:
--   seq-mean-token-mean:     1 / (num_rows * n)        (each sequence counts the same; the default)
--   token-mean:              1 / num_tokens            (each token counts the same; TRL's dapo)
--   seq-mean-token-sum:      1 / num_rows              (longer sequences count more)
--   seq-mean-token-sum-norm: 1 / (num_rows * max_length)  (TRL's dr_grpo, max_length =
--                            max_completion_length)
--   micro-token-mean:        1 / (chunk_tokens * chunks)  (TRL's bnpo: the micro-batch's tokens)
-- num_rows and num_tokens are totals over the whole step (every micro-batch), so gradient
-- accumulation gives the same gradient as one big batch. extra = {max_length=, chunk_tokens=,
-- chunks=} for the last two.
function M.row_scale(agg, n, num_rows, num_tokens, extra)
  if n == 0 then return 0 end
  extra = extra or {}
  if agg == "seq-mean-token-mean" then return 1 / (num_rows * n)
  elseif agg == "token-mean" then return 1 / num_tokens
  elseif agg == "seq-mean-token-sum" then return 1 / num_rows
  elseif agg == "seq-mean-token-sum-norm" then
    if not extra.max_length then error("seq-mean-token-sum-norm needs max_length (max_completion_length)", 0) end
    return 1 / (num_rows * extra.max_length)
  elseif agg == "micro-token-mean" then
    if not extra.chunk_tokens then error("micro-token-mean (bnpo) needs chunk_tokens and chunks", 0) end
    return 1 / (math.max(extra.chunk_tokens, 1) * (extra.chunks or 1))
  end
  error(("unknown loss_agg_mode '%s' (valid: %s)"):format(tostring(agg), valid_aggs()), 0)
end

-- The clipped surrogate of one importance ratio r with advantage A (PPO; TRL's grpo/bnpo/
-- dr_grpo/dapo): loss = -min(r' A, clamp(r, 1 - lo, 1 + hi) A), r' = min(r, delta) when delta
-- is set (two-sided clipping). Returns loss and d loss / d log r (= d loss / d logp).
function M.clipped_loss(r, A, lo, hi, delta)
  local inside = r >= 1 - lo and r <= 1 + hi
  local c2 = r < 1 - lo and 1 - lo or (r > 1 + hi and 1 + hi or r)
  local capped = delta ~= nil and r > delta
  local c1 = capped and delta or r
  local l1, l2 = c1 * A, c2 * A
  if l1 <= l2 then
    return -l1, capped and 0 or -A * r
  end
  return -l2, inside and -A * r or 0
end

-- Which side a ratio is clipped on (TRL's clip_ratio/low and /high): low when r < 1 - lo with
-- A < 0, high when r > 1 + hi with A > 0 (the cases where clipping removes the gradient).
local function clip_side(r, A, lo, hi)
  return (r < 1 - lo and A < 0), (r > 1 + hi and A > 0)
end

-- rows[r] = {adv = A, logp = {...}, ref = {...} or nil, old = {...} or nil, mask = {...} or nil,
-- masked = true or nil, returns = {...} or nil}: the completion tokens of one row; returns (gamma:
-- M.gamma_returns) replaces A token by token. old: the log-probabilities of the
-- policy that generated the rollout (num_iterations > 1); without it the ratio is exactly 1 and
-- the loss is today's -A * logp, whose gradient is the same. mask[t] = 0 leaves token t out of
-- the policy term (top_entropy_quantile); masked = true leaves the whole row out of the loss and
-- of the token counts (mask_truncated_completions; the row still counts in num_rows).
--
-- Per-token loss, with r_t = exp(logp_t - old_t) (importance_sampling_level = "token") or
-- r = exp(mean_t (logp_t - old_t)) for every token of the row ("sequence", GSPO):
--   l_t = mask_t * clipped_loss(r_t, A) + beta * k3_t       (kl = "k3")
--   l_t = mask_t * clipped_loss(r_t, A)                      (kl = "k1": the KL is in A already)
-- and the step's loss is sum over rows and tokens of row_scale * l_t. SFT is adv = 1, beta = 0.
-- opts: beta, kl, agg, num_rows, num_tokens (step totals), max_length, chunk_tokens, chunks,
-- epsilon (0.2), epsilon_high (= epsilon), delta (nil), level ("token").
-- Returns weights[r][t] = d loss / d logp_t and stats {loss=, kl_sum=, tokens=, clip_low=,
-- clip_high=, clip_n=}: loss is this part's share of the step's loss, kl_sum the sum of the
-- per-token KL estimates (k3 or k1) over loss tokens, clip_* counts of clipped tokens (rows at
-- sequence level) among clip_n.
function M.token_weights(rows, opts)
  local beta, kl, agg = opts.beta or 0, opts.kl or "k3", opts.agg or "seq-mean-token-mean"
  if kl ~= "k3" and kl ~= "k1" then error(("unknown kl_estimator '%s' (valid: k3, k1)"):format(tostring(kl)), 0) end
  local level = opts.level or "token"
  if level ~= "token" and level ~= "sequence" then
    error(("unknown importance_sampling_level '%s' (valid: token, sequence)"):format(tostring(level)), 0)
  end
  local lo = opts.epsilon or 0.2
  local hi = opts.epsilon_high or lo
  local delta = opts.delta
  local num_rows, num_tokens = opts.num_rows, opts.num_tokens
  if not num_rows or not num_tokens then
    num_rows, num_tokens = #rows, 0
    for _, row in ipairs(rows) do if not row.masked then num_tokens = num_tokens + #row.logp end end
  end
  local extra = { max_length = opts.max_length, chunk_tokens = opts.chunk_tokens, chunks = opts.chunks }
  if agg == "micro-token-mean" and not extra.chunk_tokens then
    extra.chunk_tokens, extra.chunks = num_tokens, 1
  end
  local weights, loss, kl_sum, tokens = {}, 0, 0, 0
  local clip_low, clip_high, clip_n = 0, 0, 0
  for r, row in ipairs(rows) do
    local n, A, lp, ref, old, mask = #row.logp, row.adv, row.logp, row.ref, row.old, row.mask
    local returns = row.returns   -- per-token advantages (gamma), else A for every token
    local isw = row.is_weight     -- the sampler's importance weights (remax.step.offpolicy), or nil
    local w = {}
    if row.masked then
      for t = 1, n do w[t] = 0 end
    else
      local c = M.row_scale(agg, n, num_rows, num_tokens, extra)
      -- sequence level: one ratio for the row; each token's logp moves it by r / n
      local seq_loss, seq_grad
      if old and level == "sequence" and n > 0 then
        local s = 0
        for t = 1, n do s = s + (lp[t] - old[t]) end
        local ratio = math.exp(s / n)
        seq_loss, seq_grad = M.clipped_loss(ratio, A, lo, hi, delta)
        local l, h = clip_side(ratio, A, lo, hi)
        clip_low, clip_high, clip_n = clip_low + (l and 1 or 0), clip_high + (h and 1 or 0), clip_n + 1
        local m_sum = 0
        for t = 1, n do m_sum = m_sum + (mask and mask[t] or 1) end
        seq_grad = seq_grad * m_sum / n   -- d/d logp_t of sum_t' mask_t' * loss(r)
      end
      for t = 1, n do
        local m = mask and mask[t] or 1
        local At = returns and returns[t] or A
        local l, g
        if not old then
          l, g = -At * lp[t], -At
        elseif level == "token" then
          local ratio = math.exp(lp[t] - old[t])
          l, g = M.clipped_loss(ratio, At, lo, hi, delta)
          local cl, ch = clip_side(ratio, At, lo, hi)
          clip_low, clip_high, clip_n = clip_low + (cl and 1 or 0), clip_high + (ch and 1 or 0), clip_n + 1
        else
          l, g = seq_loss, seq_grad
        end
        if m ~= 1 then
          l = m * l
          if not (old and level == "sequence") then g = m * g end
        end
        if isw then l, g = isw[t] * l, isw[t] * g end   -- the off-policy correction (remax.step.offpolicy)
        if ref then
          if kl == "k3" then
            local k = M.kl_k3(lp[t], ref[t])
            kl_sum = kl_sum + k
            if beta ~= 0 then
              l = l + beta * k
              g = g + beta * M.kl_k3_grad(lp[t], ref[t])
            end
          else
            kl_sum = kl_sum + M.kl_k1(lp[t], ref[t])
          end
        end
        loss = loss + c * l
        w[t] = c * g
      end
      tokens = tokens + n
    end
    weights[r] = w
  end
  return weights, { loss = loss, kl_sum = kl_sum, tokens = tokens, clip_low = clip_low, clip_high = clip_high,
    clip_n = clip_n }
end

---------------------------------------------------------------------------- entropy

-- The q-quantile of a list of numbers with linear interpolation between order statistics
-- (torch.quantile's default): position q * (n - 1) in the sorted list.
function M.quantile(list, q)
  local n = #list
  if n == 0 then return nil end
  local s = {}
  for i, v in ipairs(list) do s[i] = v end
  table.sort(s)
  local pos = q * (n - 1)
  local i = math.floor(pos)
  local frac = pos - i
  if i + 1 >= n then return s[n] end
  return s[i + 1] + frac * (s[i + 2] - s[i + 1])
end

-- TRL's top_entropy_quantile mask: among the loss tokens of entropies[r][t] (rows with
-- masked = true left out), keep (1) the tokens whose entropy is >= the (1 - q)-quantile, drop
-- (0) the rest. q = 1 keeps every token. Returns masks[r][t].
function M.entropy_masks(entropies, masked, q)
  local all = {}
  for r, e in ipairs(entropies) do
    if not (masked and masked[r]) then for _, v in ipairs(e) do all[#all + 1] = v end end
  end
  local thr = M.quantile(all, 1 - q)
  local out = {}
  for r, e in ipairs(entropies) do
    local m = {}
    for t, v in ipairs(e) do m[t] = (thr and v >= thr and not (masked and masked[r])) and 1 or 0 end
    out[r] = m
  end
  return out
end

-- The entropy bonus (TRL's entropy_coef): the loss gains -coef * H, H the mean per-token
-- entropy over the step, normalised as TRL normalises it: with agg = "token-mean" (dapo) each
-- token's entropy is divided by the step's loss tokens num_tokens; otherwise by the tokens of its
-- micro-batch (chunk_tokens) times the number of micro-batches. masks[r][t] (top entropy) and
-- masked rows leave tokens out. Returns dH[r][t] = d loss / d entropy_t and the bonus's share of
-- the loss.
function M.entropy_bonus(entropies, opts)
  local coef = opts.coef or 0
  local masks, masked = opts.masks, opts.masked or {}
  local function on(r, t) return not masked[r] and (not masks or masks[r][t] == 1) end
  local scale
  if opts.agg == "token-mean" then
    scale = 1 / math.max(opts.num_tokens, 1)
  else
    local n = opts.count   -- given when the micro-batch's rows run in several packs (remax.step.pack)
    if not n then
      n = 0
      for r, e in ipairs(entropies) do for t = 1, #e do if on(r, t) then n = n + 1 end end end
    end
    scale = 1 / (math.max(n, 1) * (opts.chunks or 1))
  end
  local d, loss = {}, 0
  for r, e in ipairs(entropies) do
    d[r] = {}
    for t, v in ipairs(e) do
      if on(r, t) then
        d[r][t] = -coef * scale
        loss = loss - coef * scale * v
      else
        d[r][t] = 0
      end
    end
  end
  return d, loss
end

return M
