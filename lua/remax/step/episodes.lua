-- remax.step.episodes: multi-turn rollouts. Each row of the sampling plan is an episode: the
-- model writes a turn, a tool call runs or the environment answers, the observation's tokens
-- are appended to the same KV cache (model:generate's on_turn_end, the engine's
-- rx_generate_continue), and the model goes on; the prompt and earlier turns are never
-- recomputed. The greedy row of a ReMax plan is a greedy episode (greedy in every turn against
-- the same environment): its reward is the baseline.
--
--   local ro = episodes.rollout(policy, prompt_rows, {step = n, plan = plan, setup = s})   -- a remax.step.rollout
--
-- Every episode of a prompt starts from the same state: each prompt gets a seed (its place in
-- the step: rollout.prompt_seed), every episode's environment is reset with it, and the first
-- messages of a prompt's episodes must agree (a ReMax baseline or a GRPO group that played other
-- games than its samples would judge nothing). Sampling is keyed by the row's place and slot
-- (rollout.row_keys), so repeated prompts get distinct samples.
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

-- the rows' side of episodes (remax.step.episode_rows), under this module's names too
local episode_rows = require("remax.step.episode_rows")
M.FAILING_SHARE = episode_rows.FAILING_SHARE
M.model_only = episode_rows.model_only
M.spread = episode_rows.spread
M.model_rows = episode_rows.model_rows
M.spread_rows = episode_rows.spread_rows
M.record = episode_rows.record
M.row_tokens = episode_rows.row_tokens
M.loss_tokens = episode_rows.loss_tokens
M.failures = episode_rows.failures
M.failure_warning = episode_rows.failure_warning
M.metrics = episode_rows.metrics

-- Whether the settings ask for episodes.
function M.wanted(cfg) return cfg.tools ~= nil or cfg.environment ~= nil end

-- The longest episode (max_episode_length, within the model's positions: its default), and the
-- cache room a row gets for its observations beyond max_completion_length.
function M.episode_room(cfg, positions)
  local longest = math.min(cfg.max_episode_length or positions, positions)
  return longest, math.max(64, longest - cfg.max_completion_length)
end

-- The checked tools and environment of step's settings (step: what generates, remax.step.policy's
-- Policy or a table with its cfg, recipe_dir, template, template_name and tok): {tools, env,
-- registry (the workers and servers outside Lua), format}. sample: the first prompt's row (a Lua
-- environment factory's first product, made from it, says which kind it is). A TRL-kind
-- environment's methods join the tools; tools with a template that cannot show them are refused.
-- The caller keeps it for its rollouts (opts.setup) and closes its registry.
function M.setup(step, sample)
  local cfg = step.cfg
  -- tools and environments outside Lua share one registry of workers and servers
  local ropts = { base = step.recipe_dir, max_line = cfg.reward_max_line_bytes }
  local s = { tools = cfg.tools and tools_mod.check(cfg.tools, "tools", ropts) or nil }
  if cfg.environment then
    s.env = environment.resolve(environment.check(cfg.environment, "environment", ropts), sample or {}, cfg.tool_timeout)
    if s.env.kind == "trl" then
      local methods = s.env.remote and tools_mod.from_worker(s.env.tools, s.env.remote.channel, s.env.where)
        or tools_mod.check(s.env.tools, s.env.where .. ".tools", { methods = s.env.class or s.env.methods })
      s.tools = tools_mod.merge(s.tools, methods, s.env.where)
    end
  end
  s.registry = ropts.registry
  s.format = cfg.tool_call_format or tool_calls.format_for(step.template_name,
    step.template_name == "tokenizer" and step.tok and step.tok.chat_template or nil)
  if s.tools and next(s.tools) then tools_mod.check_template(step.template, step.template_name, step.tok) end
  s.env_name = cfg.environment and M.environment_name(cfg.environment)
  s.given_tools, s.given_env, s.given_format = cfg.tools, cfg.environment, cfg.tool_call_format
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
    errors = {}, reward = nil, turn_rewards = {}, obs = {}, model_tokens = 0, obs_tokens = 0, env_errors = 0,
    error_messages = {} }
end

-- An episode's failure, by its message (the step names the most frequent one).
local function count_error(ep, message)
  message = tostring(message)
  if #message > 300 then message = message:sub(1, 300) .. "..." end
  ep.error_messages[message] = (ep.error_messages[message] or 0) + 1
end

-- How messages name the environment a recipe gave: its spec ("py:env.py:Game"), or where its
-- step function (or its factory) is defined.
function M.environment_name(env)
  if type(env) == "string" then return "environment " .. env end
  local fn, what = env, "environment factory"
  if type(env) == "table" then fn, what = env.step, "environment" end
  if type(fn) ~= "function" then return "environment" end
  local info = debug.getinfo(fn, "S")
  return ("%s (%s:%d)"):format(what, info.short_src, info.linedefined)
end

local function finite(x) return x == x and x ~= math.huge and x ~= -math.huge end

-- An environment's answer to a turn -> its observation, done (an error ends the episode). A
-- reward that is not finite, or that makes the episode's sum infinite, ends the episode too and
-- is kept in ep.bad_reward: the rollout then stops the run, naming it (M.check_rewards).
local function env_answer(ep, obs, done, reward, err)
  if err then
    ep.env_errors = ep.env_errors + 1
    ep.env_error = err
    count_error(ep, err)
    return nil, true
  end
  if reward then
    local sum = (ep.reward or 0) + reward
    if not finite(reward) or not finite(sum) then
      ep.bad_reward = ep.bad_reward or { turn = ep.turns, value = reward, before = ep.reward }
      return nil, true
    end
    ep.reward = sum
    ep.turn_rewards[#ep.turn_rewards + 1] = reward
  end
  return obs, done
end

-- Stops (after the step's on_failure, a checkpoint of the last finished step) when an episode's
-- environment gave a reward that is not finite, or rewards whose sum is not: a NaN would leave
-- every advantage 0 and an infinity would make them NaN, without a word about the environment.
function M.check_rewards(step, s, eps, opts)
  for k, ep in ipairs(eps) do
    local b = ep.bad_reward
    if b then
      local which = ("episode %d (prompt %d, %s)"):format(k, ep.prompt or 0,
        ep.greedy and "its greedy episode" or ("sample " .. tostring(ep.slot or 0)))
      local at = opts and opts.step and (" at step " .. opts.step) or ""
      local msg
      if not finite(b.value) then
        msg = ("%s returned the reward %s at turn %d of %s%s; an environment's reward must be a finite number (or nil: none)")
          :format(s.env_name or "the environment", tostring(b.value), b.turn, which, at)
      else
        msg = ("%s: the rewards of %s sum to %s at turn %d (%.17g so far + %.17g)%s; an episode's rewards must sum to a finite number")
          :format(s.env_name or "the environment", which, tostring(b.before + b.value), b.turn, b.before, b.value, at)
      end
      if step.failed then step:failed(msg) end
      error(msg, 0)
    end
  end
end

-- Starts the observation of one turn: the tool calls when the turn calls tools, else the
-- environment's step. Lua tools and environments answer now; those outside Lua answer later
-- (job_ready, then job_finish), while the other rows decode. The tool calls of an episode's
-- last turn (max_turns) are not run, as TRL runs none past max_tool_calling_iterations: no
-- observation could follow them.
local function observe_start(s, ep, text, timeout, last)
  if s.tools then
    local calls = tool_calls.parse(text, s.format, timeout)
    if #calls > 0 and last then return { obs = { nil, true } } end
    if #calls > 0 then
      local started = {}
      for i, call in ipairs(calls) do
        started[i] = { name = call.name, p = tools_mod.start(s.tools, call, timeout, s.registry, ep.env) }
      end
      return { calls = started }
    end
  end
  if ep.env and s.env.kind == "remax" then   -- a TRL-kind environment answers through its tools only
    if ep.env.remote then return { env = environment.step_start(ep.env, text, s.registry, timeout) } end
    return { obs = { env_answer(ep, environment.step(ep.env, ep.state, text, s.registry, timeout)) } }
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
        count_error(ep, result)
      end
      msgs[#msgs + 1] = { role = "tool", content = result, name = c.name }
    end
    return msgs, false
  end
  if job.env then return env_answer(ep, environment.step_finish(job.env, timeout)) end
  return job.obs[1], job.obs[2]
end

-- Whether two values (messages) are equal, table by table.
local function same(a, b)
  if type(a) ~= "table" or type(b) ~= "table" then return a == b end
  for k, v in pairs(a) do if not same(v, b[k]) then return false end end
  for k in pairs(b) do if a[k] == nil then return false end end
  return true
end

local function shown(msgs)
  local ok, text = pcall(require("remax.formats.json").encode, msgs)
  text = ok and text or tostring(msgs)
  return #text > 240 and (text:sub(1, 240) .. "...") or text
end

-- Why a prompt's episodes may not start from different first messages (the error's text).
function M.different_starts(i, slot, a, b)
  return ("the episodes of prompt %d start from different first messages: episode 1 was shown %s, episode %d %s. " ..
    "Every episode of a prompt must start from the same state: ReMax's advantage is a sample's reward minus the " ..
    "greedy episode's, and GRPO compares a prompt's episodes with each other, so episodes that played different " ..
    "games make rewards that judge tasks the model never saw and a baseline from another game. The environment's " ..
    "reset draws at random: draw from the prompt's seed instead (a Lua environment's state.seed; a Python reset " ..
    "that takes a `seed` argument gets it, e.g. random.Random(seed)), or put the random part in the dataset row")
    :format(i, shown(a), slot, shown(b))
end

-- Starts the episodes of prompt_rows (slots per prompt): each gets its environment, reset with
-- its prompt's seed (rollout.prompt_seed of the step's generation seed and the prompt's place:
-- opts.first, the place of prompt_rows[1] in the step, default 1). Returns eps (row-indexed) and
-- first (per prompt: the first messages, the same for all its episodes). A reset that fails, or
-- a prompt whose episodes start differently (M.different_starts), stops with its message.
-- The resets of an environment outside Lua are all sent first, then read.
function M.start(step, s, prompt_rows, slots, opts)
  opts = opts or {}
  local timeout = step.cfg.tool_timeout or 10
  local gen_seed = step:seed_for(opts.step or 0)
  local eps, first, resets = {}, {}, {}
  local function stop(why)
    M.close(s, eps)
    error(why, 0)
  end
  for i, row in ipairs(prompt_rows) do
    local seed = rollout.prompt_seed(gen_seed, (opts.first or 1) + i - 1)
    for sl = 1, slots do
      local k = (i - 1) * slots + sl
      local env, err = nil, nil
      if s.env then
        env, err = environment.instance(s.env, row, timeout)
        if not env then stop(("episode of prompt %d: %s"):format(i, err)) end
      end
      eps[k] = new_episode(nil, { seed = seed }, env)
      eps[k].prompt, eps[k].slot = i, sl
      local plan = opts.plan or step.cfg.sampling
      eps[k].greedy = plan and plan.greedy and sl == slots or nil
      if env and env.remote then resets[k] = environment.reset_start(env, row, s.registry, timeout, seed) end
    end
  end
  for i, row in ipairs(prompt_rows) do
    for sl = 1, slots do
      local k = (i - 1) * slots + sl
      local ep = eps[k]
      local m, err
      if resets[k] then
        m, err = environment.reset_finish(s.registry:wait(resets[k]), row, timeout, s.env.kind)
      elseif ep.env then
        m, err = environment.reset(s.env, ep.env, row, ep.state, timeout)
      else
        m = chat.messages(row.prompt)
      end
      if not m then stop(("episode of prompt %d: %s"):format(i, err)) end
      if first[i] and not same(first[i], m) then stop(M.different_starts(i, sl, first[i], m)) end
      first[i] = first[i] or m
      ep.messages = m
    end
  end
  return eps, first
end

-- A prompt's first messages -> the token ids the model sees (the template with the tools), kept
-- to the last max_prompt_length tokens; and whether they were cut.
function M.prompt_ids(step, s, msgs)
  local max = step.cfg.max_prompt_length
  local ids = chat.encode(step.tok, msgs, template_opts(step, s.tools, true))
  if #ids <= max then return ids, false end
  local cut = {}
  for t = #ids - max + 1, #ids do cut[#cut + 1] = ids[t] end
  return cut, true
end

-- The first prompt as the model sees it (remax render): the first messages of the episodes of
-- row (at opts.first in step opts.step, default 1 and 1), their token ids and text. opts.setup:
-- M.setup's (default: made for this call).
function M.first_prompt(step, row, opts)
  opts = opts or {}
  local s = opts.setup or M.setup(step, row)
  local plan = opts.plan or step.cfg.sampling
  local eps, first = M.start(step, s, { row }, plan.slots, { step = opts.step or 1, first = opts.first })
  M.close(s, eps)
  local ids, cut = M.prompt_ids(step, s, first[1])
  return first[1], ids, cut
end

-- The rollout of a plan's rows as episodes; the same shape as Policy:rollout's, each row with
-- tokens (the episode after the prompt), loss_mask, text (the last assistant message), messages
-- (the episode after the prompt), and its counters. opts: plan, step, first (as
-- Policy:rollout's), setup (M.setup's, kept by the caller for its rollouts; default: made for
-- this call). step: what generates (remax.step.policy's Policy, or a table with its cfg, model,
-- tok, stop, template, template_name, seed_for and progress); nothing of it is written.
function M.rollout(step, prompt_rows, opts)
  opts = opts or {}
  local cfg = step.cfg
  local s = opts.setup or M.setup(step, prompt_rows[1])
  local plan = opts.plan or cfg.sampling
  local slots = plan.slots
  local tok = step.tok
  local max_turns = cfg.max_turns or 4
  -- the longest episode: max_episode_length, within the model's positions (its default)
  local max_episode, room = M.episode_room(cfg, tonumber(step.model:cfg().max_position_embeddings))
  local timeout = cfg.tool_timeout or 10
  local render = function(msgs, gen) return chat.render(msgs, template_opts(step, s.tools, gen)) end
  local eps, first = M.start(step, s, prompt_rows, slots, opts)
  local prompt_ids, prompts_truncated = {}, 0
  for i = 1, #prompt_rows do
    local cut
    prompt_ids[i], cut = M.prompt_ids(step, s, first[i])
    if cut then prompts_truncated = prompts_truncated + 1 end
  end
  -- the observation of row k's turn (e: its event; before: the messages before the turn) ->
  -- the token ids to append, or nil when the episode ends (done, max_turns, the model's budget
  -- of max_completion_length tokens spent, or an observation that does not fit: truncated)
  local function turn_ids(k, e, before, assistant, obs, done)
    local ep = eps[k]
    do
      if not done and obs and #obs > 0 and ep.turns < max_turns and ep.model_tokens < cfg.max_completion_length then
        local model_end
        if not e.stop_string and #e.tokens > 0 then
          model_end = tok:decode({ e.tokens[#e.tokens] }, { skip_special_tokens = false })
        end
        local ok, obs_text = pcall(M.observation_text, render, before, assistant, obs, model_end)
        if not ok then error("episodes: " .. tostring(obs_text), 0) end
        local ids = tok:encode(obs_text, { add_special_tokens = false })
        local p = prompt_ids[math.floor((k - 1) / slots) + 1]
        local length = #p + ep.model_tokens + ep.obs_tokens + #ids
        if length >= max_episode then
          ep.truncated = true   -- no room for the observation and another turn
        else
          ep.messages = concat(ep.messages, obs)
          ep.obs_messages = #obs
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
      local job = observe_start(s, ep, text, timeout, ep.turns >= max_turns)
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
    row_keys = rollout.row_keys(slots, #prompt_ids, opts.first),
    append_capacity = room,
    on_token = step:progress() and step:progress():ticker("episodes: token %d/%d"),
  })
  local seconds = now() - t0
  local obs_total = 0
  local last_steps = {}   -- the turns the budget cut, judged by an environment outside Lua: all sent, then read
  for k, r in ipairs(out.rows) do
    local ep = eps[k]
    local n = #r.turn_ends
    if n > 0 and ep.obs[n] and r.turn_ends[n] == #r.tokens then
      -- the engine's KV cache had no room for the last observation (finish "length"): the model
      -- never saw it, so it is not part of the episode; the episode is truncated
      ep.obs_tokens = ep.obs_tokens - #ep.obs[n]
      ep.obs[n] = nil
      for _ = 1, ep.obs_messages do table.remove(ep.messages) end
      ep.truncated = true
    end
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
      if ep.env and s.env.kind == "remax" and not ep.env_error then
        if ep.env.remote then
          last_steps[k] = environment.step_start(ep.env, text, s.registry, timeout)
        else
          env_answer(ep, environment.step(ep.env, ep.state, text, s.registry, timeout))
        end
      end
    end
  end
  for k, h in pairs(last_steps) do env_answer(eps[k], environment.step_finish(s.registry:wait(h), timeout)) end
  -- the environments stay open until the rewards have read them (M.add_environment_reward
  -- asks a TRL-kind one for get_reward, then closes them)
  M.check_rewards(step, s, eps, opts)
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
      env_errors = ep.env_errors, env_error = ep.env_error, truncated = ep.truncated or nil, errors = ep.errors,
      error_messages = next(ep.error_messages) and ep.error_messages or nil }
    if ep.truncated then r.finish = "length" end
    -- what the rewards get of its environment (batch.environments): the instance; a remax-kind
    -- Lua environment's, the episode's state
    if ep.env then r.environment = (ep.env.remote or s.env.kind == "trl") and ep.env or ep.state end
    obs_total = obs_total + ep.obs_tokens
  end
  local ro = rollout.new(plan, { prompts = prompt_rows, prompt_messages = first, prompt_ids = prompt_ids, prompts_truncated = prompts_truncated,
    rows = out.rows, tokens_generated = out.tokens_generated, time_generate = seconds, step = opts.step, episodes = true,
    observation_tokens = obs_total, has_tools = s.tools ~= nil and next(s.tools) ~= nil,
    open_episodes = s.env and { setup = s, eps = eps, timeout = timeout } or nil })
  return ro
end

-- Ends episodes: their environments outside Lua drop their instances (eps: M.start's).
function M.close(s, eps)
  for _, ep in pairs(eps) do environment.close(ep.env, s.registry, s.env and s.env.kind) end
end

-- A rollout's episodes, once the rewards have read their environments: a TRL-kind
-- environment's get_reward (when it has one) becomes each episode's environment reward, then
-- the environments are closed. Once per rollout.
function M.finish(ro)
  local open = ro.open_episodes
  if not open then return end
  ro.open_episodes = nil
  local s, eps = open.setup, open.eps
  local timeout = open.timeout
  if s.env.kind == "trl" and s.env.reward then
    local handles = {}
    for k, ep in ipairs(eps) do handles[k] = environment.reward_start(ep.env, s.registry, timeout) or false end
    for k, ep in ipairs(eps) do
      local h = handles[k] and s.registry:wait(handles[k]) or nil
      local v, err = environment.reward_finish(ep.env, h, timeout)
      local e = ro.rows[k].episode
      if err then
        e.env_errors, e.env_error = e.env_errors + 1, err
        e.error_messages = e.error_messages or {}
        e.error_messages[err] = (e.error_messages[err] or 0) + 1
      elseif v ~= nil then
        e.env_reward = (e.env_reward or 0) + v
      end
    end
  end
  M.close(s, eps)
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


-- The environment's summed per-turn rewards (a TRL-kind one's get_reward) as one more reward
-- column ("environment"), for the rows whose episode got any; rows no reward scored but the
-- environment did become scored. Called once the reward functions have run: the rollout's
-- environments are finished here (M.finish).
function M.add_environment_reward(ro, per, total, unscored, none)
  M.finish(ro)
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
