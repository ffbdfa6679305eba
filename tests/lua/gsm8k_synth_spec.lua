local remax = require("remax")
local synth = require("remax.tasks.gsm8k_synth")
local data = remax.data

local OPS = {   -- an independent evaluator for the structured steps
  ["+"] = function(a) local s = 0; for _, v in ipairs(a) do s = s + v end; return s end,
  ["-"] = function(a) local s = a[1]; for i = 2, #a do s = s - a[i] end; return s end,
  ["*"] = function(a) local s = 1; for _, v in ipairs(a) do s = s * v end; return s end,
  ["/"] = function(a) return a[1] / a[2] end,
  ["%"] = function(a) return a[1] * a[2] / 100 end,
}

local function numbers_in(text)
  local set = {}
  for n in text:gmatch("%d+") do set[tonumber(n)] = true end
  return set
end

describe("gsm8k_synth", function()
  it("is deterministic in (seed, index, split)", function()
    local a = synth.problem(17, { seed = 5, split = "test" })
    local b = synth.problem(17, { seed = 5, split = "test" })
    assert.are.same(a, b)
    assert.are_not.equal(a.question, synth.problem(17, { seed = 6, split = "test" }).question)
    assert.are_not.equal(a.question, synth.problem(18, { seed = 5, split = "test" }).question)
    local rows = synth.generate(5, { seed = 5, split = "test", first = 15 })
    assert.are.same(a, rows[3])
  end)

  it("never shares a question between train and test", function()
    local train = synth.generate(2000, { seed = 1, split = "train" })
    local test = synth.generate(2000, { seed = 1, split = "test" })
    local seen = {}
    for _, r in ipairs(train) do
      assert.are.equal("train", synth.split_of(r.question))
      seen[r.question] = true
    end
    local shared = 0
    for _, r in ipairs(test) do
      assert.are.equal("test", synth.split_of(r.question))
      if seen[r.question] then shared = shared + 1 end
    end
    assert.are.equal(0, shared)
    -- and the sets are diverse, not a handful of repeats
    local distinct = 0
    for _ in pairs(seen) do distinct = distinct + 1 end
    assert.is_true(distinct > 1950, "distinct train questions: " .. distinct)
  end)

  it("writes solutions whose arithmetic is right and ends in #### N", function()
    local templates, names = {}, {}
    for _, cfg in ipairs({ { 1, 1 }, { 1, 4 }, { 3, 6 }, { 8, 10 } }) do
      local rows = synth.generate(150, { seed = 2, steps = cfg, max_number = 60 })
      for _, row in ipairs(rows) do
        templates[row.template] = true
        for w in row.question:gmatch("%f[%a]%u%l+") do names[w] = true end
        assert.is_true(#row.steps >= cfg[1] and #row.steps <= cfg[2])
        local known = numbers_in(row.question)
        for k, st in ipairs(row.steps) do
          local v = OPS[st.op](st.args)
          assert.are.equal(v, st.result)
          assert.is_true(v >= 0 and v == math.floor(v), row.answer)
          for _, x in ipairs(st.args) do
            assert.is_true(known[x] == true, ("step %d uses %s, not in the question or earlier steps:\n%s\n%s")
              :format(k, tostring(x), row.question, row.answer))
          end
          known[v] = true
          assert.is_truthy(row.answer:find(synth.expression(st.op, st.args, st.result), 1, true), row.answer)
        end
        local final = row.steps[#row.steps].result
        assert.are.equal(string.format("%d", final), row.answer:match("\n#### (%d+)$"))
        -- drawn quantities stay within max_number (a change bill is the one derived number)
        local q = row.question:gsub("%$%d+ bill", ""):gsub("%d+%%", "")
        for n in q:gmatch("%d+") do assert.is_true(tonumber(n) <= 60, row.question) end
      end
    end
    local nt, nn = 0, 0
    for _ in pairs(templates) do nt = nt + 1 end
    for _ in pairs(names) do nn = nn + 1 end
    assert.is_true(nt >= 7, "templates used: " .. nt)
    assert.is_true(nn >= 30, "capitalised words (mostly names) used: " .. nn)
  end)

  it("keeps drawn numbers within max_number", function()
    for _, row in ipairs(synth.generate(300, { seed = 3, max_number = 20, steps = { 1, 3 } })) do
      local q = row.question:gsub("%$%d+ bill", ""):gsub("%d+%%", "")
      for n in q:gmatch("%d+") do assert.is_true(tonumber(n) <= 20, row.question) end
    end
  end)

  it("flows through data.from_rows and scores 1 on its own solutions", function()
    local rows = synth.generate(50, { seed = 4 })
    local ds = data.from_rows(rows)
    local reward = dofile("rewards/gsm8k.lua")
    local batch = data.collate(ds.rows)
    local completions = {}
    for i = 1, ds:size() do
      local r = ds:row(i)
      assert.are.equal(r.question, r.prompt)
      assert.are.equal(r.steps[#r.steps].result, r.answer_value)
      completions[i] = r.answer
    end
    for _, s in ipairs(reward.fn(completions, batch)) do assert.are.equal(1, s) end
  end)

  it("rejects bad knobs by name", function()
    assert.has_error(function() synth.problem(1, { steps = { 3, 2 } }) end)
    local ok, err = pcall(synth.generate, 1, { max_number = 5 })
    assert.is_false(ok)
    assert.matches("max_number must be an integer >= 10, got 5", err, 1, true)
    ok, err = pcall(synth.generate, 1, { split = "dev" })
    assert.matches("split must be 'train' or 'test', got dev", err, 1, true)
    ok, err = pcall(synth.problem, 0, {})
    assert.matches("index must be an integer >= 1", err, 1, true)
  end)

  it("writes the same questions in every solution style, each style checkable", function()
    local base = { seed = 5, steps = { 1, 3 }, max_number = 20 }
    local function with(style)
      local o = {}
      for k, v in pairs(base) do o[k] = v end
      o.style = style
      return synth.generate(300, o)
    end
    local sentences, equations, direct = with(nil), with("equations"), with("direct")
    local mixed = with("direct:0.65,equations:0.35")
    local n_direct = 0
    for i, r in ipairs(sentences) do
      assert.are.equal("sentences", r.style)
      for _, other in ipairs({ equations[i], direct[i], mixed[i] }) do
        assert.are.equal(r.question, other.question)
      end
      local final = "#### " .. string.format("%d", r.steps[#r.steps].result)
      assert.are.equal(final, direct[i].answer)
      -- equations: one "a op b = c" line per step, recomputed here, then the final line
      local lines = {}
      for line in (equations[i].answer .. "\n"):gmatch("(.-)\n") do lines[#lines + 1] = line end
      assert.are.equal(#r.steps + 1, #lines)
      for k, st in ipairs(r.steps) do
        local lhs, rhs = lines[k]:match("^(.-) = (%d+)$")
        assert.is_not_nil(lhs, lines[k])
        assert.are.equal(OPS[st.op](st.args), tonumber(rhs))
      end
      assert.are.equal(final, lines[#lines])
      local m = mixed[i]
      assert.is_true(m.style == "direct" or m.style == "equations")
      assert.are.equal(m.style == "direct" and direct[i].answer or equations[i].answer, m.answer)
      if m.style == "direct" then n_direct = n_direct + 1 end
    end
    -- 300 draws at p = 0.65: the share is within 0.65 +- 0.1 (about 3.6 standard deviations)
    assert.is_true(math.abs(n_direct / 300 - 0.65) < 0.1, "direct share " .. n_direct / 300)
    local ok, err = pcall(synth.generate, 1, { style = "direct:0.5,worked:0.5" })
    assert.is_false(ok)
    assert.matches("style 'direct:0.5,worked:0.5': 'worked:0.5' is not style[:weight]", err, 1, true)
    ok, err = pcall(synth.generate, 1, { style = "direct:0" })
    assert.matches("the weights add up to 0", err, 1, true)
  end)
end)

describe("remax.tasks.gsm8k", function()
  local gsm8k = require("remax.tasks.gsm8k")

  it("makes a data function giving the generator's problems for a split and the run's seed", function()
    local fn = gsm8k.synthetic({ steps = { 1, 2 }, max_number = 12 })
    local ds = fn("test", 5, { seed = 3 })
    assert.are.equal("gsm8k_synth(test)", ds.source)
    local want = synth.generate(5, { seed = 3, split = "test", steps = { 1, 2 }, max_number = 12, style = "sentences" })
    assert.are.equal(5, #ds.rows)
    for i = 1, 5 do assert.are.equal(want[i].question, ds.rows[i].question) end
    assert.are_not.equal(fn("train", 1, { seed = 3 }).rows[1].question, ds.rows[1].question)
  end)

  it("stops in the recipe on a bad style or steps", function()
    assert.has_error(function() gsm8k.synthetic({ style = "poems" }) end)
    assert.has_error(function() gsm8k.synthetic({ steps = 3 }) end, "gsm8k.synthetic: steps must be two numbers {min, max}")
  end)
end)
