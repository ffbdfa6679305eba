-- The calculator demonstration (recipes/gsm8k_tools.lua on models/tiny-gsm8k-tools, made by
-- recipes/tiny_sft_tools.lua; remax.tasks.gsm8k_tools): the SFT data renders as the episodes the
-- ReMax run produces, the tool-use metric counts what it says, and the committed model does call
-- the calculator in some of its sampled episodes and answers with the result it got.
local config = require("remax.settings.config")
local trainer = require("remax.run.run")
local chat = require("remax.text.chat")
local demo = require("remax.tasks.gsm8k_tools")
local synth = require("remax.tasks.gsm8k_synth")
local support = require("support")

local function split_episode(answer)
  -- the SFT target of a tool row -> the episode's messages after the prompt
  local msgs = {}
  local rest = answer
  while true do
    local call, result, after = rest:match("^(<tool_call>.-</tool_call>)\nResult: ([^\n]*)\nAnswer: (.*)$")
    if not call then break end
    msgs[#msgs + 1] = { role = "assistant", content = call }
    msgs[#msgs + 1] = { role = "tool", content = result }
    rest = after
  end
  msgs[#msgs + 1] = { role = "assistant", content = rest }
  return msgs
end

describe("the calculator demonstration's data", function()
  it("a tool row's target is the episode the template renders, each result the calculator's", function()
    local ds = demo.sft_data({ style = "tool" })("train", 40, { seed = 5 })
    local render = function(msgs, gen) return demo.template(msgs, { add_generation_prompt = gen }) end
    for _, row in ipairs(ds.rows) do
      assert.are.equal("tool", row.style)
      assert.are.equal(demo.SYSTEM, row.prompt[1].content)
      local episode = split_episode(row.answer)
      assert.is_true(#episode >= 3, row.answer)
      -- prompt + target = the whole conversation as the template renders it (the ReMax episode's text)
      local whole = {}
      for _, m in ipairs(row.prompt) do whole[#whole + 1] = m end
      for _, m in ipairs(episode) do whole[#whole + 1] = m end
      assert.are.equal(render(whole, false), render(row.prompt, true) .. row.answer .. "\n")
      -- every call parses and the calculator gives its result; the answer is the last result
      for i, m in ipairs(episode) do
        if m.role == "tool" then
          local calls = require("remax.step.tool_calls").parse(episode[i - 1].content, "qwen")
          assert.are.equal(1, #calls)
          assert.are.equal("calculator", calls[1].name)
          assert.are.equal(m.content, demo.calculate(calls[1].arguments))
        end
      end
      assert.is_true(demo.tool_use_of(episode).correct, row.answer)
    end
  end)

  it("the styles follow the mix, and the held-out split keeps worked answers", function()
    local ds = demo.sft_data({ style = "direct:0.6,tool:0.3,sentences:0.1" })("train", 1000, { seed = 21 })
    local n = {}
    for _, r in ipairs(ds.rows) do n[r.style] = (n[r.style] or 0) + 1 end
    assert.is_true(math.abs(n.direct - 600) < 60 and math.abs(n.tool - 300) < 50 and math.abs(n.sentences - 100) < 35)
    local test = demo.sft_data({})("test", 20, { seed = 21 })
    for _, r in ipairs(test.rows) do
      assert.are.equal("sentences", r.style)
      assert.truthy(r.answer:match("#### %-?[%d%.]+$"))
    end
    assert.has_error(function() demo.sft_data({ style = "tool:1,poem:1" }) end,
      "gsm8k_tools.sft_data: style 'tool:1,poem:1': 'poem:1' is not style[:weight] with a style of direct, sentences, tool")
  end)

  it("tool_use: a call answered, and the final answer is its result", function()
    local call = demo.call_text("3 * 4")
    assert.is_true(demo.tool_use_of({ { role = "assistant", content = call }, { role = "tool", content = "12" },
      { role = "assistant", content = "#### 12" } }).correct)
    -- the answer is not the result
    assert.is_false(demo.tool_use_of({ { role = "assistant", content = call }, { role = "tool", content = "12" },
      { role = "assistant", content = "#### 13" } }).correct)
    -- the call failed
    local u = demo.tool_use_of({ { role = "assistant", content = call },
      { role = "tool", content = "Error: malformed tool call: not a JSON object" }, { role = "assistant", content = "#### 12" } })
    assert.are.same({ 1, 1, false }, { u.calls, u.errors, u.correct })
    -- no call at all
    assert.is_false(demo.tool_use_of({ { role = "assistant", content = "#### 12" } }).correct)
    local r = demo.tool_use.fn({ "#### 12", "#### 12" }, { completion_messages = {
      { { role = "assistant", content = call }, { role = "tool", content = "12" }, { role = "assistant", content = "#### 12" } },
      { { role = "assistant", content = "#### 12" } } } })
    assert.are.same({ 1, 0 }, r)
  end)

  it("the calculator refuses what is not arithmetic", function()
    assert.are.equal("17", demo.calculate({ expression = "3 * 4 + 5" }))
    assert.are.equal("2.5", demo.calculate({ expression = "5 / 2" }))
    assert.has_error(function() demo.calculate({ expression = "os.exit()" }) end, "only numbers and + - * / ( ) are allowed")
    assert.has_error(function() demo.calculate({ expression = "1 / 0" }) end, "no number")
  end)
end)

-- The committed model on a handful of held-out prompts, through the recipe's own settings: some
-- sampled episodes call the calculator, the result comes back through the episode, and answers
-- that use it are right. A model that lost the call format (or a broken tool path) fails here.
describe("models/tiny-gsm8k-tools", function()
  it("calls the calculator in some sampled episodes and answers with its result", function()
    local dir = support.tmpdir()
    local recipe = dofile("recipes/gsm8k_tools.lua")
    local cfg = config.resolve(recipe, config.parse_args({ "--eval_size", "24", "--per_device_eval_batch_size", "120",
      "--output_dir", dir, "--hot_reload", "false", "--max_completion_length", "160" }))
    local t = trainer.new(cfg, { quiet = true, signals = false, eval_only = true })
    local e = demo.held_out(t, { samples = 4 })
    assert.are.equal(24, e.n)
    -- about a third of the samples call it (tiny_sft_tools's mix); most of those use it correctly
    assert.is_true(e.sampled_tool_calls >= 0.1, demo.describe(e))
    assert.is_true(e.sampled_tool_correct >= 0.05, demo.describe(e))
    assert.is_true(e.sampled_tool_right >= 0.05, demo.describe(e))
    -- and the tool's result really is in the episode: look at one sampled episode with a call
    local rows = {}
    for i = 1, 8 do rows[i] = t.eval_ds.rows[i] end
    local ro = t.stepper:rollout(rows, { plan = require("remax.step.rollout").plan(4, false, cfg.temperature), step = 0 })
    local seen = 0
    for _, r in ipairs(ro.rows) do
      local msgs = r.completion_messages
      for i, m in ipairs(msgs) do
        if m.role == "tool" and not m.content:match("^Error") then
          seen = seen + 1
          local calls = require("remax.step.tool_calls").parse(msgs[i - 1].content, "qwen")
          assert.are.equal(demo.calculate(calls[1].arguments), m.content)
          assert.is_true(r.episode.tool_calls >= 1)
          assert.is_true(r.episode.obs_tokens > 0)
          -- observation tokens are context: loss_mask 0 on them, 1 on the model's
          local zeros = 0
          for _, v in ipairs(r.loss_mask) do if v == 0 then zeros = zeros + 1 end end
          assert.are.equal(r.episode.obs_tokens, zeros)
        end
      end
    end
    assert.is_true(seen > 0, "no sampled episode called the calculator")
  end)
end)
