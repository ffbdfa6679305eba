-- The remax program's OpenMP defaults for shared cores (issue 36, item 3; engine/host/main.c):
-- a short spin before a waiting thread sleeps unless the user chose a wait policy, and under
-- mpirun/srun each local rank's share of the cores unless OMP_NUM_THREADS is set; the engine's own
-- drop to the cores other processes leave (threads_adapt: tests/c/test_threads.c); all said by
-- `remax version` and the run's start line (remax.run.compute).
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
end)
