-- remax.step.tool_calls: the tool calls in an assistant's text, in the formats of the chat
-- templates remax supports, and a recipe's own parser for anything else.
--
--   local calls = tool_calls.parse(text, "qwen")   -- { {name=, arguments={...}} or {error=, raw=}, ... }
--
-- Formats:
--   "qwen"    Qwen2.5 / Qwen3: <tool_call>{"name": ..., "arguments": {...}}</tool_call>, any number
--   "hermes"  NousResearch Hermes 2 Pro / 3: the same calls as "qwen" (an alias of it)
--   "qwen3_coder"  Qwen3-Coder / Qwen3.5: <tool_call>\n<function=NAME>\n<parameter=ARG>\nVALUE\n
--             </parameter>\n...</function>\n</tool_call> (or the <function=...> block alone); a
--             value is text, or what JSON reads when it is a number, object, array, true, false
--             or null, or True / False (the template's Python spelling); no schema here says a
--             parameter is a string (llama.cpp's parser reads JSON where the schema allows it);
--             text inside <think>...</think> is not read
--   "mistral" [TOOL_CALLS] then a JSON list of {"name", "arguments"} (Mistral Nemo, v3), or
--             [TOOL_CALLS]NAME[ARGS]{json} (Devstral, Ministral 3), or
--             [TOOL_CALLS]NAME[CALL_ID]ID[ARGS]{json} (Mistral Small 3.2), once per call; text
--             inside [THINK]...[/THINK] is not read
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

-- One decoded JSON call {name, arguments} (v) -> a call, or {error =, raw =}.
local function call_of(v, raw, args_keys)
  if type(v) ~= "table" or v[1] ~= nil then
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

local function decode_call(raw, args_keys)
  local ok, v = pcall(json.decode, raw, "tool call")
  if not ok then v = nil end
  return call_of(v, raw, args_keys)
end

local function trim(s) return (s:gsub("^%s+", ""):gsub("%s+$", "")) end

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

-- A parameter's text -> its value: JSON's when it reads as a number, object, array, true, false
-- or null; True and False (what the template's `| string` writes for a boolean) are booleans;
-- else the text itself.
local function xml_value(v)
  local t = trim(v)
  if t == "True" or t == "False" then return t == "True" end
  local number = t:match("^-?%d") and not t:match("^-?0%d") and t:match("^-?%d+%.?%d*[eE]?[-+]?%d*$")
  if number or t:match("^[%[{]") or t == "true" or t == "false" or t == "null" then
    local ok, x = pcall(json.decode, t, "parameter")
    if ok then return x end
  end
  return v
end

-- One <function=NAME>...</function> block at the start of s -> a call, and the rest of s.
local function xml_function(s)
  local name, body_at = s:match("^<function=([^>\n]*)>()")
  if not name then
    return { error = "malformed tool call: no <function=NAME> in <tool_call>", raw = s }
  end
  name = trim(name)
  local close, close_end = s:find("</function>", body_at, true)
  if not close then
    return { error = ("malformed tool call to '%s': <function=%s> without </function>"):format(name, name), raw = s }
  end
  if name == "" then return { error = "malformed tool call: <function=> without a name", raw = s:sub(1, close_end) } end
  local body, args, at = s:sub(body_at, close - 1), {}, 1
  while true do
    local ps, pe, arg = body:find("<parameter=([^>\n]*)>", at)
    if not ps then break end
    -- the value ends at </parameter>, or (not closed) at the next <parameter= or the end
    local vs = body:find("</parameter>", pe + 1, true)
    local nx = body:find("<parameter=", pe + 1, true)
    local stop = vs and (not nx or vs < nx) and vs or nx or #body + 1
    local v = body:sub(pe + 1, stop - 1):gsub("^\n", ""):gsub("\n$", "")
    args[trim(arg)] = xml_value(v)
    at = stop == vs and vs + #"</parameter>" or stop
  end
  return { name = name, arguments = args }, s:sub(close_end + 1)
end

function M.qwen3_coder(text)
  local calls, rest = {}, text:gsub("<think>.-</think>", "")   -- a call in the reasoning is not one
  while true do
    local tc = rest:find("<tool_call>", 1, true)
    local fn = rest:find("<function=", 1, true)
    if not tc and not fn then break end
    if tc and (not fn or tc < fn) then
      local body_at = tc + #"<tool_call>"
      local cs, ce = rest:find("</tool_call>", body_at, true)
      if not cs then
        calls[#calls + 1] = { error = "malformed tool call: <tool_call> without </tool_call>", raw = rest:sub(tc) }
        break
      end
      local body = trim(rest:sub(body_at, cs - 1))
      local call, after = xml_function(body)
      if call.error == nil and trim(after) ~= "" then
        call = { error = ("malformed tool call to '%s': text after </function>"):format(call.name), raw = body }
      end
      calls[#calls + 1] = call
      rest = rest:sub(ce + 1)
    else   -- a <function=...> block without <tool_call> around it (Qwen3-Coder sometimes leaves it out)
      local call, after = xml_function(rest:sub(fn))
      calls[#calls + 1] = call
      if not after then break end
      rest = after:gsub("^%s*</tool_call>", "")
    end
  end
  return calls
end

-- One call after [TOOL_CALLS]: NAME[ARGS]{json}, NAME[CALL_ID]ID[ARGS]{json}, or JSON (a list
-- of calls, or one).
local function mistral_segment(seg, calls)
  local raw = trim(seg:gsub("</s>%s*$", ""))
  local c = raw:sub(1, 1)
  if (c == "[" or c == "{") and not raw:find("^%[ARGS%]") and not raw:find("^%[CALL_ID%]") then
    local ok, v = pcall(json.decode, raw, "tool calls")
    if not ok or type(v) ~= "table" then
      calls[#calls + 1] = { error = "malformed tool call: [TOOL_CALLS] then text that is not JSON", raw = raw }
    elseif v[1] == nil and next(v) ~= nil then
      calls[#calls + 1] = call_of(v, raw, { "arguments", "parameters" })
    else
      for _, one in ipairs(v) do calls[#calls + 1] = call_of(one, raw, { "arguments", "parameters" }) end
    end
    return
  end
  local name, args = raw:match("^(.-)%[ARGS%](.*)$")
  if not name then
    calls[#calls + 1] = { error = "malformed tool call: [TOOL_CALLS] without [ARGS] or a JSON list", raw = raw }
    return
  end
  name = trim(name:gsub("%[CALL_ID%].*$", ""))
  if name == "" then
    calls[#calls + 1] = { error = "malformed tool call: no name before [ARGS]", raw = raw }
    return
  end
  local ok, v = pcall(json.decode, trim(args), "tool call arguments")
  if not ok or type(v) ~= "table" or v[1] ~= nil then
    calls[#calls + 1] = { error = ("malformed tool call to '%s': [ARGS] is not a JSON object"):format(name), raw = raw }
    return
  end
  calls[#calls + 1] = { name = name, arguments = v }
end

function M.mistral(text)
  local calls = {}
  text = text:gsub("%[THINK%].-%[/THINK%]", "")   -- a call in the reasoning is not one
  local at = text:find("[TOOL_CALLS]", 1, true)
  while at do
    local from = at + #"[TOOL_CALLS]"
    local nxt = text:find("[TOOL_CALLS]", from, true)
    mistral_segment(text:sub(from, (nxt or #text + 1) - 1), calls)
    at = nxt
  end
  return calls
end

M.hermes = M.qwen   -- Hermes 2 Pro / 3 write their calls as Qwen2.5 does (Qwen took Hermes' format)

M.formats = { qwen = M.qwen, hermes = M.hermes, qwen3_coder = M.qwen3_coder, mistral = M.mistral, llama3 = M.llama3 }
M.FORMAT_LIST = "qwen, hermes, qwen3_coder, mistral, llama3"

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
    error(("tool_call_format = '%s' is not one of %s (or give a function(text) -> calls)"):format(tostring(format),
      M.FORMAT_LIST), 2)
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

-- The call format of a chat template's models, from its name (a file name counts:
-- "Qwen3-Coder.jinja") or else from its Jinja source (the tokenizer's chat_template), by the
-- markers its tool calls are rendered with; "qwen" when neither says.
local BY_NAME = { { "qwen3%-coder", "qwen3_coder" }, { "qwen3%.5", "qwen3_coder" }, { "hermes", "hermes" },
  { "mistral", "mistral" }, { "devstral", "mistral" }, { "ministral", "mistral" }, { "magistral", "mistral" } }
local BY_SOURCE = { { "<function=", "qwen3_coder" }, { "[TOOL_CALLS]", "mistral" }, { "<tool_call>", "qwen" },
  { "<|python_tag|>", "llama3" } }
function M.format_for(template_name, source)
  if template_name == "llama3" then return "llama3" end
  local name = type(template_name) == "string" and template_name:lower() or ""
  for _, r in ipairs(BY_NAME) do if name:find(r[1]) then return r[2] end end
  if type(source) == "string" then
    for _, r in ipairs(BY_SOURCE) do if source:find(r[1], 1, true) then return r[2] end end
  end
  return "qwen"
end

return M
