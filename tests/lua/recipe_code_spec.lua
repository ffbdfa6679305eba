-- recipe_code_spec: a recipe's Lua code cannot hold, end or silently corrupt a run (issue 45,
-- families 2, 3 and 4). Every Lua callback -- a reward, a tool, an environment's factory, reset
-- and step, a recipe's tool-call parser -- runs under remax.step.guard: its time limit holds even
-- when it catches every error (a retry loop around pcall), and Ctrl-C or SIGTERM stops it, the
-- run then saving its last finished step. What a recipe hands back is checked before it is used
-- (a parser's odd calls, a tool's schema), and an environment's rewards must be finite, or the
-- run stops naming the environment, the episode and the turn.
local ffi = require("ffi")
local remax = require("remax")
local support = require("support")
local guard = require("remax.step.guard")
local tools = require("remax.step.tools")
local tool_calls = require("remax.step.tool_calls")
local environment = require("remax.step.environment")
local episodes = require("remax.step.episodes")
local rollout = require("remax.step.rollout")
local rewards = require("remax.step.rewards")
local tokenizer = require("remax.bind.tokenizer")
local config = require("remax.settings.config")
local trainer = require("remax.run.run")
local clock = require("remax.bind.clock").now

pcall(ffi.cdef, "int raise(int sig);")

-- Catches every error and tries again, forever: the retry loop a tool author writes.
local function retry_forever()
  while true do
    pcall(function() local s = 0 for i = 1, 1e12 do s = s + i % 3 end end)
  end
end

-- Runs f with a signal standing in as pending (guard.signal_pending), as after Ctrl-C or SIGTERM.
local function with_signal(f)
  local real = guard.signal_pending
  guard.signal_pending = function() return true end
  local ok, err = pcall(f)
  guard.signal_pending = real
  return ok, err
end

-- The state a guarded call must leave: the JIT on, no hook, Lua's own pcall, os.exit as it was.
local function assert_restored()
  assert.is_true((jit.status()))
  assert.is_nil(debug.gethook())
  local ok, e = pcall(error, "x", 0)
  assert.are.same({ false, "x" }, { ok, e })
  assert.are.equal(guard.real_exit, os.exit)
end

---------------------------------------------------------------------------- family 2: time limits

describe("a Lua tool", function()
  it("that catches every error in a retry loop still stops at tool_timeout", function()
    local t = tools.check({ stubborn = { fn = retry_forever } })
    local t0 = clock()
    local result, ok, _, kind = tools.call(t, { name = "stubborn", arguments = {} }, 0.3)
    assert.is_true(clock() - t0 < 10)
    assert.are.same({ "Error: tool 'stubborn' timed out after 0.3 s", false, "timeout" }, { result, ok, kind })
    assert_restored()
  end)

  it("that returns after its limit (a blocking C call) is a timeout too", function()
    local t = tools.check({ sleeper = { fn = function() os.execute("sleep 0.4") return "late" end } })
    local result, ok, _, kind = tools.call(t, { name = "sleeper", arguments = {} }, 0.1)
    assert.are.same({ "Error: tool 'sleeper' timed out after 0.1 s", false, "timeout" }, { result, ok, kind })
  end)

  it("that calls os.exit gets an error result naming it, and the process goes on", function()
    local t = tools.check({ quitter = { fn = function() os.exit(3) end } })
    local result, ok, _, kind = tools.call(t, { name = "quitter", arguments = {} }, 1)
    assert.is_false(ok)
    assert.are.equal("error", kind)
    assert.matches("called os.exit(3) in the tool 'quitter': remax does not let recipe code end the process", result, 1, true)
    assert_restored()
  end)

  it("that runs when Ctrl-C or SIGTERM comes is stopped, and the stop reaches the caller (not the episode)", function()
    local t = tools.check({ stubborn = { fn = retry_forever } })
    local t0 = clock()
    local ok, err = with_signal(function() tools.call(t, { name = "stubborn", arguments = {} }, 0) end)
    assert.is_false(ok)
    assert.is_true(guard.is_interrupt(err), tostring(err))
    assert.matches("interrupted (Ctrl-C or SIGTERM) while the tool 'stubborn' ran", tostring(err), 1, true)
    assert.is_true(clock() - t0 < 10)
    assert_restored()
  end)
end)

describe("a Lua environment", function()
  local desc = environment.check({
    reset = function() retry_forever() end,
    step = function() while true do end end,
  })
  local env = environment.instance(desc, { prompt = "x" })   -- the episode's (here: the one table)

  it("whose step loops ends its episode at tool_timeout, with the reason", function()
    local msgs, done, reward, err = environment.step(env, {}, "hi", nil, 0.2)
    assert.are.same({ nil, true, nil }, { msgs, done, reward })
    assert.are.equal("environment step failed: took over tool_timeout = 0.2 s", err)
  end)

  it("whose reset loops inside pcall fails at tool_timeout", function()
    local msgs, err = environment.reset(desc, env, { prompt = "x" }, {}, 0.2)
    assert.is_nil(msgs)
    assert.are.equal("environment reset failed: took over tool_timeout = 0.2 s", err)
  end)

  it("whose factory loops fails at tool_timeout", function()
    local inst, err = environment.instance(environment.check(function() while true do end end), { prompt = "x" }, 0.2)
    assert.is_nil(inst)
    assert.are.equal("the environment factory failed: took over tool_timeout = 0.2 s", err)
  end)

  it("is stopped by Ctrl-C or SIGTERM even without a limit", function()
    local ok, err = with_signal(function() environment.step(env, {}, "hi", nil, 0) end)
    assert.is_false(ok)
    assert.matches("while the environment's step ran", tostring(err), 1, true)
    ok, err = with_signal(function() environment.reset(desc, env, { prompt = "x" }, {}, 0) end)
    assert.is_false(ok)
    assert.matches("while the environment's reset ran", tostring(err), 1, true)
    assert_restored()
  end)
end)

describe("a recipe's tool-call parser", function()
  it("that loops fails that turn's call at tool_timeout", function()
    local calls = tool_calls.parse("text", function() retry_forever() end, 0.2)
    assert.are.same({ { error = "the tool call parser took over tool_timeout = 0.2 s", raw = "text" } }, calls)
  end)

  it("is stopped by Ctrl-C or SIGTERM", function()
    local ok, err = with_signal(function() tool_calls.parse("text", function() while true do end end, 0) end)
    assert.is_false(ok)
    assert.matches("while the tool call parser ran", tostring(err), 1, true)
  end)
end)

describe("a reward", function()
  it("is stopped by Ctrl-C or SIGTERM even with reward_timeout = 0", function()
    local r = rewards.normalize({ name = "spin", fn = retry_forever }, 1)
    local ok, err = with_signal(function() rewards.run_one(r, { "a" }, {}, { timeout = 0 }) end)
    assert.is_false(ok)
    assert.matches("while the reward 'spin' ran", tostring(err), 1, true)
    assert_restored()
  end)

  it("that returns within a second of the signal lets the step finish", function()
    local r = rewards.normalize({ name = "quick", fn = function(c) return { 1 } end }, 1)
    local ok, scores = with_signal(function() return rewards.run_one(r, { "a" }, {}, { timeout = 0 }) end)
    assert.is_true(ok)
    assert.are.same({ 1 }, scores)
  end)
end)

describe("SIGTERM during a step whose reward never returns (reward_timeout = 0)", function()
  it("saves the last finished step, with the data position of the unfinished one's start, and stops", function()
    local dir = support.train_dir(16, { reward_file = "stuck.lua", reward = [[
local ffi = require("ffi")
pcall(ffi.cdef, "int raise(int sig);")
local calls = 0
return { name = "stuck", fn = function(c)
  calls = calls + 1
  if calls == 3 then ffi.C.raise(15); while true do pcall(function() while true do end end) end end
  local s = {}
  for i = 1, #c do s[i] = #c[i] % 2 end
  return s
end }
]] })
    local s = support.run_settings(dir, { model_config = support.tiny_model({ num_hidden_layers = 1 }), num_generations = 2,
      max_completion_length = 4, per_device_train_batch_size = 2, learning_rate = 1e-3, max_steps = 5, seed = 3,
      reward_timeout = 0, rewards = { dir .. "/stuck.lua" }, dtype = "f32" })
    local t = trainer.new(config.resolve(s), { quiet = true })
    local after_step1
    local real = t.finish_step
    t.finish_step = function(self, m, ro)
      real(self, m, ro)
      after_step1 = after_step1 or self.sampler:state()
    end
    local t0 = clock()
    local out = t:train()
    assert.is_true(clock() - t0 < 60)
    assert.is_true(out.interrupted)
    assert.are.equal(1, out.step)
    local state = t.run:load_checkpoint(select(1, t.run:latest_checkpoint()))
    assert.are.equal(1, state.step)
    assert.are.same(after_step1, state.sampler)   -- a resume draws step 2's prompts again
    t.run:close()
  end)
end)

---------------------------------------------------------------------------- family 3: what a recipe hands back

describe("a recipe parser's odd output", function()
  local t = tools.check({
    calc = { parameters = { type = "object", properties = { x = { type = "number" } }, required = { "x" } },
      fn = function(a) return a.x * 2 end },
  })
  local function results(parser)
    local out = {}
    for _, c in ipairs(tool_calls.parse("the text", parser, 1)) do
      local r, ok, _, kind = tools.call(t, c, 1)
      out[#out + 1] = { r, ok, kind }
    end
    return out
  end
  local cyclic = {}
  cyclic.self = cyclic

  it("becomes that call's error result, never a stopped run", function()
    local cases = {
      { function() return { 5 } end,
        "Error: the tool call parser's call 1 is a number (5); expected {name =, arguments =} or {error =}" },
      { function() return { { name = "calc", arguments = 5 } } end,
        "Error: malformed tool call to 'calc': arguments must be a JSON object, got a number" },
      { function() return { { name = "calc", arguments = "x = 2" } } end,
        "Error: malformed tool call to 'calc': its arguments are not a JSON object" },
      { function() return { { error = {} } } end,
        "Error: the tool call parser's call 1 has error = a table; expected the error's text" },
      { function() return { { name = 7 } } end,
        "Error: the tool call parser's call 1 has a number as its name; expected the tool's name (a non-empty string)" },
      { function() return { { name = "calc", arguments = { x = cyclic } } } end,
        "Error: malformed tool call to 'calc': its arguments cannot be written as JSON" },
      { function() return { bad = 1 } end,
        "Error: the tool call parser returned a table with the key bad; expected a list of calls" },
    }
    for _, c in ipairs(cases) do
      local r = results(c[1])
      assert.are.equal(1, #r)
      assert.is_false(r[1][2])
      assert.are.equal(c[2], r[1][1]:sub(1, #c[2]))
      assert.are.equal("malformed", r[1][3])
    end
  end)

  it("decodes arguments written as JSON text, as the built-in formats do", function()
    assert.are.same({ { "6", true, "ok" } }, results(function() return { { name = "calc", arguments = '{"x": 3}' } } end))
    assert.are.same({ { "8", true, "ok" } }, results(function() return { name = "calc", arguments = { x = 4 } } end))
  end)

  it("in an episode counts as a malformed call and the rollout goes on", function()
    local tok = tokenizer.load("tests/fixtures/byte_tokenizer")
    local m = remax.model.new(support.tiny_model({ vocab_size = 260, hidden_size = 16, intermediate_size = 24,
      tie_word_embeddings = false }), { seed = 11, init_std = 0.3 })
    local STOP = { 258 }
    for id = 100, 129 do STOP[#STOP + 1] = id end
    local step = { cfg = { max_completion_length = 20, max_prompt_length = 64, max_turns = 3, max_episode_length = 400,
      tool_timeout = 1, sampling = rollout.plan(2, true, 1.0), tools = { calc = { fn = function() return 1 end } },
      tool_call_format = function() return { 5 } end },
      model = m, tok = tok, stop = STOP, template = { template = support.chatml_tools }, template_name = "recipe function",
      seed_for = function(_, n) return 1000 + n end, progress = function() end }
    local ro = episodes.rollout(step, { { prompt = "hello" } }, { step = 1 })
    local malformed = 0
    for _, r in ipairs(ro.rows) do malformed = malformed + ((r.episode.errors or {}).malformed or 0) end
    assert.is_true(malformed > 0)
  end)
end)

describe("a tool's schema", function()
  local function refusal(params)
    local ok, err = pcall(tools.check, { calc = { fn = print, parameters = params } })
    assert.is_false(ok)
    return err
  end
  it("is refused at start-up, naming the tool and the key, not as an internal error", function()
    assert.are.equal("tools.calc.parameters.required must be a list of property names, such as { \"x\" }, got the string 'x'",
      refusal({ type = "object", properties = { x = { type = "number" } }, required = "x" }))
    assert.are.equal("tools.calc.parameters.properties must be a table of name -> schema, got a string",
      refusal({ type = "object", properties = "x" }))
    assert.are.equal("tools.calc.parameters.properties.x.enum must be a list of the allowed values, got a string",
      refusal({ type = "object", properties = { x = { type = "string", enum = "ab" } } }))
    assert.are.equal("tools.calc.parameters.required[1] = 3 is not one of its properties",
      refusal({ type = "object", properties = { x = { type = "number" } }, required = { 3 } }))
  end)
end)

---------------------------------------------------------------------------- family 4: environment rewards

describe("an environment's rewards", function()
  local tok = tokenizer.load("tests/fixtures/byte_tokenizer")
  local m = remax.model.new(support.tiny_model({ vocab_size = 260, hidden_size = 16, intermediate_size = 24,
    tie_word_embeddings = false }), { seed = 11, init_std = 0.3 })
  local STOP = { 258 }
  for id = 100, 129 do STOP[#STOP + 1] = id end
  local function step_with(env)
    local failed
    local step = { cfg = { max_completion_length = 20, max_prompt_length = 64, max_turns = 3, max_episode_length = 400,
      tool_timeout = 1, sampling = rollout.plan(2, true, 1.0), environment = env },
      model = m, tok = tok, stop = STOP, template = { template = support.chatml_tools }, template_name = "recipe function",
      seed_for = function(_, n) return 1000 + n end, progress = function() end,
      failed = function(_, why) failed = why end }
    local ok, err = pcall(episodes.rollout, step, { { prompt = "hello" } }, { step = 4 })
    return ok, err, failed
  end

  it("are refused when NaN, naming the environment, the episode and the turn, after the checkpoint", function()
    local env = { step = function() return "more", false, 0 / 0 end }
    local line = debug.getinfo(env.step, "S").linedefined
    local ok, err, failed = step_with(env)
    assert.is_false(ok)
    assert.matches(("^environment %%(tests/lua/recipe_code_spec.lua:%d%%) returned the reward %%-?nan at turn 1 of episode 1 " ..
      "%%(prompt 1, sample 1%%) at step 4; an environment's reward must be a finite number"):format(line), err)
    assert.are.equal(err, failed)
  end)

  it("are refused when infinite", function()
    local ok, err = step_with({ step = function() return "more", false, -math.huge end })
    assert.is_false(ok)
    assert.matches("returned the reward -inf at turn 1 of episode 1", err, 1, true)
  end)

  it("are refused when their sum over the turns is infinite", function()
    local ok, err = step_with({ step = function() return "more", false, 1e308 end })
    assert.is_false(ok)
    assert.matches("the rewards of episode 1 (prompt 1, sample 1) sum to inf at turn 2 (1e+308 so far + 1e+308) at step 4",
      err, 1, true)
  end)
end)
