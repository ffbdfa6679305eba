-- remax.run.compute: what a run computes with, in words, for the start line and `remax version`:
-- which GEMMs (OpenBLAS sgemm, oneDNN or OpenBLAS for bf16, cuBLAS) and how many threads, with
-- the OpenMP choices the host program made (engine/host/main.c: REMAX_THREADS_NOTE).
local M = {}

-- CPUs this process may run on (its affinity mask), from /proc/self/status.
function M.cpus()
  local f = io.open("/proc/self/status", "rb")
  if not f then return nil end
  local list
  for line in f:lines() do
    list = line:match("^Cpus_allowed_list:%s*(%S+)") or list
  end
  f:close()
  if not list then return nil end
  local n = 0
  for part in list:gmatch("[^,]+") do
    local a, b = part:match("^(%d+)%-(%d+)$")
    if a then n = n + tonumber(b) - tonumber(a) + 1 elseif tonumber(part) then n = n + 1 end
  end
  return n > 0 and n or nil
end

-- The OpenMP threads a parallel region uses: OMP_NUM_THREADS (its first number), else the CPUs
-- of the affinity mask (libgomp's default).
function M.threads()
  local env = tonumber((os.getenv("OMP_NUM_THREADS") or ""):match("^%s*(%d+)") or "")
  return env or M.cpus() or 1
end

-- The GEMMs a run with this dtype and device uses.
function M.gemms(dtype, device)
  local remax = require("remax.bind.build")
  if device and device ~= "cpu" then
    return ("cuBLAS on %s (%s)"):format(device, dtype or "f32")
  end
  if dtype == "bf16" then return remax.bf16_train_kernels() end
  return ("OpenBLAS sgemm (%s kernels)"):format(remax.blas_core())
end

-- Whether the CPU's thread count follows the cores other processes leave (threads_adapt).
function M.adapt_note()
  local on = require("remax.bind.options").get("threads_adapt") == "on"
  return on and "fewer threads while other processes hold cores (threads_adapt)" or "threads_adapt off: every thread always"
end

-- "GEMMs ...; N threads (...)": one line.
function M.describe(dtype, device)
  local note = os.getenv("REMAX_THREADS_NOTE")
  return ("GEMMs (%s): %s; %d OpenMP thread(s), %s%s"):format(dtype or "f32", M.gemms(dtype, device), M.threads(),
    M.adapt_note(), note and note ~= "" and ("; " .. note) or "")
end

return M
