-- trl_agent: recipes/trl_agent.py, a TRL agent script (GRPOTrainer with a tool, an
-- environment_factory whose methods are tools, and rewards that read the environments), run by
-- remax as it is written: each piece named from the file, the GRPOConfig fields under the same
-- names, the same data file. docs/environments.md, "From TRL".
--
--   ./remax run recipes/trl_agent.lua                  # Qwen/Qwen3-0.6B from the Hugging Face cache
--   ./remax run recipes/trl_agent.lua --algo remax     # ReMax: the greedy episode is the baseline
local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
return {
  model = "Qwen/Qwen3-0.6B",
  chat_template = "tokenizer",   -- the model's own: it lists the tools
  data = here .. "trl_agent.jsonl",
  rewards = { "py:trl_agent.py:solved_reward", "py:trl_agent.py:brevity_reward" },
  tools = { "py:trl_agent.py:calculator" },
  environment_factory = "py:trl_agent.py:GuessTheNumber",
  algo = "grpo",
  max_tool_calling_iterations = 6,
  max_completion_length = 1024,
  num_generations = 4,
  learning_rate = 1e-6,
}
