-- remax.step.micro: one micro-batch of an update (remax.step.policy's): the forward, the loss
-- weights (remax.step.algos) and the backward of its rows, padded to the longest row or, with
-- padding_free (the default), packed (remax.step.pack) and split into packs of at most
-- max_tokens_per_microbatch tokens; the old log-probabilities of num_iterations > 1 from the
-- same layout; the token balance of the step's rows over every rank's micro-batches (balance);
-- the activation plan's size (reserve); and the k1 advantage's log-probabilities (row_logprobs).
-- Functions of what they train with, tr (remax.step.policy's Policy:trainer: model, ref, world,
-- cfg, and the loss's entropy terms top_entropy_quantile and entropy_coef): they write no field
-- of the Policy or of a Step, only the training rows' own (row.old, row.ref_lp).
local algos = require("remax.step.algos")
local tensor = require("remax.bind.tensor")
local fit = require("remax.step.fit")
local pack = require("remax.step.pack")
local episodes = require("remax.step.episodes")
local offpolicy = require("remax.step.offpolicy")

local M = {}

-- prompt .. completion token lists of rows, and where each completion starts.
local function row_seqs(rows)
  local seqs, starts, lens = {}, {}, {}
  for n, row in ipairs(rows) do
    local s = {}
    for i = 1, #row.prompt_ids do s[i] = row.prompt_ids[i] end
    for i = 1, #row.completion do s[#row.prompt_ids + i] = row.completion[i] end
    seqs[n], starts[n], lens[n] = s, #row.prompt_ids, #row.completion
  end
  return seqs, starts, lens
end

-- The completion part of each row of a [B, T] tensor (logprobs, entropies) as Lua lists; of an
-- episode (multi-turn), its model tokens only (remax.step.episodes).
local function completion_values(x, rows, starts)
  local lens = {}
  for n, row in ipairs(rows) do lens[n] = #row.completion end
  return episodes.model_rows(x:row_spans(starts, lens), rows)
end

-- pack.forward's per-row completion values, an episode's model tokens only.
local function packed_forward(model, rows, seqs, starts, lens, opts)
  local a, b, fwd = pack.forward(model, seqs, starts, lens, opts)
  return episodes.model_rows(a, rows), b and episodes.model_rows(b, rows), fwd
end

-- The log-probabilities of rows under the current weights, from a forward that computes what
-- the training forward computes on the same micro-batch (same rows, same padding), so the
-- first of num_iterations updates sees a ratio of exactly 1. Stored as row.old.
function M.old_logprobs(tr, rows, what)
  if tr.cfg.padding_free then   -- packing: the same packs as the training forward (micro_step)
    for _, sub in ipairs(M.packs(tr.cfg, rows, what)) do
      local seqs, starts, lens = row_seqs(sub)
      local old = packed_forward(tr.model, sub, seqs, starts, lens, { train = true, checkpoint = tr.cfg.gradient_checkpointing })
      for n, row in ipairs(sub) do row.old = old[n] end
    end
    return
  end
  local seqs, starts = row_seqs(rows)
  local logp = tr.model:logprobs(seqs, nil, { train = true, checkpoint = tr.cfg.gradient_checkpointing })
  local old = completion_values(logp, rows, starts)
  for n, row in ipairs(rows) do row.old = old[n] end
end

-- The packs of a micro-batch's rows: with padding_free, balanced packs of at most
-- max_tokens_per_microbatch tokens (one pack without a budget); else the micro-batch itself.
-- what: where a refusal happened ("step 3"). cfg: the settings.
function M.packs(cfg, rows, what)
  if not cfg.padding_free then return { rows } end
  local lens = {}
  for n, row in ipairs(rows) do lens[n] = #row.prompt_ids + #row.completion end
  local out = {}
  for p, idx in ipairs(pack.split(lens, cfg.max_tokens_per_microbatch, what)) do
    local sub = {}
    for j, i in ipairs(idx) do sub[j] = rows[i] end
    out[p] = sub
  end
  return out
end

-- Forward, loss weights and backward for one pack of rows of a micro-batch (micro_step);
-- returns stats. chunk.tokens: the loss tokens of the micro-batch (bnpo's normaliser, skipped
-- rows included); pre: what micro_step computed over the whole micro-batch (masks, count).
local function pack_step(tr, rows, totals, chunk, pre, acc)
  local cfg = tr.cfg
  chunk, pre, acc = chunk or {}, pre or {}, acc or {}
  local seqs, starts, clens = row_seqs(rows)
  local packed = cfg.padding_free
  local use_ref = cfg.kl_mode == "k3"
  -- the reference first: with LoRA it is the policy's own model, whose last forward before the
  -- backward must be the training one
  local refs
  if use_ref then
    if rows[1].ref_lp then
      refs = {}
      for n, row in ipairs(rows) do refs[n] = row.ref_lp end
    else
      refs = packed and packed_forward(tr.ref, rows, seqs, starts, clens) or completion_values(tr.ref:logprobs(seqs), rows, starts)
      if cfg.num_iterations > 1 then for n, row in ipairs(rows) do row.ref_lp = refs[n] end end
    end
  end
  local T, N = 0, 0
  for _, s in ipairs(seqs) do T, N = math.max(T, #s), N + #s end
  local what = ("step %d"):format(chunk.step or 0)
  if packed then fit.check_train(tr.model, 1, N, { checkpoint = cfg.gradient_checkpointing, what = what })
  else fit.check_train(tr.model, #seqs, T, { checkpoint = cfg.gradient_checkpointing, what = what }) end
  local fopts = { train = true, checkpoint = cfg.gradient_checkpointing, entropy = true }
  local logp, ent, lps, ents, fwd, B
  if packed then
    lps, ents, fwd = packed_forward(tr.model, rows, seqs, starts, clens, fopts)
  else
    logp, ent = tr.model:logprobs(seqs, nil, fopts)
    B, T = logp:size(1), logp:size(2)
    lps, ents = completion_values(logp, rows, starts), completion_values(ent, rows, starts)
  end
  local masks
  if pre.masks then
    masks = {}
    for n, row in ipairs(rows) do masks[n] = pre.masks[row] end
  elseif tr.top_entropy_quantile < 1 then
    local masked = {}
    for n, row in ipairs(rows) do masked[n] = row.masked end
    masks = algos.entropy_masks(ents, masked, tr.top_entropy_quantile)
  end
  local parts = {}
  local ent_sum, ent_n = 0, 0
  local correct = cfg.vllm_importance_sampling_correction   -- rows with the sampler's log-probabilities (SFT's have none)
  for n, row in ipairs(rows) do
    parts[n] = { adv = row.adv, logp = lps[n], ref = refs and refs[n], old = row.old, mask = masks and masks[n],
      masked = row.masked, returns = row.returns }   -- returns: gamma's per-token return (algos.gamma_returns)
    if correct and row.behaviour and not row.masked then   -- the sampler's policy against the one the update starts from
      parts[n].is_weight = offpolicy.row_weights(row.old or lps[n], row.behaviour, cfg.vllm_importance_sampling_mode,
        cfg.vllm_importance_sampling_cap, acc.sampling)
    end
    if not row.masked then
      for _, e in ipairs(ents[n]) do ent_sum, ent_n = ent_sum + e, ent_n + 1 end
    end
  end
  -- the rows by normalisation unit: the micro-batch each came from (row.unit, set by M.balance
  -- when rows moved to balance tokens), else this micro-batch; each unit's normalisers as padded
  local units, by = {}, {}
  local here = { tokens = chunk.tokens, count = pre.count }
  for n, row in ipairs(rows) do
    local u = row.unit or here
    if not by[u] then by[u] = {}; units[#units + 1] = u end
    table.insert(by[u], n)
  end
  local function pick(list, idx)
    if not list then return nil end
    local out = {}
    for j, n in ipairs(idx) do out[j] = list[n] end
    return out
  end
  local weights, stats = {}, nil
  for _, u in ipairs(units) do
    local idx = by[u]
    local w, st = algos.token_weights(#units == 1 and parts or pick(parts, idx), {
      beta = (cfg.kl_mode == "none" or cfg.kl_mode == "return") and 0 or cfg.beta, kl = cfg.kl_estimator, agg = cfg.aggregation,
      num_rows = totals.rows, num_tokens = totals.tokens, max_length = cfg.max_completion_length,
      chunk_tokens = u.tokens, chunks = totals.chunks,
      epsilon = cfg.epsilon, epsilon_high = cfg.epsilon_high, delta = cfg.delta, level = cfg.importance_sampling_level,
      loss_type = not sft and cfg.loss_type or nil,   -- its own per-token term (cispo, sapo), else the clipped one
      sapo_temperature_pos = cfg.sapo_temperature_pos, sapo_temperature_neg = cfg.sapo_temperature_neg,
    })
    for j, n in ipairs(idx) do weights[n] = w[j] end
    if not stats then stats = st else for k, v in pairs(st) do stats[k] = stats[k] + v end end
  end
  stats.entropy_sum, stats.entropy_n = ent_sum, ent_n
  local dent
  if tr.entropy_coef ~= 0 then
    local masked = {}
    for n, row in ipairs(rows) do masked[n] = row.masked end
    dent = {}
    for _, u in ipairs(units) do
      local idx = by[u]
      local d, bonus = algos.entropy_bonus(pick(ents, idx), { coef = tr.entropy_coef, masks = pick(masks, idx),
        masked = pick(masked, idx), agg = cfg.aggregation, num_tokens = totals.tokens, chunks = totals.chunks, count = u.count })
      for j, n in ipairs(idx) do dent[n] = d[j] end
      stats.loss = stats.loss + bonus
    end
  end
  episodes.spread_rows(rows, weights, dent)   -- an episode's weights over its whole sequence: 0 on observations
  if acc.earlier then tr.model:hold_grads() end   -- this pack's gradient from zero, then added
  if packed then
    tr.model:backward(pack.gradient(fwd, weights), dent and pack.gradient(fwd, dent) or nil)
  else
    tr.model:backward(tensor.from_row_spans(weights, starts, B, T, logp:dtype_name()),
      dent and tensor.from_row_spans(dent, starts, B, T, logp:dtype_name()) or nil)
  end
  if acc.earlier then tr.model:add_held_grads() end
  acc.earlier = true
  return stats
end


-- The activation plan sized once for max_tokens_per_microbatch (padding_free), before the
-- first training forward: reserved is the budget it was sized for so far (nil: none). Returns
-- the budget it is sized for now.
function M.reserve(model, cfg, reserved, packs, what)
  local budget = cfg.padding_free and cfg.max_tokens_per_microbatch
  if not budget then return reserved end
  -- the activation plan sized for the largest pack: the budget, or the longest pack so far when
  -- none reaches it (a budget far above every row plans no memory it will never use)
  local longest = 0
  for _, sub in ipairs(packs or {}) do
    local n = 0
    for _, row in ipairs(sub) do n = n + #row.prompt_ids + #row.completion end
    longest = math.max(longest, n)
  end
  local plan = math.min(budget, math.max(longest, reserved or 0))
  if reserved ~= plan then
    local ck = cfg.gradient_checkpointing
    fit.check_train(model, 1, plan, { checkpoint = ck, what = what, budget = budget })
    model:reserve(plan, { train = true, checkpoint = ck })
  end
  return plan
end

-- One micro-batch (a normalisation unit: its loss tokens are chunk.tokens) as one or more packs,
-- each a forward and a backward, their gradients summed as the micro-batches' are (acc.earlier:
-- a gradient is already held). What the loss needs from the whole micro-batch (top-entropy
-- masks, the entropy bonus's token count) is computed over all its rows first, so packing
-- changes nothing but the summation order. Returns the summed stats.
function M.run(tr, rows, totals, chunk, acc, given_packs)
  local cfg = tr.cfg
  chunk, acc = chunk or {}, acc or {}
  local what = ("step %d"):format(chunk.step or 0)
  local packs = given_packs or M.packs(cfg, rows, what)
  local pre = {}
  local entropy_terms = tr.top_entropy_quantile < 1 or tr.entropy_coef ~= 0
  if #packs > 1 and entropy_terms and not rows[1].unit then   -- balanced rows carry their unit's count
    local masked = {}
    for n, row in ipairs(rows) do masked[n] = row.masked end
    if tr.top_entropy_quantile < 1 then   -- the quantile is over the whole micro-batch's tokens
      local ents = {}
      for _, sub in ipairs(packs) do
        local seqs, starts, lens = row_seqs(sub)
        local _, e = packed_forward(tr.model, sub, seqs, starts, lens, { entropy = true })
        for n, row in ipairs(sub) do ents[row] = e[n] end
      end
      local list = {}
      for n, row in ipairs(rows) do list[n] = ents[row] end
      local masks = algos.entropy_masks(list, masked, tr.top_entropy_quantile)
      pre.masks = {}
      for n, row in ipairs(rows) do pre.masks[row] = masks[n] end
    end
    local count = 0   -- the entropy bonus's tokens of the micro-batch
    for _, row in ipairs(rows) do
      if not row.masked then
        local m = pre.masks and pre.masks[row]
        for t = 1, episodes.loss_tokens(row) do if not m or m[t] == 1 then count = count + 1 end end
      end
    end
    pre.count = count
  end
  local total
  for _, sub in ipairs(packs) do
    local st = pack_step(tr, sub, totals, chunk, pre, acc)
    if not total then total = st
    else
      for k, v in pairs(st) do total[k] = total[k] + v end
    end
  end
  return total
end

-- Token balance (padding_free; docs/distributed.md, "Token balance"): the step's micro-batches
-- of every rank are slots, in rank order (rank r holds the slots of its own micro-batches), and
-- the rows of all of them are assigned to the slots by tokens (prompt + completion, pack.assign),
-- so every rank's and every micro-batch's forward holds about the same number of tokens. Each
-- row keeps the normalisers of the micro-batch it came from (row.unit: bnpo's loss tokens, the
-- entropy bonus's token count), so every loss type's normalisation is the padded one's; the
-- step's global counts are summed before and do not change. A collective (every rank calls it):
-- every rank gets every rank's rows (remax.bind.dist's concat) and computes the same assignment.
-- Not done without padding_free, nor with top_entropy_quantile < 1 (the mask is a quantile over
-- a micro-batch's entropies: its rows stay together). chunks: Step:micro_batches's; returns
-- this rank's chunks (as many as before), {rows = rows to train}.
function M.balance(tr, chunks)
  if not tr.cfg.padding_free or tr.top_entropy_quantile < 1 then return chunks end
  local world = tr.world
  local units, mine = {}, {}
  for c, ch in ipairs(chunks) do
    local count = 0   -- the entropy bonus's tokens of the micro-batch: its trained rows' loss tokens
    for _, r in ipairs(ch.rows) do count = count + episodes.loss_tokens(r) end
    units[c] = { tokens = ch.tokens, count = count }
    for _, r in ipairs(ch.rows) do
      local copy = {}
      for k, v in pairs(r) do if k ~= "unit" then copy[k] = v end end
      copy.u = c
      mine[#mine + 1] = copy
    end
  end
  local parts = { { units = units, rows = mine } }
  if world.size > 1 then parts = world:concat(parts) end
  local all, lens, slot0, offset = {}, {}, nil, 0
  for r, p in ipairs(parts) do
    if r == world.rank + 1 then slot0 = offset end
    local u = {}
    for c, x in ipairs(p.units) do u[c] = { tokens = x.tokens, count = x.count } end
    for _, row in ipairs(p.rows) do
      row.unit, row.u = u[row.u], nil
      all[#all + 1] = row
      lens[#all] = #row.prompt_ids + #row.completion
    end
    offset = offset + #p.units
  end
  local slots = pack.assign(lens, offset)
  local out = {}
  for c = 1, #chunks do
    local list = {}
    for j, i in ipairs(slots[slot0 + c]) do list[j] = all[i] end
    out[c] = { rows = list }
  end
  return out
end

-- Log-probabilities (no gradients) of the completion tokens of prompt .. completion rows seqs,
-- completions starting at starts[n] and lens[n] long, as Lua lists: padded, or with
-- padding_free packed in packs of at most max_tokens_per_microbatch tokens (the k1 advantage's
-- forwards, the policy's and the reference's). what: where a refusal happened.
function M.row_logprobs(cfg, model, seqs, starts, lens, what)
  local out = {}
  if cfg.padding_free then
    local tot = {}
    for n, s in ipairs(seqs) do tot[n] = #s end
    for _, idx in ipairs(pack.split(tot, cfg.max_tokens_per_microbatch, what)) do
      local ss, st, ln = {}, {}, {}
      for j, n in ipairs(idx) do ss[j], st[j], ln[j] = seqs[n], starts[n], lens[n] end
      local lps = pack.forward(model, ss, st, ln)
      for j, n in ipairs(idx) do out[n] = lps[j] end
    end
    return out
  end
  local lp = model:logprobs(seqs):totable()
  for n = 1, #seqs do
    local v = {}
    for t = 1, lens[n] do v[t] = lp[n][starts[n] + t] end
    out[n] = v
  end
  return out
end

return M
