-- report_to: TensorBoard event files, read back by TensorBoard itself (tests/lua/tb_ref.py:
-- tensorboard's EventAccumulator, the data the Scalars dashboard is served, and its own record
-- reader), metrics.csv (read back by Python's csv module), and the refusal of services.
local config = require("remax.settings.config")
local runs = require("remax.run.folder")
local tensorboard = require("remax.run.tensorboard")
local trl = require("remax.run.trl_names").tag
local cjson = require("cjson")
local support = require("support")
local tmpdir, has_python = support.tmpdir, support.has_python

local function capture(cmd)
  local p = io.popen(cmd)
  local out = p:read("*a")
  local ok = p:close()
  return out, ok
end

local function read_csv(path)
  local out, ok = capture(("python3 -c 'import csv, json, sys; print(json.dumps(list(csv.DictReader(open(sys.argv[1])))))' '%s' 2>&1")
    :format(path))
  assert.is_true(ok == true or ok == 0, out)
  return cjson.decode(out)
end

local dir = tmpdir   -- removed when the spec file ends

---------------------------------------------------------------------------- the event folders

-- The folders TensorBoard reads, made once: "trained" (a 3-step trainer run, report_to all),
-- "killed" (a run killed by SIGKILL after step 4, checkpoint at step 2, resumed for steps 3-5),
-- "restarted" (steps 1-2, then a resume without a checkpoint logging step 1 again).
local made
local function folders()
  if made then return made end
  made = {}
  do
    local trainer = require("remax.run.run")
    local d = support.train_dir(16)
    local cfg = config.resolve(support.run_settings(d, {
      model_config = support.tiny_model(), num_generations = 4, max_completion_length = 8,
      per_device_train_batch_size = 4, learning_rate = 1e-2, max_steps = 3, run_name = "tb", seed = 7, report_to = "all",
    }))
    local t = trainer.new(cfg, { quiet = true, signals = false })
    for _ = 1, 3 do t:train_step() end
    made.trained = { dir = d .. "/runs/tb", rows = t.run:metrics() }
  end
  do
    local d = dir()
    local child = [[
      local runs = require("remax.run.folder")
      local run = runs.open(arg[1], { report_to = { "tensorboard" } })
      for step = 1, 4 do
        run:log_metrics(step, { reward = step + 0.25 })
        if step == 2 then run:save_checkpoint(2, nil, {}) end
      end
      local ffi = require("ffi")
      ffi.cdef("int getpid(void); int kill(int pid, int sig);")
      ffi.C.kill(ffi.C.getpid(), 9)
    ]]
    support.write(d .. "/child.lua", child)
    local rc = os.execute(("{ luajit -e 'package.path = \"lua/?.lua;lua/?/init.lua;\" .. package.path' %s %s; } 2>/dev/null")
      :format(support.shell_quote(d .. "/child.lua"), support.shell_quote(d .. "/r")))
    local again = runs.open(d .. "/r", { resume = true, report_to = { "tensorboard" } })
    for step = 3, 5 do again:log_metrics(step, { reward = step + 0.5 }) end
    again:close()
    made.killed = { dir = d .. "/r", child_rc = rc, resume_step = again.resume_step }
  end
  do
    local d = dir()
    local run = runs.open(d .. "/r", { report_to = { "tensorboard" } })
    run:log_metrics(1, { reward = 0.5, loss = 1.25 })
    run:log_metrics(2, { reward = 0.75, loss = 1.0 })
    run:log_metrics(2, { eval_accuracy = 0.3, note = "a note" })
    run:close()
    local again = runs.open(d .. "/r", { resume = true, report_to = { "tensorboard" } })
    again:log_metrics(1, { reward = 0.25 })
    again:close()
    made.restarted = { dir = d .. "/r" }
  end
  return made
end

-- What TensorBoard shows for each folder (tb_ref.py's view), all read in one Python process.
local views
local function tensorboard_view(name)
  if not views then
    local f, dirs = folders(), {}
    for _, k in ipairs({ "trained", "killed", "restarted" }) do dirs[#dirs + 1] = f[k].dir .. "/tensorboard" end
    local all = cjson.decode(support.run_reference("tests/lua/tb_ref.py", unpack(dirs)))
    views = {}
    for k, v in pairs(f) do views[k] = all[v.dir .. "/tensorboard"] end
  end
  local v = views[name]
  assert.are.same({}, v.read_errors)
  return v
end

-- {tag: [[step, value], ...]} of a view's scalars, without wall times.
local function steps_values(scalars)
  local out = {}
  for tag, list in pairs(scalars) do
    out[tag] = {}
    for i, sv in ipairs(list) do out[tag][i] = { sv[1], sv[2] } end
  end
  return out
end

-- The kinds of a file's events in order, as "file_version brain.Event:2", "session_log START at 3",
-- "summary at 3".
local function kinds(file)
  local out = {}
  for i, e in ipairs(file.events) do
    out[i] = e.what == "file_version" and "file_version " .. e.file_version
      or e.what == "session_log" and ("session_log %s at %d"):format(e.session_log, e.step)
      or ("%s at %d"):format(e.what, e.step)
  end
  return out
end

local function near(a, b)   -- a float32 against the number it was written from
  if b ~= b then return a ~= a end
  return math.abs(a - b) <= 1e-6 * math.max(1, math.abs(b))
end

describe("report_to", function()
  it("computes CRC-32C as the standard check value and TFRecord's mask", function()
    assert.are.equal(0xE3069283, tensorboard.crc32c("123456789"))
    assert.are.equal(0, tensorboard.crc32c(""))
    -- the mask is a rotation plus a constant: undo it and compare
    local c = tensorboard.crc32c("remax")
    local m = tensorboard.masked_crc("remax")
    local rot = (m - 0xa282ead8) % 2 ^ 32
    local back = bit.bor(bit.lshift(rot, 15), bit.rshift(rot, 17))
    assert.are.equal(c, back < 0 and back + 2 ^ 32 or back)
  end)

  it("refuses wandb and other services with the reason, and unknown names", function()
    local ok, err = pcall(config.resolve, { report_to = "wandb" })
    assert.is_false(ok)
    assert.matches("report_to = wandb: Weights & Biases is not supported (the engine has no network dependency)", err, 1, true)
    assert.matches("metrics.jsonl", err, 1, true)
    assert.matches("report_to = tensorboard", err, 1, true)
    ok, err = pcall(config.resolve, {}, config.parse_args({ "--report_to", "tensorboard,tensorbord" }))
    assert.is_false(ok)
    assert.matches("report_to = tensorbord: expected tensorboard, csv, none or all", err, 1, true)
    assert.are.same({ "tensorboard", "csv" }, config.resolve({}, config.parse_args({ "--report_to", "tensorboard,csv" })).report_to)
    assert.are.same({ "none" }, config.resolve({}).report_to)
  end)

  it("writes every step's metrics as the scalars TensorBoard shows, under TRL's names", function()
    local py = support.reference("tensorboard"); if not py then return end
    local rows = folders().trained.rows
    assert.are.equal(3, #rows)
    local v = tensorboard_view("trained")
    assert.are.equal(2, v.file_version)
    assert.are.equal(1, #v.files)
    assert.are.same({ "file_version brain.Event:2", "session_log START at 1", "summary at 1" }, { unpack(kinds(v.files[1]), 1, 3) })
    -- every number of every row, at its step, and nothing else: [[step, value], ...] per tag
    local want = {}
    for _, row in ipairs(rows) do
      for k, x in pairs(row) do
        if k ~= "step" and type(x) == "number" then
          want[trl(k)] = want[trl(k)] or {}
          table.insert(want[trl(k)], { row.step, x })
        end
      end
    end
    local checked = 0
    for _, shown in ipairs({ steps_values(v.scalars), v.dashboard }) do
      local tags, want_tags = {}, {}
      for tag in pairs(shown) do tags[#tags + 1] = tag end
      for tag in pairs(want) do want_tags[#want_tags + 1] = tag end
      table.sort(tags)
      table.sort(want_tags)
      assert.are.same(want_tags, tags)
      for tag, list in pairs(want) do
        assert.are.equal(#list, #shown[tag], tag)
        for i, sv in ipairs(list) do
          assert.are.equal(sv[1], shown[tag][i][1], tag)
          assert.is_true(near(shown[tag][i][2], sv[2]), ("%s at step %d: TensorBoard shows %s, metrics.jsonl has %s"):format(
            tag, sv[1], tostring(shown[tag][i][2]), tostring(sv[2])))
          checked = checked + 1
        end
      end
    end
    assert.is_true(checked > 60)
    for _, list in pairs(v.scalars) do
      for _, sv in ipairs(list) do assert.is_true(math.abs(sv[3] - os.time()) < 3600) end
    end
    -- TRL's names, as transformers' TensorBoard callback writes them
    for _, tag in ipairs({ "train/reward", "train/rewards/lower/mean", "train/kl", "train/loss", "train/grad_norm",
      "train/learning_rate", "train/completions/mean_length", "train/completions/max_length",
      "train/completions/clipped_ratio", "train/reward_std" }) do
      assert.is_not_nil(v.dashboard[tag], tag)
    end
    assert.is_nil(v.dashboard["reward"])
    assert.are.same({}, v.purges)
    assert.are.same({}, v.dashboard_purges)
  end)

  it("leaves one value per step in TensorBoard after a resume that follows kill -9", function()
    -- the first process logs steps 1-4, checkpoints step 2 and dies by SIGKILL after step 4;
    -- the resumed one re-runs steps 3-5. Its event file starts a session at step 3, and
    -- TensorBoard (the accumulator and the dashboard alike) drops the first process's steps 3-4.
    local py = support.reference("tensorboard"); if not py then return end
    local k = folders().killed
    assert.is_true(k.child_rc ~= 0 and k.child_rc ~= true, "the child was meant to die by SIGKILL")
    assert.are.equal(2, k.resume_step)
    local v = tensorboard_view("killed")
    local want = { { 1, 1.25 }, { 2, 2.25 }, { 3, 3.5 }, { 4, 4.5 }, { 5, 5.5 } }
    assert.are.same(want, steps_values(v.scalars)["train/reward"])
    assert.are.same(want, v.dashboard["train/reward"])
    assert.are.equal(2, #v.files)
    assert.are.same({ "file_version brain.Event:2", "session_log START at 1", "summary at 1", "summary at 2", "summary at 3",
      "summary at 4" }, kinds(v.files[1]))
    assert.are.same({ "file_version brain.Event:2", "session_log START at 3", "summary at 3", "summary at 4", "summary at 5" },
      kinds(v.files[2]))
    -- the restart as TensorBoard reports it: one purge, at step 3, of the two orphaned values
    for _, p in ipairs({ v.purges, v.dashboard_purges }) do
      assert.are.equal(1, #p)
      assert.are.equal(3, p[1].step)
      assert.are.equal(2, p[1].removed)
    end
  end)

  it("starts a new event file on resume whose session drops what the earlier process logged from there on", function()
    -- steps 1-2 (reward, loss, and an eval value at step 2), then a resume without a
    -- checkpoint: it continues after step 0, so TensorBoard keeps the new step 1 alone
    local py = support.reference("tensorboard"); if not py then return end
    local v = tensorboard_view("restarted")
    assert.are.equal(2, #v.files)
    assert.are.same({ "file_version brain.Event:2", "session_log START at 1", "summary at 1" }, kinds(v.files[2]))
    assert.are.same({ train_reward = 0.5, train_loss = 1.25 },
      { train_reward = v.files[1].events[3].values["train/reward"], train_loss = v.files[1].events[3].values["train/loss"] })
    for _, shown in ipairs({ steps_values(v.scalars), v.dashboard }) do
      assert.are.same({ { 1, 0.25 } }, shown["train/reward"])
      assert.are.same({}, shown["train/loss"] or {})
      assert.are.same({}, shown["eval/accuracy"] or {})
    end
    assert.are.equal(5, v.purges[1].removed)
    assert.are.equal(5, v.dashboard_purges[1].removed)
  end)

  if not has_python() then
    pending("python3 is not installed: metrics.csv is read back with its csv module")
    return
  end

  it("writes every step's metrics as metrics.csv rows", function()
    local f = folders().trained
    local csv = read_csv(f.dir .. "/metrics.csv")
    assert.are.equal(#f.rows, #csv)
    for i, row in ipairs(f.rows) do
      assert.are.equal(tostring(row.step), csv[i].step)
      for k, v in pairs(row) do
        if type(v) == "number" and v == v then
          assert.is_true(math.abs(tonumber(csv[i][trl(k)]) - v) <= 1e-9 * math.max(1, math.abs(v)), k)
        end
      end
    end
  end)

  it("widens metrics.csv when a metric first appears late, and keeps it equal to metrics.jsonl on resume", function()
    local d = dir()
    local run = runs.open(d .. "/r", { report_to = { "csv" } })
    run:log_metrics(1, { reward = 0.5, loss = 1.25 })
    run:log_metrics(2, { reward = 0.75, loss = 1.0 })
    run:log_metrics(2, { eval_accuracy = 0.3, note = "a, \"quoted\" text" })
    run:close()
    local csv = read_csv(d .. "/r/metrics.csv")
    assert.are.equal(3, #csv)
    assert.are.same({ step = "1", ["train/reward"] = "0.5", ["train/loss"] = "1.25", ["eval/accuracy"] = "", ["train/note"] = "" }, csv[1])
    assert.are.same({ step = "2", ["train/reward"] = "", ["train/loss"] = "", ["eval/accuracy"] = "0.3",
      ["train/note"] = "a, \"quoted\" text" }, csv[3])
    -- a resumed run (no checkpoint here: it continues after step 0) keeps metrics.csv equal to metrics.jsonl
    local again = runs.open(d .. "/r", { resume = true, report_to = { "csv" } })
    again:log_metrics(1, { reward = 0.25 })
    again:close()
    csv = read_csv(d .. "/r/metrics.csv")
    assert.are.equal(1, #csv)
    assert.are.equal("0.25", csv[1]["train/reward"])
  end)
end)

describe("the HTML report's episodes", function()
  -- completions.jsonl of two steps of tool-using episodes; the report shows the last step's
  local function episode(reward, greedy, tool_text, extra)
    local e = { turns = 2, tool_calls = 1, tool_errors = tool_text:find("^Error") and 1 or 0, tool_time = 0.01, model_tokens = 9,
      obs_tokens = 5, errors = tool_text:find("^Error") and { timeout = 1 } or {}, turn_rewards = {} }
    for k, v in pairs(extra or {}) do e[k] = v end
    return { prompt = "What is 6*7?", completion = "It is 42.", reward = reward, advantage = reward - 0.5, greedy = greedy,
      rewards = {}, messages = {
        { role = "assistant", content = '<tool_call>{"name": "calculator", "arguments": {"expression": "6*7"}}</tool_call>' },
        { role = "tool", name = "calculator", content = tool_text },
        { role = "assistant", content = "It is 42." } }, episode = e }
  end

  it("shows a few episodes of the last step: the greedy one, the best, the worst, with their turns and tool results", function()
    local run = runs.open(dir() .. "/r", { config = {} })
    run:log_metrics(1, { reward = 0.1 })
    run:log_completions(1, { episode(0.3, false, "step-one result") })
    run:log_metrics(2, { reward = 0.5 })
    local rows = { episode(0.5, false, "42"), episode(0.9, false, "<b>42</b>"), episode(0.2, false, "Error: tool 'calculator' timed out after 10 s"),
      episode(0.4, false, "middle"), episode(0.6, false, "also middle"), episode(0.55, true, "42 (greedy)", { env_reward = 0.25, turn_rewards = { 0.25 } }) }
    run:log_completions(2, rows)
    run:plot()
    local html = support.read(run.dir .. "/index.html")
    assert.truthy(html:find("<h2>Episodes (step 2)</h2>", 1, true))
    assert.is_nil(html:find("step-one result", 1, true))      -- only the last step
    assert.is_nil(html:find("<b>42</b>", 1, true))            -- escaped
    assert.truthy(html:find("&lt;b&gt;42&lt;/b&gt;", 1, true))
    assert.truthy(html:find("Error: tool &#39;calculator&#39; timed out after 10 s", 1, true))
    assert.truthy(html:find("tool result (calculator)", 1, true))
    assert.truthy(html:find("(timeout 1)", 1, true))
    assert.truthy(html:find("environment reward 0.25", 1, true))
    assert.truthy(html:find("6 episodes in this step", 1, true))
    -- four shown, in order: greedy, best (0.9), worst (0.2), then the first not shown (0.5)
    local shown = {}
    for what, reward in html:gmatch("<p><b>(%a+ ?%a*)</b> reward ([%d%.]+),") do shown[#shown + 1] = what .. " " .. reward end
    assert.are.same({ "greedy episode 0.55", "episode 0.9", "episode 0.2", "episode 0.5" }, shown)
    -- it reads back as well-formed HTML (Python's parser, counting the episode blocks)
    if has_python() then
      local out = capture(("python3 -c '%s' '%s' 2>&1"):format([[
import sys
from html.parser import HTMLParser
class P(HTMLParser):
    def __init__(self):
        super().__init__(); self.stack = []; self.eps = 0; self.bad = 0
    def handle_starttag(self, tag, attrs):
        if tag in ("meta", "img", "br"): return
        self.stack.append(tag)
        if tag == "div" and ("class", "ep") in attrs: self.eps += 1
    def handle_endtag(self, tag):
        if not self.stack or self.stack.pop() != tag: self.bad += 1
p = P(); p.feed(open(sys.argv[1]).read()); print(p.eps, p.bad, len(p.stack))]], run.dir .. "/index.html"))
      assert.are.equal("4 0 0", out:match("^%S+ %S+ %S+"))
    end
    -- a run without episodes has no such section
    local plain = runs.open(dir() .. "/p", { config = {} })
    plain:log_metrics(1, { reward = 0.1 })
    plain:log_completions(1, { { prompt = "p", completion = "c", reward = 1 } })
    plain:plot()
    assert.is_nil(support.read(plain.dir .. "/index.html"):find("Episodes", 1, true))
  end)
end)
