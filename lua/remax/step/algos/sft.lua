-- remax.step.algos.sft: supervised fine-tuning: cross-entropy of the dataset's answers given their
-- prompts (the policy loss at advantage 1 with no KL term, aggregated by loss_agg_mode). Nothing
-- is sampled, so no estimator; the Step's sft_rows makes the rows (step/step.lua).
return {
  name = "sft", rank = 5, choice = "cross-entropy on prompt -> answer",
  samples = false,
  settings = {},
  loss = "cross_entropy",
}
