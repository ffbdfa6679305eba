-- gsm8k_tools: ReMax on GSM8K-style problems with a calculator tool. A turn may call
--   <tool_call>{"name": "calculator", "arguments": {"expression": "12 * 7"}}</tool_call>
-- and the episode goes on with the result appended to the same KV cache. A turn without a call is
-- the answer, scored by rewards/gsm8k.lua. The greedy episode (greedy in every turn, with the same
-- tool) is ReMax's baseline. Malformed calls, unknown tools, bad arguments, a failing or hanging
-- calculator all give the episode an error message as the result (docs/environments.md).
--
--   ./remax run recipes/gsm8k_tools.lua
--   ./remax eval recipes/gsm8k_tools.lua --model runs/<name>/checkpoints/step-30
--   ./remax run recipes/gsm8k_tools.lua --model ~/models/Qwen2.5-0.5B-Instruct --chat_template tokenizer
--       (a tokenizer template renders the tool list through its `tools` variable)
--
-- Without --model this trains models/tiny-gsm8k-tools (recipes/tiny_sft_tools.lua taught
-- models/tiny-gsm8k the call format): greedy answers directly, often wrong; about a third of the
-- samples call the calculator, one call per step, and are mostly right. The reward for the right
-- answer teaches the model to use the tool. The prompt, the qa template with "Result:" lines and
-- the calculator are remax.tasks.gsm8k_tools's. Besides the run's own held-out accuracy, the
-- loop below measures held-out tool use before and after (greedy episodes: the share that call
-- the calculator, and that use it correctly: every call answered and the final answer is the
-- last result); the weight-0 reward tool_use logs the same for the training episodes
-- (reward/tool_use, reward_greedy/tool_use). README, "Tools: the calculator demonstration".
local demo = require("remax").tasks.gsm8k_tools
local gsm8k = require("remax").tasks.gsm8k

return {
  algo = "remax",
  model = "models/tiny-gsm8k-tools",
  rewards = { "gsm8k", demo.tool_use },
  reward_weights = { 1, 0 },         -- tool_use is a metric, not a reward
  data = gsm8k.synthetic({ steps = { 1, 2 }, max_number = 12 }),
  map_row = demo.map_row,            -- the system message, then the question
  chat_template = demo.template,
  tools = demo.tools,
  tool_call_format = "qwen",
  stop_strings = demo.STOP,          -- a turn ends where its call closes
  tool_timeout = 2,
  max_turns = 4,
  max_episode_length = 1024,

  num_generations = 4,
  temperature = 1.0,
  max_prompt_length = 512,
  max_completion_length = 320,      -- the model's tokens over all turns
  per_device_train_batch_size = 32,
  learning_rate = 1e-4,
  lr_scheduler_type = "constant",
  beta = 0.0,
  max_steps = 30,
  eval_size = 300,
  eval_steps = 10,
  per_device_eval_batch_size = 150,
  save_steps = 10,
  log_completions = 5,
  seed = 2,

  -- the built-in loop, with held-out tool use measured before (a fresh run) and after, also
  -- written to the run folder as tool_use.json
  loop = function(run)
    local before = run.eval_ds and run.step == 0 and demo.held_out(run) or nil
    if before then run:say("tool use before: " .. demo.describe(before)) end
    while run:should_continue() do
      run:check_reload()
      run:train_step()
    end
    if not run.eval_ds or (run.step < run.cfg.max_steps and not run:out_of_time()) then return end   -- interrupted
    local after = demo.held_out(run)
    run:say("tool use after:  " .. demo.describe(after))
    demo.save(run, { before = before, after = after, step = run.step })
  end,
}
