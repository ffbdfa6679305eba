-- remax.step.tools: a recipe's tools, checked once, listed for the chat template, and called with
-- every failure turned into the message an agent would see at inference.
--
--   tools = { calculator = { description = "Evaluate arithmetic", parameters = {
--               type = "object", properties = { expression = { type = "string" } }, required = { "expression" } },
--             ["return"] = { type = "string" },   -- optional: the schema's "return"
--             fn = function(args) return tostring(...) end } }
--
-- tools.check(t, where) -> the normalised table (errors name the tool and key);
-- tools.schemas(t) -> the list the chat template's `tools` variable takes, sorted by name: each
-- {"type": "function", "function": {"name", "description", "parameters", "return"}} as template
-- values whose keys keep that order (transformers' get_json_schema order, so the template's
-- tojson writes what transformers writes); tools.call(t, call, timeout)
-- -> result text, ok, seconds, kind ("ok", "malformed", "unknown", "bad_args", "error", "timeout",
-- "worker").
--
-- A tool's fn may also be a string: "py:FILE.py:FUNCTION" (a Python function, run in the
-- worker of that file; its signature and docstring give the schema unless the recipe gives one),
-- "cmd:PROGRAM" or "http://HOST:PORT/PATH" (remax.step.channels). A tool given as just such a
-- string (calculator = "py:tools.py:calculator", or a list entry "py:tools.py:calculator") is
-- the same. Those calls are started with tools.start and collected with tools.collect, so the
-- model keeps decoding while they run. A Python function's schema follows transformers'
-- get_json_schema (which TRL uses), and a function it would refuse (no docstring, an argument
-- without a type hint or a description, *args/**kwargs) is refused here, naming it.
--
-- The methods of a TRL-kind environment (remax.step.environment) are tools too: `method = true`,
-- each call made on its episode's instance (tools.start's and tools.call's `env`).
local json = require("remax.formats.json")
local jinja = require("remax.text.jinja")
local chat = require("remax.text.chat")
local now = require("remax.bind.clock").now
local channels = require("remax.step.channels")
local guard = require("remax.step.guard")

local M = {}

local TYPES = { string = true, number = true, integer = true, boolean = true, object = true, array = true, ["null"] = true }

-- A list (1..n, no holes) or nil.
local function list_length(v)
  if type(v) ~= "table" then return nil end
  local n = 0
  for k in pairs(v) do
    if type(k) ~= "number" or k < 1 or k ~= math.floor(k) then return nil end
    n = math.max(n, k)
  end
  for i = 1, n do if v[i] == nil then return nil end end
  return n
end

-- Refuses a tool's parameters schema that remax cannot check calls against, naming where (w):
-- type "object"; properties a table of name -> { type = one of TYPES or a list of them (optional), enum = a list
-- (optional), description = text (optional) }; required a list of property names.
function M.check_schema(params, w)
  if type(params) ~= "table" or params.type ~= "object" then
    error(("%s must be a JSON schema with type = \"object\""):format(w), 0)
  end
  local props = params.properties
  if props ~= nil and type(props) ~= "table" then
    error(("%s.properties must be a table of name -> schema, got a %s"):format(w, type(props)), 0)
  end
  for pname, p in pairs(props or {}) do
    if type(pname) ~= "string" then
      error(("%s.properties has the key %s; property names are strings"):format(w, tostring(pname)), 0)
    end
    local ty = type(p) == "table" and p.type
    local known = ty == nil or ty == false or TYPES[ty]
    if type(ty) == "table" and list_length(ty) then   -- a list of types (a Python Union, as transformers writes it)
      known = true
      for _, x in ipairs(ty) do known = known and TYPES[x] end
    end
    if type(p) ~= "table" or not known then
      error(("%s.properties.%s must have a JSON-schema type (string, number, integer, boolean, object, array)"):format(w, pname), 0)
    end
    if p.enum ~= nil and not list_length(p.enum) then
      error(("%s.properties.%s.enum must be a list of the allowed values, got a %s"):format(w, pname, type(p.enum)), 0)
    end
    if p.description ~= nil and type(p.description) ~= "string" then
      error(("%s.properties.%s.description must be a string"):format(w, pname), 0)
    end
  end
  local req = params.required
  if req ~= nil then
    if not list_length(req) then
      error(("%s.required must be a list of property names, such as { \"%s\" }, got %s"):format(w,
        type(req) == "string" and req or "expression", type(req) == "string" and ("the string '" .. req .. "'") or ("a " .. type(req))), 0)
    end
    for i, name in ipairs(req) do
      if type(name) ~= "string" or not (props or {})[name] then
        error(("%s.required[%d] = %s is not one of its properties"):format(w, i,
          type(name) == "string" and ("'" .. name .. "'") or tostring(name)), 0)
      end
    end
  end
end

-- opts.registry: a remax.step.channels registry for the tools outside Lua (made here when needed,
-- and returned second); opts.base: the recipe's folder (py: files are also looked for there);
-- opts.methods: the table of a Lua TRL-kind environment's methods (t then lists their schemas,
-- without fn: each tool is the method of its name).
function M.check(t, where, opts)
  where = where or "tools"
  opts = opts or {}
  if type(t) ~= "table" then error(("%s must be a table name -> {description=, parameters=, fn=}, got %s"):format(where, type(t)), 0) end
  local out = {}
  local entries = {}
  for name, spec in pairs(t) do
    if type(name) == "number" and channels.is_spec(spec) then   -- a list entry "py:tools.py:calculator": the function's name
      local fname = spec:match(":([%a_][%w_]*)$")
      if not spec:match("^py:") or not fname then
        error(("%s[%d] = %s: a tool in the list form must be py:FILE.py:FUNCTION (give an HTTP or cmd: tool a name: name = { fn = ... })")
          :format(where, name, spec), 0)
      end
      name = fname
    end
    entries[#entries + 1] = { name, spec }
  end
  local describe = {}   -- channel -> { names } whose schema the worker gives
  for _, e in ipairs(entries) do
    local name, spec = e[1], e[2]
    if type(name) ~= "string" or not name:match("^[%a_][%w_%-]*$") then
      error(("%s: tool name %s must be an identifier"):format(where, tostring(name)), 0)
    end
    if out[name] then error(("%s: two tools are named '%s'"):format(where, name), 0) end
    local w = ("%s.%s"):format(where, name)
    if type(spec) == "function" or channels.is_spec(spec) then spec = { fn = spec } end
    if type(spec) ~= "table" then error(("%s must be a table {description=, parameters=, fn=}, got %s"):format(w, type(spec)), 0) end
    local far
    if opts.methods then
      if type(opts.methods[name]) ~= "function" then
        error(("%s: the environment has no method %s (a function(self, args) -> result)"):format(w, name), 0)
      end
      if spec.fn ~= nil then error(("%s.fn: a method of the environment is its tool; give no fn"):format(w), 0) end
    elseif type(spec.fn) == "string" then
      if not channels.is_spec(spec.fn) then
        error(("%s.fn = %s: expected a function(args) -> result, py:FILE.py:FUNCTION, cmd:PROGRAM or http://HOST:PORT/PATH")
          :format(w, spec.fn), 0)
      end
      opts.registry = opts.registry or channels.registry({ base = opts.base, max_line = opts.max_line })
      local ch = opts.registry:channel(spec.fn, w .. ".fn")
      far = { channel = ch, name = spec.fn:match("^py:") and spec.fn:match(":([%a_][%w_]*)$") or name }
      if spec.fn:match("^py:") and spec.parameters == nil then
        describe[ch] = describe[ch] or {}
        table.insert(describe[ch], { tool = name, fn = far.name, spec = spec, w = w })
      end
    elseif type(spec.fn) ~= "function" then
      error(("%s.fn must be a function(args) -> result, got %s"):format(w, type(spec.fn)), 0)
    end
    if spec.description ~= nil and type(spec.description) ~= "string" then
      error(("%s.description must be a string"):format(w), 0)
    end
    if spec["return"] ~= nil and type(spec["return"]) ~= "table" then
      error(("%s.return must be a JSON schema (a table such as { type = \"string\" })"):format(w), 0)
    end
    local params = spec.parameters or { type = "object", properties = {} }
    M.check_schema(params, w .. ".parameters")
    out[name] = { name = name, description = spec.description or "", parameters = params, returns = spec["return"], fn = spec.fn,
      remote = far, method = opts.methods and true or nil }
  end
  -- the schemas of Python tools the recipe gives none for: from their signatures and docstrings
  for ch, list in pairs(describe) do
    local names = {}
    for _, d in ipairs(list) do names[#names + 1] = d.fn end
    local h = opts.registry:wait(opts.registry:request(ch, { type = "describe", names = names }, channels.START_TIMEOUT))
    if h.err then error(("%s: %s"):format(list[1].w .. ".fn", h.err), 0) end
    for _, d in ipairs(list) do
      local got = type(h.value.tools) == "table" and h.value.tools[d.fn]
      M.take_schema(out[d.tool], got, d.w .. ".fn", d.fn, d.spec.description == nil)
    end
  end
  return out, opts.registry
end

-- The worker's schema of a Python function (a describe answer's entry: description, parameters,
-- schema; or error, why get_json_schema's rules refuse it) into tool. w: how errors name it.
function M.take_schema(tool, got, w, fname, take_description)
  if type(got) ~= "table" then error(("%s: the worker gave no schema for '%s'"):format(w, fname), 0) end
  if got.error ~= nil then error(("%s: %s"):format(w, tostring(got.error)), 0) end
  if take_description and type(got.description) == "string" then tool.description = got.description end
  local params = type(got.parameters) == "table" and got.parameters or { type = "object", properties = {} }
  if type(params.properties) ~= "table" then params.properties = {} end
  params.type = "object"
  M.check_schema(params, w .. ": the worker's schema for '" .. fname .. "', parameters")
  tool.parameters = params
  if type(got.schema) == "string" then   -- the same, keys in the worker's order (the function's)
    tool.worker_schema = jinja.from_json(got.schema, w .. ": the worker's schema")
  end
end

-- The tools of a Python TRL-kind environment: its methods, as the worker described them
-- (name -> describe entry), each called on its episode's instance over channel.
function M.from_worker(described, channel, where)
  local out = {}
  for name, got in pairs(described or {}) do
    local tool = { name = name, description = "", remote = { channel = channel, name = name }, method = true }
    M.take_schema(tool, got, ("%s: its method %s"):format(where, name), name, true)
    out[name] = tool
  end
  return out
end

-- Recipe tools and an environment's method tools as one table (a name in both: refused).
function M.merge(a, b, where)
  if not a then return b end
  if not b then return a end
  local out = {}
  for k, v in pairs(a) do out[k] = v end
  for k, v in pairs(b) do
    if out[k] then error(("%s: its method %s and the recipe's tools.%s have the same name; rename one"):format(where, k, k), 0) end
    out[k] = v
  end
  return out
end

function M.names(t)
  local names = {}
  for name in pairs(t) do if type(name) == "string" then names[#names + 1] = name end end
  table.sort(names)
  return names
end

-- The order transformers' get_json_schema writes a schema's keys in; others follow, by name.
local KEY_ORDER = {}
for i, k in ipairs({ "type", "anyOf", "items", "prefixItems", "additionalProperties", "nullable", "enum", "properties",
  "required", "description" }) do KEY_ORDER[k] = i end

-- A Lua JSON schema as template values in that order (a Lua table has no order of its own):
-- "properties" by parameter name, lists ("required", "enum", a list of types) as lists.
local function ordered(v, key)
  if type(v) ~= "table" or getmetatable(v) ~= nil then return v end
  if key == "required" or key == "enum" or key == "type" or key == "anyOf" or key == "prefixItems" or #v > 0 then
    local out = {}
    for i, x in ipairs(v) do out[i] = ordered(x) end
    return jinja.list(out)
  end
  local names = {}
  for k in pairs(v) do names[#names + 1] = k end
  local rank = key == "properties" and {} or KEY_ORDER
  table.sort(names, function(a, b)
    local ra, rb = rank[a] or math.huge, rank[b] or math.huge
    if ra ~= rb then return ra < rb end
    return tostring(a) < tostring(b)
  end)
  local kv = {}
  for i, k in ipairs(names) do kv[i] = { k, ordered(v[k], key ~= "properties" and k or nil) } end
  return jinja.dict(kv)   -- an empty table is a dict here: "properties": {} as transformers writes it
end

-- The worker's schema (its keys in order) with the recipe's name and description in place.
local function with_name(schema, name, description)
  local kv = jinja.items(schema)
  for _, e in ipairs(kv) do
    if e[1] == "name" then e[2] = name elseif e[1] == "description" then e[2] = description end
  end
  return jinja.dict(kv)
end

function M.schemas(t)
  local list = {}
  for _, name in ipairs(M.names(t)) do
    local s = t[name]
    local fn
    if s.worker_schema then
      fn = with_name(s.worker_schema, name, s.description)
    else
      local kv = { { "name", name }, { "description", s.description }, { "parameters", ordered(s.parameters) } }
      if s.returns then kv[4] = { "return", ordered(s.returns) } end
      fn = jinja.dict(kv)
    end
    list[#list + 1] = jinja.dict({ { "type", "function" }, { "function", fn } })
  end
  return list
end

-- A tool's name no template would write by chance: the template is asked to show it.
local PROBE_TOOL = "remax_tool_name_probe_a8f3e2"

-- Refuses a chat template that cannot show the model its tools, naming it (as TRL refuses one
-- that cannot render a tool-calling conversation): the built-in chatml, llama3, plain and qa,
-- and a tokenizer's template without a tools section. A recipe's own template function is the
-- recipe's to write: it gets the tools in opts.template_args.tools. template: the render options
-- (remax.text.chat's), name: how the run names it, tok: the tokenizer.
function M.check_template(template, name, tok)
  template = template or {}
  if type(template.template) == "function" then return end
  local o = {}
  for k, v in pairs(template) do o[k] = v end
  o.tokenizer = o.tokenizer or tok
  o.template_args = {}
  for k, v in pairs(template.template_args or {}) do o.template_args[k] = v end
  o.template_args.tools = M.schemas(M.check({ [PROBE_TOOL] = { description = "probe", fn = function() end } }))
  local problem = chat.tools_problem(o, PROBE_TOOL)
  if not problem then return end
  name = name or tostring(template.template)
  if name == "tokenizer" or name == "auto" then
    name = ("tokenizer (%s)"):format(tok and (tok.chat_template_path or tok.path) or "the tokenizer's chat_template")
  elseif chat.templates[name] then
    name = name .. " (built in)"
  end
  error(("chat_template = %s cannot show the model its tools: %s. The model would never see the tools it is trained to " ..
    "call; TRL refuses such a template too (\"The provided chat template does not support tool calling\"). Use a template " ..
    "with a tools section (chat_template = \"tokenizer\" with a model whose template has one, such as Qwen2.5's, " ..
    "Qwen3's or Llama 3.1's), or a recipe function(messages, opts) that writes opts.template_args.tools"):format(name, problem), 0)
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

-- A tool's result as the text the model sees (a table as JSON); nil and why for a table JSON
-- cannot hold (one that contains itself).
local function as_text(v)
  if type(v) == "string" then return v end
  if v == nil then return "" end
  if type(v) == "table" then
    local ok, text = pcall(json.encode, v, { where = "its result" })
    if not ok then return nil, (tostring(text):gsub("^runs: ", ""):gsub("^(its result" .. ("%.[^.:]+"):rep(4) .. ")[^:]*", "%1...")) end
    return text
  end
  return tostring(v)
end

-- The checks before a call: nil, or result text, ok, seconds, kind of a call that fails them.
local function precheck(t, call)
  if call.error then return "Error: " .. call.error, false, 0, "malformed" end
  local tool = t[call.name]
  if type(call.name) ~= "string" or not tool then
    return ("Error: unknown tool '%s' (available: %s)"):format(tostring(call.name), table.concat(M.names(t), ", ")), false, 0,
      "unknown"
  end
  local problem = M.args_problem(tool, call.arguments or {})
  if problem then return ("Error: bad arguments for '%s': %s"):format(call.name, problem), false, 0, "bad_args" end
end

-- A remote call's answer (its handle resolved) -> result text, ok, seconds, kind.
local function remote_result(name, h, timeout)
  if h.kind == "timeout" then
    return ("Error: tool '%s' timed out after %g s"):format(name, timeout), false, h.seconds or timeout, "timeout"
  end
  if h.err then
    return ("Error: tool '%s' failed: %s"):format(name, h.err), false, h.seconds or 0, h.kind == "error" and "error" or "worker"
  end
  local r = h.value.result
  if r == nil and h.value.error == nil then
    return ("Error: tool '%s' failed: the answer has no \"result\""):format(name), false, h.seconds or 0, "worker"
  end
  return as_text(r), true, h.seconds or 0, "ok"
end

-- The request of a call to a tool outside Lua (a method's goes to its episode's instance).
local function tool_request(tool, call, env)
  return { type = "tool", name = tool.remote.name, episode = tool.method and env and env.episode or nil,
    arguments = next(call.arguments or {}) and call.arguments or json.object() }
end

-- Starts one call: { done = true, result, ok, seconds, kind } for a Lua tool (it runs now) or a
-- call that fails its checks, or { done = false, handle } for a tool outside Lua, whose answer
-- tools.collect gives once the handle is done (registry:poll). env: the episode's environment
-- instance, for the methods of a TRL-kind environment.
function M.start(t, call, timeout, registry, env)
  local tool = not call.error and type(call.name) == "string" and t[call.name]
  if tool and tool.remote and not precheck(t, call) then
    local h = registry:request(tool.remote.channel, tool_request(tool, call, env), timeout)
    return { done = false, handle = h, name = call.name, timeout = timeout }
  end
  local result, ok, seconds, kind = M.call(t, call, timeout, registry, env)
  return { done = true, result = result, ok = ok, seconds = seconds, kind = kind }
end

-- A started call -> nil while it runs, else result text, ok, seconds, kind.
function M.collect(p)
  if p.done then return p.result, p.ok, p.seconds, p.kind end
  if not p.handle.done then return nil end
  p.result, p.ok, p.seconds, p.kind = remote_result(p.name, p.handle, p.timeout)
  p.done = true
  return p.result, p.ok, p.seconds, p.kind
end

-- One call ({name=, arguments=} or {error=}) -> result text, ok, seconds, kind. A tool outside
-- Lua is waited for (registry: the one tools.check made). env: as tools.start's.
function M.call(t, call, timeout, registry, env)
  local r, ok0, s0, k0 = precheck(t, call)
  if r then return r, ok0, s0, k0 end
  local tool = t[call.name]
  if tool.remote then
    if not registry then error("tools.call: the tool '" .. call.name .. "' runs outside Lua and needs its registry", 0) end
    local h = registry:wait(registry:request(tool.remote.channel, tool_request(tool, call, env), timeout))
    return remote_result(call.name, h, timeout)
  end
  if tool.method and type(env) ~= "table" then
    error("tools.call: the tool '" .. call.name .. "' is a method of the environment and needs its episode's instance", 0)
  end
  -- remax.step.guard: tool_timeout holds even for a tool that catches every error, Ctrl-C and
  -- SIGTERM stop it, os.exit is refused
  local t0 = now()
  local limit = { limit = timeout, what = ("the tool '%s'"):format(call.name) }
  local ok, result
  if tool.method then
    ok, result = guard.call(env[call.name], limit, env, call.arguments or {})
  else
    ok, result = guard.call(tool.fn, limit, call.arguments or {})
  end
  local seconds = now() - t0
  if not ok then
    if result == guard.TIMEOUT then
      return ("Error: tool '%s' timed out after %g s"):format(call.name, timeout), false, seconds, "timeout"
    end
    return ("Error: tool '%s' failed: %s"):format(call.name, tostring(result)), false, seconds, "error"
  end
  local text, why = as_text(result)
  if not text then
    return ("Error: tool '%s' failed: it returned what cannot be written as JSON: %s"):format(call.name, why), false, seconds, "error"
  end
  return text, true, seconds, "ok"
end

return M
