-- remax.formats.data: prompt datasets (JSONL or JSON-array files, or rows in memory), a resumable
-- shuffling sampler. Its random numbers (M.rng, M.hash) are remax.bind.random's.
local cjson = require("cjson")
local chat = require("remax.text.chat")
local random = require("remax.bind.random")

local M = {}
M.rng, M.hash = random.rng, random.hash
local check_u53 = random.check_u53

---------------------------------------------------------------------------- reading files

-- The file's text: a folder, a device, a binary file are named as such (remax.bind.fs); a
-- UTF-8 byte-order mark (as Windows editors write) is dropped.
local function read_all(path)
  local ok, text = pcall(require("remax.bind.fs").read_text_file, path)
  if not ok then error("remax.data: " .. tostring(text), 0) end
  if text:sub(1, 3) == "\239\187\191" then text = text:sub(4) end
  return text
end

local function line_of(text, offset)
  local n = 1
  for _ in text:sub(1, offset - 1):gmatch("\n") do n = n + 1 end
  return n
end

-- cjson reports "... at character N"; turn N into a line number.
local function json_error_line(text, msg, base_offset)
  local pos = tonumber(tostring(msg):match("character (%d+)"))
  if not pos then return nil end
  return line_of(text, (base_offset or 1) + pos - 1)
end

-- Line numbers where the top-level elements of a JSON array start, so rows can be named by line.
-- One pass over the bytes (a large file must not be rescanned per element).
local function array_element_lines(text)
  local lines = {}
  local depth, in_string, escaped, expect_value, line = 0, false, false, false, 1
  local byte = string.byte
  local NL, QUOTE, BACKSLASH, COMMA = 10, 34, 92, 44
  local OPEN_A, CLOSE_A, OPEN_O, CLOSE_O = 91, 93, 123, 125
  for i = 1, #text do
    local c = byte(text, i)
    if c == NL then line = line + 1 end
    if in_string then
      if escaped then escaped = false
      elseif c == BACKSLASH then escaped = true
      elseif c == QUOTE then in_string = false end
    elseif not (c == 32 or c == 9 or c == 10 or c == 13) then
      if depth == 1 and expect_value and c ~= CLOSE_A then
        lines[#lines + 1] = line
        expect_value = false
      end
      if c == QUOTE then in_string = true
      elseif c == OPEN_A or c == OPEN_O then
        depth = depth + 1
        if depth == 1 then expect_value = true end
      elseif c == CLOSE_A or c == CLOSE_O then depth = depth - 1
      elseif c == COMMA and depth == 1 then expect_value = true end
    end
  end
  return lines
end

-- Returns a list of {value=, where=} records, where = "path:LINE".
local function read_records(path)
  local text = read_all(path)
  local first = text:find("%S")
  local records = {}
  if first and text:sub(first, first) == "[" then
    local ok, doc = pcall(cjson.decode, text)
    if not ok then
      local line = json_error_line(text, doc)
      error(("%s:%s: malformed JSON array: %s"):format(path, line or "?", tostring(doc)), 0)
    end
    local lines = array_element_lines(text)
    for i, v in ipairs(doc) do
      records[i] = { value = v, where = ("%s:%d"):format(path, lines[i] or 0) }
    end
    return records
  end
  local lineno = 0
  for line in (text .. "\n"):gmatch("(.-)\r?\n") do
    lineno = lineno + 1
    if line:find("%S") then
      local ok, v = pcall(cjson.decode, line)
      if not ok then
        error(("%s:%d: malformed JSON line: %s"):format(path, lineno, tostring(v)), 0)
      end
      records[#records + 1] = { value = v, where = ("%s:%d"):format(path, lineno) }
    end
  end
  return records
end

---------------------------------------------------------------------------- rows and columns

-- The final answer of GSM8K's solution text ("... #### 72") or of an answer that is just a number
-- ("72", "$1,200"), commas and "$" removed; nil otherwise.
function M.final_answer(text)
  if type(text) == "number" then return tostring(text) end
  if type(text) ~= "string" then return nil end
  local tail = text:match(".*####(.*)$")
  if not tail then
    local bare = text:match("^%s*%$?%s*([%-+]?[%d,]*%.?%d+)%s*$")
    return bare and (bare:gsub(",", "")) or nil
  end
  tail = tail:gsub("^%s+", ""):gsub("%s+$", "")
  local num = tail:match("^%$?%s*([%-+]?[%d,]*%.?%d+)")
  if num then return (num:gsub(",", "")) end
  return tail ~= "" and tail or nil
end

local function sorted_keys(t)
  local keys = {}
  for k in pairs(t) do keys[#keys + 1] = tostring(k) end
  table.sort(keys)
  return keys
end
M.sorted_keys = sorted_keys   -- a row's column names in order, for messages (preferences.lua too)

-- A row's column names for a message: "a, b", or "none (an empty object)".
local function column_list(t)
  local keys = sorted_keys(t)
  return #keys > 0 and table.concat(keys, ", ") or "none (an empty object)"
end
M.column_list = column_list

local function is_object(v)
  if type(v) ~= "table" then return false end
  return next(v) == nil or #v == 0
end

-- The byte offset of the first byte that is not valid UTF-8 (overlong forms, surrogates and
-- code points past U+10FFFF included), or nil when s is valid.
M.utf8_error = require("remax.text.chat").utf8_error   -- one UTF-8 check for prompts, data and templates

local function check_utf8(text, where, what)
  if type(text) ~= "string" then return end
  local at = M.utf8_error(text)
  if at then
    error(("%s: %s is not valid UTF-8: byte %d of the text is 0x%02X (remax reads text as UTF-8; convert the file, " ..
      "e.g. iconv -f latin1 -t utf-8)"):format(where, what, at, text:byte(at)), 0)
  end
end

local function describe(v)
  if v == cjson.null then return "null" end
  if type(v) == "table" then return #v > 0 and "array" or "object" end
  return type(v)
end

-- Build the dataset's rows from raw records {value=, where=}; opts as in M.load.
local function build(records, opts, source)
  opts = opts or {}
  local rows = {}
  if #records == 0 then error(("remax.data: %s has no rows"):format(source), 0) end
  local first = records[1].value
  if not is_object(first) then
    error(("%s: expected a JSON object per row, got %s"):format(records[1].where, describe(first)), 0)
  end
  local prompt_col = opts.prompt
  if prompt_col == nil then
    if first.prompt ~= nil then prompt_col = "prompt"
    elseif first.question ~= nil then prompt_col = "question"
    else
      error(("%s: no prompt column: looked for 'prompt' then 'question'; columns: %s (set prompt = <column>)")
        :format(records[1].where, column_list(first)), 0)
    end
  end
  local answer_col = opts.answer
  if answer_col == nil and first.answer ~= nil then answer_col = "answer" end
  if answer_col == false then answer_col = nil end
  local columns = opts.columns   -- nil: pass every column through

  for i, rec in ipairs(records) do
    local raw, where = rec.value, rec.where
    if not is_object(raw) then
      error(("%s: expected a JSON object per row, got %s"):format(where, describe(raw)), 0)
    end
    local function need(col, why)
      if raw[col] == nil then
        error(("%s: missing %s column '%s'; columns: %s"):format(where, why, col, column_list(raw)), 0)
      end
    end
    need(prompt_col, "prompt")
    if answer_col then need(answer_col, "answer") end
    local row = {}
    if columns then
      for _, col in ipairs(columns) do
        need(col, "requested")
        row[col] = raw[col]
      end
      if answer_col then row[answer_col] = raw[answer_col] end
    else
      for k, v in pairs(raw) do row[k] = v end
    end
    -- JSON null becomes nil, so reward functions see plain Lua values.
    for k, v in pairs(row) do if v == cjson.null then row[k] = nil end end

    local prompt = raw[prompt_col]
    if type(prompt) ~= "string" then
      local ok, err = chat.check_messages(prompt)
      if not ok then
        error(("%s: prompt column '%s': %s"):format(where, prompt_col,
          prompt == cjson.null and "is null, expected a string or a list of messages" or err), 0)
      end
    end
    if type(prompt) == "string" and not prompt:find("%S") then
      error(("%s: prompt column '%s' is %s; every row needs a prompt to generate from (drop the row or fill it)")
        :format(where, prompt_col, prompt == "" and "empty" or "only white space"), 0)
    end
    if type(prompt) == "string" then check_utf8(prompt, where, ("prompt column '%s'"):format(prompt_col))
    else
      local said = false
      for m, msg in ipairs(prompt) do
        check_utf8(msg.content, where, ("prompt column '%s', message %d"):format(prompt_col, m))
        said = said or msg.content:find("%S") ~= nil
      end
      if not said then
        error(("%s: prompt column '%s': every message's content is empty; every row needs a prompt to generate from")
          :format(where, prompt_col), 0)
      end
    end
    if answer_col then check_utf8(raw[answer_col], where, ("answer column '%s'"):format(answer_col)) end
    row.prompt = prompt
    if answer_col and row.final_answer == nil then
      row.final_answer = M.final_answer(raw[answer_col])
    end
    if row.answer_value == nil and row.final_answer ~= nil then
      row.answer_value = tonumber(row.final_answer)
    end
    rows[i] = row
  end
  return rows
end

---------------------------------------------------------------------------- dataset and sampler

local Dataset = {}
Dataset.__index = Dataset

local function new_dataset(rows, source)
  return setmetatable({ rows = rows, source = source }, Dataset)
end

-- The pieces other row formats build on (remax.step.preferences): records {value=, where=} of a
-- file, the UTF-8 check, and a dataset (with its sampler) of rows already checked.
M.read_records, M.check_utf8, M.dataset = read_records, check_utf8, new_dataset

-- load(path, {prompt = "question", answer = "answer", columns = {...}})
function M.load(path, opts)
  if type(path) ~= "string" then error("remax.data.load: path must be a string, got " .. type(path), 2) end
  return new_dataset(build(read_records(path), opts, path), path)
end

-- from_rows(rows, opts): the same mapping over rows already in memory.
function M.from_rows(rows, opts)
  if type(rows) ~= "table" then error("remax.data.from_rows: rows must be a list, got " .. type(rows), 2) end
  local name = (opts and opts.name) or "rows"
  local records = {}
  for i, v in ipairs(rows) do records[i] = { value = v, where = ("%s[%d]"):format(name, i) } end
  return new_dataset(build(records, opts, name), name)
end

function Dataset:size() return #self.rows end

function Dataset:row(i)
  local r = self.rows[i]
  if r == nil then
    error(("remax.data: row %s out of range 1..%d of %s"):format(tostring(i), #self.rows, self.source), 2)
  end
  return r
end

-- Column names present in any row, sorted.
function Dataset:columns()
  local seen = {}
  for _, r in ipairs(self.rows) do for k in pairs(r) do seen[k] = true end end
  return sorted_keys(seen)
end

-- Rows -> columns: {prompt = {...}, answer = {...}, ...}, each a list aligned with rows.
function M.collate(rows)
  local batch = {}
  for i, r in ipairs(rows) do
    for k, v in pairs(r) do
      batch[k] = batch[k] or {}
      batch[k][i] = v
    end
  end
  return batch
end

local Sampler = {}
Sampler.__index = Sampler

-- sampler({seed = 0, shuffle = true, batch_size = 1}): endless batches; each epoch is a
-- permutation drawn from rng(seed, epoch), so any position can be restored from (epoch, index).
function Dataset:sampler(opts)
  opts = opts or {}
  local seed = opts.seed or 0
  check_u53(seed, "sampler seed")
  local bs = opts.batch_size or 1
  if type(bs) ~= "number" or bs < 1 or bs ~= math.floor(bs) then
    error("remax.data: sampler batch_size must be a positive integer, got " .. tostring(bs), 2)
  end
  return setmetatable({
    ds = self, seed = seed, shuffle = opts.shuffle ~= false, batch_size = bs,
    epoch = 1, index = 0,
  }, Sampler)
end

function Sampler:order()
  if self.perm_epoch ~= self.epoch or self.perm_seed ~= self.seed then
    local n = self.ds:size()
    if self.shuffle then
      self.perm = M.rng(self.seed, self.epoch):permutation(n)
    else
      self.perm = {}
      for i = 1, n do self.perm[i] = i end
    end
    self.perm_epoch, self.perm_seed = self.epoch, self.seed
  end
  return self.perm
end

function Sampler:next_batch()
  local n = self.ds:size()
  local batch = {}
  for b = 1, self.batch_size do
    if self.index >= n then
      self.epoch = self.epoch + 1
      self.index = 0
    end
    self.index = self.index + 1
    batch[b] = self.ds.rows[self:order()[self.index]]
  end
  return batch
end

-- {epoch=, index=, seed=, size=}: index rows of this epoch were already handed out.
function Sampler:state()
  return { epoch = self.epoch, index = self.index, seed = self.seed, size = self.ds:size() }
end

function Sampler:restore(state)
  local function bad(what)
    error("remax.data: sampler state " .. what .. " (expected {epoch >= 1, 0 <= index <= size, seed})", 2)
  end
  if type(state) ~= "table" then bad("is a " .. type(state)) end
  local n = self.ds:size()
  if state.size ~= nil and state.size ~= n then
    bad(("was saved for %d rows, this dataset has %d"):format(state.size, n))
  end
  local e, i, s = state.epoch, state.index, state.seed
  if type(e) ~= "number" or e < 1 or e ~= math.floor(e) then bad("has epoch " .. tostring(e)) end
  if type(i) ~= "number" or i < 0 or i > n or i ~= math.floor(i) then bad("has index " .. tostring(i)) end
  if s ~= nil then check_u53(s, "sampler state seed"); self.seed = s end
  self.epoch, self.index = e, i
  return self
end

return M
