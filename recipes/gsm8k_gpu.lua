-- gsm8k_gpu: ReMax on GSM8K with a real Qwen2.5 / Qwen3 checkpoint on one NVIDIA GPU, in bf16.
--
--   ./remax run recipes/gsm8k_gpu.lua --model ~/models/Qwen2.5-1.5B-Instruct \
--       --data gsm8k_train.jsonl --eval_data gsm8k_test.jsonl
--   ./remax run recipes/gsm8k_gpu.lua --model ~/models/Qwen3-1.7B --enable_thinking false ...
--   ./remax run recipes/gsm8k_gpu.lua --model DIR --dtype f32     # f32 compute (twice the memory)
--
-- GSM8K's JSONL (question, answer with "#### N") works as is; without --data the recipe draws
-- synthetic problems of the same form (remax.tasks.gsm8k), so it also runs without files. The
-- prompt is the tokenizer's chat template; the reward is 1 for the right final number
-- (rewards/gsm8k.lua).
--
-- What runs on the GPU (docs/gpu.md, "Training on the device"): the policy in bf16 compute with
-- f32 master weights, gradients and AdamW moments, gradient accumulation, clipping, the KL
-- reference when beta > 0, checkpoints. Rollouts are still generated on the CPU from a copy of
-- the weights until generation moves to the device (issue 25): today the CPU's decode speed
-- bounds a step, so start with few prompts per step and short completions, and raise them when
-- generation runs on the GPU. Memory at 1.5B: about 27 GB for weights, gradients and moments,
-- plus activations (gradient checkpointing on); beta > 0 adds a second model on the device.
-- Not yet run on a GPU (docs/gpu.md); the emulator has run the trainer's device path.
local gsm8k = require("remax").tasks.gsm8k

return {
  device = "cuda",
  dtype = "bf16",
  algo = "remax",
  rewards = { "gsm8k" },
  chat_template = "auto",           -- the tokenizer's template (Qwen's chat format)
  data = gsm8k.synthetic({ steps = { 2, 4 }, max_number = 100 }),

  num_generations = 4,              -- sampled rows per prompt, + 1 greedy row (ReMax's baseline)
  temperature = 1.0,
  max_prompt_length = 512,
  max_completion_length = 384,      -- GSM8K solutions of an instruct model fit in ~300 tokens

  per_device_train_batch_size = 8,  -- prompts per micro-batch (40 rows)
  gradient_accumulation_steps = 4,  -- 32 prompts (160 rows) per step
  gradient_checkpointing = true,
  learning_rate = 1e-6,             -- full fine-tuning of a 0.5B-7B instruct model, as TRL's GRPO default
  lr_scheduler_type = "constant",
  warmup_ratio = 0.0,
  weight_decay = 0.0,
  max_grad_norm = 1.0,
  beta = 0.0,                       -- > 0: a KL guard to the starting model (a second model on the GPU)
  max_steps = 200,

  eval_size = 200,                  -- held-out prompts (greedy accuracy); -- eval_data FILE for GSM8K's test split
  eval_steps = 50,
  per_device_eval_batch_size = 64,
  save_steps = 50,
  save_total_limit = 2,
  log_completions = 2,
  seed = 1,
}
