-- tiny_sft_tools: stage 3 of the built-in models, models/tiny-gsm8k-tools: models/tiny-gsm8k taught
-- to call a calculator, the starting model of the calculator demonstration (recipes/gsm8k_tools.lua).
--
--   ./remax run recipes/tiny_sft.lua            # stage 1: models/tiny-gsm8k-stage1 (from scratch)
--   ./remax run recipes/tiny_sft_styles.lua     # stage 2: models/tiny-gsm8k
--   ./remax run recipes/tiny_sft_tools.lua      # stage 3: models/tiny-gsm8k-tools (this file)
--
-- SFT from models/tiny-gsm8k on the same kind of problem with the demonstration's prompt (the
-- system message "You may call the calculator." and the question, in the qa template with
-- "Result:" lines: remax.tasks.gsm8k_tools) and a mix of three answer styles: 60% direct
-- ("#### N"), 30% tool calls (one <tool_call> per arithmetic step, each followed by the
-- calculator's "Result:", then "#### N"), 10% worked sentences. Greedy decoding keeps answering
-- directly (often wrong: the model cannot do two steps in its head); samples call the calculator
-- about a third of the time, and a right answer follows when the calls are right. That is what
-- the ReMax run has to work with. The held-out evaluation here runs greedy episodes with the tool.
local demo = require("remax").tasks.gsm8k_tools

return {
  algo = "sft",
  model = "models/tiny-gsm8k",

  train_size = 8000,
  eval_size = 200,
  data = demo.sft_data({ steps = { 1, 2 }, max_number = 12, style = "direct:0.6,tool:0.3,sentences:0.1" }),
  rewards = { "gsm8k" },
  chat_template = demo.template,
  tools = demo.tools,                 -- the evaluation's episodes call it
  tool_call_format = "qwen",
  stop_strings = demo.STOP,
  max_turns = 4,
  max_episode_length = 1024,

  max_prompt_length = 256,
  max_completion_length = 320,

  learning_rate = 1e-3,
  lr_scheduler_type = "cosine",
  warmup_ratio = 0.05,
  weight_decay = 0.01,
  adam_beta2 = 0.99,
  max_grad_norm = 1.0,
  per_device_train_batch_size = 32,
  gradient_accumulation_steps = 1,
  loss_agg_mode = "token-mean",
  max_steps = 200,

  seed = 21,                      -- another seed than stage 1's (1), stage 2's (11) and the ReMax runs' (2)
  eval_steps = 100,
  save_steps = 100,
  logging_steps = 10,
  save_final_model = "models/tiny-gsm8k-tools",
}
