-- remax.step.loss_types.cispo: TRL's loss_type = "cispo" (MiniMax-M1, arXiv 2506.13585; ScaleRL): the importance
-- weight is capped and detached, and multiplies the plain policy gradient, so a token whose ratio
-- is clipped still gets a gradient (PPO's clip drops it). TRL's grpo_trainer.py:
--   clamped_ratios = torch.clamp(coef_1, max=epsilon_high).detach()
--   per_token_loss = -clamped_ratios * advantages * per_token_logps
-- with epsilon_high TRL's (epsilon_high, else epsilon: its epsilon_max, 5 in ScaleRL) and
-- normalised as dapo: token sum / tokens of the whole step. At ratio 1 (num_iterations = 1) the
-- weight is min(1, epsilon_high): the cap acts there too.
local M = {
  name = "cispo", rank = 5,
  aggregation = "token-mean",
  normalisation = "token sum / tokens of the whole step (num_items_in_batch), as dapo",
  ignores = { delta = "does not use it (it caps its weight at epsilon_high; delta belongs to the clipped objective)" },
  on_policy = { "epsilon", "epsilon_high" },
}

-- r: the importance ratio (a token's, or its row's at sequence level), A: the advantage, lp: the
-- token's log-probability, o.epsilon_high. Returns the loss, d loss / d log r through the ratio
-- (none: the weight is detached) and d loss / d lp directly.
function M.token_loss(r, A, lp, o)
  local w = math.min(r, o.epsilon_high)
  return -w * A * lp, nil, -w * A
end

-- TRL's cispo_clip_ratio: the weight was capped where the advantage is positive (counted as high)
function M.clipped(r, A, o) return false, r > o.epsilon_high and A > 0 end

return M
