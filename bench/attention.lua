-- bench/attention.lua: times the CPU attention kernel (forward, backward) at the training shapes
-- of the small and Qwen2-0.5B models and at a decode step, f32, all-ones mask, best of N runs
-- (the machine is shared). Not a test.
--   REMAX_LIB=$PWD/build/libremax.so LUA_PATH='lua/?.lua;lua/?/init.lua' luajit bench/attention.lua [reps]
local remax = require("remax")
local rx = require("remax.bind.ffi")
local ffi = require("ffi")
local C = rx.C

ffi.cdef [[ struct rx_timespec { long tv_sec; long tv_nsec; };
            int clock_gettime(int clk, struct rx_timespec *ts); ]]
local function now()
  local ts = ffi.new("struct rx_timespec")
  ffi.C.clock_gettime(1, ts)
  return tonumber(ts.tv_sec) + tonumber(ts.tv_nsec) * 1e-9
end

local reps = tonumber(arg[1]) or 5

local function best(fn)
  fn()                                   -- warm-up: page in buffers, spin up threads
  local b = math.huge
  for _ = 1, reps do
    local t0 = now(); fn(); b = math.min(b, now() - t0)
  end
  return b
end

local function randn(shape, seed)
  local t = remax.tensor.new(shape, "f32")
  rx.check(C.rx_tensor_normal(t, seed, 0, 0, 1))
  return t
end

-- name, B, Tq, Tk, H, KV, D, cache length (k/v are views of a [B,cache,KV,D] cache when larger)
local cases = {
  { "train small  B=8  T=256 H=8  KV=2 D=32", 8, 256, 256, 8, 2, 32, 256, true },
  { "train 0.5b   B=4  T=256 H=14 KV=2 D=64", 4, 256, 256, 14, 2, 64, 256, true },
  { "decode rows=32 Tq=1 Tk=512 H=14 KV=2 D=64", 32, 1, 512, 14, 2, 64, 1024, false },
}

for _, c in ipairs(cases) do
  local name, B, Tq, Tk, H, KV, D, cacheT, train = unpack(c)
  local q = randn({ B, Tq, H, D }, 1)
  local kc, vc = randn({ B, cacheT, KV, D }, 2), randn({ B, cacheT, KV, D }, 3)
  local kp, vp = ffi.new("rx_tensor*[1]"), ffi.new("rx_tensor*[1]")
  rx.check(C.rx_tensor_narrow(kp, kc, 1, 0, Tk)); rx.check(C.rx_tensor_narrow(vp, vc, 1, 0, Tk))
  local k, v = remax.tensor.own(kp[0]), remax.tensor.own(vp[0])
  local mask = remax.tensor.new({ B, Tk }, "i32")
  rx.check(C.rx_tensor_fill(mask, 1))
  local out, lse = remax.tensor.new({ B, Tq, H, D }, "f32"), remax.tensor.new({ B, H, Tq }, "f32")
  -- causal score count: each query sees (Tk - Tq + i + 1) keys; 2 GEMM-like products of 2 D flops
  local pairs = 0
  for i = 0, Tq - 1 do pairs = pairs + (Tk - Tq + i + 1) end
  local fwd_flop = 4 * B * H * D * pairs
  local tf = best(function() rx.check(C.rx_attention_forward(out, lse, q, k, v, mask, 0)) end)
  local line = ("%-42s forward %8.3f ms (%5.1f GFLOP/s)"):format(name, tf * 1e3, fwd_flop / tf * 1e-9)
  if train then
    local dout = randn({ B, Tq, H, D }, 4)
    local dq = remax.tensor.new({ B, Tq, H, D }, "f32")
    local dk, dv = remax.tensor.new({ B, Tk, KV, D }, "f32"), remax.tensor.new({ B, Tk, KV, D }, "f32")
    local tb = best(function()
      rx.check(C.rx_attention_backward(dq, dk, dv, dout, q, k, v, out, lse, mask, 0))
    end)
    line = line .. ("  backward %8.3f ms  fwd+bwd %8.3f ms"):format(tb * 1e3, (tf + tb) * 1e3)
  end
  print(line)
end
