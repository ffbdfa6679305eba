-- remax.step.rollout: one step's generated completions as a type of its own, and the only place
-- that knows their layout. Rows are prompt-major: prompt i has `slots` rows, its G sampled rows
-- (slots 1..G) and then, when the plan has one, its greedy row (slot G + 1); row k of prompt i and
-- slot s is (i - 1) * slots + s. A prompt's rows never split across ranks for generation,
-- scoring and advantages (with padding_free the update then balances the training rows over
-- the ranks by tokens: remax.step.micro's balance).
--
--   local plan = rollout.plan(4, true, 1.0)       -- 4 samples at temperature 1 + 1 greedy row
--   local ro = rollout.new(plan, {prompts = rows, prompt_ids = ids, rows = model:generate(...).rows})
--   ro:grouped(reward)       -- per prompt {samples = {...}, greedy = r}: what estimators take
--   ro:training_rows(mask)   -- the sampled rows with their advantages, for the update
--   ro:gather(world)         -- rank 0: the whole step's rollout (rows in global prompt order)
--
-- Episodes add prompt_messages: per prompt, the first messages its episodes started from (what
-- the model saw, which may not be the dataset's prompt).
-- The step fills it in as it goes: score adds completions, batch, per (reward name -> values per
-- row), total, unscored, none; advantage adds reward, groups, adv (adv[i][s]), kl_k1.
local bit = require("bit")

local M = {}
local Rollout = {}
Rollout.__index = Rollout
M.Rollout = Rollout

-- The sampling plan of a generation call (remax.bind.generate.plan: the settings derive the
-- step's, cfg.sampling, and a task's evaluation makes its own with it).
M.plan = require("remax.bind.generate").plan

-- The random-stream keys of a generation call's rows (model:generate's row_keys): row (i, s) of
-- the call is the prompt at `first + i - 1` in its step (its place in the step's whole batch,
-- every rank's prompts counted) and slot s, packed as place * 2^25 + s. The engine draws row
-- k's token at position t from Philox keyed by (the step's seed, key, t), so a row's tokens
-- depend on the seed, the step, its place and its slot: not on the batch it is generated in,
-- on the rank, or on when its tools answer; and two rows with the same prompt text differ.
M.SLOT_BITS = 25   -- slots < 2^25 (num_generations is at most 2^24, + 1 greedy row)
function M.row_keys(slots, n, first)
  first = first or 1
  local keys = {}
  for i = 1, n do
    for s = 1, slots do keys[(i - 1) * slots + s] = (first + i - 1) * 2 ^ M.SLOT_BITS + s end
  end
  return keys
end

-- The seed of the prompt at `place` in a step whose generation seed is `seed` (Step:seed_for):
-- every episode of that prompt, the greedy one included, resets its environment with it, so an
-- environment that draws at random draws the same within a prompt. A whole number in [0, 2^31).
local function mul32(a, b)   -- a * b mod 2^32, exact in doubles (a < 2^32, b < 2^24)
  local hi, lo = math.floor(a / 65536), a % 65536
  return ((hi * b) % 65536 * 65536 + lo * b) % 4294967296
end
function M.prompt_seed(seed, place)
  local h = 2166136261   -- 32-bit FNV-1a over "seed:place"
  for c in (("%.0f:%.0f"):format(seed, place)):gmatch(".") do
    h = mul32(bit.bxor(h, c:byte()) % 4294967296, 16777619)
  end
  return h % 2147483648
end

-- A rollout from a plan and its parts: prompts (dataset rows), prompt_ids, rows (model:generate's
-- rows, each with prompt, slot, tokens, finish, and text), and any other fields (step, times).
-- Marks each row greedy or not.
function M.new(plan, fields)
  local ro = setmetatable(fields, Rollout)
  ro.slots, ro.G, ro.greedy = plan.slots, plan.num_generations, plan.greedy
  for _, r in ipairs(ro.rows) do r.greedy = ro.greedy and r.slot == ro.slots end
  return ro
end

-- The row index of prompt i, slot s.
function Rollout:index(i, s) return (i - 1) * self.slots + s end

-- values (one per row) grouped per prompt: groups[i] = {samples = {v_1, ..., v_G}, greedy = v_g}
-- (greedy: nil without a greedy row).
function Rollout:grouped(values)
  local groups = {}
  for i = 1, #self.prompts do
    local g = { samples = {} }
    for s = 1, self.G do g.samples[s] = values[self:index(i, s)] end
    if self.greedy then g.greedy = values[self:index(i, self.slots)] end
    groups[i] = g
  end
  return groups
end

-- The sampled rows' values per prompt, missing ones as NaN: out[i][s].
function Rollout:sample_table(values)
  local out = {}
  for i = 1, #self.prompts do
    out[i] = {}
    for s = 1, self.G do
      local v = values[self:index(i, s)]
      out[i][s] = v == nil and 0 / 0 or v
    end
  end
  return out
end

-- The advantage of row k (nil for a greedy row, or before advantages exist).
function Rollout:advantage(k)
  local r = self.rows[k]
  if r.greedy or not self.adv then return nil end
  return self.adv[r.prompt][r.slot]
end

-- The reward functions' inputs: the completions, and the batch (every dataset column of each
-- row's prompt, plus prompt_ids, completion_ids, greedy, finish; completion_messages when the
-- prompt is a conversation; an episode's prompt_messages, the first messages the model saw, and
-- environments, its environment's instance), aligned with the rows. collate:
-- remax.formats.data.collate.
function Rollout:reward_inputs(collate)
  local completions, expanded = {}, {}
  for k, r in ipairs(self.rows) do
    completions[k] = r.text
    expanded[k] = self.prompts[r.prompt]
  end
  local batch = collate(expanded)
  batch.prompt_ids, batch.completion_ids, batch.greedy, batch.finish = {}, {}, {}, {}
  for k, r in ipairs(self.rows) do
    batch.prompt_ids[k] = self.prompt_ids[r.prompt]
    batch.completion_ids[k] = r.tokens
    batch.greedy[k] = r.greedy
    batch.finish[k] = r.finish
    if r.completion_messages then   -- an episode: its turns, tool results and observations as messages
      batch.completion_messages = batch.completion_messages or {}
      batch.completion_messages[k] = r.completion_messages
      batch.prompt_messages = batch.prompt_messages or {}
      batch.prompt_messages[k] = self.prompt_messages and self.prompt_messages[r.prompt]
      if r.environment ~= nil then
        batch.environments = batch.environments or {}
        batch.environments[k] = r.environment
      end
    elseif type(expanded[k].prompt) == "table" then   -- conversational data: the reply as messages too
      batch.completion_messages = batch.completion_messages or {}
      batch.completion_messages[k] = { { role = "assistant", content = r.text } }
    end
  end
  return completions, batch
end

-- prompt .. completion token lists of rows `which` (row indices), with each completion's
-- length and where it starts.
function Rollout:sequences(which)
  local seqs, lens, starts = {}, {}, {}
  for n, k in ipairs(which) do
    local r = self.rows[k]
    local p = self.prompt_ids[r.prompt]
    local s = {}
    for i = 1, #p do s[i] = p[i] end
    for i = 1, #r.tokens do s[#p + i] = r.tokens[i] end
    seqs[n], lens[n], starts[n] = s, #r.tokens, #p
  end
  return seqs, lens, starts
end

-- The rows to train: each sampled row as {prompt = i, prompt_ids, completion, adv = A, key = k,
-- masked = true when mask_truncated leaves a row that hit the length limit out of the loss}.
function Rollout:training_rows(mask_truncated)
  local list = {}
  for k, r in ipairs(self.rows) do
    if not r.greedy then
      list[#list + 1] = { prompt = r.prompt, prompt_ids = self.prompt_ids[r.prompt], completion = r.tokens,
        adv = self.adv and self.adv[r.prompt][r.slot] or 1, key = k, loss_mask = r.loss_mask,
        returns = self.returns and self.returns[k],
        behaviour = r.logprobs,   -- the sampler's log-probabilities (remax.step.offpolicy)
        masked = (mask_truncated and r.finish == "length") or nil }
    end
  end
  return list
end

---------------------------------------------------------------------------- across ranks

-- The parts that metrics and completion logs read, as plain values (for remax.bind.dist's
-- gather, which sends plain Lua values).
function Rollout:pack()
  local rows = {}
  for k, r in ipairs(self.rows) do
    rows[k] = { prompt = r.prompt, slot = r.slot, greedy = r.greedy, text = r.text, tokens = r.tokens,
      finish = r.finish, loss_mask = r.loss_mask, completion_messages = r.completion_messages, episode = r.episode }
  end
  return { prompts = self.prompts, prompt_messages = self.prompt_messages, rows = rows, total = self.total, per = self.per, adv = self.adv, kl_k1 = self.kl_k1,
    groups = self.groups, none = self.none,
    tokens_generated = self.tokens_generated, time_generate = self.time_generate, time_score = self.time_score,
    unscored = self.unscored, slots = self.slots, G = self.G, greedy = self.greedy, step = self.step,
    episodes = self.episodes, has_tools = self.has_tools }
end

-- Packed rollouts of ranks 0, 1, ... -> one rollout over all their prompts, as one rank running
-- the global batch would have it (generation counts summed, times the slowest rank's).
function M.merge(parts)
  local first = parts[1]
  local whole = setmetatable({ slots = first.slots, G = first.G, greedy = first.greedy, step = first.step,
    episodes = first.episodes, has_tools = first.has_tools, prompt_messages = first.prompt_messages and {} or nil,
    prompts = {}, rows = {}, total = {}, adv = first.adv and {} or nil, groups = first.groups and {} or nil,
    none = first.none and {} or nil,
    tokens_generated = 0, unscored = 0, time_generate = 0, time_score = 0 }, Rollout)
  local per, kl = {}, first.kl_k1 and {} or nil
  for name in pairs(first.per or {}) do per[name] = {} end
  for _, p in ipairs(parts) do
    local offset = #whole.prompts
    local base = #whole.rows
    for i, prompt in ipairs(p.prompts) do whole.prompts[offset + i] = prompt end
    if whole.prompt_messages then for i, m in ipairs(p.prompt_messages) do whole.prompt_messages[offset + i] = m end end
    if whole.adv then for i, a in ipairs(p.adv) do whole.adv[offset + i] = a end end
    if whole.groups then for i, g in ipairs(p.groups) do whole.groups[offset + i] = g end end
    for k, r in ipairs(p.rows) do
      r.prompt = r.prompt + offset
      whole.rows[base + k] = r
      whole.total[base + k] = p.total[k]
      for name, list in pairs(per) do list[base + k] = p.per[name][k] end
      if kl then kl[base + k] = p.kl_k1[k] end
      if whole.none and p.none then whole.none[base + k] = p.none[k] end
    end
    whole.tokens_generated = whole.tokens_generated + p.tokens_generated
    whole.unscored = whole.unscored + (p.unscored or 0)
    whole.time_generate = math.max(whole.time_generate, p.time_generate or 0)
    whole.time_score = math.max(whole.time_score, p.time_score or 0)
  end
  whole.per, whole.kl_k1 = per, kl
  return whole
end

-- Rank 0: the whole step's rollout (rows in global prompt order). Other ranks: their own,
-- unchanged. Every rank must call it (a collective).
function Rollout:gather(world)
  if world.size == 1 then return self end
  local parts = world:gather(self:pack())
  if not world.is_root then return self end
  return M.merge(parts)
end

return M
