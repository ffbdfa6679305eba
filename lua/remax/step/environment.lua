-- remax.step.environment: a recipe's environment, for tasks that are not tools (a game, a code
-- sandbox, a simulated user). Two kinds, told apart by their methods:
--
-- remax's kind answers each assistant turn. A table (or a function(sample) returning one per
-- episode, a factory) with
--   reset(sample, state) -> the first messages (a string: one user message)
--   step(state, assistant_text) -> observation messages (or a string), done, reward (optional)
-- state is a table that belongs to one episode (reset fills it; nothing is shared between
-- episodes). Either function may be a coroutine body: a Lua environment that wants to keep its
-- place between turns can `coroutine.wrap` one and call it from step.
--
-- TRL's kind (its environment_factory) is an object per episode whose methods are the model's
-- tools. A class table (each episode gets setmetatable({}, {__index = class})) or a
-- function(sample) returning a new object, with
--   reset(self, sample, state) -> a string added to the end of the prompt's last message, or nil
--   tools = { name = { description =, parameters = }, ... }: the schemas of its tool methods,
--   each self:name(args) -> result
--   get_reward(self) -> the episode's reward (optional), asked for once the episode is over
-- An episode ends at a turn without a tool call. Rewards get the instances (batch.environments;
-- a Python reward in the environment's file as TRL's `environments=`).
--
-- state.seed is the prompt's seed, the same for every episode of a prompt (the greedy one too):
-- an environment that draws at random draws from it, so that a prompt's episodes play the same
-- game (remax.step.episodes stops when their first messages differ).
--
-- An environment outside Lua is a string: "py:FILE.py:CLASS" (one instance of the class per
-- episode, in the file's worker; its kind is asked of the worker at the start), "cmd:PROGRAM"
-- or "http://HOST:PORT/PATH" (remax's kind), spoken to with reset/step/get_reward/close requests
-- keyed by an episode id (remax.step.channels). Its reset and step are started here
-- (reset_start, step_start) and read when their answer came (reset_finish, step_finish), so
-- other rows keep decoding meanwhile.
local chat = require("remax.text.chat")
local remote = require("remax.step.channels")
local guard = require("remax.step.guard")

local M = {}

M.KINDS = "remax's environment (step = function(state, text) answering each turn) or TRL's environment_factory kind " ..
  "(reset(self, sample) and tools = { name = { description =, parameters = } }, each a method self:name(args))"

-- The function-valued keys of v and of its __index chain, sorted.
local function functions_of(v)
  local names, seen, t, depth = {}, {}, v, 0
  while type(t) == "table" and depth < 8 do
    for k, x in pairs(t) do
      if type(k) == "string" and type(x) == "function" and not seen[k] then seen[k] = true; names[#names + 1] = k end
    end
    local mt = getmetatable(t)
    t, depth = mt and type(mt.__index) == "table" and mt.__index or nil, depth + 1
  end
  table.sort(names)
  return names
end

-- Where v's functions are defined ("recipes/x.lua"), for messages.
local function file_of(v)
  for _, name in ipairs(functions_of(v)) do
    local info = debug.getinfo(v[name], "S")
    if info and info.source:sub(1, 1) == "@" then return info.source:sub(2) end
  end
  return nil
end

-- The kind of a Lua environment table: "remax", "trl", or an error naming what it has.
local function kind_of(v, where)
  if type(v.step) == "function" then
    if v.reset ~= nil and type(v.reset) ~= "function" then error(("%s.reset must be a function(sample, state) -> messages"):format(where), 0) end
    return "remax"
  end
  if type(v.reset) == "function" and type(v.tools) == "table" then return "trl" end
  local file = file_of(v)
  local names = functions_of(v)
  error(("%s%s is neither %s; it has %s%s"):format(where, file and (" (" .. file .. ")") or "", M.KINDS,
    #names > 0 and ("the functions " .. table.concat(names, ", ")) or "no functions",
    type(v.reset) == "function" and " (and no tools table)" or ""), 0)
end

-- A checked environment (a descriptor): kind ("remax" or "trl"; nil for a Lua factory until
-- M.resolve), and one of remote = { channel, name, spec, registry }, shared (a remax-kind
-- table every episode uses, with a state of its own), class (a TRL-kind class table), factory;
-- for the TRL kind, tools (the method schemas: Lua, the class's tools table; Python, the
-- worker's) and reward (it has get_reward). opts.registry (made when needed, returned second),
-- opts.base: as tools.check's.
function M.check(env, where, opts)
  where = where or "environment"
  opts = opts or {}
  if remote.is_spec(env) then
    opts.registry = opts.registry or remote.registry({ base = opts.base, max_line = opts.max_line })
    local ch = opts.registry:channel(env, where)
    local name = env:match("^py:") and env:match(":([%a_][%w_]*)$") or nil
    local d = { remote = { channel = ch, name = name, spec = env, registry = opts.registry }, episodes = 0, kind = "remax",
      where = ("%s = %s"):format(where, remote.display(env)) }
    if env:match("^py:") then   -- which kind the class is, and a TRL kind's tools
      local h = opts.registry:wait(opts.registry:request(ch, { type = "environment", name = name }, remote.START_TIMEOUT))
      if h.err then error(("%s: %s"):format(d.where, h.err), 0) end
      d.kind, d.class_name = h.value.kind, h.value.class
      if d.kind == "trl" then d.tools, d.reward = h.value.tools, h.value.reward == true end
    end
    return d, opts.registry
  end
  if type(env) == "function" then return { factory = env, where = where } end
  if type(env) ~= "table" then
    error(("%s must be a table {reset = function(sample, state), step = function(state, text)}, a TRL-kind class " ..
      "{reset = function(self, sample), tools = {...}}, or a function(sample) -> one, got %s"):format(where, type(env)), 0)
  end
  local kind = kind_of(env, where)
  if kind == "trl" then return { kind = "trl", class = env, tools = env.tools, reward = type(env.get_reward) == "function", where = where } end
  return { kind = "remax", shared = env, where = where }
end

-- A Lua environment's function under remax.step.guard: tool_timeout (timeout) bounds it, Ctrl-C
-- and SIGTERM stop it, os.exit is refused. Returns true and its results, or false and why.
local function call(what, fn, timeout, ...)
  local ok, a, b, c = guard.call(fn, { limit = timeout, what = "the environment's " .. what }, ...)
  if ok then return true, a, b, c end
  if a == guard.TIMEOUT then return false, ("took over tool_timeout = %g s"):format(timeout or 0) end
  return false, tostring(a)
end

-- A Lua factory's kind, from its first product (made from sample, the first prompt's row, and
-- dropped: TRL also makes one instance at the start to read its tools). Nothing for others.
function M.resolve(d, sample, timeout)
  if not d.factory or d.kind then return d end
  local ok, inst = call("factory", d.factory, timeout, sample)
  if not ok then error(("%s: the environment factory failed on the first row: %s"):format(d.where, tostring(inst)), 0) end
  if type(inst) ~= "table" then error(("%s: the environment factory returned a %s, expected an environment (a table)")
    :format(d.where, type(inst)), 0) end
  d.kind = kind_of(inst, d.where .. "'s product")
  if d.kind == "trl" then d.tools, d.reward, d.methods = inst.tools, type(inst.get_reward) == "function", inst end
  return d
end

-- The environment of one episode: a remote episode ({ remote, episode = id }), a Lua object, or
-- nil and why (a factory's product is checked here). timeout: tool_timeout.
function M.instance(d, sample, timeout)
  if d.remote then   -- one episode of a remote environment: its id names its state on the other side
    d.episodes = d.episodes + 1
    return { remote = d.remote, episode = ("e%d"):format(d.episodes) }
  end
  if d.class then return setmetatable({}, { __index = d.class }) end
  if d.shared then return d.shared end
  local ok, inst = call("factory", d.factory, timeout, sample)
  if not ok then return nil, "the environment factory failed: " .. tostring(inst) end
  if type(inst) ~= "table" then return nil, "the environment factory returned a " .. type(inst) end
  local ok2, kind = pcall(kind_of, inst, "the environment factory's result")
  if not ok2 then return nil, tostring(kind) end
  if d.kind and kind ~= d.kind then
    return nil, ("the environment factory's result is of %s kind, its first was of %s kind"):format(kind, d.kind)
  end
  return inst
end

-- Messages from what an environment returned: a string is one user message.
function M.messages(v, role)
  if v == nil then return {} end
  if type(v) == "string" then return { { role = role or "user", content = v } } end
  if type(v) == "table" and v.role then v = { v } end
  local ok, err = chat.check_messages(v)
  if not ok then return nil, err end
  return v
end

-- A TRL-kind reset's answer (a string or nil) -> the first messages: the row's prompt, with the
-- string added to the end of its last message, as TRL does.
function M.appended(sample, v)
  local prompt = sample.prompt
  if prompt == nil then prompt = { { role = "user", content = "" } } end
  local ok, msgs = pcall(chat.messages, prompt)
  if not ok then return nil, "the row's prompt: " .. tostring(msgs) end
  local out = {}
  for i, m in ipairs(msgs) do out[i] = m end
  if v == nil then return out end
  if type(v) ~= "string" then
    return nil, ("environment reset returned a %s; a TRL-kind reset returns a string (added to the end of the last " ..
      "message of the prompt) or nothing"):format(type(v))
  end
  local last = {}
  for k, x in pairs(out[#out]) do last[k] = x end
  last.content = last.content .. v
  out[#out] = last
  return out
end

-- The first messages of an episode of d in Lua (inst: M.instance's) -> messages or nil, error.
-- timeout: tool_timeout.
function M.reset(d, inst, sample, state, timeout)
  if d.kind == "trl" then
    local ok, v = call("reset", inst.reset, timeout, inst, sample, state)
    if not ok then return nil, "environment reset failed: " .. tostring(v) end
    return M.appended(sample, v)
  end
  if not inst.reset then return M.messages(sample.prompt) end
  local ok, msgs = call("reset", inst.reset, timeout, sample, state)
  if not ok then return nil, "environment reset failed: " .. tostring(msgs) end
  local m, err = M.messages(msgs)
  if not m or #m == 0 then return nil, "environment reset returned no messages" .. (err and (": " .. err) or "") end
  return m
end

-- A remote episode's reset: the handle (registry:request), then its first messages or nil, error.
-- seed: the prompt's seed (the request's "seed"; a Python reset that takes `seed` gets it).
function M.reset_start(inst, sample, registry, timeout, seed)
  local cols = {}
  for k, v in pairs(sample or {}) do if type(k) == "string" then cols[k] = v end end
  return registry:request(inst.remote.channel, { type = "reset", name = inst.remote.name, episode = inst.episode,
    sample = cols, seed = seed }, timeout)
end

local function remote_why(h, what, timeout)
  if h.kind == "timeout" then return ("environment %s timed out after %g s"):format(what, timeout) end
  return ("environment %s failed: %s"):format(what, h.err)
end

-- kind: the environment's ("trl": the answer is the string for the end of the prompt).
function M.reset_finish(h, sample, timeout, kind)
  if h.err then return nil, remote_why(h, "reset", timeout) end
  local v = h.value.messages
  if kind == "trl" then return M.appended(sample, v) end
  if v == nil then return M.messages(sample.prompt) end
  local m, err = M.messages(v)
  if not m or #m == 0 then return nil, "environment reset returned no messages" .. (err and (": " .. err) or "") end
  return m
end

function M.step_start(inst, text, registry, timeout)
  return registry:request(inst.remote.channel, { type = "step", name = inst.remote.name, episode = inst.episode,
    text = text }, timeout)
end

-- A remote step's answer -> observation messages, done, reward, error (as M.step).
function M.step_finish(h, timeout)
  if h.err then return nil, true, nil, remote_why(h, "step", timeout) end
  local v = h.value
  local m, err = M.messages(v.messages)
  if not m then return nil, true, nil, "environment step returned bad messages: " .. err end
  local reward = v.reward
  if reward ~= nil and type(reward) ~= "number" then
    return nil, true, nil, "environment step returned a reward of type " .. type(reward) .. ", expected a number"
  end
  return m, v.done == true, reward
end

-- A TRL-kind episode's get_reward: started (a handle, for one outside Lua) ...
function M.reward_start(inst, registry, timeout)
  if not inst.remote then return nil end
  return registry:request(inst.remote.channel, { type = "get_reward", name = inst.remote.name, episode = inst.episode }, timeout)
end

-- ... and read: the reward (a number or nil), or nil and why.
function M.reward_finish(inst, h, timeout)
  local v
  if h then
    if h.err then return nil, remote_why(h, "get_reward", timeout) end
    v = h.value.reward
  else
    local ok, r = call("get_reward", inst.get_reward, timeout, inst)
    if not ok then return nil, "environment get_reward failed: " .. tostring(r) end
    v = r
  end
  if v ~= nil and (type(v) ~= "number" or v ~= v) then
    return nil, ("environment get_reward returned %s, expected a number or nothing"):format(tostring(v))
  end
  return v
end

-- The end of a remote episode: its state on the other side is dropped (not waited for); a
-- remax-kind instance's close() is called, a TRL-kind one's is not (there it is a tool).
function M.close(inst, registry, kind)
  if inst and inst.remote and registry then registry:request(inst.remote.channel, { type = "close", name = inst.remote.name,
    episode = inst.episode, call = kind ~= "trl" }, 30) end
end

-- env.step -> observation messages, done, reward, error (an error ends the episode).
function M.step(env, state, text, registry, timeout)
  if env.remote then return M.step_finish(registry:wait(M.step_start(env, text, registry, timeout)), timeout) end
  local ok, obs, done, reward = call("step", env.step, timeout, state, text)
  if not ok then return nil, true, nil, "environment step failed: " .. tostring(obs) end
  local m, err = M.messages(obs)
  if not m then return nil, true, nil, "environment step returned bad messages: " .. err end
  if reward ~= nil and type(reward) ~= "number" then
    return nil, true, nil, "environment step returned a reward of type " .. type(reward) .. ", expected a number"
  end
  return m, done and true or false, reward
end

return M
