-- remax.step.remote: tools and environments outside Lua (py:, cmd:, http://), JSON with request ids.
-- Many calls are on their way at once, answered in any order, and the rollout keeps decoding
-- while they run (docs/environments.md, "Tools and environments in Python, or behind HTTP").
--
--   "py:FILE.py:NAME"   a function (a tool) or a class (an environment) of a Python file, run in a
--                       long-lived python3 worker, one per file, each request in its own thread
--   "cmd:PROGRAM ARGS"  any program (/bin/sh) speaking the same JSON lines on stdin/stdout
--   "http://HOST:PORT/PATH"  a server: one POST of the same JSON per request
--
-- The requests, one JSON line each ({"id": N, ...}; the answer echoes the id, in any order):
--   {"id", "type": "describe", "names": [...]}            -> {"id", "tools": {name: {description, parameters, schema}}}
--   {"id", "type": "tool", "name", "arguments": {...}}    -> {"id", "result": "text"}
--   {"id", "type": "reset", "name", "episode", "sample", "seed"}  -> {"id", "messages": [...] | "text" | null}
--   {"id", "type": "step", "name", "episode", "text"}     -> {"id", "messages", "done", "reward"}
--   {"id", "type": "close", "name", "episode"}            -> {"id"}
--   any request                                            -> {"id", "error": "message"}
--
-- local reg = remote.registry({ base = recipe_dir, max_line = bytes })
-- local ch = reg:channel("py:tools.py")            -- one per file / command / URL
-- local h = ch:request({ type = "tool", ... }, timeout)   -- never blocks long, never raises
-- reg:poll(block_until)   -- reads what arrived (until block_until when nothing did); h.done, h.value | h.err, h.kind
local ipc = require("remax.bind.ipc")
local http = require("remax.step.reward_http")
local json = require("remax.formats.json")
local cjson = require("cjson").new()

local M = {}

-- Seconds a worker may take to start (import its file).
M.START_TIMEOUT = 120
-- How many times a worker that died is started again in a run (each death fails only the
-- requests then on their way).
M.MAX_RESTARTS = 3

M.PY_HARNESS = [==[
import sys, json, os, re, enum, signal, traceback, importlib.util, inspect, threading, typing
signal.signal(signal.SIGINT, signal.SIG_IGN)
proto = sys.stdout
sys.stdout = sys.stderr
lock = threading.Lock()
def answer(obj):
    line = json.dumps(obj, default=str)
    with lock:
        proto.write(line + "\n")
        proto.flush()
path = sys.argv[1]
try:
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    spec = importlib.util.spec_from_file_location("remax_tools_" + os.path.basename(path)[:-3].replace("-", "_"), path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
except BaseException:
    answer({"error": "loading " + path + ": " + traceback.format_exc(limit=-3)})
    sys.exit(0)
answer({"ready": True})
def get(name):
    obj = getattr(mod, name, None)
    if not callable(obj):
        have = sorted(k for k, v in vars(mod).items()
                      if callable(v) and not k.startswith("_") and getattr(v, "__module__", None) == mod.__name__)
        raise LookupError("%s has no function or class '%s' (have: %s)" % (path, name, ", ".join(have) or "none"))
    return obj
# A function's schema as transformers' get_json_schema writes it (what TRL hands the chat template
# for a Python tool), keys in its order: the type hints give each parameter's JSON-schema type,
# the Google-style docstring the descriptions ("Args:", "Returns:", an argument's trailing
# "(choices: [...])"). Where get_json_schema refuses a function (a hint it cannot convert, an
# argument without a description), this leaves the part out instead.
JSON_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean", type(None): "null",
              list: "array", tuple: "array", dict: "object"}
def enum_schema(values):
    kinds = []
    for v in values:
        k = JSON_TYPES.get(type(v), "string")
        if k not in kinds:
            kinds.append(k)
    return {"type": kinds[0] if len(kinds) == 1 else kinds, "enum": list(values)}
class Unconvertible(Exception):
    pass
def type_schema(t):
    origin, args = typing.get_origin(t), typing.get_args(t)
    if origin is None and isinstance(t, type) and issubclass(t, enum.Enum):
        return enum_schema([m.value for m in t])
    if origin is None:
        if t is typing.Any:
            return {}
        if t not in JSON_TYPES:
            raise Unconvertible(t)
        return {"type": JSON_TYPES[t]}
    if origin is typing.Union or type(t).__name__ == "UnionType":   # Optional[int], int | None
        parts = [type_schema(a) for a in args if a is not type(None)]
        if len(parts) == 1:
            s = parts[0]
        elif all(list(p) == ["type"] and isinstance(p["type"], str) for p in parts):
            kinds = sorted(set(p["type"] for p in parts))
            s = {"type": kinds[0] if len(kinds) == 1 else kinds}
        else:
            s = {"anyOf": parts}
        if type(None) in args:
            s["nullable"] = True
        return s
    if origin is typing.Literal and args:
        return enum_schema(list(args))
    if origin is list:
        return {"type": "array", "items": type_schema(args[0])} if args else {"type": "array"}
    if origin is tuple:
        if len(args) > 1 and Ellipsis not in args:
            return {"type": "array", "prefixItems": [type_schema(a) for a in args]}
        return {"type": "array"}
    if origin is dict:
        return {"type": "object", "additionalProperties": type_schema(args[1])} if len(args) == 2 else {"type": "object"}
    raise Unconvertible(t)
def doc_parts(doc):
    """(description, {argument: description}, returns) of a Google-style docstring."""
    head, arg_lines, ret_lines, section = [], [], [], None
    for line in doc.split("\n"):
        word = line.strip()
        if word in ("Args:", "Returns:", "Raises:"):
            section = word
        elif section is None:
            head.append(line)
        elif section == "Args:":
            arg_lines.append(line)
        elif section == "Returns:":
            ret_lines.append(line)
    args, name, base = {}, None, None
    for line in arg_lines:
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        m = re.match(r"\s*(\w+)(?:\s*\([^()]*\))?:\s*(.*)$", line)
        if m and (base is None or indent <= base):
            base, name = indent, m.group(1)
            args[name] = m.group(2).strip()
        elif name is not None:
            args[name] = (args[name] + " " + line.strip()).strip()
    returns = "\n".join(ret_lines).strip() or None
    return "\n".join(head).strip(), args, returns
def describe(fn):
    description, args_doc, returns = doc_parts((inspect.getdoc(fn) or "").strip())
    try:
        hints = typing.get_type_hints(fn)
    except Exception:
        hints = {}
    props, required = {}, []
    for p in inspect.signature(fn).parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) or p.name in ("self", "cls"):
            continue
        if p.default is p.empty:
            required.append(p.name)
        try:
            s = type_schema(hints[p.name]) if p.name in hints else {}
        except Unconvertible:
            s = {}
        desc = args_doc.get(p.name)
        if desc is not None:
            choices = re.search(r"\(choices:\s*(.*?)\)\s*$", desc, flags=re.IGNORECASE)
            if choices:
                try:
                    s["enum"] = [c.strip() if isinstance(c, str) else c for c in json.loads(choices.group(1))]
                    desc = desc[:choices.start()].strip()
                except ValueError:
                    pass
            s["description"] = desc
        props[p.name] = s
    params = {"type": "object", "properties": props}
    if required:
        params["required"] = required
    schema = {"name": fn.__name__, "description": description, "parameters": params}
    try:
        ret = type_schema(hints["return"]) if "return" in hints else None
    except Unconvertible:
        ret = None
    if ret is not None:
        if returns is not None:
            ret["description"] = returns
        schema["return"] = ret
    # the schema once more as JSON text: the Lua side keeps its key order for the template
    return {"description": description, "parameters": params, "schema": json.dumps(schema, ensure_ascii=False)}
def text_of(v):
    if isinstance(v, str):
        return v
    if v is None:
        return ""
    return json.dumps(v, default=str)
def keywords(fn, d):
    """The entries of d that fn takes (all of them when it has **kwargs)."""
    ps = inspect.signature(fn).parameters.values()
    if any(p.kind == p.VAR_KEYWORD for p in ps):
        return dict(d)
    names = {p.name for p in ps if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    return {k: v for k, v in d.items() if k in names}
def reset_keywords(fn, req):
    """A reset's keywords: the row's columns it takes, and the prompt's seed (every episode of a
    prompt gets the same) when it names a `seed` parameter and the row has no `seed` column."""
    kw = keywords(fn, req.get("sample") or {})
    if "seed" not in kw and req.get("seed") is not None and "seed" in inspect.signature(fn).parameters:
        kw["seed"] = req["seed"]
    return kw
envs = {}
def handle(req):
    rid = req.get("id")
    try:
        t = req.get("type")
        if t == "describe":
            answer({"id": rid, "tools": {n: describe(get(n)) for n in req.get("names") or []}})
        elif t == "tool":
            fn = get(req["name"])
            answer({"id": rid, "result": text_of(fn(**(req.get("arguments") or {})))})
        elif t == "reset":
            env = get(req["name"])()
            ep = req["episode"]
            envs[ep] = env
            r = None
            if hasattr(env, "reset"):
                r = env.reset(**reset_keywords(env.reset, req))
            answer({"id": rid, "messages": r})
        elif t == "step":
            env = envs.get(req["episode"])
            if env is None:
                raise KeyError("no episode %r (reset was not called, or the worker was restarted)" % req["episode"])
            r = env.step(req["text"])
            done, reward = False, None
            if isinstance(r, tuple):
                r, done, reward = (tuple(r) + (False, None))[:3]
            answer({"id": rid, "messages": r, "done": bool(done), "reward": reward})
        elif t == "close":
            env = envs.pop(req.get("episode"), None)
            if env is not None and hasattr(env, "close"):
                env.close()
            answer({"id": rid})
        else:
            raise ValueError("unknown request type %r" % (t,))
    except BaseException as e:
        answer({"id": rid, "error": "%s: %s" % (type(e).__name__, e), "traceback": traceback.format_exc(limit=-3)})
for line in sys.stdin:
    try:
        req = json.loads(line)
    except ValueError:
        answer({"id": None, "error": "a request that is not JSON: %r" % line[:200]})
        continue
    threading.Thread(target=handle, args=(req,), daemon=True).start()
]==]

-- A py:, cmd: or http(s):// string: the rewards' forms (remax.step.reward_worker).
function M.is_spec(s) return type(s) == "string" and require("remax.step.reward_worker").is_spec(s) end

local function clip(s, n)
  s = tostring(s)
  n = n or 300
  return #s > n and (s:sub(1, n) .. "...") or s
end

-- "py:FILE.py:NAME" -> the file found (as given, or beside the recipe), NAME; errors name `where`.
function M.py_target(spec, base, where)
  local file, name = spec:sub(4):match("^(.-%.py):([%a_][%w_]*)$")
  if not file then error(("%s = %s: expected py:FILE.py:NAME (a function or class of the file)"):format(where, spec), 0) end
  local found, tried = require("remax.step.reward_worker").find_file(file, base)
  if found then return found, name end
  error(("%s = %s: no such file (looked at %s)"):format(where, spec, table.concat(tried, ", ")), 0)
end

---------------------------------------------------------------------------------------------
-- A handle: one request on its way. done, value (the answer's table) or err (text) and kind
-- ("timeout" | "worker": the channel failed | "error": the answer's own error).

local function finish(h, value, err, kind)
  if h.done then return end
  h.done, h.value, h.err, h.kind = true, value, err, kind
  h.seconds = ipc.now() - h.t0
end

-- JSON's nulls out of a decoded answer (a null reward, a null message list are nil).
local function strip(v)
  if type(v) == "table" then
    for k, x in pairs(v) do if x == cjson.null then v[k] = nil else strip(x) end end
  end
  return v
end

-- An answer (already decoded) for h: an "error" field is the call's error.
local function resolve(h, v)
  strip(v)
  if v.error ~= nil then return finish(h, nil, tostring(v.error), "error") end
  finish(h, v)
end

---------------------------------------------------------------------------------------------
-- Worker processes (py: and cmd:): one per file or command; answers matched by id.

local Worker = {}
Worker.__index = Worker

function Worker:fail_all(why, kind)
  for id, h in pairs(self.pending) do finish(h, nil, why, kind or "worker"); self.pending[id] = nil end
end

function Worker:down(why)
  if self.proc then self.proc:kill(); self.proc:close(0); self.proc = nil end
  self:fail_all(why)
end

-- Starts the worker (or says why it cannot): true, or nil, why.
function Worker:start()
  if self.proc then return true end
  if self.starts > M.MAX_RESTARTS then
    return nil, ("the worker %s died %d times; it is not started again in this run"):format(self.spec, self.starts)
  end
  self.starts = self.starts + 1
  local ok, p = pcall(ipc.spawn, self.argv)
  if not ok then return nil, tostring(p) end
  self.proc = p
  if self.hello then
    local line, why = p:read_line(ipc.now() + M.START_TIMEOUT, self.max_line)
    local v = line and select(2, pcall(cjson.decode, line))
    if type(v) ~= "table" or v.ready ~= true then
      local how = type(v) == "table" and v.error and tostring(v.error)
        or (why == "closed" and "it exited before it was ready; its error output is above")
        or (why == "timeout" and ("it did not say it was ready within %g s"):format(M.START_TIMEOUT))
        or ("it started with %s"):format(clip(line or why, 200))
      p:kill(); p:close(0); self.proc = nil
      self.starts = M.MAX_RESTARTS + 1   -- a file that does not load will not load next time either
      self.start_error = how
      return nil, how
    end
  end
  return true
end

function Worker:request(h)
  if self.start_error then return finish(h, nil, "cannot start the worker " .. self.spec .. ": " .. self.start_error, "worker") end
  local ok, why = self:start()
  if not ok then return finish(h, nil, "cannot start the worker " .. self.spec .. ": " .. why, "worker") end
  self.pending[h.id] = h
  local sent, werr = self.proc:write(h.line .. "\n", ipc.now() + 5)
  if not sent then
    self:died(werr)
  end
end

-- The worker closed its end (or a write failed): it died; what was on its way fails.
function Worker:died(why)
  local exit = why
  if self.proc then
    self.proc:wait(1)
    local _, e = self.proc:running()
    exit = e or why
  end
  self:down(("the worker %s died (%s); its error output is above"):format(self.spec, tostring(exit)))
end

-- Reads every answer that has arrived; waits until `deadline` for the first (nil: no wait).
function Worker:poll(deadline)
  if not self.proc then return end
  local first = true
  while self.proc do
    local line, why = self.proc:read_line(first and deadline or ipc.now(), self.max_line)
    first = false
    if not line then
      if why == "timeout" then return end
      if why == "too long" then
        return self:down(("the worker %s answered a line longer than reward_max_line_bytes = %d bytes (it is stopped)")
          :format(self.spec, self.max_line))
      end
      return self:died(why)
    end
    local ok, v = pcall(cjson.decode, line)
    if not ok or type(v) ~= "table" then
      return self:down(("the worker %s answered something that is not a JSON object: %s (it is stopped)"):format(self.spec, clip(line, 200)))
    end
    local id = v.id
    if id == nil or id == cjson.null then
      if v.error ~= nil then
        return self:down(("the worker %s reported an error without a request id: %s (it is stopped)"):format(self.spec, clip(v.error, 300)))
      end
      return self:down(("the worker %s answered without a request id: %s (each answer must echo its request's \"id\"; it is stopped)")
        :format(self.spec, clip(line, 200)))
    end
    local h = self.pending[id]
    if h then   -- an answer to a request that timed out, or to none, is dropped
      self.pending[id] = nil
      resolve(h, v)
    end
  end
end

function Worker:busy() return next(self.pending) ~= nil end

function Worker:close()
  if self.proc then self.proc:close(0.2); self.proc = nil end
  self:fail_all("the worker was closed")
end

---------------------------------------------------------------------------------------------
-- HTTP servers: one connection per request, read without blocking as bytes arrive.

local Server = {}
Server.__index = Server

function Server:request(h)
  local conn, why = http.http_send(self.url, h.line, h.deadline or (ipc.now() + 30))
  if not conn then return finish(h, nil, tostring(why), "worker") end
  h.conn, h.buf, h.closed = conn, {}, false
  self.pending[h.id] = h
end

function Server:poll_one(h, deadline)
  local first = true
  while not h.closed do
    local chunk, why = h.conn:read_some(first and deadline or ipc.now())
    first = false
    if not chunk then
      if why == "timeout" then break end
      h.closed = true
      if why ~= "closed" then
        h.conn:close()
        self.pending[h.id] = nil
        return finish(h, nil, ("the server %s: %s"):format(self.url, why), "worker")
      end
    else
      h.buf[#h.buf + 1] = chunk
    end
  end
  local payload, why = http.parse_response(table.concat(h.buf), h.closed, self.max_line)
  if payload == nil and why == "incomplete" then return end
  h.conn:close()
  self.pending[h.id] = nil
  if not payload then return finish(h, nil, ("the server %s %s"):format(self.url, why), "worker") end
  local ok, v = pcall(cjson.decode, payload)
  if not ok or type(v) ~= "table" then
    return finish(h, nil, ("the server %s answered something that is not a JSON object: %s"):format(self.url, clip(payload, 200)), "worker")
  end
  if v.id ~= h.id and not (v.error ~= nil and (v.id == nil or v.id == cjson.null)) then
    return finish(h, nil, ("the server %s answered id %s to request id %d"):format(self.url, clip(cjson.encode(v.id), 40), h.id), "worker")
  end
  resolve(h, v)
end

function Server:poll(deadline)
  local n = 0
  for _ in pairs(self.pending) do n = n + 1 end
  for _, h in pairs(self.pending) do self:poll_one(h, n == 1 and deadline or nil) end
end

function Server:busy() return next(self.pending) ~= nil end

function Server:close()
  for id, h in pairs(self.pending) do
    h.conn:close()
    finish(h, nil, "the connection was closed", "worker")
    self.pending[id] = nil
  end
end

---------------------------------------------------------------------------------------------
-- The registry: a step's channels and what is on its way.

local Registry = {}
Registry.__index = Registry

function M.registry(opts)
  opts = opts or {}
  return setmetatable({ base = opts.base, max_line = opts.max_line or http.MAX_LINE_BYTES, channels = {}, handles = {},
    next_id = 0 }, Registry)
end

-- The channel of a spec: "py:FILE.py[:NAME]" (the file's worker), "cmd:...", "http://...".
function Registry:channel(spec, where)
  where = where or spec
  local key, ch
  if spec:match("^py:") then
    local file = spec:sub(4):match("^(.-%.py)") or spec:sub(4)
    if not spec:sub(4):match("^.-%.py:[%a_][%w_]*$") then
      error(("%s = %s: expected py:FILE.py:NAME (a function or class of the file)"):format(where, spec), 0)
    end
    file = M.py_target(spec, self.base, where)
    key = "py:" .. file
    ch = self.channels[key]
    if not ch then
      local python = os.getenv("REMAX_PYTHON") or "python3"
      ch = setmetatable({ spec = "py:" .. file, argv = { python, "-u", "-c", M.PY_HARNESS, file }, hello = true,
        pending = {}, starts = 0, max_line = self.max_line }, Worker)
    end
  elseif spec:match("^cmd:") then
    local command = spec:sub(5):match("^%s*(.-)%s*$")
    if command == "" then error(("%s = %s: expected cmd:PROGRAM [ARGS...]"):format(where, spec), 0) end
    key = spec
    ch = self.channels[key] or setmetatable({ spec = spec, argv = { "/bin/sh", "-c", command }, pending = {}, starts = 0,
      max_line = self.max_line }, Worker)
  elseif spec:match("^https?://") then
    local ok, err = pcall(http.parse_url, spec)
    if not ok then error(("%s: %s"):format(where, tostring(err)), 0) end
    key = spec
    ch = self.channels[key] or setmetatable({ url = spec, spec = spec, pending = {}, max_line = self.max_line }, Server)
  else
    error(("%s = %s: expected py:FILE.py:NAME, cmd:PROGRAM or http://HOST:PORT/PATH"):format(where, tostring(spec)), 0)
  end
  self.channels[key] = ch
  return ch
end

-- Sends obj (a table, given an id here) on ch: the handle. timeout: seconds (nil or 0: none).
function Registry:request(ch, obj, timeout)
  self.next_id = self.next_id + 1
  obj.id = self.next_id
  local h = { id = obj.id, t0 = ipc.now(), ch = ch, timeout = timeout }
  h.deadline = timeout and timeout > 0 and (h.t0 + timeout) or nil
  local ok, line = pcall(json.encode, obj)
  if not ok then finish(h, nil, "the request cannot be written as JSON: " .. tostring(line), "error") return h end
  h.line = line
  local ok2, err = pcall(ch.request, ch, h)
  if not ok2 then finish(h, nil, tostring(err), "worker") end
  if not h.done then   -- a worker's start-up is not the call's time
    h.t0 = ipc.now()
    if h.deadline then h.deadline = h.t0 + timeout end
  end
  self.handles[h.id] = h
  return h
end

-- Reads what has arrived on every channel and times out what is past its deadline. block_until:
-- when given and nothing has resolved yet, waits (until that time at the latest) for an answer
-- or a deadline. Returns the handles resolved by this call.
function Registry:poll(block_until)
  local resolved = {}
  local function sweep()
    local t = ipc.now()
    for id, h in pairs(self.handles) do
      if not h.done and h.deadline and t >= h.deadline then
        if h.ch.pending[id] then
          if h.conn then h.conn:close() end
          h.ch.pending[id] = nil
        end
        finish(h, nil, "timeout", "timeout")
      end
      if h.done then resolved[#resolved + 1] = h; self.handles[id] = nil end
    end
  end
  for _, ch in pairs(self.channels) do if ch:busy() then ch:poll(nil) end end
  sweep()
  while block_until and #resolved == 0 and next(self.handles) do
    local t = ipc.now()
    if t >= block_until then break end
    local until_ = block_until
    for _, h in pairs(self.handles) do if h.deadline and h.deadline < until_ then until_ = h.deadline end end
    local busy = {}
    for _, ch in pairs(self.channels) do if ch:busy() then busy[#busy + 1] = ch end end
    if #busy == 1 then
      busy[1]:poll(until_)   -- one channel: wait on it
    else
      ipc.sleep(math.min(0.002, math.max(0, until_ - t)))
      for _, ch in ipairs(busy) do ch:poll(nil) end
    end
    sweep()
  end
  return resolved
end

-- Waits for one handle (a blocking call: describe, reset, the last step).
function Registry:wait(h)
  while not h.done do self:poll(ipc.now() + 3600) end
  return h
end

function Registry:busy() return next(self.handles) ~= nil end

function Registry:close()
  for _, ch in pairs(self.channels) do pcall(ch.close, ch) end
  self.channels, self.handles = {}, {}
end

return M
