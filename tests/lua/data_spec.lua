local cjson = require("cjson")
local support = require("support")
local data = require("remax").data

local FIX = "tests/fixtures/data/"

local errmsg = support.error_of

describe("data.load", function()
  it("reads GSM8K-format JSONL with no mapping", function()
    local ds = data.load(FIX .. "gsm8k_small.jsonl")
    assert.are.equal(3, ds:size())   -- the blank line is skipped
    local r = ds:row(1)
    assert.are.equal("Lily has 4 boxes of pens with 18 pens in each box. How many pens does she have?", r.prompt)
    assert.are.equal(r.prompt, r.question)
    assert.are.equal("She has 4 * 18 = 72 pens.\n#### 72", r.answer)
    assert.are.equal("72", r.final_answer)
    assert.are.equal(72, r.answer_value)
    assert.are.equal("2400", ds:row(2).final_answer)
    assert.are.equal(-3, ds:row(3).answer_value)
    assert.are.equal("fixture", ds:row(3).source)
    assert.is_nil(ds:row(3).note)   -- JSON null becomes nil
    assert.are.same({ "answer", "answer_value", "final_answer", "prompt", "question", "source" }, ds:columns())
  end)

  it("reads JSON arrays with conversational prompts and selected columns", function()
    local ds = data.load(FIX .. "messages.json", { prompt = "messages", answer = "target", columns = { "level" } })
    assert.are.equal(2, ds:size())
    local r = ds:row(1)
    assert.are.equal("system", r.prompt[1].role)
    assert.are.equal("What is 2 + 3?", r.prompt[2].content)
    assert.are.equal("5", r.target)
    assert.are.equal(1, r.level)
    assert.is_nil(r.messages)   -- not among the selected columns
    assert.are.equal(42, ds:row(2).answer_value)
  end)

  it("stops at a malformed line, a missing column or a bad prompt with path:LINE", function()
    local err = errmsg(data.load, FIX .. "bad_line.jsonl")
    assert.matches("bad_line.jsonl:3: malformed JSON line", err, 1, true)
    err = errmsg(data.load, FIX .. "missing_column.jsonl")
    assert.matches("missing_column.jsonl:3: missing answer column 'answer'; columns: prompt, solution", err, 1, true)
    err = errmsg(data.load, FIX .. "missing_column.jsonl", { prompt = "question" })
    assert.matches("missing_column.jsonl:1: missing prompt column 'question'; columns: answer, prompt", err, 1, true)
    err = errmsg(data.load, FIX .. "gsm8k_small.jsonl", { columns = { "question", "difficulty" } })
    assert.matches("gsm8k_small.jsonl:1: missing requested column 'difficulty'", err, 1, true)
    -- JSON-array rows are named by the line they start on
    err = errmsg(data.load, FIX .. "bad_messages.json")
    assert.matches("bad_messages.json:4: prompt column 'prompt': message 2 has role 'robot'", err, 1, true)
    err = errmsg(data.load, FIX .. "messages.json")
    assert.matches("messages.json:2: no prompt column: looked for 'prompt' then 'question'; columns: level, messages, target", err, 1, true)
    err = errmsg(data.load, FIX .. "does_not_exist.jsonl")
    assert.matches("does_not_exist.jsonl", err, 1, true)
  end)

  it("reports the line of a syntax error inside a JSON array", function()
    local path = support.tmpfile()
    local f = assert(io.open(path, "wb"))
    f:write('[\n {"prompt": "a"},\n {"prompt": "b",,}\n]\n')
    f:close()
    local err = errmsg(data.load, path)
    os.remove(path)
    assert.matches(":3: malformed JSON array", err, 1, true)
  end)
end)

describe("data.from_rows", function()
  it("maps in-memory rows the same way and names the row at fault", function()
    local ds = data.from_rows({ { question = "q1", answer = "x #### 1,000" }, { question = "q2", answer = "#### 5" } })
    assert.are.equal("q1", ds:row(1).prompt)
    assert.are.equal(1000, ds:row(1).answer_value)
    local err = errmsg(data.from_rows, { { prompt = "a" }, { prompt = 7 } })
    assert.matches("rows[2]: prompt column 'prompt'", err, 1, true)
    assert.matches("row 3 out of range 1..2", errmsg(ds.row, ds, 3), 1, true)
  end)

  it("collates rows into aligned columns", function()
    local ds = data.from_rows({ { prompt = "a", answer = "1" }, { prompt = "b", answer = "2" } })
    local batch = data.collate({ ds:row(2), ds:row(1) })
    assert.are.same({ "b", "a" }, batch.prompt)
    assert.are.same({ "2", "1" }, batch.answer)
    assert.are.same({ "2", "1" }, batch.final_answer)
  end)
end)

describe("data.rng", function()
  it("is a function of (seed, stream) only", function()
    local a, b, c, d = data.rng(7, 1), data.rng(7, 1), data.rng(7, 2), data.rng(8, 1)
    local same, diff_stream, diff_seed = true, 0, 0
    for _ = 1, 50 do
      local x = a:u32()
      if x ~= b:u32() then same = false end
      if x ~= c:u32() then diff_stream = diff_stream + 1 end
      if x ~= d:u32() then diff_seed = diff_seed + 1 end
    end
    assert.is_true(same)
    assert.is_true(diff_stream > 45 and diff_seed > 45)
    assert.are.equal(data.rng(3, "shuffle"):u32(), data.rng(3, data.hash("shuffle")):u32())
    -- large seeds use the high key word
    assert.are_not.equal(data.rng(2 ^ 40 + 5):u32(), data.rng(5):u32())
  end)

  it("draws integers in range, evenly, and floats in [0, 1)", function()
    local r = data.rng(11)
    local counts = { 0, 0, 0, 0, 0, 0 }
    for _ = 1, 6000 do
      local v = r:int(6)
      assert.is_true(v >= 1 and v <= 6 and v == math.floor(v))
      counts[v] = counts[v] + 1
    end
    -- chi-square with 5 degrees of freedom; 20.5 is the 0.999 quantile
    local chi2 = 0
    for _, n in ipairs(counts) do chi2 = chi2 + (n - 1000) ^ 2 / 1000 end
    assert.is_true(chi2 < 20.5, "chi2 " .. chi2)
    for _ = 1, 200 do
      local v = r:int(-3, 2)
      assert.is_true(v >= -3 and v <= 2)
    end
    local sum = 0
    for _ = 1, 4000 do
      local u = r:uniform()
      assert.is_true(u >= 0 and u < 1)
      sum = sum + u
    end
    assert.is_true(math.abs(sum / 4000 - 0.5) < 0.02)
    local p = r:permutation(50)
    table.sort(p)
    for i = 1, 50 do assert.are.equal(i, p[i]) end
  end)

  it("rejects bad seeds and ranges", function()
    assert.matches("seed must be an integer in [0, 2^53)", errmsg(data.rng, -1), 1, true)
    assert.matches("seed must be an integer", errmsg(data.rng, 1.5), 1, true)
    assert.matches("need integers lo <= hi", errmsg(function() data.rng(1):int(0) end), 1, true)
  end)
end)

describe("sampler", function()
  local rows = {}
  for i = 1, 10 do rows[i] = { prompt = "p" .. i, id = i } end
  local ds = data.from_rows(rows)

  local function ids(batch)
    local out = {}
    for i, r in ipairs(batch) do out[i] = r.id end
    return out
  end

  it("visits every row once per epoch and reshuffles each epoch", function()
    local s = ds:sampler({ seed = 3, batch_size = 5 })
    local e1 = ids(s:next_batch())
    for _, v in ipairs(ids(s:next_batch())) do e1[#e1 + 1] = v end
    local e2 = ids(s:next_batch())
    for _, v in ipairs(ids(s:next_batch())) do e2[#e2 + 1] = v end
    assert.are.same({ epoch = 2, index = 10, seed = 3, size = 10 }, s:state())
    local s1, s2 = { unpack(e1) }, { unpack(e2) }
    table.sort(s1); table.sort(s2)
    for i = 1, 10 do assert.are.equal(i, s1[i]); assert.are.equal(i, s2[i]) end
    assert.are_not.same(e1, e2)
    -- the same seed gives the same order; another seed another
    assert.are.same(e1, ids(ds:sampler({ seed = 3, batch_size = 10 }):next_batch()))
    assert.are_not.same(e1, ids(ds:sampler({ seed = 4, batch_size = 10 }):next_batch()))
    assert.are.same({ 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 1, 2 },
      ids(ds:sampler({ shuffle = false, batch_size = 12 }):next_batch()))
  end)

  it("resumes exactly from a saved state across epoch boundaries", function()
    local straight = ds:sampler({ seed = 9, batch_size = 4 })
    local want = {}
    for b = 1, 6 do want[b] = ids(straight:next_batch()) end

    local first = ds:sampler({ seed = 9, batch_size = 4 })
    local got = {}
    for b = 1, 3 do got[b] = ids(first:next_batch()) end
    local saved = cjson.decode(cjson.encode(first:state()))   -- a plain table survives JSON
    local resumed = ds:sampler({ batch_size = 4 }):restore(saved)
    for b = 4, 6 do got[b] = ids(resumed:next_batch()) end
    assert.are.same(want, got)
  end)

  it("rejects a state that does not fit", function()
    local s = ds:sampler({ seed = 1 })
    assert.matches("has index 11", errmsg(s.restore, s, { epoch = 1, index = 11, seed = 1 }), 1, true)
    assert.matches("has epoch 0", errmsg(s.restore, s, { epoch = 0, index = 0, seed = 1 }), 1, true)
    assert.matches("was saved for 12 rows, this dataset has 10",
      errmsg(s.restore, s, { epoch = 1, index = 0, seed = 1, size = 12 }), 1, true)
    assert.matches("batch_size must be a positive integer", errmsg(ds.sampler, ds, { batch_size = 0 }), 1, true)
  end)
end)
