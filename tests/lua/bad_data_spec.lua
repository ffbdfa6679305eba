-- Bad data and settings (issue 15, part 4): each gives one clear message naming the file, line,
-- key or reward, and no lost work -- the dataset loader, reward results, reward_timeout, prompts
-- over max_prompt_length (kept by their last tokens, counted in the metrics).
local data = require("remax.formats.data")
local rewards = require("remax.step.rewards")
local config = require("remax.settings.config")
local trainer = require("remax.run.run")
local support = require("support")
local tmpdir, write = support.tmpdir, support.write

local err_of = support.error_of

describe("dataset files", function()
  local dir = tmpdir()
  local function load(name, text, opts)
    write(dir .. "/" .. name, text)
    return err_of(data.load, dir .. "/" .. name, opts)
  end

  it("names the line of a JSONL line that is not JSON", function()
    local msg = load("bad.jsonl", '{"prompt": "a"}\n\n{"prompt": "b"\n{"prompt": "c"}\n')
    assert.matches(dir .. "/bad.jsonl:3: malformed JSON line", msg, 1, true)
  end)

  it("names the line and the columns of a row missing the prompt column", function()
    local msg = load("nocol.jsonl", '{"text": "a", "answer": "1"}\n')
    assert.matches(dir .. "/nocol.jsonl:1: no prompt column", msg, 1, true)
    assert.matches("columns: answer, text", msg, 1, true)
    msg = load("nocol2.jsonl", '{"question": "a"}\n{"question": "b"}\n', { prompt = "prompt" })
    assert.matches(dir .. "/nocol2.jsonl:1: missing prompt column 'prompt'; columns: question", msg, 1, true)
    msg = load("later.jsonl", '{"prompt": "a"}\n{"promt": "b"}\n')
    assert.matches(dir .. "/later.jsonl:2: missing prompt column 'prompt'; columns: promt", msg, 1, true)
  end)

  it("refuses an empty dataset, naming it", function()
    for _, case in ipairs({ { "empty.jsonl", "" }, { "blank.jsonl", "\n  \n" }, { "empty.json", " [ ] " } }) do
      local msg = load(case[1], case[2])
      assert.matches(dir .. "/" .. case[1] .. " has no rows", msg, 1, true)
    end
  end)

  it("refuses bytes that are not UTF-8, naming the line, the column and the byte", function()
    local msg = load("latin1.jsonl", '{"prompt": "ok"}\n{"prompt": "caf\233 au lait"}\n')
    assert.matches(dir .. "/latin1.jsonl:2: prompt column 'prompt' is not valid UTF-8: byte 4 of the text is 0xE9", msg, 1, true)
    msg = load("msgs.jsonl", '{"prompt": [{"role": "user", "content": "a\192\175"}]}\n')
    assert.matches("msgs.jsonl:1: prompt column 'prompt', message 1 is not valid UTF-8: byte 2", msg, 1, true)
    msg = load("answer.jsonl", '{"prompt": "q", "answer": "\237\160\128"}\n')   -- a UTF-16 surrogate
    assert.matches("answer.jsonl:1: answer column 'answer' is not valid UTF-8: byte 1", msg, 1, true)
    -- valid multi-byte text loads
    write(dir .. "/good.jsonl", '{"prompt": "h\195\169llo \228\184\150 \240\159\142\137"}\n')
    assert.are.equal(1, data.load(dir .. "/good.jsonl"):size())
  end)

  it("names a missing file without a Lua position", function()
    local msg = err_of(data.load, dir .. "/nope.jsonl")
    assert.are.equal("remax.data: cannot open " .. dir .. "/nope.jsonl: No such file or directory", msg)
  end)
end)

describe("reward results", function()
  local function reward(fn) return rewards.normalize({ name = "r", fn = fn }, 1) end
  local completions = { "a", "b", "c" }

  it("refuses more scores than completions, strings, NaN and a missing list, naming the reward", function()
    local msg = err_of(rewards.run_one, reward(function() return { 1, 1, 1, 1 } end), completions, {}, { step = 2 })
    assert.matches("reward 'r' (.-) returned 4 scores for 3 completions at step 2", msg)
    msg = err_of(rewards.run_one, reward(function() return { 1, "0.5", 1 } end), completions, {})
    assert.matches("returned a string (0.5) for completion 2; expected a finite number or nil", msg, 1, true)
    assert.matches('completion: "b"', msg, 1, true)
    msg = err_of(rewards.run_one, reward(function() return { 1, 1, 0 / 0 } end), completions, {})
    assert.matches("returned nan for completion 3", msg, 1, true)
    msg = err_of(rewards.run_one, reward(function() end), completions, {})
    assert.matches("returned a nil; expected a list of 3 numbers (nil = no score)", msg, 1, true)
  end)

  it("runs on_failure (the trainer's checkpoint) before raising", function()
    local saved = false
    err_of(rewards.run_one, reward(function() return { {} } end), completions, {}, { on_failure = function() saved = true end })
    assert.is_true(saved)
  end)
end)

describe("reward_timeout", function()
  local function spin(n) local s = 0 for i = 1, n do s = s + i % 7 end return s end
  spin(1e6)   -- compiled by the JIT before the timeout turns it off

  it("stops a Lua reward that runs past the limit, naming it and the limit, after on_failure", function()
    local saved = false
    local r = rewards.normalize({ name = "slow", fn = function() spin(1e15) end }, 1)
    local t0 = rewards.clock()
    local msg = err_of(rewards.run_one, r, { "a" }, {}, { timeout = 0.2, step = 4, on_failure = function() saved = true end })
    assert.is_true(rewards.clock() - t0 < 30)
    assert.matches("^reward 'slow' %(tests/lua/bad_data_spec.lua:%d+%) took over reward_timeout = 0.2 s at step 4 %(stopped at", msg)
    assert.is_true(saved)
    -- the JIT, the hook and the global pcall are as they were
    assert.is_true((jit.status()))
    assert.is_nil(debug.gethook())
    assert.are.equal(rewards.call_with_timeout, rewards.call_with_timeout)
    local ok = pcall(error, "x")
    assert.is_false(ok)
  end)

  it("is not swallowed by a reward that catches every error", function()
    local r = rewards.normalize({ name = "stubborn", fn = function()
      while true do pcall(spin, 1e15) end
    end }, 1)
    local msg = err_of(rewards.run_one, r, { "a" }, {}, { timeout = 0.2 })
    assert.matches("reward 'stubborn'", msg, 1, true)
    assert.matches("took over reward_timeout = 0.2 s", msg, 1, true)
  end)

  it("reports a blocking C call that overran when it returns", function()
    local r = rewards.normalize({ name = "sleeper", fn = function() os.execute("sleep 0.5"); return { 1 } end }, 1)
    local msg = err_of(rewards.run_one, r, { "a" }, {}, { timeout = 0.1 })
    assert.matches("reward 'sleeper' .- took over reward_timeout = 0.1 s %(stopped at 0%.[5-9]", msg)
  end)

  it("leaves a fast reward's scores alone, and 0 means no limit", function()
    local r = rewards.normalize({ name = "quick", fn = function(c) return { 0.5, spin(100) } end }, 1)
    assert.are.same({ 0.5, spin(100) }, rewards.run_one(r, { "a", "b" }, {}, { timeout = 5 }))
    assert.are.same({ 0.5, spin(100) }, rewards.run_one(r, { "a", "b" }, {}, { timeout = 0 }))
  end)

  it("is a setting with a default, refused when negative", function()
    -- unset: a minute, or four times the step's generation time when that is longer
    assert.is_nil(config.resolve({}).reward_timeout)
    assert.are.equal(60, rewards.limit(nil, 2))
    assert.are.equal(400, rewards.limit(nil, 100))
    assert.are.equal(0.5, rewards.limit(0.5, 100))
    assert.are.equal(0, rewards.limit(0, 100))
    assert.matches("reward_timeout = -1: expected a number in [0, inf)", err_of(config.resolve, { reward_timeout = -1 }), 1, true)
  end)
end)

-- A tiny random model with the byte-level tokenizer, as trainer_spec.lua uses.
local TINY = support.tiny_model({ num_hidden_layers = 1 })

local function setup(reward_src)
  local dir = tmpdir()
  write(dir .. "/r.lua", reward_src)
  support.prompts(dir .. "/p.jsonl", 8, '{"prompt": "a prompt of some length %d"}')
  return dir
end

local function new_trainer(dir, extra)
  local s = { model_config = TINY, data = dir .. "/p.jsonl", rewards = { dir .. "/r.lua" }, chat_template = "plain",
    num_generations = 2, max_completion_length = 4, per_device_train_batch_size = 2, gradient_accumulation_steps = 1,
    learning_rate = 1e-3, max_steps = 3, eval_size = 0, output_dir = dir .. "/runs", save_steps = 1,
    log_completions = 0, seed = 3 }
  for k, v in pairs(extra or {}) do s[k] = v end
  return trainer.new(config.resolve(s), { quiet = true, signals = false })
end

describe("the trainer with bad rewards and long prompts", function()
  it("stops a run whose reward passes reward_timeout, naming it, and keeps the last checkpoint", function()
    local dir = setup([[
return { name = "hangs_later", fn = function(completions)
  if _G.HANG_REWARD then while true do end end
  local s = {}
  for i = 1, #completions do s[i] = 0.5 end
  return s
end }
]])
    local t = new_trainer(dir, { reward_timeout = 0.3 })
    t:train_step()
    _G.HANG_REWARD = true
    local msg = err_of(t.train_step, t)
    _G.HANG_REWARD = nil
    assert.matches("reward 'hangs_later' (" .. dir .. "/r.lua:1) took over reward_timeout = 0.3 s at step 2", msg, 1, true)
    local _, step = t.run:latest_checkpoint()
    assert.are.equal(1, step)
  end)

  it("refuses a training micro-batch whose activations cannot fit, before the engine allocates them", function()
    local fit = require("remax.step.fit")
    local dir = setup("return { name = 'z', fn = function(c) local s = {} for i = 1, #c do s[i] = i % 2 end return s end }")
    local t = new_trainer(dir)
    local real = fit.available_bytes
    fit.available_bytes = function() return 4096 end   -- a machine with 4 KiB free
    local ok, msg = pcall(t.train_step, t)
    fit.available_bytes = real
    assert.is_false(ok)
    local B = tonumber(msg:match("^step 1: a training micro%-batch of (%d+) rows x %d+ tokens needs [%d.]+ [MG]iB of activations, but 0%.0 MiB"))
    assert.is_not_nil(B, msg)
    local fits = tonumber(msg:match("(%d+) rows of %d+ tokens would fit"))
    assert.is_true(fits < B, msg)
  end)

  it("keeps a long prompt's last tokens and counts such prompts in the step's metrics", function()
    local dir = setup([[
return { name = "len", fn = function(completions, batch)
  local s = {}
  for i = 1, #completions do s[i] = batch.prompt_ids and #batch.prompt_ids[i] or 0 end
  return s
end }
]])
    local t = new_trainer(dir, { max_prompt_length = 5 })
    local ids = t.stepper:encode_prompt("a prompt of some length 1")
    assert.are.same(t.tok:encode("gth 1", { add_special_tokens = false }), ids)
    local m = t:train_step()
    assert.are.equal(2, m.prompts_truncated)
    assert.are.equal(1, m.frac_prompts_truncated)
    assert.are.equal(5, m.reward)   -- every scored prompt is 5 tokens long
    local t2 = new_trainer(setup("return { name = 'z', fn = function(c) local s = {} for i = 1, #c do s[i] = 0 end return s end }"))
    local m2 = t2:train_step()
    assert.are.equal(0, m2.prompts_truncated)
    assert.are.equal(0, m2.frac_prompts_truncated)
  end)
end)
