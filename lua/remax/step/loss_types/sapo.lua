-- remax.step.loss_types.sapo: TRL's loss_type = "sapo" (Soft Adaptive Policy Optimization,
-- arXiv 2511.20347): a smooth gate in place of the hard clip. TRL's grpo_trainer.py:
--   temperatures = torch.where(advantages > 0, sapo_temperature_pos, sapo_temperature_neg)
--   soft_coef_1 = torch.sigmoid(temperatures * (coef_1 - 1)) * 4 / temperatures
--   per_token_loss = -soft_coef_1 * advantages
-- normalised as grpo (each row's token mean, mean over rows). At ratio 1 the gate's slope is 1
-- for any temperature, so the gradient is -A, the plain policy gradient; away from 1 it fades.
local M = {
  name = "sapo", rank = 6,
  aggregation = "seq-mean-token-mean",
  normalisation = "token mean per row, mean over rows, as grpo",
  settings = { "sapo_temperature_pos", "sapo_temperature_neg" },
  defaults = { sapo_temperature_pos = 1.0, sapo_temperature_neg = 1.05 },   -- TRL's GRPOConfig
  ignores = {
    epsilon = "does not use it (its soft gate replaces clipping; sapo_temperature_pos and sapo_temperature_neg shape the gate)",
    epsilon_high = "does not use it (its soft gate replaces clipping; sapo_temperature_pos and sapo_temperature_neg shape the gate)",
    delta = "does not use it (its soft gate replaces clipping; sapo_temperature_pos and sapo_temperature_neg shape the gate)",
  },
}

-- Returns the loss and d loss / d log r: with s = sigmoid(tau (r - 1)),
-- d/d log r of -(4 / tau) s A = -4 s (1 - s) r A.
function M.token_loss(r, A, lp, o)
  local tau = A > 0 and o.sapo_temperature_pos or o.sapo_temperature_neg
  local s = 1 / (1 + math.exp(-tau * (r - 1)))
  return -(s * 4 / tau) * A, -4 * s * (1 - s) * r * A
end

M.clipped = false   -- nothing is clipped: no clip_ratio metrics

return M
