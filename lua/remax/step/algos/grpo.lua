-- remax.step.algos.grpo: GRPO (Shao et al., 2024, DeepSeekMath), as TRL's GRPOTrainer computes its
-- advantages: A = (r - group mean) / (std + 1e-4), std the group's (scale_rewards = "group", TRL's
-- true), the whole batch's ("batch") or none ("none", TRL's false: A = r - mean). With several
-- reward functions, multi_objective_aggregation = "normalize_then_sum" (TRL's GDPO) normalises each
-- function's scores in its group first (per_reward). The loss is the loss type's per-token policy
-- loss.
local stats = require("remax.step.stats")
local mean, std = stats.mean, stats.std

local M = {
  name = "grpo", rank = 2, choice = "RL with that advantage estimator",
  samples = true,
  min_generations = 2, min_generations_why = "a group of one has no spread",
  settings = { "scale_rewards", "multi_objective_aggregation" },
  loss = "policy",
}

-- TRL's scale_rewards values: true and false as TRL takes them
local function scale_kind(v)
  if v == nil or v == true or v == "group" then return "group" end
  if v == false or v == "none" then return "none" end
  if v == "batch" then return "batch" end
  error(("scale_rewards: unknown value '%s' (valid: group, batch, none)"):format(tostring(v)), 0)
end
M.scale_kind = scale_kind

-- opts.scale_rewards, opts.eps (1e-4), opts.global_sum(...) (sums over every rank's groups)
function M.estimator(groups, opts)
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
  local adv = {}
  for i, g in ipairs(groups) do
    local m = mean(g.samples)
    local s = batch_std or std(g.samples)
    local a = {}
    for j, r in ipairs(g.samples) do
      a[j] = kind == "none" and (r - m) or (r - m) / (s + eps)
    end
    adv[i] = a
  end
  return adv
end

local function isnan(v) return v ~= v end

-- TRL's multi_objective_aggregation = "normalize_then_sum" (GDPO): each reward function's
-- scores are normalised within each prompt's group, (s - mean) / (std + 1e-4), then summed with
-- the weights; the sums are normalised over the whole batch. per[k][i][j]: score of function k
-- for sample j of prompt i (NaN: no score; left out of its means and stds and of the sum; a
-- sample with no score at all gets advantage 0). Returns adv[i][j].
function M.per_reward(per, weights, eps)
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

return M
