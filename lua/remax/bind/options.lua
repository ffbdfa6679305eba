-- remax.bind.options: the engine's behaviour switches (remax.h's rx_set_option): the run's
-- Engine settings (bf16_gemm, bf16_dot, cuda_graphs, host_sampler, cuda_alloc, cuda_sync, threads_adapt) are
-- handed to the engine here, once, before a model loads. An option's environment variable, when
-- set, overrides the setting as a developer's switch: overrides() names those in force.
local ffi = require("ffi")
local rx = require("remax.bind.ffi")
local C = rx.C

local M = {}

-- The engine options and the settings that give them: name -> function(cfg) -> the engine's value.
local function on_off(key) return function(cfg) return cfg[key] and "on" or "off" end end
M.from_settings = {
  bf16_gemm = function(cfg) return cfg.bf16_gemm end,
  bf16_dot = on_off("bf16_dot"),
  cuda_graphs = on_off("cuda_graphs"),
  host_sampler = on_off("host_sampler"),
  cuda_alloc = function(cfg) return cfg.cuda_alloc end,
  cuda_sync = on_off("cuda_sync"),
  threads_adapt = on_off("threads_adapt"),
}

-- Sets one engine option; a bad name or value raises the engine's message (it names both).
function M.set(name, value) rx.check(C.rx_set_option(name, tostring(value)), 2) end

-- The value in force of an engine option ("on", "auto", ...), or nil for no such option.
function M.get(name)
  local v = C.rx_get_option(name)
  return v ~= nil and ffi.string(v) or nil
end

-- Every engine option from the resolved settings cfg (keys left nil keep the engine's default).
function M.apply(cfg)
  for i = 0, C.rx_option_count() - 1 do
    local name = ffi.string(C.rx_option_name(i))
    local from = M.from_settings[name]
    if from and cfg[name] ~= nil then M.set(name, from(cfg)) end
  end
end

-- The environment overrides in force, "REMAX_CUDA_GRAPHS=0 (cuda_graphs = off); ...", or nil.
function M.overrides()
  local s = ffi.string(C.rx_engine_overrides())
  return s ~= "" and s or nil
end

return M
