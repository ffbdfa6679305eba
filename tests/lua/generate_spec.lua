-- generate_spec: Model:generate (per-slot settings, row order, logprobs, stop ids, streaming,
-- errors) and the `remax generate` command on a tiny model with the byte-level tokenizer.
local remax = require("remax")
local cjson = require("cjson")
local support = require("support")

local function tiny(vocab)
  return support.tiny_model({ vocab_size = vocab or 40, hidden_size = 16, intermediate_size = 24, max_position_embeddings = 128,
    tie_word_embeddings = false })
end

local function model(seed, vocab) return remax.model.new(tiny(vocab), { seed = seed, init_std = 0.3 }) end

local function concat(a, b)
  local out = {}
  for _, x in ipairs(a) do out[#out + 1] = x end
  for _, x in ipairs(b or {}) do out[#out + 1] = x end
  return out
end

local function argmax(row)
  local best = 1
  for i = 2, #row do if row[i] > row[best] then best = i end end
  return best - 1   -- token ids are 0-based
end

local function log_softmax_at(row, id)
  local mx = -math.huge
  for _, x in ipairs(row) do mx = math.max(mx, x) end
  local s = 0
  for _, x in ipairs(row) do s = s + math.exp(x - mx) end
  return row[id + 1] - mx - math.log(s)
end

local prompts = { { 1, 5, 9, 13, 2 }, { 7, 3 }, { 30, 31, 32, 33, 34, 35 } }

describe("model:generate", function()
  it("gives slot lists' length rows per prompt, prompt-major, greedy slots following the argmax chain", function()
    local m = model(1)
    local out = m:generate(prompts, { temperature = { 1, 1, 0 }, max_new_tokens = 6, seed = 3 })
    assert.are.equal(9, #out.rows)
    for i, row in ipairs(out.rows) do
      assert.are.equal(math.floor((i - 1) / 3) + 1, row.prompt)
      assert.are.equal((i - 1) % 3 + 1, row.slot)
      assert.are.equal(6, #row.tokens)
      assert.are.equal("length", row.finish)
    end
    assert.are.equal(54, out.tokens_generated)
    assert.is_true(out.cache_bytes > 0)
    -- the greedy slot is the argmax chain of full forwards; every logprob is log_softmax there
    for _, row in ipairs(out.rows) do
      local seq = prompts[row.prompt]
      for t, id in ipairs(row.tokens) do
        local logits = m:next_logits({ seq }):totable()[1]
        if row.slot == 3 then assert.are.equal(argmax(logits), id) end
        local want = log_softmax_at(logits, id)
        assert.is_true(math.abs(row.logprobs[t] - want) < 1e-4, ("%g vs %g"):format(row.logprobs[t], want))
        seq = concat(seq, { id })
      end
    end
  end)

  it("gives a prompt the same samples in any batch", function()
    local m = model(2)
    local opts = { temperature = { 1.0, 0.8 }, top_p = { 1.0, 0.9 }, max_new_tokens = 8, seed = 11 }
    local a = m:generate({ prompts[1], prompts[2] }, opts)
    local b = m:generate({ prompts[3], prompts[1] }, opts)
    for slot = 1, 2 do
      assert.are.same(a.rows[slot].tokens, b.rows[2 + slot].tokens)
    end
    assert.are_not.same(a.rows[1].tokens, a.rows[2].tokens)   -- the slot is part of the key
    local c = m:generate({ prompts[1] }, { temperature = { 1.0, 0.8 }, top_p = { 1.0, 0.9 }, max_new_tokens = 8, seed = 12 })
    assert.are_not.same(a.rows[1].tokens, c.rows[1].tokens)    -- and so is the seed
  end)

  -- docs/generation.md: the same bits, not only the same tokens, whatever the batch: the
  -- log-probabilities of a prompt's greedy and sampled rows alone, beside shorter and longer
  -- prompts (it is left-padded in the cache), and with more than 48 rows decoding at once, at
  -- widths where the GEMMs' kernels depend on the batch's shape; f32, and the matrices in bf16
  -- (the bf16 matmul kernels)
  for _, dtype in ipairs({ "f32", "bf16 weights" }) do
    it("gives a prompt's rows the same log-probabilities, bit for bit, in any batch (" .. dtype .. ")", function()
      local cfg = support.tiny_model({ vocab_size = 300, hidden_size = 96, intermediate_size = 160, num_attention_heads = 4,
        num_key_value_heads = 2, max_position_embeddings = 128 })
      local m = remax.model.new(cfg, { seed = 4, init_std = 0.2, weight_dtype = dtype == "f32" and "f32" or "bf16" })
      local mine = { 11, 250, 37, 4, 190, 23, 8, 77, 143 }
      local others = { { 5, 6, 7 }, {}, {} }
      for t = 1, 30 do others[2][t] = (t * 13 + 5) % 300 end
      for t = 1, 17 do others[3][t] = (t * 29 + 1) % 300 end
      local temps = { 0 }   -- slot 1 greedy, then sampled slots: 13 rows per prompt, 52 in the batch
      for k = 2, 13 do temps[k] = 1.0 end
      local opts = { temperature = temps, max_new_tokens = 12, seed = 21 }
      local alone = m:generate({ mine }, opts)
      local beside = m:generate({ others[1], mine, others[2], others[3] }, opts)
      for slot = 1, 13 do
        local a, b = alone.rows[slot], beside.rows[13 + slot]
        assert.are.equal(2, b.prompt)
        assert.are.same(a.tokens, b.tokens, "slot " .. slot .. ": the tokens changed beside other prompts")
        for t = 1, #a.logprobs do
          assert.are.equal(a.logprobs[t], b.logprobs[t],
            ("slot %d, token %d: log-probability %.9g alone, %.9g beside other prompts"):format(slot, t, a.logprobs[t], b.logprobs[t]))
        end
      end
    end)
  end

  it("ends a row at a stop id, others at their budget", function()
    local m = model(3)
    local free = m:generate(prompts, { temperature = 0, max_new_tokens = 10 })
    local stop = free.rows[1].tokens[4]
    local out = m:generate(prompts, { temperature = 0, max_new_tokens = 10, stop = { stop } })
    for i, row in ipairs(out.rows) do
      local first
      for t, id in ipairs(free.rows[i].tokens) do if id == stop then first = first or t end end
      if first then
        assert.are.equal("stop", row.finish)
        assert.are.equal(first, #row.tokens)
        assert.are.equal(stop, row.tokens[#row.tokens])
      else
        assert.are.equal("length", row.finish)
        assert.are.equal(10, #row.tokens)
      end
    end
    assert.are.equal("stop", out.rows[1].finish)
  end)

  -- The rules as Hugging Face writes them, in plain Lua: CTRL's penalty on every token seen so far
  -- (prompt and completion), then the temperature, then min-p against the most likely token.
  local function penalised(row, seen, penalty)
    local out, hit = {}, {}
    for _, id in ipairs(seen) do hit[id] = true end
    for i, x in ipairs(row) do
      if hit[i - 1] then out[i] = x > 0 and x / penalty or x * penalty else out[i] = x end
    end
    return out
  end

  it("applies repetition_penalty over the prompt and the completion so far, greedy rows too", function()
    local m = model(7)
    local out = m:generate(prompts, { temperature = 0, max_new_tokens = 10, repetition_penalty = 1.8, seed = 1 })
    local plain = m:generate(prompts, { temperature = 0, max_new_tokens = 10, seed = 1 })
    local repeats_plain, repeats = 0, 0
    for i, row in ipairs(out.rows) do
      local seq = prompts[row.prompt]
      for t, id in ipairs(row.tokens) do
        local logits = m:next_logits({ seq }):totable()[1]
        assert.are.equal(argmax(penalised(logits, seq, 1.8)), id)
        -- log-probabilities stay those of the model, not of the penalised logits
        local want = log_softmax_at(logits, id)
        assert.is_true(math.abs(row.logprobs[t] - want) < 1e-4, ("%g vs %g"):format(row.logprobs[t], want))
        for _, s in ipairs(seq) do if s == id then repeats = repeats + 1; break end end
        seq = concat(seq, { id })
      end
      local pseq = prompts[row.prompt]
      for _, id in ipairs(plain.rows[i].tokens) do
        for _, s in ipairs(pseq) do if s == id then repeats_plain = repeats_plain + 1; break end end
        pseq = concat(pseq, { id })
      end
    end
    assert.is_true(repeats < repeats_plain, ("%d repeats with the penalty, %d without"):format(repeats, repeats_plain))
  end)

  it("keeps only tokens at least min_p times as likely as the top one, after the penalty and temperature", function()
    local m = model(8)
    local T, min_p, pen = 1.5, 0.3, 1.3
    local out = m:generate(prompts, { temperature = { T, T, T, T }, min_p = min_p, repetition_penalty = pen,
      max_new_tokens = 8, seed = 5 })
    local ratios = {}
    for _, row in ipairs(out.rows) do
      local seq = prompts[row.prompt]
      for _, id in ipairs(row.tokens) do
        local x = penalised(m:next_logits({ seq }):totable()[1], seq, pen)
        local top = x[argmax(x) + 1]
        local ratio = math.exp((x[id + 1] - top) / T)
        assert.is_true(ratio >= min_p - 1e-6, ("token %d: p / p_top = %g < min_p %g"):format(id, ratio, min_p))
        ratios[#ratios + 1] = ratio
        seq = concat(seq, { id })
      end
    end
    -- the draws are not all the top token: the filter kept a set, not just the argmax
    local below_top = 0
    for _, r in ipairs(ratios) do if r < 1 then below_top = below_top + 1 end end
    assert.is_true(below_top > 0, "every draw was the most likely token")
    -- min_p = 1 leaves the most likely token only: sampled rows equal the (penalised) greedy row
    local one = m:generate(prompts, { temperature = { 1, 0 }, min_p = 1, repetition_penalty = pen, max_new_tokens = 8, seed = 5 })
    for p = 1, #prompts do assert.are.same(one.rows[2 * p].tokens, one.rows[2 * p - 1].tokens) end
  end)

  -- A detokenizer of the test's own: each id is one of a few texts, some of them two letters and
  -- one empty (as a special token skipped), so that a stop string spans several tokens.
  local pieces = { "a", "b", "c", "ab", "", "ca", "d" }
  local function detok(ids)
    local out = {}
    for i, id in ipairs(ids) do out[i] = pieces[id % #pieces + 1] end
    return table.concat(out)
  end
  -- where each row should end: the first prefix of its free run whose text holds a stop string
  local function expect_stops(free, stops, budget)
    local want = {}
    for i, row in ipairs(free.rows) do
      local len, hit = math.min(#row.tokens, budget), nil
      for k = 1, len do
        local text = detok({ unpack(row.tokens, 1, k) })
        for _, st in ipairs(stops) do if text:find(st, 1, true) then hit = st; break end end
        if hit then len = k; break end
      end
      want[i] = { len = len, stop_string = hit }
    end
    return want
  end
  local function check_stops(out, free, want, what)
    local stopped, ran = 0, 0
    for i, row in ipairs(out.rows) do
      assert.are.equal(want[i].len, #row.tokens, what .. ": row " .. i)
      assert.are.same({ unpack(free.rows[i].tokens, 1, want[i].len) }, row.tokens)
      assert.are.equal(want[i].stop_string, row.stop_string, what .. ": row " .. i)
      if want[i].stop_string then stopped = stopped + 1; assert.are.equal("stop", row.finish)
      else ran = ran + 1 end
    end
    assert.is_true(stopped > 0 and ran > 0, ("%s: %d rows stopped, %d ran on: the case checks both"):format(what, stopped, ran))
  end

  it("ends a row where a stop string appears in its text, keeping the token that completed it", function()
    local m = model(9)
    local opts = { temperature = { 1, 1, 0 }, max_new_tokens = 12, seed = 2 }
    local free = m:generate(prompts, opts)
    local stops = { "dca", "cabc" }
    opts.stop_strings, opts.detokenize = stops, detok
    check_stops(m:generate(prompts, opts), free, expect_stops(free, stops, 12), "cpu")
    local function fails(needle, o)
      local ok, err = pcall(m.generate, m, prompts, o)
      assert.is_false(ok)
      assert.is_truthy(tostring(err):find(needle, 1, true), tostring(err))
    end
    fails("stop_strings needs detokenize", { stop_strings = { "x" } })
    fails("stop_strings[2] =  is not a non-empty string", { stop_strings = { "x", "" }, detokenize = detok })
  end)

  it("cuda: stop strings end the same rows at the same token on the device as on the cpu", function()
    if not remax.tensor.has_cuda() then return end
    local m = model(9)
    local g = remax.model.new(tiny(), { seed = 9, init_std = 0.3, device = "cuda" })
    local mp, gp = m:params(), g:params()
    for name, t in pairs(mp) do gp[name]:copy_(t) end
    local opts = { temperature = { 1, 1, 0 }, max_new_tokens = 12, seed = 2 }
    local free = m:generate(prompts, opts)
    assert.are.same(free.rows[3].tokens, g:generate(prompts, opts).rows[3].tokens)   -- the same weights
    local stops = { "dca", "cabc" }
    opts.stop_strings, opts.detokenize = stops, detok
    local want = expect_stops(free, stops, 12)
    check_stops(m:generate(prompts, opts), free, want, "cpu")
    check_stops(g:generate(prompts, opts), free, want, "cuda")
  end)

  it("reports each step to on_token", function()
    local m = model(4)
    local seen = {}
    local out = m:generate({ prompts[2] }, { max_new_tokens = 5, seed = 1, on_token = function(step, tokens, lengths)
      seen[#seen + 1] = { step = step, n = lengths[0], last = tokens[lengths[0] - 1] }
    end })
    assert.are.equal(5, #seen)
    for i, s in ipairs(seen) do
      assert.are.equal(i - 1, s.step)
      assert.are.equal(i, s.n)
      assert.are.equal(out.rows[1].tokens[i], s.last)
    end
  end)

  it("rejects bad requests with messages naming the setting", function()
    local m = model(5)
    local function fails(needle, p, opts)
      local ok, err = pcall(m.generate, m, p or prompts, opts or {})
      assert.is_false(ok)
      assert.is_truthy(tostring(err):find(needle, 1, true), tostring(err))
    end
    fails("per-slot lists disagree: top_p has 2 entries, temperature has 3", nil, { temperature = { 1, 1, 0 }, top_p = { 0.9, 1 } })
    fails("per-slot lists disagree: top_k has 1 entries, temperature has 3", nil, { top_k = { 5 }, temperature = { 1, 1, 0 } })
    fails("prompt 2 is empty", { { 1 }, {} })
    fails("prompt 1, position 2: 40 is not a token id in [0, 40)", { { 1, 40 } })
    fails("prompt 1, position 1: 1.5 is not a token id", { { 1.5 } })
    fails("temperature = -1 (slot 2) must be >= 0", nil, { temperature = { 1, -1 } })
    fails("top_p = 0 must be in (0, 1]", nil, { top_p = 0 })
    fails("top_k = 2.5 must be an integer", nil, { top_k = 2.5 })
    fails("min_p = 1.5 must be in [0, 1]", nil, { min_p = 1.5 })
    fails("min_p = -0.25 (slot 2) must be in [0, 1]", nil, { min_p = { 0, -0.25 } })
    fails("repetition_penalty = 0 must be a finite number > 0", nil, { repetition_penalty = 0 })
    fails("repetition_penalty = inf must be a finite number > 0", nil, { repetition_penalty = math.huge })
    fails("max_new_tokens = 0 must be an integer >= 1", nil, { max_new_tokens = 0 })
    fails("stop[1] = 99 is not a token id", nil, { stop = { 99 } })
    fails("max_position_embeddings", nil, { max_new_tokens = 125 })
    fails("expected a non-empty list of prompts", {})
  end)
end)

-- ---------------------------------------------------------------- remax generate

local tmpdir, write = support.tmpdir, support.write

local binary = support.remax_binary

local q = support.shell_quote

local err_file = support.tmpfile()

local function run(args)
  local p = io.popen(("%s generate %s 2>%s; echo \"rc=$?\""):format(q(binary()), args, q(err_file)))
  local out = p:read("*a")
  p:close()
  local f = io.open(err_file)
  local err = f and f:read("*a") or ""
  if f then f:close() end
  local rc = tonumber(out:match("rc=(%d+)%s*$"))
  return out:gsub("rc=%d+%s*$", ""), err, rc
end

describe("remax generate", function()
  local dir, tok, m
  setup(function()
    tok = remax.tokenizer.load("tests/fixtures/byte_tokenizer")
    m = model(6, tok.vocab_size)
    dir = tmpdir()
    m:save(dir)
    local src = io.open("tests/fixtures/byte_tokenizer/tokenizer.json", "rb")
    write(dir .. "/tokenizer.json", src:read("*a"))
    src:close()
    local cfg = cjson.decode(io.open("tests/fixtures/byte_tokenizer/tokenizer_config.json"):read("*a"))
    cfg.chat_template = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    write(dir .. "/tokenizer_config.json", cjson.encode(cfg))
    write(dir .. "/generation_config.json", cjson.encode({ eos_token_id = { 258, 256 } }))
    tok = remax.tokenizer.load(dir)
  end)
  teardown(function() os.execute("rm -rf " .. q(dir)) end)

  -- `remax generate` printed every row of model:generate's result `want` under its header
  local function assert_prints(out, want)
    for i, row in ipairs(want.rows) do
      local header = ("--- completion %d (%d tokens, %s)\n"):format(i, #row.tokens, row.finish)
      assert.is_truthy(out:find(header .. tok:decode(row.tokens, { skip_special_tokens = true }) .. "\n", 1, true), out)
    end
    return #want.rows
  end

  it("streams one completion: the text of the tokens model:generate gives", function()
    local out, err, rc = run(("--model %s --prompt %s --max-new-tokens 12 --seed 4 --temperature 0.9"):format(q(dir), q("héllo")))
    assert.are.equal(0, rc, err)
    local want = m:generate({ tok:encode("héllo") }, { temperature = 0.9, max_new_tokens = 12, seed = 4, stop = { 256, 258 } })
    assert.are.equal(tok:decode(want.rows[1].tokens, { skip_special_tokens = true }) .. "\n", out)
    assert.is_truthy(err:find("new tokens in", 1, true), err)
  end)

  it("prints --n completions, takes --prompt-ids, --chat and greedy settings", function()
    local out, err, rc = run(("--model %s --prompt-ids 104,105 --n 3 --max-new-tokens 5 --top-k 5 --top-p 0.9"):format(q(dir)))
    assert.are.equal(0, rc, err)
    local want = m:generate({ { 104, 105 } }, { temperature = { 1, 1, 1 }, top_k = 5, top_p = 0.9, max_new_tokens = 5,
      seed = 0, stop = { 256, 258 } })
    local n = assert_prints(out, want)
    assert.are.equal(3, n)
    local chat_out, chat_err, chat_rc = run(("--model %s --prompt hi --chat --temperature 0 --max-new-tokens 6"):format(q(dir)))
    assert.are.equal(0, chat_rc, chat_err)
    local ids = remax.chat.encode(tok, "hi")
    assert.are.equal(257, ids[1])   -- <|im_start|>: the template was applied
    local greedy = m:generate({ ids }, { temperature = 0, max_new_tokens = 6, stop = { 256, 258 } })
    assert.are.equal(tok:decode(greedy.rows[1].tokens, { skip_special_tokens = true }) .. "\n", chat_out)
  end)

  it("keeps weights in bf16 with --dtype bf16: the greedy tokens of the bf16-rounded model", function()
    local out, err, rc = run(("--model %s --prompt-ids 104,105 --temperature 0 --max-new-tokens 8 --dtype bf16"):format(q(dir)))
    assert.are.equal(0, rc, err)
    local bdir = tmpdir()
    m:save(bdir, { dtype = "bf16" })
    local rounded = remax.model.load(bdir)   -- the same weights rounded to bf16, kept in f32
    local want = rounded:generate({ { 104, 105 } }, { temperature = 0, max_new_tokens = 8, stop = { 256, 258 } })
    assert.are.equal(tok:decode(want.rows[1].tokens, { skip_special_tokens = true }) .. "\n", out)
    local _
    _, err, rc = run(("--model %s --prompt-ids 1,2 --dtype f16"):format(q(dir)))
    assert.are_not.equal(0, rc)
    assert.is_truthy(err:find("--dtype f16: the CPU keeps weights in auto, f32 or bf16", 1, true), err)
  end)

  it("takes --min-p and --repetition-penalty: the tokens model:generate gives with them", function()
    local out, err, rc = run(("--model %s --prompt-ids 104,105,104 --n 3 --max-new-tokens 6 --seed 2 --min-p 0.05 "
      .. "--repetition-penalty 1.4"):format(q(dir)))
    assert.are.equal(0, rc, err)
    local want = m:generate({ { 104, 105, 104 } }, { temperature = { 1, 1, 1 }, min_p = 0.05, repetition_penalty = 1.4,
      max_new_tokens = 6, seed = 2, stop = { 256, 258 } })
    local plain = m:generate({ { 104, 105, 104 } }, { temperature = { 1, 1, 1 }, max_new_tokens = 6, seed = 2, stop = { 256, 258 } })
    assert.are_not.same(plain.rows[1].tokens, want.rows[1].tokens)   -- the settings reached the sampler
    assert_prints(out, want)
    _, err, rc = run(("--model %s --prompt hi --min-p 2"):format(q(dir)))
    assert.are_not.equal(0, rc)
    assert.is_truthy(err:find("--min-p 2: expected a number in [0, 1]", 1, true), err)
    _, err, rc = run(("--model %s --prompt hi --repetition-penalty 0"):format(q(dir)))
    assert.are_not.equal(0, rc)
    assert.is_truthy(err:find("--repetition-penalty 0: expected a number > 0 (1 = off)", 1, true), err)
  end)

  it("takes --stop-string: completions end where the text appears, as model:generate's stop_strings", function()
    local gen = { temperature = { 1, 1, 1, 1 }, max_new_tokens = 10, seed = 6, stop = { 256, 258 } }
    local free = m:generate({ { 104, 105 } }, gen)
    -- two letters or digits (byte-level ids are the bytes) one completion draws in a row, after its first token
    local function alnum(id) return id < 128 and string.char(id):match("%w") ~= nil end
    local stop, row_with
    for i, row in ipairs(free.rows) do
      for t = 2, #row.tokens - 1 do
        if not stop and alnum(row.tokens[t]) and alnum(row.tokens[t + 1]) then
          stop, row_with = string.char(row.tokens[t], row.tokens[t + 1]), i
        end
      end
    end
    assert.is_truthy(stop, "no two letters in a row to stop on")
    local out, err, rc = run(("--model %s --prompt-ids 104,105 --n 4 --max-new-tokens 10 --seed 6 --stop-string %s"):format(
      q(dir), q(stop)))
    assert.are.equal(0, rc, err)
    gen.stop_strings = { stop }
    gen.detokenize = function(ids) return tok:decode(ids, { skip_special_tokens = true }) end
    local want = m:generate({ { 104, 105 } }, gen)
    assert.are.equal("stop", want.rows[row_with].finish)
    assert.are.equal(stop, want.rows[row_with].stop_string)
    assert_prints(out, want)
    _, err, rc = run(("--model %s --prompt hi --stop-string ''"):format(q(dir)))
    assert.are_not.equal(0, rc)
    assert.is_truthy(err:find("--stop-string: expected a non-empty text", 1, true), err)
  end)

  it("runs with --device cuda: the CPU's tokens in f32 where a device is present, else a clear error", function()
    local args = ("--model %s --prompt-ids 104,105 --n 3 --max-new-tokens 6 --seed 3 --top-k 5"):format(q(dir))
    local want, werr, wrc = run(args)
    assert.are.equal(0, wrc, werr)
    local out, err, rc = run(args .. " --device cuda")
    if remax.tensor.has_cuda() then
      assert.are.equal(0, rc, err)
      assert.are.equal(want, out)
      -- min-p and the repetition penalty, sampled and greedy, sample the CPU's tokens too
      for _, extra in ipairs({ " --min-p 0.1 --repetition-penalty 1.5 --top-k 0", " --temperature 0 --repetition-penalty 2" }) do
        local cw, cerr, crc = run(args .. extra)
        assert.are.equal(0, crc, cerr)
        local gw, gerr, grc = run(args .. extra .. " --device cuda")
        assert.are.equal(0, grc, gerr)
        assert.are.equal(cw, gw)
      end
      -- stop tokens (what `stop` names resolve to) end the same rows at the same token: one that
      -- the second completion draws midway, so that some rows stop and others run on
      local free = m:generate({ { 104, 105 } }, { temperature = { 1, 1, 1 }, top_k = 5, max_new_tokens = 6, seed = 3,
        stop = { 256, 258 } })
      local stop = free.rows[2].tokens[3]
      local cw, cerr, crc = run(args .. " --stop " .. stop)
      assert.are.equal(0, crc, cerr)
      assert.is_truthy(cw:find("tokens, stop)", 1, true), cw)
      local gw, gerr, grc = run(args .. " --stop " .. stop .. " --device cuda")
      assert.are.equal(0, grc, gerr)
      assert.are.equal(cw, gw)
    else
      assert.are_not.equal(0, rc)
      assert.is_truthy(err:find("--device cuda: no usable CUDA device", 1, true), err)
    end
    _, err, rc = run(args .. " --device tpu")
    assert.are_not.equal(0, rc)
    assert.is_truthy(err:find("--device tpu: expected cpu or cuda", 1, true), err)
  end)

  it("fails clearly on a missing --model, a bad flag or a bad value", function()
    local _, err, rc = run("--prompt hi")
    assert.are_not.equal(0, rc)
    assert.is_truthy(err:find("missing --model DIR", 1, true), err)
    _, err, rc = run(("--model %s --prompt hi --frobnicate 3"):format(q(dir)))
    assert.are_not.equal(0, rc)
    assert.is_truthy(err:find("unknown argument '--frobnicate'", 1, true), err)
    _, err, rc = run(("--model %s --prompt hi --top-p 1.5"):format(q(dir)))
    assert.is_truthy(err:find("--top-p 1.5: expected a number in (0, 1]", 1, true), err)
    _, err, rc = run(("--model %s --prompt-ids 1,x"):format(q(dir)))
    assert.is_truthy(err:find("--prompt-ids: 'x' is not a token id", 1, true), err)
    _, err, rc = run(("--model %s/nowhere --prompt-ids 1,2"):format(q(dir)))
    assert.are_not.equal(0, rc)
    assert.is_truthy(err:find("nowhere/config.json", 1, true), err)
  end)
end)
