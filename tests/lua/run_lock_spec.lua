-- A run folder has one owner (issue 35): runs/<name>/run.lock, flock'd by the process that trains
-- in it, fresh or resumed. A second remax on the folder is refused at once, naming the owner's
-- pid, host and start; a lock left by a process that has ended (kill -9) is taken over, saying so.
-- The lock cannot be turned against a file (issue 45): a run.lock that is a symbolic link, a
-- folder, a fifo or a file with other hard links is refused, naming it, with nothing written
-- through it; save_final_model inside the run's own checkpoints is refused at the start.
local cli = require("remax.cli.main")
local support = require("support")
local tmpdir, write, read = support.tmpdir, support.write, support.try_read
local lock = require("remax.bind.lock")

local function recipe(dir)
  support.prompts(dir .. "/p.jsonl", 16)
  write(dir .. "/r.lua", ([[
return {
  model_config = { architectures = { "Qwen2ForCausalLM" }, hidden_size = 16, intermediate_size = 32,
    num_hidden_layers = 1, num_attention_heads = 2, num_key_value_heads = 1, max_position_embeddings = 128,
    rope_theta = 10000, rms_norm_eps = 1e-6, tie_word_embeddings = true },
  data = %q, rewards = { function(c) local s = {} for i = 1, #c do s[i] = #c[i] / 10 end return s end },
  chat_template = "plain", hot_reload = false, num_generations = 2, max_completion_length = 4, max_steps = 3,
  eval_size = 0, save_steps = 1, seed = 3, output_dir = %q, dtype = "f32", per_device_train_batch_size = 2,
}
]]):format(dir .. "/p.jsonl", dir .. "/runs"))
  return dir .. "/r.lua"
end

local function sh(cmd)
  local t0 = os.time()
  local p = assert(io.popen(("OMP_NUM_THREADS=1 timeout -s KILL 120 %s 2>&1; echo \"rc=$?\""):format(cmd)))
  local out = p:read("*a")
  p:close()
  return out, tonumber(out:match("rc=(%d+)%s*$")), os.time() - t0
end

-- Starts remax in the background; returns its pid.
local function start(args, log)
  local pidfile = log .. ".pid"
  assert(os.execute(("(OMP_NUM_THREADS=1 exec %s/remax %s >%s 2>&1) & echo $! >%s"):format(cli.build_dir(), args, log, pidfile)) == 0)
  return tonumber(read(pidfile))
end

local function steps(run)
  local out = {}
  for s in (read(run .. "/metrics.jsonl") or ""):gmatch('"step":%s*(%d+)') do out[#out + 1] = tonumber(s) end
  return out
end

local function wait_for_step(run, n, log)
  local t0 = os.time()
  while #steps(run) < n and os.time() - t0 < 120 do os.execute("sleep 0.2") end
  assert(#steps(run) >= n, "the run did not reach step " .. n .. ": " .. (read(log) or ""))
end

local function sha(path)
  local p = assert(io.popen("sha256sum " .. path .. " 2>/dev/null"))
  local out = p:read("*a")
  p:close()
  return out:match("^(%x+)")
end

local function alive(pid)
  local st = read("/proc/" .. pid .. "/status")
  return st ~= nil and not st:find("State:%s*Z")
end

describe("a run folder's lock", function()
  local dir, rfile, b
  setup(function()
    dir = tmpdir()
    rfile = recipe(dir)
    b = cli.build_dir()
  end)

  it("refuses a second run and a --resume while a run trains, and takes over after kill -9", function()
    local run = dir .. "/runs/shared"
    local pid = start(("run %s --run_name shared --max_steps 100000"):format(rfile), dir .. "/a.log")
    wait_for_step(run, 1, dir .. "/a.log")
    local owner = ("is in use by pid %d on host %s since "):format(pid, lock.host())
    -- a second new run with the same --run_name: refused at once, the first one untouched
    local out, rc, took = sh(("%s/remax run %s --run_name shared --max_steps 2"):format(b, rfile))
    assert.are_not.equal(0, rc, out)
    assert.is_truthy(out:find(run .. " " .. owner, 1, true), out)
    assert.is_true(took <= 20, ("refused only after %d s"):format(took))
    -- --overwrite_output_dir does not get past it either
    out, rc = sh(("%s/remax run %s --run_name shared --overwrite_output_dir true"):format(b, rfile))
    assert.are_not.equal(0, rc, out)
    assert.is_truthy(out:find(owner, 1, true), out)
    -- nor does a --resume of the run being trained
    out, rc = sh(("%s/remax run %s --resume %s --max_steps 100000"):format(b, rfile, run))
    assert.are_not.equal(0, rc, out)
    assert.is_truthy(out:find(owner, 1, true), out)
    assert.is_true(alive(pid), "the first run stopped: " .. (read(dir .. "/a.log") or ""))
    -- the owner dies without a word: its lock is free, and the next resume says whose it was
    os.execute("kill -9 " .. pid)
    while alive(pid) do os.execute("sleep 0.1") end
    local done = #steps(run)
    out, rc = sh(("%s/remax run %s --resume %s --max_steps %d"):format(b, rfile, run, done + 1))
    assert.are.equal(0, rc, out)
    assert.is_truthy(out:find(("took over the lock left by pid %d on host %s since "):format(pid, lock.host()), 1, true), out)
    local s = steps(run)
    for i = 2, #s do assert.are.equal(s[i - 1] + 1, s[i], "steps " .. table.concat(s, ",")) end   -- each step once
    -- a run that ended cleanly leaves the lock free and unnamed: the next resume says nothing about it
    out, rc = sh(("%s/remax run %s --resume %s --max_steps %d"):format(b, rfile, run, done + 2))
    assert.are.equal(0, rc, out)
    assert.is_nil(out:find("took over", 1, true), out)
  end)

  it("refuses a second --resume of one run while the first trains", function()
    local run = dir .. "/runs/twice"
    local out, rc = sh(("%s/remax run %s --run_name twice --max_steps 1"):format(b, rfile))
    assert.are.equal(0, rc, out)
    local pid = start(("run %s --resume %s --max_steps 100000"):format(rfile, run), dir .. "/r1.log")
    wait_for_step(run, 2, dir .. "/r1.log")
    out, rc = sh(("%s/remax run %s --resume %s --max_steps 100000"):format(b, rfile, run))
    os.execute("kill -9 " .. pid)
    assert.are_not.equal(0, rc, out)
    assert.is_truthy(out:find(("is in use by pid %d on host %s"):format(pid, lock.host()), 1, true), out)
  end)

  it("takes a lock file nobody holds, naming what it held", function()
    local path = dir .. "/stale.lock"
    write(path, "pid=999999\nhost=elsewhere\nsince=2026-01-01 00:00:00 UTC\n")
    local got, prev = lock.take(path)
    assert.is_true(got)
    assert.are.equal("pid 999999 on host elsewhere since 2026-01-01 00:00:00 UTC", lock.describe(prev))
    assert.is_truthy(read(path):find("pid=" .. require("remax.bind.ipc").pid(), 1, true))
    -- the same process through another spelling of the path holds it already
    assert.is_true((lock.take(dir .. "/./stale.lock")))
    lock.release(path)
    assert.are.equal("", read(path))
  end)
  it("refuses a run.lock that is a symbolic link, leaving the file it points to as it was", function()
    local run = dir .. "/runs/linked"
    local out, rc = sh(("%s/remax run %s --run_name linked --max_steps 1"):format(b, rfile))
    assert.are.equal(0, rc, out)
    local victim = dir .. "/victim.txt"
    write(victim, "not remax's file\n")
    os.remove(run .. "/run.lock")
    assert(os.execute(("ln -s %s %s/run.lock"):format(victim, run)) == 0)
    out, rc = sh(("%s/remax run %s --resume %s --max_steps 2"):format(b, rfile, run))
    assert.are_not.equal(0, rc, out)
    assert.is_truthy(out:find(run .. "/run.lock is a symbolic link (to " .. victim .. ")", 1, true), out)
    assert.is_truthy(out:find("remove " .. run .. "/run.lock", 1, true), out)
    assert.are.equal("not remax's file\n", read(victim))
    assert.are.same({ 1 }, steps(run))   -- nothing trained
    -- a link to a file that does not exist: refused too, and the file is not made
    os.remove(run .. "/run.lock")
    assert(os.execute(("ln -s %s/made-by-the-lock %s/run.lock"):format(dir, run)) == 0)
    out, rc = sh(("%s/remax run %s --resume %s --max_steps 2"):format(b, rfile, run))
    assert.are_not.equal(0, rc, out)
    assert.is_truthy(out:find("is a symbolic link", 1, true), out)
    assert.is_nil(read(dir .. "/made-by-the-lock"))
  end)

  it("refuses a lock path that is a folder, a fifo or a file with another name, writing nothing", function()
    local victim = dir .. "/other.txt"
    write(victim, "keep me\n")
    assert(os.execute(("mkdir %s/dir.lock && mkfifo %s/fifo.lock && ln %s %s/hard.lock"):format(dir, dir, victim, dir)) == 0)
    for _, case in ipairs({ { "dir.lock", "is a folder" }, { "fifo.lock", "is a fifo, not a regular file" },
      { "hard.lock", "has 2 names (hard links)" } }) do
      local ok, err = pcall(lock.take, dir .. "/" .. case[1])
      assert.is_false(ok, case[1])
      assert.is_truthy(tostring(err):find(dir .. "/" .. case[1] .. " " .. case[2], 1, true), tostring(err))
      assert.is_false(lock.holds(dir .. "/" .. case[1]))
    end
    assert.are.equal("keep me\n", read(victim))
  end)

  it("refuses save_final_model in the run's own folder or checkpoints at the start, whatever the spelling", function()
    local run = dir .. "/runs/final"
    local out, rc = sh(("%s/remax run %s --run_name final --max_steps 2"):format(b, rfile))
    assert.are.equal(0, rc, out)
    local weights = run .. "/checkpoints/step-1/model.safetensors"
    local before = sha(weights)
    assert.is_truthy(before, "checkpoint step-1 has weights")
    os.execute(("ln -s %s %s/alias"):format(run, dir))
    for _, target in ipairs({ run .. "/checkpoints/step-1", run .. "/./checkpoints/../checkpoints/step-2",
      dir .. "/alias/checkpoints/step-9", run .. "/checkpoints", run }) do
      out, rc = sh(("%s/remax run %s --resume %s --max_steps 3 --save_final_model %s"):format(b, rfile, run, target))
      assert.are_not.equal(0, rc, out)
      assert.is_truthy(out:find("save_final_model = " .. target .. " is ", 1, true), out)
      assert.is_truthy(out:find("give a folder outside", 1, true), out)
    end
    assert.are.same({ 1, 2 }, steps(run))   -- refused before any step
    assert.are.equal(before, sha(weights))
    -- a new run naming its own future folder is refused as well
    out, rc = sh(("%s/remax run %s --run_name fresh --max_steps 1 --save_final_model %s/runs/fresh/checkpoints/step-1")
      :format(b, rfile, dir))
    assert.are_not.equal(0, rc, out)
    assert.is_truthy(out:find("in this run's checkpoints folder", 1, true), out)
    -- a folder beside the checkpoints is fine
    out, rc = sh(("%s/remax run %s --resume %s --max_steps 3 --save_final_model %s/final-model"):format(b, rfile, run, run))
    assert.are.equal(0, rc, out)
    assert.is_truthy(read(run .. "/final-model/model.safetensors"), out)
  end)
end)
