-- remax.step.evaluate: evaluation on the held-out prompts: greedy accuracy and reward, and with
-- samples = K also sampled accuracy, pass@k and the headroom a reward can use. Each rank scores
-- its share; the sums are gathered. A function of what it evaluates with (the RL and SFT steps'
-- evaluate call it); the Run decides when, and keeps the history.
local now = require("remax.bind.clock").now
local rollout = require("remax.step.rollout")

local M = {}

-- pass@k of one prompt with c right answers among n samples: the chance that k samples drawn
-- without replacement include a right one, 1 - C(n-c, k) / C(n, k) (Chen et al., 2021).
local function pass_at_k(n, c, k)
  if n - c < k then return 1 end
  local miss = 1
  for i = n - c + 1, n do miss = miss * (1 - k / i) end
  return 1 - miss
end

-- Greedy completions of the eval set: accuracy (the reward marked accuracy, else the first
-- reward) and the mean combined reward. opts.samples = K > 0 also samples K completions per
-- prompt (at the recipe's temperature) in the same generation call and adds sampled accuracy,
-- pass@k for k = 1, 2, 4, ..., K, and the share of prompts whose greedy answer is wrong while
-- some sample is right (the headroom a reward can use). rows: the held-out rows. ctx: policy
-- (remax.step.policy's Policy: its rollout, score_ahead, score and progress), cfg, world
-- (remax.bind.dist), accuracy_name (the reward whose score is accuracy; nil: none). Returns the
-- evaluation; nothing of ctx is written. The signature from before the Run / Step split,
-- run(run, rows, opts) with a Run (remax.run.run) as the first argument, still works: its Step
-- gives the context.
function M.run(ctx, rows, opts)
  if ctx.policy == nil and type(ctx.stepper) == "table" then
    local s = ctx.stepper
    ctx = { policy = s.policy, cfg = s.cfg, world = s.dist, accuracy_name = s.accuracy_name }
  end
  if type(ctx.policy) ~= "table" or type(rows) ~= "table" then
    error("remax.step.evaluate.run(ctx, rows, opts): ctx is {policy, cfg, world, accuracy_name} or a Run, rows the held-out rows", 2)
  end
  opts = opts or {}
  local cfg, policy, world, accuracy_name = ctx.cfg, ctx.policy, ctx.world, ctx.accuracy_name
  local K = opts.samples or 0
  local t0 = now()
  local n = math.min(#rows, cfg.eval_size)
  local acc, rew, count, glen = 0, 0, 0, 0
  local right = {}   -- per prompt: right samples (K > 0)
  local sacc, headroom, greedy_wrong = 0, 0, 0
  local bs = cfg.per_device_eval_batch_size
  if K > 0 then bs = math.max(1, math.floor(bs / (K + 1))) end
  local lo, hi = world:share_range(n)   -- each rank evaluates its share; the sums are gathered
  -- a chunk's rewards outside Lua (workers, servers) score it while the next chunk generates:
  -- each chunk is handed to them as soon as it is generated and collected one chunk later
  local function tally(ro, chunk, last)
    policy:score(ro, { alone = true })
    local progress = policy:progress()
    if progress then progress:status(("eval %d/%d prompts"):format(last - lo + 1, hi - lo + 1)) end
    local prompt_right, prompt_greedy = {}, {}
    for k, r in ipairs(ro.rows) do
      local a = accuracy_name and ro.per[accuracy_name][k] or 0
      if r.greedy then
        rew = rew + ro.total[k]
        acc = acc + a
        glen = glen + #r.tokens
        count = count + 1
        prompt_greedy[r.prompt] = a
      else
        sacc = sacc + a
        prompt_right[r.prompt] = (prompt_right[r.prompt] or 0) + (a >= 1 and 1 or 0)
      end
    end
    if K > 0 then
      for i = 1, #chunk do
        local c = prompt_right[i] or 0
        right[#right + 1] = c
        if (prompt_greedy[i] or 0) < 1 then
          greedy_wrong = greedy_wrong + 1
          if c > 0 then headroom = headroom + 1 end
        end
      end
    end
  end
  local waiting   -- the chunk generated last, its rewards on their way
  for first = lo, hi, bs do
    local chunk = {}
    local last = math.min(hi, first + bs - 1)
    for i = first, last do chunk[#chunk + 1] = rows[i] end
    local ro = policy:rollout(chunk, { plan = rollout.plan(K, true, cfg.temperature), step = 0, first = first })
    policy:score_ahead(ro)
    if waiting then tally(waiting.ro, waiting.chunk, waiting.last) end
    waiting = { ro = ro, chunk = chunk, last = last }
  end
  if waiting then tally(waiting.ro, waiting.chunk, waiting.last) end
  acc, rew, count, glen, sacc, greedy_wrong, headroom = world:sum(acc, rew, count, glen, sacc, greedy_wrong, headroom)
  right = world:concat(right)
  local e = { accuracy = count > 0 and acc / count or 0, reward = count > 0 and rew / count or 0, n = count,
    greedy_length_mean = count > 0 and glen / count or 0, seconds = now() - t0 }
  if K > 0 and count > 0 then
    e.samples = K
    e.sampled_accuracy = sacc / (count * K)
    e.pass_at = {}
    local k = 1
    while k <= K do
      local s = 0
      for _, c in ipairs(right) do s = s + pass_at_k(K, c, k) end
      e.pass_at[#e.pass_at + 1] = { k = k, value = s / #right }
      if k < K and 2 * k > K then k = K else k = 2 * k end
    end
    e.greedy_wrong = greedy_wrong / count
    e.headroom = headroom / count
  end
  e.accuracy_name = accuracy_name
  return e
end
M.pass_at_k = pass_at_k

return M
