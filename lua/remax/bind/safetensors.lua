-- remax.bind.safetensors: Hugging Face safetensors checkpoints, read through the engine's mmap reader
-- and written crash-safely (temporary file, fsync, rename).
--   local st = remax.safetensors.open("path/to/model")   -- file, index .json, or model directory
--   for _, name in ipairs(st:names()) do local t = st:read(name, "f32") end
--   remax.safetensors.save("out.safetensors", { ["w"] = t }, { format = "pt" })
local ffi = require("ffi")
local rx = require("remax.bind.ffi")
local tensor = require("remax.bind.tensor")
local C, check = rx.C, rx.check

local M = {}
local File = {}
File.__index = File

function M.open(path)
  if type(path) ~= "string" then error("safetensors.open: expected a path string, got " .. type(path), 2) end
  local out = ffi.new("rx_safetensors*[1]")
  check(C.rx_safetensors_open(out, path), 2)
  return setmetatable({ handle = ffi.gc(out[0], C.rx_safetensors_close), path = path }, File)
end

local function handle(self)
  if not self.handle then error(("safetensors: %s is closed"):format(self.path), 3) end
  return self.handle
end

-- Frees the mapping now rather than at the next garbage collection.
function File:close()
  if self.handle then
    C.rx_safetensors_close(ffi.gc(self.handle, nil))
    self.handle = nil
  end
end

-- Tensor names, sorted.
function File:names()
  local h, out = handle(self), {}
  for i = 0, tonumber(C.rx_safetensors_count(h)) - 1 do out[i + 1] = ffi.string(C.rx_safetensors_name(h, i)) end
  return out
end

function File:has(name) return C.rx_safetensors_has(handle(self), name) == 1 end

-- { dtype = "bf16", format = "BF16", shape = { 64, 32 } }; raises for dtypes remax cannot hold.
function File:info(name)
  local h = handle(self)
  local dtype, ndim, shape = ffi.new("int32_t[1]"), ffi.new("int32_t[1]"), ffi.new("int64_t[4]")
  check(C.rx_safetensors_info(h, name, dtype, ndim, shape), 2)
  local dims = {}
  for i = 0, ndim[0] - 1 do dims[i + 1] = tonumber(shape[i]) end
  return {
    dtype = ffi.string(C.rx_dtype_name(dtype[0])),
    format = ffi.string(C.rx_safetensors_format_dtype(h, name)),
    shape = dims,
  }
end

-- A new tensor holding `name`, in the file's dtype or converted to `dtype`.
function File:read(name, dtype)
  local h = handle(self)
  local dt, ndim, shape = ffi.new("int32_t[1]"), ffi.new("int32_t[1]"), ffi.new("int64_t[4]")
  check(C.rx_safetensors_info(h, name, dt, ndim, shape), 2)
  local dims = {}
  for i = 0, ndim[0] - 1 do dims[i + 1] = tonumber(shape[i]) end
  local t = tensor.new(dims, dtype or tonumber(dt[0]))
  check(C.rx_safetensors_read(h, name, t), 2)
  return t
end

-- Reads into an existing tensor (converting dtype; the shape must match).
function File:read_into(name, dst)
  check(C.rx_safetensors_read(handle(self), name, dst), 2)
  return dst
end

-- "__metadata__" as a table of strings.
function File:metadata()
  local h, out = handle(self), {}
  for i = 0, tonumber(C.rx_safetensors_metadata_count(h)) - 1 do
    local key = C.rx_safetensors_metadata_key(h, i)
    out[ffi.string(key)] = ffi.string(C.rx_safetensors_metadata_get(h, key))
  end
  return out
end

function File:__tostring()
  return ("safetensors(%s, %d tensors)"):format(self.path, self.handle and tonumber(C.rx_safetensors_count(self.handle)) or 0)
end

local function sorted_keys(tbl, what)
  local keys = {}
  for k in pairs(tbl) do
    if type(k) ~= "string" then error(("safetensors.save: %s key %s is not a string"):format(what, tostring(k)), 3) end
    keys[#keys + 1] = k
  end
  table.sort(keys)
  return keys
end

-- Writes { name = tensor, ... } and an optional metadata table (string or number values).
function M.save(path, tensors, metadata)
  if type(path) ~= "string" then error("safetensors.save: expected a path string, got " .. type(path), 2) end
  if type(tensors) ~= "table" then error("safetensors.save: expected a table of tensors, got " .. type(tensors), 2) end
  local names = sorted_keys(tensors, "tensor")
  local cnames = ffi.new("const char*[?]", math.max(#names, 1))
  local ctensors = ffi.new("rx_tensor*[?]", math.max(#names, 1))
  local keep = {}   -- host copies of device tensors, alive while C writes them
  for i, name in ipairs(names) do
    local t = tensors[name]
    if not (ffi.istype("rx_tensor*", t) or ffi.istype("rx_tensor", t)) then   -- a tensor or a view
      error(("safetensors.save: '%s' is a %s, expected a tensor"):format(name, type(t)), 2)
    end
    if t:device_name() ~= "cpu" then   -- a device tensor is written through a host copy
      t = t:to("cpu")
      keep[#keep + 1] = t
    end
    cnames[i - 1], ctensors[i - 1] = name, t
  end
  metadata = metadata or {}
  local keys, values = sorted_keys(metadata, "metadata"), {}
  local ckeys = ffi.new("const char*[?]", math.max(#keys, 1))
  local cvalues = ffi.new("const char*[?]", math.max(#keys, 1))
  for i, key in ipairs(keys) do
    local v = metadata[key]
    if type(v) ~= "string" and type(v) ~= "number" then
      error(("safetensors.save: metadata '%s' is a %s, expected a string"):format(key, type(v)), 2)
    end
    values[i] = tostring(v)   -- kept alive in `values` while C reads the pointer
    ckeys[i - 1], cvalues[i - 1] = key, values[i]
  end
  check(C.rx_safetensors_save(path, #names, cnames, ctensors, #keys, ckeys, cvalues), 2)
end

return M
