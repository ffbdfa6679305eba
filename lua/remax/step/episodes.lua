-- remax.step.episodes: multi-turn rollouts. Each row of the sampling plan is an episode: the
-- model writes a turn, a tool call runs or the environment answers, the observation's tokens
-- are appended to the same KV cache (model:generate's on_turn_end, the engine's
-- rx_generate_continue), and the model goes on; the prompt and earlier turns are never
-- recomputed. The greedy row of a ReMax plan is a greedy episode (greedy in every turn against
-- the same environment): its reward is the baseline.
--
--   local ro = episodes.rollout(step, prompt_rows, {step = n, plan = plan})   -- a remax.step.rollout
--
-- Token in, token out: the model's tokens are kept as sampled, never re-tokenized; an
-- observation's tokens are the text the chat template adds for the new messages (render the
-- conversation before and after, take the suffix), tokenized alone. Each row's `tokens` are the
-- whole episode after the prompt, `loss_mask[t]` 1 for the model's own tokens and 0 for the
-- observations' (context: no loss, no KL, zero gradient). docs/environments.md.
local chat = require("remax.text.chat")
local tools_mod = require("remax.step.tools")
local tool_calls = require("remax.step.tool_calls")
local environment = require("remax.step.environment")
local rollout = require("remax.step.rollout")
local turns = require("remax.bind.turns")
local now = require("remax.bind.clock").now

local M = {}

-- Whether the settings ask for episodes.
function M.wanted(cfg) return cfg.tools ~= nil or cfg.environment ~= nil end

-- The checked tools and environment of a step (once).
function M.setup(step)
  if step.episode_setup then return step.episode_setup end
  local cfg = step.cfg
  -- tools and environments outside Lua share one registry of workers and servers
  local ropts = { base = step.recipe_dir, max_line = cfg.reward_max_line_bytes }
  local s = { tools = cfg.tools and tools_mod.check(cfg.tools, "tools", ropts) or nil,
    env = cfg.environment and environment.check(cfg.environment, "environment", ropts) or nil }
  s.registry = ropts.registry
  s.format = cfg.tool_call_format or tool_calls.format_for(step.template_name)
  step.episode_setup = s
  return s
end

-- The template options with the tools in its `tools` variable (the model sees them as at inference).
local function template_opts(step, tools, add_generation_prompt)
  local o = {}
  for k, v in pairs(step.template or {}) do o[k] = v end
  o.tokenizer = o.tokenizer or step.tok
  o.add_generation_prompt = add_generation_prompt
  if tools then
    local args = {}
    for k, v in pairs(o.template_args or {}) do args[k] = v end
    args.tools = tools_mod.schemas(tools)
    o.template_args = args
  end
  return o
end

local function concat(a, b, c)
  local out = {}
  for _, l in ipairs({ a, b or {}, c or {} }) do for _, m in ipairs(l) do out[#out + 1] = m end end
  return out
end

-- The text of the observation after an assistant turn: what the template writes after the
-- assistant's content when the new messages follow it (its end marker, less what the model wrote
-- of it: `model_end`, the text of its stop token; then the new messages and the next generation
-- prompt). The content itself is never rendered again: the model's tokens stay as sampled. A
-- template that rewrites earlier turns (Qwen3 drops an old turn's empty <think> block) changes
-- only text before the turn, which the KV cache already holds as the model saw it.
function M.observation_text(render, before, assistant, new_msgs, model_end)
  local MARK = "\1remax-content\1"
  local marked = render(concat(before, { { role = "assistant", content = MARK } }, new_msgs), true)
  local at, last = nil, 0
  repeat at = marked:find(MARK, last + 1, true); if at then last = at end until not at
  if last == 0 then error("the chat template drops the assistant's content: cannot find where an observation begins", 0) end
  local after = marked:sub(last + #MARK)
  if model_end and model_end ~= "" then
    if after:sub(1, #model_end) == model_end then after = after:sub(#model_end + 1) end
  end
  return after
end

-- An episode's counters, all zero.
local function new_episode(messages, state, env)
  return { messages = messages, state = state, env = env, turns = 0, tool_calls = 0, tool_errors = 0, tool_time = 0,
    errors = {}, reward = nil, turn_rewards = {}, obs = {}, model_tokens = 0, obs_tokens = 0, env_errors = 0 }
end

-- An environment's answer to a turn -> its observation, done (an error ends the episode).
local function env_answer(ep, obs, done, reward, err)
  if err then
    ep.env_errors = ep.env_errors + 1
    ep.env_error = err
    return nil, true
  end
  if reward then
    ep.reward = (ep.reward or 0) + reward
    ep.turn_rewards[#ep.turn_rewards + 1] = reward
  end
  return obs, done
end

-- Starts the observation of one turn: the tool calls when the turn calls tools, else the
-- environment's step. Lua tools and environments answer now; those outside Lua answer later
-- (job_ready, then job_finish), while the other rows decode.
local function observe_start(s, ep, text, timeout)
  if s.tools then
    local calls = tool_calls.parse(text, s.format)
    if #calls > 0 then
      local started = {}
      for i, call in ipairs(calls) do started[i] = { name = call.name, p = tools_mod.start(s.tools, call, timeout, s.registry) } end
      return { calls = started }
    end
  end
  if ep.env then
    if ep.env.remote then return { env = environment.step_start(ep.env, text, s.registry, timeout) } end
    return { obs = { env_answer(ep, environment.step(ep.env, ep.state, text)) } }
  end
  return { obs = { nil, true } }   -- tools only, and no call: the answer
end

local function job_ready(job)
  if job.calls then
    for _, c in ipairs(job.calls) do if not (c.p.done or c.p.handle.done) then return false end end
    return true
  end
  return not job.env or job.env.done
end

-- A ready job -> the observation messages, done; the episode's counters updated.
local function job_finish(ep, job, timeout)
  if job.calls then
    local msgs = {}
    for _, c in ipairs(job.calls) do
      local result, ok, seconds, kind = tools_mod.collect(c.p)
      ep.tool_calls, ep.tool_time = ep.tool_calls + 1, ep.tool_time + seconds
      if not ok then
        ep.tool_errors = ep.tool_errors + 1
        ep.errors[kind] = (ep.errors[kind] or 0) + 1
      end
      msgs[#msgs + 1] = { role = "tool", content = result, name = c.name }
    end
    return msgs, false
  end
  if job.env then return env_answer(ep, environment.step_finish(job.env, timeout)) end
  return job.obs[1], job.obs[2]
end

-- The rollout of a plan's rows as episodes; the same shape as Step:rollout's, each row with
-- tokens (the episode after the prompt), loss_mask, text (the last assistant message), messages
-- (the episode after the prompt), and its counters.
function M.rollout(step, prompt_rows, opts)
  opts = opts or {}
  local cfg = step.cfg
  local s = M.setup(step)
  local plan = opts.plan or cfg.sampling
  local slots = plan.slots
  local tok = step.tok
  local max_turns = cfg.max_turns or 4
  local max_episode = cfg.max_episode_length
  local timeout = cfg.tool_timeout or 10
  local render = function(msgs, gen) return chat.render(msgs, template_opts(step, s.tools, gen)) end
  local prompt_ids, prompts_truncated, eps, first = {}, 0, {}, {}
  -- each slot is its own episode with its own state, all from the same first messages; the
  -- resets of an environment outside Lua are all sent first, then read
  local resets = {}
  for i, row in ipairs(prompt_rows) do
    for sl = 1, slots do
      local k = (i - 1) * slots + sl
      local env, err = nil, nil
      if s.env then
        env, err = environment.instance(s.env, row)
        if not env then error(("episode of prompt %d: %s"):format(i, err), 0) end
      end
      eps[k] = new_episode(nil, {}, env)
      if env and env.remote then resets[k] = environment.reset_start(env, row, s.registry, timeout) end
    end
  end
  for i, row in ipairs(prompt_rows) do
    local msgs
    for sl = 1, slots do
      local ep = eps[(i - 1) * slots + sl]
      local m, err
      if resets[(i - 1) * slots + sl] then
        m, err = environment.reset_finish(s.registry:wait(resets[(i - 1) * slots + sl]), row, timeout)
      elseif ep.env then
        m, err = environment.reset(ep.env, row, ep.state)
      else
        m = chat.messages(row.prompt)
      end
      if not m then
        for _, e in ipairs(eps) do environment.close(e.env, s.registry) end
        error(("episode of prompt %d: %s"):format(i, err), 0)
      end
      msgs = msgs or m
      ep.messages = m
    end
    first[i] = msgs
    local ids = chat.encode(tok, msgs, template_opts(step, s.tools, true))
    if #ids > cfg.max_prompt_length then
      prompts_truncated = prompts_truncated + 1
      local cut = {}
      for t = #ids - cfg.max_prompt_length + 1, #ids do cut[#cut + 1] = ids[t] end
      ids = cut
    end
    prompt_ids[i] = ids
  end
  -- the observation of row k's turn (e: its event; before: the messages before the turn) ->
  -- the token ids to append, or nil when the episode ends
  local function turn_ids(k, e, before, assistant, obs, done)
    local ep = eps[k]
    do
      if not done and obs and #obs > 0 and ep.turns < max_turns then
        local model_end
        if not e.stop_string and #e.tokens > 0 then
          model_end = tok:decode({ e.tokens[#e.tokens] }, { skip_special_tokens = false })
        end
        local ok, obs_text = pcall(M.observation_text, render, before, assistant, obs, model_end)
        if not ok then error("episodes: " .. tostring(obs_text), 0) end
        local ids = tok:encode(obs_text, { add_special_tokens = false })
        local p = prompt_ids[math.floor((k - 1) / slots) + 1]
        local length = #p + ep.model_tokens + ep.obs_tokens + #ids
        if max_episode and length >= max_episode then
          ep.truncated = true   -- no room for the observation and another turn
        else
          ep.messages = concat(ep.messages, obs)
          ep.obs[ep.turns] = ids
          ep.obs_tokens = ep.obs_tokens + #ids
          return ids
        end
      elseif not done and ep.turns >= max_turns then
        ep.max_turns_hit = true
      end
    end
    return nil
  end
  -- rows whose observation runs outside Lua: they stay paused (turns.WAIT) while the others
  -- decode, and on_wait continues them when the answers came
  local waiting = {}
  local function on_turn_end(events)
    local appends = {}
    for _, e in ipairs(events) do
      local k = e.row
      local ep = eps[k]
      local text = tok:decode(e.tokens, { skip_special_tokens = true })
      local assistant = { role = "assistant", content = text }
      local before = ep.messages
      ep.messages = concat(before, { assistant })
      ep.turns = ep.turns + 1
      ep.model_tokens = ep.model_tokens + #e.tokens
      local job = observe_start(s, ep, text, timeout)
      if job_ready(job) then
        appends[k] = turn_ids(k, e, before, assistant, job_finish(ep, job, timeout))
      else
        waiting[k] = { e = e, before = before, assistant = assistant, job = job }
        appends[k] = turns.WAIT
      end
    end
    return appends
  end
  local function on_wait(block)
    s.registry:poll(block and (now() + 3600) or nil)
    local got = {}
    for k, w in pairs(waiting) do
      if job_ready(w.job) then
        waiting[k] = nil
        got[k] = turn_ids(k, w.e, w.before, w.assistant, job_finish(eps[k], w.job, timeout)) or false
      end
    end
    return got
  end
  local t0 = now()
  local out = (opts.model or step.model):generate(prompt_ids, {   -- opts.model: older weights (remax.run.async)
    max_new_tokens = cfg.max_completion_length, temperature = plan.temperatures, top_p = cfg.top_p, top_k = cfg.top_k,
    min_p = cfg.min_p, repetition_penalty = cfg.repetition_penalty, stop_strings = cfg.stop_strings,
    detokenize = cfg.stop_strings and function(ids) return tok:decode(ids, { skip_special_tokens = true }) end,
    stop = step.stop, seed = step:seed_for(opts.step), on_turn_end = on_turn_end, on_wait = s.registry and on_wait,
    append_capacity = cfg.append_capacity or math.max(64, (max_episode or 0) - cfg.max_completion_length),
    on_token = step:progress() and step:progress():ticker("episodes: token %d/%d"),
  })
  local seconds = now() - t0
  local obs_total = 0
  local last_steps = {}   -- the turns the budget cut, judged by an environment outside Lua: all sent, then read
  for k, r in ipairs(out.rows) do
    local ep = eps[k]
    M.assemble(r, ep)
    if #r.turn_ends == 0 or r.turn_ends[#r.turn_ends] < #r.model_ids then   -- the last turn ended by the budget
      local tail = {}
      local from = (#r.turn_ends > 0 and r.turn_ends[#r.turn_ends] or 0) + 1
      for t = from, #r.model_ids do tail[#tail + 1] = r.model_ids[t] end
      local text = tok:decode(tail, { skip_special_tokens = true })
      ep.messages = concat(ep.messages, { { role = "assistant", content = text } })
      ep.turns = ep.turns + 1
      ep.model_tokens = ep.model_tokens + #tail
      -- the environment still judges the turn the budget cut (its reward counts; no observation follows)
      if ep.env and not ep.env_error then
        if ep.env.remote then
          last_steps[k] = environment.step_start(ep.env, text, s.registry, timeout)
        else
          env_answer(ep, environment.step(ep.env, ep.state, text))
        end
      end
    end
  end
  for k, h in pairs(last_steps) do env_answer(eps[k], environment.step_finish(s.registry:wait(h), timeout)) end
  for _, ep in ipairs(eps) do environment.close(ep.env, s.registry) end
  for k, r in ipairs(out.rows) do
    local ep = eps[k]
    local last = ep.messages[#ep.messages]
    r.text = (last and last.role == "assistant") and last.content or ""
    r.messages = ep.messages
    local n0 = #first[r.prompt]
    r.completion_messages = {}
    for t = n0 + 1, #ep.messages do r.completion_messages[#r.completion_messages + 1] = ep.messages[t] end
    r.episode = { turns = ep.turns, tool_calls = ep.tool_calls, tool_errors = ep.tool_errors, tool_time = ep.tool_time,
      model_tokens = ep.model_tokens, obs_tokens = ep.obs_tokens, env_reward = ep.reward, turn_rewards = ep.turn_rewards,
      env_errors = ep.env_errors, env_error = ep.env_error, truncated = ep.truncated or nil, errors = ep.errors }
    if ep.truncated then r.finish = "length" end
    obs_total = obs_total + ep.obs_tokens
  end
  local ro = rollout.new(plan, { prompts = prompt_rows, prompt_ids = prompt_ids, prompts_truncated = prompts_truncated,
    rows = out.rows, tokens_generated = out.tokens_generated, time_generate = seconds, step = opts.step, episodes = true,
    observation_tokens = obs_total })
  return ro
end

-- A generated row's model tokens and its episode's observations -> row.tokens (the episode after
-- the prompt, in order), row.loss_mask (1: the model's, 0: an observation's), row.model_ids.
function M.assemble(r, ep)
  local model = r.tokens
  local tokens, mask, lps = {}, {}, {}
  local at = 0
  for turn, stop in ipairs(r.turn_ends or {}) do
    for t = at + 1, stop do tokens[#tokens + 1], mask[#mask + 1] = model[t], 1 end
    at = stop
    for _, id in ipairs(ep.obs[turn] or {}) do tokens[#tokens + 1], mask[#mask + 1] = id, 0 end
  end
  for t = at + 1, #model do tokens[#tokens + 1], mask[#mask + 1] = model[t], 1 end
  r.model_ids, r.tokens, r.loss_mask = model, tokens, mask
  return r
end

-- The values of a row's model tokens (list over the whole episode -> its loss tokens only), and back.
function M.model_only(list, mask)
  if not mask then return list end
  local out = {}
  for t, m in ipairs(mask) do if m == 1 then out[#out + 1] = list[t] end end
  return out
end

function M.spread(list, mask, zero)
  if not mask then return list end
  local out, k = {}, 0
  for t, m in ipairs(mask) do
    if m == 1 then k = k + 1; out[t] = list[k] else out[t] = zero or 0 end
  end
  return out
end

-- Per-row lists of the whole completion -> of the model tokens (rows with a loss_mask).
function M.model_rows(lists, rows)
  for n, row in ipairs(rows) do if row.loss_mask then lists[n] = M.model_only(lists[n], row.loss_mask) end end
  return lists
end

-- Per-row weights (and entropy weights) over the model tokens -> over the whole completion.
function M.spread_rows(rows, weights, dent)
  for n, row in ipairs(rows) do
    if row.loss_mask then
      weights[n] = M.spread(weights[n], row.loss_mask)
      if dent then dent[n] = M.spread(dent[n], row.loss_mask) end
    end
  end
end

-- A completions.jsonl record of a row, with its episode's messages and counters when it has one.
function M.record(r, rec)
  rec.messages, rec.episode = r.completion_messages, r.episode
  return rec
end

-- Model tokens of a rollout row.
function M.row_tokens(r) return M.loss_tokens({ completion = r.tokens, loss_mask = r.loss_mask }) end

-- Loss tokens of a training row (all of its completion unless it is an episode).
function M.loss_tokens(row)
  if not row.loss_mask then return #row.completion end
  local n = 0
  for _, m in ipairs(row.loss_mask) do n = n + m end
  return n
end

-- Per-step metrics of a rollout of episodes.
function M.metrics(ro)
  local m = { turns = 0, tool_calls = 0, tool_errors = 0, tool_time = 0, model_tokens = 0, observation_tokens = 0,
    env_errors = 0, truncated = 0 }
  local n = 0
  for _, r in ipairs(ro.rows) do
    local e = r.episode
    if e then
      n = n + 1
      m.turns, m.tool_calls, m.tool_errors = m.turns + e.turns, m.tool_calls + e.tool_calls, m.tool_errors + e.tool_errors
      m.tool_time, m.model_tokens, m.observation_tokens = m.tool_time + e.tool_time, m.model_tokens + e.model_tokens,
        m.observation_tokens + e.obs_tokens
      m.env_errors, m.truncated = m.env_errors + e.env_errors, m.truncated + (e.truncated and 1 or 0)
    end
  end
  if n == 0 then return {} end
  return { ["episodes/turns_mean"] = m.turns / n, ["episodes/tool_calls"] = m.tool_calls,
    ["episodes/tool_errors"] = m.tool_errors, ["episodes/tool_time"] = m.tool_time,
    ["episodes/model_tokens"] = m.model_tokens, ["episodes/observation_tokens"] = m.observation_tokens,
    ["episodes/env_errors"] = m.env_errors, ["episodes/truncated"] = m.truncated }
end

-- The environment's summed per-turn rewards as one more reward column ("environment"), for the
-- rows whose episode got any; rows no reward scored but the environment did become scored.
function M.add_environment_reward(ro, per, total, unscored, none)
  local any = false
  for _, r in ipairs(ro.rows) do any = any or (r.episode and r.episode.env_reward ~= nil) end
  if not any then return per, total, unscored, none end
  per = per or {}
  per.environment = {}
  for k, r in ipairs(ro.rows) do
    local v = r.episode and r.episode.env_reward
    per.environment[k] = v
    if v ~= nil then
      local t = total[k]
      if none and none[k] then
        none[k] = nil
        unscored = unscored - 1
        t = 0
      end
      total[k] = (t ~= t and 0 or t) + v
    end
  end
  return per, total, unscored, none
end

return M
