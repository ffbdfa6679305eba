-- gsm8k_tools: ReMax on GSM8K-style problems with a calculator tool. A turn may call
--   <tool_call>{"name": "calculator", "arguments": {"expression": "12*7+3"}}</tool_call>
-- and the episode goes on with the result appended to the same KV cache. A turn without a call is
-- the answer, scored by rewards/gsm8k.lua. The greedy episode (greedy in every turn, with the same
-- tool) is ReMax's baseline. Malformed calls, unknown tools, bad arguments, a failing or hanging
-- calculator all give the episode an error message as the result (docs/environments.md).
--
--   ./remax run recipes/gsm8k_tools.lua
--   ./remax run recipes/gsm8k_tools.lua --model ~/models/Qwen2.5-0.5B-Instruct --chat_template tokenizer
--       (a tokenizer template renders the tool list through its `tools` variable)
--
-- Not done yet: the built-in models/tiny-gsm8k was never taught the call format (an SFT stage
-- that teaches it is still to be written), so with it this recipe runs but its episodes rarely
-- call the tool. The template below is the qa format with the tool's results as "Result:" lines
-- and the call format in the system message.
local gsm8k = require("remax").tasks.gsm8k

-- the calculator: + - * / and parentheses over numbers, nothing else reaches load()
local function calculate(args)
  local e = args.expression
  if not e:match("^[%d%s%.%+%-%*/%(%)]+$") then error("only numbers and + - * / ( ) are allowed", 0) end
  local f = load("return " .. e, "expression", "t", {})
  if not f then error("cannot read " .. e, 0) end
  local v = f()
  if type(v) ~= "number" or v ~= v then error("no number", 0) end
  return v == math.floor(v) and ("%d"):format(v) or ("%.6g"):format(v)
end

local SYSTEM = 'You may call a calculator: write <tool_call>{"name": "calculator", "arguments": {"expression": "..."}}' ..
  '</tool_call> and wait for its result. End with the final answer as #### <number>.'

-- qa with tool results: "Question: ...\nAnswer: ...\nResult: ...\nAnswer: "
local function template(messages, opts)
  local out = {}
  for _, m in ipairs(messages) do
    if m.role == "system" then out[#out + 1] = m.content .. "\n"
    elseif m.role == "assistant" then out[#out + 1] = "Answer: " .. m.content .. "\n"
    elseif m.role == "tool" then out[#out + 1] = "Result: " .. m.content .. "\n"
    else out[#out + 1] = "Question: " .. m.content .. "\n" end
  end
  if opts.add_generation_prompt ~= false then out[#out + 1] = "Answer: " end
  return table.concat(out)
end

return {
  algo = "remax",
  rewards = { "gsm8k" },
  data = gsm8k.synthetic({ steps = { 1, 2 }, max_number = 12 }),
  map_row = function(row)
    if type(row.prompt) == "string" then
      row.prompt = { { role = "system", content = SYSTEM }, { role = "user", content = row.prompt } }
    end
    return row
  end,
  chat_template = template,
  tools = {
    calculator = {
      description = "Evaluate an arithmetic expression with + - * / and parentheses",
      parameters = { type = "object", properties = { expression = { type = "string" } }, required = { "expression" } },
      fn = calculate,
    },
  },
  tool_call_format = "qwen",
  tool_timeout = 2,
  max_turns = 4,
  max_episode_length = 1024,

  num_generations = 4,
  temperature = 1.0,
  max_prompt_length = 512,
  max_completion_length = 320,      -- the model's tokens over all turns
  per_device_train_batch_size = 16,
  learning_rate = 1e-4,
  lr_scheduler_type = "constant",
  beta = 0.0,
  max_steps = 30,
  eval_size = 200,
  eval_steps = 10,
  per_device_eval_batch_size = 128,
  save_steps = 10,
  log_completions = 5,
  seed = 2,
}
