-- tiny_sft: stage 1 of the built-in base model: writes models/tiny-gsm8k-stage1.
-- A small Qwen2-architecture model with the byte-level tokenizer, trained from random weights by
-- supervised fine-tuning (cross-entropy on the answer tokens) on fresh synthetic GSM8K-style
-- problems (remax.tasks.gsm8k_synth) with worked solutions, evaluated by greedy accuracy on the
-- held-out split. Stage 2, recipes/tiny_sft_styles.lua, makes models/tiny-gsm8k from it.
--
--   ./remax run recipes/tiny_sft.lua                    # writes models/tiny-gsm8k-stage1/
--   ./remax run recipes/tiny_sft.lua --max_steps 200    # a quick try (any setting: --key value)
--   ./remax run recipes/tiny_sft.lua --help             # every setting
--
-- Prompts are rendered "Question: ...\nAnswer: " (the qa template, picked automatically for a
-- tokenizer without a chat template); the target is the worked solution ending in "#### N".
local gsm8k = require("remax").tasks.gsm8k

return {
  algo = "sft",

  -- no model: a fresh random model of this shape (vocab_size comes from the tokenizer)
  model_config = {
    architectures = { "Qwen2ForCausalLM" },
    hidden_size = 256, intermediate_size = 688, num_hidden_layers = 4,
    num_attention_heads = 8, num_key_value_heads = 2,
    max_position_embeddings = 1024, rope_theta = 10000, rms_norm_eps = 1e-6,
    tie_word_embeddings = true, initializer_range = 0.02,
  },

  -- data: fresh synthetic problems (train split); held-out accuracy on the test split. One- and
  -- two-step problems with numbers up to 12: learnable by a 3M-parameter model in half an hour
  -- on 2 cores
  data = gsm8k.synthetic({ steps = { 1, 2 }, max_number = 12 }),
  train_size = 50000,
  eval_size = 200,
  rewards = { "gsm8k" },          -- used for the held-out accuracy

  max_prompt_length = 256,
  max_completion_length = 320,    -- the longest synthetic solutions are ~275 bytes

  learning_rate = 2e-3,
  lr_scheduler_type = "cosine",
  warmup_ratio = 0.03,
  weight_decay = 0.01,
  adam_beta2 = 0.99,
  max_grad_norm = 1.0,
  per_device_train_batch_size = 32,
  gradient_accumulation_steps = 1,
  loss_agg_mode = "token-mean",
  max_steps = 1200,

  seed = 1,
  eval_steps = 300,
  save_steps = 300,
  logging_steps = 10,
  save_final_model = "models/tiny-gsm8k-stage1",
}
