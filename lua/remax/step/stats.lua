-- remax.step.stats: the mean and the unbiased standard deviation of a list of numbers, as torch
-- computes them (torch.std: n - 1), for the estimators (step/algos/*.lua) and the step's metrics.
local M = {}

function M.mean(list)
  local s = 0
  for _, v in ipairs(list) do s = s + v end
  return #list > 0 and s / #list or 0
end

-- Unbiased standard deviation (n - 1), as torch.std and TRL's GRPO use; 0 for one value.
function M.std(list)
  local n = #list
  if n < 2 then return 0 end
  local m, s = M.mean(list), 0
  for _, v in ipairs(list) do s = s + (v - m) ^ 2 end
  return math.sqrt(s / (n - 1))
end

return M
