-- The RLHF chain's pieces (recipes/rlhf/, issue 39): algo = "reward" refuses more than one
-- process (the check with a world of any size, and `mpirun -np 2` on a tiny reward recipe:
-- skipped, saying why, without mpirun or the MPI backend), and the over-optimisation summary
-- recipes/rlhf/chain.lua prints (remax.run.plot.overoptimisation) on series written here.
local remax = require("remax")
local cli = require("remax.cli.main")
local rm_step = require("remax.step.reward_model")
local plot = require("remax.run.plot")

local support = require("support")
local tmpdir, write, error_of = support.tmpdir, support.write, support.error_of

describe("algo = reward and the number of processes", function()
  it("passes a world of one (or none) and refuses two or more, naming the setting and the launcher", function()
    rm_step.check_world(nil)
    rm_step.check_world({ size = 1 })
    for _, n in ipairs({ 2, 8 }) do
      local msg = error_of(rm_step.check_world, { size = n })
      assert.is_truthy(msg:find('algo = "reward" runs on one process', 1, true), msg)
      assert.is_truthy(msg:find(("this run has %d ranks (mpirun -np %d)"):format(n, n), 1, true), msg)
      assert.is_truthy(msg:find("data-parallel reward-model training is not supported yet", 1, true), msg)
    end
  end)

  local skip = support.mpi_missing()
  if skip then print("rlhf_chain_spec: skipping the mpirun test: " .. skip) end

  ;(skip and pending or it)("mpirun -np 2 stops before training, with the error, and leaves no run folder", function()
    local dir = tmpdir()
    local model = dir .. "/lm"
    os.execute("mkdir -p " .. support.shell_quote(model))
    remax.tokenizer.write_byte_level(model)
    local tok = remax.tokenizer.load(model)
    remax.model.new(support.tiny_model({ vocab_size = tok.vocab_size, tie_word_embeddings = false }),
      { seed = 3, dtype = "f32" }):save(model)
    local lines = {}
    for i = 1, 8 do
      lines[i] = ('{"prompt": "q%d", "chosen": "good %d", "rejected": "bad %d"}'):format(i, i, i)
    end
    write(dir .. "/pairs.jsonl", table.concat(lines, "\n") .. "\n")
    write(dir .. "/r.lua", ([[
return { algo = "reward", model = %q, data = %q, chat_template = "plain", eval_size = 0, max_steps = 2,
  per_device_train_batch_size = 2, save_steps = 0, log_completions = 0, dtype = "f32", seed = 1,
  output_dir = %q, run_name = "rm", hot_reload = false }
]]):format(model, dir .. "/pairs.jsonl", dir .. "/runs"))
    local cmd = ("OMP_NUM_THREADS=1 OMPI_MCA_btl_vader_single_copy_mechanism=none mpirun --allow-run-as-root "
      .. "--oversubscribe -np 2 %s/remax run %s 2>&1; echo \"rc=$?\""):format(cli.build_dir(), dir .. "/r.lua")
    local p = assert(io.popen(cmd))
    local out = p:read("*a")
    p:close()
    local rc = tonumber(out:match("rc=(%d+)%s*$"))
    assert.are_not.equal(0, rc, out)
    assert.is_truthy(out:find('algo = "reward" runs on one process: this run has 2 ranks (mpirun -np 2)', 1, true), out)
    assert.is_nil(out:find("step 1/", 1, true), out)
    assert.is_nil(support.try_read(dir .. "/runs/rm/metrics.jsonl"), "a run folder was left: " .. out)
  end)
end)

describe("the over-optimisation summary", function()
  local function series(ys)
    local x = {}
    for i = 1, #ys do x[i] = i end
    return { x = x, y = ys }
  end

  it("finds the first step after which the truth's running mean stops rising while the score's still rises", function()
    -- the score rises throughout; the truth rises to step 4, then falls
    local score = series({ 0, 1, 2, 3, 4, 5, 6, 7 })
    local truth = series({ 0.1, 0.2, 0.3, 0.4, 0.35, 0.3, 0.25, 0.2 })
    local s = plot.overoptimisation(score, truth, { window = 1 })
    assert.are.equal(4, s.truth_peak_step)
    assert.is_true(math.abs(s.truth_peak - 0.4) < 1e-9, tostring(s.truth_peak))
    assert.is_true(s.score_after_peak > s.score_at_peak)
    assert.is_true(s.truth_after_peak < s.truth_peak)
    assert.is_true(s.overoptimised)
  end)

  it("smooths with a running mean and says no when the truth is still rising at the end", function()
    local score = series({ 0, 1, 2, 3, 4, 5 })
    local truth = series({ 0.1, 0.3, 0.2, 0.4, 0.3, 0.5 })
    local s = plot.overoptimisation(score, truth, { window = 2 })
    -- running means of 2: 0.1, 0.2, 0.25, 0.3, 0.35, 0.4: the peak is the last step
    assert.are.equal(6, s.truth_peak_step)
    assert.is_false(s.overoptimised)
    assert.are.same({ 0.1, 0.2, 0.25, 0.3, 0.35, 0.4 }, (function()
      local r = {}
      for i, v in ipairs(s.truth_smooth) do r[i] = math.floor(v * 1000 + 0.5) / 1000 end
      return r
    end)())
  end)

  it("looks for the peak only where the running mean has a full window", function()
    -- one high first value, then a rise to step 4 and a fall: the peak is step 4's mean, not step 1
    local score = series({ 0, 1, 2, 3, 4, 5, 6, 7 })
    local truth = series({ 0.44, 0.41, 0.31, 0.59, 0.39, 0.22, 0.09, 0.09 })
    local s = plot.overoptimisation(score, truth, { window = 4 })
    assert.are.equal(4, s.truth_peak_step)
    assert.is_true(math.abs(s.truth_peak - (0.44 + 0.41 + 0.31 + 0.59) / 4) < 1e-9)
    assert.is_true(math.abs(s.score_at_peak - 1.5) < 1e-9)
    assert.is_true(math.abs(s.score_after_peak - 5.5) < 1e-9)
    assert.is_true(s.overoptimised)
  end)

  it("skips missing steps and refuses series that share no step", function()
    local s = plot.overoptimisation({ x = { 1, 2, 3 }, y = { 1, 2, 3 } }, { x = { 1, 3 }, y = { 0.5, 0.2 } }, { window = 1 })
    assert.are.equal(1, s.truth_peak_step)
    assert.is_true(s.overoptimised)
    assert.has_error(function() plot.overoptimisation({ x = {}, y = {} }, { x = {}, y = {} }) end)
  end)
end)

describe("the run's report", function()
  local runs = require("remax.run.folder")
  it("draws every reward function's sampled mean on one chart when a run logs two or more", function()
    local root = tmpdir()
    local run = runs.open(root .. "/r", { config = {} })
    for s = 1, 4 do
      run:log_metrics(s, { reward = s, ["reward/rm:rm"] = s / 2, ["reward/gsm8k_accuracy"] = 0.5 - s / 10,
        ["reward/rm:rm/std"] = 9 })
    end
    local files = run:plot()
    table.sort(files)
    assert.are.same({ "index.html", "reward.svg", "rewards.svg" }, files)
    local svg = support.read(root .. "/r/rewards.svg")
    local _, lines = svg:gsub("<polyline", "")
    assert.are.equal(2, lines)   -- the two functions; a nested key (.../std) is not a function's mean
    assert.truthy(svg:find("rm:rm", 1, true))
    assert.truthy(svg:find("gsm8k_accuracy", 1, true))
    assert.truthy(support.read(root .. "/r/index.html"):find('src="rewards.svg"', 1, true))
    run:close()
    -- one reward function: its line is the reward chart's already, no second chart
    local one = runs.open(root .. "/one", { config = {} })
    for s = 1, 3 do one:log_metrics(s, { reward = s, ["reward/gsm8k"] = s }) end
    files = one:plot()
    table.sort(files)
    assert.are.same({ "index.html", "reward.svg" }, files)
    one:close()
  end)
end)
