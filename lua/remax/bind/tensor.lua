-- remax.bind.tensor: tensors owned by Lua (freed by ffi.gc), over the engine's rx_tensor.
-- Dimensions, indices and narrow() starts are 1-based, as everywhere in Lua.
local ffi = require("ffi")
local rx = require("remax.bind.ffi")
local C, check = rx.C, rx.check

local M = {}
local Tensor = {}
M.Tensor = Tensor

-- The one table of devices: name <-> the engine's RX_* value (model, optim and dist ask here).
local devices = { cpu = C.RX_CPU, cuda = C.RX_CUDA }
local device_names = { [tonumber(C.RX_CPU)] = "cpu", [tonumber(C.RX_CUDA)] = "cuda" }
M.device_list = "cpu, cuda"

-- dtype name ("f32", "bfloat16", ...) or enum value -> enum value
function M.dtype(name)
  if type(name) == "number" then return name end
  local out = ffi.new("int32_t[1]")
  check(C.rx_dtype_from_name(name or "f32", out), 2)
  return out[0]
end

local function device_id(name)
  if type(name) == "number" then return name end
  local d = devices[name or "cpu"]
  if not d then error(("unknown device '%s' (valid: cpu, cuda)"):format(tostring(name)), 3) end
  return d
end

-- A device's name ("cpu", "cuda") -> its RX_* value, nil for a name remax does not know.
function M.device_id(name) return devices[name] end
-- An RX_* device value -> its name.
function M.device_name(id) return device_names[tonumber(id)] end

local function shape_array(shape)
  if #shape > 4 then error(("tensors have at most 4 dims, got %d"):format(#shape), 3) end
  local arr = ffi.new("int64_t[4]")
  for i, n in ipairs(shape) do
    if type(n) ~= "number" or n ~= math.floor(n) then
      error(("shape[%d] = %s is not an integer"):format(i, tostring(n)), 3)
    end
    arr[i - 1] = n
  end
  return arr
end

-- Wrap a freshly made rx_tensor* so the garbage collector frees it.
function M.own(ptr) return ffi.gc(ptr, C.rx_tensor_free) end

function M.new(shape, dtype, device)
  local out = ffi.new("rx_tensor*[1]")
  check(C.rx_tensor_new(out, M.dtype(dtype), device_id(device), #shape, shape_array(shape)), 2)
  return M.own(out[0])
end
M.zeros = M.new

local function infer_shape(tbl)
  local shape, node = {}, tbl
  while type(node) == "table" do
    shape[#shape + 1] = #node
    node = node[1]
  end
  return shape
end

-- Tensor from nested Lua tables of numbers (rectangular).
function M.from(tbl, dtype, device)
  if type(tbl) ~= "table" then error("tensor.from: expected a table, got " .. type(tbl), 2) end
  local shape = infer_shape(tbl)
  local t = M.new(shape, dtype)
  local n = tonumber(t.numel)
  local buf = ffi.new("double[?]", math.max(n, 1))
  local k = 0
  local function walk(node, d)
    if #node ~= shape[d] then
      error(("tensor.from: ragged table: dim %d has %d and %d entries"):format(d, shape[d], #node), 4)
    end
    for i = 1, #node do
      local v = node[i]
      if d < #shape then
        if type(v) ~= "table" then error(("tensor.from: expected a table at dim %d"):format(d + 1), 4) end
        walk(v, d + 1)
      else
        if type(v) ~= "number" then
          error(("tensor.from: element %d is a %s, expected a number"):format(k + 1, type(v)), 4)
        end
        buf[k] = v
        k = k + 1
      end
    end
  end
  if #shape > 0 and shape[1] > 0 then walk(tbl, 1) end
  check(C.rx_tensor_write_f64(t, buf), 2)
  if device and device_id(device) ~= C.RX_CPU then return t:to(device) end
  return t
end

-- The struct's own fields (data, shape, stride, numel, ndim, dtype, device) are raw cdata;
-- methods carry other names. t:size() is the shape as a table, t:size(d) one dimension.
function Tensor:size(dim)
  if dim then return tonumber(self.shape[dim - 1]) end
  local s = {}
  for i = 0, self.ndim - 1 do s[i + 1] = tonumber(self.shape[i]) end
  return s
end
function Tensor:nelement() return tonumber(self.numel) end
function Tensor:dtype_name() return ffi.string(C.rx_dtype_name(self.dtype)) end
function Tensor:device_name() return device_names[tonumber(self.device)] end
function Tensor:is_contiguous() return C.rx_tensor_is_contiguous(self) == 1 end

-- Flat values as a Lua array of numbers.
function Tensor:values()
  local n = tonumber(self.numel)
  local buf = ffi.new("double[?]", math.max(n, 1))
  check(C.rx_tensor_read_f64(self, buf), 2)
  local out = {}
  for i = 0, n - 1 do out[i + 1] = buf[i] end
  return out
end

-- Nested Lua tables matching the shape.
function Tensor:totable()
  local flat, shape = self:values(), self:size()
  if #shape == 0 then return flat[1] end
  local k = 0
  local function build(d)
    local t = {}
    for i = 1, shape[d] do
      if d == #shape then k = k + 1; t[i] = flat[k] else t[i] = build(d + 1) end
    end
    return t
  end
  return build(1)
end

-- Element by 1-based indices, one per dimension.
local function flat_index(self, idx)
  if #idx ~= self.ndim then error(("expected %d indices, got %d"):format(self.ndim, #idx), 3) end
  local k = 0
  for d = 1, #idx do
    local n = tonumber(self.shape[d - 1])
    if idx[d] < 1 or idx[d] > n then error(("index %d out of range 1..%d in dim %d"):format(idx[d], n, d), 3) end
    k = k * n + (idx[d] - 1)
  end
  return k
end

function Tensor:get(...)
  local v = ffi.new("double[1]")
  check(C.rx_tensor_get(self, flat_index(self, { ... }), v), 2)
  return v[0]
end

function Tensor:set(...)
  local args = { ... }
  local value = table.remove(args)
  check(C.rx_tensor_set(self, flat_index(self, args), value), 2)
  return self
end

function Tensor:copy_(src) check(C.rx_tensor_copy(self, src), 2); return self end
function Tensor:fill_(v) check(C.rx_tensor_fill(self, v), 2); return self end

function Tensor:uniform_(seed, offset, lo, hi)
  check(C.rx_tensor_uniform(self, seed or 0, offset or 0, lo or 0, hi or 1), 2)
  return self
end

function Tensor:normal_(seed, offset, mean, std)
  check(C.rx_tensor_normal(self, seed or 0, offset or 0, mean or 0, std or 1), 2)
  return self
end

-- A copy converted to another dtype and/or moved to another device, in either order:
-- t:to("bf16"), t:to("cuda"), t:to("cpu"), t:to("f32", "cuda").
function Tensor:to(a, b)
  local dtype, device = tonumber(self.dtype), tonumber(self.device)
  for _, x in ipairs({ a, b }) do
    if devices[x] then device = devices[x] elseif x ~= nil then dtype = M.dtype(x) end
  end
  local out = M.new(self:size(), dtype, device)
  return out:copy_(self)
end

-- Whether remax was built with CUDA and a device is present.
function M.has_cuda() return C.rx_has_cuda() == 1 end

-- The CUDA device's memory in bytes: allocated (in live tensors), peak (of allocated), reserved
-- (held by remax's caching allocator), free and total (the device's). Fails without a device.
function M.cuda_memory()
  local v = ffi.new("int64_t[5]")
  check(C.rx_cuda_memory(v, v + 1, v + 2, v + 3, v + 4), 2)
  return { allocated = tonumber(v[0]), peak = tonumber(v[1]), reserved = tonumber(v[2]), free = tonumber(v[3]),
    total = tonumber(v[4]) }
end

function Tensor:clone() return self:to(tonumber(self.dtype)) end

function Tensor:reshape(shape)
  local out = ffi.new("rx_tensor*[1]")
  check(C.rx_tensor_reshape(out, self, #shape, shape_array(shape)), 2)
  return M.own(out[0])
end

function Tensor:narrow(dim, start, len)
  local out = ffi.new("rx_tensor*[1]")
  check(C.rx_tensor_narrow(out, self, dim - 1, start - 1, len), 2)
  return M.own(out[0])
end

-- Columns starts[n] + 1 .. starts[n] + lens[n] of each row n of a [B, T] tensor, as Lua lists:
-- the completion part of prompt .. completion rows (log-probabilities, entropies).
function Tensor:row_spans(starts, lens)
  local T = self:size(2)
  local f32 = self:dtype_name() == "f32" and self:device_name() == "cpu" and self:is_contiguous()
  local p = f32 and ffi.cast("float*", self.data) or nil
  local tab = not f32 and self:totable() or nil
  local out = {}
  for n = 1, #lens do
    local v = {}
    for t = 1, lens[n] do
      local pos = starts[n] + t   -- 1-based column
      v[t] = f32 and p[(n - 1) * T + pos - 1] or tab[n][pos]
    end
    out[n] = v
  end
  return out
end

-- The reverse of row_spans: values[n] placed from column starts[n] + 1 of row n, zeros
-- elsewhere; a [B, T] f32 tensor, or for another dtype nested Lua lists (model:backward takes both).
function M.from_row_spans(values, starts, B, T, dtype)
  if dtype == "f32" then
    local x = M.new({ B, T }, "f32")
    local p = ffi.cast("float*", x.data)
    for n = 1, B do
      for t, w in ipairs(values[n]) do p[(n - 1) * T + starts[n] + t - 1] = w end
    end
    return x
  end
  local x = {}
  for n = 1, B do
    local r = {}
    for t = 1, T do r[t] = 0 end
    for t, w in ipairs(values[n]) do r[starts[n] + t] = w end
    x[n] = r
  end
  return x
end

function Tensor:__tostring()
  return ("tensor(%s, [%s], %s)"):format(self:dtype_name(), table.concat(self:size(), ","), self:device_name())
end

ffi.metatype("rx_tensor", { __index = Tensor, __tostring = Tensor.__tostring })

return M
