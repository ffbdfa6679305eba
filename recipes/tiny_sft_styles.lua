-- tiny_sft_styles: stage 2 of the built-in base model models/tiny-gsm8k.
--
--   ./remax run recipes/tiny_sft.lua            # stage 1: models/tiny-gsm8k-stage1 (from scratch)
--   ./remax run recipes/tiny_sft_styles.lua     # stage 2: models/tiny-gsm8k (this file)
--
-- Stage 1 teaches a fresh random model the task and its arithmetic with worked solutions
-- ("sentences": a worded line per step, then "#### N"). Stage 2 goes on with SFT on a mix of two
-- solution styles for the same kind of problem: 65% direct answers ("#### N" only) and 35% the
-- worked solutions. A model this small cannot do two steps of arithmetic in its head, so its
-- direct answers are often wrong while its worked ones are mostly right; greedy decoding takes
-- the more frequent style, direct, and sampling finds the worked one about a third of the time.
-- That is the headroom the default ReMax run (recipes/gsm8k.lua) uses: a reward for the right
-- answer teaches the model to show its work. `remax eval recipes/gsm8k.lua --samples 8` shows it.
local gsm8k = require("remax").tasks.gsm8k

return {
  algo = "sft",
  model = "models/tiny-gsm8k-stage1",

  train_size = 20000,
  eval_size = 200,
  data = gsm8k.synthetic({ steps = { 1, 2 }, max_number = 12, style = "direct:0.65,sentences:0.35" }),
  rewards = { "gsm8k" },

  max_prompt_length = 256,
  max_completion_length = 320,

  learning_rate = 1e-3,
  lr_scheduler_type = "cosine",
  warmup_ratio = 0.05,
  weight_decay = 0.01,
  adam_beta2 = 0.99,
  max_grad_norm = 1.0,
  per_device_train_batch_size = 64,
  gradient_accumulation_steps = 1,
  loss_agg_mode = "token-mean",
  max_steps = 150,

  seed = 11,                      -- another seed than stage 1's (1) and the ReMax run's (2)
  eval_steps = 50,
  save_steps = 50,
  logging_steps = 10,
  save_final_model = "models/tiny-gsm8k",
}
