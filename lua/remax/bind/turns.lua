-- remax.bind.turns: the turn ends of a multi-turn model:generate (opts.on_turn_end). After a
-- step, every row that stopped (a stop id or a stop string) and has not ended is an event; the
-- callback's observations continue those rows in one rx_generate_continue (a batched prefill of
-- only the new tokens into their KV caches), and rows it gives nothing end. A continued row may
-- stop again on its first token, so the loop repeats until no row is waiting.
--
-- A row whose observation is not ready (a tool still running in another process) is given
-- turns.WAIT: it stays paused, its KV cache kept, while the other rows decode, for as many steps
-- as it takes. After every step opts.on_wait(block) is asked for the answers that came: it
-- returns { [row] = token ids (the row continues) | false (its episode ends) }, the rows it does
-- not name wait on. When no row decodes, it is called with block = true and should wait for one.
local ffi = require("ffi")
local rx = require("remax.bind.ffi")
local C = rx.C

local M = {}
M.WAIT = setmetatable({}, { __tostring = function() return "turns.WAIT" end })
local Turns = {}
Turns.__index = Turns

-- gen: the rx_generator; a: the generation's arrays {tokens, lengths, finish, max_new, rows, R,
-- V, done}; turn_start[r]: where row r's turn began (shared with the stop-string check);
-- on_continue(r): a row continues; after(): the rows continued (the stop strings look again).
function M.new(gen, a, on_turn_end, turn_start, on_continue, after, on_wait)
  return setmetatable({ gen = gen, a = a, fn = on_turn_end, turn_start = turn_start, on_continue = on_continue,
    after = after, turn_ends = {}, ended = {}, waiting = {}, n_waiting = 0, on_wait = on_wait }, Turns)
end

-- Whether rows wait for their observations.
function Turns:any_waiting() return self.n_waiting > 0 end

-- The request's append_capacity for opts (on_turn_end, append_capacity; default 256), within
-- the model's positions; errors name the setting.
function M.capacity(opts, prompts, max_new, max_pos)
  if type(opts.on_turn_end) ~= "function" then
    error("generate: on_turn_end must be a function(events) -> { [row] = token ids }", 0)
  end
  local cap = opts.append_capacity
  if cap ~= nil and (type(cap) ~= "number" or cap < 1 or cap ~= math.floor(cap)) then
    error(("generate: append_capacity = %s must be an integer >= 1"):format(tostring(cap)), 0)
  end
  local longest = 0
  for _, p in ipairs(prompts) do longest = math.max(longest, #p) end
  local room = max_pos - longest - max_new   -- positions beyond the model's are never reached
  if room < 1 then
    error(("generate: a prompt of %d tokens and max_new_tokens = %d fill max_position_embeddings = %d: no room for observations")
      :format(longest, max_new, max_pos), 0)
  end
  return math.min(cap or 256, room)
end

function Turns:events()
  local a, events = self.a, {}
  for r = 0, a.R - 1 do
    if a.finish[r] == C.RX_FINISH_STOP and not self.ended[r] and not self.waiting[r] then
      local e = { row = r + 1, tokens = {}, stop_string = self.stop_string and self.stop_string(r) }
      for t = self.turn_start[r] or 0, a.lengths[r] - 1 do e.tokens[#e.tokens + 1] = a.tokens[r * a.max_new + t] end
      events[#events + 1] = e
    end
  end
  return events
end

-- The decisions { {r =, add =}, ... } -> the rows that continue, continued in one batch; whether any did.
function Turns:apply(decisions)
  local a = self.a
  local list, n_tok = {}, 0
  for _, d in ipairs(decisions) do
    local r, add = d.r, d.add
    if add == M.WAIT then
      if not self.on_wait then error("generate: on_turn_end gave row " .. (r + 1) .. " turns.WAIT, but there is no on_wait", 0) end
      self.waiting[r] = true
      self.n_waiting = self.n_waiting + 1
    elseif add and a.lengths[r] < a.rows[r].max_new_tokens then
      if type(add) ~= "table" then
        error(("generate: on_turn_end gave row %d a %s, expected a list of token ids"):format(r + 1, type(add)), 0)
      end
      for i, id in ipairs(add) do
        if type(id) ~= "number" or id ~= math.floor(id) or id < 0 or id >= a.V then
          error(("generate: on_turn_end: row %d, token %d: %s is not a token id in [0, %d)"):format(r + 1, i, tostring(id), a.V), 0)
        end
      end
      list[#list + 1] = { r = r, ids = add }
      n_tok = n_tok + #add
    else
      self.ended[r] = true
    end
  end
  if #list == 0 then return false end
  local crow = ffi.new("int64_t[?]", #list)
  local ctok = ffi.new("int32_t[?]", math.max(n_tok, 1))
  local coff = ffi.new("int64_t[?]", #list + 1)
  local k = 0
  for i, c in ipairs(list) do
    crow[i - 1], coff[i - 1] = c.r, k
    for _, id in ipairs(c.ids) do ctok[k] = id; k = k + 1 end
    self.turn_start[c.r] = a.lengths[c.r]
    self.on_continue(c.r)
  end
  coff[#list] = k
  if C.rx_generate_continue(self.gen, #list, crow, ctok, coff) ~= 0 then error(rx.last_error(), 0) end
  a.done[0] = 0
  self.after()
  return true
end

-- After a step: the rows that stopped (on_turn_end) and the answers that came for rows waiting
-- (on_wait), until no row is left to continue now. block: no row decodes, so on_wait may wait.
function Turns:run(block)
  local a = self.a
  while true do
    local decisions = {}
    local events = self:events()
    if #events > 0 then
      local appends = self.fn(events) or {}
      for _, e in ipairs(events) do
        local r = e.row - 1
        self.turn_ends[r] = self.turn_ends[r] or {}
        table.insert(self.turn_ends[r], a.lengths[r])
        decisions[#decisions + 1] = { r = r, add = appends[e.row] }
      end
    end
    local continued = self:apply(decisions)
    if not continued and self.n_waiting > 0 then
      local got = self.on_wait(block and a.done[0] ~= 0) or {}
      local resolved = {}
      for row, add in pairs(got) do
        local r = row - 1
        if not self.waiting[r] then
          error(("generate: on_wait answered row %s, which is not waiting"):format(tostring(row)), 0)
        end
        if add == M.WAIT then error(("generate: on_wait gave row %d turns.WAIT (leave it out to keep it waiting)"):format(row), 0) end
        self.waiting[r] = nil
        self.n_waiting = self.n_waiting - 1
        resolved[#resolved + 1] = { r = r, add = add or nil }
      end
      table.sort(resolved, function(x, y) return x.r < y.r end)
      continued = self:apply(resolved)
      if not continued and #resolved == 0 and not (block and a.done[0] ~= 0) then return end
    elseif not continued then
      return
    end
  end
end

return M
