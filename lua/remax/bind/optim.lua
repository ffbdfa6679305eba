-- remax.bind.optim: AdamW over named tensors, gradient norm and clipping, learning-rate schedules.
local ffi = require("ffi")
local rx = require("remax.bind.ffi")
local tensor = require("remax.bind.tensor")
local C, check = rx.C, rx.check

local M = {}

-- Parameters matching any of these Lua patterns get no weight decay (biases and norm scales,
-- picked by name, never by position).
M.default_no_decay = { "%.bias$", "norm%.weight$" }

local function sorted_names(params)
  local names = {}
  for name in pairs(params) do names[#names + 1] = name end
  table.sort(names)
  return names
end

local function matches_any(name, patterns)
  for _, p in ipairs(patterns) do
    if name:match(p) then return true end
  end
  return false
end

local AdamW = {}
AdamW.__index = AdamW

-- A view of `count` elements of the 1-D buffer `flat` from element `first`, shaped like `shape_of`
-- when given (a tensor whose shape it takes; count must be its numel), else 1-D.
local function flat_view(flat, first, count, shape_of)
  local t = ffi.new("rx_tensor")
  t.data = ffi.cast("char*", flat.data) + first * tonumber(C.rx_dtype_size(flat.dtype))
  t.dtype, t.device, t.device_index, t.numel = flat.dtype, flat.device, flat.device_index, count
  if shape_of then
    t.ndim = shape_of.ndim
    local stride = 1
    for d = shape_of.ndim - 1, 0, -1 do
      t.shape[d], t.stride[d] = shape_of.shape[d], stride
      stride = stride * shape_of.shape[d]
    end
  else
    t.ndim, t.shape[0], t.stride[0] = 1, count, 1
  end
  return t
end
M.flat_view = flat_view

-- The runs of a flat buffer that one AdamW call each updates: pieces = { {first, count, decay},
-- ... } (elements of the buffer, in any order, not overlapping) sorted by first, and neighbours
-- with the same decay merged across the padding between them (padding holds zeros: parameters,
-- gradients and moments of 0 stay 0, decay or not). Returns { {first, count, decay}, ... }.
local function decay_runs(pieces)
  local sorted = {}
  for i, p in ipairs(pieces) do sorted[i] = p end
  table.sort(sorted, function(a, b) return a.first < b.first end)
  local runs = {}
  for _, p in ipairs(sorted) do
    local last = runs[#runs]
    if last and last.decay == p.decay then
      last.count = p.first + p.count - last.first
    else
      runs[#runs + 1] = { first = p.first, count = p.count, decay = p.decay }
    end
  end
  return runs
end
M.decay_runs = decay_runs

-- AdamW. Two forms:
--   optim.adamw(model, opts)          the model's trained tensors (the adapters with LoRA, else
--                                     every parameter) over its flat buffers (model:flat()): the
--                                     moments are two flat buffers beside them on the model's
--                                     device; the gradient norm and clipping run over the whole
--                                     gradient buffer, and the update over one run per stretch
--                                     of equal weight decay (two with the default no_decay: the
--                                     matrices, then the norms and biases). A handful of launches
--                                     on a GPU, whatever the number of tensors.
--   optim.adamw(params, grads, opts)  tables name -> tensor (same keys), tensor by tensor, the
--                                     moments one pair of tensors per parameter on its device.
-- opts: lr, betas = {b1, b2}, eps, weight_decay, no_decay = {patterns}. Both forms give the same
-- bits per element (the update is element-wise); checkpoints hold the moments per tensor
-- ("m.<name>", "v.<name>", views into the flat buffers in the first form), so either form
-- resumes from the other's.
function M.adamw(params, grads, opts)
  local model
  if type(params) == "table" and params.handle and params.flat then model, opts = params, grads end
  opts = opts or {}
  local self = setmetatable({
    lr = opts.lr or 1e-3,
    beta1 = (opts.betas or {})[1] or 0.9,
    beta2 = (opts.betas or {})[2] or 0.999,
    eps = opts.eps or 1e-8,
    weight_decay = opts.weight_decay or 0.0,
    step_count = 0,
    m = {}, v = {}, decay = {}, runs = {},
  }, AdamW)
  if model then params, grads = model:trainable() end
  self.names, self.params, self.grads = sorted_names(params), params, grads
  local no_decay = opts.no_decay or M.default_no_decay
  for _, name in ipairs(self.names) do
    if not grads[name] then error(("adamw: parameter '%s' has no gradient tensor"):format(name), 2) end
    self.decay[name] = not matches_any(name, no_decay)
  end
  if model then
    local flat = model:flat()
    local p, g = flat.params, flat.grads
    local pdtype = ffi.string(C.rx_dtype_name(p.dtype))
    local device = tensor.device_name(p.device)
    self.flat = flat
    self.m_flat = tensor.new({ flat.n }, pdtype, device)   -- zeros, padding included
    self.v_flat = tensor.new({ flat.n }, pdtype, device)
    local pieces = {}
    for _, name in ipairs(self.names) do
      local at, t = flat.offsets[name], params[name]
      self.m[name] = flat_view(self.m_flat, at, tonumber(t.numel), t)
      self.v[name] = flat_view(self.v_flat, at, tonumber(t.numel), t)
      pieces[#pieces + 1] = { first = at, count = tonumber(t.numel), decay = self.decay[name] and 1 or 0 }
    end
    for k, r in ipairs(decay_runs(pieces)) do
      self.runs[k] = { name = ("elements %d..%d of the flat buffer"):format(r.first, r.first + r.count - 1),
        decay = r.decay, p = flat_view(p, r.first, r.count), g = flat_view(g, r.first, r.count),
        m = flat_view(self.m_flat, r.first, r.count), v = flat_view(self.v_flat, r.first, r.count) }
    end
    self.norm_list = { g }
  else
    self.norm_list = {}
    for _, name in ipairs(self.names) do
      local p = params[name]
      local moment_dtype = p:dtype_name() == "f64" and "f64" or "f32"
      self.m[name] = tensor.new(p:size(), moment_dtype, p:device_name())   -- on the parameter's device
      self.v[name] = tensor.new(p:size(), moment_dtype, p:device_name())
      self.runs[#self.runs + 1] = { name = name, decay = self.decay[name] and 1 or 0, p = p, g = grads[name],
        m = self.m[name], v = self.v[name] }
      self.norm_list[#self.norm_list + 1] = grads[name]
    end
  end
  self.cfg = ffi.new("rx_adamw_config")
  return self
end

-- One AdamW update of each of self.runs ({p, g, m, v, decay, name}) at step self.step_count + 1.
-- Where p is a bf16 model's master weights the engine rounds their bf16 working copy in the same
-- pass (rx_mirror_of in engine/core), so the next forward converts nothing.
local function update_runs(self, lr)
  self.step_count = self.step_count + 1
  local cfg = self.cfg
  cfg.lr, cfg.beta1, cfg.beta2, cfg.eps = lr or self.lr, self.beta1, self.beta2, self.eps
  cfg.weight_decay, cfg.step = self.weight_decay, self.step_count
  for _, r in ipairs(self.runs) do
    local rc = C.rx_adamw_step(r.p, r.g, r.m, r.v, cfg, r.decay)
    if rc ~= 0 then error(r.name .. ": " .. rx.last_error(), 3) end
  end
end

-- One update of every parameter. lr overrides the configured rate for this step (schedules).
function AdamW:step(lr) update_runs(self, lr) end

-- The global norm of the gradients the optimizer updates with; with max_norm > 0 they are then
-- scaled so it is at most max_norm. Returns the norm before clipping (inf or nan when a gradient
-- is not finite: skip the update). Over the flat gradient buffer in the model form.
function AdamW:clip(max_norm)
  if max_norm and max_norm > 0 then return M.clip_grad_norm(self.norm_list, max_norm) end
  return M.grad_norm(self.norm_list)
end

-- Moments and step count, as tensors keyed "m.<name>", "v.<name>" (for checkpoints).
function AdamW:state()
  local s = { step = self.step_count, tensors = {} }
  for _, name in ipairs(self.names) do
    s.tensors["m." .. name] = self.m[name]
    s.tensors["v." .. name] = self.v[name]
  end
  return s
end

-- Restores AdamW:state's; without tensors the step count alone (the moments came another way:
-- rank 0's, broadcast), as Zero:load_state.
function AdamW:load_state(s)
  if not s.tensors then self.step_count = s.step return end
  for _, name in ipairs(self.names) do
    for _, which in ipairs({ "m", "v" }) do
      local t = s.tensors[which .. "." .. name]
      if not t then error(("adamw state lacks '%s.%s'"):format(which, name), 2) end
      self[which][name]:copy_(t)
    end
  end
  self.step_count = s.step
end

-- Bytes the moments take (memory reports).
function AdamW:state_bytes()
  if self.m_flat then return 2 * tonumber(self.m_flat.numel) * tonumber(C.rx_dtype_size(self.m_flat.dtype)) end
  local bytes = 0
  for _, name in ipairs(self.names) do
    bytes = bytes + 2 * tonumber(self.m[name].numel) * tonumber(C.rx_dtype_size(self.m[name].dtype))
  end
  return bytes
end

local function tensor_array(list)
  local arr = ffi.new("rx_tensor*[?]", math.max(#list, 1))
  for i, t in ipairs(list) do arr[i - 1] = t end
  return arr
end

local function as_list(grads)
  if grads[1] then return grads end
  local list = {}
  for _, name in ipairs(sorted_names(grads)) do list[#list + 1] = grads[name] end
  return list
end

-- Global L2 norm of a list (or name -> tensor table) of gradients.
function M.grad_norm(grads)
  local list = as_list(grads)
  local out = ffi.new("double[1]")
  check(C.rx_grad_norm(ffi.cast("const rx_tensor *const *", tensor_array(list)), #list, out), 2)
  return out[0]
end

-- Scales gradients so their global norm is at most max_norm; returns the norm before clipping
-- (inf or nan when a gradient is not finite: skip that update).
function M.clip_grad_norm(grads, max_norm)
  local list = as_list(grads)
  local out = ffi.new("double[1]")
  check(C.rx_clip_grad_norm(tensor_array(list), #list, max_norm, out), 2)
  return out[0]
end

---------------------------------------------------------------------------- ZeRO

-- ZeRO-1 and ZeRO-2 (DeepSpeed's zero_stage): the trained tensors' arena is one flat buffer cut
-- into equal shards, one per rank (remax.bind.dist's shard_size). A rank keeps AdamW's moments for
-- its shard only, updates that shard of the weights (the f32 master weights) and all-gathers the
-- weights. Stage 1 all-reduces the gradients, so clipping sees them whole, exactly as without
-- ZeRO; stage 2 reduce-scatters them (a rank receives the sum of its shard only) and clips by the
-- global norm, the square root of the ranks' sums of squares added.
local Zero = {}
Zero.__index = Zero

local function piece_views(self)
  local dist = require("remax.bind.dist")
  local lo, hi = self.lo, self.hi
  local pes, mes = self.pflat.esize, tonumber(C.rx_dtype_size(self.m_flat.dtype))
  self.pieces = {}
  for i, name in ipairs(self.names) do
    local p, g = self.params[i], self.grads[i]
    local a = self.pflat.offsets[i]
    local b = a + tonumber(p.numel)
    local x, y = math.max(a, lo), math.min(b, hi)
    if x < y then
      local n = y - x
      self.pieces[#self.pieces + 1] = {
        name = name, index = i, at = x, first = x - a, count = n, decay = self.decay[name] and 1 or 0,
        p = dist.view(ffi.cast("char*", p.data) + (x - a) * pes, n, p),
        g = dist.view(ffi.cast("char*", g.data) + (x - a) * pes, n, g),
        m = dist.view(ffi.cast("char*", self.m_flat.data) + (x - lo) * mes, n, self.m_flat),
        v = dist.view(ffi.cast("char*", self.v_flat.data) + (x - lo) * mes, n, self.v_flat),
      }
    end
  end
  -- the update: one AdamW call per stretch of equal decay of this rank's shard (as AdamW's model
  -- form, whose runs these are cut at the shard's ends)
  local spans = {}
  for k, piece in ipairs(self.pieces) do spans[k] = { first = piece.at, count = piece.count, decay = piece.decay } end
  self.runs = {}
  for k, r in ipairs(decay_runs(spans)) do
    self.runs[k] = { name = ("elements %d..%d of the flat buffer"):format(r.first, r.first + r.count - 1),
      decay = r.decay, p = flat_view(self.pflat.view, r.first, r.count), g = flat_view(self.gflat.view, r.first, r.count),
      m = flat_view(self.m_flat, r.first - lo, r.count), v = flat_view(self.v_flat, r.first - lo, r.count) }
  end
  -- this rank's shard of the gradient buffer (stage 2's norm and clipping), padding included
  self.shard_grads = hi > lo and flat_view(self.gflat.view, lo, hi - lo) or nil
end

-- world: a remax.bind.dist world. model: a remax.model (its trainable tensors: the adapters with
-- LoRA, else every parameter). opts: adamw's, plus stage = 1 or 2.
function M.zero_adamw(world, model, opts)
  opts = opts or {}
  local stage = opts.stage
  if stage ~= 1 and stage ~= 2 then error(("zero_adamw: stage %s (1 or 2)"):format(tostring(stage)), 2) end
  local ptable, gtable = model:trainable()
  local order = model.lora and model.lora.names or model.names
  local self = setmetatable({
    zero = stage, world = world, lr = opts.lr or 1e-3,
    beta1 = (opts.betas or {})[1] or 0.9, beta2 = (opts.betas or {})[2] or 0.999, eps = opts.eps or 1e-8,
    weight_decay = opts.weight_decay or 0.0, step_count = 0,
    names = {}, params = {}, grads = {}, decay = {}, grad_table = gtable,
  }, Zero)
  local no_decay = opts.no_decay or M.default_no_decay
  for i, name in ipairs(order) do
    self.names[i], self.params[i], self.grads[i] = name, ptable[name], gtable[name]
    self.decay[name] = not matches_any(name, no_decay)
  end
  -- the engine's flat buffers of the trained tensors (model:flat(), as AdamW's model form)
  local flat = model:flat()
  local es = tonumber(C.rx_dtype_size(flat.params.dtype))
  self.pflat = { view = flat.params, offsets = {}, esize = es, n = flat.n }
  self.gflat = { view = flat.grads, offsets = self.pflat.offsets, esize = es, n = flat.n }
  for i, name in ipairs(self.names) do self.pflat.offsets[i] = flat.offsets[name] end
  local p1 = self.params[1]
  local pdtype = ffi.string(C.rx_dtype_name(p1.dtype))
  if pdtype ~= "f32" and pdtype ~= "f64" then
    error(("zero_adamw: the trained parameters are %s (f32 or f64 master weights)"):format(pdtype), 2)
  end
  self.n = self.pflat.n
  self.shard = world:shard_size(self.n)
  self.lo, self.hi = world:shard_range(self.n, self.shard)
  local device = tensor.device_name(p1.device)
  self.m_flat = tensor.new({ math.max(self.hi - self.lo, 1) }, pdtype, device)
  self.v_flat = tensor.new({ math.max(self.hi - self.lo, 1) }, pdtype, device)
  piece_views(self)
  self.cfg = ffi.new("rx_adamw_config")
  return self
end

-- Sums the gradients over ranks (stage 1: all of them; stage 2: this rank's shard), clips them
-- by the global norm when max_norm > 0, and returns that norm (before clipping; inf or nan
-- when a gradient is not finite: skip the update).
function Zero:reduce_grads(max_norm)
  local whole = { self.gflat.view }
  if self.zero == 1 then
    self.world:allreduce_tensors(self.grads)
    return max_norm > 0 and M.clip_grad_norm(whole, max_norm) or M.grad_norm(whole)
  end
  self.world:reduce_scatter(self.gflat.view, self.shard)
  local out = ffi.new("double[1]")
  out[0] = 0
  local list = { self.shard_grads }
  if self.shard_grads then
    check(C.rx_grad_sum_squares(ffi.cast("const rx_tensor *const *", tensor_array(list)), 1, out), 2)
  end
  local norm = math.sqrt(self.world:sum(out[0]))
  if self.shard_grads and max_norm > 0 and norm == norm and norm ~= math.huge and norm > max_norm then
    check(C.rx_scale(self.shard_grads, max_norm / (norm + 1e-6)), 2)   -- as rx_clip_grad_norm
  end
  return norm
end

-- One update of this rank's shard, then every rank's shard of the weights to every rank.
function Zero:step(lr)
  update_runs(self, lr)
  -- the other ranks' shards of the masters: a bf16 model converts its working copy once more
  self.world:allgather(self.pflat.view, self.shard)
end

function Zero:state_bytes()
  return 2 * tonumber(self.m_flat.numel) * tonumber(C.rx_dtype_size(self.m_flat.dtype))
end

-- Rank r's part [first, first + count) of tensor i (0-based elements of the tensor).
function Zero:part(i, r)
  local a = self.pflat.offsets[i]
  local b = a + tonumber(self.params[i].numel)
  local lo, hi = self.world:shard_range(self.n, self.shard, r)
  local x, y = math.max(a, lo), math.min(b, hi)
  if x >= y then return 0, 0 end
  return x - a, y - x
end

-- Collective (every rank calls it): the moments gathered whole on rank 0, keyed as AdamW:state
-- keys them ("m.<name>", "v.<name>"), so a checkpoint is the same whatever the stage and the
-- number of ranks, and resumes under any of them (on the host: moments on a GPU come through a
-- host copy, one piece at a time). Other ranks get no tensors.
function Zero:state()
  local world, out = self.world, { step = self.step_count, tensors = {} }
  local on_host = tonumber(self.m_flat.device) == tonumber(C.RX_CPU)
  local counts = ffi.new("int64_t[?]", world.size)
  local mes = tonumber(C.rx_dtype_size(self.m_flat.dtype))
  local own = {}
  for _, piece in ipairs(self.pieces) do own[piece.index] = piece end
  for i, name in ipairs(self.names) do
    for r = 0, world.size - 1 do
      local _, n = self:part(i, r)
      counts[r] = n * mes
    end
    local piece = own[i]
    for _, which in ipairs({ "m", "v" }) do
      local full = world.is_root and tensor.new(self.params[i]:size(), self.m_flat.dtype) or nil
      local send = piece and piece[which].data or nil
      if piece and not on_host then   -- moments on a GPU: through a host copy of this piece
        local host = tensor.new({ piece.count }, self.m_flat.dtype)
        check(C.rx_tensor_copy(host, piece[which]), 2)
        send = host.data
        piece.host = host   -- alive until the gather below has sent it
      end
      check(C.rx_dist_gather(send, piece and piece.count * mes or 0, full and full.data or nil, counts, 0), 2)
      if full then out.tensors[which .. "." .. name] = full end
      if piece then piece.host = nil end
    end
  end
  return out
end

local function copy_part(dst, src, first)
  local dist = require("remax.bind.dist")
  local es = tonumber(C.rx_dtype_size(src.dtype))
  check(C.rx_tensor_copy(dst, dist.view(ffi.cast("char*", src.data) + first * es, dst.numel, src)), 3)
end

-- s.tensors: whole moments keyed "m.<name>" / "v.<name>" (a checkpoint's, on rank 0), or none
-- (the other ranks: share_from_root hands them their parts).
function Zero:load_state(s)
  self.step_count = s.step
  if not s.tensors or next(s.tensors) == nil then return end
  for _, name in ipairs(self.names) do
    for _, which in ipairs({ "m", "v" }) do
      if not s.tensors[which .. "." .. name] then error(("adamw state lacks '%s.%s'"):format(which, name), 2) end
    end
  end
  for _, piece in ipairs(self.pieces) do
    copy_part(piece.m, s.tensors["m." .. piece.name], piece.first)
    copy_part(piece.v, s.tensors["v." .. piece.name], piece.first)
  end
  if self.world.size > 1 then self.from_root = s.tensors end
end

-- Collective: the moments rank 0 loaded (load_state) to every rank's shard, one tensor at a
-- time; nothing moves when rank 0 loaded none.
function Zero:share_from_root()
  local world = self.world
  if world.size == 1 then return end
  if not world:broadcast(self.from_root ~= nil) then return end
  local own = {}
  for _, piece in ipairs(self.pieces) do own[piece.index] = piece end
  local biggest = 0
  for _, p in ipairs(self.params) do biggest = math.max(biggest, tonumber(p.numel)) end
  local scratch = not world.is_root and tensor.new({ biggest }, self.m_flat.dtype) or nil
  for i, name in ipairs(self.names) do
    for _, which in ipairs({ "m", "v" }) do
      local full = world.is_root and self.from_root[which .. "." .. name]
        or require("remax.bind.dist").view(scratch.data, tonumber(self.params[i].numel), scratch)
      world:broadcast_tensor(full, 0)
      local piece = own[i]
      if piece and not world.is_root then copy_part(piece[which], full, piece.first) end
    end
  end
  self.from_root = nil
end

-- Learning rate of the step-th optimizer update (1-based) of total: a linear warmup over the
-- first warmup_steps updates (base_lr * step / warmup_steps, so none runs at lr 0), then
-- constant, linear or cosine decay counted as Hugging Face's schedulers count (0-based
-- s = step - 1): linear base_lr * (total - s) / (total - warmup_steps), cosine
-- base_lr * 0.5 * (1 + cos(pi * (s - warmup_steps) / (total - warmup_steps))). The first decay
-- update runs at base_lr and the last one above 0, so no update is wasted at lr 0.
function M.schedule(kind, base_lr, step, total, warmup_steps)
  warmup_steps = warmup_steps or 0
  if step <= warmup_steps and warmup_steps > 0 then return base_lr * step / warmup_steps end
  local s = step - 1
  local progress = total > warmup_steps and (s - warmup_steps) / (total - warmup_steps) or 1
  progress = math.min(math.max(progress, 0), 1)
  if kind == "constant" or kind == "constant_with_warmup" then return base_lr
  elseif kind == "linear" then return base_lr * (1 - progress)
  elseif kind == "cosine" then return base_lr * 0.5 * (1 + math.cos(math.pi * progress))
  end
  error(("unknown lr_scheduler_type '%s' (valid: constant, linear, cosine)"):format(tostring(kind)), 2)
end

return M
