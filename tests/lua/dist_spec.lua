-- Data parallel training (remax.bind.dist, engine/dist/). In-process checks run in a world of one;
-- the rest start `mpirun -np 2` on the CPU and compare with one process on the same global batch.
-- They skip, saying why, when mpirun or the MPI backend (libremax_mpi.so) is not there.
local ffi = require("ffi")
local dist = require("remax.bind.dist")
local cli = require("remax.cli.main")

local support = require("support")
local tmpdir, write = support.tmpdir, support.write

local read = support.try_read

local function exists(path) return read(path) ~= nil end

describe("dist in a world of one", function()
  it("is rank 0 of 1 without a launcher and loads no MPI library", function()
    local w = dist.world()
    assert.are.equal(0, w.rank)
    assert.are.equal(1, w.size)
    assert.is_true(w.is_root)
    assert.are.equal("single", w.backend)
    assert.is_nil((read("/proc/self/maps") or ""):find("libmpi", 1, true))
    -- collectives return their input
    assert.are.same({ 3, 4.5 }, { w:sum(3, 4.5) })
    assert.are.same({ { a = 1 } }, w:gather({ a = 1 }))
    assert.are.same({ x = "y" }, w:broadcast({ x = "y" }))
    assert.is_true(w:any(true))
    assert.is_false(w:any(false))
    local ok, msg = w:agree(false, "boom")
    assert.is_false(ok)
    assert.are.equal("boom", msg)
  end)

  it("libremax and the remax program do not link libmpi", function()
    local bdir = cli.build_dir()
    for _, f in ipairs({ bdir .. "/libremax.so", bdir .. "/remax" }) do
      local p = assert(io.popen("ldd " .. f .. " 2>&1"))
      local out = p:read("*a")
      p:close()
      assert.is_nil(out:find("libmpi", 1, true), f .. " links libmpi:\n" .. out)
    end
  end)

  it("splits n items into contiguous shares that cover 1..n once", function()
    for _, size in ipairs({ 1, 2, 3, 5 }) do
      for _, n in ipairs({ 0, 1, 4, 7, 12 }) do
        local next_first = 1
        for rank = 0, size - 1 do
          local w = setmetatable({ rank = rank, size = size }, dist.World)
          local first, last = w:share_range(n)
          assert.are.equal(next_first, first)
          local count = last - first + 1
          assert.is_true(count == math.floor(n / size) or count == math.floor(n / size) + 1)
          next_first = last + 1
        end
        assert.are.equal(n + 1, next_first)
      end
    end
  end)

  it("sends Lua values exactly", function()
    local v = { 0.1, 1 / 3, -0.0, 1e300, math.huge, -math.huge, "a\0b\n\"\\\255", true, false,
      nested = { x = { 1, 2, { y = "z" } } }, [20] = 2 ^ 60, [21] = 123456789012345 }
    local back = dist.decode(dist.encode(v))
    for i = 1, 8 do assert.are.equal(v[i], back[i]) end
    assert.is_false(back[9])
    assert.are.equal(1 / v[3], 1 / back[3])   -- -0 stays -0
    assert.are.equal(v[20], back[20])
    assert.are.equal(v[21], back[21])
    assert.are.same(v.nested, back.nested)
    local nan = dist.decode(dist.encode({ 0 / 0 }))[1]
    assert.is_true(nan ~= nan)
    assert.has_error(function() dist.encode({ print }) end, "dist: cannot send a function to another rank")
  end)

  it("rejects a REMAX_DIST value it does not know, naming it", function()
    local dir = tmpdir()
    write(dir .. "/probe.lua", 'local w = require("remax.bind.dist").world() print("world", w.rank, w.size, w.backend)')
    local p = assert(io.popen(("REMAX_DIST=bogus %s/remax run %s/probe.lua 2>&1; echo rc=$?"):format(cli.build_dir(), dir)))
    local out = p:read("*a")
    p:close()
    assert.is_truthy(out:find("REMAX_DIST=bogus: expected auto (the default), mpi or off", 1, true), out)
    assert.is_nil(out:find("rc=0", 1, true))
    p = assert(io.popen(("REMAX_DIST=off OMPI_COMM_WORLD_SIZE=2 %s/remax run %s/probe.lua 2>&1"):format(cli.build_dir(), dir)))
    out = p:read("*a")
    p:close()
    assert.is_truthy(out:find("world\t0\t1\tsingle"), out)
  end)
end)

---------------------------------------------------------------------------- two processes

local function mpi_missing()
  if os.execute("command -v mpirun >/dev/null 2>&1") ~= 0 then return "mpirun is not installed (apt-get install openmpi-bin libopenmpi-dev)" end
  if not exists(cli.build_dir() .. "/libremax_mpi.so") then
    return "remax was built without MPI (no libremax_mpi.so: CMake did not find libopenmpi-dev)"
  end
  return nil
end

local skip = mpi_missing()
if skip then print("dist_spec: skipping the mpirun tests: " .. skip) end

local REWARD = [[
-- the fraction of lowercase ASCII letters; FAIL_RANK / KILL_RANK make one rank fail at its call N
local ffi = require("ffi")
pcall(ffi.cdef, "int getpid(void); int kill(int pid, int sig);")
local calls = 0
return { name = "lower", fn = function(completions, batch)
  calls = calls + 1
  local rank = os.getenv("OMPI_COMM_WORLD_RANK")
  if rank and rank == os.getenv("FAIL_RANK") and calls == tonumber(os.getenv("FAIL_CALL")) then
    error("made to fail on rank " .. rank)
  end
  if rank and rank == os.getenv("KILL_RANK") and calls == tonumber(os.getenv("FAIL_CALL")) then
    local f = io.open(os.getenv("KILL_STAMP"), "w"); f:write(os.time()); f:close()
    ffi.C.kill(ffi.C.getpid(), 9)
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
  local lines = {}
  for i = 1, 24 do lines[i] = ('{"prompt": "say something %d", "answer": "x%d"}'):format(i, i) end
  write(dir .. "/p.jsonl", table.concat(lines, "\n") .. "\n")
  write(dir .. "/r.lua", ([[
return {
  model_config = { architectures = { "Qwen2ForCausalLM" }, hidden_size = 16, intermediate_size = 32,
    num_hidden_layers = 1, num_attention_heads = 2, num_key_value_heads = 1, max_position_embeddings = 128,
    rope_theta = 10000, rms_norm_eps = 1e-6, tie_word_embeddings = true },
  data = %q, rewards = { %q }, chat_template = "plain", hot_reload = false,
  num_generations = 2, max_completion_length = 6, learning_rate = 1e-2, max_steps = 3, eval_size = 0,
  save_steps = 0, log_completions = 1, seed = 7, output_dir = %q,
}
]]):format(dir .. "/p.jsonl", dir .. "/lower.lua", dir .. "/runs"))
  return dir .. "/r.lua"
end

-- Runs remax (under mpirun -np ranks when ranks > 1); returns output, exit code.
local function remax(ranks, args, env)
  local prefix = "OMP_NUM_THREADS=1 OMPI_MCA_btl_vader_single_copy_mechanism=none " .. (env or "") .. " "
  local cmd
  if ranks > 1 then
    cmd = ("%smpirun --allow-run-as-root --oversubscribe -np %d -x OMP_NUM_THREADS -x FAIL_RANK -x FAIL_CALL "
      .. "-x KILL_RANK -x KILL_STAMP %s/remax %s"):format(prefix, ranks, cli.build_dir(), args)
  else
    cmd = ("%s%s/remax %s"):format(prefix, cli.build_dir(), args)
  end
  local p = assert(io.popen(cmd .. " 2>&1; echo \"rc=$?\""))
  local out = p:read("*a")
  p:close()
  local rc = tonumber(out:match("rc=(%d+)%s*$"))
  return out, rc
end

local function jsonl(path)
  local cjson = require("cjson")
  local out = {}
  for line in (read(path) or ""):gmatch("[^\n]+") do out[#out + 1] = cjson.decode(line) end
  return out
end

-- Largest |a - b| / max(|a|, |b|, 1e-3) over every weight of two checkpoints; and whether all bits agree.
local function compare_weights(dir_a, dir_b)
  local st = require("remax.bind.safetensors")
  local a, b = st.open(dir_a), st.open(dir_b)
  local worst, same = 0, true
  for _, name in ipairs(a:names()) do
    local ta, tb = a:read(name, "f64"), b:read(name, "f64")
    local pa, pb = ffi.cast("double*", ta.data), ffi.cast("double*", tb.data)
    for i = 0, tonumber(ta.numel) - 1 do
      local x, y = pa[i], pb[i]
      if x ~= y then
        same = false
        worst = math.max(worst, math.abs(x - y) / math.max(math.abs(x), math.abs(y), 1e-3))
      end
    end
  end
  a:close()
  b:close()
  return worst, same
end

local function same_rollouts(one, two)
  local a, b = jsonl(one .. "/completions.jsonl"), jsonl(two .. "/completions.jsonl")
  assert.are.equal(#a, #b)
  assert.is_true(#a > 0)
  for i = 1, #a do
    assert.are.equal(a[i].prompt, b[i].prompt)
    assert.are.equal(a[i].completion, b[i].completion)
    assert.are.equal(a[i].reward, b[i].reward)
  end
  local ma, mb = jsonl(one .. "/metrics.jsonl"), jsonl(two .. "/metrics.jsonl")
  assert.are.equal(#ma, #mb)
  for i = 1, #ma do
    assert.are.equal(ma[i].reward, mb[i].reward)
    assert.are.equal(ma[i].completion_length_mean, mb[i].completion_length_mean)
  end
end

local describe_mpi = skip and pending or describe

describe_mpi("mpirun -np 2 on the CPU", function()
  local dir, rfile
  setup(function()
    dir = tmpdir()
    rfile = recipe(dir)
  end)

  it("is a world of one over MPI with REMAX_DIST=mpi and no launcher", function()
    write(dir .. "/probe.lua", 'local w = require("remax.bind.dist").world() print("world", w.rank, w.size, w.backend)')
    local out, rc = remax(1, ("run %s/probe.lua"):format(dir), "REMAX_DIST=mpi")
    assert.are.equal(0, rc, out)
    assert.is_truthy(out:find("world\t0\t1\tmpi %("), out)
    out, rc = remax(2, ("run %s/probe.lua"):format(dir))
    assert.are.equal(0, rc, out)
    assert.is_truthy(out:find("world\t0\t2\tmpi", 1), out)
    assert.is_truthy(out:find("world\t1\t2\tmpi", 1), out)
  end)

  -- 2 ranks x 4 prompts against 1 rank x 4 prompts x 2 accumulation steps: the same 8 prompts,
  -- the same micro-batches, so the same completions and (up to summation order) the same weights.
  local cases = {
    { name = "remax", args = "--algo remax" },
    { name = "grpo", args = "--algo grpo --generate_greedy false --num_generations 3" },
    { name = "beta", args = "--algo remax --beta 0.1" },
  }
  for _, case in ipairs(cases) do
    it(("trains like one process on the same global batch (%s)"):format(case.name), function()
      local out1, rc1 = remax(1, ("run %s %s --per_device_train_batch_size 4 --gradient_accumulation_steps 2 --run_name one-%s")
        :format(rfile, case.args, case.name))
      assert.are.equal(0, rc1, out1)
      local out2, rc2 = remax(2, ("run %s %s --per_device_train_batch_size 4 --run_name two-%s")
        :format(rfile, case.args, case.name))
      assert.are.equal(0, rc2, out2)
      local one, two = dir .. "/runs/one-" .. case.name, dir .. "/runs/two-" .. case.name
      same_rollouts(one, two)
      local worst, bits = compare_weights(one .. "/checkpoints/step-3", two .. "/checkpoints/step-3")
      print(("dist_spec %s: final weights %s (largest relative difference %.3g)"):format(case.name,
        bits and "bit-identical" or "differ in low bits", worst))
      -- two ranks' all-reduce adds the same two micro-batch gradients one process adds: same bits
      assert.is_true(bits, ("weights differ: largest relative difference %g"):format(worst))
    end)
  end

  it("has rank 0 alone write the run folder and print progress", function()
    local out, rc = remax(2, ("run %s --per_device_train_batch_size 4 --run_name solo --max_steps 1"):format(rfile))
    assert.are.equal(0, rc, out)
    local _, runs = out:gsub("run [^\n]*/runs/solo: remax", "")
    assert.are.equal(1, runs, out)
    local p = assert(io.popen("ls " .. dir .. "/runs"))
    local listing = p:read("*a")
    p:close()
    assert.is_truthy(listing:find("solo", 1, true))
    assert.is_nil(listing:find("solo-", 1, true))   -- no second folder from another rank's clock
    assert.is_true(exists(dir .. "/runs/solo/checkpoints/step-1/trainer_state.json"))
    local m = jsonl(dir .. "/runs/solo/metrics.jsonl")
    assert.are.equal(1, #m)
    -- the logs cover the 8 prompts of both ranks: 2 sampled rows and 1 greedy row each
    assert.are.equal(8 * 3, #jsonl(dir .. "/runs/solo/completions.jsonl"))
  end)

  it("resumes with the same global batch and refuses another one", function()
    local out, rc = remax(1, ("run %s --per_device_train_batch_size 4 --resume %s/runs/two-remax --max_steps 4")
      :format(rfile, dir))
    assert.are_not.equal(0, rc)
    assert.is_truthy(out:find("2 rank(s) x 4 prompts per step (8 in all)", 1, true), out)
    assert.is_truthy(out:find("mpirun -np 2", 1, true), out)
    -- 1 rank x 4 x 2 accumulation steps is the same global batch: the data order is global
    out, rc = remax(1, ("run %s --per_device_train_batch_size 4 --gradient_accumulation_steps 2 --resume %s/runs/two-remax --max_steps 4")
      :format(rfile, dir))
    assert.are.equal(0, rc, out)
    assert.is_true(exists(dir .. "/runs/two-remax/checkpoints/step-4/trainer_state.json"))
    -- and two ranks resume a two-rank run
    out, rc = remax(2, ("run %s --per_device_train_batch_size 4 --resume %s/runs/two-grpo --algo grpo --generate_greedy false --num_generations 3 --max_steps 4")
      :format(rfile, dir))
    assert.are.equal(0, rc, out)
    assert.is_true(exists(dir .. "/runs/two-grpo/checkpoints/step-4/trainer_state.json"))
  end)

  it("stops every rank when a reward fails on one, after rank 0 saves the last step", function()
    local out, rc = remax(2, ("run %s --per_device_train_batch_size 4 --run_name fail --max_steps 5"):format(rfile),
      "FAIL_RANK=1 FAIL_CALL=3")   -- call 1 is the reward check at setup, 3 is step 2
    assert.are_not.equal(0, rc)
    assert.is_truthy(out:find("remax (rank 0 of 2): reward 'lower'", 1, true), out)
    assert.is_truthy(out:find("remax (rank 1 of 2): reward 'lower'", 1, true), out)
    assert.is_truthy(out:find("made to fail on rank 1", 1, true), out)
    assert.is_true(exists(dir .. "/runs/fail/checkpoints/step-1/trainer_state.json"))
  end)

  it("saves and stops on Ctrl-C to mpirun, given the ranks time to save", function()
    local log, pidfile = dir .. "/ctrlc.log", dir .. "/ctrlc.pid"
    -- Open MPI sends SIGTERM to the ranks, then SIGKILL after odls_base_sigkill_timeout seconds
    local cmd = ("(exec env OMP_NUM_THREADS=1 OMPI_MCA_btl_vader_single_copy_mechanism=none "
      .. "OMPI_MCA_odls_base_sigkill_timeout=20 mpirun --allow-run-as-root --oversubscribe -np 2 -x OMP_NUM_THREADS "
      .. "%s/remax run %s --per_device_train_batch_size 4 --run_name ctrlc --max_steps 100000 >%s 2>&1) & echo $! >%s")
      :format(cli.build_dir(), rfile, log, pidfile)
    assert.is_true(os.execute(cmd) == 0)
    local pid = tonumber(read(pidfile))
    local metrics = dir .. "/runs/ctrlc/metrics.jsonl"
    local t0 = os.time()
    while #jsonl(metrics) < 2 and os.time() - t0 < 300 do os.execute("sleep 0.5") end
    assert.is_true(#jsonl(metrics) >= 2, "the run did not start: " .. (read(log) or ""))
    os.execute("kill -INT " .. pid)   -- what Ctrl-C sends
    t0 = os.time()
    -- running: not gone and not a zombie (the launcher's parent shell has exited; nobody reaps it)
    local function running()
      local st = read("/proc/" .. pid .. "/status")
      return st ~= nil and not st:find("State:%s*Z")
    end
    while running() and os.time() - t0 < 120 do os.execute("sleep 0.5") end
    local alive = running()
    if alive then os.execute("kill -9 " .. pid) end
    assert.is_false(alive, "mpirun still ran 120 s after Ctrl-C")
    -- rank 0 saved the last finished step (mpirun may drop the ranks' last output lines, so the
    -- checkpoint is what counts)
    local steps = #jsonl(metrics)
    local ckpt = ("%s/runs/ctrlc/checkpoints/step-%d/trainer_state.json"):format(dir, steps)
    assert.is_true(exists(ckpt), ckpt .. " is missing; output:\n" .. (read(log) or ""))
  end)

  it("ends the other rank within a minute when one is killed", function()
    local stamp = dir .. "/killed"
    local out, rc = remax(2, ("run %s --per_device_train_batch_size 4 --run_name killed --max_steps 50"):format(rfile),
      "KILL_RANK=1 FAIL_CALL=3 KILL_STAMP=" .. stamp)
    local ended = os.time()
    assert.are_not.equal(0, rc)
    local killed_at = tonumber(read(stamp))
    assert.is_truthy(killed_at, out)
    assert.is_true(ended - killed_at <= 60, ("the run went on %d s after rank 1 died"):format(ended - killed_at))
  end)
end)
