-- remax: the Lua library over the C engine. `local remax = require("remax")`.
local M = {}

local lazy = {
  ffi = "remax.bind.ffi",
  tensor = "remax.bind.tensor",
  optim = "remax.bind.optim",
  model = "remax.bind.model",
  safetensors = "remax.bind.safetensors",
  tokenizer = "remax.bind.tokenizer",
  chat = "remax.text.chat", data = "remax.train.data",
  runs = "remax.train.runs", progress = "remax.train.progress", plot = "remax.train.plot",
  config = "remax.train.config", algos = "remax.train.algos", trainer = "remax.train.trainer", recipe = "remax.train.recipe", rewards = "remax.train.rewards",
}

-- Submodules load on first use, so `require("remax")` stays cheap.
setmetatable(M, {
  __index = function(t, k)
    local name = lazy[k]
    if not name then return nil end
    local mod = require(name)
    -- remax.model.load also reads LoRA adapter folders: the LoRA module installs that loader
    if k == "model" then require("remax.bind.lora") end
    rawset(t, k, mod)
    return mod
  end,
})

function M.version()
  local ffi = require("ffi")
  return ffi.string(require("remax.bind.ffi").C.rx_version())
end

-- OpenBLAS's kernel set in use ("SkylakeX", "Haswell", ...).
function M.blas_core()
  local ffi = require("ffi")
  return ffi.string(require("remax.bind.ffi").C.rx_blas_core())
end

-- The bf16 kernels this CPU uses for bf16 weights ("vdpbf16ps (AVX-512 BF16)"), or why none.
function M.bf16_kernels()
  local ffi = require("ffi")
  return ffi.string(require("remax.bind.ffi").C.rx_bf16_kernels())
end

-- The GEMMs bf16 training runs on this CPU and why ("OpenBLAS sgemm on widened bf16 weights ...
-- (AVX-512 BF16 without AMX: ...)"); bf16_train_pays: whether dtype = auto trains in bf16 here.
function M.bf16_train_kernels()
  local ffi = require("ffi")
  return ffi.string(require("remax.bind.ffi").C.rx_bf16_train_kernels())
end
function M.bf16_train_pays() return require("remax.bind.ffi").C.rx_bf16_train_pays() ~= 0 end

-- The CUDA backend of this build, in words: not built, built for the GPU, or the CPU emulation.
function M.cuda_backend()
  local ffi = require("ffi")
  local kind = ffi.string(require("remax.bind.ffi").C.rx_cuda_backend())
  return ({ none = "not built", device = "built for the GPU",
    emulated = "emulated on the CPU (for testing, not speed)" })[kind] or kind
end

return M
