-- recipes/rlhf/reward_model.lua: stage (b) of the RLHF chain (recipes/rlhf/README.md): a reward
-- model trained on the pairs of stage (a), saved where stage (c) reads it.
--
--   ./remax run recipes/rlhf/pairs.lua                 # (a) runs/rlhf/pairs_{train,test}.jsonl
--   ./remax run recipes/rlhf/reward_model.lua          # (b) runs/rlhf/rm (a Qwen2ForSequenceClassification)
--
-- The reward model starts from the built-in base model (its language-model head replaced by a
-- new score head) and learns the Bradley-Terry loss on the pairs; held-out pair accuracy is
-- logged every eval_steps and printed at the end.
return {
  algo = "reward",
  model = "models/tiny-gsm8k",
  data = "runs/rlhf/pairs_train.jsonl",
  eval_data = "runs/rlhf/pairs_test.jsonl",
  eval_size = 1000,                   -- every held-out pair
  per_device_train_batch_size = 16,   -- pairs per forward (32 rows)
  gradient_accumulation_steps = 1,
  learning_rate = 5e-4,
  lr_scheduler_type = "cosine",
  warmup_ratio = 0.05,
  weight_decay = 0.0,
  max_grad_norm = 1.0,
  num_train_epochs = 3,
  center_rewards_coefficient = 0.01,  -- keeps scores near 0 (TRL's suggestion), so ReMax's rewards are centred
  eval_steps = 15,
  save_steps = 0,
  seed = 4,
  dtype = "f32",
  run_name = "rlhf-rm",
  save_final_model = "runs/rlhf/rm",
}
