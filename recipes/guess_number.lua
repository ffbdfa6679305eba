-- guess_number: a multi-turn environment that is not a tool. The model guesses a secret digit;
-- after each wrong guess the game answers "higher" or "lower" and the model guesses again, up
-- to max_turns guesses. The game's per-turn rewards (1 for the right digit, -0.1 for each wrong
-- guess, -0.2 for a reply without a digit) are summed into the reward "environment". ReMax's
-- baseline is the greedy episode: the greedy policy playing the same game with the same secret.
-- Every turn's tokens stay in one KV cache; the game's replies are appended to it.
--
--   ./remax run recipes/guess_number.lua
--   ./remax run recipes/guess_number.lua --algo grpo --num_generations 8
--
-- A fresh random model with the byte-level tokenizer and the chatml template: it starts by
-- guessing at random; docs/environments.md explains the environment API.
local game = {
  -- the first messages of an episode; state is this episode's own table
  reset = function(sample, state)
    state.secret, state.tries = sample.secret, 0
    return { { role = "user", content = sample.prompt } }
  end,
  -- the game's reply to one assistant turn: messages, done, reward
  step = function(state, text)
    state.tries = state.tries + 1
    local guess = tonumber(text:match("%d"))
    if not guess then return "Please answer with one digit.", false, -0.2 end
    if guess == state.secret then return "Right!", true, 1 end
    return guess < state.secret and "Higher." or "Lower.", false, -0.1
  end,
}

-- rows: the prompt and the secret (the game's reset reads it); the test split's secrets differ
local function digits(split, n)
  local rows = {}
  for i = 1, n do
    rows[i] = { prompt = "I am thinking of a digit from 0 to 9. Guess it: answer with one digit.",
      secret = (i * 7 + (split == "test" and 3 or 0)) % 10 }
  end
  return rows
end

return {
  algo = "remax",
  model_config = {
    architectures = { "Qwen2ForCausalLM" }, hidden_size = 64, intermediate_size = 128, num_hidden_layers = 2,
    num_attention_heads = 4, num_key_value_heads = 2, max_position_embeddings = 512, rope_theta = 10000,
    rms_norm_eps = 1e-6, tie_word_embeddings = true, initializer_range = 0.02,
  },
  chat_template = "chatml",
  data = digits,
  train_size = 2000,
  eval_size = 0,
  environment = game,
  rewards = {},                 -- the game's reward is the only one

  max_turns = 4,
  -- a turn ends at the first digit the model writes: that digit is its guess
  stop_strings = { "0", "1", "2", "3", "4", "5", "6", "7", "8", "9" },
  max_prompt_length = 128,
  max_completion_length = 64,   -- the model's tokens over all turns
  max_episode_length = 320,
  num_generations = 4,
  per_device_train_batch_size = 8,
  learning_rate = 1e-3,
  max_steps = 60,
  logging_steps = 5,
  save_steps = 0,
}
