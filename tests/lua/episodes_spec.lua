-- episodes_spec: multi-turn rollouts (remax.step.episodes, tools, tool_calls, environment) on a
-- tiny model: continued KV caches against full forwards, observation tokens against the chat
-- templates, every tool and environment failure, the greedy (ReMax baseline) episode against a
-- greedy policy run by hand, and the loss mask's zero gradient on observation tokens.
local remax = require("remax")
local support = require("support")
local chat = require("remax.text.chat")
local episodes = require("remax.step.episodes")
local tools = require("remax.step.tools")
local tool_calls = require("remax.step.tool_calls")
local algos = require("remax.step.algos")
local tensor = require("remax.bind.tensor")
local rollout = require("remax.step.rollout")

local function read(path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("*a")
  f:close()
  return s
end

local function tiny(vocab, seed)
  return remax.model.new(support.tiny_model({ vocab_size = vocab, hidden_size = 16, intermediate_size = 24,
    max_position_embeddings = 256, tie_word_embeddings = false }), { seed = seed or 1, init_std = 0.3 })
end

local function concat(...)
  local out = {}
  for i = 1, select("#", ...) do for _, x in ipairs(select(i, ...)) do out[#out + 1] = x end end
  return out
end

describe("model:generate with on_turn_end", function()
  it("continues rows from their KV cache: every model token's logprob is the full forward's over the episode", function()
    local m = tiny(40, 3)
    local prompts = { { 1, 5, 9, 13, 2 }, { 7, 3 } }
    local appended, made = {}, {}   -- row -> turn -> the observation appended; row -> model tokens so far
    local out = m:generate(prompts, { temperature = { 1, 0 }, max_new_tokens = 12, seed = 5, stop = { 4, 11, 17, 23, 30 },
      on_turn_end = function(events)
        local add = {}
        for _, e in ipairs(events) do
          local r = e.row
          appended[r] = appended[r] or {}
          made[r] = (made[r] or 0) + #e.tokens
          local turn = #appended[r] + 1
          if turn <= 3 and made[r] < 12 then
            local ids = {}
            for i = 1, (r + turn) % 4 + 1 do ids[i] = (3 * r + 7 * turn + i) % 40 end
            appended[r][turn], add[r] = ids, ids
          end
        end
        return add
      end })
    local continued = 0
    for r, row in ipairs(out.rows) do
      local seq, model_at = { unpack(prompts[row.prompt]) }, {}
      local at = 0
      for turn, stop in ipairs(row.turn_ends) do
        for t = at + 1, stop do seq[#seq + 1] = row.tokens[t]; model_at[#seq] = t end
        at = stop
        for _, id in ipairs((appended[r] or {})[turn] or {}) do seq[#seq + 1] = id end
        if (appended[r] or {})[turn] then continued = continued + 1 end
      end
      for t = at + 1, #row.tokens do seq[#seq + 1] = row.tokens[t]; model_at[#seq] = t end
      local lp = m:logprobs({ seq }):totable()[1]
      local n = 0
      for pos, t in pairs(model_at) do
        n = n + 1
        assert.is_true(math.abs(lp[pos] - row.logprobs[t]) < 1e-4,
          ("row %d token %d: continued %g, full forward %g"):format(r, t, row.logprobs[t], lp[pos]))
      end
      assert.are.equal(#row.tokens, n)
    end
    assert.is_true(continued >= 3, "episodes continued " .. continued .. " times")
  end)

  it("refuses a bad observation, naming the row", function()
    local m = tiny(40)
    local every = {}
    for i = 0, 39 do every[#every + 1] = i end   -- the first token ends the turn
    assert.has_error(function()
      m:generate({ { 1, 2 } }, { max_new_tokens = 6, stop = every, temperature = 0,
        on_turn_end = function(events) return { [events[1].row] = { 99 } } end })
    end, "generate: on_turn_end: row 1, token 1: 99 is not a token id in [0, 40)")
  end)
end)

describe("observation tokens", function()
  local tok_stub = {
    eos_token = "<|im_end|>", bos_token = "<|begin_of_text|>",
    encode = function(_, text) return { string.byte(text, 1, -1) } end,
  }
  local templates = { ["qwen2.5"] = "<|im_end|>", qwen3 = "<|im_end|>", smollm2 = "<|im_end|>",
    ["llama3.1"] = "<|eot_id|>", ["llama3.2"] = "<|eot_id|>" }
  for name, model_end in pairs(templates) do
    it("are the suffix the " .. name .. " template adds for the new messages", function()
      local t = { chat_template = read("tests/fixtures/chat_templates/" .. name .. ".jinja"), bos_token = "<|begin_of_text|>",
        eos_token = model_end }
      local tool_list = tools.schemas(tools.check({ calc = { description = "arithmetic", parameters = { type = "object",
        properties = { e = { type = "string" } } }, fn = function() end } }))
      local opts = function(gen) return { tokenizer = t, add_generation_prompt = gen, template_args = { tools = tool_list },
        template_args_date = nil } end
      local render = function(msgs, gen) return chat.render(msgs, opts(gen)) end
      local conv = { { role = "system", content = "Use tools." }, { role = "user", content = "What is 6*7?" } }
      local text = render(conv, true)
      for turn = 1, 3 do
        local reply = turn == 1 and '<tool_call>{"name": "calc", "arguments": {"e": "6*7"}}</tool_call>' or ("answer " .. turn)
        local assistant = { role = "assistant", content = reply }
        local new = turn == 1 and { { role = "tool", content = "42" } } or { { role = "user", content = "and again? " .. turn } }
        local obs = episodes.observation_text(render, conv, assistant, new, model_end)
        text = text .. reply .. model_end .. obs   -- what the model wrote (its stop token too), then the observation
        conv = concat(conv, { assistant }, new)
        local whole = render(conv, true)
        if name == "qwen3" then   -- it drops earlier turns' empty <think> blocks: the tail after the last turn agrees
          assert.are.equal(whole:sub(-#obs), obs)
          assert.are.equal(reply .. model_end, whole:sub(-#obs - #reply - #model_end, -#obs - 1))
        else
          assert.are.equal(whole, text)
        end
      end
    end)
  end
end)

describe("tool calls", function()
  local t = tools.check({
    calc = { description = "d", parameters = { type = "object", properties = { x = { type = "number" } }, required = { "x" } },
      fn = function(a) return a.x * 2 end },
    hang = { fn = function() local i = 0 while true do i = i + 1 end end },
    boom = { fn = function() error("kaput", 0) end },
  })
  local function results(text, format)
    local out = {}
    for _, c in ipairs(tool_calls.parse(text, format)) do
      local r, ok, _, kind = tools.call(t, c, 0.2)
      out[#out + 1] = { r, ok, kind }
    end
    return out
  end
  it("reads Qwen calls and gives every failure its error as the result", function()
    local r = results('a <tool_call>{"name":"calc","arguments":{"x":3}}</tool_call><tool_call>{"name":"calc","arguments":{"y":1}}</tool_call>' ..
      '<tool_call>{oops</tool_call><tool_call>{"name":"nope"}</tool_call><tool_call>{"name":"hang"}</tool_call>' ..
      '<tool_call>{"name":"boom"}</tool_call><tool_call>{"name":"calc","arguments":{"x":"3"}}</tool_call><tool_call>{"name"')
    local want = {
      { "6", true, "ok" },
      { "Error: bad arguments for 'calc': missing required argument 'x'", false, "bad_args" },
      { "Error: malformed tool call: not a JSON object", false, "malformed" },
      { "Error: unknown tool 'nope' (available: boom, calc, hang)", false, "unknown" },
      { "Error: tool 'hang' timed out after 0.2 s", false, "timeout" },
      { "Error: tool 'boom' failed: kaput", false, "error" },
      { "Error: bad arguments for 'calc': argument 'x' must be of type number, got string", false, "bad_args" },
      { "Error: malformed tool call: <tool_call> without </tool_call>", false, "malformed" },
    }
    assert.are.same(want, r)
  end)
  it("reads Llama 3.1 JSON calls, python_tag built-in calls and code, and a recipe's parser", function()
    assert.are.same({ { "8", true, "ok" } }, results('{"name": "calc", "parameters": {"x": 4}}', "llama3"))
    local c = tool_calls.parse('<|python_tag|>brave_search.call(query="x y", n=3)<|eom_id|>', "llama3")
    assert.are.same({ { name = "brave_search", arguments = { query = "x y", n = 3 } } }, c)
    assert.are.same({ { name = "code_interpreter", arguments = { code = "print(1)" } } }, tool_calls.parse("<|python_tag|>print(1)", "llama3"))
    assert.are.same({}, tool_calls.parse("The answer is 4.", "llama3"))
    local mine = function(text) local x = text:match("CALC%((%d+)%)") return x and { { name = "calc", arguments = { x = tonumber(x) } } } or {} end
    assert.are.same({ { "10", true, "ok" } }, results("CALC(5)", mine))
    assert.are.same("Error: the tool call parser failed: bad", tools.call(t, tool_calls.parse("x", function() error("bad", 0) end)[1]))
  end)
  it("refuses bad tool tables naming the tool and key", function()
    assert.has_error(function() tools.check({ calc = { description = "d" } }) end, "tools.calc.fn must be a function(args) -> result, got nil")
    assert.has_error(function() tools.check({ calc = { fn = print, parameters = { type = "array" } } }) end,
      'tools.calc.parameters must be a JSON schema with type = "object"')
    assert.has_error(function() tools.check({ calc = { fn = print, parameters = { type = "object", required = { "q" } } } }) end,
      "tools.calc.parameters.required[1] = 'q' is not one of its properties")
  end)
end)
