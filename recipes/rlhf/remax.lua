-- recipes/rlhf/remax.lua: stage (c) of the RLHF chain (recipes/rlhf/README.md): ReMax against
-- the reward model of stage (b), with the hidden true preference (the right final answer,
-- rewards/gsm8k.lua) measured beside it but given weight 0: the policy learns from the reward
-- model alone.
--
--   ./remax run recipes/rlhf/remax.lua --beta 0          # no KL: free to over-optimise the RM
--   ./remax run recipes/rlhf/remax.lua                   # beta = 0.2: the original's per-token KL to the starting model
--
-- Metrics: reward/rm:rm (the reward model's score, sampled), reward/gsm8k_accuracy (the truth,
-- sampled); eval_reward (the RM's score of the held-out greedy completions) and eval_accuracy
-- (their truth) before and after. KL as the original ReMax puts it: per token in the return
-- (gamma = 1, docs/trainer.md).
local gsm8k = require("remax.tasks.gsm8k")

return {
  algo = "remax",
  rewards = { "model:runs/rlhf/rm", "gsm8k" },
  reward_weights = { 1, 0 },          -- the reward model alone trains; gsm8k is the measured truth
  data = gsm8k.synthetic({ steps = { 1, 2 }, max_number = 12 }),
  num_generations = 4,
  temperature = 1.0,
  max_prompt_length = 512,
  max_completion_length = 320,
  per_device_train_batch_size = 16,
  gradient_accumulation_steps = 1,
  learning_rate = 3e-4,               -- high for a 2.8M-parameter model: beta = 0 over-optimises within ~10 steps
  lr_scheduler_type = "constant",
  max_grad_norm = 1.0,
  beta = 0.2,                         -- per-token KL in the return (gamma below); 0.05 barely restrains at this lr
  gamma = 1.0,
  max_steps = 30,
  eval_size = 100,
  eval_steps = 15,
  per_device_eval_batch_size = 100,
  save_steps = 0,
  log_completions = 6,
  seed = 2,
  dtype = "f32",
}
