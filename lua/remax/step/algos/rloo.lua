-- remax.step.algos.rloo: REINFORCE leave-one-out (Kool et al., 2019; Ahmadian et al., 2024): the
-- baseline of each sample is the mean reward of the other samples of its prompt,
-- A_j = r_j - (sum_k r_k - r_j) / (n - 1). The loss is the loss type's per-token policy loss.
return {
  name = "rloo", rank = 3, choice = "RL with that advantage estimator",
  samples = true,
  min_generations = 2,
  min_scored = 2,   -- a group left with one scored sample (the others unscored) gets advantage 0
  settings = {},
  loss = "policy",

  estimator = function(groups)
    local adv = {}
    for i, g in ipairs(groups) do
      local n = #g.samples
      if n < 2 then error(("rloo advantage: prompt %d has %d sample(s); rloo needs num_generations >= 2"):format(i, n), 0) end
      local s = 0
      for _, r in ipairs(g.samples) do s = s + r end
      local a = {}
      for j, r in ipairs(g.samples) do a[j] = r - (s - r) / (n - 1) end
      adv[i] = a
    end
    return adv
  end,
}
