-- Every behaviour switch of the engine is a setting (the Engine group of config.lua), validated
-- once like every other, handed to the engine by remax.bind.options; an environment variable
-- remains only as a developer's override, and then `remax version` and the run's start line say so.
local config = require("remax.settings.config")
local options = require("remax.bind.options")
local support = require("support")

local function remax_with_env(env, args)
  local p = io.popen(("%s %s %s 2>&1"):format(env, support.remax_binary(), args))
  local out = p:read("*a")
  p:close()
  return out
end

describe("engine options", function()
  local saved = {}
  before_each(function() for name in pairs(options.from_settings) do saved[name] = options.get(name) end end)
  after_each(function() for name, v in pairs(saved) do options.set(name, v) end end)

  it("are settings: each engine option has one, and the resolved settings set the engine", function()
    local ffi = require("ffi")
    local C = require("remax.bind.ffi").C
    for i = 0, C.rx_option_count() - 1 do
      local name = ffi.string(C.rx_option_name(i))
      assert.is_truthy(config.keys[name], "engine option " .. name .. " has no setting")
      assert.is_truthy(options.from_settings[name], name)
    end
    local cfg = config.resolve({ cuda_graphs = false, host_sampler = true, bf16_gemm = "sgemm", cuda_sync = true,
      bf16_dot = false, cuda_alloc = "plain", threads_adapt = false })
    options.apply(cfg)
    assert.are.equal("off", options.get("cuda_graphs"))
    assert.are.equal("on", options.get("host_sampler"))
    assert.are.equal("sgemm", options.get("bf16_gemm"))
    assert.are.equal("on", options.get("cuda_sync"))
    assert.are.equal("off", options.get("bf16_dot"))
    assert.are.equal("plain", options.get("cuda_alloc"))
    assert.are.equal("off", options.get("threads_adapt"))
    options.set("threads_adapt", "on")
    -- the bf16 GEMM choice follows the option at once (it is re-decided when an option moves)
    assert.matches("bf16_gemm = sgemm", require("remax.bind.build").bf16_train_kernels(), 1, true)
    assert.are.equal("f32", cfg.dtype, "dtype auto with bf16_gemm = sgemm trains in f32")
    options.set("bf16_gemm", "auto")
    assert.is_nil(require("remax.bind.build").bf16_train_kernels():match("bf16_gemm = sgemm"))
  end)

  it("refuse a bad value with the setting's name, and the engine names its options", function()
    local ok, err = pcall(config.resolve, { bf16_gemm = "fast" })
    assert.is_false(ok)
    assert.matches("bf16_gemm", tostring(err), 1, true)
    assert.matches("auto", tostring(err), 1, true)
    ok, err = pcall(options.set, "cuda_graph", "on")
    assert.is_false(ok)
    assert.matches("engine option 'cuda_graph' does not exist (options: bf16_gemm, bf16_dot, cuda_graphs", err, 1, true)
    ok, err = pcall(options.set, "cuda_alloc", "slab")
    assert.is_false(ok)
    assert.matches("engine option cuda_alloc = 'slab': expected one of: caching plain", err, 1, true)
  end)

  it("an environment variable overrides the setting, and remax version says so", function()
    local out = remax_with_env("REMAX_CUDA_GRAPHS=0 REMAX_BF16_GEMM=sgemm", "version")
    assert.matches("engine options set by the environment (developer overrides): REMAX_BF16_GEMM=sgemm (bf16_gemm = sgemm); "
      .. "REMAX_CUDA_GRAPHS=0 (cuda_graphs = off)", out, 1, true)
    assert.is_nil(remax_with_env("", "version"):match("developer overrides"), "nothing said when none is set")
    -- the override wins over a setting
    local p = io.popen(("REMAX_HOST_SAMPLER=1 %s -e %q 2>&1"):format("luajit", table.concat({
      "package.path = 'lua/?.lua;lua/?/init.lua;' .. package.path",
      "local o = require('remax.bind.options')",
      "o.set('host_sampler', 'off')",
      "io.write(o.get('host_sampler'))" }, "; ")))
    local got = p:read("*a")
    p:close()
    assert.are.equal("on", got)
  end)
end)
