-- remax.step.environment: a recipe's environment, for tasks that are not tools (a game, a code
-- sandbox, a simulated user). An environment is a table (or a function(sample) returning one, a
-- factory as TRL's environment_factory) with
--   reset(sample, state) -> the first messages (a string: one user message)
--   step(state, assistant_text) -> observation messages (or a string), done, reward (optional)
-- state is a table that belongs to one episode (reset fills it; nothing is shared between
-- episodes). state.seed is the prompt's seed, the same for every episode of a prompt (the
-- greedy one too): an environment that draws at random draws from it, so that a prompt's
-- episodes play the same game (remax.step.episodes stops when their first messages differ). Either function may be a coroutine body: a Lua environment that wants to keep its
-- place between turns can `coroutine.wrap` one and call it from step.
--
-- An environment outside Lua is a string: "py:FILE.py:CLASS" (one instance of the class per
-- episode, in the file's worker), "cmd:PROGRAM" or "http://HOST:PORT/PATH", spoken to with
-- reset/step/close requests keyed by an episode id (remax.step.channels). Its reset and step are
-- started here (reset_start, step_start) and read when their answer came (reset_finish,
-- step_finish), so other rows keep decoding meanwhile.
local chat = require("remax.text.chat")
local remote = require("remax.step.channels")
local guard = require("remax.step.guard")

local M = {}

-- opts.registry (made when needed, returned second), opts.base: as tools.check's.
function M.check(env, where, opts)
  where = where or "environment"
  opts = opts or {}
  if remote.is_spec(env) then
    opts.registry = opts.registry or remote.registry({ base = opts.base, max_line = opts.max_line })
    local ch = opts.registry:channel(env, where)
    local name = env:match("^py:") and env:match(":([%a_][%w_]*)$") or nil
    return { remote = { channel = ch, name = name, spec = env }, episodes = 0 }, opts.registry
  end
  if type(env) == "function" then return { factory = env } end
  if type(env) ~= "table" then
    error(("%s must be a table {reset = function(sample, state), step = function(state, text)} or a function(sample) -> one, got %s")
      :format(where, type(env)), 0)
  end
  if type(env.step) ~= "function" then error(("%s.step must be a function(state, assistant_text) -> messages, done, reward"):format(where), 0) end
  if env.reset ~= nil and type(env.reset) ~= "function" then error(("%s.reset must be a function(sample, state) -> messages"):format(where), 0) end
  return env
end

-- A Lua environment's function under remax.step.guard: tool_timeout (timeout) bounds it, Ctrl-C
-- and SIGTERM stop it, os.exit is refused. Returns true and its results, or false and why.
local function call(what, fn, timeout, ...)
  local ok, a, b, c = guard.call(fn, { limit = timeout, what = "the environment's " .. what }, ...)
  if ok then return true, a, b, c end
  if a == guard.TIMEOUT then return false, ("took over tool_timeout = %g s"):format(timeout) end
  return false, tostring(a)
end

-- The environment of one episode (a factory's product is checked here). timeout: tool_timeout.
function M.instance(env, sample, timeout)
  if env.remote then   -- one episode of a remote environment: its id names its state on the other side
    env.episodes = env.episodes + 1
    return { remote = env.remote, episode = ("e%d"):format(env.episodes) }
  end
  if env.factory then
    local ok, inst = call("factory", env.factory, timeout, sample)
    if not ok then return nil, "the environment factory failed: " .. tostring(inst) end
    local ok2, err = pcall(M.check, inst, "the environment factory's result")
    if not ok2 then return nil, tostring(err) end
    return inst
  end
  return env
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

-- env.reset -> (messages or nil, error). timeout: tool_timeout.
function M.reset(env, sample, state, timeout)
  if not env.reset then return M.messages(sample.prompt) end
  local ok, msgs = call("reset", env.reset, timeout, sample, state)
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

function M.reset_finish(h, sample, timeout)
  if h.err then return nil, remote_why(h, "reset", timeout) end
  local v = h.value.messages
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

-- The end of a remote episode: its state on the other side is dropped (not waited for).
function M.close(inst, registry)
  if inst and inst.remote and registry then registry:request(inst.remote.channel, { type = "close", name = inst.remote.name,
    episode = inst.episode }, 30) end
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
