-- remax.step.algos.remax: ReMax (Li et al., 2023, "ReMax: A Simple, Effective, and Efficient
-- Reinforcement Learning Method for Aligning Large Language Models"): the baseline of a prompt's
-- sampled completions is the reward of its greedy completion, which the step generates in the same
-- batch. A = r - r(greedy). The loss is the loss type's per-token policy loss (step/algos.lua).
return {
  name = "remax", rank = 1, choice = "RL with that advantage estimator",
  samples = true,                                   -- trains on sampled completions
  needs_greedy = "the greedy row is its baseline",  -- generate_greedy defaults to true, and must be
  min_generations = 1,
  settings = {},                                    -- no setting of its own
  loss = "policy",

  estimator = function(groups)
    local adv = {}
    for i, g in ipairs(groups) do
      if type(g.greedy) ~= "number" then
        error(("remax advantage: prompt %d has no greedy reward (generate_greedy must be true)"):format(i), 0)
      end
      local a = {}
      for j, r in ipairs(g.samples) do a[j] = r - g.greedy end
      adv[i] = a
    end
    return adv
  end,
}
