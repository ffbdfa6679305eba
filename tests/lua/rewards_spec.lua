-- Reward files are plain Lua files under rewards/, loaded the way a recipe loads them.
local gsm8k = dofile("rewards/gsm8k.lua")
local format = dofile("rewards/format.lua")
local length = dofile("rewards/length.lua")

local function score(completion, reference)
  return gsm8k.fn({ completion }, { answer = { "Some reasoning.\n#### " .. reference } })[1]
end

describe("rewards share one shape", function()
  it("has name, fn and with", function()
    for _, r in ipairs({ gsm8k, format, length }) do
      assert.are.equal("string", type(r.name))
      assert.are.equal("function", type(r.fn))
      assert.are.equal("function", type(r.with))
      assert.are.equal(r.name .. "!", r.with({ name = r.name .. "!" }).name)
    end
  end)
end)

describe("gsm8k_accuracy", function()
  it("extracts the final answer by precedence", function()
    local cases = {
      { "3 + 4 = 7 apples.\n#### 7", "7", "####" },
      { "So 12 in all.\n#### 72 dollars, since 5 were extra", "72", "####" },
      { "We get 5 and then \\boxed{42} at last 9", "42", "boxed" },
      { "x = \\boxed{\\frac{3}{4}}", "3/4", "boxed" },
      { "Half is 4. The final answer is: $1,234.", "1,234", "answer_is" },
      { "THE ANSWER IS **-5** (not 3)", "-5", "answer_is" },
      { "Final answer: 50%", "50%", "answer_is" },
      { "First 3, then 10 - 4 = 6 kg", "6", "last_number" },
      { "It costs 3.50", "3.50", "last_number" },
    }
    for _, c in ipairs(cases) do
      local got, form = gsm8k.extract_answer(c[1])
      assert.are.equal(c[2], got, c[1])
      assert.are.equal(c[3], form, c[1])
    end
    assert.is_nil(gsm8k.extract_answer("no digits here"))
  end)

  it("compares by value", function()
    assert.is_true(gsm8k.same_value("1,234", "1234"))
    assert.is_true(gsm8k.same_value("1,000,000", 1e6))
    assert.is_true(gsm8k.same_value("3.50", "3.5"))
    assert.is_true(gsm8k.same_value("3/4", "0.75"))
    assert.is_true(gsm8k.same_value("50%", "50"))
    assert.is_true(gsm8k.same_value("$18", "18"))
    assert.is_true(gsm8k.same_value("-7", -7))
    assert.is_true(gsm8k.same_value("100000000", "100000000.00001"))   -- relative 1e-6
    assert.is_false(gsm8k.same_value("1234", "123"))
    -- integers compare exactly: an answer off by one is wrong however large it is
    assert.is_false(gsm8k.same_value("1450001", "1450000"))
    assert.is_false(gsm8k.same_value("1,450,001", 1450000))
    assert.is_false(gsm8k.same_value("-1000001", "-1000000"))
    assert.is_true(gsm8k.same_value("12.0", "12"))
    assert.is_true(gsm8k.same_value("24/2", "12"))
    assert.is_true(gsm8k.same_value("0.1", 0.1 + 1e-12))   -- decimals keep the tolerance
    assert.is_true(gsm8k.same_value("1/3", "0.3333333333"))
    assert.is_false(gsm8k.same_value("-5", "5"))
    assert.is_false(gsm8k.same_value("3.5", "3.51"))
    assert.is_false(gsm8k.same_value("1/0", "0"))
    assert.is_false(gsm8k.same_value("seven", "7"))
    assert.is_false(gsm8k.same_value("12 kg", "12"))   -- same_value takes bare numbers
  end)

  it("scores each answer form and near-miss", function()
    assert.are.equal(0, score("so the total is\n#### 1450001", "1450000"))
    assert.are.equal(1, score("so the total is\n#### 1,450,000", "1450000"))
    assert.are.equal(1, score("6 * 12 = 72\n#### 72", "72"))
    assert.are.equal(1, score("The answer is \\boxed{72}.", "72"))
    assert.are.equal(1, score("So the answer is $72.", "72"))
    assert.are.equal(1, score("She pays 3 * 24 = 72", "72"))
    assert.are.equal(1, score("It weighs 72kg", "72"))                  -- a unit after the number
    assert.are.equal(1, score("#### 72 apples in total", "72"))          -- trailing text after ####
    assert.are.equal(1, score("The total is 1,000,000", "1,000,000"))
    assert.are.equal(1, score("1000000", "1,000,000"))
    assert.are.equal(1, score("It is 5 - 8 = -3", "-3"))
    assert.are.equal(1, score("#### 3.50", "3.5"))
    assert.are.equal(1, score("#### 3/4", "0.75"))
    assert.are.equal(1, score("The answer is 50%", "50"))
    assert.are.equal(0, score("6 * 12 = 72, plus 1 is 73", "72"))        -- wrong last number
    assert.are.equal(0, score("The answer is 1234", "123"))             -- 123 inside a longer number
    assert.are.equal(0, score("The answer is 123", "1234"))
    assert.are.equal(0, score("It is 5 - 8 = 3", "-3"))                  -- sign matters
    assert.are.equal(0, score("#### 72\nbut wait #### 70", "72"))        -- the last #### counts
    assert.are.equal(0, score("no idea", "72"))
  end)

  it("takes the reference from final_answer or answer and names bad batches", function()
    local s = gsm8k.fn({ "#### 4", "#### 5" }, { final_answer = { "4", 6 } })
    assert.are.same({ 1, 0 }, s)
    s = gsm8k.fn({ "#### 4" }, { answer = { "4" } })
    assert.are.same({ 1 }, s)
    local ok, err = pcall(gsm8k.fn, { "#### 4" }, { prompt = { "q" } })
    assert.is_false(ok)
    assert.matches("neither a 'final_answer' nor an 'answer' column (columns: prompt)", err, 1, true)
    ok, err = pcall(gsm8k.fn, { "#### 4" }, { answer = { "unknown" } })
    assert.matches("row 1: reference answer", err, 1, true)
    ok, err = pcall(gsm8k.fn, { 4 }, { answer = { "4" } })
    assert.matches("completion 1 is a number", err, 1, true)
  end)
end)

describe("format", function()
  it("rewards a final #### line by default", function()
    assert.are.same({ 1, 1, 0, 0, 1 }, format.fn({
      "so 4 + 4 = 8\n#### 8", "#### -1,250.5  \n", "#### 8 apples", "the answer is 8", "#### $12",
    }, {}))
  end)

  it("takes a pattern, a list of patterns or a function", function()
    local boxed = format.with({ pattern = "\\boxed{[^}]+}%s*$", match = 0.5, miss = -0.5 })
    assert.are.same({ 0.5, -0.5 }, boxed.fn({ "so \\boxed{3}", "so 3" }, {}))
    local both = format.with({ pattern = { "<think>.-</think>", "####" } })
    assert.are.same({ 1, 0 }, both.fn({ "<think>hm</think> #### 2", "<think>hm</think> 2" }, {}))
    local fn = format.with({ pattern = function(c, i, batch) return c == batch.want[i] end })
    assert.are.same({ 1, 0 }, fn.fn({ "a", "b" }, { want = { "a", "c" } }))
    assert.has_error(function() format.with({ pattern = "[unclosed" }) end)
    assert.has_error(function() format.with({ pattern = 5 }) end)
  end)
end)

describe("length", function()
  it("penalises only the part over the target, capped", function()
    local r = length.with({ target = 10, coef = 0.5 })
    local s = r.fn({ string.rep("x", 5), string.rep("x", 10), string.rep("x", 15), string.rep("x", 100) }, {})
    assert.are.same({ 0, 0, -0.5 * 5 / 10, -0.5 }, s)
    local uncapped = length.with({ target = 10, coef = 0.5, cap = false })
    assert.are.equal(-0.5 * 90 / 10, uncapped.fn({ string.rep("x", 100) }, {})[1])
    local words = length.with({ target = 2, coef = 1, measure = "words" })
    assert.are.same({ 0, -0.5 }, words.fn({ "one two", "one two three" }, {}))
    local custom = length.with({ target = 1, coef = 1, measure = function(_, i, batch) return batch.tokens[i] end })
    assert.are.same({ 0, -1 }, custom.fn({ "a", "b" }, { tokens = { 1, 2 } }))
    assert.has_error(function() length.with({ measure = "lines" }) end)
    assert.has_error(function() length.with({ target = 0 }) end)
  end)
end)
