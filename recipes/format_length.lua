-- format_length: composing rewards. Correctness (rewards/gsm8k.lua), a format reward (the answer
-- ends with "#### N", rewards/format.lua), a length penalty past 200 characters
-- (rewards/length.lua) and a reward written right here, combined with reward_weights.
-- Prompts are chat messages (a system message and the question), rendered with the model's chat
-- template (the qa template for the built-in byte-level model).
--
--   ./remax run recipes/format_length.lua
--   ./remax run recipes/format_length.lua --reward_weights 1,0.5,0.5,0.1 --algo grpo --num_generations 4
local rewards = require("remax.step.rewards")
local gsm8k = require("remax.tasks.gsm8k")

-- 1 per line of worked arithmetic ("a op b = c"), at most 1: rewards showing the steps.
local shows_work = {
  name = "shows_work",
  fn = function(completions, batch)
    local scores = {}
    for i, c in ipairs(completions) do
      local n = 0
      for _ in c:gmatch("%d+ [%+%-%*/] %d+[^\n]-= %d+") do n = n + 1 end
      scores[i] = math.min(1, n / 2)
    end
    return scores
  end,
}

return {
  algo = "remax",
  data = gsm8k.synthetic(),   -- GSM8K-style problems (remax.tasks.gsm8k), or --data FILE.jsonl
  -- the synthetic problems (or --data rows) as a conversation
  map_row = function(row)
    if type(row.prompt) == "string" then
      row.prompt = {
        { role = "system", content = "Solve the problem. End with the final answer as #### <number>." },
        { role = "user", content = row.prompt },
      }
    end
    return row
  end,
  rewards = {
    "gsm8k",
    rewards.file("format"),                                          -- ends with "#### <number>"
    rewards.file("length").with({ target = 200, coef = 1 }),         -- 0 up to 200 chars, -1 at 400
    shows_work,
  },
  reward_weights = { 1, 0.5, 0.5, 0.1 },

  num_generations = 2,
  max_completion_length = 320,
  per_device_train_batch_size = 16,
  gradient_accumulation_steps = 2,
  learning_rate = 2e-5,
  max_grad_norm = 1.0,
  max_steps = 20,
  eval_size = 100,
  eval_steps = 10,
  save_steps = 10,
  seed = 2,
}
