-- remax.bind.clock: the one clock of remax, wall-clock seconds from CLOCK_MONOTONIC (os.clock
-- counts the CPU time of all threads; os.time has whole seconds). Timings of steps, generation,
-- rewards, progress lines and exports all read it.
--
--   local now = require("remax.bind.clock").now
--   local t0 = now(); ...; local seconds = now() - t0
local ffi = require("ffi")

-- (the timespec goes as void*: another module may have declared clock_gettime with its own type)
for _, decl in ipairs({
  "struct rx_clock_timespec { int64_t tv_sec; long tv_nsec; };",
  "int clock_gettime(int clk_id, void *tp);",
}) do pcall(ffi.cdef, decl) end

local M = {}

local ts = ffi.new("struct rx_clock_timespec")
local tsp = ffi.cast("void *", ts)
local monotonic = ffi.os == "Linux" and pcall(function() return ffi.C.clock_gettime(1, tsp) end)

function M.now()
  if monotonic and ffi.C.clock_gettime(1, tsp) == 0 then
    return tonumber(ts.tv_sec) + tonumber(ts.tv_nsec) * 1e-9
  end
  return os.time()
end

return M
