-- remax.bind.build: what this build of the engine is and picks on this machine, in words: the
-- version, OpenBLAS's kernel set, the bf16 kernels and GEMMs, the CUDA backend.
local ffi = require("ffi")
local rx = require("remax.bind.ffi")
local C = rx.C

local M = {}

function M.version() return ffi.string(C.rx_version()) end

-- OpenBLAS's kernel set in use ("SkylakeX", "Haswell", ...).
function M.blas_core() return ffi.string(C.rx_blas_core()) end

-- The bf16 kernels this CPU uses for bf16 weights ("vdpbf16ps (AVX-512 BF16)"), or why none.
function M.bf16_kernels() return ffi.string(C.rx_bf16_kernels()) end

-- The GEMMs bf16 training runs on this CPU and why ("OpenBLAS sgemm on widened bf16 weights ...
-- (AVX-512 BF16 without AMX: ...)"); bf16_train_pays: whether dtype = auto trains in bf16 here.
function M.bf16_train_kernels() return ffi.string(C.rx_bf16_train_kernels()) end
function M.bf16_train_pays() return C.rx_bf16_train_pays() ~= 0 end

-- The CUDA backend of this build, in words: not built, built for the GPU, or the CPU emulation.
function M.cuda_backend()
  local kind = ffi.string(C.rx_cuda_backend())
  return ({ none = "not built", device = "built for the GPU",
    emulated = "emulated on the CPU (for testing, not speed)" })[kind] or kind
end

return M
