-- remax.bind.generate: generation with a KV cache over the engine's rx_generate_* (a model's
-- generate method, model:generate(prompts, opts), is M.run(model, prompts, opts)), and the one
-- check of sampling settings at the Lua boundary.
--
-- Generation with a KV cache. prompts: list of token-id lists. Options (temperature, top_k,
-- top_p, min_p, repetition_penalty, max_new_tokens) are numbers, or lists whose length gives the
-- number of rows per prompt, one entry per row ("slot"):
--   model:generate(prompts, { max_new_tokens = 256, temperature = {1.0, 1.0, 0.0}, stop = {eos} })
-- gives each prompt two sampled rows and one greedy row. Rows are returned prompt-major:
--   out.rows[i] = { prompt =, slot =, tokens = {...}, logprobs = {...}, finish = "stop"|"length" }
-- Randomness: Philox keyed by (seed, row key, position); the row key defaults to a hash of the
-- prompt's tokens and the slot, so the same prompt gets the same samples in any batch.
-- opts.row_keys (one per row) replaces it: the trainer keys rows by their prompt's place in the
-- step and their slot (remax.step.rollout.row_keys), so repeated prompts get distinct samples.
-- opts.on_token(step, out_rows) is called after each decoding step (streaming).
-- opts.stop_strings (with opts.detokenize = function(ids) -> text): a row also ends when one of
-- these strings appears in the text of its completion (vLLM's `stop`): its tokens are kept up to
-- and including the one that completed the string, row.finish = "stop", row.stop_string = it.
-- Multi-turn (remax.step.episodes): opts.on_turn_end(events) makes rows pause instead of ending.
-- After a step, each row that stopped (a stop id or a stop string) is an event
-- { row = r (1-based, prompt-major), tokens = {this turn's tokens}, stop_string = s or nil }; the
-- callback returns { [r] = {token ids to append} } for the rows that go on (their observation:
-- appended to the row's KV cache by one batched prefill, rx_generate_continue) and nothing for the
-- rows whose episode ends. opts.append_capacity (default 256) is the cache room for observations.
-- Each row then has row.turn_ends = { length after each turn }, its tokens the model's alone.
-- A row whose observation is not ready yet gets remax.bind.turns.WAIT instead: it stays paused
-- while the others decode, and opts.on_wait(block) -> { [r] = ids | false } gives it later
-- (called after every step while rows wait; block = true when no row decodes).
local ffi = require("ffi")
local rx = require("remax.bind.ffi")
local C = rx.C

local M = {}

local function slot_list(v, name)
  if type(v) == "table" then return v end
  return nil
end

local function fnv1a64(ids, slot)
  -- 64-bit FNV-1a over the ids and the slot, as two 32-bit halves to stay exact in Lua numbers
  local bit = require("bit")
  local h = ffi.new("uint64_t", 0xcbf29ce484222325ULL)
  local prime = ffi.new("uint64_t", 0x100000001b3ULL)
  local function mix(x)
    h = bit.bxor(h, ffi.new("uint64_t", x % 4294967296))
    h = h * prime
  end
  for _, id in ipairs(ids) do mix(id) end
  mix(0xFFFFFFFF)
  mix(slot)
  return h
end

-- The sampling plan of a generation call: G sampled rows at temperature, plus one greedy row
-- (temperature 0) when greedy; temperatures is the per-slot list M.run takes, slots its
-- rows_per_prompt (remax.step.rollout lays its rows out by it).
function M.plan(G, greedy, temperature)
  local temps = {}
  for s = 1, G do temps[s] = temperature end
  if greedy then temps[#temps + 1] = 0 end
  return { num_generations = G, greedy = greedy and true or false, slots = #temps, temperatures = temps }
end

-- The memory a generation call needs, as the engine counts it (rx_generate_memory_bytes: what
-- rx_generate_begin checks): rows rows of prompts prompts of up to max_prompt prompt tokens and
-- max_new new ones, for a model of config c (an rx_model_config); penalty: whether
-- repetition_penalty is on. Returns the bytes and the KV cache's share of them.
function M.memory_bytes(c, rows, prompts, max_prompt, max_new, penalty)
  local cache = ffi.new("int64_t[1]")
  local total = C.rx_generate_memory_bytes(c, rows, prompts, max_prompt, max_new, penalty and 1 or 0, cache)
  return tonumber(total), tonumber(cache[0])
end

-- Bytes of memory available to this process now (MemAvailable, what rx_generate_begin checks a
-- request against), or nil when unknown.
function M.available_bytes()
  local f = io.open("/proc/meminfo", "r")
  if not f then return nil end
  local text = f:read("*a")
  f:close()
  local kb = text:match("MemAvailable:%s*(%d+) kB")
  return kb and tonumber(kb) * 1024 or nil
end

-- The one check of sampling settings at the Lua boundary (model:generate, and the trainer's
-- config through remax.settings.config; the engine checks again as the last guard): nil when
-- temperature, top_k, top_p, min_p, repetition_penalty and max_new_tokens (entries of s; a
-- missing one is not checked) are valid, else what is wrong, naming the setting, its value and `where`.
function M.sampling_problem(s, where)
  where = where or ""
  local t, k, p, n = s.temperature, s.top_k, s.top_p, s.max_new_tokens
  local mp, rp = s.min_p, s.repetition_penalty
  if t ~= nil and not (t >= 0) then return ("temperature = %s%s must be >= 0"):format(tostring(t), where) end
  if p ~= nil and not (p > 0 and p <= 1) then return ("top_p = %s%s must be in (0, 1]"):format(tostring(p), where) end
  if mp ~= nil and not (mp >= 0 and mp <= 1) then return ("min_p = %s%s must be in [0, 1]"):format(tostring(mp), where) end
  if rp ~= nil and not (rp > 0 and rp < math.huge) then
    return ("repetition_penalty = %s%s must be a finite number > 0 (1: none)"):format(tostring(rp), where)
  end
  if k ~= nil and (k < 0 or k ~= math.floor(k)) then return ("top_k = %s%s must be an integer >= 0"):format(tostring(k), where) end
  if n ~= nil and (n < 1 or n ~= math.floor(n)) then return ("max_new_tokens = %s%s must be an integer >= 1"):format(tostring(n), where) end
  return nil
end

function M.run(self, prompts, opts)
  opts = opts or {}
  if type(prompts) ~= "table" or #prompts == 0 then error("generate: expected a non-empty list of prompts (token-id lists)", 2) end
  -- opts.rows_per_prompt (the caller's layout: remax.step.rollout's plan.slots) or, without it,
  -- the length of the per-slot lists, which must all agree with it
  local slots, slots_from = opts.rows_per_prompt or 1, opts.rows_per_prompt and "rows_per_prompt" or nil
  if type(slots) ~= "number" or slots < 1 or slots ~= math.floor(slots) then
    error(("generate: rows_per_prompt = %s: expected a whole number >= 1"):format(tostring(opts.rows_per_prompt)), 2)
  end
  for _, key in ipairs({ "temperature", "top_k", "top_p", "min_p", "repetition_penalty", "max_new_tokens" }) do
    local l = slot_list(opts[key], key)
    if l then
      if #l == 0 then error(("generate: %s is an empty list (give a number, or one entry per row of a prompt)"):format(key), 2) end
      if slots_from and #l ~= slots then
        error(("generate: per-slot lists disagree: %s has %d entries, %s has %d"):format(key, #l, slots_from, slots), 2)
      end
      slots, slots_from = #l, key
    end
  end
  local function per_slot(key, default, s)
    local v = opts[key]
    if type(v) == "table" then v = v[s] end
    if v == nil then return default end
    if type(v) ~= "number" then error(("generate: %s must be a number or a list of numbers"):format(key), 3) end
    return v
  end
  for s = 1, slots do   -- checked here so the message names the slot as the caller wrote it
    local problem = M.sampling_problem({ temperature = per_slot("temperature", 1.0, s), top_k = per_slot("top_k", 0, s),
      top_p = per_slot("top_p", 1.0, s), min_p = per_slot("min_p", 0.0, s),
      repetition_penalty = per_slot("repetition_penalty", 1.0, s), max_new_tokens = per_slot("max_new_tokens", 128, s) },
      slots > 1 and (" (slot %d)"):format(s) or "")
    if problem then error("generate: " .. problem, 2) end
  end
  local max_new = 0
  for s = 1, slots do max_new = math.max(max_new, per_slot("max_new_tokens", 128, s)) end
  local P, R = #prompts, #prompts * slots
  local total = 0
  local V = tonumber(self:cfg().vocab_size)
  for i, p in ipairs(prompts) do
    if type(p) ~= "table" then error(("generate: prompt %d is a %s, expected a list of token ids"):format(i, type(p)), 2) end
    if #p == 0 then error(("generate: prompt %d is empty"):format(i), 2) end
    for t, id in ipairs(p) do
      if type(id) ~= "number" or id ~= math.floor(id) or id < 0 or id >= V then
        error(("generate: prompt %d, position %d: %s is not a token id in [0, %d)"):format(i, t, tostring(id), V), 2)
      end
    end
    total = total + #p
  end
  local toks = ffi.new("int32_t[?]", math.max(total, 1))
  local offs = ffi.new("int64_t[?]", P + 1)
  local k = 0
  for i, p in ipairs(prompts) do
    offs[i - 1] = k
    for _, id in ipairs(p) do toks[k] = id; k = k + 1 end
  end
  offs[P] = k
  local row_prompt = ffi.new("int64_t[?]", R)
  local rows = ffi.new("rx_sampling[?]", R)
  local keys = opts.row_keys
  for i = 1, P do
    for s = 1, slots do
      local r = (i - 1) * slots + (s - 1)
      row_prompt[r] = i - 1
      local row = rows[r]
      row.temperature = per_slot("temperature", 1.0, s)
      row.top_k = per_slot("top_k", 0, s)
      row.top_p = per_slot("top_p", 1.0, s)
      row.min_p = per_slot("min_p", 0.0, s)
      row.repetition_penalty = per_slot("repetition_penalty", 1.0, s)
      row.max_new_tokens = per_slot("max_new_tokens", 128, s)
      row.key = keys and keys[r + 1] or fnv1a64(prompts[i], s)
    end
  end
  local stop = opts.stop or {}
  if type(stop) ~= "table" then error("generate: stop must be a list of token ids", 2) end
  for i, id in ipairs(stop) do
    if type(id) ~= "number" or id ~= math.floor(id) or id < 0 or id >= V then
      error(("generate: stop[%d] = %s is not a token id in [0, %d)"):format(i, tostring(id), V), 2)
    end
  end
  local stop_strings = opts.stop_strings or {}
  if type(stop_strings) ~= "table" then error("generate: stop_strings must be a list of strings", 2) end
  local longest = 0
  for i, s in ipairs(stop_strings) do
    if type(s) ~= "string" or s == "" then
      error(("generate: stop_strings[%d] = %s is not a non-empty string"):format(i, tostring(s)), 2)
    end
    longest = math.max(longest, #s)
  end
  if #stop_strings > 0 and type(opts.detokenize) ~= "function" then
    error("generate: stop_strings needs detokenize = function(ids) -> text", 2)
  end
  local stop_ids = ffi.new("int32_t[?]", math.max(#stop, 1))
  for i, id in ipairs(stop) do stop_ids[i - 1] = id end
  local req = ffi.new("rx_generate_request")
  req.num_prompts, req.prompt_tokens, req.prompt_offsets = P, toks, offs
  req.num_rows, req.row_prompt, req.rows = R, row_prompt, rows
  req.stop_ids, req.num_stop_ids = stop_ids, #stop
  req.seed = opts.seed or 0
  req.max_new_tokens = max_new
  local on_turn_end = opts.on_turn_end
  if on_turn_end ~= nil then   -- multi-turn: cache room for the observations
    req.append_capacity = require("remax.bind.turns").capacity(opts, prompts, max_new, tonumber(self:cfg().max_position_embeddings))
  end
  local res = ffi.new("rx_generate_result")
  local out_tok = ffi.new("int32_t[?]", R * max_new)
  local out_lp = ffi.new("float[?]", R * max_new)
  local lengths, finish = ffi.new("int32_t[?]", R), ffi.new("int32_t[?]", R)
  res.tokens, res.logprobs, res.lengths, res.finish = out_tok, out_lp, lengths, finish
  local now = require("remax.bind.clock").now   -- wall clock (os.clock sums the CPU time of all threads)
  local t0 = now()
  local g = ffi.new("rx_generator*[1]")
  local rc = C.rx_generate_begin(g, self.handle, req, res)
  if rc ~= 0 then error(rx.last_error(), 2) end
  local gen = ffi.gc(g[0], C.rx_generate_end)
  local done = ffi.new("int32_t[1]")
  local step = 0
  -- stop strings: after each step, the text of each row's newest tokens (enough of them for the
  -- longest string, whatever special tokens decode to nothing) is searched; an occurrence there
  -- ends in the newest token, since one that ended earlier would have ended the row then
  local matched, checked = {}, {}
  local turn_start = {}   -- multi-turn: where each row's current turn began
  local function check_stop_strings()
    local stopped = 0
    for r = 0, R - 1 do
      local n = lengths[r]
      if n > (checked[r] or 0) and finish[r] ~= C.RX_FINISH_STOP then
        checked[r] = n
        local w, text = longest + 1, ""
        local first = turn_start[r] or 0
        repeat
          local ids, lo = {}, math.max(first, n - w)
          for t = lo, n - 1 do ids[#ids + 1] = out_tok[r * max_new + t] end
          text = opts.detokenize(ids)
          w = w * 2
        until #text >= longest + 4 or lo == first
        for _, s in ipairs(stop_strings) do
          if text:find(s, 1, true) then
            matched[r] = s
            if C.rx_generate_stop_row(gen, r) ~= 0 then error(rx.last_error(), 3) end
            stopped = stopped + 1
            break
          end
        end
      end
    end
    return stopped
  end
  -- rows that stopped become turn ends: the callback's observations continue them (remax.bind.turns)
  local turns = on_turn_end and require("remax.bind.turns").new(gen, { tokens = out_tok, lengths = lengths, finish = finish,
    max_new = max_new, rows = rows, R = R, V = V, done = done }, on_turn_end, turn_start, function(r)
      matched[r], checked[r] = nil, nil
    end, function() if #stop_strings > 0 then check_stop_strings() end end, opts.on_wait)
  if turns then turns.stop_string = function(r) return matched[r] end end
  local function end_turns() turns:run() end
  if #stop_strings > 0 then check_stop_strings() end
  if on_turn_end then end_turns() end
  if opts.on_token then opts.on_token(step, out_tok, lengths, max_new) end
  while true do
    while done[0] == 0 do
      local rc = C.rx_generate_step(gen, done)
      if rc ~= 0 then error(rx.last_error(), 2) end
      step = step + 1
      if #stop_strings > 0 then check_stop_strings() end
      if on_turn_end then end_turns() end
      if opts.on_token then opts.on_token(step, out_tok, lengths, max_new) end
    end
    -- no row decodes, but rows wait for their observations: wait for them (on_wait, blocking)
    if not (turns and turns:any_waiting()) then break end
    turns:run(true)
  end
  C.rx_generate_end(ffi.gc(gen, nil))
  local out = { rows = {}, cache_bytes = tonumber(res.cache_bytes), decode_steps = tonumber(res.decode_steps),
    tokens_generated = 0, seconds = now() - t0 }
  for r = 0, R - 1 do
    local n = lengths[r]
    local row = { prompt = math.floor(r / slots) + 1, slot = r % slots + 1, tokens = {}, logprobs = {},
      finish = (finish[r] == C.RX_FINISH_STOP or matched[r]) and "stop" or "length", stop_string = matched[r],
      turn_ends = turns and (turns.turn_ends[r] or {}) or nil }
    for t = 0, n - 1 do
      row.tokens[t + 1] = out_tok[r * max_new + t]
      row.logprobs[t + 1] = out_lp[r * max_new + t]
    end
    out.tokens_generated = out.tokens_generated + n
    out.rows[r + 1] = row
  end
  return out
end

return M
