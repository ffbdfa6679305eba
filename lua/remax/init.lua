-- remax: the Lua library over the C engine. `local remax = require("remax")`.
local M = {}

local lazy = {
  ffi = "remax.bind.ffi",
  tensor = "remax.bind.tensor",
  optim = "remax.bind.optim",
  model = "remax.bind.model",
  safetensors = "remax.bind.safetensors",
  tokenizer = "remax.bind.tokenizer",
  chat = "remax.text.chat", data = "remax.step.data",
  runs = "remax.run.folder", progress = "remax.run.progress", plot = "remax.run.plot",
  config = "remax.settings.config", algos = "remax.step.algos", trainer = "remax.run.run", recipe = "remax.settings.recipe", rewards = "remax.step.rewards",
}

-- Submodules load on first use, so `require("remax")` stays cheap.
setmetatable(M, {
  __index = function(t, k)
    local name = lazy[k]
    if not name then return nil end
    local mod = require(name)
    -- remax.model.load also reads LoRA adapter folders: the LoRA module installs that loader
    if k == "model" then require("remax.bind.lora").register() end
    rawset(t, k, mod)
    return mod
  end,
})

-- What this build is and picks here (remax.bind.build): version, blas_core, bf16_kernels,
-- bf16_train_kernels, bf16_train_pays, cuda_backend.
for _, name in ipairs({ "version", "blas_core", "bf16_kernels", "bf16_train_kernels", "bf16_train_pays", "cuda_backend" }) do
  M[name] = function(...) return require("remax.bind.build")[name](...) end
end

return M
