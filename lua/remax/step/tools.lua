-- remax.step.tools: a recipe's tools, checked once, listed for the chat template, and called with
-- every failure turned into the message an agent would see at inference.
--
--   tools = { calculator = { description = "Evaluate arithmetic", parameters = {
--               type = "object", properties = { expression = { type = "string" } }, required = { "expression" } },
--             fn = function(args) return tostring(...) end } }
--
-- tools.check(t, where) -> the normalised table (errors name the tool and key);
-- tools.schemas(t) -> the list the chat template's `tools` variable takes ({type="function",
-- ["function"]={name, description, parameters}}, sorted by name); tools.call(t, call, timeout)
-- -> result text, ok, seconds, kind ("ok", "malformed", "unknown", "bad_args", "error", "timeout").
local json = require("remax.formats.json")
local now = require("remax.bind.clock").now

local M = {}

local TYPES = { string = true, number = true, integer = true, boolean = true, object = true, array = true, ["null"] = true }

function M.check(t, where)
  where = where or "tools"
  if type(t) ~= "table" then error(("%s must be a table name -> {description=, parameters=, fn=}, got %s"):format(where, type(t)), 0) end
  local out = {}
  for name, spec in pairs(t) do
    if type(name) ~= "string" or not name:match("^[%a_][%w_%-]*$") then
      error(("%s: tool name %s must be an identifier"):format(where, tostring(name)), 0)
    end
    local w = ("%s.%s"):format(where, name)
    if type(spec) == "function" then spec = { fn = spec } end
    if type(spec) ~= "table" then error(("%s must be a table {description=, parameters=, fn=}, got %s"):format(w, type(spec)), 0) end
    if type(spec.fn) ~= "function" then error(("%s.fn must be a function(args) -> result, got %s"):format(w, type(spec.fn)), 0) end
    if spec.description ~= nil and type(spec.description) ~= "string" then
      error(("%s.description must be a string"):format(w), 0)
    end
    local params = spec.parameters or { type = "object", properties = {} }
    if type(params) ~= "table" or params.type ~= "object" then
      error(("%s.parameters must be a JSON schema with type = \"object\""):format(w), 0)
    end
    for pname, p in pairs(params.properties or {}) do
      if type(p) ~= "table" or (p.type ~= nil and not TYPES[p.type]) then
        error(("%s.parameters.properties.%s must have a JSON-schema type (string, number, integer, boolean, object, array)"):format(w, tostring(pname)), 0)
      end
    end
    for i, req in ipairs(params.required or {}) do
      if not (params.properties or {})[req] then
        error(("%s.parameters.required[%d] = '%s' is not one of its properties"):format(w, i, tostring(req)), 0)
      end
    end
    out[name] = { name = name, description = spec.description or "", parameters = params, fn = spec.fn }
  end
  return out
end

function M.names(t)
  local names = {}
  for name in pairs(t) do names[#names + 1] = name end
  table.sort(names)
  return names
end

function M.schemas(t)
  local list = {}
  for _, name in ipairs(M.names(t)) do
    local s = t[name]
    list[#list + 1] = { type = "function", ["function"] = { name = name, description = s.description, parameters = s.parameters } }
  end
  return list
end

local function type_ok(v, ty)
  if ty == nil then return true end
  if ty == "string" then return type(v) == "string" end
  if ty == "number" then return type(v) == "number" end
  if ty == "integer" then return type(v) == "number" and v == math.floor(v) end
  if ty == "boolean" then return type(v) == "boolean" end
  if ty == "object" or ty == "array" then return type(v) == "table" end
  return true
end

-- What is wrong with args for the tool's schema, or nil.
function M.args_problem(tool, args)
  local params = tool.parameters
  local props = params.properties or {}
  for _, req in ipairs(params.required or {}) do
    if args[req] == nil then return ("missing required argument '%s'"):format(req) end
  end
  for k, v in pairs(args) do
    local p = props[k]
    if not p then
      local names = {}
      for n in pairs(props) do names[#names + 1] = n end
      table.sort(names)
      return ("unexpected argument '%s' (parameters: %s)"):format(tostring(k), #names > 0 and table.concat(names, ", ") or "none")
    end
    if not type_ok(v, p.type) then
      return ("argument '%s' must be of type %s, got %s"):format(k, p.type, type(v))
    end
    if p.enum then
      local hit = false
      for _, e in ipairs(p.enum) do hit = hit or e == v end
      if not hit then return ("argument '%s' = %s is not one of its allowed values"):format(k, tostring(v)) end
    end
  end
  return nil
end

local function as_text(v)
  if type(v) == "string" then return v end
  if v == nil then return "" end
  if type(v) == "table" then return json.encode(v) end
  return tostring(v)
end

-- fn(args) with a wall-clock limit: a count hook (the function runs uncompiled, so the hook
-- fires) raises once the deadline has passed. A function blocked in C (a socket) is not cut.
local function call_limited(fn, args, timeout)
  if not timeout or timeout <= 0 then return pcall(fn, args) end
  local deadline = now() + timeout
  local jit_ok = pcall(function() jit.off(fn, true) end)
  local timed_out = false
  local co = coroutine.create(function() return fn(args) end)
  -- LuaJIT's hooks are global (not per coroutine): set for the call, then the earlier one back
  local old_hook, old_mask, old_count = debug.gethook()
  debug.sethook(function()
    if coroutine.running() == co and now() > deadline then timed_out = true; error("__remax_tool_timeout__", 2) end
  end, "", 1000)
  local res = { coroutine.resume(co) }
  if old_hook then debug.sethook(old_hook, old_mask, old_count) else debug.sethook() end
  if jit_ok then pcall(function() jit.on(fn, true) end) end
  if timed_out then return false, "__remax_tool_timeout__" end
  if coroutine.status(co) ~= "dead" then return false, "the tool yielded (tools must return their result)" end
  return unpack(res)
end

-- One call ({name=, arguments=} or {error=}) -> result text, ok, seconds, kind.
function M.call(t, call, timeout)
  if call.error then return "Error: " .. call.error, false, 0, "malformed" end
  local tool = t[call.name]
  if not tool then
    return ("Error: unknown tool '%s' (available: %s)"):format(tostring(call.name), table.concat(M.names(t), ", ")), false, 0,
      "unknown"
  end
  local problem = M.args_problem(tool, call.arguments or {})
  if problem then return ("Error: bad arguments for '%s': %s"):format(call.name, problem), false, 0, "bad_args" end
  local t0 = now()
  local ok, result = call_limited(tool.fn, call.arguments or {}, timeout)
  local seconds = now() - t0
  if not ok then
    if tostring(result):find("__remax_tool_timeout__", 1, true) then
      return ("Error: tool '%s' timed out after %g s"):format(call.name, timeout), false, seconds, "timeout"
    end
    return ("Error: tool '%s' failed: %s"):format(call.name, tostring(result)), false, seconds, "error"
  end
  return as_text(result), true, seconds, "ok"
end

return M
