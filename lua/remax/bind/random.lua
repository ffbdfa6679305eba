-- remax.bind.random: seeded random numbers from the engine's Philox generator, and a stable
-- string hash (stream names, problem splits). Numbers depend only on (seed, stream, how many were
-- drawn), so a run is reproducible and resumable.
local ffi = require("ffi")
local bit = require("bit")
local C = require("remax.bind.ffi").C

local M = {}


-- FNV-1a, 32-bit: a stable hash of a string (stream names, problem splits).
function M.hash(s)
  local h = 2166136261
  for i = 1, #s do
    h = bit.bxor(h, s:byte(i))
    -- h * 16777619 mod 2^32, with 16777619 = 2^24 + 403 so nothing exceeds 2^53
    h = bit.tobit(bit.lshift(h, 24) + (h % 4294967296) * 403)
  end
  return h % 4294967296
end

local TWO32 = 4294967296

function M.check_u53(v, what)
  if type(v) ~= "number" or v < 0 or v ~= math.floor(v) or v >= 2 ^ 53 then
    error(("remax.data.rng: %s must be an integer in [0, 2^53), got %s"):format(what, tostring(v)), 3)
  end
end

local Rng = {}
Rng.__index = Rng

-- rng(seed, stream): numbers that depend only on (seed, stream, how many were drawn).
-- seed: integer in [0, 2^53); stream: integer in [0, 2^53) or a string (hashed), default 0.
-- Philox key = seed, counter = (block, stream); each block gives four 32-bit words.
function M.rng(seed, stream)
  M.check_u53(seed, "seed")
  stream = stream or 0
  if type(stream) == "string" then stream = M.hash(stream) end
  M.check_u53(stream, "stream")
  local r = setmetatable({
    seed = seed, stream = stream, block = 0, pos = 4,
    key = ffi.new("uint32_t[2]", seed % TWO32, math.floor(seed / TWO32)),
    ctr = ffi.new("uint32_t[4]", 0, 0, stream % TWO32, math.floor(stream / TWO32)),
    out = ffi.new("uint32_t[4]"),
  }, Rng)
  return r
end

-- Next raw 32-bit word, as a Lua number in [0, 2^32).
function Rng:u32()
  if self.pos >= 4 then
    self.ctr[0] = self.block % TWO32
    self.ctr[1] = math.floor(self.block / TWO32)
    C.rx_philox4x32(self.key, self.ctr, self.out)
    self.block = self.block + 1
    self.pos = 0
  end
  local v = self.out[self.pos]
  self.pos = self.pos + 1
  return tonumber(v)
end

-- Uniform float in [0, 1) with 53 random bits.
function Rng:uniform()
  local a = math.floor(self:u32() / 32)   -- 27 bits
  local b = math.floor(self:u32() / 64)   -- 26 bits
  return (a * 67108864 + b) / 9007199254740992
end

-- int(n) -> [1, n]; int(lo, hi) -> [lo, hi]. Unbiased (rejection), ranges up to 2^32.
function Rng:int(lo, hi)
  if hi == nil then lo, hi = 1, lo end
  if type(lo) ~= "number" or type(hi) ~= "number" or lo ~= math.floor(lo) or hi ~= math.floor(hi) or hi < lo then
    error(("remax.data.rng: int(%s, %s): need integers lo <= hi"):format(tostring(lo), tostring(hi)), 2)
  end
  local n = hi - lo + 1
  if n > TWO32 then error("remax.data.rng: int range wider than 2^32", 2) end
  local limit = TWO32 - TWO32 % n   -- accept words below the largest multiple of n
  local v = self:u32()
  while v >= limit do v = self:u32() end
  return lo + v % n
end

function Rng:pick(list)
  if #list == 0 then error("remax.data.rng: pick from an empty list", 2) end
  return list[self:int(#list)]
end

-- Fisher-Yates, in place; returns the list.
function Rng:shuffle(list)
  for i = #list, 2, -1 do
    local j = self:int(i)
    list[i], list[j] = list[j], list[i]
  end
  return list
end

function Rng:permutation(n)
  local p = {}
  for i = 1, n do p[i] = i end
  return self:shuffle(p)
end

M.Rng = Rng

return M
