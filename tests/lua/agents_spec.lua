-- agents_spec: what a TRL user's agent script needs of remax's episodes (issue 44): every
-- episode of a prompt starting from the same state (the prompt's seed, a stop when they
-- differ, completions.jsonl and index.html showing what the model saw), distinct samples for
-- repeated prompts that do not depend on the batch, the max_episode_length default, failing
-- episodes said on the progress line (or a stop with strict_episodes), `remax render`, and
-- TRL's names: max_tool_calling_iterations, num_turns_*, tools/call_frequency,
-- tools/failure_frequency, completion lengths of the model's tokens, reward/environment.
local remax = require("remax")
local support = require("support")
local chat = require("remax.text.chat")
local episodes = require("remax.step.episodes")
local tools = require("remax.step.tools")
local rollout = require("remax.step.rollout")
local step_mod = require("remax.step.step")
local config = require("remax.settings.config")
local report = require("remax.run.report")
local progress = require("remax.run.progress")
local tokenizer = require("remax.bind.tokenizer")
local dist = require("remax.bind.dist")
local cjson = require("cjson")
local write = support.write

local tok = tokenizer.load("tests/fixtures/byte_tokenizer")
local STOP = { 258 }
for id = 100, 129 do STOP[#STOP + 1] = id end   -- turns end within a few tokens on a random model

local function tiny(seed, positions)
  return remax.model.new(support.tiny_model({ vocab_size = 260, hidden_size = 16, intermediate_size = 24,
    max_position_embeddings = positions or 256, tie_word_embeddings = false }), { seed = seed or 11, init_std = 0.3 })
end

-- A Step (remax.step.step) over a tiny model and the byte tokenizer, with a resolved config:
-- settings over a small episode run's.
local function make_step(settings, model, hooks)
  local s = { chat_template = "chatml", rewards = {}, num_generations = 2, max_completion_length = 20,
    max_prompt_length = 64, max_turns = 3, tool_timeout = 2, seed = 5, per_device_train_batch_size = 2,
    learning_rate = 1e-3, max_steps = 2 }
  for k, v in pairs(settings or {}) do s[k] = v end
  if not s.environment then s.rewards = { function(c) local z = {} for i = 1, #c do z[i] = 0 end return z end } end
  local cfg = config.resolve(s, {}, { running = true })
  model = model or tiny()
  local fn = type(s.chat_template) == "function" and s.chat_template or nil
  return step_mod.new({ model = model, tok = tok, stop = STOP, template = { template = fn or "chatml" },
    template_name = fn and "recipe function" or "chatml", rewards = {}, world = dist.world(),
    opt = require("remax.bind.optim").adamw(model, { lr = 1e-3 }) }, cfg, hooks)
end

local function rows_tokens(ro, from, to)
  local out = {}
  for k = from, to do out[#out + 1] = ro.rows[k].tokens end
  return out
end

---------------------------------------------------------------------------- 1a: the same start

-- "Say the digit N.": a game whose secret comes from the prompt's seed.
local seeded_game = {
  reset = function(_, state)
    state.secret = state.seed % 10
    return "Say the digit " .. state.secret .. "."
  end,
  step = function(state, text)
    if text:find(tostring(state.secret), 1, true) then return "Right.", true, 1 end
    return "No.", false, 0
  end,
}

describe("a prompt's episodes", function()
  it("start from the same state: every environment is reset with the prompt's seed (state.seed)", function()
    local seeds = {}
    local game = { step = seeded_game.step, reset = function(sample, state)
      seeds[#seeds + 1] = state.seed
      return seeded_game.reset(sample, state)
    end }
    local step = make_step({ environment = game, stop_strings = { "0", "1", "2", "3", "4", "5", "6", "7", "8", "9" } })
    local prompts = { { prompt = "DATASET-PROMPT" }, { prompt = "DATASET-PROMPT" }, { prompt = "DATASET-PROMPT" } }
    local ro = step:rollout(prompts, { step = 1 })
    assert.are.equal(9, #seeds)   -- 3 prompts x (2 samples + the greedy episode)
    local per_prompt = {}
    for i = 1, 3 do
      for s = 1, 3 do assert.are.equal(seeds[(i - 1) * 3 + 1], seeds[(i - 1) * 3 + s]) end
      per_prompt[seeds[(i - 1) * 3 + 1]] = true
      local first = ro.prompt_messages[i]
      for s = 1, 3 do
        local r = ro.rows[ro:index(i, s)]
        -- what the model saw is the reset's message; the episode's messages continue from it
        assert.are.same({ { role = "user", content = "Say the digit " .. (seeds[(i - 1) * 3 + 1] % 10) .. "." } }, first)
        assert.are.equal("assistant", r.completion_messages[1].role)
      end
    end
    local n = 0
    for _ in pairs(per_prompt) do n = n + 1 end
    assert.are.equal(3, n)   -- each place in the step has its own seed
    -- the same step and places: the same seeds (a resumed run plays the same games)
    local again = {}
    game.reset = function(sample, state) again[#again + 1] = state.seed return seeded_game.reset(sample, state) end
    step:rollout(prompts, { step = 1 })
    assert.are.same(seeds, again)
  end)

  it("stop, saying why, when their first messages differ", function()
    local n = 0
    local game = { step = seeded_game.step, reset = function() n = n + 1 return "Say the digit " .. (n % 10) .. "." end }
    local step = make_step({ environment = game })
    local err = support.error_of(function() step:rollout({ { prompt = "p" } }, { step = 1 }) end)
    assert.matches("the episodes of prompt 1 start from different first messages", err, 1, true)
    assert.matches('episode 1 was shown [{"content":"Say the digit 1.","role":"user"}], episode 2 [{"content":"Say the digit 2.","role":"user"}]', err, 1, true)
    assert.matches("ReMax's advantage is a sample's reward minus the greedy episode's", err, 1, true)
    assert.matches("GRPO compares a prompt's episodes with each other", err, 1, true)
    assert.matches("state.seed", err, 1, true)
  end)

  it("show what the model saw in completions.jsonl and index.html, not the dataset's prompt", function()
    local step = make_step({ environment = seeded_game })
    local ro = step:rollout({ { prompt = "DATASET-PROMPT" } }, { step = 1 })
    ro.per, ro.total = {}, { 0, 0, 0 }
    local recs = step:completion_records(ro)
    local secret = rollout.prompt_seed(step.policy:seed_for(1), 1) % 10
    local want = { { role = "user", content = "Say the digit " .. secret .. "." } }
    for _, rec in ipairs(recs) do assert.are.same(want, rec.prompt) end
    local d = support.tmpdir()
    local lines = {}
    for i, rec in ipairs(recs) do rec.step = 1; lines[i] = cjson.encode(rec) end
    write(d .. "/completions.jsonl", table.concat(lines, "\n") .. "\n")
    local html = report.episodes_html(d .. "/completions.jsonl", function(s) return s end)
    assert.matches("Say the digit " .. secret .. ".", html, 1, true)
    assert.is_nil(html:find("DATASET-PROMPT", 1, true))
  end)

  describe("with a Python environment", function()
    if not support.has_python() then
      pending("python3 is not installed")
      return
    end
    local d = support.tmpdir()
    write(d .. "/games.py", [[
import random
class Seeded:
    def reset(self, prompt, seed):
        self.secret = random.Random(seed).randint(0, 9)
        return "Say the digit %d." % self.secret
    def step(self, text):
        return ("Right." if str(self.secret) in text else "No."), str(self.secret) in text, 1.0 if str(self.secret) in text else 0.0
class Unseeded:
    def reset(self, **kwargs):
        self.secret = random.randint(0, 10 ** 9)
        return "Say the number %d." % self.secret
    def step(self, text):
        return "No.", True, 0.0
]])
    it("pass the prompt's seed to a reset that takes `seed`, so that a random reset repeats within a prompt", function()
      local step = make_step({ environment = "py:" .. d .. "/games.py:Seeded" })
      finally(function() step.policy:episode_setup().registry:close() end)
      local ro = step:rollout({ { prompt = "p" }, { prompt = "p" } }, { step = 3 })
      for i = 1, 2 do
        local msg = ro.prompt_messages[i][1].content
        assert.matches("^Say the digit %d%.$", msg)
        for s = 1, 3 do
          assert.are.equal(ro.rows[ro:index(i, s)].messages[1].content, msg)
        end
      end
    end)
    it("stop a step whose Python reset draws at random without the seed", function()
      local step = make_step({ environment = "py:" .. d .. "/games.py:Unseeded" })
      finally(function() step.policy:episode_setup().registry:close() end)
      local err = support.error_of(function() step:rollout({ { prompt = "p" } }, { step = 1 }) end)
      assert.matches("the episodes of prompt 1 start from different first messages", err, 1, true)
      assert.matches("a Python reset that takes a `seed` argument gets it", err, 1, true)
    end)
  end)
end)

---------------------------------------------------------------------------- 1b: distinct samples

describe("repeated prompts", function()
  it("get distinct samples, keyed by their place in the step, whatever else is in the batch", function()
    local step = make_step({})
    local same = { prompt = "What is 2 + 2?" }
    local ro = step:rollout({ same, same, same, same }, { step = 1 })
    local seen, distinct = {}, 0
    for _, r in ipairs(ro.rows) do
      if not r.greedy then
        local key = table.concat(r.tokens, ",")
        if not seen[key] then seen[key], distinct = true, distinct + 1 end
      end
    end
    assert.are.equal(8, distinct)   -- 4 prompts x 2 samples, all different
    -- a row's tokens are those of its place: the same in a batch of its own
    local alone = step:rollout({ same }, { step = 1, first = 3 })
    assert.are.same(rows_tokens(ro, 7, 9), rows_tokens(alone, 1, 3))
    local other = step:rollout({ { prompt = "Something else" }, same }, { step = 1, first = 2 })   -- same at place 3
    assert.are.same(rows_tokens(ro, 7, 9), rows_tokens(other, 4, 6))
    -- another step samples anew; the greedy rows of one prompt are the same everywhere
    local later = step:rollout({ same }, { step = 2, first = 1 })
    assert.are_not.same(ro.rows[1].tokens, later.rows[1].tokens)
    assert.are.same(ro.rows[3].tokens, later.rows[3].tokens)
  end)

  it("get distinct episodes, each the same in any batch", function()
    local game = { step = function(_, text) return "again", false, #text end }
    local step = make_step({ environment = game, stop_strings = { "a", "e", "o" } })
    local same = { prompt = "I am thinking of a digit. Guess it." }
    local ro = step:rollout({ same, same, same }, { step = 1 })
    local firsts, distinct = {}, 0
    for _, r in ipairs(ro.rows) do
      if not r.greedy then
        local t = r.completion_messages[1].content
        if not firsts[t] then firsts[t], distinct = true, distinct + 1 end
      end
    end
    assert.is_true(distinct >= 5, distinct .. " distinct first turns among 6 samples")
    local alone = step:rollout({ same }, { step = 1, first = 2 })
    assert.are.same(rows_tokens(ro, 4, 6), rows_tokens(alone, 1, 3))
    for s = 1, 3 do assert.are.same(ro.rows[3 + s].loss_mask, alone.rows[s].loss_mask) end
  end)
end)

---------------------------------------------------------------------------- 1d: episode length

describe("max_episode_length", function()
  local flood = string.rep("0123456789", 300)   -- 3000 tokens of observation
  local game = { step = function() return flood, false, 0 end }

  it("defaults to the model's positions: an observation that does not fit ends the episode, counted", function()
    local positions = 256
    local step = make_step({ environment = game, stop_strings = { "a", "e", "o" } }, tiny(11, positions))
    local ro = step:rollout({ { prompt = "x" }, { prompt = "y" } }, { step = 1 })
    local truncated = 0
    for i, r in ipairs(ro.rows) do
      local p = ro.prompt_ids[r.prompt]
      assert.is_true(#p + #r.tokens < positions, ("row %d: %d tokens"):format(i, #p + #r.tokens))
      assert.are.equal(0, r.episode.obs_tokens)   -- the flood never fits
      if r.episode.turns >= 1 and #r.turn_ends > 0 then
        assert.is_true(r.episode.truncated, "row " .. i)
        assert.are.equal("length", r.finish)
        truncated = truncated + 1
      end
    end
    assert.is_true(truncated >= 4, truncated .. " episodes reached a turn's end")
    assert.are.equal(truncated, episodes.metrics(ro)["episodes/truncated"])
  end)

  it("ends an episode where the next observation would pass it", function()
    local short = { step = function() return "try again", false, 0 end }
    local limit = 80
    local step = make_step({ environment = short, max_episode_length = limit, max_turns = 20, max_completion_length = 60,
      stop_strings = { "a", "e", "o" } })
    local ro = step:rollout({ { prompt = "x" } }, { step = 1 })
    local truncated = 0
    for _, r in ipairs(ro.rows) do
      -- every observation was appended with room left for another turn: prompt, turns and
      -- observations up to its end stay under the limit
      for t, mk in ipairs(r.loss_mask) do
        if mk == 0 and r.loss_mask[t + 1] ~= 0 then assert.is_true(#ro.prompt_ids[1] + t < limit) end
      end
      if r.episode.truncated then truncated = truncated + 1 end
    end
    assert.is_true(truncated >= 1)
  end)
end)

---------------------------------------------------------------------------- 3: failures that are seen

describe("failing episodes", function()
  local broken = { step = function() error("the game broke", 0) end }

  it("make the step's warning name the most frequent error, and strict_episodes stop the run", function()
    local step = make_step({ environment = broken, stop_strings = { "a", "e", "o" } })
    local ro = step:rollout({ { prompt = "x" }, { prompt = "y" } }, { step = 1 })
    local m = episodes.metrics(ro)
    assert.are.equal(6, m["episodes/failed"])
    assert.are.equal(1, m["episodes/failed_fraction"])
    assert.are.equal("6/6 episodes failed, most often: environment step failed: the game broke", m.warning)
    step:check_episodes(ro)   -- not strict: the step goes on
    local why
    local strict = make_step({ environment = broken, strict_episodes = true }, nil, { on_failure = function(w) why = w end })
    local err = support.error_of(function() strict:check_episodes(ro) end)
    assert.are.equal("strict_episodes: step 1: 6/6 episodes failed, most often: environment step failed: the game broke", err)
    assert.are.equal(err, why)   -- the Run saves the last finished step first
    assert.are.equal(true, config.resolve({}, config.parse_args({ "--strict_episodes", "true" })).strict_episodes)
  end)

  it("count failed tool calls and malformed calls, and warn only above half of the episodes", function()
    local f = episodes.failures({ rows = {
      { episode = { tool_errors = 2, env_errors = 0, error_messages = { ["Error: malformed tool call: not a JSON object"] = 2 } } },
      { episode = { tool_errors = 1, env_errors = 0, error_messages = { ["Error: unknown tool 'x' (available: calc)"] = 1 } } },
      { episode = { tool_errors = 0, env_errors = 0 } },
      { episode = { tool_errors = 0, env_errors = 0 } },
    } })
    assert.are.same({ failed = 2, total = 4, top = "Error: malformed tool call: not a JSON object", top_count = 2 }, f)
    assert.is_nil(episodes.failure_warning(2, 4, f.top))   -- half is not more than half
    assert.are.equal("3/4 episodes failed, most often: x", episodes.failure_warning(3, 4, "x"))
  end)

  it("are said on the progress line, on a terminal and in a log", function()
    local lines = {}
    local out = { write = function(_, ...) for _, s in ipairs({ ... }) do lines[#lines + 1] = s end end, flush = function() end }
    local p = progress.new({ total = 10, label = "agents", out = out, tty = false, clock = function() return 0 end })
    local w = "6/6 episodes failed, most often: environment step failed: the game broke"
    p:update(1, { reward = 0, warning = w })
    assert.matches("warning: " .. w, table.concat(lines), 1, true)
    local narrow = p:format(1, { reward = 0.5, kl = 0.01, loss = 0.2, tokens_per_s = 900, warning = w }, 79)
    assert.is_true(#narrow <= 79, narrow)
    assert.matches("warning: 6/6 episodes failed, most often: ", narrow, 1, true)   -- at least 40 columns for it
  end)

  it("stop a run with --strict_episodes true, and are on its progress line without", function()
    local d = support.tmpdir()
    write(d .. "/broken.lua", [[
return {
  model_config = { architectures = { "Qwen2ForCausalLM" }, hidden_size = 16, intermediate_size = 24, num_hidden_layers = 1,
    num_attention_heads = 2, num_key_value_heads = 1, max_position_embeddings = 256, tie_word_embeddings = true },
  chat_template = "chatml",
  data = function(_, n) local r = {} for i = 1, n do r[i] = { prompt = "guess" } end return r end,
  train_size = 8, eval_size = 0, rewards = {},
  environment = { step = function() error("the game broke", 0) end },
  stop_strings = { "a", "e", "o" }, max_completion_length = 8, num_generations = 2, per_device_train_batch_size = 2,
  max_steps = 2, logging_steps = 5, save_steps = 0, log_completions = 0, hot_reload = false,
}
]])
    local base = ("run %s/broken.lua --output_dir %s/runs"):format(d, d)
    local out, rc = support.run_remax(1, base .. " --run_name soft")
    assert.are.equal(0, rc, out)
    -- logging_steps = 5 and 2 steps: step 1's line is there for its warning
    assert.matches("step 1/2  reward [^\n]*warning: 6/6 episodes failed, most often: environment step failed: the game broke", out)
    out, rc = support.run_remax(1, base .. " --run_name strict --strict_episodes true")
    assert.are_not.equal(0, rc, out)
    assert.matches("strict_episodes: step 1: 6/6 episodes failed, most often: environment step failed: the game broke", out, 1, true)
  end)
end)

---------------------------------------------------------------------------- 4: remax render

describe("remax render", function()
  local function render(args)
    local p = assert(io.popen(("%s render %s 2>/dev/null"):format(support.remax_binary(), args)))
    local out = p:read("*a")
    p:close()
    return out
  end

  it("prints the first prompt exactly as the model sees it", function()
    local want = chat.render({ { role = "user", content = "I am thinking of a digit from 0 to 9. Guess it: answer with one digit." } },
      { template = "chatml", add_generation_prompt = true })
    assert.are.equal(want, render("recipes/guess_number.lua"))
  end)

  it("shows the tools as the chat template lists them, and an environment's first messages", function()
    local d = support.tmpdir()
    local model = d .. "/model"
    os.execute("mkdir -p " .. model)
    for _, f in ipairs({ "tokenizer.json", "tokenizer_config.json" }) do
      write(model .. "/" .. f, support.read("tests/fixtures/byte_tokenizer/" .. f))
    end
    write(model .. "/chat_template.jinja", support.read("tests/fixtures/chat_templates/qwen2.5.jinja"))
    write(model .. "/config.json", cjson.encode(support.tiny_model({ vocab_size = 260 })))
    write(d .. "/agent.lua", ([[
return {
  model = %q, chat_template = "tokenizer", rewards = {}, eval_size = 0, train_size = 4, max_prompt_length = 2048,
  data = function(_, n) local r = {} for i = 1, n do r[i] = { prompt = "row " .. i, secret = i } end return r end,
  tools = { calc = { description = "Evaluate arithmetic", parameters = { type = "object",
    properties = { e = { type = "string", description = "the expression" } }, required = { "e" } }, fn = function() return "1" end } },
  environment = { reset = function(sample, state) return "Find the secret of " .. sample.prompt .. " (seed " .. state.seed .. ")." end,
    step = function() return "no", true, 0 end },
}
]]):format(model))
    local out = render(d .. "/agent.lua --row 3")
    local seed = rollout.prompt_seed(require("remax.step.policy").Policy.seed_for({ cfg = config.resolve({}) }, 1), 1)   -- step 1, place 1
    local t = tokenizer.load(model)
    local schemas = tools.schemas(tools.check({ calc = { description = "Evaluate arithmetic", parameters = { type = "object",
      properties = { e = { type = "string", description = "the expression" } }, required = { "e" } }, fn = function() end } }))
    local want = chat.render({ { role = "user", content = ("Find the secret of row 3 (seed %d)."):format(seed) } },
      { template = "tokenizer", tokenizer = t, add_generation_prompt = true, template_args = { tools = schemas } })
    assert.are.equal(want, out)
    assert.matches('"name": "calc"', out, 1, true)
    assert.matches("<tools>", out, 1, true)
  end)
end)

---------------------------------------------------------------------------- 2f: TRL's names

describe("TRL's names", function()
  it("take max_tool_calling_iterations as max_turns: N rounds of tool calls are N + 1 assistant turns", function()
    local cfg = config.resolve({}, config.parse_args({ "--max_tool_calling_iterations", "2" }))
    assert.are.equal(3, cfg.max_turns)
    assert.is_nil(cfg.max_tool_calling_iterations)
    assert.are.equal(1, config.resolve({ max_tool_calling_iterations = 0 }).max_turns)
    local err = support.error_of(config.resolve, { max_tool_calling_iterations = 2, max_turns = 6 }, {}, { where = "r.lua" })
    assert.matches("r.lua: max_turns and max_tool_calling_iterations are the same setting", err, 1, true)
    assert.matches("TRL has no limit by default, remax's max_turns = 4 allows 3 rounds", config.help(config.resolve({})), 1, true)
  end)

  it("do not run the tool calls of an episode's last turn, as TRL runs none past its iterations", function()
    local calls = 0
    local t = { count = { description = "count", fn = function() calls = calls + 1 return "ok" end } }
    local every_turn_calls = function() return { { name = "count", arguments = {} } } end
    local step = make_step({ tools = t, tool_call_format = every_turn_calls, max_turns = 2, max_completion_length = 40,
      stop_strings = { "a", "e", "o" }, chat_template = support.chatml_tools })
    local ro = step:rollout({ { prompt = "x" }, { prompt = "y" } }, { step = 1 })
    local full = 0
    for _, r in ipairs(ro.rows) do
      assert.is_true(r.episode.turns <= 2)
      if r.episode.turns == 2 then
        full = full + 1
        assert.are.equal(1, r.episode.tool_calls)
      end
    end
    assert.is_true(full >= 3, full .. " episodes reached max_turns")
    assert.are.equal(episodes.metrics(ro)["episodes/tool_calls"], calls)
  end)

  it("compute num_turns, tools/call_frequency and tools/failure_frequency over the sampled episodes as TRL", function()
    local function ep(turns, calls, errors) return { turns = turns, tool_calls = calls, tool_errors = errors, tool_time = 0,
      model_tokens = 0, obs_tokens = 0, env_errors = 0 } end
    local ro = { rows = {
      { episode = ep(3, 2, 1) }, { episode = ep(1, 0, 0) }, { episode = ep(2, 1, 0) },
      { episode = ep(4, 5, 5), greedy = true },   -- TRL has no greedy row: not in its metrics
    } }
    local m = episodes.metrics(ro, true)
    assert.are.equal(2, m.num_turns_mean)
    assert.are.equal(1, m.num_turns_min)
    assert.are.equal(3, m.num_turns_max)
    assert.are.equal(3 / 3, m["tools/call_frequency"])      -- calls per completion
    assert.are.equal(1 / 3, m["tools/failure_frequency"])   -- failed calls per call
    assert.are.equal(8, m["episodes/tool_calls"])           -- remax's own counts: every episode
    assert.are.equal(0, episodes.metrics({ rows = { { episode = ep(1, 0, 0) } } }, true)["tools/failure_frequency"])
    assert.is_nil(episodes.metrics(ro, false)["tools/call_frequency"])   -- no tools, no tool metrics
  end)

  it("count the model's tokens in completion_length_*, and log reward/environment", function()
    local game = { step = function(_, text) return "more", false, #text % 3 end }
    local step = make_step({ environment = game, stop_strings = { "a", "e", "o" }, max_completion_length = 30 })
    local m, ro = step:run({ { prompt = "x" }, { prompt = "y" } }, { step = 1 })
    local model, all, env, n = 0, 0, 0, 0
    for k, r in ipairs(ro.rows) do
      if not r.greedy then
        n = n + 1
        for _, x in ipairs(r.loss_mask) do model = model + x end
        all = all + #r.tokens
        for _, v in ipairs(r.episode.turn_rewards) do env = env + v end
      end
    end
    assert.is_true(all > model, "the episodes have observations")
    assert.are.equal(model / n, m.completion_length_mean)
    assert.is_true(math.abs(env / n - m["reward/environment"]) < 1e-12)
    assert.is_number(m["reward_greedy/environment"])
  end)
end)
