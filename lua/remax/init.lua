-- remax: the Lua library over the C engine. `local remax = require("remax")`.
local M = {}

-- Old module names (require("remax.lora"), require("remax.train.config"), ...) keep working, with
-- a note, for whoever loads the package face (remax.deprecated holds the table).
require("remax.deprecated").register()
-- The settings' algorithms and loss types (remax.config resolves `algo` against them).
require("remax.step.algos").register()

-- The public face: every documented module, under a name that stays put when files move
-- (recipes and docs use require("remax").<name>; tests/lua/api_spec.lua pins the list).
local lazy = {
  ffi = "remax.bind.ffi",
  tensor = "remax.bind.tensor",
  optim = "remax.bind.optim",
  model = "remax.bind.model",
  lora = "remax.bind.lora",
  reward_model = "remax.step.model_reward",
  safetensors = "remax.bind.safetensors",
  gguf = "remax.formats.gguf",
  tokenizer = "remax.bind.tokenizer",
  dist = "remax.bind.dist",
  chat = "remax.text.chat", jinja = "remax.text.jinja",
  data = "remax.formats.data",
  runs = "remax.run.folder", progress = "remax.run.progress", plot = "remax.run.plot",
  tensorboard = "remax.run.tensorboard",
  config = "remax.settings.config", algos = "remax.step.algos", trainer = "remax.run.run", recipe = "remax.settings.recipe",
  rewards = "remax.step.rewards", fit = "remax.step.fit",
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
