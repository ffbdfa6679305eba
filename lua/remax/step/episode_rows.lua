-- remax.step.episode_rows: an episode's rows as the trainer and the logs see them: the model's
-- own tokens among an episode's (model_only, spread and their row forms), the completion record,
-- the loss's token count, the step's failed episodes and the warning they make, and the
-- episodes' metrics under TRL's names. Plain functions of rows and rollouts; remax.step.episodes
-- (which makes the episodes) hands them on under its own name.
local M = {}

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

-- An episode failed when a tool call or the environment failed in it (a tool that raised or
-- timed out, a worker that died, a malformed call, an unknown tool, bad arguments, an
-- environment step that failed). When more than this share of a step's episodes failed, the
-- step warns (the progress line), or with strict_episodes stops the run.
M.FAILING_SHARE = 0.5

-- The failures of a rollout's episodes: { failed = episodes, total = episodes, top = the most
-- frequent error message, top_count = how often it came }.
function M.failures(ro)
  local f, counts = { failed = 0, total = 0 }, {}
  for _, r in ipairs(ro.rows) do
    local e = r.episode
    if e then
      f.total = f.total + 1
      if (e.tool_errors or 0) > 0 or (e.env_errors or 0) > 0 then f.failed = f.failed + 1 end
      for message, n in pairs(e.error_messages or {}) do counts[message] = (counts[message] or 0) + n end
    end
  end
  for message, n in pairs(counts) do
    if not f.top or n > f.top_count or (n == f.top_count and message < f.top) then f.top, f.top_count = message, n end
  end
  return f
end

-- The warning of a step whose failed episodes are over M.FAILING_SHARE (failed and total may
-- be summed over ranks; top: a most frequent error), else nil.
function M.failure_warning(failed, total, top)
  if total == 0 or failed <= M.FAILING_SHARE * total then return nil end
  local text = ("%d/%d episodes failed"):format(failed, total)
  if top then text = text .. ", most often: " .. top:gsub("%s+", " ") end
  return text
end

-- Per-step metrics of a rollout of episodes. episodes/* count every episode of the step, the
-- greedy ones too; TRL's (num_turns_*, tools/*) its sampled episodes, as TRL has no greedy row:
-- tools/call_frequency = tool calls / sampled episodes, tools/failure_frequency = failed calls /
-- calls (0 without calls), as GRPOTrainer computes them (tools: the step has tools).
function M.metrics(ro, tools)
  local m = { tool_calls = 0, tool_errors = 0, tool_time = 0, model_tokens = 0, observation_tokens = 0,
    env_errors = 0, truncated = 0 }
  local n = 0
  local sampled, calls, failed_calls, turns_min, turns_max, turns_sum = 0, 0, 0, math.huge, 0, 0
  for _, r in ipairs(ro.rows) do
    local e = r.episode
    if e then
      n = n + 1
      m.tool_calls, m.tool_errors = m.tool_calls + e.tool_calls, m.tool_errors + e.tool_errors
      m.tool_time, m.model_tokens, m.observation_tokens = m.tool_time + e.tool_time, m.model_tokens + e.model_tokens,
        m.observation_tokens + e.obs_tokens
      m.env_errors, m.truncated = m.env_errors + e.env_errors, m.truncated + (e.truncated and 1 or 0)
      if not r.greedy then
        sampled = sampled + 1
        calls, failed_calls = calls + e.tool_calls, failed_calls + e.tool_errors
        turns_sum, turns_min, turns_max = turns_sum + e.turns, math.min(turns_min, e.turns), math.max(turns_max, e.turns)
      end
    end
  end
  if n == 0 then return {} end
  local f = M.failures(ro)
  local out = { ["episodes/tool_calls"] = m.tool_calls,
    ["episodes/tool_errors"] = m.tool_errors, ["episodes/tool_time"] = m.tool_time,
    ["episodes/model_tokens"] = m.model_tokens, ["episodes/observation_tokens"] = m.observation_tokens,
    ["episodes/env_errors"] = m.env_errors, ["episodes/truncated"] = m.truncated,
    ["episodes/failed"] = f.failed, ["episodes/failed_fraction"] = f.failed / f.total,
    warning = M.failure_warning(f.failed, f.total, f.top) }
  if sampled > 0 then
    out.num_turns_mean, out.num_turns_min, out.num_turns_max = turns_sum / sampled, turns_min, turns_max
    if tools or ro.has_tools then
      out["tools/call_frequency"] = calls / sampled
      out["tools/failure_frequency"] = calls > 0 and failed_calls / calls or 0
    end
  end
  return out
end

return M
