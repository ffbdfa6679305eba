-- tests/lua/nccl_probe.lua: the NCCL side of remax's collectives on CUDA tensors, run by
-- dist_spec.lua as `REMAX_DIST=mpi remax run tests/lua/nccl_probe.lua` (a world of one over MPI,
-- so the backend, not the world-of-one shortcut, runs every call) where a CUDA device (a GPU, or
-- the CPU emulation of CUDA with its NCCL) and an NCCL-built libremax_mpi.so exist. Prints
-- "nccl probe ok" or stops with what differed.
local ffi = require("ffi")
local dist = require("remax.bind.dist")
local tensor = require("remax.bind.tensor")
local optim = require("remax.bind.optim")
local C = require("remax.bind.ffi").C

local w = dist.world()
assert(w.backend:find("NCCL", 1, true), "libremax_mpi.so was built without NCCL: " .. w.backend)

local function filled(n, device, seed)
  local t = tensor.new({ n }, "f32")
  t:normal_(seed, 0, 0, 1)
  return device == "cuda" and t:to("cuda") or t
end

local function same(a, b, what, tol)
  local x, y = a:to("cpu"), b:to("cpu")
  local px, py = ffi.cast("float*", x.data), ffi.cast("float*", y.data)
  for i = 0, tonumber(x.numel) - 1 do
    local d = math.abs(px[i] - py[i])
    if d > (tol or 0) * math.max(math.abs(px[i]), 1) then
      error(("%s: element %d is %.9g, expected %.9g"):format(what, i, py[i], px[i]), 0)
    end
  end
end

-- the collectives: equal shards (ncclReduceScatter / ncclAllGather) and a short one (grouped
-- ncclReduce / ncclBroadcast); in a world of one each leaves the buffer as it was
for _, n in ipairs({ 1024, 1000 }) do
  local host = filled(n, "cpu", 1)
  local dev = host:to("cuda")
  w:reduce_scatter(dev, w:shard_size(n))
  same(host, dev, ("reduce-scatter of %d"):format(n))
  w:allgather(dev, w:shard_size(n))
  same(host, dev, ("all-gather of %d"):format(n))
  w:broadcast_tensor(dev, 0)
  same(host, dev, ("broadcast of %d"):format(n))
  w:allreduce_tensors({ dev })
  same(host, dev, ("all-reduce of %d"):format(n))
end

-- ZeRO-2 AdamW on CUDA tensors against the same on the CPU: a stand-in model whose trained
-- tensors are views of one arena per device
local function fake_model(device)
  local sizes, names = { 300, 64, 1000 }, { "a.weight", "b.bias", "c.weight" }
  local total = 0
  for _, s in ipairs(sizes) do total = total + math.ceil(s / 16) * 16 end
  local parena, garena = filled(total, device, 7), filled(total, device, 8)
  local p, g, at, offsets = {}, {}, 0, {}
  for i, s in ipairs(sizes) do
    p[names[i]] = dist.view(ffi.cast("char*", parena.data) + at * 4, s, parena)
    g[names[i]] = dist.view(ffi.cast("char*", garena.data) + at * 4, s, garena)
    offsets[names[i]] = at
    at = at + math.ceil(s / 16) * 16
  end
  -- model:flat()'s layout (the padding between tensors is not zero here: both devices see the same)
  local flat = { params = parena, grads = garena, n = total, matrices = total, names = names, offsets = offsets }
  return { names = names, arenas = { parena, garena }, trainable = function() return p, g end, p = p,
    flat = function() return flat end }
end
local mc, md = fake_model("cpu"), fake_model("cuda")
local oc = optim.zero_adamw(w, mc, { lr = 1e-2, weight_decay = 0.1, stage = 2 })
local od = optim.zero_adamw(w, md, { lr = 1e-2, weight_decay = 0.1, stage = 2 })
local nc, nd = oc:reduce_grads(1.0), od:reduce_grads(1.0)
assert(math.abs(nc - nd) <= 1e-6 * nc, ("gradient norm %.9g on cuda, %.9g on the cpu"):format(nd, nc))
oc:step()
od:step()
for _, name in ipairs(mc.names) do
  local a, b = tensor.new({ tonumber(mc.p[name].numel) }, "f32"), tensor.new({ tonumber(md.p[name].numel) }, "f32")
  assert(C.rx_tensor_copy(a, mc.p[name]) == 0 and C.rx_tensor_copy(b, md.p[name]) == 0)
  same(a, b, "ZeRO-2 AdamW step of " .. name, 1e-6)
end
local sc, sd = oc:state(), od:state()
same(sc.tensors["m.c.weight"], sd.tensors["m.c.weight"], "gathered moments", 1e-6)
print("nccl probe ok")
