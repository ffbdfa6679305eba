-- remax.step.offpolicy: the off-policy correction of rows the sampler generated with other
-- weights than the ones being trained (older ones under async_mode, or the same ones in another
-- precision), as TRL's vLLM importance-sampling correction does it (GRPOTrainer's
-- vllm_importance_sampling_correction, _mode, _cap):
--
--   ratio = pi(token) / mu(token), pi the policy the update starts from (the training forward's
--   log-probabilities, detached; pi_old when num_iterations > 1), mu the sampler's (the
--   behaviour policy: remax's generator returns each token's log-probability under the unscaled
--   distribution, as the training forward computes it)
--   token_* modes: one ratio per token;  sequence_* modes: exp of the row's summed log-ratio
--   *_truncate: a ratio above cap becomes cap;  *_mask: it becomes 0 (the token or row drops out)
--
-- The ratio multiplies each token's policy-gradient loss (and so its gradient), as a constant;
-- the KL term to the reference is not weighted (TRL adds it after). remax.step.algos's
-- token_weights applies it (a part's is_weight); this module computes it and the statistics
-- TRL logs under sampling/*:
--
--   local st = offpolicy.stats()
--   local w = offpolicy.row_weights(cur, behaviour, "sequence_mask", 3.0, st)   -- w[t]
--   local m = offpolicy.metrics(offpolicy.reduce(world, st), "sequence_mask")      -- sampling/... keys
local M = {}

M.modes = { token_truncate = true, token_mask = true, sequence_truncate = true, sequence_mask = true }

-- An empty accumulator of the statistics (one rank's, one update).
function M.stats()
  return { n = 0, sum = 0, min = math.huge, max = -math.huge, cut = 0,
    tokens = 0, diff_sum = 0, diff_max = 0, kl_sum = 0 }
end

-- The correction's weights of one row's loss tokens: cur[t] the current policy's
-- log-probabilities, behaviour[t] the sampler's, mode and cap as above. Adds the row to st
-- (when given). Returns w[t].
function M.row_weights(cur, behaviour, mode, cap, st)
  local n = #cur
  if #behaviour ~= n then
    error(("off-policy correction: a row has %d loss tokens but the sampler gave %d log-probabilities"):format(n, #behaviour), 0)
  end
  if not M.modes[mode] then
    error(("unknown vllm_importance_sampling_mode '%s' (valid: token_truncate, token_mask, sequence_truncate, sequence_mask)")
      :format(tostring(mode)), 0)
  end
  local sequence, truncate = mode:sub(1, 8) == "sequence", mode:sub(-8) == "truncate"
  local function corrected(r)
    if r > cap then
      if st then st.cut = st.cut + 1 end
      r = truncate and cap or 0
    end
    if st then st.n, st.sum, st.min, st.max = st.n + 1, st.sum + r, math.min(st.min, r), math.max(st.max, r) end
    return r
  end
  if st then   -- how far the two policies are apart, token by token (whatever the mode)
    for t = 1, n do
      local d = cur[t] - behaviour[t]
      st.tokens, st.diff_sum, st.diff_max = st.tokens + 1, st.diff_sum + math.abs(d), math.max(st.diff_max, math.abs(d))
      st.kl_sum = st.kl_sum + (math.exp(d) - 1 - d)   -- k3 estimate of KL(mu || pi) from mu's samples
    end
  end
  local w = {}
  if sequence then
    if n == 0 then return w end
    local s = 0
    for t = 1, n do s = s + (cur[t] - behaviour[t]) end
    local r = corrected(math.exp(s))
    for t = 1, n do w[t] = r end
  else
    for t = 1, n do w[t] = corrected(math.exp(cur[t] - behaviour[t])) end
  end
  return w
end

-- Every rank's statistics combined (a collective when world has several ranks).
function M.reduce(world, st)
  if not world or world.size == 1 then return st end
  local out = {}
  out.n, out.sum, out.cut, out.tokens, out.diff_sum, out.kl_sum = world:sum(st.n, st.sum, st.cut, st.tokens, st.diff_sum, st.kl_sum)
  out.max, out.diff_max = world:max(st.max, st.diff_max)
  out.min = world:min(st.min)
  return out
end

-- The metrics TRL logs for the correction (sampling/...), plus the share of ratios cut and the
-- KL between the sampler's policy and the current one. nil when no row was corrected.
function M.metrics(st, mode)
  if not st or st.n == 0 then return nil end
  local m = {}
  m["sampling/importance_sampling_ratio/mean"] = st.sum / st.n
  m["sampling/importance_sampling_ratio/min"] = st.min
  m["sampling/importance_sampling_ratio/max"] = st.max
  m[(mode:sub(-8) == "truncate") and "sampling/importance_sampling_ratio/clipped_fraction"
    or "sampling/importance_sampling_ratio/masked_fraction"] = st.cut / st.n
  if st.tokens > 0 then
    m["sampling/sampling_logp_difference/mean"] = st.diff_sum / st.tokens
    m["sampling/sampling_logp_difference/max"] = st.diff_max
    m["sampling/kl"] = st.kl_sum / st.tokens
  end
  return m
end

return M
