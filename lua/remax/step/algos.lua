-- remax.step.algos: advantage estimators and the per-token loss, as pure functions of plain Lua values.
-- The algorithms are records, one file each in step/algos/ (remax, grpo, rloo, reinforce, sft,
-- reward), and so are TRL's loss types in step/loss_types/ (grpo, bnpo, dr_grpo, dapo, cispo,
-- sapo): a new one is a new file there. M.register() hands them to the settings, which derive
-- `algo`'s and `loss_type`'s choices from them (remax.settings.registry).
--
-- A step's rewards come grouped by prompt: groups[i] = {samples = {r_1, ..., r_G}, greedy = r_g}
-- (greedy: the reward of the prompt's greedy completion; nil when none was generated).
--
--   local adv, state = algos.advantages("remax", groups, {clip = 0})      -- adv[i][j]
--   local w, stats = algos.token_weights(rows, {beta = 0.01, kl = "k3", agg = "seq-mean-token-mean",
--                                              num_rows = R, num_tokens = N})
--   -- w[r][t] = d loss / d logp of completion token t of row r: what model:backward takes.
--
-- An algorithm record (step/algos/<name>.lua returns it):
--   name, rank        its name (the `algo` value) and its place in lists (--help, errors)
--   choice            its words in `algo`'s help
--   samples           true: it trains on sampled completions (RL); false: sft, reward
--   needs_greedy      nil, or why it needs each prompt's greedy row (generate_greedy's default)
--   min_generations   the fewest num_generations it learns from (min_generations_why: in words)
--   min_scored        the fewest scored samples a group needs (default 1; fewer: advantage 0)
--   settings          the settings it alone reads (they do nothing under another algorithm)
--   estimator         function(groups, opts, state) -> adv[, state] (RL); per_reward: an
--                     estimator over each reward function's scores (grpo's GDPO)
--   loss              what it trains: "policy" (the loss type's per-token loss: token_weights),
--                     "cross_entropy" (sft), "bradley_terry" (reward: its own Step)
-- A loss type record (step/loss_types/<name>.lua):
--   name, rank, aggregation (how token losses are averaged: M.row_scale), normalisation (in words)
--   token_loss        function(r, A, lp, o) -> loss, d loss / d log r, d loss / d lp; nil: the
--                     clipped surrogate (M.clipped_loss, with epsilon, epsilon_high, delta)
--   clipped           function(r, A, o) -> low, high: the clip_ratio counts; false: none
--   settings, ignores, on_policy   what it reads of the settings (remax.settings.registry);
--                     defaults: its settings' defaults (they have none under another loss type)
local stats = require("remax.step.stats")
local fs = require("remax.bind.fs")

local M = {}

local mean, std = stats.mean, stats.std
M.mean, M.std = mean, std

---------------------------------------------------------------------------- the records

-- The records of a folder beside this file (step/algos/, step/loss_types/), in rank order: every
-- .lua file there is one.
local function load_folder(folder)
  local here = debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or "."
  local list = {}
  for _, file in ipairs(fs.list_dir(here .. "/" .. folder)) do
    local name = file:match("^([%w_]+)%.lua$")
    if name then
      local module = "remax.step." .. folder .. "." .. name
      local rec = require(module)
      assert(rec.name == name, module .. ": its record's name must be its file's name")
      list[#list + 1] = rec
    end
  end
  table.sort(list, function(a, b) return a.rank < b.rank end)
  return list
end

local loaded = {}
local function records(folder)
  if not loaded[folder] then loaded[folder] = load_folder(folder) end
  return loaded[folder]
end

function M.algorithms() return records("algos") end
function M.loss_types() return records("loss_types") end

local function find(list, name)
  for _, r in ipairs(list) do if r.name == name then return r end end
  return nil
end
function M.algorithm(name) return find(M.algorithms(), name) end
function M.loss_type(name) return name ~= nil and find(M.loss_types(), name) or nil end

-- Hands every algorithm and loss type to the settings (their choices, checks and notes come from
-- them). Called where the program starts (cli/main.lua), by the package face and by the specs'
-- support.lua, before the first config.resolve.
function M.register()
  local registry = require("remax.settings.registry")
  for _, a in ipairs(M.algorithms()) do registry.add_algorithm(a) end
  for _, l in ipairs(M.loss_types()) do registry.add_loss_type(l) end
end

---------------------------------------------------------------------------- advantages

local function isnan(v) return v ~= v end

-- Rows no reward scored (every reward returned nil) arrive as NaN, as in TRL: they are left out
-- of every baseline and statistic and get advantage 0. A group keeps its scored samples; it is
-- left out whole (advantages 0) when none is scored, when an algorithm that needs the greedy row
-- has no scored greedy row, or when fewer than its min_scored samples are left. Returns the
-- groups the estimator sees and, for each, {prompt index, sample indices}.
local function scored_groups(groups, rec)
  local any = false
  for _, g in ipairs(groups) do
    if g.greedy ~= nil and isnan(g.greedy) then any = true end
    for _, r in ipairs(g.samples) do if isnan(r) then any = true end end
  end
  if not any then return groups, nil end
  local needs_greedy, min_scored = rec and rec.needs_greedy, rec and rec.min_scored or 1
  local out, back = {}, {}
  for i, g in ipairs(groups) do
    local samples, idx = {}, {}
    for j, r in ipairs(g.samples) do
      if not isnan(r) then samples[#samples + 1], idx[#idx + 1] = r, j end
    end
    local greedy = g.greedy
    if greedy ~= nil and isnan(greedy) then greedy = nil end
    local keep = #samples > 0 and not (needs_greedy and greedy == nil) and #samples >= min_scored
    if keep then
      local ng = {}
      for k, v in pairs(g) do ng[k] = v end
      ng.samples, ng.greedy = samples, greedy
      out[#out + 1] = ng
      back[#back + 1] = { i, idx }
    end
  end
  return out, back
end

-- The names of the estimators, for an error
local function estimator_names()
  local out = {}
  for _, a in ipairs(M.algorithms()) do if a.estimator then out[#out + 1] = a.name end end
  return table.concat(out, ", ")
end

-- Advantages for every sample: kind is an algorithm's name (its record's estimator) or
-- function(groups, opts, state) -> adv[, state]. opts.clip > 0 clips every advantage to
-- [-clip, clip]. Rewards that are NaN (unscored rows) get advantage 0 and stay out of the
-- baselines (see scored_groups). Returns adv, state. opts.global_sum(a, b, ...), when given,
-- returns each number summed over every rank's groups (data parallel training): statistics over
-- the whole batch (the REINFORCE running mean, GRPO's batch std) use it.
function M.advantages(kind, groups, opts, state)
  opts = opts or {}
  local rec = type(kind) == "string" and M.algorithm(kind) or nil
  local f = type(kind) == "function" and kind or (rec and rec.estimator)
  if not f then
    error(("unknown advantage estimator '%s' (valid: %s, or a Lua function)"):format(tostring(kind), estimator_names()), 0)
  end
  local seen, back = scored_groups(groups, rec)
  local adv, new_state
  if #seen > 0 then
    adv, new_state = f(seen, opts, state)
  else
    adv, new_state = {}, state
  end
  if type(adv) ~= "table" then
    error(("advantage function returned a %s, expected a list (one list per prompt)"):format(type(adv)), 0)
  end
  local clip = opts.clip or 0
  for i, g in ipairs(seen) do
    local a = adv[i]
    if type(a) ~= "table" then
      error(("advantage function: entry %d is a %s, expected a list of %d numbers"):format(i, type(a), #g.samples), 0)
    end
    for j = 1, #g.samples do
      local v = a[j]
      if type(v) ~= "number" or v ~= v then
        error(("advantage function: prompt %d sample %d is %s, expected a number"):format(i, j, tostring(v)), 0)
      end
      if clip > 0 then a[j] = math.max(-clip, math.min(clip, v)) end
    end
  end
  if back then
    local full = {}
    for i, g in ipairs(groups) do
      full[i] = {}
      for j = 1, #g.samples do full[i][j] = 0 end
    end
    for k, map in ipairs(back) do
      for n, j in ipairs(map[2]) do full[map[1]][j] = adv[k][n] end
    end
    adv = full
  end
  return adv, new_state
end

-- grpo's per-reward estimator (TRL's GDPO: multi_objective_aggregation = "normalize_then_sum"):
-- step/algos/grpo.lua's per_reward.
function M.normalize_then_sum(per, weights, eps) return M.algorithm("grpo").per_reward(per, weights, eps) end

---------------------------------------------------------------------------- KL estimators

-- Per-token KL(pi || ref) estimators from logp = log pi(token), ref = log ref(token).
-- k1 = logp - ref (unbiased, high variance; folded into the reward);
-- k3 = exp(ref - logp) - (ref - logp) - 1 (>= 0, low variance; added to the loss).
function M.kl_k1(logp, ref) return logp - ref end
function M.kl_k3(logp, ref)
  local d = ref - logp
  return math.exp(d) - d - 1
end
-- d k3 / d logp
function M.kl_k3_grad(logp, ref) return 1 - math.exp(ref - logp) end

-- k1 folded into a sequence's reward: r - beta * sum_t (logp_t - ref_t).
function M.fold_kl(reward, logp, ref, beta)
  local s = 0
  for t = 1, #logp do s = s + logp[t] - ref[t] end
  return reward - beta * s, s
end

-- The original ReMax's per-token return (liziniu/ReMax, whose trainer is DeepSpeed-Chat's; remax's
-- gamma setting): for a completion of T tokens with advantage A (r - r_greedy, clipped by
-- advantage_clip), token t (1-based) gets
--   return_t = -beta * (logp_t - ref_t) + gamma^(T - t) * A
-- the KL a per-token penalty at its own token (not summed over the later ones: the original's
-- cumulative_kl is overwritten at every position), A discounted from the last token back. ref
-- nil (beta = 0): no KL term. Returns the list of returns and the sum of logp_t - ref_t.
function M.gamma_returns(A, logp, ref, beta, gamma)
  local out, kl_sum, disc = {}, 0, 1
  for t = #logp, 1, -1 do
    local kl = ref and (logp[t] - ref[t]) or 0
    kl_sum = kl_sum + kl
    out[t] = -beta * kl + disc * A
    disc = disc * gamma
  end
  return out, kl_sum
end

-- M.gamma_returns of every sampled row of a rollout (its advantage ro.adv[prompt][slot]);
-- fetch(which) -> the policy's and the reference's log-probabilities of the completion tokens
-- of rows `which` (row indices), or fetch nil (beta = 0: no KL term). Returns returns[k] and
-- kl_k1[k] (the summed log-ratio of row k; nil without fetch), by row index.
function M.rollout_returns(ro, fetch, beta, gamma)
  local which = {}
  for k, r in ipairs(ro.rows) do if not r.greedy then which[#which + 1] = k end end
  local lp, ref
  if fetch then lp, ref = fetch(which) end
  local returns, kl = {}, lp and {} or nil
  for n, k in ipairs(which) do
    local r = ro.rows[k]
    local logp = lp and lp[n]
    if not logp then
      logp = {}
      for t = 1, #r.tokens do logp[t] = 0 end
    end
    local s
    returns[k], s = M.gamma_returns(ro.adv[r.prompt][r.slot], logp, ref and ref[n], lp and beta or 0, gamma)
    if kl then kl[k] = s end
  end
  return returns, kl
end

---------------------------------------------------------------------------- loss

-- loss_agg_mode values. seq-mean-token-sum-norm is verl's name for Dr. GRPO's normalisation.
M.aggregations = { "seq-mean-token-mean", "token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm" }

local function valid_aggs()
  return table.concat(M.aggregations, ", ")
end

-- The factor each token of a row with n loss tokens carries in the step's loss:
--   seq-mean-token-mean:     1 / (num_rows * n)        (each sequence counts the same; the default)
--   token-mean:              1 / num_tokens            (each token counts the same; TRL's dapo)
--   seq-mean-token-sum:      1 / num_rows              (longer sequences count more)
--   seq-mean-token-sum-norm: 1 / (num_rows * max_length)  (TRL's dr_grpo, max_length =
--                            max_completion_length)
--   micro-token-mean:        1 / (chunk_tokens * chunks)  (TRL's bnpo: the micro-batch's tokens)
-- num_rows and num_tokens are totals over the whole step (every micro-batch), so gradient
-- accumulation gives the same gradient as one big batch. extra = {max_length=, chunk_tokens=,
-- chunks=} for the last two.
function M.row_scale(agg, n, num_rows, num_tokens, extra)
  if n == 0 then return 0 end
  extra = extra or {}
  if agg == "seq-mean-token-mean" then return 1 / (num_rows * n)
  elseif agg == "token-mean" then return 1 / num_tokens
  elseif agg == "seq-mean-token-sum" then return 1 / num_rows
  elseif agg == "seq-mean-token-sum-norm" then
    if not extra.max_length then error("seq-mean-token-sum-norm needs max_length (max_completion_length)", 0) end
    return 1 / (num_rows * extra.max_length)
  elseif agg == "micro-token-mean" then
    if not extra.chunk_tokens then error("micro-token-mean (bnpo) needs chunk_tokens and chunks", 0) end
    return 1 / (math.max(extra.chunk_tokens, 1) * (extra.chunks or 1))
  end
  error(("unknown loss_agg_mode '%s' (valid: %s)"):format(tostring(agg), valid_aggs()), 0)
end

-- The clipped surrogate of one importance ratio r with advantage A (PPO; TRL's grpo/bnpo/
-- dr_grpo/dapo): loss = -min(r' A, clamp(r, 1 - lo, 1 + hi) A), r' = min(r, delta) when delta
-- is set (two-sided clipping). Returns loss and d loss / d log r (= d loss / d logp).
function M.clipped_loss(r, A, lo, hi, delta)
  local inside = r >= 1 - lo and r <= 1 + hi
  local c2 = r < 1 - lo and 1 - lo or (r > 1 + hi and 1 + hi or r)
  local capped = delta ~= nil and r > delta
  local c1 = capped and delta or r
  local l1, l2 = c1 * A, c2 * A
  if l1 <= l2 then
    return -l1, capped and 0 or -A * r
  end
  return -l2, inside and -A * r or 0
end

-- Which side a ratio is clipped on (TRL's clip_ratio/low and /high): low when r < 1 - lo with
-- A < 0, high when r > 1 + hi with A > 0 (the cases where clipping removes the gradient).
local function clip_side(r, A, lo, hi)
  return (r < 1 - lo and A < 0), (r > 1 + hi and A > 0)
end

-- A loss type's own per-token term over one row (token_weights' rows[r]): each token's loss and
-- d loss / d logp_t, the entropy mask applied, and the clip counts {low, high, n}. The ratio is
-- exp(logp - old) per token, or one per row at sequence level (exp of the mean log-ratio, which
-- each token moves by 1/n of its share); without old it is exactly 1 (old = logp, detached).
local function term_row(term, clipped, o, row, level)
  local n, A, lp, old, mask, returns = #row.logp, row.adv, row.logp, row.old, row.mask, row.returns
  local seq_ratio
  if level == "sequence" and n > 0 then
    local s = 0
    for t = 1, n do s = s + (lp[t] - (old and old[t] or lp[t])) end
    seq_ratio = math.exp(s / n)
  end
  local ls, gs, through = {}, {}, 0
  local counts = { 0, 0, 0 }
  for t = 1, n do
    local m = mask and mask[t] or 1
    local At = returns and returns[t] or A
    local ratio = seq_ratio or math.exp(lp[t] - (old and old[t] or lp[t]))
    local l, dr, dd = term(ratio, At, lp[t], o)
    if clipped and (not seq_ratio or t == 1) then   -- a token's ratio, or the row's once
      local cl, ch = clipped(ratio, At, o)
      counts[1], counts[2], counts[3] = counts[1] + (cl and 1 or 0), counts[2] + (ch and 1 or 0), counts[3] + 1
    end
    ls[t] = m * l
    if seq_ratio then
      through = through + m * (dr or 0)   -- every token's loss moves with the row's ratio
      gs[t] = m * (dd or 0)
    else
      gs[t] = m * ((dr or 0) + (dd or 0))
    end
  end
  if seq_ratio then for t = 1, n do gs[t] = gs[t] + through / n end end
  return ls, gs, counts
end

-- rows[r] = {adv = A, logp = {...}, ref = {...} or nil, old = {...} or nil, mask = {...} or nil,
-- masked = true or nil, returns = {...} or nil}: the completion tokens of one row; returns (gamma:
-- M.gamma_returns) replaces A token by token. old: the log-probabilities of the
-- policy that generated the rollout (num_iterations > 1); without it the ratio is exactly 1 and
-- the loss is today's -A * logp, whose gradient is the same. mask[t] = 0 leaves token t out of
-- the policy term (top_entropy_quantile); masked = true leaves the whole row out of the loss and
-- of the token counts (mask_truncated_completions; the row still counts in num_rows).
--
-- Per-token loss, with r_t = exp(logp_t - old_t) (importance_sampling_level = "token") or
-- r = exp(mean_t (logp_t - old_t)) for every token of the row ("sequence", GSPO):
--   l_t = mask_t * clipped_loss(r_t, A) + beta * k3_t       (kl = "k3")
--   l_t = mask_t * clipped_loss(r_t, A)                      (kl = "k1": the KL is in A already)
-- and the step's loss is sum over rows and tokens of row_scale * l_t. SFT is adv = 1, beta = 0.
-- A loss type with a token_loss of its own (cispo, sapo: step/loss_types/) puts its term in place
-- of clipped_loss, evaluated at ratio 1 when there is no old (as TRL does with the detached logp).
-- opts: beta, kl, agg, num_rows, num_tokens (step totals), max_length, chunk_tokens, chunks,
-- epsilon (0.2), epsilon_high (= epsilon), delta (nil), level ("token"), loss_type (a name of
-- step/loss_types/; nil: the clipped surrogate), and the settings that loss type reads
-- (sapo_temperature_pos, sapo_temperature_neg; default: its record's defaults).
-- Returns weights[r][t] = d loss / d logp_t and stats {loss=, kl_sum=, tokens=, clip_low=,
-- clip_high=, clip_n=}: loss is this part's share of the step's loss, kl_sum the sum of the
-- per-token KL estimates (k3 or k1) over loss tokens, clip_* counts of clipped tokens (rows at
-- sequence level) among clip_n.
function M.token_weights(rows, opts)
  local beta, kl, agg = opts.beta or 0, opts.kl or "k3", opts.agg or "seq-mean-token-mean"
  if kl ~= "k3" and kl ~= "k1" then error(("unknown kl_estimator '%s' (valid: k3, k1)"):format(tostring(kl)), 0) end
  local level = opts.level or "token"
  if level ~= "token" and level ~= "sequence" then
    error(("unknown importance_sampling_level '%s' (valid: token, sequence)"):format(tostring(level)), 0)
  end
  local lo = opts.epsilon or 0.2
  local hi = opts.epsilon_high or lo
  local delta = opts.delta
  local L = M.loss_type(opts.loss_type)
  if opts.loss_type ~= nil and not L then error(("unknown loss_type '%s'"):format(tostring(opts.loss_type)), 0) end
  local term = L and L.token_loss
  local o   -- what a loss type's own term reads: the clip range, and its settings (or their defaults)
  if term then
    o = { epsilon = lo, epsilon_high = hi, delta = delta }
    for k, v in pairs(L.defaults or {}) do o[k] = v end
    for _, k in ipairs(L.settings or {}) do if opts[k] ~= nil then o[k] = opts[k] end end
  end
  local num_rows, num_tokens = opts.num_rows, opts.num_tokens
  if not num_rows or not num_tokens then
    num_rows, num_tokens = #rows, 0
    for _, row in ipairs(rows) do if not row.masked then num_tokens = num_tokens + #row.logp end end
  end
  local extra = { max_length = opts.max_length, chunk_tokens = opts.chunk_tokens, chunks = opts.chunks }
  if agg == "micro-token-mean" and not extra.chunk_tokens then
    extra.chunk_tokens, extra.chunks = num_tokens, 1
  end
  local weights, loss, kl_sum, tokens = {}, 0, 0, 0
  local clip_low, clip_high, clip_n = 0, 0, 0
  for r, row in ipairs(rows) do
    local n, A, lp, ref, old, mask = #row.logp, row.adv, row.logp, row.ref, row.old, row.mask
    local returns = row.returns   -- per-token advantages (gamma), else A for every token
    local isw = row.is_weight     -- the sampler's importance weights (remax.step.offpolicy), or nil
    local w = {}
    if row.masked then
      for t = 1, n do w[t] = 0 end
    else
      local c = M.row_scale(agg, n, num_rows, num_tokens, extra)
      local policy_l, policy_g, counts
      if term then
        policy_l, policy_g, counts = term_row(term, L.clipped, o, row, level)
        clip_low, clip_high, clip_n = clip_low + counts[1], clip_high + counts[2], clip_n + counts[3]
      end
      -- sequence level: one ratio for the row; each token's logp moves it by r / n
      local seq_loss, seq_grad
      if old and level == "sequence" and n > 0 and not term then
        local s = 0
        for t = 1, n do s = s + (lp[t] - old[t]) end
        local ratio = math.exp(s / n)
        seq_loss, seq_grad = M.clipped_loss(ratio, A, lo, hi, delta)
        local l, h = clip_side(ratio, A, lo, hi)
        clip_low, clip_high, clip_n = clip_low + (l and 1 or 0), clip_high + (h and 1 or 0), clip_n + 1
        local m_sum = 0
        for t = 1, n do m_sum = m_sum + (mask and mask[t] or 1) end
        seq_grad = seq_grad * m_sum / n   -- d/d logp_t of sum_t' mask_t' * loss(r)
      end
      for t = 1, n do
        local m = mask and mask[t] or 1
        local At = returns and returns[t] or A
        local l, g
        if policy_l then
          l, g = policy_l[t], policy_g[t]   -- the mask is in them
        elseif not old then
          l, g = -At * lp[t], -At
        elseif level == "token" then
          local ratio = math.exp(lp[t] - old[t])
          l, g = M.clipped_loss(ratio, At, lo, hi, delta)
          local cl, ch = clip_side(ratio, At, lo, hi)
          clip_low, clip_high, clip_n = clip_low + (cl and 1 or 0), clip_high + (ch and 1 or 0), clip_n + 1
        else
          l, g = seq_loss, seq_grad
        end
        if m ~= 1 and not policy_l then
          l = m * l
          if not (old and level == "sequence") then g = m * g end
        end
        if isw then l, g = isw[t] * l, isw[t] * g end   -- the off-policy correction (remax.step.offpolicy)
        if ref then
          if kl == "k3" then
            local k = M.kl_k3(lp[t], ref[t])
            kl_sum = kl_sum + k
            if beta ~= 0 then
              l = l + beta * k
              g = g + beta * M.kl_k3_grad(lp[t], ref[t])
            end
          else
            kl_sum = kl_sum + M.kl_k1(lp[t], ref[t])
          end
        end
        loss = loss + c * l
        w[t] = c * g
      end
      tokens = tokens + n
    end
    weights[r] = w
  end
  return weights, { loss = loss, kl_sum = kl_sum, tokens = tokens, clip_low = clip_low, clip_high = clip_high,
    clip_n = clip_n }
end

---------------------------------------------------------------------------- entropy

-- The q-quantile of a list of numbers with linear interpolation between order statistics
-- (torch.quantile's default): position q * (n - 1) in the sorted list.
function M.quantile(list, q)
  local n = #list
  if n == 0 then return nil end
  local s = {}
  for i, v in ipairs(list) do s[i] = v end
  table.sort(s)
  local pos = q * (n - 1)
  local i = math.floor(pos)
  local frac = pos - i
  if i + 1 >= n then return s[n] end
  return s[i + 1] + frac * (s[i + 2] - s[i + 1])
end

-- TRL's top_entropy_quantile mask: among the loss tokens of entropies[r][t] (rows with
-- masked = true left out), keep (1) the tokens whose entropy is >= the (1 - q)-quantile, drop
-- (0) the rest. q = 1 keeps every token. Returns masks[r][t].
function M.entropy_masks(entropies, masked, q)
  local all = {}
  for r, e in ipairs(entropies) do
    if not (masked and masked[r]) then for _, v in ipairs(e) do all[#all + 1] = v end end
  end
  local thr = M.quantile(all, 1 - q)
  local out = {}
  for r, e in ipairs(entropies) do
    local m = {}
    for t, v in ipairs(e) do m[t] = (thr and v >= thr and not (masked and masked[r])) and 1 or 0 end
    out[r] = m
  end
  return out
end

-- The entropy bonus (TRL's entropy_coef): the loss gains -coef * H, H the mean per-token
-- entropy over the step, normalised as TRL normalises it: with agg = "token-mean" (dapo) each
-- token's entropy is divided by the step's loss tokens num_tokens; otherwise by the tokens of its
-- micro-batch (chunk_tokens) times the number of micro-batches. masks[r][t] (top entropy) and
-- masked rows leave tokens out. Returns dH[r][t] = d loss / d entropy_t and the bonus's share of
-- the loss.
function M.entropy_bonus(entropies, opts)
  local coef = opts.coef or 0
  local masks, masked = opts.masks, opts.masked or {}
  local function on(r, t) return not masked[r] and (not masks or masks[r][t] == 1) end
  local scale
  if opts.agg == "token-mean" then
    scale = 1 / math.max(opts.num_tokens, 1)
  else
    local n = opts.count   -- given when the micro-batch's rows run in several packs (remax.step.pack)
    if not n then
      n = 0
      for r, e in ipairs(entropies) do for t = 1, #e do if on(r, t) then n = n + 1 end end end
    end
    scale = 1 / (math.max(n, 1) * (opts.chunks or 1))
  end
  local d, loss = {}, 0
  for r, e in ipairs(entropies) do
    d[r] = {}
    for t, v in ipairs(e) do
      if on(r, t) then
        d[r][t] = -coef * scale
        loss = loss - coef * scale * v
      else
        d[r][t] = 0
      end
    end
  end
  return d, loss
end

return M
