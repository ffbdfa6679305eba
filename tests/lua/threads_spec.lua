-- The remax program's OpenMP defaults for shared cores (issue 36, item 3; engine/host/main.c):
-- a short spin before a waiting thread sleeps unless the user chose a wait policy, and under
-- mpirun/srun each local rank's share of the cores unless OMP_NUM_THREADS is set; the engine's own
-- drop to the cores other processes leave (threads_adapt: tests/c/test_threads.c); all said by
-- `remax version` and the run's start line (remax.run.compute). And what makes the drop harmless
-- (README, issue 45): an f32 run trains the same bits at 1 and at 2 threads, where OpenBLAS's
-- kernels allow it (rx_blas_same_bits: its AVX-512 kernel sets).
local support = require("support")

-- What the program sees: the environment it was started with (/proc/self/environ: what
-- libgomp read when it loaded, before main) and the threads line.
local function probe(env)
  local script = support.tmpfile() .. ".lua"
  support.write(script, [[
local f = io.open("/proc/self/environ", "rb")
local start = f:read("*a"); f:close()
local function started(name) return start:match("%z" .. name .. "=([^%z]*)") or start:match("^" .. name .. "=([^%z]*)") end
print("spin=" .. tostring(started("GOMP_SPINCOUNT")) .. " threads=" .. tostring(started("OMP_NUM_THREADS")))
print(require("remax.run.compute").describe("f32", "cpu"))
]])
  local p = io.popen(("env -u GOMP_SPINCOUNT -u OMP_WAIT_POLICY -u OMP_NUM_THREADS -u OMPI_COMM_WORLD_LOCAL_SIZE "
    .. "-u SLURM_NTASKS_PER_NODE -u MPI_LOCALNRANKS -u PMI_LOCAL_SIZE -u REMAX_THREADS_NOTE %s %s run %s 2>&1")
    :format(env or "", support.remax_binary(), support.shell_quote(script)))
  local out = p:read("*a")
  p:close()
  os.remove(script)
  return out
end

local function online()
  local p = io.popen("getconf _NPROCESSORS_ONLN")
  local n = tonumber(p:read("*a"))
  p:close()
  return n
end

describe("OpenMP defaults of the remax program", function()
  it("starts with a short spin count (libgomp reads it at load), unless the user set a wait policy", function()
    local out = probe()
    assert.matches("spin=10000 ", out, 1, true)
    assert.matches("OpenMP threads spin 10000 times before they sleep", out, 1, true)
    assert.matches("fewer threads while other processes hold cores (threads_adapt)", out, 1, true)
    out = probe("REMAX_THREADS_ADAPT=0")
    assert.matches("threads_adapt off: every thread always", out, 1, true)
    out = probe("OMP_WAIT_POLICY=active")
    assert.matches("spin=nil ", out, 1, true)
    assert.matches("OpenMP wait policy as set (OMP_WAIT_POLICY=active)", out, 1, true)
    out = probe("GOMP_SPINCOUNT=5")
    assert.matches("spin=5 ", out, 1, true)
  end)

  it("gives each local rank its share of the cores under mpirun or srun, unless OMP_NUM_THREADS is set", function()
    local n = online()
    local share = math.max(1, math.floor(n / 2))
    local out = probe("OMPI_COMM_WORLD_LOCAL_SIZE=2")
    assert.matches("threads=" .. share .. "\n", out, 1, true)
    assert.matches(("%d thread(s) per rank: 2 local ranks (OMPI_COMM_WORLD_LOCAL_SIZE) share %d cores"):format(share, n), out, 1, true)
    assert.matches("GEMMs (f32): OpenBLAS sgemm", out, 1, true)
    out = probe("SLURM_NTASKS_PER_NODE='" .. (2 * n) .. "(x3)'")
    assert.matches("threads=1\n", out, 1, true)
    out = probe("OMPI_COMM_WORLD_LOCAL_SIZE=2 OMP_NUM_THREADS=3")
    assert.matches("threads=3\n", out, 1, true)
    assert.matches("3 OpenMP thread(s)", out, 1, true)
    out = probe()
    assert.matches("threads=nil\n", out, 1, true)   -- alone: libgomp's own default (every CPU of the mask)
  end)
  it("trains the same bits at 1 and at 2 threads (f32), where OpenBLAS's kernels allow it", function()
    local ffi = require("ffi")
    local rx = require("remax.bind.ffi")
    if rx.C.rx_blas_same_bits() == 0 then
      pending("OpenBLAS's " .. ffi.string(rx.C.rx_blas_core()) .. " kernels: f32 GEMMs follow the thread count (README)")
      return
    end
    local dir = support.tmpdir()
    support.prompts(dir .. "/p.jsonl", 16)
    -- hidden 456 and about a thousand tokens per step: K values between OpenBLAS's GEMM_Q and 2 GEMM_Q,
    -- where its threaded and single-threaded drivers used to sum in different orders
    support.write(dir .. "/r.lua", ([[
return {
  model_config = { architectures = { "Qwen2ForCausalLM" }, hidden_size = 456, intermediate_size = 960,
    num_hidden_layers = 1, num_attention_heads = 6, num_key_value_heads = 2, max_position_embeddings = 256,
    rope_theta = 10000, rms_norm_eps = 1e-6, tie_word_embeddings = true },
  data = %q, rewards = { function(c) local s = {} for i = 1, #c do s[i] = #c[i] / 10 end return s end },
  chat_template = "plain", hot_reload = false, num_generations = 4, max_completion_length = 40, max_steps = 2,
  eval_size = 0, save_steps = 2, seed = 3, output_dir = %q, dtype = "f32", per_device_train_batch_size = 4,
  learning_rate = 1e-3,
}
]]):format(dir .. "/p.jsonl", dir .. "/runs"))
    local function train(threads)
      local p = io.popen(("cd %s && REMAX_THREADS_ADAPT=0 OMP_NUM_THREADS=%d %s run r.lua --run_name t%d 2>&1; echo rc=$?")
        :format(support.shell_quote(dir), threads, support.remax_binary(), threads))
      local out = p:read("*a")
      p:close()
      assert.matches("rc=0%s*$", out)
      local run = dir .. "/runs/t" .. threads
      local metrics = {}
      for line in (support.try_read(run .. "/metrics.jsonl") or ""):gmatch("[^\n]+") do
        local row = require("cjson").decode(line)
        metrics[#metrics + 1] = ("%.17g %.17g"):format(row.loss or 0, row.grad_norm or 0)
      end
      return support.try_read(run .. "/checkpoints/step-2/model.safetensors"), metrics
    end
    local w1, m1 = train(1)
    local w2, m2 = train(2)
    assert.is_truthy(w1 and #w1 > 0, "a checkpoint was written")
    assert.are.same(m1, m2, "loss and grad_norm at 1 and 2 threads")
    assert.is_true(w1 == w2, "the weights after 2 steps differ between 1 and 2 threads")
  end)
end)
