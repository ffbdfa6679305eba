-- remax.step.pack: padding-free training (docs/trainer.md, "Packing"). A micro-batch's rows
-- (prompt .. completion token lists) are split into packs of at most max_tokens_per_microbatch
-- tokens by a balanced packing, and each pack runs as one packed forward and backward
-- (model:logprobs_packed: the rows end to end, attention within each row, no padding).
--
--   local packs = pack.split(lens, budget)            -- packs[p] = {row indices}, balanced
--   local lp, ent, fwd = pack.forward(model, seqs, starts, lens, opts)
--   model:backward(pack.gradient(fwd, weights, dtype), dent and pack.gradient(fwd, dent, dtype))
local M = {}

-- Refuses a row longer than the budget, naming the setting, the row's length and the budget.
local function check_budget(lens, budget, what)
  for i, n in ipairs(lens) do
    if n > budget then
      error(("%smax_tokens_per_microbatch = %d is smaller than row %d's %d tokens (prompt + completion): "
        .. "raise max_tokens_per_microbatch to at least %d, or lower max_prompt_length + max_completion_length")
        :format(what and what .. ": " or "", budget, i, n, n), 0)
    end
  end
end

-- Rows of lengths lens[i] into as few packs of at most `budget` tokens as a balanced packing
-- finds: k = ceil(total / budget) packs to start with, the rows longest first each into the
-- pack holding the fewest tokens that still has room (ties: the lower index), and one more pack
-- whenever a row fits none. Every pack's rows are listed in their original order, so a pack
-- reads like a slice of the micro-batch. budget nil or 0: one pack of every row.
-- Returns packs[p] = {i, ...}.
function M.split(lens, budget, what)
  local n = #lens
  if n == 0 then return {} end
  if not budget or budget <= 0 then
    local all = {}
    for i = 1, n do all[i] = i end
    return { all }
  end
  check_budget(lens, budget, what)
  local total = 0
  for _, l in ipairs(lens) do total = total + l end
  local k = math.max(1, math.ceil(total / budget))
  local order = {}
  for i = 1, n do order[i] = i end
  table.sort(order, function(a, b) if lens[a] ~= lens[b] then return lens[a] > lens[b] end return a < b end)
  local load, members = {}, {}
  for p = 1, k do load[p], members[p] = 0, {} end
  for _, i in ipairs(order) do
    local best
    for p = 1, #load do
      if load[p] + lens[i] <= budget and (not best or load[p] < load[best]) then best = p end
    end
    if not best then
      best = #load + 1
      load[best], members[best] = 0, {}
    end
    load[best] = load[best] + lens[i]
    table.insert(members[best], i)
  end
  local packs = {}
  for p = 1, #members do
    if #members[p] > 0 then
      table.sort(members[p])
      packs[#packs + 1] = members[p]
    end
  end
  return packs
end

-- Rows of lengths lens[i] (in a global order every rank sees the same) to `slots` slots,
-- balancing the tokens each slot holds: rows longest first (ties: the lower index), each to the
-- slot holding the fewest tokens so far (ties: the lower slot). Deterministic: the same lens
-- give the same assignment on every rank. Returns out[s] = {i, ...} in the rows' order.
function M.assign(lens, slots)
  local out, load = {}, {}
  for s = 1, slots do out[s], load[s] = {}, 0 end
  if slots == 0 then return out end
  local order = {}
  for i = 1, #lens do order[i] = i end
  table.sort(order, function(a, b) if lens[a] ~= lens[b] then return lens[a] > lens[b] end return a < b end)
  for _, i in ipairs(order) do
    local best = 1
    for s = 2, slots do if load[s] < load[best] then best = s end end
    load[best] = load[best] + lens[i]
    table.insert(out[best], i)
  end
  for s = 1, slots do table.sort(out[s]) end
  return out
end

-- The packed forward of rows seqs (prompt .. completion lists) whose completions start at
-- starts[r] (the prompt's length) and run lens[r] tokens: the completions' log-probabilities
-- (and entropies with opts.entropy) as Lua lists per row, like the padded forward's
-- row_spans, and what pack.gradient needs to lay weights back out.
function M.forward(model, seqs, starts, lens, opts)
  local logp, ent, offsets = model:logprobs_packed(seqs, opts)
  local lp_all = logp:totable()[1]
  local ent_all = ent and ent:totable()[1]
  local lps, ents = {}, ent and {} or nil
  for r = 1, #seqs do
    local base = offsets[r] + starts[r]
    local v, e = {}, ent and {} or nil
    for t = 1, lens[r] do
      v[t] = lp_all[base + t]
      if e then e[t] = ent_all[base + t] end
    end
    lps[r] = v
    if ents then ents[r] = e end
  end
  return lps, ents, { offsets = offsets, starts = starts, N = offsets[#seqs + 1], dtype = logp:dtype_name() }
end

-- values[r][t] (a gradient per completion token) as the [1, N] layout of the packed forward fwd.
function M.gradient(fwd, values)
  local flat = {}
  for i = 1, fwd.N do flat[i] = 0 end
  for r, v in ipairs(values) do
    local base = fwd.offsets[r] + fwd.starts[r]
    for t, w in ipairs(v) do flat[base + t] = w end
  end
  return require("remax.bind.tensor").from_row_spans({ flat }, { 0 }, 1, fwd.N, fwd.dtype)
end

-- The padding share of a padded micro-batch of rows of these lengths: 1 - tokens / (B * T_max).
function M.padding_share(lens)
  local total, T = 0, 0
  for _, l in ipairs(lens) do total, T = total + l, math.max(T, l) end
  if #lens == 0 or T == 0 then return 0 end
  return 1 - total / (#lens * T)
end

return M
