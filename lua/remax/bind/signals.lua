-- remax.bind.signals: Ctrl-C (SIGINT) and SIGTERM as a flag the engine sets (rx_signal_* in
-- remax.h) and Lua polls between units of work, so a training run saves a checkpoint and a GGUF
-- export removes its half-written file instead of dying mid-write. A second Ctrl-C stops at once.
--
--   local signals = require("remax.bind.signals")
--   local on = signals.install()         -- false where the engine cannot catch signals
--   if signals.pending() then ... end
--   signals.clear()
local M = {}

local function C() return require("remax.bind.ffi").C end

-- Starts catching the signals; returns whether it could.
function M.install() return (pcall(function() return C().rx_signal_install() end)) end

-- Whether a signal came since install (or the last clear).
function M.pending()
  local ok, v = pcall(function() return C().rx_signal_pending() end)
  return ok and v ~= 0
end

-- Forgets a signal that came (the handlers stay installed).
function M.clear() pcall(function() return C().rx_signal_clear() end) end

return M
