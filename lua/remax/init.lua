-- remax: the Lua library over the C engine. `local remax = require("remax")`.
local M = {}

-- The public face: every documented module, under a name that stays put when files move
-- (recipes and docs use require("remax").<name>; tests/lua/api_spec.lua pins the list).
local lazy = {
  ffi = "remax.bind.ffi",
  tensor = "remax.bind.tensor",
  optim = "remax.bind.optim",
  model = "remax.bind.model",
  lora = "remax.bind.lora",
  reward_model = "remax.bind.reward_model",
  safetensors = "remax.bind.safetensors",
  gguf = "remax.bind.gguf",
  tokenizer = "remax.bind.tokenizer",
  dist = "remax.bind.dist",
  chat = "remax.text.chat", jinja = "remax.text.jinja",
  data = "remax.train.data",
  runs = "remax.train.runs", progress = "remax.train.progress", plot = "remax.train.plot",
  tensorboard = "remax.train.tensorboard",
  config = "remax.train.config", algos = "remax.train.algos", trainer = "remax.train.trainer", recipe = "remax.train.recipe",
  rewards = "remax.train.rewards", fit = "remax.train.fit",
}
M.modules = lazy

-- remax.tasks.<name>: the task modules (gsm8k, gsm8k_synth), loaded on first use.
local tasks = setmetatable({}, { __index = function(t, k)
  local ok, mod = pcall(require, "remax.tasks." .. tostring(k))
  if not ok then
    if tostring(mod):find("module 'remax.tasks." .. tostring(k) .. "' not found", 1, true) then return nil end
    error(mod, 2)
  end
  rawset(t, k, mod)
  return mod
end })

-- Submodules load on first use, so `require("remax")` stays cheap.
setmetatable(M, {
  __index = function(t, k)
    if k == "tasks" then rawset(t, k, tasks) return tasks end
    local name = lazy[k]
    if not name then return nil end
    local mod = require(name)
    -- remax.model.load also reads LoRA adapter folders: the LoRA module installs that loader
    if k == "model" then require("remax.bind.lora") end
    rawset(t, k, mod)
    return mod
  end,
})

-- For the shims of names that moved (lua/remax/<name>.lua): the module through the face, and
-- a note on stderr the first time each old name is required.
local noted = {}
function M.deprecated(old, name)
  if not noted[old] then
    noted[old] = true
    io.stderr:write(("remax: require(\"%s\") is deprecated (the module moved); use require(\"remax\").%s\n"):format(old, name))
  end
  return M[name]
end

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
