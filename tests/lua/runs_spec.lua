local ffi = require("ffi")
local remax = require("remax")
local runs = require("remax.run.folder")
local fs = runs.fs

local support = require("support")
local tmpdir, read, write = support.tmpdir, support.read, support.write

local tiny = {
  architectures = { "Qwen2ForCausalLM" }, vocab_size = 40, hidden_size = 16, intermediate_size = 24,
  num_hidden_layers = 2, num_attention_heads = 4, num_key_value_heads = 2, max_position_embeddings = 64,
  rms_norm_eps = 1e-6, rope_theta = 10000, tie_word_embeddings = false,
}

-- Every byte of a tensor, for bit-exact comparisons.
local function bytes(t)
  return ffi.string(t.data, tonumber(t.numel) * ffi.sizeof("float"))
end

describe("runs", function()
  local root
  before_each(function() root = tmpdir() end)
  after_each(function() fs.remove_tree(root) end)

  it("creates the run folder and writes the resolved config", function()
    local reward = function() return {} end
    local run = runs.open(root .. "/runs/demo", {
      config = { lr = 1e-6, model = "Qwen/x", rewards = { reward }, stop = {}, nested = { a = 1 / 0 } },
    })
    assert.is_true(fs.is_dir(root .. "/runs/demo"))
    local cfg = run:read_config()
    assert.are.equal(1e-6, cfg.lr)
    assert.are.equal("Qwen/x", cfg.model)
    assert.are.equal(math.huge, cfg.nested.a)
    -- a function in a recipe's config is recorded by where it was defined
    assert.matches("^function .*runs_spec%.lua:%d+$", cfg.rewards[1])
    -- no temporary file remains after the atomic write
    for _, name in ipairs(fs.list_dir(root .. "/runs/demo")) do assert.is_nil(name:match("%.tmp$")) end
  end)

  it("appends metrics with a flush per line and reads them back", function()
    local run = runs.open(root .. "/r", { config = {} })
    run:log_metrics(1, { reward = 0.25, kl = 0.001, loss = 0 / 0 })
    -- flushed: another reader sees the line while the run's handle is still open
    local text = read(root .. "/r/metrics.jsonl")
    assert.are.equal(1, select(2, text:gsub("\n", "")))
    assert.matches('^{"step":1,', text)
    run:log_metrics(2, { reward = 0.5, reward_greedy = 0.4, eval_accuracy = 0.75, tag = "a\"b\n" })
    local rows = run:metrics()
    assert.are.equal(2, #rows)
    assert.are.same({ 1, 0.25, 0.001 }, { rows[1].step, rows[1].reward, rows[1].kl })
    assert.is_true(rows[1].loss ~= rows[1].loss, "NaN reads back as NaN")
    assert.are.equal("a\"b\n", rows[2].tag)
    assert.are.equal(0.75, rows[2].eval_accuracy)
    run:close()
  end)

  it("logs completions as JSON lines, with invalid UTF-8 made valid", function()
    local run = runs.open(root .. "/r", { config = {} })
    run:log_completions(3, {
      { prompt = "2+2?", completion = "4", reward = 1, rewards = { correct = 1 }, advantage = 0.5, greedy = false },
      { prompt = "2+3?", completion = "cut \xE2\x82", reward = 0, rewards = { correct = 0 }, advantage = 0, greedy = true },
    })
    local rows = runs.read_jsonl(root .. "/r/completions.jsonl")
    assert.are.equal(2, #rows)
    assert.are.same({ 3, "4", 1, 0.5, false }, { rows[1].step, rows[1].completion, rows[1].rewards.correct,
      rows[1].advantage, rows[1].greedy })
    assert.are.equal("cut \239\191\189\239\191\189", rows[2].completion)
    assert.is_true(rows[2].greedy)
  end)

  it("refuses to mix a new run into a folder holding one, unless resuming or overwriting", function()
    local run = runs.open(root .. "/r", { config = {} })
    run:log_metrics(1, { reward = 1 })
    run:close()
    local ok, err = pcall(runs.open, root .. "/r", { config = {} })
    assert.is_false(ok)
    assert.matches("already holds a run", err)
    local again = runs.open(root .. "/r", { config = {}, overwrite = true })
    assert.are.equal(0, #again:metrics())
  end)

  it("round-trips a checkpoint bit for bit: model, optimizer tensors and state", function()
    local run = runs.open(root .. "/r", { config = { save_total_limit = nil } })
    local model = remax.model.new(tiny, { seed = 7 })
    local params, grads = model:params(), model:grads()
    for _, g in pairs(grads) do g:normal_(3, 0, 1, 0.1) end
    local opt = remax.optim.adamw(params, grads, { lr = 1e-2 })
    opt:step()
    local ostate = opt:state()
    local state = { tensors = ostate.tensors, optimizer_step = ostate.step, lr = 0.1 + 0.2,
      sampler = { epoch = 2, index = 17, seed = 2 ^ 40 + 3 }, best = -1 / 0 }
    assert.is_nil(run:latest_checkpoint())
    local dir = run:save_checkpoint(5, model, state)
    assert.are.equal(root .. "/r/checkpoints/step-5", dir)
    local latest, step = run:latest_checkpoint()
    assert.are.equal(dir, latest)
    assert.are.equal(5, step)

    local st, tensors, model_dir = run:load_checkpoint(latest)
    assert.are.equal(5, st.step)
    assert.are.equal(0.1 + 0.2, st.lr)          -- 17 digits: exact
    assert.are.equal(2 ^ 40 + 3, st.sampler.seed)
    assert.are.equal(-math.huge, st.best)
    assert.are.equal(1, st.optimizer_step)
    assert.is_nil(st.tensors)
    local n = 0
    for name, t in pairs(ostate.tensors) do
      n = n + 1
      assert.is_truthy(tensors[name], name)
      assert.are.same(t:size(), tensors[name]:size())
      assert.is_true(bytes(t) == bytes(tensors[name]), name .. " differs")
    end
    local m = 0
    for _ in pairs(tensors) do m = m + 1 end
    assert.are.equal(n, m)

    local loaded = remax.model.load(model_dir)
    for name, p in pairs(params) do
      assert.is_true(bytes(p) == bytes(loaded:param(name)), name .. " differs")
    end
    -- the optimizer takes its state back
    local opt2 = remax.optim.adamw(loaded:params(), loaded:grads(), { lr = 1e-2 })
    opt2:load_state({ step = st.optimizer_step, tensors = tensors })
    assert.are.equal(1, opt2.step_count)
    -- the model did not adopt the (renamed) temporary folder as its source
    assert.is_nil(model.source_dir)
  end)

  it("keeps only the save_total_limit newest checkpoints", function()
    local run = runs.open(root .. "/r", { config = { save_total_limit = 2 } })
    local model = remax.model.new(tiny, { seed = 1 })
    for _, s in ipairs({ 10, 20, 30, 40 }) do run:save_checkpoint(s, model, { n = s }) end
    local steps = {}
    for _, c in ipairs(run:checkpoints()) do steps[#steps + 1] = c.step end
    assert.are.same({ 30, 40 }, steps)
    assert.is_false(fs.is_dir(root .. "/r/checkpoints/step-10"))
    -- an explicit option wins over the config; nil keeps all
    local all = runs.open(root .. "/s", { config = {} })
    for _, s in ipairs({ 1, 2, 3 }) do all:save_checkpoint(s, nil, {}) end
    assert.are.equal(3, #all:checkpoints())
    assert.has_error(function() runs.open(root .. "/t", { save_total_limit = 0 }) end)
  end)

  it("ignores and cleans a temporary folder a crash left behind", function()
    local run = runs.open(root .. "/r", { config = {} })
    run:save_checkpoint(2, nil, { x = 1 })
    -- a crash while writing step 4: its temporary folder is complete-looking but not renamed
    local tmp = root .. "/r/checkpoints/.tmp-step-4"
    fs.mkdir_p(tmp)
    write(tmp .. "/trainer_state.json", '{"step":4}')
    write(tmp .. "/model.safetensors", "half a fi")
    local dir, step = run:latest_checkpoint()
    assert.are.equal(2, step)
    assert.are.equal(root .. "/r/checkpoints/step-2", dir)
    -- a bare step folder without trainer_state.json is not a checkpoint either
    fs.mkdir_p(root .. "/r/checkpoints/step-9")
    assert.are.equal(2, select(2, run:latest_checkpoint()))
    fs.remove_tree(root .. "/r/checkpoints/step-9")
    local again = runs.open(root .. "/r", { resume = true })
    assert.is_false(fs.is_dir(tmp))
    assert.are.equal(2, select(2, again:latest_checkpoint()))
  end)

  it("puts back a checkpoint a crash moved aside while replacing it", function()
    local run = runs.open(root .. "/r", { config = {} })
    run:save_checkpoint(3, nil, { version = 1 })
    os.rename(root .. "/r/checkpoints/step-3", root .. "/r/checkpoints/.old-step-3")
    local again = runs.open(root .. "/r", { resume = true })
    assert.are.equal(3, select(2, again:latest_checkpoint()))
    -- saving the same step again replaces it whole
    again:save_checkpoint(3, nil, { version = 2 })
    assert.are.equal(2, (again:load_checkpoint(again:latest_checkpoint())).version)
    assert.are.same({ "step-3" }, fs.list_dir(root .. "/r/checkpoints"))
  end)

  it("on resume drops metrics and completions past the checkpoint's step", function()
    local run = runs.open(root .. "/r", { config = {} })
    local model = remax.model.new(tiny, { seed = 2 })
    for s = 1, 6 do
      run:log_metrics(s, { reward = s / 10 })
      run:log_completions(s, { { prompt = "p", completion = "c" .. s, reward = 0 } })
      if s == 4 then run:save_checkpoint(4, model, {}) end
    end
    run:close()
    -- a crash tore the last line
    local f = assert(io.open(root .. "/r/metrics.jsonl", "ab"))
    f:write('{"step":7,"rew')
    f:close()

    local again = runs.open(root .. "/r", { resume = true })
    local dir = again:latest_checkpoint()
    again:load_checkpoint(dir)
    local steps = {}
    for _, row in ipairs(again:metrics()) do steps[#steps + 1] = row.step end
    assert.are.same({ 1, 2, 3, 4 }, steps)
    local crows = runs.read_jsonl(root .. "/r/completions.jsonl")
    assert.are.equal(4, #crows)
    assert.are.equal("c4", crows[4].completion)
    -- appending continues cleanly after the rewrite
    again:log_metrics(5, { reward = 0.55 })
    local rows = again:metrics()
    assert.are.equal(5, #rows)
    assert.are.equal(0.55, rows[5].reward)
    assert.matches("\n$", read(root .. "/r/metrics.jsonl"))
  end)

  it("loading an older checkpoint drops the rows past it", function()
    local run = runs.open(root .. "/r", { config = {} })
    for s = 1, 4 do
      run:log_metrics(s, { reward = s })
      if s % 2 == 0 then run:save_checkpoint(s, nil, {}) end
    end
    local state = run:load_checkpoint(root .. "/r/checkpoints/step-2")
    assert.are.equal(2, state.step)
    assert.are.equal(2, #run:metrics())
  end)

  it("a resume without a checkpoint starts the files over", function()
    local run = runs.open(root .. "/r", { config = {} })
    run:log_metrics(1, { reward = 1 })
    run:close()
    local again = runs.open(root .. "/r", { resume = true })
    assert.are.equal(0, #again:metrics())
  end)

  it("refuses state JSON cannot hold back, naming the key", function()
    local run = runs.open(root .. "/r", { config = {} })
    local ok, err = pcall(run.save_checkpoint, run, 1, nil, { rng = { [3] = 1, [7] = 2 } })
    assert.is_false(ok)
    assert.matches("trainer_state%.rng", err)
    ok, err = pcall(run.save_checkpoint, run, 1, nil, { fn = print })
    assert.is_false(ok)
    assert.matches("trainer_state%.fn is a function", err)
    assert.is_nil(run:latest_checkpoint())
  end)

  it("writes plots for the metric keys present and an index that escapes the config", function()
    local run = runs.open(root .. "/r", { config = { name = "<script>alert('x')</script> & co" } })
    for s = 1, 5 do
      local m = { reward = s / 5, reward_greedy = s / 6, kl = 0.01 * s, completion_length_mean = 20 + s }
      if s % 2 == 0 then m.eval_accuracy = s / 10 end
      run:log_metrics(s, m)
    end
    local files = run:plot()
    table.sort(files)
    assert.are.same({ "eval.svg", "index.html", "kl.svg", "length.svg", "reward.svg" }, files)
    assert.is_nil(io.open(root .. "/r/loss.svg"))   -- no `loss` key: no chart
    local reward = read(root .. "/r/reward.svg")
    assert.matches("sampled", reward)
    assert.matches("greedy", reward)
    local _, polylines = reward:gsub("<polyline", "")
    assert.are.equal(2, polylines)
    local html = read(root .. "/r/index.html")
    assert.is_nil(html:find("<script>", 1, true))
    assert.truthy(html:find("&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt; &amp; co", 1, true))
    assert.truthy(html:find('src="reward.svg"', 1, true))
    assert.truthy(html:find("completion_length_mean", 1, true))   -- the last metrics row
  end)

  it("draws the learning rate, steps on whole-number ticks, no flat KL chart, and counts steps not rows", function()
    local run = runs.open(root .. "/r", { config = { beta = 0 } })
    run:log_metrics(0, { eval_accuracy = 0.1 })
    for s = 1, 3 do run:log_metrics(s, { reward = s / 3, kl = 0, lr = 1e-5 * s / 3 }) end
    run:log_metrics(3, { eval_accuracy = 0.4 })
    local files = run:plot()
    table.sort(files)
    assert.are.same({ "eval.svg", "index.html", "lr.svg", "reward.svg" }, files)   -- kl is 0 throughout: no chart
    local reward = read(root .. "/r/reward.svg")
    local labels = {}
    for v in reward:gmatch('<text x="[%d.]+" y="%d+" text%-anchor="middle">([^<]*)</text>') do labels[#labels + 1] = v end
    assert.is_true(#labels >= 3)
    for _, v in ipairs(labels) do assert.matches("^%-?%d+$", v) end   -- 1, 2, 3, not 1.5
    local html = read(root .. "/r/index.html")
    assert.truthy(html:find("3 training steps logged", 1, true))   -- 5 rows, 3 steps
    assert.truthy(html:find("width:100%", 1, true))
    run:log_metrics(4, { kl = 0.02 })
    files = run:plot()
    table.sort(files)
    assert.are.same({ "eval.svg", "index.html", "kl.svg", "lr.svg", "reward.svg" }, files)
  end)

  it("plots entropy, the learning signal and clip ratios when a run logs them", function()
    local run = runs.open(root .. "/r", { config = {} })
    for s = 1, 4 do
      run:log_metrics(s, { entropy = 2 - s / 10, frac_rows_nonzero_adv = s / 8, frac_prompts_nonzero_adv = s / 4,
        frac_reward_zero_std = 1 - s / 4, truncated_fraction = 0.1, ["clip_ratio/low_mean"] = 0.01 * s,
        ["clip_ratio/high_mean"] = 0.02 * s, ["clip_ratio/region_mean"] = 0.03 * s })
    end
    local files = run:plot()
    table.sort(files)
    assert.are.same({ "clip.svg", "entropy.svg", "index.html", "signal.svg" }, files)
    local _, lines = read(root .. "/r/clip.svg"):gsub("<polyline", "")
    assert.are.equal(3, lines)
    _, lines = read(root .. "/r/signal.svg"):gsub("<polyline", "")
    assert.are.equal(4, lines)
  end)
end)
