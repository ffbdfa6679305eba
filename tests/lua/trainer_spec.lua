-- End-to-end trainer checks on a tiny random model (byte-level tokenizer, real model:generate).
local config = require("remax.settings.config")
local trainer = require("remax.run.run")
local cli = require("remax.cli.main")
local ffi = require("ffi")

local support = require("support")
local write = support.write

-- setup() writes the reward LOWER: the fraction of completion tokens that are lowercase ASCII
-- letters (about 10% for a random byte-level model; easy to learn)
local TINY = support.tiny_model()

local function setup() return support.train_dir(24) end

local function settings(dir, extra)
  return support.run_settings(dir, {
    model_config = TINY, num_generations = 4, max_completion_length = 10, per_device_train_batch_size = 4,
    gradient_accumulation_steps = 2, learning_rate = 1e-2, max_steps = 30, seed = 7, dtype = "f32",
  }, extra)
end

local function new_trainer(dir, extra, overrides)
  local cfg = config.resolve(settings(dir, extra), overrides)
  return trainer.new(cfg, { quiet = true, signals = false })
end

local function params_bytes(model)
  local out = {}
  for name, p in pairs(model:params()) do
    out[name] = ffi.string(p.data, tonumber(p.numel) * 4)
  end
  return out
end

local capture_error = support.error_of

describe("trainer", function()
  it("raises the reward of a learnable task with ReMax (and logs the contract's metrics)", function()
    local dir = setup()
    local t = new_trainer(dir)
    local out = t:train()
    local h = out.history
    assert.are.equal(30, #h)
    local function avg(a, b)
      local s = 0
      for i = a, b do s = s + h[i].reward end
      return s / (b - a + 1)
    end
    local first, last = avg(1, 5), avg(26, 30)
    assert.is_true(last > first + 0.15, ("reward %.3f -> %.3f"):format(first, last))
    for _, k in ipairs({ "reward", "reward_greedy", "reward/lower", "reward_greedy/lower", "advantage_mean",
      "advantage_std", "kl", "loss", "grad_norm", "lr", "completion_length_mean", "completion_length_max",
      "truncated_fraction", "tokens_per_s", "time_generate", "time_score", "time_train", "peak_memory_mib",
      "bad_steps", "reloads" }) do
      assert.is_not_nil(h[30][k], "metric " .. k)
    end
    local rows = t.run:metrics()
    assert.are.equal(30, #rows)
    assert.is_not_nil(t.run:latest_checkpoint())
  end)

  it("ends completions at stop_strings and applies min_p and repetition_penalty to its rollouts", function()
    local dir = setup()
    local free = new_trainer(dir, { max_steps = 1 })
    local batch = free:next_batch()
    local ro_free = free:rollout(batch)
    -- a two-letter text that some completions hold and others do not
    local counts = {}
    for _, r in ipairs(ro_free.rows) do
      for i = 1, #r.text - 1 do
        local s = r.text:sub(i, i + 1)
        if s:match("^%w%w$") then counts[s] = (counts[s] or 0) + 1 end
      end
    end
    local stop
    for s, n in pairs(counts) do if n >= 1 and n < #ro_free.rows and (not stop or s < stop) then stop = s end end
    assert.is_truthy(stop, "no two-letter text to stop on")
    local t = new_trainer(dir, { max_steps = 1, stop_strings = { stop } })
    local ro = t:rollout(t:next_batch())
    local stopped = 0
    for i, r in ipairs(ro.rows) do
      local at = ro_free.rows[i].text:find(stop, 1, true)
      if at then
        stopped = stopped + 1
        assert.are.equal("stop", r.finish)
        assert.are.equal(stop, r.text:sub(-2))   -- the text of its tokens, up to the one that completed it
      else
        assert.are.same(ro_free.rows[i].tokens, r.tokens)
      end
    end
    assert.is_true(stopped > 0)
    -- the sampler settings reach the rollouts: a strong penalty changes what is drawn
    local p = new_trainer(dir, { max_steps = 1, repetition_penalty = 3, min_p = 0.2 })
    local ro_p = p:rollout(p:next_batch())
    local differ = 0
    for i, r in ipairs(ro_p.rows) do
      if table.concat(r.tokens, ",") ~= table.concat(ro_free.rows[i].tokens, ",") then differ = differ + 1 end
    end
    assert.is_true(differ > 0, "min_p and repetition_penalty changed no rollout row")
  end)

  it("resumes exactly: 3 steps + resume + 3 steps == 6 steps", function()
    local dir = setup()
    local extra = { max_steps = 6, beta = 0.05, lr_scheduler_type = "cosine", warmup_ratio = 0.34,
      weight_decay = 0.01, learning_rate = 3e-3 }
    extra.run_name = "straight"
    local a = new_trainer(dir, extra)
    a:train()
    extra.run_name = "split"
    local b = new_trainer(dir, extra)
    for _ = 1, 3 do b:train_step() end
    b:save_checkpoint()
    extra.run_name, extra.resume = nil, dir .. "/runs/split"
    local c = new_trainer(dir, extra)
    assert.are.equal(3, c.step)
    c:train()
    assert.are.equal(6, c.step)
    local pa, pc = params_bytes(a.model), params_bytes(c.model)
    for name, bytes in pairs(pa) do
      assert.is_true(bytes == pc[name], "parameter " .. name .. " differs after resume")
    end
    -- the straight run's metrics and the resumed run's agree step by step
    local ma, mc = a.run:metrics(), c.run:metrics()
    assert.are.equal(ma[6].reward, mc[6].reward)
    assert.are.equal(ma[6].loss, mc[6].loss)
  end)

  it("trains with SFT on prompt -> answer (loss falls)", function()
    local dir = setup()
    local t = new_trainer(dir, { algo = "sft", max_steps = 15, learning_rate = 1e-2, rewards = { dir .. "/lower.lua" } })
    local out = t:train()
    assert.is_true(out.history[15].loss < out.history[1].loss * 0.7,
      ("sft loss %.3f -> %.3f"):format(out.history[1].loss, out.history[15].loss))
  end)

  it("stops on a failing reward with its name, file:line and the completion, after a checkpoint", function()
    local dir = setup()
    write(dir .. "/bad.lua", [[
return { name = "flaky", fn = function(completions, batch)
  local s = {}
  for i, c in ipairs(completions) do
    if _G.FLAKY_ON and batch.greedy[i] then
      s[i] = 0/0
    else
      s[i] = 0.5
    end
  end
  return s
end }
]])
    local t = new_trainer(dir, { rewards = { dir .. "/lower.lua", dir .. "/bad.lua" }, max_steps = 3 })
    assert.is_nil(t.run:latest_checkpoint())
    t:train_step()
    _G.FLAKY_ON = true
    local err = capture_error(t.train_step, t)
    _G.FLAKY_ON = nil
    assert.matches("reward 'flaky'", err, 1, true)
    assert.matches("bad.lua:1", err, 1, true)
    assert.matches("returned nan", err, 1, true)
    assert.matches("completion: \"", err, 1, true)
    local _, step = t.run:latest_checkpoint()
    assert.are.equal(1, step)

    write(dir .. "/throws.lua", [[
return { name = "thrower", fn = function(completions, batch)
  error("no column 'solution' in batch")
end }
]])
    err = capture_error(new_trainer, dir, { rewards = { dir .. "/throws.lua" } })
    assert.matches("reward 'thrower'", err, 1, true)
    assert.matches("throws.lua:2: no column 'solution'", err, 1, true)
    assert.matches("columns: answer, prompt", err, 1, true)
  end)

  it("names missing dataset columns", function()
    local dir = setup()
    write(dir .. "/noanswer.jsonl", '{"prompt": "a"}\n{"prompt": "b"}\n')
    local err = capture_error(new_trainer, dir, { algo = "sft", data = dir .. "/noanswer.jsonl" })
    assert.matches("answer column 'answer'", err, 1, true)
    assert.matches("columns: prompt", err, 1, true)
    err = capture_error(new_trainer, dir, { data = dir .. "/noanswer.jsonl", prompt_column = "question" })
    assert.matches("noanswer.jsonl:1: missing prompt column 'question'", err, 1, true)
  end)

  it("takes its data from a recipe function: train_size rows of 'train', eval_size of 'test'", function()
    local dir = setup()
    local calls = {}
    local function rows_of(split, n, cfg)
      calls[#calls + 1] = { split, n, cfg.seed }
      local rows = {}
      for i = 1, n do rows[i] = { prompt = split .. " " .. i, answer = "x" .. i } end
      return rows
    end
    local t = new_trainer(dir, { data = rows_of, train_size = 6, eval_size = 3 })
    assert.are.same({ { "train", 6, 7 }, { "test", 3, 7 } }, calls)
    assert.are.equal(6, #t.train_ds.rows)
    assert.are.same({ "test 1", "test 2", "test 3" }, { t.eval_ds.rows[1].prompt, t.eval_ds.rows[2].prompt, t.eval_ds.rows[3].prompt })
    -- a file as data has no held-out split unless eval_data names one
    assert.is_nil(new_trainer(dir, { eval_size = 3 }).eval_ds)
    local err = capture_error(new_trainer, dir, { data = function() error("no rows today") end })
    assert.matches("split train: ", err, 1, true)
    assert.matches("no rows today", err, 1, true)
  end)

  it("stops without data, saying how to give it", function()
    local dir = setup()
    local s = settings(dir)
    s.data = nil
    local err = capture_error(function() return trainer.new(config.resolve(s), { quiet = true, signals = false }) end)
    assert.matches("no training data: set data to a JSONL or JSON file (--data FILE)", err, 1, true)
    assert.matches("remax.tasks.gsm8k.synthetic()", err, 1, true)
  end)

  it("hot-reloads a changed reward file and keeps the old one when the new one fails", function()
    local dir = setup()
    local t = new_trainer(dir, { max_steps = 4 })
    t:train_step()
    write(dir .. "/lower.lua", "return { name = 'lower', fn = function(c) error('broken') end }")
    assert.are.equal(0, t:check_reload())
    t:train_step()
    write(dir .. "/lower.lua", "return { name = 'lower', fn = function(c) local s = {} for i = 1, #c do s[i] = 1 end return s end }")
    assert.are.equal(1, t:check_reload())
    local m = t:train_step()
    assert.are.equal(1, m.reward)
    assert.are.equal(1, m.reloads)
  end)

  it("hot-reloads a changed recipe (hot settings and rewards) and keeps it when the new one fails", function()
    local dir = setup()
    local recipe_mod = require("remax.settings.recipe")
    local function recipe_text(lr, value)
      return ([[
local s = dofile(%q)
s.learning_rate = %s
s.rewards = { { name = "const", fn = function(c) local r = {} for i = 1, #c do r[i] = %s end return r end } }
return s
]]):format(dir .. "/settings.lua", lr, value)
    end
    local base = settings(dir, { max_steps = 4 })
    base.model_config = nil
    local lines = { "return {" }
    for k, v in pairs(base) do
      if type(v) ~= "table" then lines[#lines + 1] = ("  %s = %s,"):format(k, type(v) == "string" and ("%q"):format(v) or tostring(v)) end
    end
    lines[#lines + 1] = "  model_config = { hidden_size = 16, intermediate_size = 32, num_hidden_layers = 1, num_attention_heads = 2, max_position_embeddings = 128 },"
    lines[#lines + 1] = "}"
    write(dir .. "/settings.lua", table.concat(lines, "\n"))
    local path = dir .. "/recipe.lua"
    write(path, recipe_text("1e-3", "0.25"))
    local cfg = config.resolve(recipe_mod.load(path), {})
    local t = trainer.new(cfg, { quiet = true, signals = false, recipe_path = path })
    assert.are.equal(0.25, t:train_step().reward)
    write(path, recipe_text("2e-3", "0.75"))
    assert.are.equal(1, t:check_reload())
    assert.are.equal(2e-3, t.cfg.learning_rate)
    local m = t:train_step()
    assert.are.equal(0.75, m.reward)
    assert.are.same({ path }, m.reloaded)
    write(path, "return { learning_rate = 1e-3,, }")
    assert.are.equal(0, t:check_reload())
    assert.are.equal(0.75, t:train_step().reward)
  end)

  it("saves a checkpoint and stops cleanly on Ctrl-C", function()
    local dir = setup()
    local t = new_trainer(dir, { max_steps = 50, rewards = { support.interrupting_reward() } })
    t.opts.signals = true
    local out = t:train()
    assert.is_true(out.interrupted)
    assert.are.equal(2, out.step)
    local _, step = t.run:latest_checkpoint()
    assert.are.equal(2, step)
  end)

  it("skips non-finite updates, counts them, and stops after max_bad_steps", function()
    local dir = setup()
    local t = new_trainer(dir, { max_steps = 5, max_bad_steps = 1 })
    -- a custom advantage that is huge makes the loss overflow to inf
    t.cfg.advantage = function(groups)
      local adv = {}
      for i, g in ipairs(groups) do
        adv[i] = {}
        for j = 1, #g.samples do adv[i][j] = 1e308 * (j % 2 == 0 and 10 or -10) end
      end
      return adv
    end
    local m = t:train_step()
    assert.are.equal(1, m.bad_steps)
    local err = capture_error(t.train_step, t)
    assert.matches("max_bad_steps = 1", err, 1, true)
  end)

  it("runs a recipe file through the CLI and reports bad recipes with file:line", function()
    local dir = setup()
    local s = settings(dir, { max_steps = 2 })
    local parts = {}
    for k, v in pairs(s) do
      if k ~= "model_config" and k ~= "rewards" then
        parts[#parts + 1] = ("%s = %s,"):format(k, type(v) == "string" and ("%q"):format(v) or tostring(v))
      end
    end
    local body = table.concat(parts, "\n")
    write(dir .. "/ok.lua", ("return {\n%s\nrewards = { %q },\nmodel_config = { hidden_size = 16, intermediate_size = 32, num_hidden_layers = 1, num_attention_heads = 2, max_position_embeddings = 128 },\n}\n"):format(body, dir .. "/lower.lua"))
    local real_print = print
    _G.print = function() end
    local ok, rc = pcall(cli.run, dir .. "/ok.lua", "--max_steps", "1", "--seed", "3")
    _G.print = real_print
    assert.is_true(ok, tostring(rc))
    assert.are.equal(0, rc)

    write(dir .. "/syntax.lua", "return {\n  learning_rate = 1e-5\n  beta = 0.1,\n}\n")
    local err = capture_error(cli.run, dir .. "/syntax.lua")
    assert.matches("syntax.lua:3:", err, 1, true)

    write(dir .. "/typo.lua", "return { learning_rat = 1e-5 }\n")
    err = capture_error(cli.run, dir .. "/typo.lua")
    assert.matches("unknown setting 'learning_rat'; did you mean 'learning_rate'", err, 1, true)
    assert.matches("typo.lua", err, 1, true)

    err = capture_error(cli.run, dir .. "/ok.lua", "--beta", "lots")
    assert.matches("--beta 'lots': expected a number", err, 1, true)
  end)
end)
