-- remax.formats.json: JSON as remax writes it (config.json, metrics.jsonl, trainer state, the
-- reward channels' lines) and reads it back.
local cjson = require("cjson").new()   -- a private instance: its settings do not leak to others
local ffi = require("ffi")   -- int64 cdata (ffi.istype) are written as numbers

local M = {}

-- cjson decodes; this encoder writes objects with sorted keys ("step" first), so files
-- diff cleanly, and handles what cjson would refuse or garble:
--   NaN, +inf, -inf  -> the strings "NaN", "Infinity", "-Infinity" (valid JSON; read back
--                       into numbers by M.decode, and by Python's float("NaN") etc.)
--   invalid UTF-8    -> U+FFFD per bad byte (byte-level tokenizers cut characters in half)
--   int64 cdata      -> number
--   functions etc.   -> a descriptive string in lenient mode (config.json: recipes hold reward
--                       functions), an error naming the key in strict mode (trainer state)
-- Numbers: integers exactly; others with %.17g (exact round trip) or %.10g (readable).

local inf = math.huge
local function finite(v) return type(v) == "number" and v == v and v ~= inf and v ~= -inf end
M.finite = finite

local function valid_utf8(s)
  if not s:find("[\128-\255]") then return s end
  local out, i, n, changed = {}, 1, #s, false
  while i <= n do
    local c = s:byte(i)
    local len = c < 0x80 and 1 or (c >= 0xC2 and c <= 0xDF) and 2 or (c >= 0xE0 and c <= 0xEF) and 3
      or (c >= 0xF0 and c <= 0xF4) and 4 or 0
    local ok = len > 0 and i + len - 1 <= n
    if ok and len > 1 then
      for j = i + 1, i + len - 1 do
        local b = s:byte(j)
        if b < 0x80 or b > 0xBF then ok = false break end
      end
      local c2 = s:byte(i + 1)
      -- overlong forms, UTF-16 surrogates, code points above U+10FFFF
      if ok and ((c == 0xE0 and c2 < 0xA0) or (c == 0xED and c2 > 0x9F) or (c == 0xF0 and c2 < 0x90)
        or (c == 0xF4 and c2 > 0x8F)) then ok = false end
    end
    if ok then
      out[#out + 1] = s:sub(i, i + len - 1)
      i = i + len
    else
      out[#out + 1] = "\239\191\189"
      changed = true
      i = i + 1
    end
  end
  return changed and table.concat(out) or s
end

-- cjson writes "/" as "\/"; plain "/" is valid JSON and reads better (paths, "</script>").
local function encode_string(s)
  return (cjson.encode(valid_utf8(s)):gsub("\\/", "/"))
end

local function encode_number(v, precision)
  if v ~= v then return '"NaN"' end
  if v == inf then return '"Infinity"' end
  if v == -inf then return '"-Infinity"' end
  if v == math.floor(v) and math.abs(v) < 2 ^ 53 then
    if v == 0 and 1 / v < 0 then return "-0" end
    return ("%d"):format(v)
  end
  if precision == "shortest" then   -- the fewest digits that read back as the same double: 0.9, not 0.90000000000000002
    for digits = 15, 16 do
      local text = ("%." .. digits .. "g"):format(v)
      if tonumber(text) == v then return text end
    end
    precision = 17
  end
  return ("%." .. precision .. "g"):format(v)
end

-- A table marked as a JSON object: written {} when it is empty (an empty Lua table is [] otherwise).
local OBJECT = {}
function M.object(t) return setmetatable(t or {}, OBJECT) end

local function array_length(t)
  local n = 0
  for k in pairs(t) do
    if type(k) ~= "number" or k < 1 or k ~= math.floor(k) then return nil end
    n = n + 1
  end
  for i = 1, n do if t[i] == nil then return nil end end
  return n
end

local function describe(v)
  if type(v) == "function" then
    local info = debug.getinfo(v, "S")
    return ("function %s:%d"):format((info.source or "?"):gsub("^@", ""), info.linedefined or 0)
  end
  return tostring(v)
end

local function encode_value(v, o, path, depth, out)
  local tv = type(v)
  if tv == "string" then
    out[#out + 1] = encode_string(v)
  elseif tv == "number" then
    out[#out + 1] = encode_number(v, o.precision)
  elseif tv == "boolean" then
    out[#out + 1] = v and "true" or "false"
  elseif v == cjson.null or v == nil then
    out[#out + 1] = "null"
  elseif tv == "cdata" and (ffi.istype("int64_t", v) or ffi.istype("uint64_t", v)) then
    out[#out + 1] = encode_number(tonumber(v), o.precision)
  elseif tv == "table" then
    if depth > 64 then error(("runs: %s: tables nested too deep (a cycle?)"):format(path), 0) end
    local nl = o.pretty and ("\n" .. ("  "):rep(depth + 1)) or ""
    local close = o.pretty and ("\n" .. ("  "):rep(depth)) or ""
    local n = array_length(v)
    if n == 0 and getmetatable(v) == OBJECT then
      out[#out + 1] = "{}"
    elseif n == 0 then
      out[#out + 1] = "[]"
    elseif n then
      out[#out + 1] = "["
      for i = 1, n do
        if i > 1 then out[#out + 1] = "," end
        out[#out + 1] = nl
        encode_value(v[i], o, path .. "[" .. i .. "]", depth + 1, out)
      end
      out[#out + 1] = close .. "]"
    else
      local keys = {}
      for k in pairs(v) do
        if type(k) ~= "string" and o.strict then
          error(("runs: %s has the key %s (a %s): JSON object keys are strings, so it would not read back"):format(
            path, tostring(k), type(k)), 0)
        end
        keys[#keys + 1] = k
      end
      table.sort(keys, function(a, b)
        if (a == "step") ~= (b == "step") then return a == "step" end
        return tostring(a) < tostring(b)
      end)
      out[#out + 1] = "{"
      for i, k in ipairs(keys) do
        if i > 1 then out[#out + 1] = "," end
        out[#out + 1] = nl .. encode_string(tostring(k)) .. (o.pretty and ": " or ":")
        encode_value(v[k], o, path .. "." .. tostring(k), depth + 1, out)
      end
      out[#out + 1] = close .. "}"
    end
  elseif o.strict then
    error(("runs: %s is a %s, which JSON cannot hold"):format(path, tv), 0)
  else
    out[#out + 1] = encode_string(describe(v))
  end
end

-- opts: pretty (indent 2), strict (error on values JSON cannot hold), precision (default 17;
-- "shortest": the shortest text that reads back exactly), where (names the value in errors).
function M.encode(v, opts)
  opts = opts or {}
  local o = { pretty = opts.pretty, strict = opts.strict, precision = opts.precision or 17 }
  local out = {}
  encode_value(v, o, opts.where or "value", 0, out)
  return table.concat(out)
end

local special = { NaN = 0 / 0, Infinity = inf, ["-Infinity"] = -inf }

-- Back from what the encoder wrote: "NaN"/"Infinity"/"-Infinity" become numbers, null nil.
local function revive(v)
  if type(v) == "string" then
    local s = special[v]
    if s then return s end
  elseif type(v) == "table" then
    for k, x in pairs(v) do
      if x == cjson.null then v[k] = nil else v[k] = revive(x) end
    end
  end
  return v
end

function M.decode(text, where)
  local ok, v = pcall(cjson.decode, text)
  if not ok then error(("runs: %s: invalid JSON (%s)"):format(where or "text", tostring(v)), 2) end
  if v == cjson.null then return nil end
  return revive(v)
end

-- Rows of a JSON-lines file; a line that does not parse (the torn last line of a crash) is
-- skipped. Returns rows and the number of skipped lines.
function M.read_jsonl(path)
  local rows, bad = {}, 0
  local f = io.open(path, "rb")
  if not f then return rows, 0 end
  for line in f:lines() do
    if line:find("%S") then
      local ok, v = pcall(cjson.decode, line)
      if ok and type(v) == "table" then rows[#rows + 1] = revive(v) else bad = bad + 1 end
    end
  end
  f:close()
  return rows, bad
end

return M
