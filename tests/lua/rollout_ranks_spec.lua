-- Rollouts on ranks of their own (--rollout_ranks, remax.run.rollout_ranks, issue 46), under
-- `mpirun -np 2` on the CPU: rank 0 trains, rank 1 generates and scores. Which weights generate
-- which step is decided by step count, so the run gives the bits of one process running the same
-- async schedule on the same global batch; a generator that stops makes the trainer stop within
-- dist_timeout, naming it; a checkpoint keeps the rows generated ahead and resumes exactly.
-- Skips, saying why, without mpirun or libremax_mpi.so.
local cli = require("remax.cli.main")
local support = require("support")
local tmpdir, write, read = support.tmpdir, support.write, support.try_read

local skip = support.mpi_missing()
if skip then print("rollout_ranks_spec: skipping: " .. skip) end

local REWARD = [[
-- the fraction of lowercase letters; STOP_RANK stops its own process (SIGSTOP) at call STOP_CALL,
-- or with STOP_SIGNAL = 2 sends itself SIGINT (what Ctrl-C sends) and goes on
local ffi = require("ffi")
pcall(ffi.cdef, "int getpid(void); int kill(int pid, int sig);")
local calls = 0
return { name = "lower", fn = function(completions, batch)
  calls = calls + 1
  local rank = os.getenv("OMPI_COMM_WORLD_RANK")
  if rank and rank == os.getenv("STOP_RANK") and calls == tonumber(os.getenv("STOP_CALL")) then
    local f = io.open(os.getenv("STOP_STAMP"), "w"); f:write(os.time()); f:close()
    ffi.C.kill(ffi.C.getpid(), tonumber(os.getenv("STOP_SIGNAL") or "") or 19)
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
  num_generations = 2, max_completion_length = 6, learning_rate = 5e-2, max_steps = 4, eval_size = 0,
  save_steps = 0, log_completions = 0, seed = 7, output_dir = %q, dtype = "f32", per_device_train_batch_size = 4,
}
]]):format(dir .. "/p.jsonl", dir .. "/lower.lua", dir .. "/runs"))
  return dir .. "/r.lua"
end

local ENV = "OMP_NUM_THREADS=1 OMPI_MCA_btl_vader_single_copy_mechanism=none"
local MPIRUN = "mpirun --allow-run-as-root --oversubscribe -x OMP_NUM_THREADS -x STOP_RANK -x STOP_CALL -x STOP_STAMP -x STOP_SIGNAL"

-- Runs `remax ARGS` on n ranks (one: no launcher) with a bound; returns its output, exit code, seconds.
local function remax(n, args, env, bound)
  local b = cli.build_dir()
  local launch = n > 1 and ("%s -np %d "):format(MPIRUN, n) or ""
  local t0 = os.time()
  local p = assert(io.popen(("%s %s timeout -s KILL %d %s%s/remax %s 2>&1; echo \"rc=$?\""):format(ENV, env or "",
    bound or 120, launch, b, args)))
  local out = p:read("*a")
  p:close()
  return out, tonumber(out:match("rc=(%d+)%s*$")), os.time() - t0
end

local describe_mpi = skip and pending or describe

describe_mpi("rollout ranks", function()
  local dir, rfile
  setup(function()
    dir = tmpdir()
    rfile = recipe(dir)
  end)
  local function ckpt(name, step) return ("%s/runs/%s/checkpoints/step-%d"):format(dir, name, step) end
  local function metrics(name) return support.jsonl(("%s/runs/%s/metrics.jsonl"):format(dir, name)) end
  local function same_run(a, b)
    local _, same = support.compare_weights(ckpt(a, 4) .. "/model.safetensors", ckpt(b, 4) .. "/model.safetensors")
    assert.is_true(same, ("%s and %s end with different weights"):format(a, b))
    local ma, mb = metrics(a), metrics(b)
    assert.are.equal(#ma, #mb)
    for i = 1, #ma do
      assert.are.equal(ma[i].loss, mb[i].loss)
      assert.are.equal(ma[i].reward, mb[i].reward)
      if ma[i]["async/policy_version"] then assert.are.equal(ma[i]["async/policy_version"], mb[i]["async/policy_version"]) end
    end
    return ma, mb
  end

  for _, mode in ipairs({ "--async_mode one_step_off", "--async_mode async --max_staleness 2 --weight_sync_steps 2", "--async_mode off" }) do
    it(("1 trainer + 1 generator gives one process's bits (%s)"):format(mode), function()
      local tag = mode:gsub("[^%w]+", "_")
      local out, rc = remax(1, ("run %s %s --run_name one%s"):format(rfile, mode, tag))
      assert.are.equal(0, rc, out)
      out, rc = remax(2, ("run %s %s --rollout_ranks 1 --run_name two%s"):format(rfile, mode, tag))
      assert.are.equal(0, rc, out)
      assert.is_truthy(out:find("rank 0 trains, 1 generate and score", 1, true), out)
      local _, m = same_run("one" .. tag, "two" .. tag)
      for _, r in ipairs(m) do
        if r.step and r.loss then
          assert.is_number(r["async/trainer_idle"])
          assert.is_number(r["async/generator_busy"])
        end
      end
    end)
  end

  it("1 trainer + 2 generators (each its share of the prompts) gives one process's bits", function()
    -- the same tokens and rewards; the sampler's log-probabilities depend in their last bits on how
    -- many rows a generation call holds (the GEMMs' blocking), so the bits are equal without the
    -- correction and equal to rounding with it
    local off = "--async_mode one_step_off --vllm_importance_sampling_correction false"
    local out, rc = remax(1, ("run %s %s --run_name one3"):format(rfile, off))
    assert.are.equal(0, rc, out)
    out, rc = remax(3, ("run %s %s --rollout_ranks 2 --run_name three"):format(rfile, off), nil, 180)
    assert.are.equal(0, rc, out)
    same_run("one3", "three")
    out, rc = remax(1, ("run %s --async_mode one_step_off --run_name one3c"):format(rfile))
    assert.are.equal(0, rc, out)
    out, rc = remax(3, ("run %s --async_mode one_step_off --rollout_ranks 2 --run_name threec"):format(rfile), nil, 180)
    assert.are.equal(0, rc, out)
    local _, _, rel = support.compare_weights(ckpt("one3c", 4) .. "/model.safetensors", ckpt("threec", 4) .. "/model.safetensors")
    assert.is_true(rel < 1e-5, ("relative difference %g"):format(rel))
    local a, b = metrics("one3c"), metrics("threec")
    for i = 1, #a do assert.are.equal(a[i].reward, b[i].reward) end
  end)

  it("saves on Ctrl-C and resumes with the rows generated ahead: the same bits as an uninterrupted run", function()
    -- the generator's reward calls: 1 the check at setup, 2 and 3 steps 1 and 2 (round 1), 4 step 3
    -- (round 2): Ctrl-C on the generator then, the run stops after step 2 with step 3's rows in flight
    local out, rc = remax(2, ("run %s --async_mode one_step_off --rollout_ranks 1 --run_name half"):format(rfile),
      ("STOP_RANK=1 STOP_CALL=4 STOP_SIGNAL=2 STOP_STAMP=%s/int"):format(dir))
    assert.is_truthy(out:find("interrupted at step 2", 1, true), out)
    assert.is_truthy(read(ckpt("half", 2) .. "/trainer_state.json"), out)
    out, rc = remax(2, ("run %s --resume %s/runs/half"):format(rfile, dir))
    assert.are.equal(0, rc, out)
    out, rc = remax(1, ("run %s --async_mode one_step_off --run_name whole"):format(rfile))
    assert.are.equal(0, rc, out)
    same_run("whole", "half")
  end)

  it("stops the trainer within dist_timeout when the generator stops, naming it", function()
    local stamp = dir .. "/stopped"
    -- the generator's reward calls: 1 the check at setup, 2 and 3 the rows of steps 1 and 2 (round 1), 4 step 3's
    local out, rc, _ = remax(2, ("run %s --async_mode one_step_off --rollout_ranks 1 --max_steps 20 --dist_timeout 3 --run_name stopped")
      :format(rfile), ("STOP_RANK=1 STOP_CALL=4 STOP_STAMP=%s"):format(stamp), 90)
    local ended = os.time()
    assert.are_not.equal(0, rc, out)
    local stopped_at = tonumber(read(stamp))
    assert.is_truthy(stopped_at, out)
    assert.is_true(ended - stopped_at <= 30, ("the run went on %d s after the generator stopped"):format(ended - stopped_at))
    assert.is_truthy(out:find("waited 3 s (dist_timeout) for rank(s) 1, which did not come", 1, true), out)
  end)

  it("refuses what does not work yet, naming it", function()
    local out, rc = remax(2, ("run %s --rollout_ranks 2 --run_name bad"):format(rfile))
    assert.are_not.equal(0, rc)
    assert.is_truthy(out:find("rollout_ranks = 2: the world has 2 rank(s); at least one must train", 1, true), out)
  end)
end)
