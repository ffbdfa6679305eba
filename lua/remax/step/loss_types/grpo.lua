-- remax.step.loss_types.grpo: TRL's loss_type = "grpo": the clipped surrogate (PPO's, with
-- epsilon, epsilon_high and delta: step/algos.lua's clipped_loss), each row's tokens averaged,
-- then the rows: sum_t l_t / T_i, mean over rows.
return {
  name = "grpo", rank = 1,
  aggregation = "seq-mean-token-mean",
  normalisation = "token mean per row, mean over rows",
}
