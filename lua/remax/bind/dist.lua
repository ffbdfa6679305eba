-- remax.bind.dist: data parallel training seen from Lua. A run started by mpirun / srun is a world
-- of several ranks; one started alone is a world of one, and every call here is then a no-op
-- that returns its input. The trainer asks for "my share" and "the global sum" and never names
-- MPI; the collectives live in the engine (engine/dist/, rx_dist_* in remax.h).
--
--   local world = require("remax.bind.dist").world()
--   local mine = world:share(batch)              -- whole prompts: a contiguous slice per rank
--   local rows, tokens = world:sum(#rows, n)     -- numbers summed over ranks, on every rank
--   world:allreduce_grads(model)                 -- gradients summed in place
--   local all = world:gather(value)              -- rank 0: {value of rank 0, of rank 1, ...}
--   world:reduce_scatter(flat, shard)            -- ZeRO: each rank's shard of a flat buffer summed
--   world:allgather(flat, shard)                 -- ZeRO: every rank's shard to every rank
--
-- Every collective must be called by every rank, in the same order.
local ffi = require("ffi")

local M = {}
local World = {}
World.__index = World

local C
local function lib()
  C = C or require("remax.bind.ffi").C
  return C
end

local function check(rc)
  if rc ~= 0 then error(ffi.string(lib().rx_last_error()), 0) end
end

local the_world

-- The world of this process (MPI initialised on first call, when a launcher started it).
function M.world()
  if the_world then return the_world end
  local c = lib()
  check(c.rx_dist_init())
  the_world = setmetatable({
    rank = tonumber(c.rx_dist_rank()), size = tonumber(c.rx_dist_size()),
    local_rank = tonumber(c.rx_dist_local_rank()), local_size = tonumber(c.rx_dist_local_size()),
    backend = ffi.string(c.rx_dist_backend_name()),
  }, World)
  the_world.is_root = the_world.rank == 0
  return the_world
end

-- Seconds a collective waits for the other ranks before it fails naming them (dist_timeout).
function World:set_timeout(seconds) check(lib().rx_dist_set_timeout(seconds)) end

-- The step the run is at, named by a collective that fails (-1 or nil: before the first step).
function World:set_step(step) lib().rx_dist_set_step(step or -1) end

---------------------------------------------------------------------------- splitting work

-- The part of 1..n this rank works on: contiguous, sizes differing by at most one, lower ranks
-- first. Returns first, last (last < first when the share is empty).
function World:share_range(n)
  local base, extra = math.floor(n / self.size), n % self.size
  local first = self.rank * base + math.min(self.rank, extra) + 1
  local count = base + (self.rank < extra and 1 or 0)
  return first, first + count - 1
end

-- This rank's share of a list (whole items: a prompt with all its rows), and the index its
-- first item has in the whole list.
function World:share(list)
  if self.size == 1 then return list, 1 end
  local first, last = self:share_range(#list)
  local out = {}
  for i = first, last do out[#out + 1] = list[i] end
  return out, first
end

---------------------------------------------------------------------------- reductions

local function reduce(self, op, ...)
  local n = select("#", ...)
  if self.size == 1 then return ... end
  local buf = ffi.new("double[?]", n)
  for i = 1, n do
    local v = select(i, ...)
    if type(v) ~= "number" then error(("dist: value %d to reduce is a %s, expected a number"):format(i, type(v)), 3) end
    buf[i - 1] = v
  end
  check(lib().rx_dist_allreduce_f64(buf, n, op))
  local out = {}
  for i = 1, n do out[i] = buf[i - 1] end
  return unpack(out, 1, n)
end

-- Each argument summed over ranks (max, min), returned on every rank in the same order.
function World:sum(...) return reduce(self, 0, ...) end
function World:max(...) return reduce(self, 1, ...) end
function World:min(...) return reduce(self, 2, ...) end

-- True on every rank when flag is true on any rank.
function World:any(flag)
  if self.size == 1 then return flag and true or false end
  return self:max(flag and 1 or 0) > 0
end

-- Sums tensors (a list of rx_tensor pointers) in place over ranks.
function World:allreduce_tensors(tensors)
  if self.size == 1 or #tensors == 0 then return end
  local arr = ffi.new("rx_tensor*[?]", #tensors)
  for i, t in ipairs(tensors) do arr[i - 1] = t end
  check(lib().rx_dist_allreduce_tensors(arr, #tensors))
end

-- A model's parameters or gradients in arena order (adjacent tensors go in one collective).
local function model_tensors(model, which)
  local list = {}
  for i = 1, #model.names do list[i] = lib()[which](model.handle, i - 1) end
  return list
end

-- Every weight a rank must share with the others: the parameters, then the LoRA adapters.
local function all_weights(model)
  local list = model_tensors(model, "rx_model_param")
  if model.lora then
    for i = 1, #model.lora.names do list[#list + 1] = lib().rx_model_lora_param(model.handle, i - 1) end
  end
  return list
end

-- Sums a model's gradients over ranks: every rank then holds the whole batch's gradient.
function World:allreduce_grads(model)
  if self.size == 1 then return end
  self:allreduce_tensors(model:trainable_grads())
end

function World:barrier()
  if self.size > 1 then check(lib().rx_dist_barrier()) end
end

---------------------------------------------------------------------------- ZeRO: flat buffers

-- Shards start at multiples of SHARD_ALIGN elements (256 bytes of f32): the arenas align every
-- tensor to 64 bytes, so a shard boundary inside a tensor falls where the tensor's own vector
-- loops would split it, and a kernel run over a piece gives the bits it gives over the whole.
M.SHARD_ALIGN = 64

-- Elements per shard of a flat buffer of n: equal shards, a multiple of SHARD_ALIGN, covering n
-- (the last ones may be short or empty).
function World:shard_size(n)
  local a = M.SHARD_ALIGN
  return math.max(a, math.ceil(math.ceil(n / self.size) / a) * a)
end

-- The 0-based element range [lo, hi) of the flat buffer that rank (default: this one) owns.
function World:shard_range(n, shard, rank)
  rank = rank or self.rank
  local lo = math.min(rank * shard, n)
  return lo, math.min(lo + shard, n)
end

-- A 1-D view (a Lua-owned rx_tensor, no storage of its own) of count elements of like's dtype
-- and device at data. The memory must outlive the view.
function M.view(data, count, like)
  local t = ffi.new("rx_tensor")
  t.data = data
  t.ndim, t.numel = 1, count
  t.shape[0], t.stride[0] = count, 1
  t.dtype, t.device, t.device_index = like.dtype, like.device, like.device_index
  return t
end

-- The flat buffer under tensors that live in one arena, in any order (the engine keeps matrices
-- first, then norms and biases; gaps of alignment padding between them allowed): { view = 1-D view
-- from the lowest tensor's first element to the highest one's end, offsets = each tensor's first
-- element in it, esize = bytes per element }. Tensors may not overlap. what names them in errors.
function M.flat(tensors, what)
  local first = tensors[1]
  if not first then error(("dist: %s: no tensors to shard"):format(what), 0) end
  local c = lib()
  local esize = tonumber(c.rx_dtype_size(first.dtype))
  local lowest = 1
  for i, t in ipairs(tensors) do
    if t.dtype ~= first.dtype or t.device ~= first.device then
      error(("dist: %s: tensor %d differs in dtype or device from the first: ZeRO shards one arena"):format(what, i), 0)
    end
    if ffi.cast("char*", t.data) < ffi.cast("char*", tensors[lowest].data) then lowest = i end
  end
  local base = ffi.cast("char*", tensors[lowest].data)
  local offsets, order = {}, {}
  for i, t in ipairs(tensors) do
    local bytes = tonumber(ffi.cast("char*", t.data) - base)
    if bytes % esize ~= 0 then
      error(("dist: %s: tensor %d is not element-aligned in the arena of the others"):format(what, i), 0)
    end
    offsets[i], order[i] = bytes / esize, i
  end
  table.sort(order, function(a, b) return offsets[a] < offsets[b] or (offsets[a] == offsets[b] and a < b) end)
  local at = 0
  for k, i in ipairs(order) do
    if k > 1 and offsets[i] < at then
      error(("dist: %s: tensor %d overlaps tensor %d (ZeRO shards the arena as one buffer)")
        :format(what, i, order[k - 1]), 0)
    end
    at = offsets[i] + tonumber(tensors[i].numel)
  end
  return { view = M.view(base, at, tensors[lowest]), offsets = offsets, esize = esize, n = at }
end

-- In place over a flat view: rank r's shard of `shard` elements gets the sum over ranks of it.
function World:reduce_scatter(flat, shard)
  if self.size > 1 then check(lib().rx_dist_reduce_scatter(flat, shard)) end
end

-- In place: every rank's shard into every rank's flat view.
function World:allgather(flat, shard)
  if self.size > 1 then check(lib().rx_dist_allgather(flat, shard)) end
end

-- Rank root's tensor (CPU or CUDA) into every rank's, in place.
function World:broadcast_tensor(t, root)
  if self.size > 1 then check(lib().rx_dist_broadcast_tensor(t, root or 0)) end
end

---------------------------------------------------------------------------- Lua values

-- Plain Lua values (numbers, strings, booleans, tables of them) to text and back, exactly
-- (numbers with 17 digits, strings byte for byte).
local function serialize(v, out)
  local t = type(v)
  if t == "number" then
    if v ~= v then out[#out + 1] = "0/0"
    elseif v == math.huge then out[#out + 1] = "1/0"
    elseif v == -math.huge then out[#out + 1] = "-1/0"
    elseif v == 0 and 1 / v < 0 then out[#out + 1] = "-0.0"
    elseif v == math.floor(v) and math.abs(v) < 2 ^ 53 then out[#out + 1] = ("%d"):format(v)
    else out[#out + 1] = ("%.17g"):format(v) end
  elseif t == "string" then out[#out + 1] = ("%q"):format(v)
  elseif t == "boolean" or t == "nil" then out[#out + 1] = tostring(v)
  elseif t == "table" then
    out[#out + 1] = "{"
    for k, x in pairs(v) do
      out[#out + 1] = "["
      serialize(k, out)
      out[#out + 1] = "]="
      serialize(x, out)
      out[#out + 1] = ","
    end
    out[#out + 1] = "}"
  else
    error("dist: cannot send a " .. t .. " to another rank", 0)
  end
end

function M.encode(v)
  local out = { "return " }
  serialize(v, out)
  return table.concat(out)
end

function M.decode(text)
  local chunk = assert(loadstring(text, "=dist"))
  setfenv(chunk, {})
  return chunk()
end

-- Rank 0 gets the list of every rank's value, in rank order; the other ranks get nil.
function World:gather(value)
  if self.size == 1 then return { value } end
  local text = M.encode(value)
  local sizes = ffi.new("int64_t[?]", self.size)
  check(lib().rx_dist_allgather_i64(#text, sizes))
  local total = 0
  for r = 0, self.size - 1 do total = total + tonumber(sizes[r]) end
  local recv = self.is_root and ffi.new("char[?]", math.max(total, 1)) or nil
  check(lib().rx_dist_gather(text, #text, recv, sizes, 0))
  if not self.is_root then return nil end
  local out, at = {}, 0
  for r = 0, self.size - 1 do
    local n = tonumber(sizes[r])
    out[r + 1] = M.decode(ffi.string(recv + at, n))
    at = at + n
  end
  return out
end

-- Every rank's list, concatenated in rank order, on every rank.
function World:concat(list)
  if self.size == 1 then return list end
  local parts = self:gather(list)
  local all = {}
  if parts then for _, p in ipairs(parts) do for _, v in ipairs(p) do all[#all + 1] = v end end end
  return self:broadcast(all)
end

-- Rank root's value on every rank.
function World:broadcast(value, root)
  root = root or 0
  if self.size == 1 then return value end
  local text = self.rank == root and M.encode(value) or ""
  local n = ffi.new("double[1]", #text)
  check(lib().rx_dist_broadcast(n, 8, root))
  local len = tonumber(n[0])
  local buf = ffi.new("char[?]", math.max(len, 1))
  if self.rank == root then ffi.copy(buf, text, len) end
  check(lib().rx_dist_broadcast(buf, len, root))
  return M.decode(ffi.string(buf, len))
end

-- Whether every rank succeeded: ok, or false and the message of the lowest rank that failed
-- (the same on every rank).
function World:agree(ok, message)
  if self.size == 1 then return ok, message end
  local first_bad = self:min(ok and self.size or self.rank)
  if first_bad == self.size then return true end
  local msg = self:broadcast(ok and "" or tostring(message), first_bad)
  return false, msg, first_bad
end

---------------------------------------------------------------------------- weights

-- Stops with a clear message when the weights differ between ranks (they must stay
-- bit-identical: every rank takes the same optimizer step on the same summed gradients).
function World:check_same_weights(model, where)
  if self.size == 1 then return end
  local params = all_weights(model)
  for i, t in ipairs(params) do   -- the checksum reads host memory: device weights through a copy
    if t.device ~= lib().RX_CPU then params[i] = t:to("cpu") end
  end
  local arr = ffi.new("const rx_tensor*[?]", #params)
  for i, t in ipairs(params) do arr[i - 1] = t end
  local h = ffi.new("uint64_t[1]")
  check(lib().rx_dist_checksum(arr, #params, h))
  local all = ffi.new("int64_t[?]", self.size)
  check(lib().rx_dist_allgather_i64(ffi.cast("int64_t", h[0]), all))
  local differ = {}
  for r = 1, self.size - 1 do
    if all[r] ~= all[0] then differ[#differ + 1] = tostring(r) end
  end
  if #differ > 0 then
    error(("dist: the weights of rank(s) %s differ from rank 0's at %s (checksums disagree): the ranks "
      .. "no longer train the same model; stopping (mixed library builds or hardware across ranks?)")
      :format(table.concat(differ, ", "), where), 0)
  end
end

-- Rank 0's model weights (LoRA adapters and their dropout counter included), and tensors
-- (name -> tensor: optimizer moments), copied into every other rank's in place.
function World:broadcast_model(model, tensors)
  if self.size == 1 then return end
  local list = all_weights(model)
  if model.lora then   -- a resumed run's counter is rank 0's alone (the adapters' file)
    local count = ffi.new("uint64_t[1]", lib().rx_model_lora_forward_count(model.handle))
    check(lib().rx_dist_broadcast(count, 8, 0))
    lib().rx_model_lora_set_forward_count(model.handle, count[0])
  end
  local names = {}
  for name in pairs(tensors or {}) do names[#names + 1] = name end
  table.sort(names)
  for _, name in ipairs(names) do list[#list + 1] = tensors[name] end
  for _, t in ipairs(list) do check(lib().rx_dist_broadcast_tensor(t, 0)) end   -- CPU: MPI; CUDA: NCCL
end

M.World = World

return M
