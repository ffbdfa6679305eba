-- remax.step.channels.wire: the one wire format of every channel (rewards, tools, environments;
-- py:, cmd:, http://): a request is a JSON object with an "id", its answer a JSON object that
-- echoes the id, one per line (or one per HTTP body). Here: requests written, answers read
-- (after the channel has bounded their size), an answer matched to its request by id, and the
-- handle of one request resolved.
--
-- A handle (remax.step.channels' registry makes them): { id, ch, t0, deadline, line } until it
-- is done; then h.done, and h.value (the answer's table) or h.err (text) and h.kind:
--   "error"    the answer's own {"error": ...} (h.traceback when it sent one)
--   "timeout"  no answer before the deadline
--   "died"     the worker died with the request on its way (h.exit says how, h.death counts)
--   "worker"   the channel failed: a bad answer, a connection that failed, a worker stopped
local json = require("remax.formats.json")
local now = require("remax.bind.clock").now
local cjson = require("cjson").new()

local M = {}

M.null = cjson.null

function M.clip(s, n)
  s = tostring(s)
  n = n or 300
  return #s > n and (s:sub(1, n) .. "...") or s
end

-- A decoded value as JSON, cut to n characters (for messages).
function M.show(v, n)
  local ok, text = pcall(cjson.encode, v)
  return M.clip(ok and text or tostring(v), n or 40)
end

-- The request line of obj (a table with its id): the text, or nil and why it cannot be written.
function M.encode(obj)
  local ok, line = pcall(json.encode, obj, { where = "the request" })
  if not ok then return nil, "the request cannot be written as JSON: " .. tostring(line):gsub("^runs: ", "") end
  return line
end

local function hex_at(s, i)
  local h = s:match("^%x%x%x%x", i)
  return h and tonumber(h, 16)
end

-- Python's json.dumps writes a lone surrogate of its text (os.fsdecode of a bad file name, a
-- string cut between the halves of a pair) as \udXXX, which is no character and which cjson
-- refuses: each becomes \ufffd, U+FFFD. A valid pair, and "\\udc80" (an escaped backslash),
-- stay. Linear in the number of backslashes; only run when one may be there.
function M.fix_surrogates(s)
  if not s:find("\\u[dD][89abcdefABCDEF]%x%x") then return s end
  local out, from, i = {}, 1, 1
  while true do
    local b = s:find("\\", i, true)
    if not b then break end
    if s:sub(b + 1, b + 1) ~= "u" then
      i = b + 2   -- \\, \", \n ...: the next character is escaped, never the start of an escape
    else
      local cp = hex_at(s, b + 2)
      local lone = false
      if cp and cp >= 0xD800 and cp <= 0xDBFF then
        local lo = s:sub(b + 6, b + 7) == "\\u" and hex_at(s, b + 8)
        if lo and lo >= 0xDC00 and lo <= 0xDFFF then i = b + 12 else lone = true end
      elseif cp and cp >= 0xDC00 and cp <= 0xDFFF then
        lone = true
      else
        i = b + 2
      end
      if lone then
        out[#out + 1] = s:sub(from, b - 1)
        out[#out + 1] = "\\ufffd"
        from, i = b + 6, b + 6
      end
    end
  end
  if from == 1 then return s end
  out[#out + 1] = s:sub(from)
  return table.concat(out)
end

-- One answer's text (a line or a body, already within its limit) -> its table, or nil and what
-- is wrong, worded after the channel's name ("the worker py:x.py answered ...").
function M.decode(text)
  if text:match("^%s*$") then
    return nil, ("answered %s; expected one JSON object with the request's \"id\""):format(
      text == "" and "nothing (an empty answer)" or "only white space")
  end
  local ok, v = pcall(cjson.decode, M.fix_surrogates(text))
  if not ok then
    return nil, ("answered something that is not JSON: %s (%s)"):format(M.clip(text, 200), tostring(v))
  end
  if type(v) ~= "table" or v[1] ~= nil then
    return nil, ("answered %s, which is not a JSON object; expected one with the request's \"id\""):format(M.clip(text, 200))
  end
  return v
end

-- JSON's nulls out of a decoded answer (a null reward, a null message list are nil).
function M.strip(v)
  if type(v) == "table" then
    for k, x in pairs(v) do if x == cjson.null then v[k] = nil else M.strip(x) end end
  end
  return v
end

local function ids_on_way(book)
  local ids = {}
  for id in pairs(book.pending) do ids[#ids + 1] = id end
  table.sort(ids)
  if #ids == 0 then return "" end
  if #ids > 8 then ids = { ids[1], ids[2], ids[3], "...", ids[#ids] } end
  return (" (on its way: %s %s)"):format(#ids == 1 and "request" or "requests", table.concat(ids, ", "))
end

-- The request an answer of a stream (a worker's stdout) belongs to, by its id. book: the
-- channel's { pending = {id -> handle}, abandoned = {id -> true}, last_id }. Returns the handle
-- (taken out of pending); or nil, nil for a late answer to a request nobody waits for any more
-- (dropped); or nil and what is wrong: no id, an id never sent, an id answered already.
function M.owner(v, book, text)
  local id = v.id
  if id == nil or id == cjson.null then
    if v.error ~= nil then
      return nil, ("reported an error without a request id%s: %s"):format(ids_on_way(book), M.clip(v.error, 300))
    end
    return nil, ("answered without a request id%s: each answer must echo the \"id\" of its request; got %s")
      :format(ids_on_way(book), M.clip(text, 200))
  end
  local h = book.pending[id]
  if h then
    book.pending[id] = nil
    return h
  end
  if book.abandoned[id] then
    book.abandoned[id] = nil
    return nil, nil
  end
  if type(id) == "number" and id >= 1 and id <= book.last_id and id % 1 == 0 then
    return nil, ("answered id %d a second time (its request had its answer already)%s: the answers are out of step with the requests")
      :format(id, ids_on_way(book))
  end
  return nil, ("answered id %s, which remax never sent%s"):format(M.show(id), ids_on_way(book))
end

-- Marks h done: a value, or an error text and its kind. Once only.
function M.finish(h, value, err, kind)
  if h.done then return end
  h.done, h.value, h.err, h.kind = true, value, err, kind
  h.seconds = now() - h.t0
end

-- An answer for h (decoded): an "error" field is the call's error. Its nulls go (h.keep_null:
-- kept, for a reward's list of scores where null means "no score").
function M.resolve(h, v)
  if not h.keep_null then M.strip(v) end
  if v.error ~= nil and v.error ~= cjson.null then
    h.traceback = type(v.traceback) == "string" and v.traceback or nil
    return M.finish(h, nil, type(v.error) == "string" and v.error or cjson.encode(v.error), "error")
  end
  M.finish(h, v)
end

return M
