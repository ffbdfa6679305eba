-- bench/lora_memory.lua: what training holds besides activations, by the engine's own
-- accounting, for full fine-tuning with a KL reference (beta > 0) and for LoRA (the reference is
-- the base with adapters off; on an f32 base and on a base kept in bf16), and for full fine-tuning
-- with its reference in bf16, at a model shape. Weights stay zero: no forward runs. Not a test.
--   REMAX_LIB=$PWD/build/libremax.so LUA_PATH='lua/?.lua;lua/?/init.lua' luajit bench/lora_memory.lua \
--     [--shape qwen0.5b] [--r 16] [--targets all-linear]
local ffi = require("ffi")
local rx = require("remax.bind.ffi")
local remax = require("remax")
local lora = require("remax.bind.lora")
local common = dofile(arg[0]:match("^(.-)[^/]*$") .. "common.lua")
local C = rx.C

local o = common.options({ shape = "qwen0.5b", r = 16, alpha = 32, targets = "all-linear" }, arg)
local function new_model(weight_dtype)
  local cfg = {}
  for k, v in pairs(common.shapes[o.shape] or error("unknown shape " .. o.shape, 0)) do cfg[k] = v end
  cfg.architectures = { "Qwen2ForCausalLM" }
  local c = remax.model.resolve_config(cfg)
  c.dtype, c.device = C.RX_F32, C.RX_CPU
  c.weight_dtype = weight_dtype or C.RX_F32
  local out = ffi.new("rx_model*[1]")
  rx.check(C.rx_model_new(out, c))
  return { handle = ffi.gc(out[0], C.rx_model_free) }
end
local function mem(m)
  local mu = ffi.new("rx_model_memory")
  C.rx_model_memory_usage(m.handle, mu)
  return tonumber(mu.param_bytes), tonumber(mu.grad_bytes)
end
local MiB = 1048576

local full = new_model()
local n = tonumber(C.rx_model_param_count(full.handle))
for i = 0, n - 1 do C.rx_model_grad(full.handle, i) end          -- the gradient arena, as backward makes it
local fp, fg = mem(full)
local rows = { { "full + reference", fp, fg, 2 * fp, fp } }     -- AdamW m, v in f32; the reference: a second copy
full = nil
collectgarbage()
local rp = mem(new_model(C.RX_BF16))                             -- the reference kept in bf16 (frozen_dtype)
rows[#rows + 1] = { "full + bf16 reference", fp, fg, 2 * fp, rp }
collectgarbage()

local m = new_model()
lora.apply(m, { r = o.r, alpha = o.alpha, target_modules = o.targets })
local trainable = lora.num_parameters(m) * 4
for i = 0, tonumber(C.rx_model_lora_count(m.handle)) - 1 do C.rx_model_lora_grad(m.handle, i) end
local lp, lg = mem(m)
rows[#rows + 1] = { ("LoRA r=%d %s"):format(o.r, o.targets), lp, lg, 2 * trainable, 0 }
m = nil
collectgarbage()
local h = new_model(C.RX_BF16)                                   -- the base kept in bf16 (frozen_dtype)
lora.apply(h, { r = o.r, alpha = o.alpha, target_modules = o.targets })
for i = 0, tonumber(C.rx_model_lora_count(h.handle)) - 1 do C.rx_model_lora_grad(h.handle, i) end
local hp, hg = mem(h)
rows[#rows + 1] = { ("LoRA r=%d, bf16 base"):format(o.r), hp, hg, 2 * trainable, 0 }

print(("%s, f32 compute; MiB (activations come on top, the same for all)"):format(o.shape))
print(("%-28s %10s %10s %10s %10s %10s"):format("", "weights", "gradients", "AdamW", "reference", "total"))
for _, r in ipairs(rows) do
  print(("%-28s %10.1f %10.1f %10.1f %10.1f %10.1f"):format(r[1], r[2] / MiB, r[3] / MiB, r[4] / MiB, r[5] / MiB,
    (r[2] + r[3] + r[4] + r[5]) / MiB))
end
print(("trainable parameters: %d (LoRA) of %d"):format(trainable / 4, fp / 4))
