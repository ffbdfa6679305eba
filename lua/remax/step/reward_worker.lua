-- remax.step.reward_worker: rewards computed outside Lua, by a long-lived worker process or a
-- reward server, spoken to in JSON. See docs/rewards.md ("Rewards in Python, or any program").
--
--   "py:rewards/verify.py"        the function `reward` of a Python file, called as TRL calls a
--                                 reward function: reward(completions=[...], prompts=[...],
--                                 trainer_state=..., **columns)
--   "py:rewards/verify.py:name"   another function of that file
--   "cmd:PROGRAM ARGS..."         any program (run by /bin/sh) speaking the JSON-lines protocol
--   "http://HOST:PORT/PATH"       a reward server: one POST of the same JSON per batch
--   { worker = "<one of those>", name = "verify", weight = 0.5, accuracy = true }   (accuracy: evaluation's accuracy)
--
-- The protocol: per batch one line {"id": N, "step": N, "trainer_state": {...}, "completions":
-- [...], "batch": {"prompt": [...], ...every column the Lua rewards get...}} to the worker's
-- stdin; it answers one line on stdout: {"id": N, "scores": [number|null, ...]}, or {"id": N,
-- "error": "message"}. The id (a count per reward, from 1) must come back: an answer without it,
-- or to another request (a program that answers twice, or out of order), stops the run. A worker
-- that dies is started again once per run; a second death, a timeout (reward_timeout), a line
-- longer than reward_max_line_bytes, an answer that is not that JSON or has the wrong count
-- stops the run with the reward's name (after a checkpoint, as a failing Lua reward does).
local ipc = require("remax.bind.ipc")
local cjson = require("cjson").new()
local json = require("remax.formats.json")
local fs = require("remax.bind.fs")

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
class TrainerState:
    """The run's state under transformers' TrainerState names (what TRL passes as trainer_state)."""
    def __init__(self, d):
        self.__dict__.update(d or {})
    def __repr__(self):
        return "TrainerState(%s)" % ", ".join("%s=%r" % kv for kv in sorted(self.__dict__.items()))
for line in sys.stdin:
    rid = None
    try:
        req = json.loads(line)
        rid = req.get("id")
        kw = dict(req.get("batch") or {})
        if "prompt" in kw:
            kw["prompts"] = kw.pop("prompt")
        kw["trainer_state"] = TrainerState(req.get("trainer_state"))
        scores = fn(completions=req["completions"], **kw)
        out = []
        for i, s in enumerate(list(scores)):
            if s is None:
                out.append(None)
            elif isinstance(s, (int, float)) and not isinstance(s, bool):
                out.append(float(s) if math.isfinite(s) else str(s))
            else:
                raise TypeError("score %d is %r (a %s); expected a number or None" % (i + 1, s, type(s).__name__))
        answer({"id": rid, "scores": out})
    except BaseException:
        answer({"id": rid, "error": traceback.format_exc(limit=-4)})
]]

function M.is_spec(spec)
  if type(spec) == "table" then return type(spec.worker) == "string" end
  return type(spec) == "string" and (spec:match("^py:") or spec:match("^cmd:") or spec:match("^https?://")) and true or false
end

local function basename(p) return (p:match("([^/]+)$") or p) end

local function clip(s, n)
  s = tostring(s)
  n = n or 400
  return #s > n and (s:sub(1, n) .. "...") or s
end

-- The JSON of one request (the same for workers and servers). state: the run's state under
-- TRL's trainer_state names (rewards.trainer_state), nil when there is none.
local function request_json(completions, batch, step, id, state)
  local cols = {}
  for k, v in pairs(batch or {}) do
    if type(k) == "string" and type(v) == "table" then cols[k] = v end
  end
  local st = {}
  for k, v in pairs(state or {}) do st[k] = v end
  if st.global_step == nil then st.global_step = step or 0 end
  return json.encode({ id = id or cjson.null, step = step or cjson.null, trainer_state = st,
    completions = completions, batch = cols })
end
M.request_json = request_json

-- One answer line/body -> scores (a Lua list with nil for null), or raises what is wrong. id:
-- the request's id, which the answer must carry (nil: not checked).
local function parse_answer(text, n, id)
  if text:match("^%s*$") then
    error(("answered %s; expected {\"id\": %s, \"scores\": [number|null, ...]}")
      :format(text == "" and "nothing (an empty answer)" or "only white space", tostring(id or "N")), 0)
  end
  local ok, v = pcall(cjson.decode, text)
  if not ok then error(("answered something that is not JSON: %s"):format(clip(text, 200)), 0) end
  if type(v) ~= "table" then
    error(("answered %s; expected {\"id\": %s, \"scores\": [number|null, ...]}"):format(clip(text, 200), tostring(id or "N")), 0)
  end
  if id ~= nil then
    local got = v.id
    if got == nil or got == cjson.null then
      if v.error ~= nil then error(("reported an error: %s"):format(tostring(v.error)), 0) end
      error(("answered without the request's id (%s): each answer must echo the \"id\" of its request, as {\"id\": %s, \"scores\": [...]}; got %s")
        :format(tostring(id), tostring(id), clip(text, 200)), 0)
    end
    if got ~= id then
      error(("answered id %s to request id %s: the answers are out of step with the requests (an answer sent twice, or one missing); the scores would belong to another batch")
        :format(clip(cjson.encode(got), 40), tostring(id)), 0)
    end
  end
  if v.error ~= nil then error(("reported an error: %s"):format(tostring(v.error)), 0) end
  local scores = v.scores or (id == nil and (v[1] ~= nil and v or (next(v) == nil and v))) or nil
  if type(scores) ~= "table" then
    error(("answered %s; expected {\"id\": %s, \"scores\": [number|null, ...]}"):format(clip(text, 200), tostring(id or "N")), 0)
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
  self.next_id = (self.next_id or 0) + 1
  local p = { key = completions, n = #completions, timeout = opts and opts.timeout, id = self.next_id }
  self.queue[#self.queue + 1] = p
  local ok, err = pcall(function()
    p.req = request_json(completions, batch, opts and opts.step, p.id, opts and opts.state) .. "\n"
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
  local p, earlier
  repeat
    p = table.remove(self.queue, 1)
    if not p then
      -- an earlier batch's failure stopped the worker, and this batch went with it
      error(earlier or "internal: no batch was sent to this worker", 0)
    end
    if p.key ~= key then
      local ok, err = pcall(self.answer, self, p)
      if not ok then earlier = tostring(err) end
    end
  until p.key == key
  return self:answer(p)
end

-- Reads the answer to p, the oldest batch on its way.
function Worker:answer(p)
  if p.error then error(p.error, 0) end
  while true do
    local line, why = nil, p.why
    if p.sent then line, why = self.proc:read_line(p.deadline, self.max_line) end
    if line then
      local ok, scores = pcall(parse_answer, line, p.n, p.id)
      if ok then return scores end
      if tostring(scores):match("^answered id ") or tostring(scores):match("^answered without the request's id") then
        -- out of step: every later answer would be another batch's; start afresh
        self.proc:kill()
        self:stop()
        self.queue = {}
      end
      error(scores, 0)
    end
    if why == "too long" then
      self.proc:kill()
      self:stop()
      self.queue = {}
      error(("answered a line longer than reward_max_line_bytes = %d bytes without ending it (the worker is stopped; raise reward_max_line_bytes if the answers are meant to be that long)")
        :format(self.max_line), 0)
    end
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

local http = require("remax.step.reward_http")
local parse_url = http.parse_url
M.parse_url, M.http_send, M.http_receive, M.http_post = http.parse_url, http.http_send, http.http_receive, http.http_post

local Server = {}
Server.__index = Server

-- Sends a batch (connects and posts) without waiting for the answer; never raises. Each batch on
-- its way has its own connection. A batch already sent is not sent again.
function Server:send(completions, batch, opts)
  for _, q in ipairs(self.queue) do if q.key == completions then return end end
  local timeout = opts and opts.timeout
  self.next_id = (self.next_id or 0) + 1
  local p = { key = completions, n = #completions, timeout = timeout, id = self.next_id,
    deadline = timeout and timeout > 0 and (ipc.now() + timeout) or nil }
  self.queue[#self.queue + 1] = p
  local ok, err = pcall(function()
    p.body = request_json(completions, batch, opts and opts.step, p.id, opts and opts.state)
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
    if p.conn then payload, why, kind = M.http_receive(p.conn, p.deadline, self.max_line) end
    if payload then return parse_answer(payload, p.n, p.id) end
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

-- The most bytes of one answer line (a cmd: or py: worker) or body (a server): the setting
-- reward_max_line_bytes, this when unset.
M.MAX_LINE_BYTES = http.MAX_LINE_BYTES   -- 4 MiB

-- Interpreters whose first file argument names a cmd: reward ("python3 score.py" is "score").
local INTERPRETERS = { sh = true, bash = true, dash = true, zsh = true, ksh = true, env = true, exec = true,
  python = true, python2 = true, python3 = true, pypy = true, pypy3 = true, node = true, deno = true, bun = true,
  ruby = true, perl = true, php = true, lua = true, luajit = true, Rscript = true, julia = true, java = true,
  nice = true, nohup = true, uv = true, run = true }

-- The name of a cmd: reward: its program's file name without the extension (the script's,
-- when the program is an interpreter), never an argument after it.
function M.program_name(command)
  local words = {}
  for w in command:gmatch("%S+") do words[#words + 1] = (w:gsub("^[\"']", ""):gsub("[\"']$", "")) end
  local i = 1
  while words[i] and words[i]:match("^[%a_][%w_]*=") do i = i + 1 end   -- VAR=value before the program
  local program = words[i]
  if not program then return "cmd" end
  local function stem(w) return (basename(w):gsub("%.[%w]+$", "")) end
  local b = basename(program)
  if INTERPRETERS[b] or b:match("^python%d[%.%d]*$") then
    local j = i + 1
    while words[j] do
      local w = words[j]
      if w == "-m" and words[j + 1] then return (words[j + 1]:gsub("^.*%.", "")) end
      if w == "-c" or w == "-e" then return stem(program) end   -- inline code: the interpreter
      if not w:match("^%-") and not w:match("^[%a_][%w_]*=") and not INTERPRETERS[basename(w)] then return stem(w) end
      j = j + 1
    end
  end
  local n = stem(program)
  return n ~= "" and n or "cmd"
end

-- A "py:" file given relative to the recipe is found there too (beside it, or one folder up):
-- the path found, or nil and the paths tried. Tools and environments (remax.step.remote) use it.
function M.find_file(path, base)
  if fs.exists(path) then return path end
  local tried = { path }
  for _, p in ipairs(base and { base .. "/" .. path, base .. "/../" .. path } or {}) do
    if fs.exists(p) then return p end
    tried[#tried + 1] = p
  end
  return nil, tried
end

local function find_py(path, base)
  local found, tried = M.find_file(path, base)
  if found then return found end
  error(("reward py:%s: no such file (looked at %s)"):format(path, table.concat(tried, ", ")), 0)
end

-- spec (string or {worker =, name =, weight =}) -> a reward {name=, fn=, where=, external=true,
-- close=, reload=}. opts.base: the recipe's folder.
function M.reward(spec, opts)
  opts = opts or {}
  local s, name, weight, accuracy = spec, nil, nil, nil
  if type(spec) == "table" then s, name, weight, accuracy = spec.worker, spec.name, spec.weight, spec.accuracy end
  local r = { where = s, weight = weight, external = true, accuracy = accuracy }
  local max_line = opts.max_line_bytes or M.MAX_LINE_BYTES
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
      restarts = 0, name = r.name, queue = {}, max_line = max_line }, Worker)
  elseif s:match("^cmd:") then
    local command = s:sub(5):match("^%s*(.-)%s*$")
    if command == "" then error(("reward %s: expected cmd:PROGRAM [ARGS...]"):format(s), 0) end
    r.name = name or M.program_name(command)
    impl = setmetatable({ argv = { "/bin/sh", "-c", command }, restarts = 0, name = r.name, queue = {},
      max_line = max_line }, Worker)
  else
    local host, port, path = parse_url(s)
    r.name = name or ((path:match("([^/]+)/*$") or host):gsub("[^%w_%-%.]", "_"))
    impl = setmetatable({ url = s, name = r.name, queue = {}, max_line = max_line }, Server)
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
