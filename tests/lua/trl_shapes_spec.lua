-- trl_shapes_spec: a TRL user's code runs as they wrote it (issue 44, part 2 a-e): TRL's kind of
-- environment (environment_factory: reset(**row) appended to the prompt, its public methods the
-- tools, get_reward, the instances handed to rewards as environments=) in Python and in Lua
-- beside remax's turn-answering kind, and a class of neither kind refused; async def tools,
-- rewards and environment methods awaited; the arguments TRL gives reward functions; tool
-- schemas by transformers' get_json_schema rules (checked against transformers itself when the
-- reference is installed) and results through str(); a chat template that cannot show tools
-- refused. Needs python3 and its standard library only, but for the comparison with
-- transformers (.cache/venv).
local remax = require("remax")
local support = require("support")
local episodes = require("remax.step.episodes")
local tools = require("remax.step.tools")
local rewards = require("remax.step.rewards")
local step_mod = require("remax.step.step")
local config = require("remax.settings.config")
local tokenizer = require("remax.bind.tokenizer")
local dist = require("remax.bind.dist")
local jinja = require("remax.text.jinja")
local cjson = require("cjson")
local write = support.write

local tok = tokenizer.load("tests/fixtures/byte_tokenizer")
local STOP = { 258 }
for id = 100, 129 do STOP[#STOP + 1] = id end   -- turns end within a few tokens on a random model

local function tiny(seed)
  return remax.model.new(support.tiny_model({ vocab_size = 260, hidden_size = 16, intermediate_size = 24,
    max_position_embeddings = 256, tie_word_embeddings = false }), { seed = seed or 11, init_std = 0.3 })
end

-- A Step over a tiny model and the byte tokenizer (template: a chat template function that
-- shows the tools, unless the settings give chat_template, or pieces give template).
local function make_step(settings, pieces)
  local s = { rewards = { function(c) local z = {} for i = 1, #c do z[i] = 0 end return z end }, num_generations = 2,
    max_completion_length = 24, max_prompt_length = 96, max_turns = 3, tool_timeout = 10, seed = 5,
    per_device_train_batch_size = 2, learning_rate = 1e-3, max_steps = 2 }
  for k, v in pairs(settings or {}) do s[k] = v end
  local cfg = config.resolve(s, {}, { running = true })
  local model = tiny()
  local p = { model = model, tok = tok, stop = STOP, template = { template = support.chatml_tools }, template_name = "recipe function",
    rewards = {}, world = dist.world(), opt = require("remax.bind.optim").adamw(model, { lr = 1e-3 }) }
  for k, v in pairs(pieces or {}) do p[k] = v end
  return step_mod.new(p, cfg)
end

local function close(step) local s = step.policy.episodes_ready if s and s.registry then s.registry:close() end end

-- A parser that makes every turn call `name` with args (the tiny model writes no call of its own).
local function calls(name, args) return function() return { { name = name, arguments = args or {} } } end end

-- The tool results of an episode, in order.
local function results(r)
  local out = {}
  for _, m in ipairs(r.completion_messages) do if m.role == "tool" then out[#out + 1] = m.content end end
  return out
end

local ROWS = { { prompt = { { role = "system", content = "Play." }, { role = "user", content = "p1" } }, start = 3 },
  { prompt = { { role = "system", content = "Play." }, { role = "user", content = "p2" } }, start = 10 } }

-- An episode of the Counter game (ROWS, add = 1 on every turn but the last) checked: its first
-- messages are the row's prompt with reset's text at the end, its own instance counts from the
-- row's start, and the count is what the rewards read.
local function check_counter(ro)
  local ran = 0
  for k, r in ipairs(ro.rows) do
    local row = ROWS[r.prompt]
    assert.are.same({ row.prompt[1], { role = "user", content = row.prompt[2].content .. " Count from " .. row.start .. "." } },
      ro.prompt_messages[r.prompt])
    -- every call ran on the episode's instance (the last result may not fit in the episode's budget)
    local got, want = results(r), {}
    for i = 1, #got do want[i] = tostring(row.start + i) end
    assert.are.same(want, got, "row " .. k)
    assert.is_true(#got == r.episode.tool_calls or #got == r.episode.tool_calls - 1)
    assert.are.equal(0, r.episode.tool_errors)
    ran = ran + r.episode.tool_calls
  end
  assert.is_true(ran >= 4, ran .. " method calls")
end

---------------------------------------------------------------------------- 2a environment_factory

describe("TRL's kind of environment (environment_factory)", function()
  if not support.has_python() then
    pending("python3 is not installed")
    return
  end
  local d = support.tmpdir()
  write(d .. "/counter.py", [[
class Counter:
    """TRL's kind: reset gives the end of the prompt; add is a tool; get_reward scores the episode."""
    def reset(self, start, **row):
        self.count = start
        return " Count from %d." % start
    def add(self, n: int) -> int:
        """Add to the count.

        Args:
            n: How much to add
        """
        self.count += n
        return self.count
    def get_reward(self):
        return 100.0 + self.count
    def _private(self):
        pass
def count_reward(environments, **kwargs):
    return [float(env.count) for env in environments]
def saw(prompts, completions, **kwargs):
    # what TRL gives: the prompts the model saw (reset's text at the end) and the episodes as messages
    return [1.0 if p[-1]["content"].endswith("Count from %d." % s) and c[0]["role"] == "assistant"
            and any(m["role"] == "tool" for m in c) else 0.0
            for p, c, s in zip(prompts, completions, kwargs["start"])]
class Undocumented:
    def reset(self, **row):
        return None
    def move(self, where: str) -> str:
        return where
class Neither:
    def play(self, x):
        pass
    def score(self):
        pass
]])
  local env = "py:" .. d .. "/counter.py:Counter"

  it("in Python: reset's text ends the prompt, its methods are the tools, each episode calls its own instance", function()
    local step = make_step({ environment_factory = env, tool_call_format = calls("add", { n = 1 }) })
    finally(function() close(step) end)
    local ro = step:rollout(ROWS, { step = 1 })
    check_counter(ro)
    -- the tools section lists the method, with the schema from its signature and docstring
    assert.matches("<|im_start|>system\nTools: add<|im_end|>", tok:decode(ro.prompt_ids[1], { skip_special_tokens = false }), 1, true)
    assert.are.same({ type = "function", ["function"] = { name = "add", description = "Add to the count.",
      parameters = { type = "object", properties = { n = { type = "integer", description = "How much to add" } }, required = { "n" } },
      ["return"] = { type = "integer" } } }, jinja.to_lua(tools.schemas(step.policy:episode_setup().tools)[1]))
    assert.are.equal(1, #tools.names(step.policy:episode_setup().tools))   -- not reset, get_reward or _private
    -- rewards in the environment's file get the episodes' instances, and what TRL gives them
    local completions, batch = step:reward_inputs(ro)
    local counts = rewards.run_one(rewards.normalize("py:" .. d .. "/counter.py:count_reward", 1, {}), completions, batch, { timeout = 30 })
    local saw = rewards.run_one(rewards.normalize("py:" .. d .. "/counter.py:saw", 2, {}), completions, batch, { timeout = 30 })
    for k, r in ipairs(ro.rows) do
      assert.are.equal(ROWS[r.prompt].start + r.episode.tool_calls, counts[k])
      assert.are.equal(#results(r) > 0 and 1 or 0, saw[k])
    end
    -- get_reward, once the rewards ran: the column "environment"
    local per = episodes.add_environment_reward(ro, {}, { 0, 0, 0, 0, 0, 0 }, 0, {})
    for k = 1, #ro.rows do assert.are.equal(100 + counts[k], per.environment[k]) end
  end)

  it("in Lua: a class table, one object per episode, its tools table the methods' schemas", function()
    local Counter = { tools = { add = { description = "Add to the count", parameters = { type = "object",
      properties = { n = { type = "integer" } }, required = { "n" } } } } }
    function Counter:reset(sample) self.count = sample.start return " Count from " .. sample.start .. "." end
    function Counter:add(args) self.count = self.count + args.n return tostring(self.count) end
    function Counter:get_reward() return 100 + self.count end
    local step = make_step({ environment = Counter, tool_call_format = calls("add", { n = 1 }) })
    local ro = step:rollout(ROWS, { step = 1 })
    check_counter(ro)
    local _, batch = step:reward_inputs(ro)
    local per = episodes.add_environment_reward(ro, {}, { 0, 0, 0, 0, 0, 0 }, 0, {})
    for k, r in ipairs(ro.rows) do
      assert.are.equal(ROWS[r.prompt].start + r.episode.tool_calls, batch.environments[k].count)
      assert.are.equal(100 + batch.environments[k].count, per.environment[k])
    end
    assert.is_nil(rawget(Counter, "count"))   -- the class itself is no episode's
    -- and as a factory: function(sample) -> a new object
    local step2 = make_step({ environment = function() return setmetatable({}, { __index = Counter }) end,
      tool_call_format = calls("add", { n = 1 }) })
    check_counter(step2:rollout(ROWS, { step = 1 }))
  end)

  it("is told from remax's kind by its methods; a class of neither kind is refused, naming the file and its methods", function()
    local step = make_step({ environment = "py:" .. d .. "/counter.py:Neither" })
    finally(function() close(step) end)
    local err = support.error_of(function() step:rollout(ROWS, { step = 1 }) end)
    assert.matches(d .. "/counter.py: Neither is neither remax's environment (a step(text) method that answers each turn) " ..
      "nor TRL's environment_factory kind (a reset(**row) method; its other public methods are the tools); its methods: play, score",
      err, 1, true)
    -- a method get_json_schema would refuse is refused, naming it
    local undocumented = make_step({ environment = "py:" .. d .. "/counter.py:Undocumented" })
    finally(function() close(undocumented) end)
    err = support.error_of(function() undocumented:rollout(ROWS, { step = 1 }) end)
    assert.matches("environment = py:" .. d .. "/counter.py:Undocumented: its method move: cannot make the JSON schema of move: " ..
      "it has no docstring", err, 1, true)
    local lua = make_step({ environment = { play = function() end, score = function() end } })
    err = support.error_of(function() lua:rollout(ROWS, { step = 1 }) end)
    assert.matches("environment (tests/lua/trl_shapes_spec.lua) is neither remax's environment", err, 1, true)
    assert.matches("it has the functions play, score", err, 1, true)
    -- remax's kind stays itself: step answers each turn
    local game = make_step({ environment = { step = function() return "again", false, 1 end }, stop_strings = { "a", "e" } })
    local ro = game:rollout(ROWS, { step = 1 })
    assert.are.equal(ro.rows[1].episode.turns, #ro.rows[1].episode.turn_rewards)
  end)

  it("is set as environment_factory, TRL's name, as well as environment", function()
    local cfg = config.resolve({ environment_factory = env }, {}, { where = "r.lua" })
    assert.are.equal(env, cfg.environment)
    assert.is_nil(cfg.environment_factory)
    local err = support.error_of(config.resolve, { environment_factory = env, environment = "py:other.py:G" }, {}, { where = "r.lua" })
    assert.matches("r.lua: environment and environment_factory are the same setting", err, 1, true)
  end)
end)

---------------------------------------------------------------------------- 2b async

describe("async def", function()
  if not support.has_python() then
    pending("python3 is not installed")
    return
  end
  local d = support.tmpdir()
  write(d .. "/aio.py", [[
import asyncio
async def add(a: int, b: int) -> int:
    """Add two numbers, after a wait.

    Args:
        a: One number
        b: The other
    """
    await asyncio.sleep(0.01)
    return a + b
async def lengths(completions, **kwargs):
    await asyncio.sleep(0)
    return [float(len(c)) for c in completions]
class Game:
    async def reset(self, **row):
        self.loop = asyncio.get_running_loop()
        self.poked = asyncio.Event()   # made on the loop the later calls run on
        return " Go."
    async def poke(self) -> str:
        """Poke the game."""
        self.poked.set()
        return "same loop" if asyncio.get_running_loop() is self.loop else "another loop"
    async def get_reward(self):
        return 1.0 if self.poked.is_set() else 0.0
class Steps:
    async def step(self, text):
        await asyncio.sleep(0)
        return "fine", True, 0.5
]])
  local py = "py:" .. d .. "/aio.py:"

  it("tools, rewards and environment methods are awaited, on one event loop", function()
    local t, reg = tools.check({ py .. "add" })
    finally(function() reg:close() end)
    assert.are.same({ "5", true, "ok" }, { select(1, tools.call(t, { name = "add", arguments = { a = 2, b = 3 } }, 10, reg)),
      select(2, tools.call(t, { name = "add", arguments = { a = 2, b = 3 } }, 10, reg)),
      select(4, tools.call(t, { name = "add", arguments = { a = 2, b = 3 } }, 10, reg)) })
    local r = rewards.normalize(py .. "lengths", 1, {})
    assert.are.same({ 1, 3 }, rewards.run_one(r, { "a", "abc" }, { prompt = { "p", "q" } }, { timeout = 30 }))
    r.close()
    local step = make_step({ environment = py .. "Game", tool_call_format = calls("poke") })
    finally(function() close(step) end)
    local ro = step:rollout(ROWS, { step = 1 })
    local poked = 0
    for _, row in ipairs(ro.rows) do
      for _, result in ipairs(results(row)) do assert.are.equal("same loop", result); poked = poked + 1 end
    end
    assert.is_true(poked >= 2)
    local per = episodes.add_environment_reward(ro, {}, { 0, 0, 0, 0, 0, 0 }, 0, {})
    for k, row in ipairs(ro.rows) do assert.are.equal(row.episode.tool_calls > 0 and 1 or 0, per.environment[k]) end
    local steps = make_step({ environment = py .. "Steps" })
    finally(function() close(steps) end)
    local sro = steps:rollout(ROWS, { step = 1 })
    for _, row in ipairs(sro.rows) do
      assert.are.equal(0, row.episode.env_errors, tostring(row.episode.env_error))
      assert.are.same({ 0.5 }, row.episode.turn_rewards)
    end
  end)
end)

---------------------------------------------------------------------------- 2c reward arguments

describe("a Python reward function", function()
  if not support.has_python() then
    pending("python3 is not installed")
    return
  end
  local d = support.tmpdir()
  write(d .. "/shapes.py", ([[
import json
def shapes(prompts, completions, completion_ids, trainer_state, **kwargs):
    with open(%q, "a") as f:
        f.write(json.dumps({"prompt": prompts[0], "completion": completions[0], "completion_ids": completion_ids[0],
                            "step": trainer_state.global_step, "messages": kwargs["completion_messages"][0],
                            "greedy": kwargs["greedy"][0], "answer": kwargs["answer"][0],
                            "logging": [callable(kwargs["log_metric"]), callable(kwargs["log_extra"])]}) + "\n")
    return [0.0] * len(completions)
def trl_format(completions, **kwargs):
    # TRL's documentation's reward for conversational data, as written
    return [1.0 if completion[0]["content"].startswith("Answer") else 0.0 for completion in completions]
]]):format(d .. "/seen.jsonl"))

  it("gets what TRL passes: messages for conversational data, strings for string data, completion_ids, trainer_state", function()
    local r = rewards.normalize("py:" .. d .. "/shapes.py:shapes", 1, {})
    local conv = { { role = "user", content = "Q?" } }
    rewards.run_one(r, { "Answer: 4", "no" }, { prompt = { conv, conv }, answer = { "4", "4" }, completion_ids = { { 1, 2 }, { 3 } },
      greedy = { false, true }, completion_messages = { { { role = "assistant", content = "Answer: 4" } },
        { { role = "assistant", content = "no" } } } }, { timeout = 30, step = 7 })
    rewards.run_one(r, { "Answer: 4" }, { prompt = { "Q?" }, answer = { "4" }, completion_ids = { { 5 } }, greedy = { false } },
      { timeout = 30, step = 8 })
    r.close()
    local seen = support.jsonl(d .. "/seen.jsonl")
    local assistant = { { role = "assistant", content = "Answer: 4" } }
    assert.are.same({ prompt = conv, completion = assistant, completion_ids = { 1, 2 }, step = 7, messages = assistant,
      greedy = false, answer = "4", logging = { true, true } }, seen[1])
    -- string data: both strings, and remax's completion_messages all the same
    assert.are.same({ prompt = "Q?", completion = "Answer: 4", completion_ids = { 5 }, step = 8, messages = assistant,
      greedy = false, answer = "4", logging = { true, true } }, seen[2])
    local f = rewards.normalize("py:" .. d .. "/shapes.py:trl_format", 2, {})
    assert.are.same({ 1, 0 }, rewards.run_one(f, { "Answer: 4", "no" }, { prompt = { conv, conv } }, { timeout = 30 }))
    f.close()
  end)
end)

---------------------------------------------------------------------------- 2d get_json_schema

-- Tools that transformers' get_json_schema takes, and the schemas it writes (the comparison with
-- transformers itself is below): choices, Optional, unions, Literal, Enum, tuple, dict, a method.
local SCHEMA_PY = [==[
import enum
from typing import Any, Literal, Optional, Union
class Size(enum.Enum):
    SMALL = "s"
    BIG = 2
def order(drink: str, size: Size, sugar: Optional[int] = None, milk: Union[bool, str] = False,
          extras: list[Literal["ice", "lemon"]] = (), where: tuple[float, float] = (0, 0),
          notes: dict[str, Any] = None, mode: int | list[int] | None = None) -> dict:
    """Order a drink.

    The bar is open from 8 to 8.

    Args:
        drink: The drink (choices: ["tea", "coffee"])
        size (Size): Its size
        sugar: Spoons of sugar,
            if any
        milk: Milk, or which milk
        extras: What goes in
        where: The table's place
        notes: Anything else
        mode: How to serve it

    Returns:
        The order, as the bar took it
    """
    return {"drink": drink}
def nothing() -> None:
    """Do nothing at all."""
    return None
class Env:
    def reset(self, **row):
        return None
    def guess(self, n: int) -> str:
        """Guess a number.

        Args:
            n: The number
        """
        return str(n)
]==]

local REFUSED_PY = [[
def nodoc(x: int) -> int:
    return x
def nohint(x):
    """No hint.

    Args:
        x: a thing
    """
def undescribed(x: int, y: int):
    """One missing.

    Args:
        x: a thing
    """
def star(*args: int):
    """Star.

    Args:
        args: things
    """
def kw(**kwargs: int):
    """Keywords.

    Args:
        kwargs: things
    """
def custom(x: object):
    """A custom type.

    Args:
        x: a thing
    """
def ok(x: int) -> object:
    """A return hint it cannot convert is only left out.

    Args:
        x: a thing
    """
    return {"x": x}
]]

describe("tool schemas", function()
  if not support.has_python() then
    pending("python3 is not installed")
    return
  end
  local d = support.tmpdir()
  write(d .. "/schema.py", SCHEMA_PY)
  write(d .. "/refused.py", REFUSED_PY)

  it("refuse at the start, naming the function, what get_json_schema refuses (and *args, **kwargs)", function()
    local function refusal(name) return support.error_of(tools.check, { "py:" .. d .. "/refused.py:" .. name }) end
    assert.matches("tools.nodoc.fn: cannot make the JSON schema of nodoc: it has no docstring", refusal("nodoc"), 1, true)
    assert.matches("tools.nohint.fn: cannot make the JSON schema of nohint: the argument x has no type hint", refusal("nohint"), 1, true)
    assert.matches("tools.undescribed.fn: cannot make the JSON schema of undescribed: the docstring has no description of the argument 'y'",
      refusal("undescribed"), 1, true)
    assert.matches("tools.star.fn: cannot make the JSON schema of star: *args: a tool is called with the arguments", refusal("star"), 1, true)
    assert.matches("tools.kw.fn: cannot make the JSON schema of kw: **kwargs:", refusal("kw"), 1, true)
    assert.matches("tools.custom.fn: cannot make the JSON schema of custom: cannot convert the type hint <class 'object'>",
      refusal("custom"), 1, true)
    -- a tool of the file that is fine is taken with the others refused
    local t, reg = tools.check({ "py:" .. d .. "/refused.py:ok" })
    reg:close()
    assert.is_nil(jinja.to_lua(tools.schemas(t)[1])["function"]["return"])
  end)

  it("read choices as an enum, Optional as nullable, unions as a type list or anyOf; a result that is not a string goes through str()", function()
    local t, reg = tools.check({ "py:" .. d .. "/schema.py:order", "py:" .. d .. "/schema.py:nothing" })
    finally(function() reg:close() end)
    local p = t.order.parameters.properties
    assert.are.same({ type = "string", enum = { "tea", "coffee" }, description = "The drink" }, p.drink)
    assert.are.same({ type = { "string", "integer" }, enum = { "s", 2 }, description = "Its size" }, p.size)
    assert.are.same({ type = "integer", nullable = true, description = "Spoons of sugar, if any" }, p.sugar)
    assert.are.same({ type = { "boolean", "string" }, description = "Milk, or which milk" }, p.milk)
    assert.are.same({ anyOf = { { type = "integer" }, { type = "array", items = { type = "integer" } } }, nullable = true,
      description = "How to serve it" }, p.mode)
    assert.are.same({ "drink", "size" }, t.order.parameters.required)
    -- str() of what is not a string, as TRL makes its tool message
    assert.are.equal("{'drink': 'tea'}", (tools.call(t, { name = "order", arguments = { drink = "tea", size = "s" } }, 10, reg)))
    assert.are.equal("None", (tools.call(t, { name = "nothing", arguments = {} }, 10, reg)))
  end)

  it("are transformers' get_json_schema, key for key", function()
    local py = support.reference("transformers")
    if not py then return end
    local t, reg = tools.check({ "py:" .. d .. "/schema.py:order", "py:" .. d .. "/schema.py:nothing" })
    reg:close()
    write(d .. "/ref.py", [==[
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("schema", sys.argv[1])
m = importlib.util.module_from_spec(spec)
spec.loader.exec_module(m)
from transformers.utils import get_json_schema
print(json.dumps([json.dumps(get_json_schema(f)) for f in [m.order, m.nothing, m.Env().guess]]))
]==])
    local want = cjson.decode(support.run_reference(d .. "/ref.py", d .. "/schema.py"))
    local got = tools.schemas(t)   -- by name: nothing, order
    assert.are.equal(want[1], jinja.render("{{ t | tojson }}", { t = got[2] }))
    assert.are.equal(want[2], jinja.render("{{ t | tojson }}", { t = got[1] }))
    -- a method of a TRL-kind environment: the receiver is not an argument
    write(d .. "/env.py", SCHEMA_PY .. "\n")
    local step = make_step({ environment = "py:" .. d .. "/env.py:Env" })
    finally(function() close(step) end)
    step.policy:episode_setup({ prompt = "x" })
    assert.are.equal(want[3], jinja.render("{{ t | tojson }}", { t = tools.schemas(step.policy:episode_setup().tools)[1] }))
  end)
end)

---------------------------------------------------------------------------- 2e templates

describe("tools with a chat template", function()
  local t = { calc = { description = "Evaluate arithmetic", parameters = { type = "object", properties = {} }, fn = function() return "1" end } }
  local function tokenizer_with(template)
    local dir = support.tmpdir()
    for _, f in ipairs({ "tokenizer.json", "tokenizer_config.json" }) do
      write(dir .. "/" .. f, support.read("tests/fixtures/byte_tokenizer/" .. f))
    end
    write(dir .. "/chat_template.jinja", support.read("tests/fixtures/chat_templates/" .. template))
    return tokenizer.load(dir), dir
  end

  it("are refused, naming the template, when it cannot show them: the built-in chatml and qa, a tokenizer's without a tools section", function()
    for _, name in ipairs({ "chatml", "qa", "llama3", "plain" }) do
      local step = make_step({ tools = t }, { template = { template = name }, template_name = name })
      local err = support.error_of(function() step:rollout(ROWS, { step = 1 }) end)
      assert.matches("chat_template = " .. name .. " (built in) cannot show the model its tools: it has no tools section", err, 1, true)
      assert.matches("TRL refuses such a template too", err, 1, true)
    end
    local smol, dir = tokenizer_with("smollm2.jinja")
    local step = make_step({ tools = t }, { tok = smol, template = { template = "tokenizer", tokenizer = smol }, template_name = "tokenizer" })
    local err = support.error_of(function() step:rollout(ROWS, { step = 1 }) end)
    assert.matches("chat_template = tokenizer (" .. dir .. "/chat_template.jinja) cannot show the model its tools", err, 1, true)
  end)

  it("are taken with a template that lists them (Qwen2.5's, Llama 3.1's) and with a recipe's template function", function()
    for _, name in ipairs({ "qwen2.5.jinja", "llama3.1.jinja" }) do
      local tk = tokenizer_with(name)
      local step = make_step({ tools = t, max_prompt_length = 2048 }, { tok = tk, template = { template = "tokenizer", tokenizer = tk },
        template_name = "tokenizer" })
      local _, ids = episodes.first_prompt(step.policy, ROWS[1], { step = 1 })
      assert.matches('"name": "calc"', tk:decode(ids, { skip_special_tokens = false }), 1, true)
    end
    local step = make_step({ tools = t })   -- support.chatml_tools
    assert.is_table(step:rollout(ROWS, { step = 1 }))
  end)
end)

---------------------------------------------------------------------------- 5 From TRL

-- recipes/trl_agent.py is a TRL agent script (docs/environments.md, "From TRL"), and
-- recipes/trl_agent.lua runs it unchanged.
describe("recipes/trl_agent.lua", function()
  if not support.has_python() then
    pending("python3 is not installed")
    return
  end
  local rows = support.jsonl("recipes/trl_agent.jsonl")

  it("plays the TRL file's game through its methods, and its rewards read the environments", function()
    local py = "py:recipes/trl_agent.py:"
    local step = make_step({ environment_factory = py .. "GuessTheNumber", tools = { py .. "calculator" },
      tool_call_format = calls("guess", { number = 50 }) })
    finally(function() close(step) end)
    local two = { rows[1], rows[2] }
    assert.are.same({ 50, 98 }, { rows[1].secret, rows[2].secret })
    local ro = step:rollout(two, { step = 1 })
    assert.are.same({ "calculator", "guess" }, tools.names(step.policy:episode_setup().tools))
    assert.are.equal(rows[1].prompt[1].content .. " You have 6 guesses.", ro.prompt_messages[1][1].content)
    local completions, batch = step:reward_inputs(ro)
    local solved = rewards.run_one(rewards.normalize(py .. "solved_reward", 1, {}), completions, batch, { timeout = 30 })
    local brevity = rewards.run_one(rewards.normalize(py .. "brevity_reward", 2, {}), completions, batch, { timeout = 30 })
    for k, r in ipairs(ro.rows) do
      local got = results(r)
      for _, result in ipairs(got) do assert.are.equal(r.prompt == 1 and "Right!" or "Higher.", result) end
      local g = r.episode.tool_calls
      assert.are.equal((r.prompt == 1 and g > 0) and math.max(0, 1.1 - 0.1 * g) or 0, solved[k])
      local chars = 0
      for _, m in ipairs(r.completion_messages) do if m.role == "assistant" then chars = chars + #m.content end end
      -- the assistant messages' characters (Python counts characters, Lua bytes: the random model writes some of more bytes)
      assert.is_true(brevity[k] < 0 and brevity[k] >= -0.01 * chars / 100 - 1e-12, tostring(brevity[k]))
    end
  end)

  it("trains on the TRL file, unchanged, for two steps", function()
    local d = support.tmpdir()
    local model = d .. "/model"
    remax.model.new(support.tiny_model({ vocab_size = 260, max_position_embeddings = 2048 }), { seed = 3 }):save(model)
    for _, f in ipairs({ "tokenizer.json", "tokenizer_config.json" }) do
      write(model .. "/" .. f, support.read("tests/fixtures/byte_tokenizer/" .. f))
    end
    write(model .. "/chat_template.jinja", support.read("tests/fixtures/chat_templates/qwen2.5.jinja"))   -- it lists tools
    local out, rc = support.run_remax(1, ("run recipes/trl_agent.lua --model %s --max_steps 2 --num_generations 2 " ..
      "--per_device_train_batch_size 2 --max_completion_length 24 --max_prompt_length 1536 --learning_rate 1e-3 " ..
      "--output_dir %s/runs --run_name t --save_steps 0 --logging_steps 1 --log_completions 1"):format(model, d))
    assert.are.equal(0, rc, out)
    local m = support.jsonl(d .. "/runs/t/metrics.jsonl")
    assert.are.equal(2, #m)
    for _, step in ipairs(m) do
      assert.is_number(step["reward/solved_reward"])
      assert.is_number(step["reward/brevity_reward"])
      assert.is_true(step["reward/brevity_reward"] < 0)
      assert.is_number(step["tools/call_frequency"])
    end
    for _, rec in ipairs(support.jsonl(d .. "/runs/t/completions.jsonl")) do
      assert.are.equal("I am thinking of a number from 1 to 100. Find it. You have 6 guesses.", rec.prompt[1].content)
    end
    -- the prompt lists the file's tool and the environment's method, as the template writes them
    local p = assert(io.popen(("%s render recipes/trl_agent.lua --model %s --max_prompt_length 1536 2>/dev/null"):format(support.remax_binary(), model)))
    local prompt = p:read("*a")
    p:close()
    assert.matches('"name": "calculator", "description": "Evaluate an arithmetic expression."', prompt, 1, true)
    assert.matches('"name": "guess", "description": "Guess the secret number."', prompt, 1, true)
    assert.matches("Find it. You have 6 guesses.<|im_end|>", prompt, 1, true)
  end)

  it("is shown in docs/environments.md as it is, beside the TRL script", function()
    local doc = support.read("docs/environments.md")
    assert.is_truthy(doc:find(support.read("recipes/trl_agent.py"), 1, true), "docs/environments.md shows another trl_agent.py")
    assert.is_truthy(doc:find(support.read("recipes/trl_agent.lua"), 1, true), "docs/environments.md shows another trl_agent.lua")
  end)
end)
