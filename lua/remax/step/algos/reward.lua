-- remax.step.algos.reward: a reward model trained on preference pairs with the Bradley-Terry loss
-- -log sigmoid(r_chosen - r_rejected - margin), as TRL's RewardTrainer; a Step of its own
-- (step/reward_model.lua), chosen by the Run. Nothing is sampled, so no estimator.
return {
  name = "reward", rank = 6, choice = "a reward model from preference pairs: Bradley-Terry, as TRL's RewardTrainer",
  samples = false,
  settings = { "chosen_column", "rejected_column", "margin_column", "center_rewards_coefficient" },
  loss = "bradley_terry",
}
