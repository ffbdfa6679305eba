-- gsm8k: ReMax on GSM8K-style math problems.
--
--   ./remax run recipes/gsm8k.lua                       # the built-in base model, synthetic problems
--   ./remax run recipes/gsm8k.lua --model ~/models/Qwen2.5-0.5B-Instruct \
--       --data gsm8k_train.jsonl --eval_data gsm8k_test.jsonl     # a real model on real GSM8K
--   ./remax run recipes/gsm8k.lua --algo grpo --num_generations 4  # another estimator
--   ./remax eval recipes/gsm8k.lua --model runs/<name>/checkpoints/step-30
--
-- Per prompt: num_generations sampled completions plus one greedy completion; the advantage of a
-- sample is its reward minus the greedy completion's reward (ReMax). The reward is 1 for the right
-- final answer (rewards/gsm8k.lua). Prints held-out greedy accuracy before and after.
-- Without --model this trains models/tiny-gsm8k (made by recipes/tiny_sft.lua, then
-- recipes/tiny_sft_styles.lua): it answers two ways, directly ("#### N", greedy's pick, often
-- wrong) or with worked steps (sampled a third of the time, mostly right), so the reward has
-- something to teach. About 5 minutes on 2 cores; held-out accuracy 31% -> ~75% (README, Results).
local gsm8k = require("remax").tasks.gsm8k

return {
  algo = "remax",
  rewards = { "gsm8k" },

  -- synthetic problems like the ones models/tiny-gsm8k was trained on (recipes/tiny_sft.lua),
  -- drawn fresh: another seed than the SFT runs, and the held-out split for evaluation
  -- (--data FILE.jsonl trains on a file instead; --eval_data FILE then evaluates)
  data = gsm8k.synthetic({ steps = { 1, 2 }, max_number = 12 }),

  num_generations = 4,            -- sampled rows per prompt (+ 1 greedy row)
  temperature = 1.0,
  max_prompt_length = 512,
  max_completion_length = 320,

  per_device_train_batch_size = 32,   -- prompts per micro-batch
  gradient_accumulation_steps = 1,    -- 32 prompts (160 rows) per step
  learning_rate = 1e-4,
  lr_scheduler_type = "constant",
  warmup_ratio = 0.0,
  max_grad_norm = 1.0,
  beta = 0.0,                     -- > 0 adds a KL guard to the starting model (and loads it twice)
  max_steps = 30,

  eval_size = 500,                -- held-out prompts: one standard error is about 2 points
  eval_steps = 5,
  per_device_eval_batch_size = 256,
  save_steps = 10,
  log_completions = 5,
  seed = 2,
}
