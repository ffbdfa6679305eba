-- bench/dist_collectives.lua: what summing the gradients in rank order costs. Times remax's
-- gradient all-reduce on the CPU (rx_dist_allreduce_tensors: a reduce-scatter that adds the
-- ranks' pieces in rank order, then MPI_Allgatherv) against Open MPI's own MPI_Allreduce on the
-- same number of bytes (rx_dist_allreduce_f64), interleaved, mean of 3 after one warm-up.
--   mpirun -np 4 -x OMP_NUM_THREADS=1 build/remax run bench/dist_collectives.lua [--mb 64]
local ffi = require("ffi")
local dist = require("remax.bind.dist")
local tensor = require("remax.bind.tensor")
local C = require("remax.bind.ffi").C
local now = require("remax.run.progress").now
local common = dofile(arg[0]:match("^(.-)[^/]*$") .. "common.lua")

local opts = common.options({ mb = 64, reps = 3 }, arg)
local w = dist.world()
local n = math.floor(opts.mb * 1e6 / 8) * 2   -- f32 elements; half as many doubles
local t = tensor.new({ n }, "f32")
t:fill_(1)
local d = ffi.new("double[?]", n / 2)
local ours, mpi = 0, 0
for rep = 0, opts.reps do
  w:barrier()
  local t0 = now()
  w:allreduce_tensors({ t })
  w:barrier()
  local t1 = now()
  assert(C.rx_dist_allreduce_f64(d, n / 2, 0) == 0, ffi.string(C.rx_last_error()))
  w:barrier()
  local t2 = now()
  if rep > 0 then ours, mpi = ours + t1 - t0, mpi + t2 - t1 end
end
if w.is_root then
  print(("%d ranks, %.0f MB: rank-order reduce-scatter + all-gather %.3f s, MPI_Allreduce %.3f s (%.2fx)")
    :format(w.size, n * 4 / 1e6, ours / opts.reps, mpi / opts.reps, ours / mpi))
end
