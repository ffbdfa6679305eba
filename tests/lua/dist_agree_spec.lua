-- Ranks that disagree, stop or leave (issue 35): under `mpirun -np 2` on the CPU, ranks started
-- with different settings are refused before the first step on every rank, naming the setting
-- and both values; a rank that ends early or is stopped makes the other stop within
-- dist_timeout, naming it and the step, with the last checkpoint resumable. Each case is bounded
-- by `timeout`. Skips, saying why, without mpirun or libremax_mpi.so.
local cli = require("remax.cli.main")
local support = require("support")
local tmpdir, write, read = support.tmpdir, support.write, support.try_read

local skip = support.mpi_missing()
if skip then print("dist_agree_spec: skipping: " .. skip) end

local REWARD = [[
-- the fraction of lowercase letters; STOP_RANK stops its own process (SIGSTOP) at call STOP_CALL
local ffi = require("ffi")
pcall(ffi.cdef, "int getpid(void); int kill(int pid, int sig);")
local calls = 0
return { name = "lower", fn = function(completions, batch)
  calls = calls + 1
  local rank = os.getenv("OMPI_COMM_WORLD_RANK")
  if rank and rank == os.getenv("STOP_RANK") and calls == tonumber(os.getenv("STOP_CALL")) then
    local f = io.open(os.getenv("STOP_STAMP"), "w"); f:write(os.time()); f:close()
    ffi.C.kill(ffi.C.getpid(), 19)
  end
  local s = {}
  for i = 1, #completions do
    local ids, n = batch.completion_ids[i], 0
    for _, id in ipairs(ids) do if id >= 97 and id <= 122 then n = n + 1 end end
    s[i] = n / math.max(#ids, 1)
  end
  return s
end }
]]

local function recipe(dir)
  write(dir .. "/lower.lua", REWARD)
  support.prompts(dir .. "/p.jsonl", 24)
  write(dir .. "/r.lua", ([[
return {
  model_config = { architectures = { "Qwen2ForCausalLM" }, hidden_size = 16, intermediate_size = 32,
    num_hidden_layers = 1, num_attention_heads = 2, num_key_value_heads = 1, max_position_embeddings = 128,
    rope_theta = 10000, rms_norm_eps = 1e-6, tie_word_embeddings = true },
  data = %q, rewards = { %q }, chat_template = "plain", hot_reload = false,
  num_generations = 2, max_completion_length = 6, learning_rate = 1e-2, max_steps = 3, eval_size = 0,
  save_steps = 1, log_completions = 1, seed = 7, output_dir = %q, dtype = "f32", per_device_train_batch_size = 4,
}
]]):format(dir .. "/p.jsonl", dir .. "/lower.lua", dir .. "/runs"))
  return dir .. "/r.lua"
end

local ENV = "OMP_NUM_THREADS=1 OMPI_MCA_btl_vader_single_copy_mechanism=none"
local MPIRUN = "mpirun --allow-run-as-root --oversubscribe -x OMP_NUM_THREADS -x STOP_RANK -x STOP_CALL -x STOP_STAMP"

-- Runs a shell command line with a bound; returns its output, exit code and seconds taken.
local function sh(cmd, bound)
  local t0 = os.time()
  local p = assert(io.popen(("%s timeout -s KILL %d %s 2>&1; echo \"rc=$?\""):format(ENV, bound, cmd)))
  local out = p:read("*a")
  p:close()
  return out, tonumber(out:match("rc=(%d+)%s*$")), os.time() - t0
end

-- Rank 0 runs `remax a0`, rank 1 `remax a1` (mpirun's MPMD form).
local function two(a0, a1, env, bound)
  local b = cli.build_dir()
  return sh(("env %s %s -np 1 %s/remax %s : -np 1 %s/remax %s"):format(env or "", MPIRUN, b, a0, b, a1), bound or 60)
end

local describe_mpi = skip and pending or describe

describe_mpi("ranks that disagree are refused before the first step", function()
  local dir, rfile
  setup(function()
    dir = tmpdir()
    rfile = recipe(dir)
  end)

  local cases = {
    { key = "zero_stage", a = "0", b = "1" },
    { key = "seed", a = "7", b = "8" },
    { key = "num_generations", a = "2", b = "3" },
    { key = "learning_rate", a = "0.01", b = "0.02", shown_a = "0.01", shown_b = "0.02" },
    { key = "per_device_train_batch_size", a = "4", b = "2" },
    { key = "max_steps", a = "3", b = "1" },
  }
  for _, c in ipairs(cases) do
    it(("names %s and both ranks' values, on every rank, without a crash"):format(c.key), function()
      local base = ("run %s --run_name dis-%s"):format(rfile, c.key)
      local out, rc = two(("%s --%s %s"):format(base, c.key, c.a), ("%s --%s %s"):format(base, c.key, c.b))
      assert.are_not.equal(0, rc, out)
      assert.are_not.equal(139, rc, out)   -- no segfault
      local line = ("  %s: rank 0 has %s, rank 1 has %s"):format(c.key, c.shown_a or c.a, c.shown_b or c.b)
      for rank = 0, 1 do
        assert.is_truthy(out:find(("remax (rank %d of 2): the ranks disagree on their settings"):format(rank), 1, true), out)
      end
      assert.is_truthy(out:find(line, 1, true), out)
      -- nothing was trained: no checkpoint, no metrics
      assert.is_nil(read(("%s/runs/dis-%s/metrics.jsonl"):format(dir, c.key)))
    end)
  end

  it("names the collectives when ranks run different code, before any data moves", function()
    write(dir .. "/differ.lua", [[
local w = require("remax.bind.dist").world()
if w.rank == 1 then w:broadcast({ 1, 2, 3 }) else w:sum(1, 2) end
]])
    local out, rc = two("run " .. dir .. "/differ.lua", "run " .. dir .. "/differ.lua")
    assert.are_not.equal(0, rc, out)
    assert.are_not.equal(139, rc, out)
    assert.is_truthy(out:find("the ranks disagree: rank 0 calls all-reduce (sum) of 2 f64 before the first step, "
      .. "rank 1 calls broadcast of 8 bytes from rank 0 before the first step", 1, true), out)
  end)
end)

describe_mpi("a rank that stops or leaves", function()
  local dir, rfile
  setup(function()
    dir = tmpdir()
    rfile = recipe(dir)
  end)

  it("ends the others at once when it ends early, naming it", function()
    write(dir .. "/early.lua", [[
local w = require("remax.bind.dist").world()
w:sum(1)
if w.rank == 1 then return end   -- rank 1 is done; rank 0 goes on to step 2
w:set_step(2)
w:sum(2)
]])
    local out, rc, took = two("run " .. dir .. "/early.lua", "run " .. dir .. "/early.lua", nil, 60)
    assert.are_not.equal(0, rc, out)
    assert.is_true(took < 30, ("took %d s"):format(took))
    assert.is_truthy(out:find("the ranks disagree on the run's length: rank 0 calls all-reduce (sum) of 1 f64 at step 2, "
      .. "rank 1 has ended its run (before the first step)", 1, true), out)
  end)

  it("stops the others within dist_timeout when one is stopped (SIGSTOP), keeping the last checkpoint resumable", function()
    local stamp = dir .. "/stopped"
    local args = ("run %s --run_name stopped --max_steps 20 --dist_timeout 3"):format(rfile)
    -- call 1 is the reward check at setup, 3 is step 2
    local out, rc = two(args, args, ("STOP_RANK=1 STOP_CALL=3 STOP_STAMP=%s"):format(stamp), 90)
    local ended = os.time()
    assert.are_not.equal(0, rc, out)
    local stopped_at = tonumber(read(stamp))
    assert.is_truthy(stopped_at, out)
    assert.is_true(ended - stopped_at <= 30, ("the run went on %d s after rank 1 stopped"):format(ended - stopped_at))
    assert.is_truthy(out:find("remax (rank 0 of 2): ", 1, true), out)
    assert.is_truthy(out:find("at step 2 and waited 3 s (dist_timeout) for rank(s) 1, which did not come", 1, true), out)
    -- step 1's checkpoint is whole: one process with the same global batch (4 x 2) resumes it
    local run = dir .. "/runs/stopped"
    assert.is_truthy(read(run .. "/checkpoints/step-1/trainer_state.json"), out)
    local b = cli.build_dir()
    local out2, rc2 = sh(("%s/remax run %s --resume %s --max_steps 2 --gradient_accumulation_steps 2"):format(b, rfile, run), 120)
    assert.are.equal(0, rc2, out2)
    assert.is_truthy(read(run .. "/checkpoints/step-2/trainer_state.json"), out2)
  end)

  it("has rank 0 hold the run folder's lock: another process on it is refused, naming rank 0", function()
    local log, pidfile = dir .. "/held.log", dir .. "/held.pid"
    local b = cli.build_dir()
    assert.is_true(os.execute(("(exec env %s %s -np 2 %s/remax run %s --run_name held --max_steps 100000 >%s 2>&1) & echo $! >%s")
      :format(ENV, MPIRUN, b, rfile, log, pidfile)) == 0)
    local mpirun = tonumber(read(pidfile))
    local run = dir .. "/runs/held"
    local t0 = os.time()
    while not (read(run .. "/metrics.jsonl") or ""):find("step") and os.time() - t0 < 120 do os.execute("sleep 0.2") end
    local owner = tonumber((read(run .. "/run.lock") or ""):match("pid=(%d+)"))
    local out, rc = sh(("%s/remax run %s --run_name held --max_steps 1"):format(b, rfile), 60)
    local environ = owner and read("/proc/" .. owner .. "/environ") or ""
    os.execute("kill -TERM " .. mpirun)
    t0 = os.time()
    while read("/proc/" .. mpirun .. "/status") and not read("/proc/" .. mpirun .. "/status"):find("State:%s*Z")
      and os.time() - t0 < 60 do os.execute("sleep 0.2") end
    assert.is_truthy(owner, "no lock owner: " .. (read(log) or ""))
    assert.is_truthy(environ:find("OMPI_COMM_WORLD_RANK=0\0", 1, true), "the lock's owner is not rank 0")
    assert.are_not.equal(0, rc, out)
    assert.is_truthy(out:find(("is in use by pid %d on host "):format(owner), 1, true), out)
  end)

  it("refuses a dist_timeout that is not a positive number of seconds", function()
    local out, rc = sh(("%s/remax run %s --dist_timeout 0 --max_steps 1"):format(cli.build_dir(), rfile), 60)
    assert.are_not.equal(0, rc)
    assert.is_truthy(out:find("dist_timeout = 0", 1, true), out)
  end)
end)
