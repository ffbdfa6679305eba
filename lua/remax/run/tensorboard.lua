-- remax.run.tensorboard: TensorBoard event files, written by hand (no TensorFlow, no protobuf
-- library): scalars a run logs, readable by `tensorboard --logdir runs`. See docs/runs.md.
--
--   local w = tensorboard.open("runs/x/tensorboard")          -- events.out.tfevents.<time>.<host>.<pid>.remax
--   w:scalars(step, { reward = 0.4, ["reward/gsm8k"] = 0.5 })  -- one Event per call, flushed
--   w:close()
--
-- The file is a TFRecord stream: per record the payload length (uint64, little-endian), the
-- masked CRC-32C of those 8 bytes, the payload, the masked CRC-32C of the payload. Each payload
-- is an Event protobuf: wall_time (1, double), step (2, int64), file_version (3, string: the
-- first record says "brain.Event:2"), summary (5: Summary { repeated Value value = 1 } with Value
-- { string tag = 1; float simple_value = 2 }), session_log (7: SessionLog { SessionStatus status = 1 },
-- START = 1; field 6 is the deprecated log_message).
--
-- Every file starts a session, as TensorFlow's writers do: after the version record, a START at
-- the first step the process logs (1, or the step after a resumed run's checkpoint). The
-- TensorBoard server (plugin_event_accumulator) takes a run's first START as its beginning and
-- each later one as a restart, dropping what earlier processes logged at that step or later (its
-- purge of orphaned data); so a resumed run's START must not be the folder's first. TensorBoard
-- reads a folder's files in name order, so a new file's name sorts after the ones already there
-- (its time part is at least one second past theirs).
local ffi = require("ffi")

local M = {}

M.SESSION_LOG_FIELD = 7   -- Event.session_log in event.proto
M.SESSION_START = 1       -- SessionLog.SessionStatus.START

---------------------------------------------------------------------------------------------
-- CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), table-driven.

local CRC_TABLE = {}
for i = 0, 255 do
  local c = i
  for _ = 1, 8 do
    if bit.band(c, 1) ~= 0 then c = bit.bxor(bit.rshift(c, 1), 0x82F63B78) else c = bit.rshift(c, 1) end
  end
  CRC_TABLE[i] = c
end

-- CRC-32C of a string, as a number in [0, 2^32).
function M.crc32c(s)
  local c = 0xFFFFFFFF
  for i = 1, #s do
    c = bit.bxor(CRC_TABLE[bit.band(bit.bxor(c, s:byte(i)), 0xFF)], bit.rshift(c, 8))
  end
  c = bit.bnot(c)
  return c < 0 and c + 2 ^ 32 or c
end

-- TFRecord's mask: rotate right by 15 and add 0xa282ead8 (mod 2^32).
function M.masked_crc(s)
  local c = M.crc32c(s)
  local rot = bit.bor(bit.rshift(c, 15), bit.lshift(c, 17))
  local v = (rot < 0 and rot + 2 ^ 32 or rot) + 0xa282ead8
  return v % 2 ^ 32
end

---------------------------------------------------------------------------------------------
-- Bytes.

local function u32le(v)
  v = v % 2 ^ 32
  return string.char(v % 256, math.floor(v / 256) % 256, math.floor(v / 65536) % 256, math.floor(v / 16777216) % 256)
end

local function u64le(v) return u32le(v % 2 ^ 32) .. u32le(math.floor(v / 2 ^ 32)) end

local dbuf, fbuf = ffi.new("double[1]"), ffi.new("float[1]")
local function f64le(v) dbuf[0] = v return ffi.string(dbuf, 8) end   -- x86-64 and arm64 are little-endian
local function f32le(v) fbuf[0] = v return ffi.string(fbuf, 4) end

local function varint(v)   -- v >= 0, below 2^53
  local out = {}
  repeat
    local b = v % 128
    v = math.floor(v / 128)
    out[#out + 1] = string.char(v > 0 and b + 128 or b)
  until v == 0
  return table.concat(out)
end

local function field_bytes(num, s) return varint(num * 8 + 2) .. varint(#s) .. s end

-- An Event protobuf: {wall_time =, step =, file_version =, scalars = {{tag, value}...}, start = bool}.
function M.event(e)
  local parts = { varint(1 * 8 + 1) .. f64le(e.wall_time) }
  if e.step then parts[#parts + 1] = varint(2 * 8 + 0) .. varint(e.step) end
  if e.file_version then parts[#parts + 1] = field_bytes(3, e.file_version) end
  if e.scalars then
    local values = {}
    for i, tv in ipairs(e.scalars) do
      values[i] = field_bytes(1, field_bytes(1, tv[1]) .. varint(2 * 8 + 5) .. f32le(tv[2]))
    end
    parts[#parts + 1] = field_bytes(5, table.concat(values))
  end
  if e.start then parts[#parts + 1] = field_bytes(M.SESSION_LOG_FIELD, varint(1 * 8 + 0) .. varint(M.SESSION_START)) end
  return table.concat(parts)
end

-- One TFRecord around a payload.
function M.record(payload)
  local len = u64le(#payload)
  return len .. u32le(M.masked_crc(len)) .. payload .. u32le(M.masked_crc(payload))
end

---------------------------------------------------------------------------------------------
-- The writer.

local Writer = {}
Writer.__index = Writer

local now = require("remax.bind.clock").wall

local function hostname()
  local f = io.open("/proc/sys/kernel/hostname", "rb")
  local h = f and f:read("*l")
  if f then f:close() end
  return (h and h ~= "") and h:gsub("[^%w%-%.]", "_") or "localhost"
end

-- Opens a new event file in folder `dir` (created when missing) and starts a session in it: a
-- SessionLog START at opts.start_step (default 1), the first step this writer logs, so
-- TensorBoard drops what earlier files logged at that step or later.
function M.open(dir, opts)
  opts = opts or {}
  require("remax.bind.fs").mkdir_p(dir)
  local t = os.time()
  for _, name in ipairs(require("remax.bind.fs").list_dir(dir)) do
    local seen = tonumber(name:match("^events%.out%.tfevents%.(%d+)%."))
    if seen and seen >= t then t = seen + 1 end   -- sort after the earlier process's file
  end
  local pid = require("remax.bind.ipc").pid()
  local path = ("%s/events.out.tfevents.%d.%s.%d.remax"):format(dir, t, hostname(), pid)
  local k = 1
  while io.open(path, "rb") do   -- two writers in one second (a test, a quick restart)
    k = k + 1
    path = ("%s/events.out.tfevents.%d.%s.%d.%d.remax"):format(dir, t, hostname(), pid, k)
  end
  local f, err = io.open(path, "wb")
  if not f then error(("tensorboard: cannot create %s (%s)"):format(path, tostring(err)), 0) end
  local w = setmetatable({ path = path, f = f }, Writer)
  w:write(M.event({ wall_time = now(), file_version = "brain.Event:2" }))
  w:write(M.event({ wall_time = now(), step = opts.start_step or 1, start = true }))
  return w
end

function Writer:write(payload)
  if not self.f then self.f = assert(io.open(self.path, "ab")) end   -- after close: append
  local ok, err = self.f:write(M.record(payload))
  if ok then ok, err = self.f:flush() end
  if not ok then error(("tensorboard: cannot write %s (%s)"):format(self.path, tostring(err)), 0) end
end

-- Every number in `values` (sorted by name) as a scalar at `step`; other values are skipped.
function Writer:scalars(step, values)
  local list = {}
  for k, v in pairs(values) do
    if type(k) == "string" and k ~= "step" and type(v) == "number" then list[#list + 1] = { k, v } end
  end
  if #list == 0 then return end
  table.sort(list, function(a, b) return a[1] < b[1] end)
  self:write(M.event({ wall_time = now(), step = step, scalars = list }))
end

function Writer:close()
  if self.f then self.f:close(); self.f = nil end
end

return M
