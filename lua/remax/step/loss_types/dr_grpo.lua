-- remax.step.loss_types.dr_grpo: TRL's loss_type = "dr_grpo" (Liu et al., 2025, "Understanding
-- R1-Zero-Like Training"): the clipped surrogate, token sum / (rows x max_completion_length), a
-- constant that removes the length bias.
return {
  name = "dr_grpo", rank = 3,
  aggregation = "seq-mean-token-sum-norm",
  normalisation = "token sum / (rows x max_completion_length)",
}
