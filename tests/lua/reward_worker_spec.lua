-- Rewards outside Lua: "py:" files in a python3 worker, "cmd:" programs speaking the JSON-lines
-- protocol, and "http://" reward servers (a python3 http.server this spec starts on 127.0.0.1).
-- Needs only the system's python3 and its standard library.
local rewards = require("remax.step.rewards")
local rw = require("remax.step.reward_worker")
local support = require("support")
local tmpdir, write, has_python = support.tmpdir, support.write, support.has_python
local capture_error = support.error_of

local read = support.try_read   -- nil when the file does not exist

local function lines_of(path)
  local n = 0
  for _ in (read(path) or ""):gmatch("[^\n]+") do n = n + 1 end
  return n
end

-- The completions and batch a Lua reward gets, for three rows.
local function sample_batch()
  return { "first #### 72", "so it is 5", "no number here" },
    { prompt = { "p1", "p2", "p3" }, answer = { "#### 72", "#### 6", "#### 1" }, final_answer = { "72", "6", "1" },
      completion_ids = { { 1, 2 }, {}, { 3 } } }
end

local dir = tmpdir   -- removed when the spec file ends

describe("reward workers", function()
  if not has_python() then
    pending("python3 is not installed")
    return
  end

  it("scores with rewards/verify.py as the built-in Lua gsm8k reward does", function()
    local py = rewards.normalize("py:rewards/verify.py", 1, {})
    assert.are.equal("verify", py.name)
    assert.is_true(py.external)
    local lua = rewards.load_file("rewards/gsm8k.lua")
    local completions = { "#### 72", "The answer is 72", "#### 73", "$1,234 in total", "#### 3/4", "nothing", "12 then 7" }
    local batch = { prompt = {}, final_answer = { "72", "72", "72", "1234", "0.75", "5", "7" } }
    for i = 1, #completions do batch.prompt[i] = "q" .. i end
    local want = rewards.run_one(lua, completions, batch, {})
    local got = rewards.run_one(py, completions, batch, { timeout = 30, step = 1 })
    assert.are.same(want, got)
    assert.are.equal(1, got[1])   -- and the check is not vacuous: both kinds of answer occur
    assert.are.equal(0, got[3])
    py.close()
  end)

  it("calls a Python function as TRL does: completions, prompts and every column by keyword", function()
    local d = dir()
    write(d .. "/kw.py", [[
import sys
seen = []
def reward(completions, prompts, answer, completion_ids, **kwargs):
    print("reward called", file=sys.stdout)   # goes to stderr, not into the protocol
    assert len(prompts) == len(completions) == len(answer)
    seen.append(len(completions))
    return [len(c) + len(ids) + 100 * len(seen) if p != "p3" else None
            for c, p, ids in zip(completions, prompts, completion_ids)]

def other(completions, **kwargs):
    return [float(sorted(kwargs).index("final_answer"))] * len(completions)
]])
    local r = rewards.normalize("py:" .. d .. "/kw.py", 1, {})
    local c, b = sample_batch()
    local s = rewards.run_one(r, c, b, { timeout = 30 })
    assert.are.same({ #c[1] + 2 + 100, #c[2] + 100 }, { s[1], s[2] })
    assert.is_nil(s[3])
    -- the same process answers the next batch (its state goes on)
    s = rewards.run_one(r, c, b, { timeout = 30 })
    assert.are.equal(#c[1] + 2 + 200, s[1])
    r.close()
    local o = rewards.normalize("py:" .. d .. "/kw.py:other", 1, {})
    assert.are.equal("other", o.name)
    -- keyword arguments: answer, completion_ids, completion_messages, final_answer, log_extra, ... (prompt became prompts)
    assert.are.same({ 3, 3, 3 }, rewards.run_one(o, c, b, { timeout = 30 }))
    o.close()
  end)

  it("reports a Python exception, a load error, a bad score and a missing function clearly", function()
    local d = dir()
    write(d .. "/bad.py", [[
def reward(completions, **kw):
    raise ValueError("no column 'solution' in this dataset")
def strings(completions, **kw):
    return ["high"] * len(completions)
def short(completions, **kw):
    return [1.0]
]])
    local c, b = sample_batch()
    local r = rewards.normalize("py:" .. d .. "/bad.py", 1, {})
    local err = capture_error(rewards.run_one, r, c, b, { timeout = 30, step = 4 })
    assert.matches("reward 'bad' (py:" .. d .. "/bad.py) at step 4", err, 1, true)
    assert.matches("ValueError: no column 'solution' in this dataset", err, 1, true)
    r.close()
    r = rewards.normalize("py:" .. d .. "/bad.py:strings", 1, {})
    err = capture_error(rewards.run_one, r, c, b, { timeout = 30 })
    assert.matches("score 1 is 'high' (a str); expected a number or None", err, 1, true)
    r.close()
    r = rewards.normalize("py:" .. d .. "/bad.py:short", 1, {})
    err = capture_error(rewards.run_one, r, c, b, { timeout = 30 })
    assert.matches("answered 1 scores for 3 completions", err, 1, true)
    r.close()
    r = rewards.normalize("py:" .. d .. "/bad.py:nope", 1, {})
    err = capture_error(rewards.run_one, r, c, b, { timeout = 30 })
    assert.matches("has no function 'nope' (functions: reward, short, strings)", err, 1, true)
    write(d .. "/syntax.py", "def reward(completions:\n")
    r = rewards.normalize("py:" .. d .. "/syntax.py", 1, {})
    err = capture_error(rewards.run_one, r, c, b, { timeout = 30 })
    assert.matches("loading " .. d .. "/syntax.py", err, 1, true)
    assert.matches("SyntaxError", err, 1, true)
    err = capture_error(rewards.normalize, "py:" .. d .. "/missing.py", 1, {})
    assert.matches("reward py:" .. d .. "/missing.py: no such file", err, 1, true)
  end)

  it("restarts a worker that dies once, and stops naming it when it dies again", function()
    local d = dir()
    -- dies on its second batch in every process; counts the processes started in starts.txt
    write(d .. "/dies.py", ([[
open(%q, "a").write("start\n")
calls = 0
def reward(completions, **kw):
    global calls
    calls += 1
    if calls == 2:
        import os
        os._exit(3)
    return [0.5] * len(completions)
]]):format(d .. "/starts.txt"))
    local r = rewards.normalize("py:" .. d .. "/dies.py", 1, {})
    local c, b = sample_batch()
    assert.are.same({ 0.5, 0.5, 0.5 }, rewards.run_one(r, c, b, { timeout = 30 }))
    assert.are.equal(1, lines_of(d .. "/starts.txt"))
    -- second batch: the worker exits; a new one starts and answers the same batch
    assert.are.same({ 0.5, 0.5, 0.5 }, rewards.run_one(r, c, b, { timeout = 30 }))
    assert.are.equal(2, lines_of(d .. "/starts.txt"))
    -- the new worker's second batch: it dies again, which ends the run
    local saved = false
    local err = capture_error(rewards.run_one, r, c, b, { timeout = 30, step = 9,
      on_failure = function() saved = true end })
    assert.is_true(saved)
    assert.matches("reward 'dies' (py:" .. d .. "/dies.py) at step 9", err, 1, true)
    assert.matches("died again (exit status 3) after it was restarted once", err, 1, true)
    r.close()
  end)

  it("stops a worker that takes longer than reward_timeout", function()
    local d = dir()
    write(d .. "/slow.py", "import time\ndef reward(completions, **kw):\n    time.sleep(60)\n    return [0] * len(completions)\n")
    local r = rewards.normalize("py:" .. d .. "/slow.py", 1, {})
    local c, b = sample_batch()
    local t0 = os.time()
    local err = capture_error(rewards.run_one, r, c, b, { timeout = 1, step = 2 })
    assert.is_true(os.time() - t0 < 20)
    assert.matches("reward 'slow' (py:" .. d .. "/slow.py) at step 2: took over reward_timeout = 1 s", err, 1, true)
    r.close()
  end)

  it("scores with every worker at once: two 2-second workers take about 2 seconds, not 4", function()
    local d = dir()
    write(d .. "/nap.py", [==[
import time
def reward(completions, **kw):
    if completions[0] == "slow":
        time.sleep(2)
    return [1.0] * len(completions)
def other(completions, **kw):
    return reward(completions) if completions[0] != "slow" else [time.sleep(2) or 2.0] * len(completions)
]==])
    local list = rewards.load_all({ "py:" .. d .. "/nap.py", "py:" .. d .. "/nap.py:other" }, {})
    rewards.score(list, nil, { "fast" }, { prompt = { "p" } }, { timeout = 60 })   -- both workers started
    local now = require("remax.bind.clock").now
    local t0 = now()
    local per, total = rewards.score(list, { 1, 0.5 }, { "slow", "slow" }, { prompt = { "p", "q" } }, { timeout = 60 })
    local seconds = now() - t0
    assert.are.same({ 1, 1 }, per.nap)
    assert.are.same({ 2, 2 }, per.other)
    assert.are.same({ 2, 2 }, total)
    assert.is_true(seconds >= 2 and seconds < 3.6, ("took %.2f s"):format(seconds))
    for _, r in ipairs(list) do r.close() end
  end)

  it("scores an evaluation chunk while the next one generates, with the results of a Lua reward", function()
    local config = require("remax.settings.config")
    local trainer = require("remax.run.run")
    local d = dir()
    write(d .. "/len.py", "def reward(completions, completion_ids, **kw):\n    return [len(ids) % 3 for ids in completion_ids]\n")
    write(d .. "/len.lua", "return { name = 'len', fn = function(c, b) local s = {} for i in ipairs(c) do s[i] = #b.completion_ids[i] % 3 end return s end }")
    support.prompts(d .. "/p.jsonl", 8)
    local function new(reward)
      return trainer.new(config.resolve({
        model_config = support.tiny_model(),
        data = d .. "/p.jsonl", eval_data = d .. "/p.jsonl", eval_size = 7, per_device_eval_batch_size = 2,
        rewards = { reward }, chat_template = "plain", max_completion_length = 8, max_steps = 1,
        output_dir = d .. "/runs", save_steps = 0, log_completions = 0, seed = 7,
      }), { quiet = true, signals = false })
    end
    local t = new("py:" .. d .. "/len.py")
    -- watch how many batches are on their way to the worker at once
    local impl, most = t.stepper:reward_functions()[1].impl, 0
    local send = impl.send
    impl.send = function(self, ...)
      send(self, ...)
      most = math.max(most, #self.queue)
    end
    local e = t:evaluate()
    assert.are.equal(2, most)   -- chunk k+1 was handed over before chunk k's scores were read
    local want = new(d .. "/len.lua"):evaluate()
    assert.are.equal(7, e.n)
    assert.are.equal(want.reward, e.reward)
    assert.are.equal(want.accuracy, e.accuracy)
    t.stepper:reward_functions()[1].close()
  end)

  it("runs a cmd: program speaking the JSON-lines protocol, and names a malformed answer", function()
    local d = dir()
    write(d .. "/echo_len.py", [==[
import sys, json
for line in sys.stdin:
    req = json.loads(line)
    if req["completions"][0] == "garbage":
        print("this is not json", flush=True)
        continue
    print(json.dumps({"id": req["id"], "scores": [len(c) for c in req["completions"]]}), flush=True)
]==])
    local r = rewards.normalize("cmd:python3 " .. d .. "/echo_len.py", 1, {})
    assert.are.equal("echo_len", r.name)
    local c, b = sample_batch()
    assert.are.same({ #c[1], #c[2], #c[3] }, rewards.run_one(r, c, b, { timeout = 30 }))
    local err = capture_error(rewards.run_one, r, { "garbage" }, { prompt = { "p" } }, { timeout = 30 })
    assert.matches("answered something that is not JSON: this is not json", err, 1, true)
    r.close()
    err = capture_error(rewards.run_one, rewards.normalize("cmd:exit 7", 1, {}), c, b, { timeout = 30 })
    assert.matches("died again (exit status 7)", err, 1, true)
  end)

  it("posts batches to a reward server on 127.0.0.1 and names its failures", function()
    local d = dir()
    write(d .. "/server.py", [[
import json, sys, os
from http.server import HTTPServer, BaseHTTPRequestHandler
class H(BaseHTTPRequestHandler):
    def log_message(self, *a): pass
    def do_POST(self):
        req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path == "/fail":
            body, code = b"model not loaded", 503
        else:
            scores = [len(c) + (10 if a == "#### 72" else 0) for c, a in zip(req["completions"], req["batch"]["answer"])]
            body, code = json.dumps({"id": req["id"], "scores": scores}).encode(), 200
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
srv = HTTPServer(("127.0.0.1", 0), H)
with open(sys.argv[1] + ".tmp", "w") as f:
    f.write("%d %d\n" % (srv.server_address[1], os.getpid()))
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
srv.serve_forever()
]])
    os.execute(("python3 %s %s >/dev/null 2>&1 &"):format(d .. "/server.py", d .. "/port"))
    local port, pid
    for _ = 1, 200 do
      local t = read(d .. "/port")
      if t then port, pid = t:match("(%d+) (%d+)") break end
      os.execute("sleep 0.05")
    end
    assert.is_not_nil(port, "the test server did not start")
    finally(function() os.execute("kill " .. pid) end)
    local r = rewards.normalize(("http://127.0.0.1:%s/score"):format(port), 1, {})
    assert.are.equal("score", r.name)
    local c, b = sample_batch()
    assert.are.same({ #c[1] + 10, #c[2], #c[3] }, rewards.run_one(r, c, b, { timeout = 30 }))
    local bad = rewards.normalize(("http://127.0.0.1:%s/fail"):format(port), 1, {})
    local err = capture_error(rewards.run_one, bad, c, b, { timeout = 30 })
    assert.matches("answered HTTP/1.0 503", err, 1, true)
    assert.matches("model not loaded", err, 1, true)
    os.execute("kill " .. pid)
    os.execute("sleep 0.2")
    err = capture_error(rewards.run_one, r, c, b, { timeout = 30, step = 3 })
    assert.matches(("reward 'score' (http://127.0.0.1:%s/score) at step 3: cannot connect to 127.0.0.1:%s"):format(port, port), err, 1, true)
    assert.matches("(tried twice)", err, 1, true)
    err = capture_error(rewards.normalize, "https://example.com/score", 1, {})
    assert.matches("https is not supported", err, 1, true)
  end)

  it("passes a TRL-signature reward the step's arguments at start and trainer_state in every step", function()
    local config = require("remax.settings.config")
    local trainer = require("remax.run.run")
    local d = dir()
    -- completion_messages exists only for conversational prompts, so the first-rows check must
    -- pass it as a step does; trainer_state carries TRL's names
    write(d .. "/trl.py", ([[
import json
def reward(completions, completion_messages, ground_truth, trainer_state, **kwargs):
    assert len(completion_messages) == len(completions) == len(ground_truth)
    assert completion_messages[0][0]["role"] == "assistant"
    assert "prompt_ids" in kwargs and "completion_ids" in kwargs and "greedy" in kwargs and "finish" in kwargs
    with open(%q, "a") as f:
        f.write(json.dumps({"global_step": trainer_state.global_step, "max_steps": trainer_state.max_steps,
                            "epoch": trainer_state.epoch, "n": len(completions)}) + "\n")
    return [float(trainer_state.global_step)] * len(completions)
]]):format(d .. "/calls.jsonl"))
    local lines = {}
    for i = 1, 8 do
      lines[i] = ('{"prompt": [{"role": "user", "content": "say %d"}], "ground_truth": "%d"}'):format(i, i)
    end
    write(d .. "/p.jsonl", table.concat(lines, "\n") .. "\n")
    local cfg = config.resolve({
      model_config = support.tiny_model(),
      data = d .. "/p.jsonl", rewards = { "py:" .. d .. "/trl.py" }, chat_template = "plain",
      num_generations = 2, max_completion_length = 4, per_device_train_batch_size = 2, learning_rate = 1e-3,
      max_steps = 2, eval_size = 0, output_dir = d .. "/runs", save_steps = 0, log_completions = 0, seed = 3,
    })
    local t = trainer.new(cfg, { quiet = true, signals = false })   -- runs the first-rows check
    local m1 = t:train_step()
    local m2 = t:train_step()
    t.stepper:reward_functions()[1].close()
    local calls = {}
    for l in read(d .. "/calls.jsonl"):gmatch("[^\n]+") do calls[#calls + 1] = require("cjson").decode(l) end
    assert.are.equal(3, #calls)   -- the check, then steps 1 and 2
    assert.are.same({ 0, 2, 0 }, { calls[1].global_step, calls[1].max_steps, calls[1].epoch })
    assert.are.same({ 1, 2 }, { calls[2].global_step, calls[3].global_step })
    assert.are.equal(2, calls[3].max_steps)
    assert.are.equal(2 * 2 / 8, calls[3].epoch)   -- 2 steps of 2 prompts over 8 rows
    assert.are.equal(1, m1["reward/trl"])
    assert.are.equal(2, m2["reward/trl"])
  end)

  it("trains with a Python reward, and stops the run after a checkpoint when the worker fails", function()
    local config = require("remax.settings.config")
    local trainer = require("remax.run.run")
    local d = dir()
    -- the fraction of lowercase letters, as the trainer spec's Lua reward
    write(d .. "/lower.py", ([[
import os
def reward(completions, completion_ids, **kw):
    if os.path.exists(%q):
        raise RuntimeError("judge unavailable")
    return [sum(97 <= i <= 122 for i in ids) / max(1, len(ids)) for ids in completion_ids]
]]):format(d .. "/broken"))
    support.prompts(d .. "/p.jsonl", 16)
    local cfg = config.resolve({
      model_config = support.tiny_model(),
      data = d .. "/p.jsonl", rewards = { "py:" .. d .. "/lower.py" }, chat_template = "plain",
      num_generations = 4, max_completion_length = 8, per_device_train_batch_size = 4, learning_rate = 1e-2,
      max_steps = 3, eval_size = 0, output_dir = d .. "/runs", save_steps = 0, log_completions = 0, seed = 7,
    })
    local t = trainer.new(cfg, { quiet = true, signals = false })
    local m = t:train_step()
    assert.is_number(m["reward/lower"])
    assert.is_true(m["reward/lower"] >= 0 and m["reward/lower"] <= 1)
    -- hot reload: an edited file starts a new worker with the new code
    require("remax.run.reload").snapshot(t)
    local old_worker = t.stepper:reward_functions()[1]
    write(d .. "/lower.py", ([[
import os
def reward(completions, **kw):
    if os.path.exists(%q):
        raise RuntimeError("judge unavailable")
    return [0.25] * len(completions)
]]):format(d .. "/broken"))
    assert.are.equal(1, t:check_reload())
    assert.is_nil(old_worker.impl.proc)   -- the old worker is stopped
    m = t:train_step()
    assert.are.equal(0.25, m["reward/lower"])
    write(d .. "/broken", "")
    local err = capture_error(t.train_step, t)
    assert.matches("reward 'lower' (py:" .. d .. "/lower.py) at step 3", err, 1, true)
    assert.matches("RuntimeError: judge unavailable", err, 1, true)
    local _, step = t.run:latest_checkpoint()
    assert.are.equal(2, step)
    t.stepper:reward_functions()[1].close()
  end)
end)
