-- function_identity_spec: a recipe's functions are compared by what they are, not by file:line
-- (issue 45, family 6). Ranks with different copies of a reward or data function at one path are
-- refused before the first step, and a hot reload of an edited tool puts the new tool in force
-- and says so; an edit that changes no code (a comment, lines moved) changes nothing.
local agree = require("remax.run.agree")
local config = require("remax.settings.config")
local trainer = require("remax.run.run")
local recipe_mod = require("remax.settings.recipe")
local episodes = require("remax.step.episodes")
local support = require("support")
local write = support.write

-- A function from Lua text, as if read from the file `path` (the same file:line for all).
local function from(text, path)
  return assert(load(text, "@" .. (path or "rewards/same.lua")))()
end

-- Rank 0 and rank 1 of a job, in one process: each call of fn(world) describes one rank; the
-- gather hands rank 0 both ranks' items, as remax.bind.dist's would. Returns agree's error or nil.
local function two_ranks(fn0, fn1)
  local items = {}
  local capture = { size = 2, is_root = false, gather = function(_, it) items[#items + 1] = it; return nil end,
    broadcast = function() return false end }
  fn1(capture)
  local rank1 = items[1]
  local world = { size = 2, is_root = true, gather = function(_, it) return { it, rank1 } end,
    broadcast = function(_, v) return v end }
  local ok, err = pcall(fn0, world)
  return not ok and err or nil
end

describe("a function's identity", function()
  it("is its code: the same code at the same place agrees, other code at the same file:line differs", function()
    local a = from("return function(c) return { #c } end")
    local a2 = from("return function(c) return { #c } end")
    local b = from("return function(c) return { #c + 1 } end")
    assert.are.equal(agree.identity(a), agree.identity(a2))
    assert.are_not.equal(agree.identity(a), agree.identity(b))
    assert.matches("^function %(rewards/same.lua:1, code %x+%)$", agree.identity(a))
  end)

  it("takes in the helpers it calls", function()
    local a = from("local function h(x) return x end return function(c) return h(c) end")
    local b = from("local function h(x) return x * 2 end return function(c) return h(c) end")
    assert.are_not.equal(agree.show(a), agree.show(b))
  end)

  it("holds for a table that contains itself", function()
    local t = { fn = from("return function() end") }
    t.self = t
    assert.matches('"self"={...}', agree.show(t), 1, true)
  end)
end)

describe("ranks with different copies of a function at one path", function()
  it("are refused for a reward loaded from a file, naming the reward and both codes", function()
    local r0 = { name = "lower", fn = from("return function(c) return { 0 } end", "rewards/lower.lua") }
    local r1 = { name = "lower", fn = from("return function(c) return { 1 } end", "rewards/lower.lua") }
    local err = two_ranks(function(w) agree.rewards(w, { r0 }) end, function(w) agree.rewards(w, { r1 }) end)
    assert.is_truthy(err, "no refusal")
    assert.matches("the ranks disagree on their reward functions before the first step", err, 1, true)
    assert.matches("  reward 1 'lower': rank 0 has function %(rewards/lower.lua:1, code %x+%), rank 1 has function " ..
      "%(rewards/lower.lua:1, code %x+%)", err)
    assert.is_nil(two_ranks(function(w) agree.rewards(w, { r0 }) end, function(w) agree.rewards(w, { r0 }) end))
  end)

  it("are refused for a data function in the settings", function()
    local d0 = from("return function(split, n) return { { prompt = 'a' } } end", "recipes/data.lua")
    local d1 = from("return function(split, n) return { { prompt = 'b' } } end", "recipes/data.lua")
    local c0 = config.resolve({ data = d0, rewards = { "length" } })
    local c1 = config.resolve({ data = d1, rewards = { "length" } })
    local err = two_ranks(function(w) agree.settings(w, c0) end, function(w) agree.settings(w, c1) end)
    assert.is_truthy(err, "no refusal")
    assert.matches("  data: rank 0 has function (recipes/data.lua:1, code ", err, 1, true)
  end)
end)

local skip = support.mpi_missing()
local describe_mpi = skip and pending or describe

describe_mpi("two ranks on machines whose reward files differ (mpirun, a folder each)", function()
  it("stop before the first step, naming the reward", function()
    local dirs = {}
    for rank = 0, 1 do
      local d = support.tmpdir()
      dirs[rank] = d
      os.execute("mkdir -p '" .. d .. "/rewards'")
      write(d .. "/rewards/mine.lua", ("return { name = 'mine', fn = function(c) local s = {} for i = 1, #c do s[i] = %d end return s end }")
        :format(rank))
      support.prompts(d .. "/p.jsonl", 8)
      write(d .. "/r.lua", [[
return {
  model_config = { architectures = { "Qwen2ForCausalLM" }, hidden_size = 16, intermediate_size = 32,
    num_hidden_layers = 1, num_attention_heads = 2, num_key_value_heads = 1, max_position_embeddings = 128,
    rope_theta = 10000, rms_norm_eps = 1e-6, tie_word_embeddings = true },
  data = "p.jsonl", rewards = { "rewards/mine.lua" }, chat_template = "plain", hot_reload = false,
  num_generations = 2, max_completion_length = 4, max_steps = 1, eval_size = 0, save_steps = 0,
  log_completions = 0, seed = 7, output_dir = "runs", run_name = "x", dtype = "f32", per_device_train_batch_size = 2,
}
]])
    end
    local b = require("remax.cli.main").build_dir()
    if b:sub(1, 1) ~= "/" then b = os.getenv("PWD") .. "/" .. b end   -- each rank starts in its own folder
    local cmd = ("OMP_NUM_THREADS=1 OMPI_MCA_btl_vader_single_copy_mechanism=none timeout -s KILL 120 mpirun --allow-run-as-root " ..
      "--oversubscribe -x OMP_NUM_THREADS -np 1 -wdir %s %s/remax run r.lua : -np 1 -wdir %s %s/remax run r.lua 2>&1; echo rc=$?")
      :format(dirs[0], b, dirs[1], b)
    local p = assert(io.popen(cmd))
    local out = p:read("*a")
    p:close()
    assert.are_not.equal("0", out:match("rc=(%d+)%s*$"), out)
    assert.matches("the ranks disagree on their reward functions before the first step", out, 1, true)
    assert.matches("reward 1 'mine': rank 0 has function (rewards/mine.lua:1, code", out, 1, true)
    assert.is_nil(support.try_read(dirs[0] .. "/runs/x/metrics.jsonl"))
  end)
end)

describe("hot reload of a recipe's tool", function()
  local function recipe(dir, tool_body)
    write(dir .. "/recipe.lua", ([[
return {
  model_config = { architectures = { "Qwen2ForCausalLM" }, hidden_size = 16, intermediate_size = 24, num_hidden_layers = 1,
    num_attention_heads = 2, num_key_value_heads = 1, max_position_embeddings = 256, tie_word_embeddings = true },
  -- a template of the recipe's own (one with no tools section is refused beside tools)
  chat_template = function(messages)
    local t = {}
    for _, m in ipairs(messages) do t[#t + 1] = m.role .. ": " .. tostring(m.content or "") .. "\n" end
    return table.concat(t) .. "assistant: "
  end,
  data = %q, eval_size = 0, output_dir = %q, run_name = "hot",
  rewards = { function(c) local s = {} for i = 1, #c do s[i] = 0 end return s end },
  tools = { answer = { description = "the answer", fn = function(args)
%s
  end } },
  stop_strings = { "a", "e", "o" }, max_completion_length = 6, num_generations = 2, per_device_train_batch_size = 2,
  max_steps = 4, save_steps = 0, log_completions = 0, hot_reload = true, dtype = "f32",
}
]]):format(dir .. "/p.jsonl", dir .. "/runs", tool_body))
    return dir .. "/recipe.lua"
  end

  it("puts the edited tool in force and says so; an edit of its comments changes nothing", function()
    local dir = support.train_dir(8)
    local path = recipe(dir, "    return 'one'")
    local t = trainer.new(config.resolve(recipe_mod.load(path), {}), { quiet = true, signals = false, recipe_path = path,
      overrides = {} })
    t.said = {}
    t.say = function(self, text) self.said[#self.said + 1] = text end
    t:train_step()
    local function tool_says() return t.stepper.policy:episode_setup().tools.answer.fn({}) end
    assert.are.equal("one", tool_says())

    -- the same code, another comment and a blank line: the recipe reloads, nothing changed
    recipe(dir, "    -- a comment\n\n    return 'one'")
    assert.are.equal(1, t:check_reload())
    assert.matches("hot reload: " .. path .. " reloaded (reload 1); no setting changed", table.concat(t.said, "\n"), 1, true)

    recipe(dir, "    return 'two'")
    assert.are.equal(1, t:check_reload())
    assert.matches("hot reload: " .. path .. " reloaded (reload 2); tools: its code changed", table.concat(t.said, "\n"), 1, true)
    t:train_step()
    assert.are.equal("two", tool_says())
    t.run:close()
  end)
end)
