-- remax.bind.build: what this build of the engine is and picks on this machine, in words: the
-- version, OpenBLAS's kernel set, the bf16 kernels and GEMMs, the CUDA backend.
local ffi = require("ffi")
local bit = require("bit")
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

-- The libremax.so this process runs, as "N bytes, hash H" (64-bit FNV-1a over its 8-byte words,
-- then its last bytes), or "(file not found)": ranks compare it (remax.run.agree). Read once.
local library_file
function M.library_file()
  if not library_file then
    local maps = io.open("/proc/self/maps")
    local text = maps and maps:read("*a") or ""
    if maps then maps:close() end
    local path = text:match("(/%S*libremax%.so)\n")
    local f = path and io.open(path, "rb")
    if f then
      local data = f:read("*a")
      f:close()
      local h = ffi.new("uint64_t[1]", 0xcbf29ce484222325ULL)
      local p8 = ffi.cast("const uint8_t*", data)
      local words, w64 = math.floor(#data / 8), ffi.cast("const uint64_t*", p8)
      local x = h[0]
      for i = 0, words - 1 do x = bit.bxor(x, w64[i]) * 0x100000001b3ULL end
      for i = words * 8, #data - 1 do x = bit.bxor(x, p8[i]) * 0x100000001b3ULL end
      library_file = ("%d bytes, hash %s"):format(#data, bit.tohex(x))
    else
      library_file = "(file not found)"
    end
  end
  return library_file
end

-- The CUDA backend of this build, in words: not built, built for the GPU, or the CPU emulation.
function M.cuda_backend()
  local kind = ffi.string(C.rx_cuda_backend())
  return ({ none = "not built", device = "built for the GPU",
    emulated = "emulated on the CPU (for testing, not speed)" })[kind] or kind
end

return M
