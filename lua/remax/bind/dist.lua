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

-- Sums a model's gradients over ranks: every rank then holds the whole batch's gradient.
function World:allreduce_grads(model)
  if self.size == 1 then return end
  self:allreduce_tensors(model:trainable_grads())
end

function World:barrier()
  if self.size > 1 then check(lib().rx_dist_barrier()) end
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
  local params = model_tensors(model, "rx_model_param")
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

-- Rank 0's model weights, and tensors (name -> tensor: optimizer moments), copied into every
-- other rank's in place (CPU tensors).
function World:broadcast_model(model, tensors)
  if self.size == 1 then return end
  local list = model_tensors(model, "rx_model_param")
  local names = {}
  for name in pairs(tensors or {}) do names[#names + 1] = name end
  table.sort(names)
  for _, name in ipairs(names) do list[#list + 1] = tensors[name] end
  for _, t in ipairs(list) do
    if t.device ~= lib().RX_CPU then error("dist: broadcasting weights on a GPU is not supported yet", 0) end
    check(lib().rx_dist_broadcast(t.data, t.numel * lib().rx_dtype_size(t.dtype), 0))
  end
end

M.World = World

return M
