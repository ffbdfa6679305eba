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
--   function  the recipe's parser: function(text) -> list of {name=, arguments=} (or {error=})
-- A call that cannot be read is {error = "why", raw = the text} (the episode then gets that
-- error as the tool's result); no call at all is an empty list (the episode's answer).
local json = require("remax.formats.json")

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

-- The calls in text under format (a name in M.formats or a function).
function M.parse(text, format)
  local fn = type(format) == "function" and format or M.formats[format or "qwen"]
  if not fn then
    error(("tool_call_format = '%s' is not one of qwen, llama3 (or give a function(text) -> calls)"):format(tostring(format)), 2)
  end
  local ok, calls = pcall(fn, text)
  if not ok then return { { error = "the tool call parser failed: " .. tostring(calls), raw = text } } end
  if type(calls) ~= "table" then
    return { { error = "the tool call parser returned a " .. type(calls) .. ", expected a list of calls", raw = text } }
  end
  return calls
end

-- The template's name -> the call format of its models.
function M.format_for(template_name)
  if template_name == "llama3" then return "llama3" end
  return "qwen"
end

return M
