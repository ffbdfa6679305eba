-- remax.text.jinja: a Jinja interpreter for the subset Hugging Face chat templates use, set up as
-- transformers sets up jinja2 (trim_blocks, lstrip_blocks, loop controls, tojson as json.dumps
-- with ensure_ascii off, raise_exception, strftime_now).
--
--   local tpl = jinja.compile(source, "tokenizer_config.json chat_template")
--   local text = tpl:render({ messages = {...}, add_generation_prompt = true, bos_token = "<s>" })
--
-- Values follow Python: Lua strings are str (indexed by code point), integral numbers int,
-- jinja.float(x) a float, true/false bool, jinja.none None; Lua arrays are lists, other tables
-- dicts (keys in sorted order unless built with jinja.dict{{k, v}, ...}). A construct the
-- interpreter lacks fails with the template's line and the construct's name.
local M = {}

local NONE = setmetatable({}, { __tostring = function() return "None" end })
local UNDEF = setmetatable({}, { __tostring = function() return "" end })
M.none, M.undefined = NONE, UNDEF

local FLOAT = {}
local LIST = {}
local DICT = {}
local NS = {}       -- namespace(): a dict that set may write through
local MACRO = {}
local FUNC = {}     -- a Lua function callable from templates: fn(args, kwargs, line)
local SAFE = {}

local has_cjson, cjson = pcall(require, "cjson")
local JSON_NULL = has_cjson and cjson.null or nil

local function float(x) return setmetatable({ v = x }, FLOAT) end
M.float = float

local function list(t, n) t = t or {}; t.n = n or #t; return setmetatable(t, LIST) end
local function tuple(t, n) t = list(t, n); t.tuple = true; return t end
local function new_dict() return setmetatable({ keys = {}, map = {} }, DICT) end
local function dict_set(d, k, v)
  if d.map[k] == nil then d.keys[#d.keys + 1] = k end
  d.map[k] = v
end
local function dict_get(d, k) return d.map[k] end
M.list = function(t) return list(t) end
-- An ordered dict from {{key, value}, ...}.
function M.dict(pairs_)
  local d = new_dict()
  for _, kv in ipairs(pairs_ or {}) do dict_set(d, kv[1], M.from_lua(kv[2])) end
  return d
end

---------------------------------------------------------------------------- errors

local function fail(line, msg, ...)
  error({ jinja = true, line = line, msg = select("#", ...) > 0 and msg:format(...) or msg }, 0)
end

---------------------------------------------------------------------------- limits

-- What one rendering may use, so that a template (a file a user hands remax) cannot hang the
-- run or exhaust its memory: it fails instead, naming the limit. A real chat template stays far
-- below each (a 1000-message conversation with tools takes a few thousand steps).
--   steps   loop iterations, macro calls and items walked, per rendering
--   bytes   the longest string an operation may build (the rendered text included)
--   memory  bytes of Lua heap a rendering may add
--   range   the longest range() (jinja2's sandbox, which transformers uses, has the same limit)
--   depth   nesting of statements, of macro calls and of values; expressions nest up to 3 x depth
M.limits = { steps = 1000000, bytes = 16 * 2 ^ 20, memory = 1024 * 2 ^ 20, range = 100000, depth = 100 }

local budget   -- the rendering in progress: { steps =, ctx =, mem0 =, next_mem = }

local function tick(n)
  local b = budget
  if not b then return end
  b.steps = b.steps + (n or 1)
  local lim = M.limits
  if b.steps > lim.steps then
    fail(b.ctx.line, "the rendering takes over %d steps (loop iterations, macro calls, items walked): a runaway loop? " ..
      "(remax.text.jinja.limits.steps)", lim.steps)
  end
  if b.steps >= b.next_mem then
    b.next_mem = b.steps + 1024
    if (collectgarbage("count") - b.mem0) * 1024 > lim.memory then
      collectgarbage()
      if (collectgarbage("count") - b.mem0) * 1024 > lim.memory then
        fail(b.ctx.line, "the rendering uses over %d MB (remax.text.jinja.limits.memory)", lim.memory / 2 ^ 20)
      end
    end
  end
end

-- A string of n bytes is about to be built.
local function sized(n, line)
  if n > M.limits.bytes then
    fail(line or (budget and budget.ctx.line), "a string of %.0f bytes is over the limit of %d (remax.text.jinja.limits.bytes)",
      n, M.limits.bytes)
  end
end

local function too_deep(line, what)
  fail(line or (budget and budget.ctx.line), "%s nested over %d deep (remax.text.jinja.limits.depth)", what, M.limits.depth)
end

-- table.concat of a buffer, its total size checked first.
local function joined(buf, sep, line)
  local n = sep and #sep * math.max(0, #buf - 1) or 0
  for i = 1, #buf do n = n + #buf[i] end
  sized(n, line)
  return table.concat(buf, sep)
end

local function kind(v)
  local tv = type(v)
  if tv == "string" then return "str" end
  if tv == "number" then return "int" end
  if tv == "boolean" then return "bool" end
  if v == NONE then return "none" end
  if v == UNDEF or v == nil then return "undefined" end
  local mt = getmetatable(v)
  if mt == FLOAT then return "float" end
  if mt == LIST then return "list" end
  if mt == DICT then return "dict" end
  if mt == NS then return "namespace" end
  if mt == MACRO or mt == FUNC then return "callable" end
  if tv == "function" then return "callable" end
  return "object"
end

-- Lua values (recipe arguments, messages) -> template values.
function M.from_lua(v, depth)
  depth = depth or 0
  if depth > M.limits.depth then too_deep(nil, "a value") end
  local tv = type(v)
  if tv == "nil" then return NONE end
  if tv ~= "table" then
    if tv == "number" and (v ~= math.floor(v) or v ~= v or v == math.huge or v == -math.huge) then return float(v) end
    if tv == "function" then return setmetatable({ fn = function(args) return M.from_lua(v(unpack(args))) end }, FUNC) end
    if tv == "userdata" and v == JSON_NULL then return NONE end
    return v
  end
  local mt = getmetatable(v)
  if mt == FLOAT or mt == LIST or mt == DICT or mt == NS or mt == MACRO or mt == FUNC or v == NONE or v == UNDEF then return v end
  local n = #v
  if n > 0 or next(v) == nil then
    local out = {}
    for i = 1, n do out[i] = M.from_lua(v[i], depth + 1) end
    return list(out, n)
  end
  local keys = {}
  for k in pairs(v) do keys[#keys + 1] = k end
  table.sort(keys, function(a, b) return tostring(a) < tostring(b) end)
  local d = new_dict()
  for _, k in ipairs(keys) do dict_set(d, k, M.from_lua(v[k], depth + 1)) end
  return d
end

-- JSON text -> template values as Python's json.loads gives them: objects keep their keys in the
-- text's order (json.dumps, and so tojson, writes them back in that order), 1 is an int and 1.0
-- a float, null is None. Errors name `where` and the byte offset.
function M.from_json(text, where)
  where = where or "JSON"
  local pos = 1
  local function bad(msg) error(("%s: %s at byte %d"):format(where, msg, pos), 0) end
  local function skip() pos = text:find("[^ \t\r\n]", pos) or #text + 1 end
  local escapes = { ['"'] = '"', ["\\"] = "\\", ["/"] = "/", b = "\b", f = "\f", n = "\n", r = "\r", t = "\t" }
  local function utf8(cp)
    if cp < 0x80 then return string.char(cp) end
    if cp < 0x800 then return string.char(0xC0 + math.floor(cp / 64), 0x80 + cp % 64) end
    if cp < 0x10000 then return string.char(0xE0 + math.floor(cp / 4096), 0x80 + math.floor(cp / 64) % 64, 0x80 + cp % 64) end
    return string.char(0xF0 + math.floor(cp / 262144), 0x80 + math.floor(cp / 4096) % 64, 0x80 + math.floor(cp / 64) % 64,
      0x80 + cp % 64)
  end
  local function hex4(at)
    local h = text:match("^%x%x%x%x", at)
    if not h then bad("bad \\u escape") end
    return tonumber(h, 16)
  end
  local function string_()
    local buf = {}
    pos = pos + 1
    while true do
      local a, b = text:find('["\\]', pos)
      if not a then bad("unterminated string") end
      buf[#buf + 1] = text:sub(pos, a - 1)
      pos = a + 1
      if text:sub(a, a) == '"' then return table.concat(buf) end
      local e = text:sub(pos, pos)
      if e == "u" then
        local cp = hex4(pos + 1)
        pos = pos + 5
        if cp >= 0xD800 and cp < 0xDC00 and text:sub(pos, pos + 1) == "\\u" then
          local lo = hex4(pos + 2)
          if lo >= 0xDC00 and lo < 0xE000 then
            cp = 0x10000 + (cp - 0xD800) * 1024 + (lo - 0xDC00)
            pos = pos + 6
          end
        end
        buf[#buf + 1] = utf8(cp)
      elseif escapes[e] then
        buf[#buf + 1] = escapes[e]
        pos = pos + 1
      else
        bad("bad escape")
      end
    end
  end
  local value
  function value(depth)
    if depth > M.limits.depth then bad("nested too deep") end
    skip()
    local c = text:sub(pos, pos)
    if c == "{" then
      local d = new_dict()
      pos = pos + 1
      skip()
      if text:sub(pos, pos) == "}" then pos = pos + 1 return d end
      while true do
        skip()
        if text:sub(pos, pos) ~= '"' then bad("expected a string key") end
        local k = string_()
        skip()
        if text:sub(pos, pos) ~= ":" then bad("expected ':'") end
        pos = pos + 1
        dict_set(d, k, value(depth + 1))
        skip()
        local sep = text:sub(pos, pos)
        pos = pos + 1
        if sep == "}" then return d end
        if sep ~= "," then bad("expected ',' or '}'") end
      end
    elseif c == "[" then
      local out, n = {}, 0
      pos = pos + 1
      skip()
      if text:sub(pos, pos) == "]" then pos = pos + 1 return list(out, 0) end
      while true do
        n = n + 1
        out[n] = value(depth + 1)
        skip()
        local sep = text:sub(pos, pos)
        pos = pos + 1
        if sep == "]" then return list(out, n) end
        if sep ~= "," then bad("expected ',' or ']'") end
      end
    elseif c == '"' then
      return string_()
    end
    for word, v in pairs({ ["true"] = true, ["false"] = false, null = NONE }) do
      if text:sub(pos, pos + #word - 1) == word then pos = pos + #word return v end
    end
    local num = text:match("^-?%d+%.?%d*[eE]?[-+]?%d*", pos)
    if not num or num == "" or num == "-" then bad("unexpected character") end
    pos = pos + #num
    local x = tonumber(num)
    if not x then bad("bad number " .. num) end
    return num:find("[.eE]") and float(x) or x
  end
  local v = value(0)
  skip()
  if pos <= #text then bad("text after the value") end
  return v
end

-- Template values -> plain Lua values (lists and dicts as tables, None as nil, floats as numbers).
function M.to_lua(v)
  local k = kind(v)
  if k == "float" then return v.v end
  if k == "none" or k == "undefined" then return nil end
  if k == "list" then
    local out = {}
    for i = 1, v.n do out[i] = M.to_lua(v[i]) end
    return out
  end
  if k == "dict" then
    local out = {}
    for _, key in ipairs(v.keys) do out[key] = M.to_lua(v.map[key]) end
    return out
  end
  return v
end

-- The entries of a template dict in order, { {key, value}, ... } (nil for anything else).
function M.items(v)
  if kind(v) ~= "dict" then return nil end
  local out = {}
  for i, key in ipairs(v.keys) do out[i] = { key, v.map[key] } end
  return out
end

---------------------------------------------------------------------------- UTF-8 and Python str

local function codepoints(s)
  local out, i, n = {}, 1, #s
  while i <= n do
    local c = s:byte(i)
    local len = c < 0x80 and 1 or c < 0xE0 and 2 or c < 0xF0 and 3 or 4
    if c >= 0x80 and c < 0xC0 then len = 1 end
    out[#out + 1] = s:sub(i, i + len - 1)
    i = i + len
  end
  return out
end

local function ulen(s)
  local n = 0
  for i = 1, #s do
    local c = s:byte(i)
    if c < 0x80 or c >= 0xC0 then n = n + 1 end
  end
  return n
end

-- Python's str.isspace() set.
local SPACE = {}
for _, cp in ipairs({ 9, 10, 11, 12, 13, 28, 29, 30, 31, 32, 0x85, 0xA0, 0x1680, 0x2000, 0x2001, 0x2002, 0x2003,
  0x2004, 0x2005, 0x2006, 0x2007, 0x2008, 0x2009, 0x200A, 0x2028, 0x2029, 0x202F, 0x205F, 0x3000 }) do
  local s
  if cp < 0x80 then s = string.char(cp)
  elseif cp < 0x800 then s = string.char(0xC0 + math.floor(cp / 64), 0x80 + cp % 64)
  else s = string.char(0xE0 + math.floor(cp / 4096), 0x80 + math.floor(cp / 64) % 64, 0x80 + cp % 64) end
  SPACE[s] = true
end

local function py_strip(s, chars, left, right)
  local cps = codepoints(s)
  local set
  if chars == nil or chars == NONE then set = SPACE
  else
    set = {}
    for _, c in ipairs(codepoints(chars)) do set[c] = true end
  end
  local i, j = 1, #cps
  if left then while i <= j and set[cps[i]] do i = i + 1 end end
  if right then while j >= i and set[cps[j]] do j = j - 1 end end
  return table.concat(cps, "", i, j)
end

local function find_plain(s, sub, init) return s:find(sub, init, true) end

local function py_split(s, sep, maxsplit)
  maxsplit = (maxsplit == nil or maxsplit == NONE) and -1 or maxsplit
  local out = {}
  if sep == nil or sep == NONE then
    local cps, cur, count = codepoints(s), {}, 0
    local i = 1
    while i <= #cps do
      if SPACE[cps[i]] then
        if #cur > 0 then
          out[#out + 1] = table.concat(cur); cur = {}; count = count + 1
          if maxsplit >= 0 and count >= maxsplit then
            while i <= #cps and SPACE[cps[i]] do i = i + 1 end
            if i <= #cps then out[#out + 1] = table.concat(cps, "", i) end
            return list(out)
          end
        end
      else cur[#cur + 1] = cps[i] end
      i = i + 1
    end
    if #cur > 0 then out[#out + 1] = table.concat(cur) end
    return list(out)
  end
  if sep == "" then fail(nil, "split: empty separator") end
  local start, count = 1, 0
  while true do
    if maxsplit >= 0 and count >= maxsplit then break end
    local a, b = find_plain(s, sep, start)
    if not a then break end
    out[#out + 1] = s:sub(start, a - 1)
    start = b + 1
    count = count + 1
  end
  out[#out + 1] = s:sub(start)
  return list(out)
end

local function py_rsplit(s, sep, maxsplit)
  maxsplit = (maxsplit == nil or maxsplit == NONE) and -1 or maxsplit
  if maxsplit < 0 or sep == nil or sep == NONE then return py_split(s, sep, maxsplit) end
  -- split from the right: find all occurrences, keep the last maxsplit
  local pos, start = {}, 1
  while true do
    local a, b = find_plain(s, sep, start)
    if not a then break end
    pos[#pos + 1] = { a, b }
    start = b + 1
  end
  local first = math.max(1, #pos - maxsplit + 1)
  local out, from = {}, 1
  if first <= #pos then out[1] = s:sub(1, pos[first][1] - 1); from = pos[first][2] + 1 else out[1] = s end
  for k = first + 1, #pos do out[#out + 1] = s:sub(from, pos[k][1] - 1); from = pos[k][2] + 1 end
  if first <= #pos then out[#out + 1] = s:sub(from) end
  return list(out)
end

local function py_replace(s, old, new, count)
  count = (count == nil or count == NONE) and -1 or count
  if old == "" then
    local cps, out = codepoints(s), {}
    local done = 0
    for i = 1, #cps + 1 do
      if count < 0 or done < count then out[#out + 1] = new; done = done + 1 end
      if cps[i] then out[#out + 1] = cps[i] end
    end
    return joined(out)
  end
  local out, start, done = {}, 1, 0
  while count < 0 or done < count do
    local a, b = find_plain(s, old, start)
    if not a then break end
    out[#out + 1] = s:sub(start, a - 1)
    out[#out + 1] = new
    start = b + 1
    done = done + 1
  end
  out[#out + 1] = s:sub(start)
  return joined(out)
end

---------------------------------------------------------------------------- str(), repr(), json

local function float_repr(x)
  if x ~= x then return "nan" end
  if x == math.huge then return "inf" end
  if x == -math.huge then return "-inf" end
  if x == math.floor(x) and math.abs(x) < 1e16 then return ("%.1f"):format(x) end
  for p = 1, 17 do
    local s = ("%." .. p .. "g"):format(x)
    if tonumber(s) == x then
      -- Python writes exponents with at least two digits and keeps a sign: 1e-05, 1e+16
      s = s:gsub("e([+-])(%d)$", "e%10%2")
      return s
    end
  end
  return ("%.17g"):format(x)
end

local function int_str(x)
  if x == math.floor(x) and math.abs(x) < 2 ^ 63 then return ("%d"):format(x) end
  return float_repr(x)
end

local repr

local function str(v)
  local k = kind(v)
  if k == "str" then return v end
  if k == "int" then return int_str(v) end
  if k == "float" then return float_repr(v.v) end
  if k == "bool" then return v and "True" or "False" end
  if k == "none" then return "None" end
  if k == "undefined" then return "" end
  if getmetatable(v) == SAFE then return v.s end
  return repr(v)
end
M.str = str

local function str_repr(s)
  local q = "'"
  if s:find("'", 1, true) and not s:find('"', 1, true) then q = '"' end
  local out = s:gsub("[%c\\'\"]", function(c)
    if c == "\\" then return "\\\\" end
    if c == q then return "\\" .. c end
    if c == "'" or c == '"' then return c end
    local named = { ["\n"] = "\\n", ["\r"] = "\\r", ["\t"] = "\\t" }
    return named[c] or ("\\x%02x"):format(c:byte())
  end)
  return q .. out .. q
end

repr = function(v, depth)
  depth = depth or 0
  if depth > M.limits.depth then too_deep(nil, "a value") end
  local k = kind(v)
  if k == "str" then return str_repr(v) end
  if k == "list" then
    local parts = {}
    for i = 1, v.n do parts[i] = repr(v[i], depth + 1) end
    if v.tuple then return "(" .. joined(parts, ", ") .. (v.n == 1 and ",)" or ")") end
    return "[" .. joined(parts, ", ") .. "]"
  end
  if k == "dict" or k == "namespace" then
    local d = k == "namespace" and v.d or v
    local parts = {}
    for _, key in ipairs(d.keys) do parts[#parts + 1] = repr(key, depth + 1) .. ": " .. repr(d.map[key], depth + 1) end
    if k == "namespace" then return "<Namespace {" .. joined(parts, ", ") .. "}>" end
    return "{" .. joined(parts, ", ") .. "}"
  end
  if k == "callable" then return "<function>" end
  return str(v)
end

local function json_string(s)
  return '"' .. s:gsub('[%c"\\]', function(c)
    local named = { ['"'] = '\\"', ["\\"] = "\\\\", ["\n"] = "\\n", ["\r"] = "\\r", ["\t"] = "\\t",
      ["\b"] = "\\b", ["\f"] = "\\f" }
    if c == "\127" then return c end
    return named[c] or ("\\u%04x"):format(c:byte())
  end) .. '"'
end

-- json.dumps(v, ensure_ascii=False, indent=indent, separators=..., sort_keys=...)
local function tojson(v, indent, item_sep, key_sep, sort_keys, line, level)
  level = level or 0
  if level > M.limits.depth then too_deep(line, "tojson: a value") end
  local k = kind(v)
  if k == "str" then return json_string(v) end
  if k == "int" then return int_str(v) end
  if k == "float" then
    local x = v.v
    if x ~= x then return "NaN" end
    if x == math.huge then return "Infinity" end
    if x == -math.huge then return "-Infinity" end
    return float_repr(x)
  end
  if k == "bool" then return v and "true" or "false" end
  if k == "none" then return "null" end
  if k == "undefined" then fail(line, "tojson: the value is undefined") end
  local nl, pad, pad_in = "", "", ""
  if indent then
    nl = "\n"
    sized(indent * (level + 1), line)
    pad = (" "):rep(indent * level)
    pad_in = (" "):rep(indent * (level + 1))
  end
  if k == "list" then
    if v.n == 0 then return "[]" end
    local parts = {}
    for i = 1, v.n do parts[i] = pad_in .. tojson(v[i], indent, item_sep, key_sep, sort_keys, line, level + 1) end
    return "[" .. nl .. joined(parts, item_sep .. nl, line) .. nl .. pad .. "]"
  end
  if k == "dict" or k == "namespace" then
    local d = k == "namespace" and v.d or v
    if #d.keys == 0 then return "{}" end
    local keys = {}
    for i, key in ipairs(d.keys) do keys[i] = key end
    if sort_keys then table.sort(keys, function(a, b) return tostring(a) < tostring(b) end) end
    local parts = {}
    for i, key in ipairs(keys) do
      local ks = type(key) == "string" and json_string(key) or json_string(str(key))
      parts[i] = pad_in .. ks .. key_sep .. tojson(d.map[key], indent, item_sep, key_sep, sort_keys, line, level + 1)
    end
    return "{" .. nl .. joined(parts, item_sep .. nl, line) .. nl .. pad .. "}"
  end
  fail(line, "tojson: cannot serialise a %s", k)
end

---------------------------------------------------------------------------- truth, equality, numbers

local function truthy(v)
  local k = kind(v)
  if k == "bool" then return v end
  if k == "str" then return v ~= "" end
  if k == "int" then return v ~= 0 end
  if k == "float" then return v.v ~= 0 end
  if k == "none" or k == "undefined" then return false end
  if k == "list" then return v.n > 0 end
  if k == "dict" then return #v.keys > 0 end
  return true
end
M.truthy = truthy

local function num(v)
  local k = kind(v)
  if k == "int" then return v, false end
  if k == "float" then return v.v, true end
  if k == "bool" then return v and 1 or 0, false end
  return nil
end

local function equal(a, b, depth)
  depth = depth or 0
  if depth > M.limits.depth then too_deep(nil, "a value") end
  local ka, kb = kind(a), kind(b)
  local na, fa = num(a)
  local nb = num(b)
  if na ~= nil and nb ~= nil then return na == nb end
  if ka ~= kb then return false end
  if ka == "str" then return a == b end
  if ka == "list" then
    if a.n ~= b.n then return false end
    for i = 1, a.n do if not equal(a[i], b[i], depth + 1) then return false end end
    return true
  end
  if ka == "dict" then
    if #a.keys ~= #b.keys then return false end
    for _, key in ipairs(a.keys) do
      if b.map[key] == nil or not equal(a.map[key], b.map[key], depth + 1) then return false end
    end
    return true
  end
  return rawequal(a, b)
end

local function make_num(x, is_float)
  if is_float then return float(x) end
  return x
end

local function less(a, b, line)
  local na, nb = num(a), num(b)
  if na ~= nil and nb ~= nil then return na < nb end
  if kind(a) == "str" and kind(b) == "str" then return a < b end
  fail(line, "cannot compare %s with %s", kind(a), kind(b))
end

local function length(v, line)
  local k = kind(v)
  if k == "str" then return ulen(v) end
  if k == "list" then return v.n end
  if k == "dict" then return #v.keys end
  if k == "namespace" then return #v.d.keys end
  fail(line, "object of type %s has no length", k)
end

local function iterate(v, line)
  local k = kind(v)
  if k == "list" then
    tick(math.floor(v.n / 16))
    local out = {}
    for i = 1, v.n do out[i] = v[i] end
    return out
  end
  if k == "str" then tick(math.floor(#v / 16)); return codepoints(v) end
  if k == "dict" then
    tick(math.floor(#v.keys / 16))
    local out = {}
    for i, key in ipairs(v.keys) do out[i] = key end
    return out
  end
  if k == "undefined" then return {} end
  fail(line, "%s is not iterable", k)
end

local function contains(container, item, line)
  local k = kind(container)
  if k == "str" then
    if kind(item) ~= "str" then fail(line, "'in <string>' requires a string on the left, got %s", kind(item)) end
    return find_plain(container, item, 1) ~= nil
  end
  if k == "list" then
    for i = 1, container.n do if equal(container[i], item) then return true end end
    return false
  end
  if k == "dict" then return container.map[item] ~= nil end
  if k == "namespace" then return container.d.map[item] ~= nil end
  if k == "undefined" then fail(line, "'in' on an undefined value") end
  fail(line, "argument of type %s is not iterable", k)
end

local function index_of(n, i, line)
  if i < 0 then i = i + n end
  if i < 0 or i >= n then return nil end
  return i + 1
end

local function slice_range(n, a, b, step, line)
  step = (step == nil or step == NONE) and 1 or step
  if step == 0 then fail(line, "slice step cannot be zero") end
  local lo, hi
  if step > 0 then
    lo = (a == nil or a == NONE) and 0 or (a < 0 and math.max(0, a + n) or math.min(a, n))
    hi = (b == nil or b == NONE) and n or (b < 0 and math.max(0, b + n) or math.min(b, n))
  else
    lo = (a == nil or a == NONE) and n - 1 or (a < 0 and math.max(-1, a + n) or math.min(a, n - 1))
    hi = (b == nil or b == NONE) and -1 or (b < 0 and math.max(-1, b + n) or math.min(b, n - 1))
  end
  local idx = {}
  local i = lo
  if step > 0 then while i < hi do idx[#idx + 1] = i + 1; i = i + step end
  else while i > hi do idx[#idx + 1] = i + 1; i = i + step end end
  return idx
end

---------------------------------------------------------------------------- lexer

-- Splits the source into text and tag tokens, applying whitespace control as transformers'
-- jinja2 environment does: trim_blocks (first newline after a block or comment tag dropped),
-- lstrip_blocks (spaces and tabs before a block or comment tag on its own line dropped), "-"
-- (all whitespace on that side dropped) and "+" (lstrip_blocks off for that tag). A single
-- trailing newline of the template is dropped (keep_trailing_newline off).
-- Whitespace bytes (Lua's %s) at the end of a text, found from the end: the trims below cost
-- the whitespace they look at, not the text's length (`text:gsub("%s+$", "")` and
-- `text:match(".*()\n")` try every start position: quadratic on a template of one long line).
local SPACE = { [32] = true, [9] = true, [10] = true, [11] = true, [12] = true, [13] = true }
local function rtrim(text)
  local i = #text
  while i > 0 and SPACE[text:byte(i)] do i = i - 1 end
  return i == #text and text or text:sub(1, i)
end

-- lstrip_blocks: the text without the spaces and tabs between its last line start and its end,
-- when only those are there (at_line_start: the text starts a line).
local function lstrip_tail(text, at_line_start)
  local i = #text
  while i > 0 do
    local b = text:byte(i)
    if b == 10 then return text:sub(1, i) end
    if not (b == 32 or b == 9 or b == 11 or b == 12 or b == 13) then return text end
    i = i - 1
  end
  return at_line_start and "" or text
end

local function lex(src)
  src = src:gsub("\r\n?", "\n")   -- jinja2 reads every newline sequence as \n
  if src:sub(-1) == "\n" then src = src:sub(1, -2) end
  local toks = {}
  local pos, n, line = 1, #src, 1
  local strip_next = false     -- previous tag ended with "-"
  local line_starting = true
  while pos <= n do
    local a = src:find("{[{%%#]", pos)
    local text = a and src:sub(pos, a - 1) or src:sub(pos)
    if strip_next then text = text:gsub("^%s+", ""); strip_next = false end
    if not a then
      if text ~= "" then toks[#toks + 1] = { t = "text", v = text, line = line } end
      break
    end
    local open = src:sub(a, a + 1)
    local mod = src:sub(a + 2, a + 2)
    local tag_line = line + select(2, src:sub(pos, a - 1):gsub("\n", ""))
    if mod == "-" then text = rtrim(text)
    elseif open ~= "{{" and mod ~= "+" then
      -- lstrip_blocks: whitespace between the line start and the tag goes
      text = lstrip_tail(text, line_starting)
    end
    if text ~= "" then toks[#toks + 1] = { t = "text", v = text, line = line } end
    line = tag_line
    local body_start = a + 2 + ((mod == "-" or mod == "+") and 1 or 0)
    if open == "{#" then
      local e = src:find("#}", body_start, true)
      if not e then fail(line, "comment is not closed") end
      local trim_right = src:sub(e - 1, e - 1) == "-" and e - 1 >= body_start
      line = line + select(2, src:sub(a, e + 1):gsub("\n", ""))
      pos = e + 2
      if trim_right then strip_next = true
      elseif src:sub(pos, pos) == "\n" then pos = pos + 1; line = line + 1 end
      line_starting = src:sub(pos - 1, pos - 1) == "\n"
    else
      local close = open == "{{" and "}}" or "%}"
      -- find the closing delimiter outside string literals
      local i, e = body_start, nil
      while i <= n do
        local c = src:sub(i, i)
        if c == "'" or c == '"' then
          local j = i + 1
          while j <= n and src:sub(j, j) ~= c do
            if src:sub(j, j) == "\\" then j = j + 1 end
            j = j + 1
          end
          i = j + 1
        elseif src:sub(i, i + 1) == close then e = i; break
        else i = i + 1 end
      end
      if not e then fail(line, "%s is not closed", open) end
      local body_end = e - 1
      local trim_right = false
      if src:sub(e - 1, e - 1) == "-" and e - 1 >= body_start then trim_right = true; body_end = e - 2 end
      if src:sub(e - 1, e - 1) == "+" and e - 1 >= body_start then body_end = e - 2 end
      local body = src:sub(body_start, body_end)
      toks[#toks + 1] = { t = open == "{{" and "var" or "block", v = body, line = line }
      line = line + select(2, src:sub(a, e + 1):gsub("\n", ""))
      pos = e + 2
      if trim_right then strip_next = true
      elseif open == "{%" and src:sub(pos, pos) == "\n" then pos = pos + 1; line = line + 1 end
      line_starting = src:sub(pos - 1, pos - 1) == "\n"
    end
  end
  return toks
end

---------------------------------------------------------------------------- expression tokens

local function tokenize_expr(s, line)
  local out, i, n = {}, 1, #s
  while i <= n do
    local c = s:sub(i, i)
    if c:match("%s") then i = i + 1
    elseif c:match("[%a_]") then
      local w = s:match("^[%w_]+", i)
      out[#out + 1] = { t = "name", v = w }
      i = i + #w
    elseif c:match("%d") then
      local w = s:match("^%d[%d_]*%.%d[%d_]*[eE][+-]?%d+", i) or s:match("^%d[%d_]*%.%d[%d_]*", i)
        or s:match("^%d[%d_]*[eE][+-]?%d+", i)
      if w then out[#out + 1] = { t = "float", v = tonumber((w:gsub("_", ""))) }
      else
        w = s:match("^%d[%d_]*", i)
        out[#out + 1] = { t = "int", v = tonumber((w:gsub("_", ""))) }
      end
      i = i + #w
    elseif c == "'" or c == '"' then
      local j, buf = i + 1, {}
      while true do
        if j > n then fail(line, "string literal is not closed") end
        local d = s:sub(j, j)
        if d == c then break end
        if d == "\\" then
          local e = s:sub(j + 1, j + 1)
          local map = { n = "\n", t = "\t", r = "\r", ["\\"] = "\\", ["'"] = "'", ['"'] = '"', ["0"] = "\0",
            a = "\a", b = "\b", f = "\f", v = "\v" }
          if map[e] then buf[#buf + 1] = map[e]; j = j + 2
          elseif e == "u" or e == "x" or e == "U" then
            local len = e == "x" and 2 or e == "u" and 4 or 8
            local hex = s:sub(j + 2, j + 1 + len)
            local cp = tonumber(hex, 16)
            if not cp or #hex ~= len then fail(line, "bad \\%s escape in a string literal", e) end
            if cp < 0x80 then buf[#buf + 1] = string.char(cp)
            elseif cp < 0x800 then buf[#buf + 1] = string.char(0xC0 + math.floor(cp / 64), 0x80 + cp % 64)
            elseif cp < 0x10000 then
              buf[#buf + 1] = string.char(0xE0 + math.floor(cp / 4096), 0x80 + math.floor(cp / 64) % 64, 0x80 + cp % 64)
            else
              buf[#buf + 1] = string.char(0xF0 + math.floor(cp / 262144), 0x80 + math.floor(cp / 4096) % 64,
                0x80 + math.floor(cp / 64) % 64, 0x80 + cp % 64)
            end
            j = j + 2 + len
          else buf[#buf + 1] = "\\" .. e; j = j + 2 end   -- Python keeps unknown escapes
        else buf[#buf + 1] = d; j = j + 1 end
      end
      out[#out + 1] = { t = "str", v = table.concat(buf) }
      i = j + 1
    else
      local three = s:sub(i, i + 1)
      local ops2 = { ["=="] = 1, ["!="] = 1, ["<="] = 1, [">="] = 1, ["//"] = 1, ["**"] = 1 }
      if ops2[three] then out[#out + 1] = { t = "op", v = three }; i = i + 2
      elseif ("+-*/%~<>=()[]{}.,:|"):find(c, 1, true) then out[#out + 1] = { t = "op", v = c }; i = i + 1
      else fail(line, "unexpected character '%s' in an expression", c) end
    end
  end
  out[#out + 1] = { t = "eof" }
  return out
end

---------------------------------------------------------------------------- expression parser

local Parser = {}
Parser.__index = Parser

local function parser(s, line)
  return setmetatable({ toks = tokenize_expr(s, line), i = 1, line = line, src = s }, Parser)
end

function Parser:peek(k) return self.toks[self.i + (k or 0)] end
function Parser:next() local t = self.toks[self.i]; self.i = self.i + 1; return t end
function Parser:is(t, v) local k = self.toks[self.i]; return k.t == t and (v == nil or k.v == v) end
function Parser:accept(t, v) if self:is(t, v) then return self:next() end end
function Parser:expect(t, v)
  if self:is(t, v) then return self:next() end
  local k = self.toks[self.i]
  fail(self.line, "expected %s, found %s in '%s'", v and ("'" .. v .. "'") or t,
    k.t == "eof" and "the end" or ("'" .. tostring(k.v) .. "'"), self.src)
end
function Parser:done() return self:is("eof") end

local function deeper(p, by)
  p.depth = (p.depth or 0) + by
  if p.depth > 3 * M.limits.depth then too_deep(p.line, "expressions") end
end

-- expression := ternary
function Parser:expr(no_ternary)
  deeper(self, 1)
  local e = self:expr_(no_ternary)
  deeper(self, -1)
  return e
end
function Parser:expr_(no_ternary)
  local e = self:or_expr()
  if not no_ternary and self:is("name", "if") then
    self:next()
    local cond = self:or_expr()
    local other
    if self:accept("name", "else") then other = self:expr() end
    return { k = "cond", cond = cond, a = e, b = other }
  end
  return e
end

function Parser:or_expr()
  local e = self:and_expr()
  while self:accept("name", "or") do e = { k = "or", a = e, b = self:and_expr() } end
  return e
end

function Parser:and_expr()
  local e = self:not_expr()
  while self:accept("name", "and") do e = { k = "and", a = e, b = self:not_expr() } end
  return e
end

function Parser:not_expr()
  if self:accept("name", "not") then
    deeper(self, 1)
    local e = { k = "not", a = self:not_expr() }
    deeper(self, -1)
    return e
  end
  return self:compare()
end

local CMP = { ["=="] = true, ["!="] = true, ["<"] = true, [">"] = true, ["<="] = true, [">="] = true }

function Parser:compare()
  local e = self:add()
  while true do
    local t = self:peek()
    if t.t == "op" and CMP[t.v] then
      self:next()
      e = { k = "cmp", op = t.v, a = e, b = self:add() }
    elseif t.t == "name" and t.v == "in" then
      self:next()
      e = { k = "in", a = e, b = self:add() }
    elseif t.t == "name" and t.v == "not" and self:peek(1).t == "name" and self:peek(1).v == "in" then
      self:next(); self:next()
      e = { k = "not", a = { k = "in", a = e, b = self:add() } }
    else break end
  end
  return e
end

-- jinja2's precedence: + - below ~ below * / // % below ** (left-assoc) below unary - +,
-- which binds before filters and tests: "-4 | abs" is 4.
function Parser:add()
  local e = self:concat()
  while self:is("op", "+") or self:is("op", "-") do
    local op = self:next().v
    e = { k = "arith", op = op, a = e, b = self:concat() }
  end
  return e
end

function Parser:concat()
  local e = self:mul()
  while self:accept("op", "~") do e = { k = "concat", a = e, b = self:mul() } end
  return e
end

function Parser:mul()
  local e = self:pow()
  while self:is("op", "*") or self:is("op", "/") or self:is("op", "//") or self:is("op", "%") do
    local op = self:next().v
    e = { k = "arith", op = op, a = e, b = self:pow() }
  end
  return e
end

function Parser:pow()
  local e = self:unary(true)
  while self:accept("op", "**") do e = { k = "arith", op = "**", a = e, b = self:unary(true) } end
  return e
end

function Parser:unary(with_filter)
  local e
  deeper(self, 1)
  if self:accept("op", "-") then e = { k = "neg", a = self:unary(false) }
  elseif self:accept("op", "+") then e = self:unary(false)
  else e = self:primary() end
  deeper(self, -1)
  e = self:postfix(e)
  if with_filter then e = self:filters(e) end
  return e
end

function Parser:args()
  local args, kwargs = {}, {}
  self:expect("op", "(")
  while not self:is("op", ")") do
    if self:is("name") and self:peek(1).t == "op" and self:peek(1).v == "=" then
      local name = self:next().v
      self:next()
      kwargs[#kwargs + 1] = { name, self:expr() }
    else
      args[#args + 1] = self:expr()
    end
    if not self:accept("op", ",") then break end
  end
  self:expect("op", ")")
  return args, kwargs
end

-- filters and tests after an operand
function Parser:filters(e)
  while true do
    if self:accept("op", "|") then
      local name = self:expect("name").v
      local args, kwargs = {}, {}
      if self:is("op", "(") then args, kwargs = self:args() end
      e = { k = "filter", name = name, a = e, args = args, kwargs = kwargs, line = self.line }
      e = self:postfix(e)
    elseif self:is("name", "is") then
      self:next()
      local negate = self:accept("name", "not") ~= nil
      local name = self:expect("name").v
      local args = {}
      if self:is("op", "(") then args = self:args()
      elseif not self:done() and (self:is("str") or self:is("int") or self:is("float")
        or (self:is("name") and not ({ ["and"] = 1, ["or"] = 1, ["else"] = 1, ["if"] = 1, ["in"] = 1, ["not"] = 1, ["is"] = 1 })[self:peek().v])) then
        args = { self:postfix(self:primary()) }
      end
      e = { k = "test", name = name, a = e, args = args, negate = negate, line = self.line }
    else break end
  end
  return e
end

function Parser:postfix(e)
  while true do
    if self:accept("op", ".") then
      local t = self:next()
      if t.t ~= "name" and t.t ~= "int" then fail(self.line, "expected an attribute name after '.'") end
      e = { k = "attr", a = e, name = t.v }
    elseif self:is("op", "[") then
      self:next()
      local parts, is_slice = { nil, nil, nil }, false
      local idx = 1
      while true do
        if self:is("op", ":") then
          self:next(); is_slice = true; idx = idx + 1
        elseif self:is("op", "]") then break
        else
          parts[idx] = self:expr()
          if not self:is("op", ":") then break end
        end
      end
      self:expect("op", "]")
      if is_slice then e = { k = "slice", a = e, start = parts[1], stop = parts[2], step = parts[3] }
      elseif parts[1] == nil then fail(self.line, "expected an expression inside '[]' (a key, an index or a slice)")
      else e = { k = "item", a = e, key = parts[1] } end
    elseif self:is("op", "(") then
      local args, kwargs = self:args()
      e = { k = "call", f = e, args = args, kwargs = kwargs, line = self.line }
    else return e end
  end
end

function Parser:primary()
  local t = self:next()
  if t.t == "str" then
    local s = t.v
    while self:is("str") do s = s .. self:next().v end   -- adjacent literals join
    return { k = "lit", v = s }
  end
  if t.t == "int" then return { k = "lit", v = t.v } end
  if t.t == "float" then return { k = "lit", v = float(t.v) } end
  if t.t == "name" then
    local w = t.v
    if w == "true" or w == "True" then return { k = "lit", v = true } end
    if w == "false" or w == "False" then return { k = "lit", v = false } end
    if w == "none" or w == "None" then return { k = "lit", v = NONE } end
    return { k = "name", name = w }
  end
  if t.t == "op" and t.v == "(" then
    if self:accept("op", ")") then return { k = "tuple", items = {}, tuple = true } end
    local e = self:expr()
    if self:is("op", ",") then
      local items = { e }
      while self:accept("op", ",") do
        if self:is("op", ")") then break end
        items[#items + 1] = self:expr()
      end
      self:expect("op", ")")
      return { k = "tuple", items = items, tuple = true }
    end
    self:expect("op", ")")
    return e
  end
  if t.t == "op" and t.v == "[" then
    local items = {}
    while not self:is("op", "]") do
      items[#items + 1] = self:expr()
      if not self:accept("op", ",") then break end
    end
    self:expect("op", "]")
    return { k = "tuple", items = items }
  end
  if t.t == "op" and t.v == "{" then
    local items = {}
    while not self:is("op", "}") do
      local key = self:expr()
      self:expect("op", ":")
      items[#items + 1] = { key, self:expr() }
      if not self:accept("op", ",") then break end
    end
    self:expect("op", "}")
    return { k = "dictlit", items = items }
  end
  fail(self.line, "unexpected %s in '%s'", t.t == "eof" and "end of expression" or ("'" .. tostring(t.v) .. "'"), self.src)
end

---------------------------------------------------------------------------- statement parser

local function parse_targets(p)
  local names = {}
  local paren = p:accept("op", "(")
  repeat
    local n = p:expect("name").v
    if p:accept("op", ".") then n = { ns = n, attr = p:expect("name").v } end
    names[#names + 1] = n
  until not p:accept("op", ",")
  if paren then p:expect("op", ")") end
  return names
end

local SUPPORTED_TAGS = "if, elif, else, endif, for, endfor, set, endset, macro, endmacro, call, endcall, filter, " ..
  "endfilter, break, continue, generation, endgeneration"

local function parse(toks)
  local i = 1
  local function block_name(tok) return tok.v:match("^%s*([%w_]+)") end

  local parse_body
  local nesting = 0
  parse_body = function(stop)
    nesting = nesting + 1
    if nesting > M.limits.depth then too_deep(toks[i] and toks[i].line, "statements") end
    local nodes = {}
    while i <= #toks do
      local tok = toks[i]
      if tok.t == "text" then nodes[#nodes + 1] = { k = "text", v = tok.v }; i = i + 1
      elseif tok.t == "var" then
        local p = parser(tok.v, tok.line)
        local e = p:expr()
        if not p:done() then fail(tok.line, "unexpected '%s' in '{{%s}}'", tostring(p:peek().v), tok.v) end
        nodes[#nodes + 1] = { k = "out", e = e, line = tok.line }
        i = i + 1
      else
        local name = block_name(tok)
        if not name then fail(tok.line, "empty block tag") end
        if stop and stop[name] then nesting = nesting - 1; return nodes, name, tok end
        i = i + 1
        local rest = tok.v:gsub("^%s*[%w_]+", "", 1)
        local p = parser(rest, tok.line)
        if name == "if" then
          local node = { k = "if", branches = {}, line = tok.line }
          local cond = p:expr()
          while true do
            local body, ended, etok = parse_body({ elif = true, ["else"] = true, endif = true })
            node.branches[#node.branches + 1] = { cond = cond, body = body }
            if not ended then fail(tok.line, "'if' is not closed by 'endif'") end
            i = i + 1
            if ended == "endif" then break end
            if ended == "else" then
              local b2, e2 = parse_body({ endif = true })
              if not e2 then fail(tok.line, "'if' is not closed by 'endif'") end
              i = i + 1
              node.else_body = b2
              break
            end
            cond = parser((etok.v:gsub("^%s*elif", "", 1)), etok.line):expr()
          end
          nodes[#nodes + 1] = node
        elseif name == "for" then
          local targets = parse_targets(p)
          p:expect("name", "in")
          local iter = p:expr(true)
          local filter
          if p:accept("name", "if") then filter = p:expr(true) end
          local recursive = p:accept("name", "recursive")
          if recursive then fail(tok.line, "'for ... recursive' is not supported") end
          local body, ended = parse_body({ ["else"] = true, endfor = true })
          if not ended then fail(tok.line, "'for' is not closed by 'endfor'") end
          i = i + 1
          local else_body
          if ended == "else" then
            local e2
            else_body, e2 = parse_body({ endfor = true })
            if not e2 then fail(tok.line, "'for' is not closed by 'endfor'") end
            i = i + 1
          end
          nodes[#nodes + 1] = { k = "for", targets = targets, iter = iter, filter = filter, body = body,
            else_body = else_body, line = tok.line }
        elseif name == "set" then
          local targets = parse_targets(p)
          if p:accept("op", "=") then
            local e = p:expr()
            if p:is("op", ",") then
              local items = { e }
              while p:accept("op", ",") do items[#items + 1] = p:expr() end
              e = { k = "tuple", items = items, tuple = true }
            end
            nodes[#nodes + 1] = { k = "set", targets = targets, e = e, line = tok.line }
          else
            local filters = {}
            while p:accept("op", "|") do filters[#filters + 1] = p:expect("name").v end
            local body, ended = parse_body({ endset = true })
            if not ended then fail(tok.line, "'set' block is not closed by 'endset'") end
            i = i + 1
            nodes[#nodes + 1] = { k = "setblock", target = targets[1], body = body, filters = filters, line = tok.line }
          end
        elseif name == "macro" then
          local mname = p:expect("name").v
          p:expect("op", "(")
          local params = {}
          while not p:is("op", ")") do
            local pn = p:expect("name").v
            local default
            if p:accept("op", "=") then default = p:expr() end
            params[#params + 1] = { pn, default }
            if not p:accept("op", ",") then break end
          end
          p:expect("op", ")")
          local body, ended = parse_body({ endmacro = true })
          if not ended then fail(tok.line, "'macro' is not closed by 'endmacro'") end
          i = i + 1
          nodes[#nodes + 1] = { k = "macro", name = mname, params = params, body = body, line = tok.line }
        elseif name == "call" then
          local e = p:expr()
          local body, ended = parse_body({ endcall = true })
          if not ended then fail(tok.line, "'call' is not closed by 'endcall'") end
          i = i + 1
          nodes[#nodes + 1] = { k = "callblock", e = e, body = body, line = tok.line }
        elseif name == "filter" then
          local fname = p:expect("name").v
          local args, kwargs = {}, {}
          if p:is("op", "(") then args, kwargs = p:args() end
          local body, ended = parse_body({ endfilter = true })
          if not ended then fail(tok.line, "'filter' is not closed by 'endfilter'") end
          i = i + 1
          nodes[#nodes + 1] = { k = "filterblock", name = fname, args = args, kwargs = kwargs, body = body, line = tok.line }
        elseif name == "generation" then
          local body, ended = parse_body({ endgeneration = true })
          if not ended then fail(tok.line, "'generation' is not closed by 'endgeneration'") end
          i = i + 1
          nodes[#nodes + 1] = { k = "group", body = body }
        elseif name == "break" or name == "continue" then
          nodes[#nodes + 1] = { k = name, line = tok.line }
        elseif name == "raw" then
          fail(tok.line, "statement 'raw' is not supported")
        else
          if ({ elif = 1, ["else"] = 1, endif = 1, endfor = 1, endset = 1, endmacro = 1, endcall = 1,
            endfilter = 1, endgeneration = 1 })[name] then
            fail(tok.line, "'%s' without its opening statement", name)
          end
          fail(tok.line, "statement '%s' is not supported (supported: %s)", name, SUPPORTED_TAGS)
        end
        if not p:done() and name ~= "if" and name ~= "for" and name ~= "set" and name ~= "macro" and name ~= "call"
          and name ~= "filter" then
          fail(tok.line, "unexpected '%s' after '%s'", tostring(p:peek().v), name)
        end
        if (name == "if" or name == "for" or name == "set" or name == "macro" or name == "filter") and not p:done() then
          fail(tok.line, "unexpected '%s' in '%s' statement", tostring(p:peek().v), name)
        end
      end
    end
    nesting = nesting - 1
    return nodes
  end
  local nodes, ended, tok = parse_body(nil)
  if ended then fail(tok.line, "'%s' without its opening statement", ended) end
  return nodes
end

---------------------------------------------------------------------------- evaluation

local Scope = {}
Scope.__index = Scope
local function scope(parent) return setmetatable({ vars = {}, parent = parent }, Scope) end
function Scope:get(name)
  local s = self
  while s do
    local v = s.vars[name]
    if v ~= nil then return v end
    s = s.parent
  end
  return nil
end
function Scope:set(name, v) self.vars[name] = v end

local filters, tests, methods = {}, {}, {}
local eval, exec_body

local function kw(kwargs, name, default)
  if kwargs[name] ~= nil then return kwargs[name] end
  return default
end

-- A built-in filter, test, method or global raised a Lua error (arguments of kinds it cannot
-- take, as Python would raise a TypeError): the template's error, naming it and the arguments.
-- Errors of the template itself (tables) pass through.
local function kinds(v, args)
  local out = {}
  if v ~= nil then out[1] = kind(v) end
  for i = 1, #(args or {}) do out[#out + 1] = kind(args[i]) end
  return table.concat(out, ", ")
end
local function builtin_failed(what, line, err, v, args)
  if type(err) == "table" then error(err, 0) end
  if tostring(err):find("not enough memory", 1, true) then fail(line, "%s: out of memory", what) end
  fail(line, "%s cannot take (%s)", what, kinds(v, args))
end

local function call_value(f, args, kwargs, line, ctx)
  local mt = getmetatable(f)
  if mt == MACRO then return f.call(args, kwargs, line) end
  if mt == FUNC or type(f) == "function" then
    local ok, r = pcall(function()
      if mt == FUNC then return f.fn(args, kwargs, line) end
      return M.from_lua(f(unpack(args)))
    end)
    if ok then return r end
    builtin_failed(f.what or "the function", line, r, nil, args)
  end
  fail(line, "%s is not callable", kind(f))
end

local function getattr(obj, name, line)
  local k = kind(obj)
  if k == "undefined" then fail(line, "'%s' is undefined (attribute '%s' of an undefined value)", obj == UNDEF and "value" or "value", tostring(name)) end
  if k == "namespace" then
    local v = obj.d.map[name]
    if v == nil then return UNDEF end
    return v
  end
  local m = methods[k] and methods[k][name]
  if m then
    return setmetatable({ fn = function(args, kwargs, l) return m(obj, args, kwargs, l or line) end,
      what = ("method '%s' of %s"):format(name, k) }, FUNC)
  end
  if k == "dict" then
    local v = obj.map[name]
    if v == nil then return UNDEF end
    return v
  end
  if k == "list" and type(name) == "number" then
    local i = index_of(obj.n, name, line)
    return i and obj[i] or UNDEF
  end
  return UNDEF
end

local function getitem(obj, key, line)
  local k = kind(obj)
  if k == "undefined" then fail(line, "subscript of an undefined value") end
  if k == "dict" then
    local v = obj.map[key]
    if v == nil then
      local nk = num(key)
      if nk ~= nil and kind(key) == "float" then v = obj.map[nk] end
    end
    if v ~= nil then return v end
    if type(key) == "string" and methods.dict[key] then return getattr(obj, key, line) end
    return UNDEF
  end
  if k == "namespace" then return getattr(obj, key, line) end
  if k == "list" or k == "str" then
    local n = num(key)
    if n == nil or kind(key) == "float" then
      if type(key) == "string" then return getattr(obj, key, line) end
      fail(line, "%s indices must be integers, not %s", k, kind(key))
    end
    if k == "list" then
      local i = index_of(obj.n, n, line)
      return i and obj[i] or UNDEF
    end
    local cps = codepoints(obj)
    local i = index_of(#cps, n, line)
    return i and cps[i] or UNDEF
  end
  fail(line, "cannot subscript a %s", k)
end

local function arith(op, a, b, line)
  local na, fa = num(a)
  local nb, fb = num(b)
  if kind(a) == "bool" or kind(b) == "bool" then
    if na == nil or nb == nil then na = nil end
  end
  if na ~= nil and nb ~= nil then
    local isf = fa or fb
    if op == "+" then return make_num(na + nb, isf) end
    if op == "-" then return make_num(na - nb, isf) end
    if op == "*" then return make_num(na * nb, isf) end
    if op == "/" then
      if nb == 0 then fail(line, "division by zero") end
      return float(na / nb)
    end
    if op == "//" then
      if nb == 0 then fail(line, "integer division by zero") end
      return make_num(math.floor(na / nb), isf)
    end
    if op == "%" then
      if nb == 0 then fail(line, "modulo by zero") end
      return make_num(na - math.floor(na / nb) * nb, isf)
    end
    if op == "**" then return make_num(na ^ nb, isf or nb < 0) end
  end
  local ka, kb = kind(a), kind(b)
  if ka == "undefined" or kb == "undefined" then fail(line, "'%s' with an undefined value", op) end
  if op == "+" and ka == "str" and kb == "str" then sized(#a + #b, line); return a .. b end
  if op == "+" and ka == "list" and kb == "list" then
    tick(math.floor((a.n + b.n) / 16))
    local out = {}
    for i = 1, a.n do out[i] = a[i] end
    for i = 1, b.n do out[a.n + i] = b[i] end
    return list(out, a.n + b.n)
  end
  if op == "*" and ka == "int" and kb == "str" then a, b, ka, kb = b, a, kb, ka end
  if op == "*" and ka == "str" and kb == "int" then
    if b <= 0 then return "" end
    sized(#a * b, line)
    return a:rep(b)
  end
  if op == "%" and ka == "str" then fail(line, "string formatting with '%%' is not supported") end
  fail(line, "unsupported operand types for %s: %s and %s", op, ka, kb)
end

local function assign(sc, targets, value, line)
  if #targets == 1 then
    local t = targets[1]
    if type(t) == "table" then
      local ns = sc:get(t.ns)
      if kind(ns) ~= "namespace" then fail(line, "cannot assign attribute '%s' of '%s': not a namespace", t.attr, t.ns) end
      dict_set(ns.d, t.attr, value)
    else sc:set(t, value) end
    return
  end
  local items = iterate(value, line)
  if #items ~= #targets then fail(line, "cannot unpack %d values into %d names", #items, #targets) end
  for j, t in ipairs(targets) do
    if type(t) == "table" then fail(line, "namespace attributes cannot be unpacked into") end
    sc:set(t, items[j])
  end
end

local eval_node
eval = function(e, sc, ctx)
  local d = ctx.edepth + 1
  if d > 3 * M.limits.depth then too_deep(ctx.line, "expressions") end
  ctx.edepth = d
  local v = eval_node(e, sc, ctx)
  ctx.edepth = d - 1
  return v
end

eval_node = function(e, sc, ctx)
  local k = e.k
  if k == "lit" then return e.v end
  if k == "name" then
    local v = sc:get(e.name)
    if v == nil then return UNDEF end
    return v
  end
  if k == "attr" then return getattr(eval(e.a, sc, ctx), e.name, ctx.line) end
  if k == "item" then return getitem(eval(e.a, sc, ctx), eval(e.key, sc, ctx), ctx.line) end
  if k == "slice" then
    local obj = eval(e.a, sc, ctx)
    local function part(x)
      if not x then return nil end
      local v = eval(x, sc, ctx)
      if v == NONE then return nil end
      if kind(v) ~= "int" then fail(ctx.line, "slice indices must be integers") end
      return v
    end
    local a, b, st = part(e.start), part(e.stop), part(e.step)
    local ko = kind(obj)
    if ko == "list" then
      local out = {}
      for _, i in ipairs(slice_range(obj.n, a, b, st, ctx.line)) do out[#out + 1] = obj[i] end
      return list(out)
    end
    if ko == "str" then
      local cps, out = codepoints(obj), {}
      for _, i in ipairs(slice_range(#cps, a, b, st, ctx.line)) do out[#out + 1] = cps[i] end
      return table.concat(out)
    end
    fail(ctx.line, "cannot slice a %s", ko)
  end
  if k == "tuple" then
    local out = {}
    for j, x in ipairs(e.items) do out[j] = eval(x, sc, ctx) end
    if e.tuple then return tuple(out, #e.items) end
    return list(out, #e.items)
  end
  if k == "dictlit" then
    local d = new_dict()
    for _, kv in ipairs(e.items) do dict_set(d, eval(kv[1], sc, ctx), eval(kv[2], sc, ctx)) end
    return d
  end
  if k == "cond" then
    if truthy(eval(e.cond, sc, ctx)) then return eval(e.a, sc, ctx) end
    if e.b then return eval(e.b, sc, ctx) end
    return UNDEF
  end
  if k == "or" then
    local a = eval(e.a, sc, ctx)
    if truthy(a) then return a end
    return eval(e.b, sc, ctx)
  end
  if k == "and" then
    local a = eval(e.a, sc, ctx)
    if not truthy(a) then return a end
    return eval(e.b, sc, ctx)
  end
  if k == "not" then return not truthy(eval(e.a, sc, ctx)) end
  if k == "in" then return contains(eval(e.b, sc, ctx), eval(e.a, sc, ctx), ctx.line) end
  if k == "cmp" then
    local a, b = eval(e.a, sc, ctx), eval(e.b, sc, ctx)
    local op = e.op
    if op == "==" then return equal(a, b) end
    if op == "!=" then return not equal(a, b) end
    if op == "<" then return less(a, b, ctx.line) end
    if op == ">" then return less(b, a, ctx.line) end
    if op == "<=" then return less(a, b, ctx.line) or equal(a, b) end
    if op == ">=" then return less(b, a, ctx.line) or equal(a, b) end
  end
  if k == "concat" then
    local a, b = str(eval(e.a, sc, ctx)), str(eval(e.b, sc, ctx))
    sized(#a + #b, ctx.line)
    return a .. b
  end
  if k == "arith" then return arith(e.op, eval(e.a, sc, ctx), eval(e.b, sc, ctx), ctx.line) end
  if k == "neg" then
    local v = eval(e.a, sc, ctx)
    local n, isf = num(v)
    if n == nil then fail(ctx.line, "bad operand type for unary -: %s", kind(v)) end
    return make_num(-n, isf)
  end
  if k == "filter" then
    local f = filters[e.name]
    if not f then fail(ctx.line, "filter '%s' is not supported", e.name) end
    local args, kwargs = {}, {}
    for j, x in ipairs(e.args) do args[j] = eval(x, sc, ctx) end
    for _, kv in ipairs(e.kwargs) do kwargs[kv[1]] = eval(kv[2], sc, ctx) end
    local v = eval(e.a, sc, ctx)
    local ok, r = pcall(f, v, args, kwargs, ctx.line, ctx)
    if ok then return r end
    builtin_failed("filter '" .. e.name .. "'", ctx.line, r, v, args)
  end
  if k == "test" then
    local t = tests[e.name]
    if not t then fail(ctx.line, "test '%s' is not supported", e.name) end
    local args = {}
    for j, x in ipairs(e.args) do args[j] = eval(x, sc, ctx) end
    local v = eval(e.a, sc, ctx)
    local ok, r = pcall(t, v, args, ctx.line, ctx)
    if not ok then builtin_failed("test '" .. e.name .. "'", ctx.line, r, v, args) end
    if e.negate then return not r end
    return r
  end
  if k == "call" then
    local f
    if e.f.k == "name" then
      f = sc:get(e.f.name)
      if f == nil then fail(ctx.line, "function '%s' is not defined", e.f.name) end
    else
      f = eval(e.f, sc, ctx)
      if f == UNDEF and e.f.k == "attr" then
        local obj = eval(e.f.a, sc, ctx)
        fail(ctx.line, "method '%s' of %s is not supported", tostring(e.f.name), kind(obj))
      end
    end
    local args, kwargs = {}, {}
    for j, x in ipairs(e.args) do args[j] = eval(x, sc, ctx) end
    for _, kv in ipairs(e.kwargs) do kwargs[kv[1]] = eval(kv[2], sc, ctx) end
    return call_value(f, args, kwargs, ctx.line, ctx)
  end
  fail(ctx.line, "expression '%s' is not supported", tostring(k))
end

local BREAK, CONTINUE = {}, {}

exec_body = function(nodes, sc, ctx, out)
  for _, node in ipairs(nodes) do
    local k = node.k
    if node.line then ctx.line = node.line end
    if k == "text" then
      ctx.produced = ctx.produced + #node.v
      if ctx.produced > M.limits.bytes then fail(ctx.line, "the rendering writes over %d bytes (remax.text.jinja.limits.bytes)", M.limits.bytes) end
      out[#out + 1] = node.v
    elseif k == "out" then
      local v = str(eval(node.e, sc, ctx))
      -- all the text written, in macros and set blocks too: a loop writing a long string
      -- stops at the limit, not when the output is joined
      ctx.produced = ctx.produced + #v
      if ctx.produced > M.limits.bytes then fail(ctx.line, "the rendering writes over %d bytes (remax.text.jinja.limits.bytes)", M.limits.bytes) end
      out[#out + 1] = v
    elseif k == "if" then
      local done = false
      for _, br in ipairs(node.branches) do
        ctx.line = node.line
        if truthy(eval(br.cond, sc, ctx)) then
          local sig = exec_body(br.body, sc, ctx, out)
          if sig then return sig end
          done = true
          break
        end
      end
      if not done and node.else_body then
        local sig = exec_body(node.else_body, sc, ctx, out)
        if sig then return sig end
      end
    elseif k == "for" then
      local items = iterate(eval(node.iter, sc, ctx), node.line)
      if node.filter then
        local kept = {}
        for _, item in ipairs(items) do
          tick()
          local fs = scope(sc)
          assign(fs, node.targets, item, node.line)
          if truthy(eval(node.filter, fs, ctx)) then kept[#kept + 1] = item end
        end
        items = kept
      end
      local n = #items
      if n == 0 then
        if node.else_body then
          local sig = exec_body(node.else_body, sc, ctx, out)
          if sig then return sig end
        end
      else
        for j, item in ipairs(items) do
          tick()
          local ls = scope(sc)
          local loop = new_dict()
          dict_set(loop, "index", j)
          dict_set(loop, "index0", j - 1)
          dict_set(loop, "revindex", n - j + 1)
          dict_set(loop, "revindex0", n - j)
          dict_set(loop, "first", j == 1)
          dict_set(loop, "last", j == n)
          dict_set(loop, "length", n)
          dict_set(loop, "depth", 1)
          dict_set(loop, "depth0", 0)
          if j > 1 then dict_set(loop, "previtem", items[j - 1]) end
          if j < n then dict_set(loop, "nextitem", items[j + 1]) end
          dict_set(loop, "cycle", setmetatable({ fn = function(args)
            if #args == 0 then fail(node.line, "loop.cycle needs at least one value") end
            return args[(j - 1) % #args + 1]
          end }, FUNC))
          ls:set("loop", loop)
          assign(ls, node.targets, item, node.line)
          local sig = exec_body(node.body, ls, ctx, out)
          if sig == BREAK then break end
          if sig and sig ~= CONTINUE then return sig end
        end
      end
    elseif k == "set" then
      assign(sc, node.targets, eval(node.e, sc, ctx), node.line)
    elseif k == "setblock" then
      local buf = {}
      exec_body(node.body, scope(sc), ctx, buf)
      local v = joined(buf, nil, node.line)
      for _, fname in ipairs(node.filters) do
        local f = filters[fname]
        if not f then fail(node.line, "filter '%s' is not supported", fname) end
        local ok, r = pcall(f, v, {}, {}, node.line, ctx)
        if not ok then builtin_failed("filter '" .. fname .. "'", node.line, r, v, {}) end
        v = r
      end
      assign(sc, { node.target }, v, node.line)
    elseif k == "macro" then
      local defining = sc
      local m = setmetatable({}, MACRO)
      m.call = function(args, kwargs, line)
        tick()
        if ctx.depth >= M.limits.depth then too_deep(line, "macro calls") end
        ctx.depth = ctx.depth + 1
        local ms = scope(defining)
        for j, pdef in ipairs(node.params) do
          local v = args[j]
          if v == nil then v = kwargs[pdef[1]] end
          if v == nil then v = pdef[2] and eval(pdef[2], ms, ctx) or UNDEF end
          ms:set(pdef[1], v)
        end
        if #args > #node.params then fail(line, "macro '%s' takes %d arguments, got %d", node.name, #node.params, #args) end
        if ctx.caller then ms:set("caller", ctx.caller) end
        local buf = {}
        local saved = ctx.line
        exec_body(node.body, ms, ctx, buf)
        ctx.line = saved
        ctx.depth = ctx.depth - 1
        return joined(buf, nil, line)
      end
      sc:set(node.name, m)
    elseif k == "callblock" then
      local caller_scope = sc
      local saved = ctx.caller
      ctx.caller = setmetatable({ fn = function()
        tick()
        if ctx.depth >= M.limits.depth then too_deep(node.line, "macro calls") end
        ctx.depth = ctx.depth + 1
        local buf = {}
        exec_body(node.body, scope(caller_scope), ctx, buf)
        ctx.depth = ctx.depth - 1
        return joined(buf, nil, node.line)
      end, what = "caller()" }, FUNC)
      out[#out + 1] = str(eval(node.e, sc, ctx))
      ctx.caller = saved
    elseif k == "filterblock" then
      local buf = {}
      exec_body(node.body, scope(sc), ctx, buf)
      local f = filters[node.name]
      if not f then fail(node.line, "filter '%s' is not supported", node.name) end
      local args, kwargs = {}, {}
      for j, x in ipairs(node.args) do args[j] = eval(x, sc, ctx) end
      for _, kv in ipairs(node.kwargs) do kwargs[kv[1]] = eval(kv[2], sc, ctx) end
      local v = joined(buf, nil, node.line)
      local ok, r = pcall(f, v, args, kwargs, node.line, ctx)
      if not ok then builtin_failed("filter '" .. node.name .. "'", node.line, r, v, args) end
      out[#out + 1] = str(r)
    elseif k == "group" then
      local sig = exec_body(node.body, sc, ctx, out)
      if sig then return sig end
    elseif k == "break" then return BREAK
    elseif k == "continue" then return CONTINUE
    end
  end
  return nil
end

---------------------------------------------------------------------------- filters

local function need_str(v, name, line)
  if kind(v) ~= "str" then
    if kind(v) == "undefined" then return "" end
    return str(v)
  end
  return v
end

local function attr_path(obj, path, line)
  if kind(path) == "int" then return getitem(obj, path, line) end
  for part in tostring(path):gmatch("[^.]+") do
    local n = tonumber(part)
    obj = n and getitem(obj, n, line) or getitem(obj, part, line)
  end
  return obj
end

local function run_test(name, v, args, line, ctx)
  local t = tests[name]
  if not t then fail(line, "test '%s' is not supported", tostring(name)) end
  return t(v, args, line, ctx)
end

filters.tojson = function(v, args, kwargs, line)
  local indent = kw(kwargs, "indent", args[1])
  if indent == NONE then indent = nil end
  if indent ~= nil and kind(indent) ~= "int" then fail(line, "tojson: indent must be an integer") end
  local seps = kw(kwargs, "separators", nil)
  local item_sep, key_sep = indent and "," or ", ", ": "
  if seps and seps ~= NONE then item_sep, key_sep = seps[1], seps[2] end
  local sort_keys = truthy(kw(kwargs, "sort_keys", false))
  if kwargs.ensure_ascii ~= nil and truthy(kwargs.ensure_ascii) then fail(line, "tojson: ensure_ascii = true is not supported") end
  return tojson(v, indent, item_sep, key_sep, sort_keys, line, 0)
end
filters.trim = function(v, args, kwargs) return py_strip(need_str(v), kw(kwargs, "chars", args[1]), true, true) end
filters.length = function(v, _, _, line) return length(v, line) end
filters.count = filters.length
filters.string = function(v) return str(v) end
filters.safe = function(v) return v end
filters.lower = function(v) return need_str(v):lower() end
filters.upper = function(v) return need_str(v):upper() end
filters.capitalize = function(v)
  local s = need_str(v)
  return s:sub(1, 1):upper() .. s:sub(2):lower()
end
filters.title = function(v)
  return (need_str(v):lower():gsub("(%w)(%w*)", function(a, b) return a:upper() .. b end))
end
filters.replace = function(v, args, kwargs)
  return py_replace(need_str(v), str(args[1]), str(args[2]), kw(kwargs, "count", args[3]))
end
filters.first = function(v, _, _, line)
  local items = iterate(v, line)
  return items[1] == nil and UNDEF or items[1]
end
filters.last = function(v, _, _, line)
  local items = iterate(v, line)
  return items[#items] == nil and UNDEF or items[#items]
end
filters.list = function(v, _, _, line) return list(iterate(v, line)) end
filters.reverse = function(v, _, _, line)
  if kind(v) == "str" then
    local cps, out = codepoints(v), {}
    for j = #cps, 1, -1 do out[#out + 1] = cps[j] end
    return table.concat(out)
  end
  local items, out = iterate(v, line), {}
  for j = #items, 1, -1 do out[#out + 1] = items[j] end
  return list(out)
end
filters.join = function(v, args, kwargs, line)
  local sep = kw(kwargs, "d", args[1]) or ""
  local attribute = kw(kwargs, "attribute", args[2])
  local parts = {}
  for j, item in ipairs(iterate(v, line)) do
    if attribute and attribute ~= NONE then item = attr_path(item, attribute, line) end
    parts[j] = str(item)
  end
  return joined(parts, str(sep), line)
end
filters.default = function(v, args, kwargs)
  local dv = kw(kwargs, "default_value", args[1])
  if dv == nil then dv = "" end
  local boolean = truthy(kw(kwargs, "boolean", args[2] or false))
  if v == UNDEF or v == nil or (boolean and not truthy(v)) then return dv end
  return v
end
filters.d = filters.default
filters.items = function(v, _, _, line)
  local k = kind(v)
  if k == "undefined" then return list({}) end
  if k ~= "dict" then fail(line, "items: expected a mapping, got %s", k) end
  local out = {}
  for j, key in ipairs(v.keys) do out[j] = tuple({ key, v.map[key] }, 2) end
  return list(out)
end
filters.dictsort = function(v, args, kwargs, line)
  local items = filters.items(v, {}, {}, line)
  local by_value = kw(kwargs, "by", args[3]) == "value"
  local rev = truthy(kw(kwargs, "reverse", args[4] or false))
  local arr = {}
  for j = 1, items.n do arr[j] = items[j] end
  table.sort(arr, function(a, b)
    local x, y = by_value and a[2] or a[1], by_value and b[2] or b[1]
    if rev then return less(y, x, line) end
    return less(x, y, line)
  end)
  return list(arr)
end
filters.int = function(v, args)
  local n = num(v)
  if n then return n >= 0 and math.floor(n) or -math.floor(-n) end
  local x = kind(v) == "str" and tonumber((py_strip(v, nil, true, true)))
  if x then return x >= 0 and math.floor(x) or -math.floor(-x) end
  return args[1] or 0
end
filters.float = function(v, args)
  local n = num(v)
  if n then return float(n) end
  local x = kind(v) == "str" and tonumber((py_strip(v, nil, true, true)))
  if x then return float(x) end
  return args[1] or float(0)
end
filters.abs = function(v, _, _, line)
  local n, isf = num(v)
  if n == nil then fail(line, "abs: expected a number") end
  return make_num(math.abs(n), isf)
end
filters.round = function(v, args, kwargs, line)
  local n = num(v)
  if n == nil then fail(line, "round: expected a number") end
  local prec = kw(kwargs, "precision", args[1]) or 0
  local method = kw(kwargs, "method", args[2]) or "common"
  local m = 10 ^ prec
  local x = n * m
  if method == "common" then x = x >= 0 and math.floor(x + 0.5) or -math.floor(-x + 0.5)
  elseif method == "ceil" then x = math.ceil(x)
  elseif method == "floor" then x = math.floor(x)
  else fail(line, "round: method '%s' is not supported", tostring(method)) end
  return float(x / m)
end
filters.sum = function(v, args, kwargs, line)
  local attribute = kw(kwargs, "attribute", args[1])
  local total = kw(kwargs, "start", args[2]) or 0
  for _, item in ipairs(iterate(v, line)) do
    if attribute and attribute ~= NONE then item = attr_path(item, attribute, line) end
    total = arith("+", total, item, line)
  end
  return total
end
local function minmax(v, args, kwargs, line, want_less)
  local items = iterate(v, line)
  local attribute = kw(kwargs, "attribute", nil)
  local best, bestkey
  for _, item in ipairs(items) do
    local key = attribute and attr_path(item, attribute, line) or item
    if kind(key) == "str" and not truthy(kw(kwargs, "case_sensitive", false)) then key = key:lower() end
    if best == nil or (want_less and less(key, bestkey, line)) or (not want_less and less(bestkey, key, line)) then
      best, bestkey = item, key
    end
  end
  return best == nil and UNDEF or best
end
filters.min = function(v, args, kwargs, line) return minmax(v, args, kwargs, line, true) end
filters.max = function(v, args, kwargs, line) return minmax(v, args, kwargs, line, false) end
filters.unique = function(v, args, kwargs, line)
  local out = {}
  local attribute = kw(kwargs, "attribute", nil)
  for _, item in ipairs(iterate(v, line)) do
    tick(math.floor(#out / 16))
    local key = attribute and attr_path(item, attribute, line) or item
    if kind(key) == "str" and not truthy(kw(kwargs, "case_sensitive", false)) then key = key:lower() end
    local seen = false
    for _, o in ipairs(out) do
      local ok = attribute and attr_path(o, attribute, line) or o
      if kind(ok) == "str" and not truthy(kw(kwargs, "case_sensitive", false)) then ok = ok:lower() end
      if equal(ok, key) then seen = true; break end
    end
    if not seen then out[#out + 1] = item end
  end
  return list(out)
end
filters.sort = function(v, args, kwargs, line)
  local items = iterate(v, line)
  local rev = truthy(kw(kwargs, "reverse", args[1] or false))
  local cs = truthy(kw(kwargs, "case_sensitive", args[2] or false))
  local attribute = kw(kwargs, "attribute", args[3])
  local keyed = {}
  for j, item in ipairs(items) do
    local key = (attribute and attribute ~= NONE) and attr_path(item, attribute, line) or item
    if kind(key) == "str" and not cs then key = key:lower() end
    keyed[j] = { key = key, item = item, j = j }
  end
  table.sort(keyed, function(a, b)
    if rev then
      if less(b.key, a.key, line) then return true end
      if less(a.key, b.key, line) then return false end
    else
      if less(a.key, b.key, line) then return true end
      if less(b.key, a.key, line) then return false end
    end
    return a.j < b.j
  end)
  local out = {}
  for j, x in ipairs(keyed) do out[j] = x.item end
  return list(out)
end
filters.map = function(v, args, kwargs, line, ctx)
  local out = {}
  local attribute = kwargs.attribute
  for j, item in ipairs(iterate(v, line)) do
    if attribute then
      local x = attr_path(item, attribute, line)
      if x == UNDEF and kwargs.default ~= nil then x = kwargs.default end
      out[j] = x
    else
      local fname = args[1]
      local f = filters[fname]
      if not f then fail(line, "map: filter '%s' is not supported", tostring(fname)) end
      local rest = {}
      for a = 2, #args do rest[a - 1] = args[a] end
      out[j] = f(item, rest, {}, line, ctx)
    end
  end
  return list(out)
end
local function select_items(v, args, line, ctx, by_attr, keep)
  local out = {}
  for _, item in ipairs(iterate(v, line)) do
    local subject, rest = item, {}
    local tname
    if by_attr then
      subject = attr_path(item, args[1], line)
      tname = args[2]
      for a = 3, #args do rest[#rest + 1] = args[a] end
    else
      tname = args[1]
      for a = 2, #args do rest[#rest + 1] = args[a] end
    end
    local ok
    if tname == nil then ok = truthy(subject) else ok = run_test(tname, subject, rest, line, ctx) end
    if ok == keep then out[#out + 1] = item end
  end
  return list(out)
end
filters.selectattr = function(v, args, _, line, ctx) return select_items(v, args, line, ctx, true, true) end
filters.rejectattr = function(v, args, _, line, ctx) return select_items(v, args, line, ctx, true, false) end
filters.select = function(v, args, _, line, ctx) return select_items(v, args, line, ctx, false, true) end
filters.reject = function(v, args, _, line, ctx) return select_items(v, args, line, ctx, false, false) end
filters.indent = function(v, args, kwargs, line)
  local width = kw(kwargs, "width", args[1]) or 4
  local first = truthy(kw(kwargs, "first", args[2] or false))
  local blank = truthy(kw(kwargs, "blank", args[3] or false))
  if type(width) ~= "string" and kind(width) ~= "int" then fail(line, "indent: width must be an integer or a string") end
  if type(width) ~= "string" then sized(width, line) end
  local pad = type(width) == "string" and width or (" "):rep(width)
  local s = need_str(v)
  local lines_ = {}
  for l in (s .. "\n"):gmatch("(.-)\n") do lines_[#lines_ + 1] = l end
  tick(math.floor(#lines_ / 16))
  sized(#s + #pad * (#lines_ + 1), line)
  for j = 2, #lines_ do
    if blank or lines_[j] ~= "" then lines_[j] = pad .. lines_[j] end
  end
  local out = table.concat(lines_, "\n")
  if first and (blank or s ~= "") then out = pad .. out end
  return out
end
filters.wordcount = function(v)
  local n = 0
  for _ in need_str(v):gmatch("%w+") do n = n + 1 end
  return n
end
filters.batch = function(v, args, _, line)
  local size, fill = args[1], args[2]
  if kind(size) ~= "int" or size < 1 then fail(line, "batch: the size must be a positive integer") end
  local out, cur = {}, {}
  for _, item in ipairs(iterate(v, line)) do
    cur[#cur + 1] = item
    if #cur == size then out[#out + 1] = list(cur); cur = {} end
  end
  if #cur > 0 then
    if fill ~= nil then
      tick(size - #cur)
      while #cur < size do cur[#cur + 1] = fill end
    end
    out[#out + 1] = list(cur)
  end
  return list(out)
end

---------------------------------------------------------------------------- tests

tests.defined = function(v) return v ~= UNDEF and v ~= nil end
tests.undefined = function(v) return v == UNDEF or v == nil end
tests.none = function(v) return v == NONE end
tests.string = function(v) return kind(v) == "str" end
tests.number = function(v) local k = kind(v); return k == "int" or k == "float" end
tests.integer = function(v) return kind(v) == "int" end
tests.float = function(v) return kind(v) == "float" end
tests.boolean = function(v) return kind(v) == "bool" end
tests["true"] = function(v) return v == true end
tests["false"] = function(v) return v == false end
tests.mapping = function(v) local k = kind(v); return k == "dict" end
tests.iterable = function(v) local k = kind(v); return k == "list" or k == "dict" or k == "str" end
tests.sequence = function(v) local k = kind(v); return k == "list" or k == "dict" or k == "str" end
tests.callable = function(v) return kind(v) == "callable" end
tests.equalto = function(v, args) return equal(v, args[1]) end
tests.eq = tests.equalto
tests["=="] = tests.equalto
tests.ne = function(v, args) return not equal(v, args[1]) end
tests["!="] = tests.ne
tests.lt = function(v, args, line) return less(v, args[1], line) end
tests.lessthan = tests.lt
tests.gt = function(v, args, line) return less(args[1], v, line) end
tests.greaterthan = tests.gt
tests.le = function(v, args, line) return less(v, args[1], line) or equal(v, args[1]) end
tests.ge = function(v, args, line) return less(args[1], v, line) or equal(v, args[1]) end
tests["in"] = function(v, args, line) return contains(args[1], v, line) end
tests.odd = function(v) return kind(v) == "int" and v % 2 == 1 end
tests.even = function(v) return kind(v) == "int" and v % 2 == 0 end
tests.divisibleby = function(v, args) return num(v) % num(args[1]) == 0 end
tests.lower = function(v) return kind(v) == "str" and v:lower() == v end
tests.upper = function(v) return kind(v) == "str" and v:upper() == v end
tests.sameas = function(v, args) return rawequal(v, args[1]) end

---------------------------------------------------------------------------- methods

local function startswith(s, prefixes, line, ends)
  local options = kind(prefixes) == "list" and iterate(prefixes, line) or { prefixes }
  for _, p in ipairs(options) do
    if kind(p) ~= "str" then fail(line, "%s: expected a string or a tuple of strings", ends and "endswith" or "startswith") end
    if ends then
      if p == "" or s:sub(-#p) == p then return true end
    elseif s:sub(1, #p) == p then return true end
  end
  return false
end

methods.str = {
  strip = function(s, a) return py_strip(s, a[1], true, true) end,
  lstrip = function(s, a) return py_strip(s, a[1], true, false) end,
  rstrip = function(s, a) return py_strip(s, a[1], false, true) end,
  split = function(s, a, k) return py_split(s, kw(k, "sep", a[1]), kw(k, "maxsplit", a[2])) end,
  rsplit = function(s, a, k) return py_rsplit(s, kw(k, "sep", a[1]), kw(k, "maxsplit", a[2])) end,
  startswith = function(s, a, _, line) return startswith(s, a[1], line, false) end,
  endswith = function(s, a, _, line) return startswith(s, a[1], line, true) end,
  upper = function(s) return s:upper() end,
  lower = function(s) return s:lower() end,
  title = function(s) return filters.title(s) end,
  capitalize = function(s) return filters.capitalize(s) end,
  replace = function(s, a) return py_replace(s, str(a[1]), str(a[2]), a[3]) end,
  find = function(s, a)
    local i = find_plain(s, a[1], 1)
    return i and ulen(s:sub(1, i - 1)) or -1
  end,
  count = function(s, a)
    local n, start = 0, 1
    if a[1] == "" then return ulen(s) + 1 end
    while true do
      local i, j = find_plain(s, a[1], start)
      if not i then return n end
      n, start = n + 1, j + 1
    end
  end,
  join = function(s, a, _, line)
    local parts = {}
    for j, x in ipairs(iterate(a[1], line)) do
      if kind(x) ~= "str" then fail(line, "join: sequence item %d is a %s, expected str", j - 1, kind(x)) end
      parts[j] = x
    end
    return joined(parts, s, line)
  end,
  splitlines = function(s)
    local out = {}
    for l in (s .. "\n"):gmatch("(.-)\r?\n") do out[#out + 1] = l end
    if s:sub(-1) == "\n" then out[#out] = nil end
    return list(out)
  end,
  isdigit = function(s) return s ~= "" and s:match("^%d+$") ~= nil end,
  isalpha = function(s) return s ~= "" and s:match("^%a+$") ~= nil end,
  isspace = function(s)
    if s == "" then return false end
    for _, c in ipairs(codepoints(s)) do if not SPACE[c] then return false end end
    return true
  end,
}
methods.dict = {
  items = function(d) return filters.items(d, {}, {}) end,
  keys = function(d) local out = {}; for j, k in ipairs(d.keys) do out[j] = k end; return list(out) end,
  values = function(d) local out = {}; for j, k in ipairs(d.keys) do out[j] = d.map[k] end; return list(out) end,
  get = function(d, a)
    local v = d.map[a[1]]
    if v == nil then return a[2] == nil and NONE or a[2] end
    return v
  end,
}
methods.list = {
  index = function(l, a, _, line)
    for j = 1, l.n do if equal(l[j], a[1]) then return j - 1 end end
    fail(line, "%s is not in list", repr(a[1]))
  end,
  count = function(l, a)
    local n = 0
    for j = 1, l.n do if equal(l[j], a[1]) then n = n + 1 end end
    return n
  end,
}

---------------------------------------------------------------------------- globals and the API

local function globals(ctx)
  local g = {}
  g.raise_exception = setmetatable({ fn = function(args, _, line)
    error({ jinja = true, raised = true, line = line, msg = str(args[1] or "") }, 0)
  end }, FUNC)
  g.namespace = setmetatable({ fn = function(args, kwargs)
    local d = new_dict()
    if args[1] and kind(args[1]) == "dict" then
      for _, k in ipairs(args[1].keys) do dict_set(d, k, args[1].map[k]) end
    end
    local names = {}
    for k in pairs(kwargs) do names[#names + 1] = k end
    table.sort(names)
    for _, k in ipairs(names) do dict_set(d, k, kwargs[k]) end
    return setmetatable({ d = d }, NS)
  end }, FUNC)
  g.strftime_now = setmetatable({ fn = function(args) return os.date(str(args[1])) end }, FUNC)
  g.range = setmetatable({ fn = function(args, _, line)
    local a, b, st = args[1], args[2], args[3] or 1
    if b == nil then a, b = 0, a end
    for _, x in ipairs({ a, b, st }) do
      if kind(x) ~= "int" and kind(x) ~= "bool" then fail(line, "range: expected integers, got a %s", kind(x)) end
    end
    a, b, st = num(a), num(b), num(st)
    if st == 0 then fail(line, "range: step cannot be zero") end
    if (b - a) / st > M.limits.range then
      fail(line, "range: over %d items (the limit of jinja2's sandbox, remax.text.jinja.limits.range)", M.limits.range)
    end
    local out = {}
    local i = a
    if st > 0 then while i < b do out[#out + 1] = i; i = i + st end
    else while i > b do out[#out + 1] = i; i = i + st end end
    return list(out)
  end, what = "range()" }, FUNC)
  g.dict = setmetatable({ fn = function(args, kwargs)
    local d = new_dict()
    local names = {}
    for k in pairs(kwargs) do names[#names + 1] = k end
    table.sort(names)
    for _, k in ipairs(names) do dict_set(d, k, kwargs[k]) end
    return d
  end }, FUNC)
  return g
end

local Template = {}
Template.__index = Template

local function located(name, err)
  if type(err) == "table" and err.jinja then
    local where = err.line and (" line %d"):format(err.line) or ""
    if err.raised then return ("%s%s: raise_exception: %s"):format(name, where, err.msg) end
    return ("%s%s: %s"):format(name, where, err.msg)
  end
  return ("%s: internal error: %s"):format(name, tostring(err))   -- a fault of the interpreter itself
end

-- Parses a template; errors name `name` and the line.
function M.compile(source, name)
  name = name or "template"
  if type(source) ~= "string" then error(("%s: template is a %s, expected a string"):format(name, type(source)), 2) end
  if #source > M.limits.bytes then
    error(("%s: the template is %d bytes, over the limit of %d (remax.text.jinja.limits.bytes)"):format(name, #source, M.limits.bytes), 2)
  end
  local ok, nodes = pcall(function() return parse(lex(source)) end)
  if not ok then error(located(name, nodes), 0) end
  return setmetatable({ nodes = nodes, name = name, source = source }, Template)
end

-- Renders with vars (a Lua table: values converted by from_lua; nil-valued keys are undefined).
-- Within M.limits: a rendering past one fails naming it.
function Template:render(vars)
  local ctx = { line = 1, depth = 0, edepth = 0, produced = 0 }
  local outer = budget
  budget = { steps = 0, ctx = ctx, mem0 = collectgarbage("count"), next_mem = 1024 }
  local ok, text = pcall(function()
    local root = scope(nil)
    for k, v in pairs(globals(ctx)) do root:set(k, v) end
    local top = scope(root)
    for k, v in pairs(vars or {}) do top:set(k, M.from_lua(v)) end
    local out = {}
    exec_body(self.nodes, scope(top), ctx, out)
    return joined(out)
  end)
  budget = outer
  if not ok then error(located(self.name, text), 0) end
  return text
end

function M.render(source, vars, name) return M.compile(source, name):render(vars) end

return M
