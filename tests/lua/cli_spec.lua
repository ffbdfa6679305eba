-- The remax program itself: `remax version` and the OpenBLAS kernels it runs with.
local function binary() return require("remax.cli.main").build_dir() .. "/remax" end

local function version(env)
  local p = assert(io.popen(("%s '%s' version 2>&1"):format(env, binary())))
  local out = p:read("*a")
  p:close()
  return out
end

local function cpu_has(flag)
  local f = io.open("/proc/cpuinfo")
  if not f then return false end
  local text = f:read("*a")
  f:close()
  return text:find("%f[%w_]" .. flag .. "%f[^%w_]") ~= nil
end

describe("remax version", function()
  it("names the version, the OpenBLAS kernels in use and how CUDA was built", function()
    local out = version("env")
    assert.is_truthy(out:match("^remax %d+%.%d+%.%d+ %(OpenBLAS kernels: %w+; CUDA: [^;]+; bf16 kernels: [^\n]+%)\n$"), out)
    local backend = require("ffi").string(require("remax.bind.ffi").C.rx_cuda_backend())
    local want = ({ none = "CUDA: not built", device = "CUDA: built for the GPU",
      emulated = "CUDA: emulated on the CPU (for testing, not speed)" })[backend]
    assert.is_truthy(want and out:find(want, 1, true), out)
    assert.are.equal(want, "CUDA: " .. require("remax").cuda_backend())
  end)

  it("names the bf16 kernels in use: vdpbf16ps where the CPU has AVX-512 BF16, else why none", function()
    local out = version("env -u REMAX_NO_BF16_DOT")
    if cpu_has("avx512_bf16") then
      assert.is_truthy(out:find("bf16 kernels: vdpbf16ps (AVX-512 BF16)", 1, true), out)
    else
      assert.is_truthy(out:find("bf16 kernels: none: ", 1, true), out)
    end
    out = version("env REMAX_NO_BF16_DOT=1")
    assert.is_truthy(out:find("bf16 kernels: none: bf16_dot = off", 1, true), out)
    assert.is_truthy(out:find("developer overrides): REMAX_NO_BF16_DOT=1 (bf16_dot = off)", 1, true), out)
  end)

  it("leaves an OPENBLAS_CORETYPE the user set alone", function()
    assert.is_truthy(version("env OPENBLAS_CORETYPE=Prescott"):find("OpenBLAS kernels: Prescott", 1, true))
    if cpu_has("avx2") then
      assert.is_truthy(version("env OPENBLAS_CORETYPE=Haswell"):find("OpenBLAS kernels: Haswell", 1, true))
    end
  end)

  it("does not run OpenBLAS's SSE3 fallback kernels on a CPU with AVX2", function()
    if not (cpu_has("avx2") and cpu_has("fma")) then return end
    local out = version("env -u OPENBLAS_CORETYPE")
    assert.is_falsy(out:find("Prescott", 1, true), out)
    assert.is_falsy(out:find("Core2", 1, true), out)
  end)
end)
