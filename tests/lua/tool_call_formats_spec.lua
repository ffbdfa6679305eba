-- The tool-call formats of remax.step.tool_calls beyond qwen and llama3: qwen3_coder, mistral and
-- hermes. Each is checked against what the real chat templates render (llama.cpp's copies, run
-- through remax.text.jinja and parsed back), against examples written in the formats' own
-- documentation, and against malformed text, which gives {error =} calls.
local jinja = require("remax.text.jinja")
local tool_calls = require("remax.step.tool_calls")
local support = require("support")

local TOOLS = { { type = "function", ["function"] = { name = "get_weather", description = "The weather in a city",
  parameters = { type = "object", properties = { city = { type = "string" }, days = { type = "integer" } },
    required = { "city" } } } } }

-- Two calls, with a multi-line string, a number, an object, a list and a boolean.
local CALLS = {
  { name = "get_weather", arguments = { city = "New York\nNY", days = 3 } },
  { name = "get_weather", arguments = { city = "Paris", opts = { units = "C" }, tags = { "a", "b" }, hourly = true } },
}
local IDS = { "abc123XYZ", "def456UVW" }   -- Mistral's templates want 9-character ids

-- The assistant turn the template file renders for CALLS: the conversation with it, less the
-- same conversation ending in the generation prompt.
local function rendered_turn(file)
  local path = support.llama_cpp_file("models/templates/" .. file)
  if not path then return nil end
  local t = jinja.compile(support.read(path), file)
  local function render(messages, gen)
    return t:render({ messages = messages, tools = TOOLS, add_generation_prompt = gen, bos_token = "<s>",
      eos_token = "</s>" })
  end
  local user = { role = "user", content = "The weather?" }
  local tcs = {}
  for i, c in ipairs(CALLS) do tcs[i] = { id = IDS[i], type = "function", ["function"] = c } end
  local before = render({ user }, true)
  local all = render({ user, { role = "assistant", content = "", tool_calls = tcs } }, false)
  assert.are.equal(before, all:sub(1, #before), file .. ": the turn does not follow the generation prompt")
  return all:sub(#before + 1), support.read(path)
end

local function parse(text, format) return tool_calls.parse(text, format) end

describe("tool call formats", function()
  it("read back the calls the real templates render, and format_for picks them from the template", function()
    local cases = {
      { "Qwen3-Coder.jinja", "qwen3_coder", "<function=get_weather>" },
      { "Qwen3.5-4B.jinja", "qwen3_coder", "<function=get_weather>" },
      { "mistralai-Mistral-Nemo-Instruct-2407.jinja", "mistral", '[TOOL_CALLS][{"' },
      { "Mistral-Small-3.2-24B-Instruct-2506.jinja", "mistral", "[CALL_ID]abc123XYZ[ARGS]" },
      { "unsloth-mistral-Devstral-Small-2507.jinja", "mistral", "[TOOL_CALLS]get_weather[ARGS]{" },
      { "mistralai-Ministral-3-14B-Reasoning-2512.jinja", "mistral", "[TOOL_CALLS]get_weather[ARGS]{" },
      { "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja", "hermes", '<tool_call>\n{"name": "get_weather"' },
      { "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja", "hermes", '<tool_call>\n{"name": "get_weather"' },
    }
    for _, c in ipairs(cases) do
      local file, format, marker = c[1], c[2], c[3]
      local turn, source = rendered_turn(file)
      if not turn then return end
      assert.truthy(turn:find(marker, 1, true), file .. " renders:\n" .. turn)
      assert.are.same(CALLS, parse(turn, format), file)
      assert.are.equal(format, tool_calls.format_for(file), file .. " by name")
      -- by its source (the tokenizer's template): Hermes' calls are qwen's
      assert.are.equal(format == "hermes" and "qwen" or format, tool_calls.format_for("tokenizer", source), file)
    end
  end)

  it("hermes is the qwen format under another name", function()
    assert.are.equal(tool_calls.qwen, tool_calls.formats.hermes)
    -- the Hermes 2 Pro template's system prompt: "return a json object with function name and
    -- arguments within <tool_call></tool_call> XML tags as follows:
    -- <tool_call>\n{"name": <function-name>, "arguments": <args-dict>}\n</tool_call>"
    assert.are.same({ { name = "get_stock_fundamentals", arguments = { symbol = "TSLA" } } },
      parse('<tool_call>\n{"arguments": {"symbol": "TSLA"}, "name": "get_stock_fundamentals"}\n</tool_call>', "hermes"))
  end)

  it("qwen3_coder reads the examples of Qwen3-Coder's and Qwen3.5's system prompts", function()
    -- Qwen3-Coder.jinja: "If you choose to call a tool ONLY reply in the following format ..."
    assert.are.same({ { name = "example_function_name",
      arguments = { example_parameter_1 = "value_1", example_parameter_2 = "value_2" } } },
      parse("<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n</parameter>\n"
        .. "<parameter=example_parameter_2>\nvalue_2\n</parameter>\n</function>\n</tool_call>", "qwen3_coder"))
    -- Qwen3.5-4B.jinja: "<parameter=example_parameter_2>\nThis is the value for the second parameter\n
    -- that can span\nmultiple lines\n</parameter>"
    assert.are.same({ { name = "f", arguments = { p = "This is the value for the second parameter\nthat can span\nmultiple lines" } } },
      parse("Let me look.\n<tool_call>\n<function=f>\n<parameter=p>\nThis is the value for the second parameter\n"
        .. "that can span\nmultiple lines\n</parameter>\n</function>\n</tool_call>", "qwen3_coder"))
    -- JSON values, a call without <tool_call>, no parameters, a call inside <think> left alone
    assert.are.same({ { name = "g", arguments = { n = -2.5, l = { 1, 2 }, b = false, s = "07", t = "two words" } },
      { name = "search", arguments = {} } },
      parse("<think>maybe <function=x>\n</function></think><function=g>\n<parameter=n>\n-2.5\n</parameter>\n"
        .. "<parameter=l>\n[1, 2]\n</parameter>\n<parameter=b>\nfalse\n</parameter>\n<parameter=s>\n07\n</parameter>\n"
        .. "<parameter=t>\ntwo words\n</parameter>\n</function>\n</tool_call>\n"
        .. "<tool_call>\n<function=search>\n</function>\n</tool_call>", "qwen3_coder"))
    assert.are.same({}, parse("No call: #include <functional>", "qwen3_coder"))
  end)

  it("mistral reads the forms llama.cpp's tests and Mistral's templates use", function()
    -- llama.cpp tests/test-chat.cpp: Mistral Nemo, Ministral 3 / Devstral, Mistral Small 3.2
    local one = { { name = "special_function", arguments = { arg1 = 1 } } }
    assert.are.same(one, parse('[TOOL_CALLS][{"name": "special_function", "arguments": {"arg1": 1}, "id": "123456789"}]', "mistral"))
    assert.are.same(one, parse('[TOOL_CALLS]special_function[ARGS]{"arg1":1}', "mistral"))
    assert.are.same(one, parse('[TOOL_CALLS]special_function[CALL_ID]123456789[ARGS]{"arg1": 1}', "mistral"))
    assert.are.same({ one[1], { name = "special_function_with_opt", arguments = { arg1 = 1, arg2 = 2 } } },
      parse('[TOOL_CALLS]special_function[CALL_ID]000000001[ARGS]{"arg1": 1}'
        .. '[TOOL_CALLS]special_function_with_opt[CALL_ID]000000002[ARGS]{"arg1": 1, "arg2": 2}</s>', "mistral"))
    -- "fake tool call marker in reasoning": the call inside [THINK] is not one
    assert.are.same(one, parse('[THINK]Let me think about [TOOL_CALLS]special_function[ARGS]{"arg1":1} and more[/THINK]'
      .. '[TOOL_CALLS]special_function[ARGS]{"arg1": 1}', "mistral"))
    -- the v3 tokenizer's space after [TOOL_CALLS]
    assert.are.same(one, parse('[TOOL_CALLS] [{"name": "special_function", "arguments": {"arg1": 1}}]', "mistral"))
    assert.are.same({}, parse("Paris is sunny.</s>", "mistral"))
  end)

  it("gives malformed calls as {error =} calls", function()
    local function errors(text, format, want)
      local calls = parse(text, format)
      assert.is_true(#calls >= 1, text)
      for _, c in ipairs(calls) do
        assert.is_nil(c.name, text)
        assert.matches("^malformed tool call", c.error)
        assert.is_string(c.raw)
      end
      assert.matches(want, calls[1].error, 1, true)
    end
    errors("<tool_call>\n<function=f>\n<parameter=a>\n1\n</parameter>\n</function>", "qwen3_coder", "without </tool_call>")
    errors("<tool_call>\n<function=f>\n<parameter=a>\n1\n</parameter>\n</tool_call>", "qwen3_coder", "without </function>")
    errors("<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>", "qwen3_coder", "no <function=NAME>")
    errors("<tool_call>\n<function=>\n</function>\n</tool_call>", "qwen3_coder", "without a name")
    errors("<function=f>\n<parameter=a>\n1\n", "qwen3_coder", "without </function>")
    errors("<tool_call>\n<function=f>\n</function>\nmore\n</tool_call>", "qwen3_coder", "text after </function>")
    errors("[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {}", "mistral", "not JSON")
    errors("[TOOL_CALLS]f{\"a\": 1}", "mistral", "without [ARGS]")
    errors("[TOOL_CALLS][ARGS]{\"a\": 1}", "mistral", "no name before [ARGS]")
    errors("[TOOL_CALLS]f[ARGS]{\"a\": ", "mistral", "[ARGS] is not a JSON object")
    errors("[TOOL_CALLS]f[ARGS][1, 2]", "mistral", "[ARGS] is not a JSON object")
    errors("[TOOL_CALLS][{\"arguments\": {}}]", "mistral", "no \"name\" string")
    errors("<tool_call>\n{\"name\": \"f\", \"arguments\": 5}\n</tool_call>", "hermes", "arguments must be a JSON object")
    errors("<tool_call>\n{\"name\": \"f\"", "hermes", "without </tool_call>")
  end)

  it("names every format when given an unknown one; format_for falls back to qwen", function()
    local ok, err = pcall(tool_calls.parse, "x", "nope")
    assert.is_false(ok)
    assert.matches("is not one of qwen, hermes, qwen3_coder, mistral, llama3", err, 1, true)
    for name in pairs(tool_calls.formats) do
      assert.truthy(tool_calls.FORMAT_LIST:find(name, 1, true), name)
      assert.is_table(parse("", name))
    end
    assert.are.equal("llama3", tool_calls.format_for("llama3"))
    assert.are.equal("qwen", tool_calls.format_for("chatml"))
    assert.are.equal("qwen", tool_calls.format_for("tokenizer"))
    for name, want in pairs({ ["qwen2.5"] = "qwen", qwen3 = "qwen", ["llama3.1"] = "llama3" }) do
      local source = support.read("tests/fixtures/chat_templates/" .. name .. ".jinja")
      assert.are.equal(want, tool_calls.format_for("tokenizer", source), name)
    end
  end)
end)
