-- tools_remote_spec: tools and environments outside Lua (remax.step.channels): Python functions
-- and classes in a python3 worker, cmd: programs, and HTTP servers, every failure as the
-- episode's error result, and rows that wait on a slow tool while the other rows decode.
-- Needs only the system's python3 and its standard library.
local remax = require("remax")
local support = require("support")
local tools = require("remax.step.tools")
local channels = require("remax.step.channels")
local episodes = require("remax.step.episodes")
local rollout = require("remax.step.rollout")
local turns = require("remax.bind.turns")
local tokenizer = require("remax.bind.tokenizer")
local json = require("remax.formats.json")
local jinja = require("remax.text.jinja")
local write, read = support.write, support.try_read

local function tiny(vocab, seed)
  return remax.model.new(support.tiny_model({ vocab_size = vocab, hidden_size = 16, intermediate_size = 24,
    max_position_embeddings = 512, tie_word_embeddings = false }), { seed = seed or 1, init_std = 0.3 })
end

local TOOLS_PY = [[
import time, os, sys
from typing import Literal, Optional
def pick(kind: Literal["a", "b"], n: Optional[int], note: "str | None" = None) -> str:
    """Pick one.

    Args:
        kind: which
        n: how many
        note: a note
    """
    return kind
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression.

    Args:
        expression: the expression, such as 12*7+3
    """
    return str(eval(expression, {"__builtins__": {}}))
def search(query: str, limit: int = 3, exact: bool = False) -> list:
    """Search the notes.

    Args:
        query: the words
        limit: the most hits
        exact: whole words only
    """
    return [query] * limit
def nap(seconds: float) -> str:
    """Sleep.

    Args:
        seconds: how long
    """
    time.sleep(seconds)
    return "slept"
def die() -> str:
    """Exit at once."""
    os._exit(3)
def garbage() -> str:
    """Write a line that is not JSON where the answers go."""
    sys.__stdout__.write("this is not json\n")
    sys.__stdout__.flush()
    time.sleep(0.5)
    return "x"
]]

-- A server on 127.0.0.1 (a port of its own), answering the remote protocol; killed at the end.
local SERVER_PY = [==[
import json, sys, os, time
from http.server import ThreadingHTTPServer, BaseHTTPRequestHandler
envs = {}
class H(BaseHTTPRequestHandler):
    def log_message(self, *a): pass
    def do_POST(self):
        req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        t = req["type"]
        if self.path == "/broken":
            out = "this is not json"
        elif t == "tool":
            a = req["arguments"]
            if req["name"] == "add":
                out = {"id": req["id"], "result": str(a["a"] + a["b"])}
            else:
                out = {"id": req["id"], "error": "no tool " + req["name"]}
        elif t == "reset":
            envs[req["episode"]] = {"secret": req["sample"]["secret"], "turns": 0}
            out = {"id": req["id"], "messages": [{"role": "user", "content": "guess: " + req["sample"]["prompt"]}]}
        elif t == "step":
            e = envs[req["episode"]]
            e["turns"] += 1
            right = str(e["secret"]) in req["text"]
            out = {"id": req["id"], "messages": "right" if right else "no (%d)" % e["turns"], "done": right,
                   "reward": 1.0 if right else 0.1}
        elif t == "close":
            envs.pop(req["episode"], None)
            out = {"id": req["id"]}
        body = (out if isinstance(out, str) else json.dumps(out)).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
with open(sys.argv[1] + ".tmp", "w") as f:
    f.write("%d %d\n" % (srv.server_address[1], os.getpid()))
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
srv.serve_forever()
]==]

local function start_server(d)
  write(d .. "/server.py", SERVER_PY)
  os.execute(("python3 %s %s >/dev/null 2>&1 &"):format(d .. "/server.py", d .. "/port"))
  for _ = 1, 200 do
    local t = read(d .. "/port")
    if t then
      local port, pid = t:match("(%d+) (%d+)")
      return port, pid
    end
    os.execute("sleep 0.05")
  end
  error("the test server did not start")
end

local STOP = { 258 }
for id = 100, 129 do STOP[#STOP + 1] = id end   -- turns end within a few tokens on a random model

local function fake_step(m, tok, cfg_extra)
  local cfg = { max_completion_length = 24, max_prompt_length = 64, max_turns = 3, max_episode_length = 600,
    tool_timeout = 5, sampling = rollout.plan(2, true, 1.0) }
  for k, v in pairs(cfg_extra or {}) do cfg[k] = v end
  local tools_shown = cfg.tools ~= nil   -- the built-in chatml has no tools section: a template function that shows them
  return { cfg = cfg, model = m, tok = tok, stop = STOP, template = { template = tools_shown and support.chatml_tools or "chatml" },
    template_name = tools_shown and "recipe function" or "chatml",
    seed_for = function(_, s) return 1000 + s end, progress = function() end }
end

describe("tools outside Lua", function()
  if not support.has_python() then
    pending("python3 is not installed")
    return
  end
  local d = support.tmpdir()
  write(d .. "/tools.py", TOOLS_PY)
  local py = "py:" .. d .. "/tools.py:"

  it("run a TRL-style Python function as-is, its schema from its signature and docstring", function()
    local t, reg = tools.check({ py .. "calculator", search = py .. "search", py .. "pick" })
    finally(function() reg:close() end)
    -- as transformers' get_json_schema writes them: required = the parameters without a default,
    -- Optional as "nullable", the return type as "return"
    local s = {}
    for i, schema in ipairs(tools.schemas(t)) do s[i] = jinja.to_lua(schema) end
    assert.are.same({ type = "function", ["function"] = { name = "calculator", description = "Evaluate an arithmetic expression.",
      parameters = { type = "object", required = { "expression" },
        properties = { expression = { type = "string", description = "the expression, such as 12*7+3" } } },
      ["return"] = { type = "string" } } }, s[1])
    assert.are.same({ type = "object", required = { "query" }, properties = { query = { type = "string", description = "the words" },
      limit = { type = "integer", description = "the most hits" }, exact = { type = "boolean", description = "whole words only" } } },
      s[3]["function"].parameters)
    assert.are.same({ type = "array" }, s[3]["function"]["return"])
    assert.are.same({ type = "object", required = { "kind", "n" }, properties = {
      kind = { type = "string", enum = { "a", "b" }, description = "which" },
      n = { type = "integer", nullable = true, description = "how many" }, note = { type = "string", nullable = true, description = "a note" } } },
      s[2]["function"].parameters)
    assert.are.same({ "42", true }, { (tools.call(t, { name = "calculator", arguments = { expression = "6*7" } }, 5, reg)) , true })
    -- a result that is not a string goes through str(), as TRL makes a tool message of it
    assert.are.equal("['x', 'x']", (tools.call(t, { name = "search", arguments = { query = "x", limit = 2 } }, 5, reg)))
    -- the recipe's own schema wins, and the Lua-side checks run before anything is sent
    local t2, reg2 = tools.check({ calc = { description = "mine", parameters = { type = "object",
      properties = { expression = { type = "string" } }, required = { "expression" } }, fn = py .. "calculator" } })
    finally(function() reg2:close() end)
    assert.are.equal("mine", t2.calc.description)
    assert.are.same({ "Error: bad arguments for 'calc': missing required argument 'expression'", false, 0, "bad_args" },
      { tools.call(t2, { name = "calc", arguments = {} }, 5, reg2) })
  end)

  it("give every failure its documented error as the result, and keep going", function()
    local t, reg = tools.check({ calc = py .. "calculator", nap = py .. "nap", die = py .. "die", garbage = py .. "garbage" })
    finally(function() reg:close() end)
    local function call(name, args, timeout)
      local r, ok, _, kind = tools.call(t, { name = name, arguments = args or {} }, timeout or 5, reg)
      return { r, ok, kind }
    end
    assert.are.same({ "Error: tool 'calc' failed: ZeroDivisionError: division by zero", false, "error" }, call("calc", { expression = "1/0" }))
    assert.are.same({ "Error: tool 'nap' timed out after 0.3 s", false, "timeout" }, call("nap", { seconds = 3 }, 0.3))
    local died = call("die")
    assert.are.equal("worker", died[3])
    assert.matches("Error: tool 'die' failed: the worker py:.*tools.py died %(exit status 3%)", died[1])
    assert.are.same({ "4", true, "ok" }, call("calc", { expression = "2+2" }))   -- started again
    local bad = call("garbage")
    assert.are.equal("worker", bad[3])
    assert.matches("answered something that is not JSON: this is not json", bad[1], 1, true)
    assert.are.same({ "5", true, "ok" }, call("calc", { expression = "2+3" }))
    assert.matches("Error: unknown tool 'nope' %(available: calc, die, garbage, nap%)", call("nope")[1])
  end)

  it("are settings a recipe may give: a py:, cmd: or http:// environment, and nothing else as a string", function()
    local config = require("remax.settings.config")
    local cfg = config.resolve({ environment = "py:env.py:Game", rewards = {} }, {}, { where = "r.lua" })
    assert.are.equal("py:env.py:Game", cfg.environment)
    assert.are.equal("http://127.0.0.1:9/env", config.resolve({ environment = "http://127.0.0.1:9/env", rewards = {} }, {}, {}).environment)
    local err = support.error_of(config.resolve, { environment = "game.py" }, {}, { where = "r.lua" })
    assert.matches("py:FILE.py:CLASS, cmd:PROGRAM or http://HOST:PORT/PATH", err, 1, true)
  end)

  it("refuse a missing function or file at the start, naming the tool", function()
    local err = support.error_of(tools.check, { x = py .. "nothere" })
    assert.matches("tools.x.fn: LookupError: .*tools.py has no function or class 'nothere' %(have: calculator, die, garbage, nap, pick, search%)", err)
    err = support.error_of(tools.check, { x = "py:no/such/file.py:f" })
    assert.matches("tools.x.fn = py:no/such/file.py:f: no such file", err, 1, true)
    err = support.error_of(tools.check, { x = { fn = "ftp://x" } })
    assert.matches("tools.x.fn = ftp://x: expected a function(args) -> result, py:FILE.py:FUNCTION", err, 1, true)
    write(d .. "/broken.py", "def f(:\n")
    err = support.error_of(tools.check, { x = "py:" .. d .. "/broken.py:f" })
    assert.matches("loading .*broken.py: .*SyntaxError", err)
  end)

  it("run a cmd: program and an HTTP server speaking the same JSON", function()
    write(d .. "/echo.py", [[
import json, sys
for line in sys.stdin:
    r = json.loads(line)
    if r["arguments"].get("bad"):
        print(json.dumps({"result": "no id"}), flush=True)
    else:
        print(json.dumps({"id": r["id"], "result": r["arguments"]["text"].upper()}), flush=True)
]])
    local port, pid = start_server(d)
    finally(function() os.execute("kill " .. pid) end)
    local url = ("http://127.0.0.1:%s/tool"):format(port)
    local params = { type = "object", properties = { a = { type = "number" }, b = { type = "number" } } }
    local t, reg = tools.check({ shout = { fn = "cmd:python3 " .. d .. "/echo.py",
      parameters = { type = "object", properties = { text = { type = "string" }, bad = { type = "boolean" } } } },
      add = { fn = url, parameters = params }, sub = { fn = url, parameters = params },
      broken = { fn = ("http://127.0.0.1:%s/broken"):format(port) } })
    finally(function() reg:close() end)
    assert.are.equal("HI", (tools.call(t, { name = "shout", arguments = { text = "hi" } }, 5, reg)))
    local r, ok, _, kind = tools.call(t, { name = "shout", arguments = { bad = true } }, 5, reg)
    assert.are.same({ false, "worker" }, { ok, kind })
    assert.matches("answered without a request id", r, 1, true)
    assert.are.equal("HI", (tools.call(t, { name = "shout", arguments = { text = "hi" } }, 5, reg)))
    assert.are.equal("5", (tools.call(t, { name = "add", arguments = { a = 2, b = 3 } }, 5, reg)))
    assert.are.equal("Error: tool 'sub' failed: no tool sub", (tools.call(t, { name = "sub", arguments = { a = 2, b = 3 } }, 5, reg)))
    r, ok, _, kind = tools.call(t, { name = "broken", arguments = {} }, 5, reg)
    assert.are.same({ false, "worker" }, { ok, kind })
    assert.matches("answered something that is not JSON: this is not json", r, 1, true)
    os.execute("kill " .. pid)
    os.execute("sleep 0.2")
    r, ok, _, kind = tools.call(t, { name = "add", arguments = { a = 1, b = 1 } }, 5, reg)
    assert.are.same({ false, "worker" }, { ok, kind })
    assert.matches(("Error: tool 'add' failed: cannot connect to 127.0.0.1:%s"):format(port), r, 1, true)
  end)
end)

describe("episodes with tools and environments outside Lua", function()
  if not support.has_python() then
    pending("python3 is not installed")
    return
  end
  local tok = tokenizer.load("tests/fixtures/byte_tokenizer")
  local m = tiny(260, 11)
  local d = support.tmpdir()
  -- every turn calls the tool `work` with its own text; the worker's first call sleeps 1.5 s
  -- (whichever row makes it), and each call is logged with its times
  write(d .. "/slow.py", ([[
import time, json, threading
lock = threading.Lock()
first = [True]
def work(text: str) -> str:
    """Work on a text.

    Args:
        text: the text
    """
    with lock:
        slow, first[0] = first[0], False
    t0 = time.time()
    if slow:
        time.sleep(1.5)
    with open(%q, "a") as f:
        f.write(json.dumps({"text": text, "t0": t0, "t1": time.time(), "slow": slow}) + "\n")
    return "ok:%%d" %% sum(1 for c in text if c.isascii() and c.isalnum())
]]):format(d .. "/calls.jsonl"))
  local function parser(text) return { { name = "work", arguments = { text = text } } } end
  local prompts = { { prompt = "first problem" }, { prompt = "second one" } }

  it("keep decoding the other rows while one waits on a slow tool, with the results of inline Lua tools", function()
    local step = fake_step(m, tok, { tools = { work = "py:" .. d .. "/slow.py:work" }, tool_call_format = parser })
    local setup = episodes.setup(step)
    local ro = episodes.rollout(step, prompts, { step = 1, setup = setup })
    setup.registry:close()
    local calls = {}
    for line in (read(d .. "/calls.jsonl") or ""):gmatch("[^\n]+") do calls[#calls + 1] = json.decode(line) end
    local slow
    for _, c in ipairs(calls) do if c.slow then slow = c end end
    assert.is_not_nil(slow)
    -- every other call ran, and was answered, while the slow one slept: nothing waited for it
    -- but the slow row's own later turns
    local during, others = 0, 0
    for _, c in ipairs(calls) do
      if not c.slow and c.t0 < slow.t1 then
        during = during + 1
        assert.is_true(c.t1 < slow.t1, "a call answered after the slow one: the rows waited for it")
      end
    end
    local slow_row
    for k, r in ipairs(ro.rows) do
      if r.episode.tool_time >= 1.4 then
        assert.is_nil(slow_row, "two rows waited on the slow tool")
        slow_row = k
      end
    end
    assert.is_not_nil(slow_row)
    for k, r in ipairs(ro.rows) do if k ~= slow_row then others = others + r.episode.tool_calls end end
    assert.are.equal(others, during)   -- all of the other rows' calls, every turn of theirs
    assert.is_true(others >= 5, others .. " calls of the other rows")
    assert.is_true(ro.rows[slow_row].episode.tool_time >= 1.4)
    -- the same episodes as the same tool in Lua, run inline
    local lua_step = fake_step(m, tok, { tools = { work = { parameters = { type = "object", properties = { text = { type = "string" } } },
      fn = function(a) return ("ok:%d"):format(select(2, a.text:gsub("[%w]", ""))) end } }, tool_call_format = parser })
    local want = episodes.rollout(lua_step, prompts, { step = 1 })
    for k, r in ipairs(ro.rows) do
      assert.are.same(want.rows[k].tokens, r.tokens)
      assert.are.same(want.rows[k].loss_mask, r.loss_mask)
      assert.are.same(want.rows[k].completion_messages, r.completion_messages)
    end
  end)

  it("cut a hanging tool at tool_timeout with the timeout result, counted, while the other rows go on", function()
    write(d .. "/hang.py", "import time\ndef work(text: str) -> str:\n    \"\"\"Work.\n\n    Args:\n        text: the text\n    \"\"\"\n    time.sleep(30 if len(text) % 2 else 0)\n    return 'ok'\n")
    local step = fake_step(m, tok, { tools = { work = "py:" .. d .. "/hang.py:work" }, tool_call_format = parser, tool_timeout = 0.5 })
    local t0 = require("remax.bind.clock").now()
    local setup = episodes.setup(step)
    local ro = episodes.rollout(step, prompts, { step = 1, setup = setup })
    setup.registry:close()
    assert.is_true(require("remax.bind.clock").now() - t0 < 20)
    local timeouts = 0
    for _, r in ipairs(ro.rows) do
      timeouts = timeouts + (r.episode.errors.timeout or 0)
      for _, msg in ipairs(r.completion_messages) do
        if msg.role == "tool" then assert.is_true(msg.content == "ok" or msg.content == "Error: tool 'work' timed out after 0.5 s", msg.content) end
      end
    end
    assert.is_true(timeouts >= 1)
    assert.are.equal(timeouts, episodes.metrics(ro)["episodes/tool_errors"])
  end)

  it("play a Python environment class, one instance per episode, and an HTTP one", function()
    write(d .. "/env.py", [[
class Guess:
    def reset(self, prompt, secret):
        self.secret, self.turns = secret, 0
        return "guess: " + prompt
    def step(self, text):
        self.turns += 1
        right = str(self.secret) in text
        return ("right" if right else "no (%d)" % self.turns), right, (1.0 if right else 0.1)
]])
    local rows = { { prompt = "first", secret = 7 }, { prompt = "second", secret = 3 } }
    local port, pid = start_server(d)
    finally(function() os.execute("kill " .. pid) end)
    for _, env in ipairs({ "py:" .. d .. "/env.py:Guess", ("http://127.0.0.1:%s/env"):format(port) }) do
      local step = fake_step(m, tok, { environment = env })
      local setup = episodes.setup(step)
      local ro = episodes.rollout(step, rows, { step = 1, setup = setup })
      setup.registry:close()
      local multi = 0
      for k, r in ipairs(ro.rows) do
        local e = r.episode
        assert.are.equal(0, e.env_errors, tostring(e.env_error))
        assert.are.equal(ro.prompts[r.prompt].prompt, rows[r.prompt].prompt)
        -- each episode has its own count of turns: the replies number them from 1
        local n = 0
        for _, msg in ipairs(r.completion_messages) do
          if msg.role == "user" then
            n = n + 1
            assert.is_true(msg.content == "right" or msg.content == ("no (%d)"):format(n), msg.content)
          end
        end
        local s = 0
        for _, v in ipairs(e.turn_rewards) do s = s + v end
        assert.is_true(math.abs(s - e.env_reward) < 1e-12)
        assert.are.equal(e.turns, #e.turn_rewards)
        if e.turns > 1 then multi = multi + 1 end
        assert.matches("^guess: ", ro.rows[k].messages[1].content)
      end
      assert.is_true(multi >= 2)
    end
  end)

  it("end an episode whose environment worker fails, counting it, and go on", function()
    write(d .. "/badenv.py", [[
import os
class Env:
    def reset(self, **sample):
        return [{"role": "user", "content": sample["prompt"]}]
    def step(self, text):
        if len(text) % 2:
            raise RuntimeError("the game broke")
        return "again", False, 0.0
]])
    local step = fake_step(m, tok, { environment = "py:" .. d .. "/badenv.py:Env" })
    local setup = episodes.setup(step)
    local ro = episodes.rollout(step, prompts, { step = 1, setup = setup })
    setup.registry:close()
    local failed = 0
    for _, r in ipairs(ro.rows) do
      if r.episode.env_error then
        failed = failed + 1
        assert.matches("^environment step failed: RuntimeError: the game broke", r.episode.env_error)
      end
    end
    assert.is_true(failed >= 1)
    assert.are.equal(failed, episodes.metrics(ro)["episodes/env_errors"])
  end)
end)

describe("model:generate with rows waiting (turns.WAIT)", function()
  it("keeps a row paused over many steps and continues it later with the tokens it would have had at once", function()
    local m = tiny(40, 3)
    local prompts = { { 1, 5, 9, 13, 2 }, { 7, 3 } }
    local function obs(r, turn) local ids = {} for i = 1, (r + turn) % 4 + 1 do ids[i] = (3 * r + 7 * turn + i) % 40 end return ids end
    local function run(delay)
      local made, turn_of, waiting, steps, continued_at = {}, {}, {}, 0, {}
      local out = m:generate(prompts, { temperature = { 1, 0 }, max_new_tokens = 12, seed = 5, stop = { 4, 11, 17, 23, 30 },
        append_capacity = 8,   -- small: the cache is repacked while rows wait
        on_turn_end = function(events)
          local add = {}
          for _, e in ipairs(events) do
            local r = e.row
            made[r] = (made[r] or 0) + #e.tokens
            turn_of[r] = (turn_of[r] or 0) + 1
            if turn_of[r] <= 3 and made[r] < 12 then
              if delay[r] then
                waiting[r] = { at = steps + delay[r], ids = obs(r, turn_of[r]) }
                add[r] = turns.WAIT
              else
                add[r] = obs(r, turn_of[r])
              end
            end
          end
          return add
        end,
        on_wait = function(block)
          local got = {}
          for r, w in pairs(waiting) do
            if steps >= w.at or block then got[r] = w.ids; waiting[r] = nil; continued_at[#continued_at + 1] = steps end
          end
          return got
        end,
        on_token = function(s) steps = s end })
      return out, continued_at
    end
    local a = run({})
    local b, at = run({ [1] = 5, [3] = 9 })
    assert.is_true(#at >= 2)
    assert.is_true(b.decode_steps > a.decode_steps)
    for r = 1, 4 do
      assert.are.same(a.rows[r].tokens, b.rows[r].tokens)
      assert.are.same(a.rows[r].turn_ends, b.rows[r].turn_ends)
      for t = 1, #a.rows[r].logprobs do assert.is_true(math.abs(a.rows[r].logprobs[t] - b.rows[r].logprobs[t]) < 1e-4) end
    end
  end)
end)
