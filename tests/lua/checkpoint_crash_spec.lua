-- Crash safety of checkpoints: a run killed with SIGKILL at 20 moments of its checkpoint writing
-- (between files, mid-file, before a rename, after it, while pruning) leaves its newest complete
-- checkpoint loadable, never takes a half-written folder for a checkpoint, and --resume then
-- continues bit-exactly: the final weights and optimizer state equal an uninterrupted run's.
-- The moments come from the writers' test hook (rx_crash_point in remax.h): REMAX_CRASH_LIST=1
-- lists every write event of a run, REMAX_CRASH_AT=N kills the run at the Nth.
-- Also: write failures (a full disk through RLIMIT_FSIZE, a read-only run folder) stop the run
-- with the path and the errno, and the checkpoint before stays intact.
local runs = require("remax.run.folder")
local fs = require("remax.bind.fs")
local support = require("support")

local q = support.shell_quote
local binary = support.remax_binary   -- absolute: the runs cd to their folder

-- Runs a shell command; returns its exit status and its output (stdout and stderr).
local function sh(cmd)
  local p = assert(io.popen("{ " .. cmd .. " ; } 2>&1; echo \"rc=$?\""))
  local out = p:read("*a")
  p:close()
  return tonumber(out:match("rc=(%d+)%s*$")), out
end

local write = support.write

local STEPS = 4

local function setup()
  local dir = support.train_dir(8, { prompt_format = '{"prompt": "say something %d"}' })
  write(dir .. "/recipe.lua", ([[
return {
  model_config = { architectures = { "Qwen2ForCausalLM" }, hidden_size = 16, intermediate_size = 32,
    num_hidden_layers = 1, num_attention_heads = 2, num_key_value_heads = 1, max_position_embeddings = 64,
    tie_word_embeddings = false },
  data = %q, rewards = { %q }, chat_template = "plain",
  num_generations = 2, max_completion_length = 4, per_device_train_batch_size = 2,
  gradient_accumulation_steps = 1, learning_rate = 1e-2, max_steps = %d, eval_size = 0,
  output_dir = %q, save_steps = 1, save_total_limit = 2, log_completions = 0, seed = 3, dtype = "f32",
}
]]):format(dir .. "/p.jsonl", dir .. "/lower.lua", STEPS, dir .. "/runs"))
  return dir
end

local function remax_run(dir, env, args)
  return sh(("cd %s && %s %s run recipe.lua %s"):format(q(dir), env or "", q(binary()), args))
end

-- The bytes a checkpoint's result is judged by: weights and optimizer state.
local function state_bytes(ckpt)
  local out = {}
  for _, f in ipairs({ "model.safetensors", "trainer_state.safetensors" }) do
    out[f] = fs.read_text(ckpt .. "/" .. f)
  end
  return out
end

describe("checkpoints survive SIGKILL", function()
  local dir, events, straight

  it("at 20 moments of checkpoint writing, and --resume continues bit-exactly", function()
    dir = setup()
    -- the uninterrupted run, keeping every checkpoint, lists the write events
    local rc, out = remax_run(dir, "REMAX_CRASH_LIST=1", "--run_name straight --save_total_limit 10")
    assert.are.equal(0, rc, out)
    events = {}
    for n, ev in out:gmatch("remax%-crash%-point (%d+): ([^\n]*)") do events[tonumber(n)] = ev end
    assert.is_true(#events > 40, "too few write events listed:\n" .. out)
    straight = {}
    for step = 1, STEPS do
      straight[step] = state_bytes(("%s/runs/straight/checkpoints/step-%d"):format(dir, step))
      assert.is_not_nil(straight[step]["model.safetensors"], "straight run: step " .. step)
    end

    -- 20 moments: one of each kind of event (the path left out), then evenly spread ones
    -- (only events inside save_checkpoint: from its temporary folder to its pruning)
    local inside, within = {}, false
    for n, ev in ipairs(events) do
      if ev == "checkpoint: temporary folder made" then within = true end
      if within then inside[#inside + 1] = n end
      if ev == "checkpoint: pruned" then within = false end
    end
    local chosen, seen, kinds = {}, {}, {}
    local function kind(ev) return (ev:gsub(": /.*$", "")) .. (ev:match("(%.[%a]+)$") or "") end
    for _, n in ipairs(inside) do
      local k = kind(events[n])
      if not kinds[k] then kinds[k] = true; chosen[#chosen + 1] = n; seen[n] = true end
    end
    local want = 20
    local stride = #inside / (want - #chosen + 1)
    local at = stride
    while #chosen < want and at < #inside do
      local n = inside[math.floor(at)]
      while seen[n] do n = n + 1 end
      chosen[#chosen + 1] = n
      seen[n] = true
      at = at + stride
    end
    table.sort(chosen)
    assert.are.equal(want, #chosen)

    for _, n in ipairs(chosen) do
      local name = "kill" .. n
      local run_dir = ("%s/runs/%s"):format(dir, name)
      local krc, kout = remax_run(dir, "REMAX_CRASH_AT=" .. n, "--run_name " .. name)
      assert.are.equal(137, krc, ("killed at event %d (%s), expected SIGKILL:\n%s"):format(n, events[n], kout))
      -- the checkpoints a complete rename made before the kill
      local done = 0
      for i = 1, n do if events[i] == "checkpoint: after rename" then done = done + 1 end end
      local run = runs.open(run_dir, { resume = true })
      local list = run:checkpoints()
      local _, latest = run:latest_checkpoint()
      local where = ("killed at event %d (%s)"):format(n, events[n])
      assert.are.equal(done > 0 and done or nil, latest, where .. ": latest checkpoint")
      for _, c in ipairs(list) do   -- every folder taken for a checkpoint is whole and right
        local got = state_bytes(c.dir)
        for f, bytes in pairs(straight[c.step]) do
          assert.is_true(got[f] == bytes, ("%s: %s of step-%d differs from the uninterrupted run's"):format(where, f, c.step))
        end
      end
      for _, entry in ipairs(fs.list_dir(run_dir .. "/checkpoints")) do
        assert.is_truthy(entry:match("^step%-%d+$"), where .. ": leftover " .. entry .. " after open")
      end
      run:close()
      local rrc, rout = remax_run(dir, "", "--resume " .. q(run_dir))
      if done == 0 then
        assert.are_not.equal(0, rrc, where .. ": a resume without a checkpoint must refuse")
        assert.is_truthy(rout:find("no checkpoint yet", 1, true), where .. ":\n" .. rout)
      else
        assert.are.equal(0, rrc, where .. ": resume:\n" .. rout)
        local got = state_bytes(run_dir .. "/checkpoints/step-" .. STEPS)
        for f, bytes in pairs(straight[STEPS]) do
          assert.is_true(got[f] == bytes, ("%s: after --resume, %s differs from the uninterrupted run's"):format(where, f))
        end
      end
    end
  end)
end)

describe("checkpoint write failures", function()
  it("a full disk (RLIMIT_FSIZE) stops the run naming the file and errno; earlier checkpoints stay", function()
    local dir = setup()
    -- one step with a generous limit, then a resume whose file-size limit is below a checkpoint
    local rc, out = remax_run(dir, "", "--run_name full --max_steps 1")
    assert.are.equal(0, rc, out)
    local ckpt = dir .. "/runs/full/checkpoints/step-1"
    local before = state_bytes(ckpt)
    local size = #before["model.safetensors"]
    -- ulimit -f counts 512-byte blocks in sh; SIGXFSZ ignored, so write() fails with EFBIG
    rc, out = sh(("cd %s && trap '' XFSZ && ulimit -f %d && %s run recipe.lua --resume %s --max_steps 2"):format(
      q(dir), math.floor(size / 2 / 512), q(binary()), q(dir .. "/runs/full")))
    assert.are_not.equal(0, rc, out)
    assert.is_truthy(out:find("checkpoint step-2 not saved", 1, true), out)
    assert.is_truthy(out:find("File too large", 1, true), out)
    assert.is_truthy(out:find("runs/full/checkpoints/", 1, true), out)
    local after = state_bytes(ckpt)
    for f, bytes in pairs(before) do assert.is_true(after[f] == bytes, f .. " of step-1 changed") end
    local run = runs.open(dir .. "/runs/full", { resume = true })
    local _, latest = run:latest_checkpoint()
    assert.are.equal(1, latest)
    assert.are.same({ "step-1" }, fs.list_dir(dir .. "/runs/full/checkpoints"))
  end)

  it("a read-only checkpoints folder stops the run naming the folder and errno", function()
    local dir = setup()
    local rc, out = remax_run(dir, "", "--run_name ro --max_steps 1")
    assert.are.equal(0, rc, out)
    local ckpts = dir .. "/runs/ro/checkpoints"
    local before = state_bytes(ckpts .. "/step-1")
    -- permission bits do not stop root: as root the resumed run drops to nobody (setpriv)
    local as = ""
    if sh("test \"$(id -u)\" = 0") == 0 then
      as = "setpriv --reuid=65534 --regid=65534 --clear-groups "
      sh("chmod -R a+rwX " .. q(dir))
    end
    sh("chmod a-w " .. q(ckpts))
    rc, out = sh(("cd %s && %s%s run recipe.lua --resume %s --max_steps 2"):format(q(dir), as, q(binary()),
      q(dir .. "/runs/ro")))
    sh("chmod u+w " .. q(ckpts))
    assert.are_not.equal(0, rc, out)
    assert.is_truthy(out:find("Permission denied", 1, true), out)
    assert.is_truthy(out:find(ckpts, 1, true), out)
    local after = state_bytes(ckpts .. "/step-1")
    for f, bytes in pairs(before) do assert.is_true(after[f] == bytes, f .. " of step-1 changed") end
  end)
end)
