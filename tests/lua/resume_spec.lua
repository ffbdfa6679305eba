-- Resume from the run's own config.json (command-line changes printed, immutable settings
-- refused), --overwrite_output_dir, and no half-made run folder after a failed start.
local config = require("remax.settings.config")
local trainer = require("remax.run.run")
local resume = require("remax.run.resume")
local fs = require("remax.bind.fs")
local support = require("support")
local write, error_of = support.write, support.error_of
local ipc = require("remax.bind.ipc")

-- A folder with the LOWER reward and 16 prompts (removed when the spec file ends).
local function setup() return support.train_dir(16) end

local function recipe(d, extra)
  return support.run_settings(d, {
    model_config = support.tiny_model(), num_generations = 4, max_completion_length = 8,
    per_device_train_batch_size = 4, learning_rate = 1e-2, max_steps = 2, run_name = "r", save_steps = 1,
    seed = 7, dtype = "f32",   -- bit-exact comparisons: the same on every CPU
  }, extra)
end

-- A recipe file's settings for runs of the remax program: a tiny model, 2 prompts of 2 samples,
-- f32, no evaluation or checkpoints but the ones a stop makes (a recipe adds its own lines).
local PROGRAM_SETTINGS = [[
  model_config = { architectures = { "Qwen2ForCausalLM" }, hidden_size = 32, intermediate_size = 64,
    num_hidden_layers = 2, num_attention_heads = 4, num_key_value_heads = 2, max_position_embeddings = 256,
    rope_theta = 10000, rms_norm_eps = 1e-6, tie_word_embeddings = true },
  data = "p.jsonl", chat_template = "plain", num_generations = 2, max_completion_length = 6,
  per_device_train_batch_size = 2, eval_size = 0, output_dir = "runs",
  save_steps = 0, log_completions = 0, seed = 7, learning_rate = 1e-3, dtype = "f32",
]]

-- The remax program (its path), and sh(cmd): cmd run by the shell in folder d, its output with
-- stderr and a last line rc=STATUS.
local function program(d)
  local bin = require("remax.cli.main").build_dir() .. "/remax"
  if bin:sub(1, 1) ~= "/" then bin = os.getenv("PWD") .. "/" .. bin end
  return bin, function(cmd)
    local p = io.popen("cd " .. d .. " && " .. cmd .. " 2>&1; echo rc=$?")
    local out = p:read("*a")
    p:close()
    return out
  end
end

describe("resume", function()
  it("continues with the run's own settings; only the command line changes them, and says so", function()
    local d = setup()
    -- the first run: the recipe says learning_rate 1e-2, the command line said 2e-2 and top_k 5
    local first = config.resolve(recipe(d), config.parse_args({ "--learning_rate", "0.02", "--top_k", "5" }))
    local t = trainer.new(first, { quiet = true, signals = false })
    t:train_step()
    t:save_checkpoint("test")
    local dir = d .. "/runs/r"

    -- resumed with the recipe alone: the run's values, not the recipe's; the recipe's other edits are said
    local cfg, changes = resume.resolve(recipe(d, { max_steps = 4 }), { resume = dir })
    assert.are.equal(0.02, cfg.learning_rate)
    assert.are.equal(5, cfg.top_k)
    assert.are.equal(2, cfg.max_steps)
    -- (the values the first run took from its command line differ from the recipe too: said as well)
    local text = table.concat(resume.describe(dir, changes), "\n")
    assert.matches("max_steps = 2 as the run had it (the recipe now says 4; give --max_steps to change it)", text, 1, true)
    assert.matches("learning_rate = 0.02 as the run had it (the recipe now says 0.01", text, 1, true)
    assert.is_nil(text:find("num_generations", 1, true))   -- unchanged settings are not listed

    -- a setting given again on the command line changes it, and the change is printed
    cfg, changes = resume.resolve(recipe(d), config.parse_args({ "--resume", dir, "--learning_rate", "0.005", "--max_steps", "3" }))
    assert.are.equal(0.005, cfg.learning_rate)
    assert.are.equal(3, cfg.max_steps)
    local lines = {}
    for _, line in ipairs(resume.describe(dir, changes)) do
      if line:find("command line", 1, true) then lines[#lines + 1] = line end
    end
    assert.are.equal(2, #lines)
    assert.matches("resume " .. dir .. ": learning_rate = 0.005 (was 0.02; from the command line)", table.concat(lines, "\n"), 1, true)
    assert.matches("max_steps = 3 (was 2; from the command line)", table.concat(lines, "\n"), 1, true)

    -- and the run goes on from its checkpoint with those settings
    local r = trainer.new(cfg, { quiet = true, signals = false })
    assert.are.equal(1, r.step)
    local m = r:train_step()
    assert.are.equal(2, r.step)
    assert.is_true(math.abs(m.lr - 0.005) < 1e-12)
    -- config.json now says what the run runs with
    assert.are.equal(0.005, r.run:read_config().learning_rate)
  end)

  it("records data paths absolute, so a run started with a relative one resumes from any folder", function()
    local d = setup()
    local ffi = require("ffi")
    pcall(ffi.cdef, "int chdir(const char *path);")
    local home = fs.cwd()
    local other = support.tmpdir()
    local function within(dir, f, ...)
      assert.are.equal(0, ffi.C.chdir(dir))
      local ok, a, b = pcall(f, ...)
      ffi.C.chdir(home)
      assert(ok, a)
      return a, b
    end
    -- started in d with relative paths
    local t = within(d, function()
      local cfg = config.resolve(recipe(d, { data = "p.jsonl", output_dir = "runs" }))
      local t = trainer.new(cfg, { quiet = true, signals = false })
      t:train_step()
      t:save_checkpoint("test")
      return t
    end)
    local dir = fs.absolute(d .. "/runs/r")
    local saved = require("remax.run.folder").decode(support.read(dir .. "/config.json"))
    assert.are.equal(fs.absolute(d .. "/p.jsonl"), saved.data)
    within(d, t.run.close, t.run)
    -- resumed from another folder, naming the run absolutely, with the data absolute or as before
    within(other, function()
      local cfg = resume.resolve(recipe(d, { data = "p.jsonl" }), { resume = dir })
      assert.are.equal(fs.absolute(d .. "/p.jsonl"), cfg.data)
      cfg = resume.resolve(recipe(d), config.parse_args({ "--resume", dir, "--data", fs.absolute(d .. "/p.jsonl") }))
      local t2 = trainer.new(cfg, { quiet = true, signals = false })
      t2:train_step()
      assert.are.equal(2, t2.step)
      t2.run:close()
    end)
    within(d, function()
      resume.resolve(recipe(d), config.parse_args({ "--resume", dir, "--data", "p.jsonl" }))
      support.write(d .. "/q.jsonl", support.read(d .. "/p.jsonl"))
      local err = error_of(resume.resolve, recipe(d), config.parse_args({ "--resume", dir, "--data", "q.jsonl" }))
      assert.matches("cannot change when a run resumes: data", err, 1, true)
    end)
  end)

  it("refuses settings that cannot change on resume, naming each", function()
    local d = setup()
    local t = trainer.new(config.resolve(recipe(d)), { quiet = true, signals = false })
    t:train_step()
    t:save_checkpoint("test")
    local dir = d .. "/runs/r"
    local err = error_of(resume.resolve, recipe(d), config.parse_args({ "--resume", dir, "--seed", "8", "--algo", "grpo" }))
    assert.matches("cannot change when a run resumes", err, 1, true)
    assert.matches("seed (7 -> 8: the data order and the sampling seeds derive from it)", err, 1, true)
    assert.matches("algo (remax -> grpo", err, 1, true)
    assert.matches("--overwrite_output_dir", err, 1, true)
    err = error_of(resume.resolve, recipe(d), { resume = d .. "/runs/none" })
    assert.matches("--resume " .. d .. "/runs/none: no run there (no config.json)", err, 1, true)
  end)

  it("replaces a run with --overwrite_output_dir, and says how otherwise", function()
    local d = setup()
    local t = trainer.new(config.resolve(recipe(d)), { quiet = true, signals = false })
    t:train_step()
    t:train_step()
    assert.are.equal(2, #t.run:metrics())
    local err = error_of(trainer.new, config.resolve(recipe(d)), { quiet = true, signals = false })
    assert.matches("runs/r already holds a run: continue it with --resume", err, 1, true)
    assert.matches("replace it with --overwrite_output_dir", err, 1, true)
    local again = trainer.new(config.resolve(recipe(d), config.parse_args({ "--overwrite_output_dir" })),
      { quiet = true, signals = false })
    assert.are.equal(0, #again.run:metrics())
    assert.is_nil(again.run:latest_checkpoint())
  end)

  it("prints a Ctrl-C hint that resumes the run when typed as printed", function()
    local d = setup()
    -- a recipe whose reward sends the process SIGINT during step 2 (as Ctrl-C at the terminal)
    write(d .. "/recipe.lua", [[
local ipc = require("remax.bind.ipc")
local calls = 0
return {
]] .. PROGRAM_SETTINGS .. [[
  max_steps = 4, run_name = "c",
  rewards = { { name = "interrupt", fn = function(c)
    calls = calls + 1
    -- (from a background shell: system() ignores SIGINT in its caller while it waits)
    if calls == 3 and not os.getenv("NO_INTERRUPT") then os.execute("(sleep 0.3; kill -INT " .. ipc.pid() .. ") &"); ipc.sleep(1) end
    local s = {}
    for i in ipairs(c) do s[i] = #c[i] end
    return s
  end } },
}
]])
    local bin, sh = program(d)
    local out = sh(("%s run recipe.lua --learning_rate 0.002"):format(bin))
    assert.matches("rc=130", out, 1, true)
    local hint = out:match("resume with: (remax run [^\n]+)")
    assert.are.equal("remax run recipe.lua --resume runs/c", hint, out)
    -- typed as printed (remax is the program), the run goes on from its checkpoint with its own settings
    out = sh("NO_INTERRUPT=1 " .. hint:gsub("^remax", bin))
    assert.matches("rc=0", out, 1, true)
    assert.matches("resumed runs/c from runs/c/checkpoints/step%-%d", out)
    local rows = require("remax.run.folder").read_jsonl(d .. "/runs/c/metrics.jsonl")
    assert.are.equal(4, rows[#rows].step)
    for _, row in ipairs(rows) do assert.is_true(math.abs(row.lr - 0.002) < 1e-12) end   -- the first command line's lr
  end)

  it("SIGTERM while a py: reward worker computes stops within the grace, saves the last step, and resumes", function()
    if not support.has_python() then return pending("python3 is not installed") end
    local d = setup()
    -- the worker's reward marks its second call and then takes a minute (reward_timeout is two)
    write(d .. "/slow.py", "STALLED = " .. ("%q"):format(d .. "/stalled") .. "\n" .. [[
import os, time
calls = 0
def reward(completions, **kwargs):
    global calls
    calls += 1
    if calls == 2 and not os.environ.get("NO_STALL"):
        open(STALLED, "w").close()
        time.sleep(60)
    return [float(len(c)) for c in completions]
]])
    write(d .. "/recipe.lua", "return {\n" .. PROGRAM_SETTINGS .. [[
  max_steps = 3, run_name = "w",
  rewards = { "py:slow.py:reward" }, reward_timeout = 120,
}
]])
    local bin, sh = program(d)
    local t0 = ipc.now()
    local out = sh(("{ %s run recipe.lua >out.txt 2>&1 & pid=$!; n=0; while [ ! -f stalled ] && [ $n -lt 600 ]; do " ..
      "sleep 0.1; n=$((n+1)); done; kill -TERM $pid; wait $pid; echo status=$?; cat out.txt; }"):format(bin))
    local seconds = ipc.now() - t0
    assert.is_true(seconds < 40, ("the run took %.1f s after the signal: it waited for the worker"):format(seconds))
    assert.matches("status=130", out, 1, true)
    assert.matches("saved (interrupted)", out, 1, true)
    assert.matches("interrupted at step 0 (stopped while the worker py:", out, 1, true)
    assert.is_nil(out:match("reward 'slow"), out)   -- the stop, not a failing reward
    local hint = out:match("resume with: (remax run [^\n]+)")
    assert.are.equal("remax run recipe.lua --resume runs/w", hint, out)
    out = sh("NO_STALL=1 " .. hint:gsub("^remax", bin))
    assert.matches("rc=0", out, 1, true)
    assert.matches("resumed runs/w from runs/w/checkpoints/step%-%d", out)
    local rows = require("remax.run.folder").read_jsonl(d .. "/runs/w/metrics.jsonl")
    assert.are.equal(3, rows[#rows].step)
  end)

  it("leaves no half-made run folder after a failed start", function()
    local d = setup()
    local err = error_of(trainer.new, config.resolve(recipe(d, { model = d .. "/no-such-model", model_config = nil })),
      { quiet = true, signals = false })
    assert.matches("no%-such%-model", err)
    assert.is_false(fs.is_dir(d .. "/runs/r"))
    err = error_of(trainer.new, config.resolve(recipe(d, { data = d .. "/missing.jsonl" })), { quiet = true, signals = false })
    assert.matches("missing.jsonl", err, 1, true)
    assert.is_false(fs.is_dir(d .. "/runs/r"))
  end)
end)
