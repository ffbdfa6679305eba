-- remax.step.algos.reinforce: REINFORCE (Williams, 1992) with no baseline (reinforce_baseline =
-- "none") or a running mean of the rewards ("mean"): A = r - b, b the running mean before this
-- batch (this batch's mean on the first step); then b <- momentum * b + (1 - momentum) * batch
-- mean. The running mean is the estimator's state, saved in checkpoints. The loss is the loss
-- type's per-token policy loss.
return {
  name = "reinforce", rank = 4, choice = "RL with that advantage estimator",
  samples = true,
  min_generations = 1,
  settings = { "reinforce_baseline", "baseline_momentum" },
  loss = "policy",

  -- opts.baseline ("none" | "mean"), opts.momentum (0.9), opts.global_sum(...) (the sums over
  -- every rank's groups, under data parallel training)
  estimator = function(groups, opts, state)
    local kind = opts.baseline or "none"
    if kind == "none" then
      local adv = {}
      for i, g in ipairs(groups) do
        local a = {}
        for j, r in ipairs(g.samples) do a[j] = r end
        adv[i] = a
      end
      return adv, state
    elseif kind ~= "mean" then
      error(("reinforce advantage: unknown baseline '%s' (valid: none, mean)"):format(tostring(kind)), 0)
    end
    local sum, count = 0, 0
    for _, g in ipairs(groups) do for _, r in ipairs(g.samples) do sum, count = sum + r, count + 1 end end
    -- with several ranks, the batch is every rank's share
    if opts.global_sum then sum, count = opts.global_sum(sum, count) end
    local batch_mean = count > 0 and sum / count or 0
    local b = state and state.mean
    if b == nil then b = batch_mean end
    local m = opts.momentum or 0.9
    local adv = {}
    for i, g in ipairs(groups) do
      local a = {}
      for j, r in ipairs(g.samples) do a[j] = r - b end
      adv[i] = a
    end
    local prev = state and state.mean
    return adv, { mean = prev == nil and batch_mean or m * prev + (1 - m) * batch_mean }
  end,
}
