-- remax.step.tool_calls: the tool calls in an assistant's text, in the formats of the chat
-- templates remax supports, and a recipe's own parser for anything else.
--
--   local calls = tool_calls.parse(text, "qwen")   -- { {name=, arguments={...}} or {error=, raw=}, ... }
--
-- Formats:
--   "qwen"    Qwen2.5 / Qwen3: <tool_call>{"name": ..., "arguments": {...}}</tool_call>, any number
--   "llama3"  Llama 3.1: the whole message one JSON object {"name": ..., "parameters": {...}}
--             (or "arguments"), or <|python_tag|> then name.call(key="value", ...) (a built-in
--             tool) or code (the code_interpreter tool, arguments {code = ...})
--   function  the recipe's parser: function(text) -> list of {name=, arguments=} (or {error=});
--             arguments may be JSON text; what it returns is checked (M.check_call)
-- A call that cannot be read is {error = "why", raw = the text} (the episode then gets that
-- error as the tool's result); no call at all is an empty list (the episode's answer).
local json = require("remax.formats.json")
local guard = require("remax.step.guard")

local M = {}

local function decode_call(raw, args_keys)
  local ok, v = pcall(json.decode, raw, "tool call")
  if not ok or type(v) ~= "table" then
    return { error = "malformed tool call: not a JSON object", raw = raw }
  end
  if type(v.name) ~= "string" or v.name == "" then
    return { error = "malformed tool call: no \"name\" string", raw = raw }
  end
  local args
  for _, k in ipairs(args_keys) do if v[k] ~= nil then args = v[k] break end end
  if type(args) == "string" then   -- some models write the arguments as a JSON string
    local ok2, a = pcall(json.decode, args, "tool call arguments")
    args = ok2 and a or args
  end
  if args == nil then args = {} end
  if type(args) ~= "table" then
    return { error = ("malformed tool call to '%s': arguments must be a JSON object"):format(v.name), raw = raw }
  end
  return { name = v.name, arguments = args }
end

function M.qwen(text)
  local calls = {}
  local at = 1
  while true do
    local s, e = text:find("<tool_call>", at, true)
    if not s then break end
    local cs, ce = text:find("</tool_call>", e + 1, true)
    if not cs then   -- an open call with no close: malformed
      calls[#calls + 1] = { error = "malformed tool call: <tool_call> without </tool_call>", raw = text:sub(s) }
      break
    end
    local raw = text:sub(e + 1, cs - 1):gsub("^%s+", ""):gsub("%s+$", "")
    calls[#calls + 1] = decode_call(raw, { "arguments", "parameters" })
    at = ce + 1
  end
  return calls
end

-- key="value", key=3 pairs of a python call's arguments
local function python_args(s)
  local args = {}
  local rest = s
  while true do
    rest = rest:gsub("^[%s,]+", "")
    if rest == "" then break end
    local k, r = rest:match("^([%a_][%w_]*)%s*=%s*(.*)$")
    if not k then return nil end
    local q = r:sub(1, 1)
    if q == '"' or q == "'" then
      local close = r:find(q, 2, true)
      if not close then return nil end
      args[k] = r:sub(2, close - 1)
      rest = r:sub(close + 1)
    else
      local v, r2 = r:match("^([^,]+)(.*)$")
      if not v then return nil end
      v = v:gsub("%s+$", "")
      args[k] = tonumber(v) or (v == "True" and true) or (v == "False" and false) or v
      rest = r2
    end
  end
  return args
end

function M.llama3(text)
  local t = text:gsub("<|eot_id|>", ""):gsub("<|eom_id|>", "")
  local tag = t:find("<|python_tag|>", 1, true)
  if tag then
    local body = t:sub(tag + #"<|python_tag|>"):gsub("^%s+", ""):gsub("%s+$", "")
    if body:sub(1, 1) == "{" then return { decode_call(body, { "parameters", "arguments" }) } end
    local name, inner = body:match("^([%a_][%w_]*)%.call%((.*)%)$")
    if name then
      local args = python_args(inner)
      if not args then return { { error = ("malformed tool call to '%s': cannot read its arguments"):format(name), raw = body } } end
      return { { name = name, arguments = args } }
    end
    return { { name = "code_interpreter", arguments = { code = body } } }
  end
  local body = t:gsub("^%s+", ""):gsub("%s+$", "")
  if body:sub(1, 1) == "{" and body:find('"name"', 1, true) then
    return { decode_call(body, { "parameters", "arguments" }) }
  end
  return {}
end

M.formats = { qwen = M.qwen, llama3 = M.llama3 }

-- One call as a recipe's parser gave it -> a call remax can use: {name = a non-empty string,
-- arguments = a table JSON can write} (arguments written as a JSON string are decoded, as the
-- built-in formats decode them; none is {}), or {error = text, raw =}. Anything else becomes
-- that call's error, which the episode gets as the tool's result.
function M.check_call(c, i, text)
  local function bad(why) return { error = ("the tool call parser's call %d %s"):format(i, why), raw = text } end
  if type(c) ~= "table" then
    return bad(("is a %s (%s); expected {name =, arguments =} or {error =}"):format(type(c), tostring(c)))
  end
  if c.error ~= nil then
    if type(c.error) ~= "string" then return bad(("has error = a %s; expected the error's text"):format(type(c.error))) end
    return { error = c.error, raw = type(c.raw) == "string" and c.raw or text }
  end
  if type(c.name) ~= "string" or c.name == "" then
    return bad(("has %s as its name; expected the tool's name (a non-empty string)"):format(
      c.name == nil and "nothing" or ("a " .. type(c.name))))
  end
  local args = c.arguments
  if type(args) == "string" then   -- written as JSON text, as the built-in formats read it
    local ok, v = pcall(json.decode, args, "tool call arguments")
    if not ok or type(v) ~= "table" then
      return { error = ("malformed tool call to '%s': its arguments are not a JSON object"):format(c.name), raw = text }
    end
    args = v
  end
  if args == nil then args = {} end
  if type(args) ~= "table" then
    return { error = ("malformed tool call to '%s': arguments must be a JSON object, got a %s"):format(c.name, type(args)),
      raw = text }
  end
  local ok, why = pcall(json.encode, args, { where = "arguments" })
  if not ok then
    return { error = ("malformed tool call to '%s': its arguments cannot be written as JSON: %s"):format(c.name,
      tostring(why)), raw = text }
  end
  return { name = c.name, arguments = args }
end

-- The calls in text under format (a name in M.formats or a function). A recipe's parser runs
-- under remax.step.guard (timeout: tool_timeout; Ctrl-C and SIGTERM stop it) and what it gives
-- back is checked (M.check_call): a parser that fails, loops or gives odd calls fails that turn's
-- call, never the run.
function M.parse(text, format, timeout)
  local fn = type(format) == "function" and format or M.formats[format or "qwen"]
  if not fn then
    error(("tool_call_format = '%s' is not one of qwen, llama3 (or give a function(text) -> calls)"):format(tostring(format)), 2)
  end
  if fn ~= format then return fn(text) end   -- remax's own formats
  local ok, calls = guard.call(fn, { limit = timeout, what = "the tool call parser" }, text)
  if not ok then
    if calls == guard.TIMEOUT then
      return { { error = ("the tool call parser took over tool_timeout = %g s"):format(timeout), raw = text } }
    end
    return { { error = "the tool call parser failed: " .. tostring(calls), raw = text } }
  end
  if calls == nil then return {} end
  if type(calls) ~= "table" then
    return { { error = "the tool call parser returned a " .. type(calls) .. ", expected a list of calls", raw = text } }
  end
  if calls.name ~= nil or calls.error ~= nil then calls = { calls } end   -- one call, not in a list
  local n = 0
  for k in pairs(calls) do
    if type(k) ~= "number" or k < 1 or k ~= math.floor(k) then
      return { { error = ("the tool call parser returned a table with the key %s; expected a list of calls"):format(
        tostring(k)), raw = text } }
    end
    n = math.max(n, k)
  end
  local out = {}
  for i = 1, n do out[i] = M.check_call(calls[i], i, text) end
  return out
end

-- The template's name -> the call format of its models.
function M.format_for(template_name)
  if template_name == "llama3" then return "llama3" end
  return "qwen"
end

return M
