-- remax.tasks.gsm8k_tools: what the calculator demonstration needs (recipes/gsm8k_tools.lua, the
-- ReMax run; recipes/tiny_sft_tools.lua, the SFT stage that taught models/tiny-gsm8k-tools to call
-- the calculator), kept in one place so both recipes and tests/lua/tools_demo_spec.lua see the
-- same prompt, template, tool and data:
--
--   local demo = require("remax").tasks.gsm8k_tools
--   demo.SYSTEM, demo.template, demo.tools, demo.STOP       -- the prompt, the qa template with "Result:" lines, the calculator, stop strings
--   demo.map_row(row)                                       -- a problem row -> system + user messages
--   demo.sft_data({steps=, max_number=, style="direct:0.6,tool:0.3,sentences:0.1"})   -- a data function for algo = "sft"
--   demo.tool_use                                           -- a reward: 1 for correct tool use (weight 0: a metric)
--   demo.held_out(run, {samples = K})                       -- greedy (and sampled) held-out episodes: accuracy and tool use
--
-- An episode of the built-in model, as the qa template renders it (the turn ends at the stop
-- string "</tool_call>"; the result is the observation):
--
--   You may call the calculator.
--   Question: Tom has 3 boxes of 4 pens and buys 5 more pens. How many pens does he have?
--   Answer: <tool_call>{"name": "calculator", "arguments": {"expression": "3 * 4"}}</tool_call>
--   Result: 12
--   Answer: <tool_call>{"name": "calculator", "arguments": {"expression": "12 + 5"}}</tool_call>
--   Result: 17
--   Answer: #### 17
local synth = require("remax.tasks.gsm8k_synth")
local data = require("remax.formats.data")
local generate = require("remax.bind.generate")

local M = {}

M.SYSTEM = "You may call the calculator."
M.STOP = { "</tool_call>" }   -- a turn ends where its call closes: the rest of the episode is the tool's

-- The calculator: + - * / and parentheses over numbers; nothing else reaches load().
function M.calculate(args)
  local e = args.expression
  if not e:match("^[%d%s%.%+%-%*/%(%)]+$") then error("only numbers and + - * / ( ) are allowed", 0) end
  local f = load("return " .. e, "expression", "t", {})
  if not f then error("cannot read " .. e, 0) end
  local ok, v = pcall(f)
  if not ok or type(v) ~= "number" or v ~= v or v == math.huge or v == -math.huge then error("no number", 0) end
  return v == math.floor(v) and ("%d"):format(v) or ("%.6g"):format(v)
end

M.tools = {
  calculator = {
    description = "Evaluate an arithmetic expression with + - * / and parentheses",
    parameters = { type = "object", properties = { expression = { type = "string" } }, required = { "expression" } },
    fn = M.calculate,
  },
}

-- The qa template with tool results: "Question: ...\nAnswer: ...\nResult: ...\nAnswer: ".
function M.template(messages, opts)
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

-- A problem row (prompt or question a string) -> the system message and the question.
function M.map_row(row)
  local q = row.prompt or row.question
  if type(q) == "string" then
    row.prompt = { { role = "system", content = M.SYSTEM }, { role = "user", content = q } }
    row.question = nil
  end
  return row
end

local function num(v)
  if v == math.floor(v) and math.abs(v) < 2 ^ 53 then return ("%d"):format(v) end
  return (("%.6f"):format(v):gsub("0+$", ""):gsub("%.$", ""))
end

-- The expression of one step of a synthetic problem ("a op b", a percentage as "a * b / 100").
function M.expression(st)
  local strs = {}
  for i, v in ipairs(st.args) do strs[i] = num(v) end
  if st.op == "%" then return strs[1] .. " * " .. strs[2] .. " / 100" end
  return table.concat(strs, " " .. st.op .. " ")
end

function M.call_text(expression)
  return ('<tool_call>{"name": "calculator", "arguments": {"expression": "%s"}}</tool_call>'):format(expression)
end

-- The tool solution of a problem as the model writes it after "Answer: ": one call per step, each
-- followed by the calculator's result as the template renders it, then "#### N". Checked against
-- the calculator: every step's result is what the tool returns.
function M.tool_solution(steps)
  local parts = {}
  for _, st in ipairs(steps) do
    local e = M.expression(st)
    local r = M.calculate({ expression = e })
    if tonumber(r) == nil or math.abs(tonumber(r) - st.result) > 1e-9 * math.max(1, math.abs(st.result)) then
      error(("gsm8k_tools: the calculator gives %s for %s, the problem says %s"):format(r, e, num(st.result)), 0)
    end
    parts[#parts + 1] = M.call_text(e) .. "\nResult: " .. r .. "\nAnswer: "
  end
  return table.concat(parts) .. "#### " .. num(steps[#steps].result)
end

local STYLES = { direct = true, sentences = true, tool = true }

local function parse_style(spec)
  local mix, total = {}, 0
  for part in tostring(spec):gmatch("[^,]+") do
    local name, w = part:match("^%s*([%a_]+)%s*:%s*([%d%.]+)%s*$")
    if not name then name, w = part:match("^%s*([%a_]+)%s*$"), "1" end
    w = tonumber(w)
    if not name or not STYLES[name] or not w then
      error(("gsm8k_tools.sft_data: style '%s': '%s' is not style[:weight] with a style of direct, sentences, tool")
        :format(tostring(spec), part), 3)
    end
    total = total + w
    mix[#mix + 1] = { name, total }
  end
  if total <= 0 then error(("gsm8k_tools.sft_data: style '%s': the weights add up to 0"):format(tostring(spec)), 3) end
  for _, m in ipairs(mix) do m[2] = m[2] / total end
  return mix
end

-- A data function for SFT: synthetic problems (remax.tasks.gsm8k_synth) with the system
-- message, each answered in a style drawn from opts.style: "direct" ("#### N"), "sentences"
-- (the worked solution) or "tool" (M.tool_solution). The target of a tool row includes the
-- "Result:" lines the episode would get from the calculator; SFT trains on them as on the rest
-- of the text, while a ReMax episode stops at "</tool_call>" and is given the real result.
-- The test split has the worked solution as its answer (the reward reads its "#### N").
function M.sft_data(opts)
  opts = opts or {}
  local steps, max_number = opts.steps or { 1, 2 }, opts.max_number or 12
  local mix = parse_style(opts.style or "direct:0.6,tool:0.3,sentences:0.1")
  return function(split, n, cfg)
    local rows = synth.generate(n, { seed = cfg.seed, steps = steps, max_number = max_number, style = "sentences", split = split })
    for i, row in ipairs(rows) do
      local style = "sentences"
      if split == "train" then
        local u = data.rng(cfg.seed, "tool-style:" .. split .. ":" .. i):u32() / 4294967296
        style = mix[#mix][1]
        for _, m in ipairs(mix) do if u < m[2] then style = m[1] break end end
      end
      if style == "direct" then row.answer = "#### " .. num(row.steps[#row.steps].result)
      elseif style == "tool" then row.answer = M.tool_solution(row.steps) end
      row.style = style
      row.steps = nil
      M.map_row(row)
    end
    return data.from_rows(rows, { name = ("gsm8k_tools(%s)"):format(split) })
  end
end

local function final_number(text)
  local last
  for v in (text or ""):gmatch("####%s*(%-?[%d%.]+)") do last = v end
  return last and tonumber(last)
end

-- What an episode (its messages after the prompt) did with the calculator: calls (the tool's
-- messages), errors (results starting "Error:"), and correct: at least one call, every call
-- answered, and the final answer ("#### N") is the last result.
function M.tool_use_of(messages)
  local calls, errors, last_result, answer = 0, 0, nil, nil
  for _, m in ipairs(messages or {}) do
    if m.role == "tool" then
      calls = calls + 1
      if tostring(m.content):match("^Error") then errors = errors + 1 else last_result = tonumber(m.content) end
    elseif m.role == "assistant" then
      answer = m.content
    end
  end
  local final = final_number(answer)
  local correct = calls > 0 and errors == 0 and last_result ~= nil and final ~= nil
    and math.abs(final - last_result) <= 1e-6 * math.max(1, math.abs(last_result))
  return { calls = calls, errors = errors, correct = correct }
end

-- The reward `tool_use`: 1 for an episode that uses the calculator correctly (M.tool_use_of),
-- else 0. The recipe gives it weight 0: it is logged (reward/tool_use for the samples,
-- reward_greedy/tool_use for the greedy episodes) and does not train.
M.tool_use = {
  name = "tool_use",
  fn = function(completions, batch)
    local out = {}
    for i = 1, #completions do
      local msgs = batch.completion_messages and batch.completion_messages[i]
        or { { role = "assistant", content = completions[i] } }
      out[i] = M.tool_use_of(msgs).correct and 1 or 0
    end
    return out
  end,
}

-- Held-out episodes of a Run (remax.run.run: its stepper and eval set): the first n held-out
-- prompts (default eval_size), a greedy episode each plus opts.samples sampled ones. Returns
-- {n, accuracy (greedy), tool_calls (share of greedy episodes with a call), tool_correct (share
-- with correct tool use), tool_right (correct tool use and the right answer), and with samples
-- the same of the sampled episodes: sampled_accuracy, sampled_tool_calls, sampled_tool_correct}.
function M.held_out(run, opts)
  opts = opts or {}
  local step, cfg = run.stepper, run.cfg
  local rows = assert(run.eval_ds, "gsm8k_tools.held_out: the run has no held-out set").rows
  local n = math.min(#rows, opts.n or cfg.eval_size)
  local K = opts.samples or 0
  local plan = generate.plan(K, true, cfg.temperature)
  local bs = math.max(1, math.floor(cfg.per_device_eval_batch_size / (K + 1)))
  local acc_name = run.accuracy_name or "gsm8k_accuracy"
  local g = { n = 0, acc = 0, calls = 0, correct = 0, right = 0 }
  local s = { n = 0, acc = 0, calls = 0, correct = 0, right = 0 }
  for first = 1, n, bs do
    local chunk = {}
    for i = first, math.min(n, first + bs - 1) do chunk[#chunk + 1] = rows[i] end
    local ro = step:rollout(chunk, { plan = plan, step = 0, first = first })
    step:score(ro, { alone = true })
    for k, r in ipairs(ro.rows) do
      local t = r.greedy and g or s
      local a = ro.per[acc_name][k] or 0
      local u = M.tool_use_of(r.completion_messages)
      t.n, t.acc = t.n + 1, t.acc + a
      if u.calls > 0 then t.calls = t.calls + 1 end
      if u.correct then t.correct = t.correct + 1; if a >= 1 then t.right = t.right + 1 end end
    end
  end
  local function share(x, t) return t.n > 0 and x / t.n or 0 end
  local e = { n = g.n, accuracy = share(g.acc, g), tool_calls = share(g.calls, g), tool_correct = share(g.correct, g),
    tool_right = share(g.right, g) }
  if K > 0 then
    e.samples = K
    e.sampled_accuracy, e.sampled_tool_calls = share(s.acc, s), share(s.calls, s)
    e.sampled_tool_correct, e.sampled_tool_right = share(s.correct, s), share(s.right, s)
  end
  return e
end

-- Writes numbers (a table) to the run folder as tool_use.json (rank 0).
function M.save(run, numbers)
  if not run.run_dir or (run.dist and not run.dist.is_root) then return end
  local f = assert(io.open(run.run_dir .. "/tool_use.json", "wb"))
  f:write(require("remax.formats.json").encode(numbers), "\n")
  f:close()
end

-- One line of M.held_out's numbers.
function M.describe(e)
  local line = ("held-out (%d prompts), greedy: accuracy %.1f%%, calls the calculator %.1f%%, correct tool use %.1f%%")
    :format(e.n, 100 * e.accuracy, 100 * e.tool_calls, 100 * e.tool_correct)
  if e.samples then
    line = line .. ("; %d samples each: accuracy %.1f%%, calls %.1f%%, correct tool use %.1f%%"):format(e.samples,
      100 * e.sampled_accuracy, 100 * e.sampled_tool_calls, 100 * e.sampled_tool_correct)
  end
  return line
end

return M
