-- Evaluation diagnostics: `remax eval --samples K` (greedy and sampled accuracy, pass@k, headroom).
local config = require("remax.settings.config")
local trainer = require("remax.run.run")
local cli = require("remax.cli.main")

local support = require("support")
local TINY = support.tiny_model({ max_position_embeddings = 64 })
local tmpdir = support.tmpdir

-- C(n, k) by the multiplicative formula
local function choose(n, k)
  if k < 0 or k > n then return 0 end
  local c = 1
  for i = 1, k do c = c * (n - k + i) / i end
  return c
end

-- pass@k by enumerating every k-subset of n samples of which the first c are right
local function pass_brute(n, c, k)
  local hit, total = 0, 0
  local function rec(start, left, any)
    if left == 0 then
      total = total + 1
      if any then hit = hit + 1 end
      return
    end
    for i = start, n - left + 1 do rec(i + 1, left - 1, any or i <= c) end
  end
  rec(1, k, false)
  return hit / total
end

describe("evaluation", function()
  it("pass@k is the unbiased estimator 1 - C(n-c,k)/C(n,k)", function()
    for n = 1, 8 do
      for c = 0, n do
        for k = 1, n do
          local v = require("remax.step.evaluate").pass_at_k(n, c, k)
          assert.is_true(math.abs(v - pass_brute(n, c, k)) < 1e-12, ("n=%d c=%d k=%d"):format(n, c, k))
          assert.is_true(math.abs(v - (1 - choose(n - c, k) / choose(n, k))) < 1e-12)
        end
      end
    end
  end)

  it("with samples, reports sampled accuracy, pass@k and headroom that match the scored rows", function()
    local dir = tmpdir()
    local f = assert(io.open(dir .. "/p.jsonl", "wb"))
    for i = 1, 40 do f:write(('{"prompt": "q%d", "answer": "a"}\n'):format(i)) end
    f:close()
    -- right = the first completion token is even: about half of random samples
    local seen = {}
    local even = { name = "even", fn = function(completions, batch)
      local s = {}
      for i = 1, #completions do
        local first = batch.completion_ids[i][1] or 1
        s[i] = first % 2 == 0 and 1 or 0
        if batch.greedy then seen[#seen + 1] = { prompt = batch.prompt[i], greedy = batch.greedy[i], right = s[i] } end
      end
      return s
    end }
    local K = 6
    local cfg = config.resolve({ model_config = TINY, data = dir .. "/p.jsonl", eval_data = dir .. "/p.jsonl",
      rewards = { even }, chat_template = "plain", eval_size = 40, max_completion_length = 3,
      per_device_eval_batch_size = 70, output_dir = dir .. "/runs", hot_reload = false, seed = 4 })
    local t = trainer.new(cfg, { quiet = true, signals = false, eval_only = true })
    seen = {}   -- drop the reward probe's calls
    local e = t:evaluate({ samples = K })
    -- recompute every number from what the reward saw
    local per = {}
    for _, s in ipairs(seen) do
      local p = per[s.prompt] or { right = 0, n = 0 }
      per[s.prompt] = p
      if s.greedy then p.greedy = s.right else p.right, p.n = p.right + s.right, p.n + 1 end
    end
    local n, gacc, sacc, wrong, head = 0, 0, 0, 0, 0
    local pass = {}
    for _, p in pairs(per) do
      n = n + 1
      assert.are.equal(K, p.n)
      gacc, sacc = gacc + p.greedy, sacc + p.right / K
      if p.greedy == 0 then wrong = wrong + 1; if p.right > 0 then head = head + 1 end end
      for _, k in ipairs({ 1, 2, 4, 6 }) do pass[k] = (pass[k] or 0) + pass_brute(K, p.right, k) end
    end
    assert.are.equal(40, n)
    assert.are.equal(40, e.n)
    assert.is_true(math.abs(e.accuracy - gacc / n) < 1e-12)
    assert.is_true(math.abs(e.sampled_accuracy - sacc / n) < 1e-12)
    assert.is_true(math.abs(e.greedy_wrong - wrong / n) < 1e-12)
    assert.is_true(math.abs(e.headroom - head / n) < 1e-12)
    assert.is_true(e.headroom > 0 and e.headroom < 1, "the task has headroom: " .. e.headroom)
    local ks = {}
    for i, p in ipairs(e.pass_at) do
      ks[i] = p.k
      assert.is_true(math.abs(p.value - pass[p.k] / n) < 1e-12, "pass@" .. p.k)
    end
    assert.are.same({ 1, 2, 4, 6 }, ks)
    -- the report names every number
    local text = table.concat(cli.eval_report(e, "m", "even"), "\n")
    assert.matches("pass@1 ", text, 1, true)
    assert.matches("pass@6 ", text, 1, true)
    assert.matches("headroom", text, 1, true)
    -- the old name and signature, require("remax.train.evaluate").run(run, rows, opts), give the
    -- same evaluation; a wrong first argument is an error that names the signature
    local old = require("remax.deprecated").moved("remax.train.evaluate", "remax.step.evaluate")
    local again = old.run(t, t.eval_ds.rows, { samples = K })
    assert.are.equal(e.accuracy, again.accuracy)
    assert.are.equal(e.sampled_accuracy, again.sampled_accuracy)
    assert.are.equal(e.n, again.n)
    local ok, err = pcall(old.run, {}, t.eval_ds.rows)
    assert.is_false(ok)
    assert.matches("ctx is {policy, cfg, world, accuracy_name} or a Run", tostring(err), 1, true)
    os.execute("rm -rf " .. dir)
  end)

  -- The program beside the library in use (REMAX_LIB: the CUDA emulator's build runs the specs
  -- named cuda), else the build's.
  local binary, q = support.remax_binary, support.shell_quote

  it("remax eval --device cuda: the CPU's report (greedy and sampled rows, f32), else a clear refusal", function()
    local remax = require("remax")
    local dir = tmpdir()
    local tok = remax.tokenizer.load("tests/fixtures/byte_tokenizer")
    local m = remax.model.new(support.tiny_model({ vocab_size = tok.vocab_size, attention_bias = true }),
      { seed = 9, init_std = 0.3 })
    m:save(dir .. "/model")
    for _, name in ipairs({ "tokenizer.json", "tokenizer_config.json" }) do
      support.write(dir .. "/model/" .. name, support.read("tests/fixtures/byte_tokenizer/" .. name))
    end
    support.prompts(dir .. "/p.jsonl", 6, '{"prompt": "say %d things", "answer": "x"}')
    support.write(dir .. "/lower.lua", support.LOWER)
    -- min-p and the repetition penalty on: the sampled rows go through every rule of the sampler
    support.write(dir .. "/r.lua", ("return { data = %q, eval_data = %q, rewards = { %q }, chat_template = 'plain', "
      .. "eval_size = 6, max_completion_length = 6, temperature = 1.2, min_p = 0.02, repetition_penalty = 1.3, "
      .. "seed = 5, dtype = 'f32', output_dir = %q }"):format(dir .. "/p.jsonl", dir .. "/p.jsonl", dir .. "/lower.lua",
      dir .. "/runs"))   -- f32 on both: dtype auto is bf16 on CPUs with AVX-512 BF16
    local function eval(device)
      local err_file = support.tmpfile()
      local p = io.popen(("%s eval %s --model %s --samples 3 --device %s 2>%s; echo \"rc=$?\""):format(q(binary()),
        q(dir .. "/r.lua"), q(dir .. "/model"), device, q(err_file)))
      local out = p:read("*a")
      p:close()
      local text = out:gsub("rc=%d+%s*$", ""):gsub(", [%d.]+s%)", ")")   -- the report's timing aside
      return text, support.read(err_file), tonumber(out:match("rc=(%d+)%s*$"))
    end
    local want, werr, wrc = eval("cpu")
    assert.are.equal(0, wrc, werr)
    assert.matches("pass@3", want, 1, true)
    assert.matches("held-out prompts)", want, 1, true)
    local got, err, rc = eval("cuda")
    if remax.tensor.has_cuda() then
      assert.are.equal(0, rc, err)
      assert.are.equal(want, got)
    else
      assert.are_not.equal(0, rc)
      assert.matches("device = cuda", err, 1, true)
    end
  end)

  it("remax eval refuses a bad --samples value by name", function()
    local ok, err = pcall(cli.eval, "recipes/gsm8k.lua", "--samples", "zero")
    assert.is_false(ok)
    assert.matches("--samples zero: need an integer from 1 to 1024", tostring(err), 1, true)
  end)
end)
