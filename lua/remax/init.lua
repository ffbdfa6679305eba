-- remax: the Lua library over the C engine. `local remax = require("remax")`.
local M = {}

local lazy = {
  ffi = "remax.ffi",
  tensor = "remax.tensor",
  optim = "remax.optim",
  model = "remax.model",
  safetensors = "remax.safetensors",
  tokenizer = "remax.tokenizer",
  chat = "remax.chat", data = "remax.data",
  runs = "remax.runs", progress = "remax.progress", plot = "remax.plot",
  config = "remax.config", algos = "remax.algos", trainer = "remax.trainer", recipe = "remax.recipe", rewards = "remax.rewards",
}

-- Submodules load on first use, so `require("remax")` stays cheap.
setmetatable(M, {
  __index = function(t, k)
    local name = lazy[k]
    if not name then return nil end
    local mod = require(name)
    rawset(t, k, mod)
    return mod
  end,
})

function M.version()
  local ffi = require("ffi")
  return ffi.string(require("remax.ffi").C.rx_version())
end

return M
