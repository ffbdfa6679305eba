-- remax.step.environment: a recipe's environment, for tasks that are not tools (a game, a code
-- sandbox, a simulated user). An environment is a table (or a function(sample) returning one, a
-- factory as TRL's environment_factory) with
--   reset(sample, state) -> the first messages (a string: one user message)
--   step(state, assistant_text) -> observation messages (or a string), done, reward (optional)
-- state is a table that belongs to one episode (reset fills it; nothing is shared between
-- episodes). Either function may be a coroutine body: a Lua environment that wants to keep its
-- place between turns can `coroutine.wrap` one and call it from step.
local chat = require("remax.text.chat")

local M = {}

function M.check(env, where)
  where = where or "environment"
  if type(env) == "function" then return { factory = env } end
  if type(env) ~= "table" then
    error(("%s must be a table {reset = function(sample, state), step = function(state, text)} or a function(sample) -> one, got %s")
      :format(where, type(env)), 0)
  end
  if type(env.step) ~= "function" then error(("%s.step must be a function(state, assistant_text) -> messages, done, reward"):format(where), 0) end
  if env.reset ~= nil and type(env.reset) ~= "function" then error(("%s.reset must be a function(sample, state) -> messages"):format(where), 0) end
  return env
end

-- The environment of one episode (a factory's product is checked here).
function M.instance(env, sample)
  if env.factory then
    local ok, inst = pcall(env.factory, sample)
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

-- env.reset -> (messages or nil, error).
function M.reset(env, sample, state)
  if not env.reset then return M.messages(sample.prompt) end
  local ok, msgs = pcall(env.reset, sample, state)
  if not ok then return nil, "environment reset failed: " .. tostring(msgs) end
  local m, err = M.messages(msgs)
  if not m or #m == 0 then return nil, "environment reset returned no messages" .. (err and (": " .. err) or "") end
  return m
end

-- env.step -> observation messages, done, reward, error (an error ends the episode).
function M.step(env, state, text)
  local ok, obs, done, reward = pcall(env.step, state, text)
  if not ok then return nil, true, nil, "environment step failed: " .. tostring(obs) end
  local m, err = M.messages(obs)
  if not m then return nil, true, nil, "environment step returned bad messages: " .. err end
  if reward ~= nil and type(reward) ~= "number" then
    return nil, true, nil, "environment step returned a reward of type " .. type(reward) .. ", expected a number"
  end
  return m, done and true or false, reward
end

return M
