-- remax.algos: advantage estimators and the per-token loss, as pure functions of plain Lua values.
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

-- GRPO: (r - group mean) / (group std + eps); scale_rewards = false keeps r - mean.
function M.estimators.grpo(groups, opts)
  local eps = opts.eps or 1e-4
  return each_group(groups, function(g)
    local m, s = mean(g.samples), std(g.samples)
    local a = {}
    for j, r in ipairs(g.samples) do
      a[j] = opts.scale_rewards == false and (r - m) or (r - m) / (s + eps)
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

-- Advantages for every sample: kind is a name above or function(groups, opts, state) ->
-- adv[, state]. opts.clip > 0 clips every advantage to [-clip, clip]. Returns adv, state.
-- opts.global_sum(a, b, ...), when given, returns each number summed over every rank's groups
-- (data parallel training): statistics over the whole batch (the REINFORCE running mean) use it.
function M.advantages(kind, groups, opts, state)
  opts = opts or {}
  local f = type(kind) == "function" and kind or M.estimators[kind]
  if not f then
    error(("unknown advantage estimator '%s' (valid: %s, or a Lua function)"):format(
      tostring(kind), table.concat(M.estimator_names, ", ")), 0)
  end
  local adv, new_state = f(groups, opts, state)
  if type(adv) ~= "table" then
    error(("advantage function returned a %s, expected a list (one list per prompt)"):format(type(adv)), 0)
  end
  local clip = opts.clip or 0
  for i, g in ipairs(groups) do
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
  return adv, new_state
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

---------------------------------------------------------------------------- loss

M.aggregations = { "seq-mean-token-mean", "token-mean", "seq-mean-token-sum" }

-- The factor each token of a row with n tokens carries in the step's loss:
--   seq-mean-token-mean: 1 / (num_rows * n)   (each sequence counts the same; the default)
--   token-mean:          1 / num_tokens       (each token counts the same)
--   seq-mean-token-sum:  1 / num_rows         (longer sequences count more)
-- num_rows and num_tokens are totals over the whole step (every micro-batch), so gradient
-- accumulation gives the same gradient as one big batch.
function M.row_scale(agg, n, num_rows, num_tokens)
  if n == 0 then return 0 end
  if agg == "seq-mean-token-mean" then return 1 / (num_rows * n)
  elseif agg == "token-mean" then return 1 / num_tokens
  elseif agg == "seq-mean-token-sum" then return 1 / num_rows end
  error(("unknown loss_agg_mode '%s' (valid: %s)"):format(tostring(agg), table.concat(M.aggregations, ", ")), 0)
end

-- rows[r] = {adv = A, logp = {...}, ref = {...} or nil}: the completion tokens of one row.
-- Per-token loss l_t = -A * logp_t + beta * k3_t (kl = "k3"), or -A * logp_t (kl = "k1": the KL
-- is already in A through the reward, or beta = 0). SFT is adv = 1, beta = 0: cross-entropy.
-- Returns weights[r][t] = d loss / d logp_t and stats {loss=, kl_sum=, tokens=}: loss is this
-- part's share of the step's loss, kl_sum the sum of the per-token KL estimates (k3 or k1).
function M.token_weights(rows, opts)
  local beta, kl, agg = opts.beta or 0, opts.kl or "k3", opts.agg or "seq-mean-token-mean"
  if kl ~= "k3" and kl ~= "k1" then error(("unknown kl_estimator '%s' (valid: k3, k1)"):format(tostring(kl)), 0) end
  local num_rows, num_tokens = opts.num_rows, opts.num_tokens
  if not num_rows or not num_tokens then
    num_rows, num_tokens = #rows, 0
    for _, row in ipairs(rows) do num_tokens = num_tokens + #row.logp end
  end
  local weights, loss, kl_sum, tokens = {}, 0, 0, 0
  for r, row in ipairs(rows) do
    local n, A, lp, ref = #row.logp, row.adv, row.logp, row.ref
    local c = M.row_scale(agg, n, num_rows, num_tokens)
    local w = {}
    for t = 1, n do
      local l, g = -A * lp[t], -A
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
    weights[r] = w
  end
  return weights, { loss = loss, kl_sum = kl_sum, tokens = tokens }
end

return M
