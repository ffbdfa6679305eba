-- remax.step.reward_worker: rewards computed outside Lua, by a long-lived worker process or a
-- reward server, spoken to in JSON. See docs/rewards.md ("Rewards in Python, or any program").
--
--   "py:rewards/verify.py"        the function `reward` of a Python file, called as TRL calls a
--                                 reward function: reward(completions=[...], prompts=[...], **columns)
--   "py:rewards/verify.py:name"   another function of that file
--   "cmd:PROGRAM ARGS..."         any program (run by /bin/sh) speaking the JSON-lines protocol
--   "http://HOST:PORT/PATH"       a reward server: one POST of the same JSON per batch
--   { worker = "<one of those>", name = "verify", weight = 0.5, accuracy = true }   (accuracy: evaluation's accuracy)
--
-- The protocol: per batch one line {"step": N, "completions": [...], "batch": {"prompt": [...],
-- ...every column the Lua rewards get...}} to the worker's stdin; it answers one line on stdout:
-- {"scores": [number|null, ...]} (a bare list is accepted), or {"error": "message"}. A worker that
-- dies is started again once per run; a second death, a timeout (reward_timeout), an answer that
-- is not that JSON or has the wrong count stops the run with the reward's name (after a
-- checkpoint, as a failing Lua reward does).
local ipc = require("remax.bind.ipc")
local cjson = require("cjson").new()
local json = require("remax.formats.json")

local M = {}

-- The Python side of "py:": loads the file, answers {"ready": true} (or the load error), then
-- calls the function once per request line. print() in the reward goes to stderr, so it cannot
-- corrupt the answers; Ctrl-C is the trainer's to handle (the worker is in its own process group).
M.PY_HARNESS = [[
import sys, json, os, signal, traceback, importlib.util, math
signal.signal(signal.SIGINT, signal.SIG_IGN)
proto = sys.stdout
sys.stdout = sys.stderr
path, name = sys.argv[1], sys.argv[2]
def answer(obj):
    proto.write(json.dumps(obj) + "\n")
    proto.flush()
try:
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    spec = importlib.util.spec_from_file_location("remax_reward_" + os.path.basename(path)[:-3].replace("-", "_"), path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    fn = getattr(mod, name, None)
    if not callable(fn):
        have = sorted(k for k, v in vars(mod).items() if callable(v) and not k.startswith("_"))
        raise LookupError("%s has no function '%s' (functions: %s)" % (path, name, ", ".join(have) or "none"))
except BaseException:
    answer({"error": "loading " + path + ": " + traceback.format_exc(limit=-3)})
    sys.exit(0)
answer({"ready": True})
for line in sys.stdin:
    try:
        req = json.loads(line)
        kw = dict(req.get("batch") or {})
        if "prompt" in kw:
            kw["prompts"] = kw.pop("prompt")
        scores = fn(completions=req["completions"], **kw)
        out = []
        for i, s in enumerate(list(scores)):
            if s is None:
                out.append(None)
            elif isinstance(s, (int, float)) and not isinstance(s, bool):
                out.append(float(s) if math.isfinite(s) else str(s))
            else:
                raise TypeError("score %d is %r (a %s); expected a number or None" % (i + 1, s, type(s).__name__))
        answer({"scores": out})
    except BaseException:
        answer({"error": traceback.format_exc(limit=-4)})
]]

function M.is_spec(spec)
  if type(spec) == "table" then return type(spec.worker) == "string" end
  return type(spec) == "string" and (spec:match("^py:") or spec:match("^cmd:") or spec:match("^https?://")) and true or false
end

local function file_exists(path)
  local f = io.open(path, "rb")
  if f then f:close() return true end
  return false
end

local function basename(p) return (p:match("([^/]+)$") or p) end

local function clip(s, n)
  s = tostring(s)
  n = n or 400
  return #s > n and (s:sub(1, n) .. "...") or s
end

-- The JSON of one request (the same for workers and servers).
local function request_json(completions, batch, step)
  local cols = {}
  for k, v in pairs(batch or {}) do
    if type(k) == "string" and type(v) == "table" then cols[k] = v end
  end
  return json.encode({ step = step or cjson.null, completions = completions, batch = cols })
end
M.request_json = request_json

-- One answer line/body -> scores (a Lua list with nil for null), or raises what is wrong.
local function parse_answer(text, n)
  local ok, v = pcall(cjson.decode, text)
  if not ok then error(("answered something that is not JSON: %s"):format(clip(text, 200)), 0) end
  if type(v) == "table" and v.error ~= nil then error(("reported an error: %s"):format(tostring(v.error)), 0) end
  local scores = type(v) == "table" and (v.scores or (v[1] ~= nil and v) or (next(v) == nil and v)) or nil
  if type(scores) ~= "table" then
    error(("answered %s; expected {\"scores\": [number|null, ...]}"):format(clip(text, 200)), 0)
  end
  local count = 0
  for k in pairs(scores) do if type(k) == "number" and k > count then count = k end end
  if count ~= n then error(("answered %d scores for %d completions"):format(count, n), 0) end
  local out = {}
  for i = 1, n do
    local s = scores[i]
    if s == cjson.null then s = nil end
    if type(s) == "string" then s = ({ NaN = 0 / 0, nan = 0 / 0, inf = math.huge, Infinity = math.huge,
      ["-inf"] = -math.huge, ["-Infinity"] = -math.huge })[s] or s end
    out[i] = s   -- numbers, nil, or whatever else came (rewards.run_one names a non-number)
  end
  return out
end
M.parse_answer = parse_answer

---------------------------------------------------------------------------------------------
-- Worker processes ("py:" and "cmd:").

local Worker = {}
Worker.__index = Worker

-- Seconds a worker may take to start (load its file), beside the per-batch timeout.
M.START_TIMEOUT = 120

function Worker:start()
  self.proc = ipc.spawn(self.argv)
  if self.hello then
    local line, why = self.proc:read_line(ipc.now() + M.START_TIMEOUT)
    if not line then
      local how = why
      if why == "closed" then
        self.proc:wait(1)
        local _, exit = self.proc:running()
        how = "it exited" .. (exit and (" (" .. exit .. ")") or "") .. " before it was ready; its error output is above"
      elseif why == "timeout" then
        how = ("it did not say it was ready within %g s"):format(M.START_TIMEOUT)
      end
      self:stop()
      error(("cannot start the worker: %s"):format(how), 0)
    end
    local ok, v = pcall(cjson.decode, line)
    if not ok or type(v) ~= "table" or not v.ready then
      self:stop()
      error(ok and type(v) == "table" and v.error and tostring(v.error) or ("started with %s"):format(clip(line, 200)), 0)
    end
  end
end

function Worker:stop()
  if self.proc then self.proc:close(0.2); self.proc = nil end
end

-- Sends a batch without waiting for the answer (receive reads it), so the worker scores while
-- the other rewards run, or while the next batch generates. Several batches may be on their way
-- (answered in order: the protocol is one line each). Never raises: what goes wrong is raised by
-- receive. A batch already sent (the same completions table) is not sent again.
function Worker:send(completions, batch, opts)
  for _, q in ipairs(self.queue) do if q.key == completions then return end end
  local p = { key = completions, n = #completions, timeout = opts and opts.timeout }
  self.queue[#self.queue + 1] = p
  local ok, err = pcall(function()
    p.req = request_json(completions, batch, opts and opts.step) .. "\n"
    self:transmit(p)
  end)
  if not ok then p.error = err end
end

function Worker:transmit(p)
  if not self.proc then self:start() end   -- starting has its own limit (START_TIMEOUT)
  p.deadline = p.timeout and p.timeout > 0 and (ipc.now() + p.timeout) or nil
  p.sent, p.why = self.proc:write(p.req, p.deadline)
end

-- The scores of the batch sent with these completions (answers to batches sent before it, which
-- nobody asked for after an earlier failure, are read and dropped).
function Worker:receive(key)
  local p
  repeat
    p = table.remove(self.queue, 1)
    if not p then error("internal: no batch was sent to this worker", 0) end
    if p.key ~= key then pcall(self.answer, self, p) end
  until p.key == key
  return self:answer(p)
end

-- Reads the answer to p, the oldest batch on its way.
function Worker:answer(p)
  if p.error then error(p.error, 0) end
  while true do
    local line, why = nil, p.why
    if p.sent then line, why = self.proc:read_line(p.deadline) end
    if line then return parse_answer(line, p.n) end
    if why == "timeout" then
      self.proc:kill()
      self:stop()
      self.queue = {}   -- what was sent after it went with the worker
      error(("took over reward_timeout = %g s scoring %d completions (the worker is stopped; make it faster, or raise reward_timeout, 0: no limit)")
        :format(p.timeout, p.n), 0)
    end
    -- the worker closed its end: it died
    self.proc:wait(1)
    local _, exit = self.proc:running()
    exit = exit or why
    self:stop()
    if self.restarts >= 1 then
      self.queue = {}
      error(("the worker died again (%s) after it was restarted once; its error output is above"):format(exit), 0)
    end
    self.restarts = self.restarts + 1
    io.stderr:write(("reward '%s': the worker died (%s); starting it again (once per run)\n"):format(self.name, exit))
    -- the new worker gets this batch and every later one still on its way, in order
    self:transmit(p)
    for _, q in ipairs(self.queue) do
      if not q.error then
        local ok, err = pcall(self.transmit, self, q)
        if not ok then q.error = err end
      end
    end
  end
end

-- One batch: the scores (the answer to an earlier send of the same completions, when there is one).
-- opts.timeout: seconds (nil or 0: no limit); opts.step goes into the request.
function Worker:call(completions, batch, opts)
  self:send(completions, batch, opts)   -- (nothing when it is on its way already)
  return self:receive(completions)
end

---------------------------------------------------------------------------------------------
-- Reward servers ("http://").

-- "http://host:port/path" -> host, port, path.
local function parse_url(url)
  if url:match("^https://") then
    error(("%s: https is not supported (the engine has no TLS); serve the reward on http:// (localhost, or through a local proxy)")
      :format(url), 0)
  end
  local host, port, path = url:match("^http://([^/:]+):?(%d*)(/?.*)$")
  if host and host:sub(1, 1) == "[" then host = nil end
  if not host then error(("%s: expected http://HOST[:PORT]/PATH"):format(url), 0) end
  return host, tonumber(port) or 80, path ~= "" and path or "/"
end
M.parse_url = parse_url

-- A chunked HTTP body, decoded.
local function dechunk(body)
  local out, pos = {}, 1
  while true do
    local size_hex, after = body:match("^(%x+)[^\r\n]*\r\n()", pos)
    if not size_hex then error("a chunked answer is cut short", 0) end
    local size = tonumber(size_hex, 16)
    if size == 0 then break end
    out[#out + 1] = body:sub(after, after + size - 1)
    pos = after + size + 2
  end
  return table.concat(out)
end

-- Connects and sends the POST: the connection, or nil, why, kind ("connect" | "timeout").
function M.http_send(url, body, deadline)
  local host, port, path = parse_url(url)
  local conn, why = ipc.connect(host, port, deadline)
  if not conn then
    return nil, ("cannot connect to %s:%d (%s)"):format(host, port, why), why == "connection timed out" and "timeout" or "connect"
  end
  local head = ("POST %s HTTP/1.1\r\nHost: %s:%d\r\nContent-Type: application/json\r\nContent-Length: %d\r\n" ..
    "Accept: application/json\r\nConnection: close\r\nUser-Agent: remax\r\n\r\n"):format(path, host, port, #body)
  local ok, werr = conn:write(head .. body, deadline)
  if not ok then
    conn:close()
    return nil, werr, werr == "timeout" and "timeout" or "connect"
  end
  return conn
end

-- Reads the answer on a connection: the body when the status is 2xx, or nil, why, kind
-- ("connect" | "timeout" | "answer").
function M.http_receive(conn, deadline)
  local resp, rerr = conn:read_all(deadline)
  conn:close()
  if not resp then return nil, rerr, rerr == "timeout" and "timeout" or "connect" end
  if resp == "" then return nil, "the server closed the connection without answering", "connect" end
  local status_line, headers, payload = resp:match("^([^\r\n]*)\r\n(.-)\r\n\r\n(.*)$")
  local code = status_line and tonumber(status_line:match("^HTTP/%d[%.%d]* (%d%d%d)"))
  if not code then return nil, ("answered something that is not HTTP: %s"):format(clip(resp, 200)), "answer" end
  if headers:lower():match("transfer%-encoding:%s*chunked") then
    local dok, decoded = pcall(dechunk, payload)
    if not dok then return nil, decoded, "answer" end
    payload = decoded
  else
    local len = tonumber(headers:lower():match("content%-length:%s*(%d+)"))
    if len and #payload < len then return nil, ("the answer is cut short (%d of %d bytes)"):format(#payload, len), "answer" end
    if len then payload = payload:sub(1, len) end
  end
  if code < 200 or code > 299 then
    return nil, ("answered %s: %s"):format(status_line, clip(payload, 300)), "answer"
  end
  return payload
end

function M.http_post(url, body, deadline)
  local conn, why, kind = M.http_send(url, body, deadline)
  if not conn then return nil, why, kind end
  return M.http_receive(conn, deadline)
end

local Server = {}
Server.__index = Server

-- Sends a batch (connects and posts) without waiting for the answer; never raises. Each batch on
-- its way has its own connection. A batch already sent is not sent again.
function Server:send(completions, batch, opts)
  for _, q in ipairs(self.queue) do if q.key == completions then return end end
  local timeout = opts and opts.timeout
  local p = { key = completions, n = #completions, timeout = timeout,
    deadline = timeout and timeout > 0 and (ipc.now() + timeout) or nil }
  self.queue[#self.queue + 1] = p
  local ok, err = pcall(function()
    p.body = request_json(completions, batch, opts and opts.step)
    p.conn, p.why, p.kind = M.http_send(self.url, p.body, p.deadline)
  end)
  if not ok then p.error = err end
end

-- The scores of the batch sent with these completions. A connection that fails (refused, reset,
-- closed without an answer) is tried once more; a timeout or a bad answer stops at once.
-- Batches sent before it and never asked for (after an earlier failure) are dropped.
function Server:receive(key)
  local p
  repeat
    p = table.remove(self.queue, 1)
    if not p then error("internal: no batch was sent to this server", 0) end
    if p.key ~= key and p.conn then p.conn:close() end
  until p.key == key
  if p.error then error(p.error, 0) end
  for attempt = 1, 2 do
    local payload, why, kind = nil, p.why, p.kind
    if p.conn then payload, why, kind = M.http_receive(p.conn, p.deadline) end
    if payload then return parse_answer(payload, p.n) end
    if kind == "timeout" then
      error(("took over reward_timeout = %g s scoring %d completions (make the server faster, or raise reward_timeout, 0: no limit)")
        :format(p.timeout, p.n), 0)
    end
    if kind ~= "connect" or attempt == 2 then
      error(why .. (attempt == 2 and " (tried twice)" or ""), 0)
    end
    ipc.sleep(0.2)   -- a short pause before the second try
    p.conn, p.why, p.kind = M.http_send(self.url, p.body, p.deadline)
  end
end

function Server:call(completions, batch, opts)
  self:send(completions, batch, opts)
  return self:receive(completions)
end

---------------------------------------------------------------------------------------------
-- The reward entry.

-- A "py:" file given relative to the recipe is found there too.
local function find_py(path, base)
  if file_exists(path) then return path end
  local tried = { path }
  if base then
    for _, p in ipairs({ base .. "/" .. path, base .. "/../" .. path }) do
      if file_exists(p) then return p end
      tried[#tried + 1] = p
    end
  end
  error(("reward py:%s: no such file (looked at %s)"):format(path, table.concat(tried, ", ")), 0)
end

-- spec (string or {worker =, name =, weight =}) -> a reward {name=, fn=, where=, external=true,
-- close=, reload=}. opts.base: the recipe's folder.
function M.reward(spec, opts)
  opts = opts or {}
  local s, name, weight, accuracy = spec, nil, nil, nil
  if type(spec) == "table" then s, name, weight, accuracy = spec.worker, spec.name, spec.weight, spec.accuracy end
  local r = { where = s, weight = weight, external = true, accuracy = accuracy }
  local impl
  if s:match("^py:") then
    local rest = s:sub(4)
    local file, fname = rest:match("^(.-%.py):([%a_][%w_]*)$")
    file = file or rest
    if not file:match("%.py$") then error(("reward %s: expected py:FILE.py or py:FILE.py:FUNCTION"):format(s), 0) end
    file = find_py(file, opts.base)
    r.name = name or fname or basename(file):gsub("%.py$", "")
    r.path = file
    local python = os.getenv("REMAX_PYTHON") or "python3"
    impl = setmetatable({ argv = { python, "-u", "-c", M.PY_HARNESS, file, fname or "reward" }, hello = true,
      restarts = 0, name = r.name, queue = {} }, Worker)
  elseif s:match("^cmd:") then
    local command = s:sub(5):match("^%s*(.-)%s*$")
    if command == "" then error(("reward %s: expected cmd:PROGRAM [ARGS...]"):format(s), 0) end
    local last
    for word in command:gmatch("%S+") do if not word:match("^%-") then last = word end end
    r.name = name or (basename(last or "cmd"):gsub("%.%w+$", ""))
    impl = setmetatable({ argv = { "/bin/sh", "-c", command }, restarts = 0, name = r.name, queue = {} }, Worker)
  else
    local host, port, path = parse_url(s)
    r.name = name or ((path:match("([^/]+)/*$") or host):gsub("[^%w_%-%.]", "_"))
    impl = setmetatable({ url = s, name = r.name, queue = {} }, Server)
    r.url = s
  end
  if type(r.name) ~= "string" or r.name == "" then error(("reward %s: name must be a non-empty string"):format(s), 0) end
  r.impl = impl
  -- fn is what every reward has: (completions, batch) -> scores; a third argument carries the
  -- timeout and step (rewards.run_one passes them)
  r.fn = function(completions, batch, o) return impl:call(completions, batch, o) end
  -- send: start scoring now, fn collects the answer (rewards.score sends to every worker first)
  r.send = function(completions, batch, o) impl:send(completions, batch, o) end
  r.close = function()
    if impl.stop then impl:stop() end
    impl.queue = {}
  end
  r.reload = function()
    return M.reward(spec, opts)
  end
  return r
end

return M
