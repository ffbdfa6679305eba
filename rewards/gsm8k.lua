-- gsm8k_accuracy: 1 when the completion's final answer equals the reference by value, else 0.
--
-- The completion's answer is, in order of preference: the number after the last "####", the
-- number in the last \boxed{...}, the number after the last "answer is" / "answer:" (any case,
-- optional "final", "$", "**"), else the last number in the text.
-- Numbers: "1,234" (comma groups of three), signs, decimals ("3.50" == "3.5"), fractions
-- ("3/4" == 0.75), "$5"; a percentage is its number ("50%" == 50). Two integer values ("12",
-- "12.0", "24/2") are equal only when exactly equal; otherwise values are equal within a
-- relative tolerance of 1e-6 (absolute below magnitude 1).
-- The reference is batch.final_answer[i] when that column exists, else the answer extracted the
-- same way from batch.answer[i] (GSM8K's "... #### 72").

local function trim(s) return (s:gsub("^%s+", ""):gsub("%s+$", "")) end

-- The number token starting at i, or nil. Returns token (without "$"), last index.
local function number_at(text, i)
  local j = i
  local sign = ""
  local c = text:sub(j, j)
  if c == "-" or c == "+" then sign = c == "-" and "-" or ""; j = j + 1 end
  if text:sub(j, j) == "$" then j = j + 1 end
  local int = text:match("^%d+", j)
  local body = ""
  if int then
    body, j = int, j + #int
    -- thousands groups: ",ddd" not followed by another digit
    while text:match("^,%d%d%d", j) and not text:match("^,%d%d%d%d", j) do
      body = body .. text:sub(j, j + 3)
      j = j + 4
    end
  end
  local frac = text:match("^%.%d+", j)
  if frac then body, j = body .. frac, j + #frac end
  if body == "" then return nil end
  if int and not frac then
    local den = text:match("^/(%d+)", j)
    if den then body, j = body .. "/" .. den, j + 1 + #den end
  end
  if text:sub(j, j) == "%" then body, j = body .. "%", j + 1 end
  return sign .. body, j - 1
end

local function can_start(text, i)
  local c = text:sub(i, i)
  if c:match("%d") then return true end
  local nxt = text:sub(i + 1, i + 1)
  if c == "." then return nxt:match("%d") ~= nil end
  if c == "-" or c == "+" then
    local prev = i > 1 and text:sub(i - 1, i - 1) or ""
    if prev:match("[%w%)]") then return false end
    return nxt:match("[%d%.%$]") ~= nil
  end
  if c == "$" then return nxt:match("%d") ~= nil end
  return false
end

-- Every number token in text, in order: list of {token, first, last}.
local function numbers(text)
  local out, i = {}, 1
  while i <= #text do
    local tok, last
    if can_start(text, i) then tok, last = number_at(text, i) end
    if tok then
      out[#out + 1] = { tok, i, last }
      i = last + 1
    else
      i = i + 1
    end
  end
  return out
end

-- The value of a string that is one number ("$1,234", "-3.5", "3/4", "50%"), a number, or nil.
local function parse_number(s)
  if type(s) == "number" then return s end
  if type(s) ~= "string" then return nil end
  s = trim(s)
  local tok, last = number_at(s, 1)
  if not tok or last ~= #s then return nil end
  tok = tok:gsub(",", ""):gsub("%%$", "")
  local a, b = tok:match("^(%-?%d+)/(%d+)$")
  if a then
    if tonumber(b) == 0 then return nil end
    return tonumber(a) / tonumber(b)
  end
  return tonumber(tok)
end

local function first_number(text)
  local n = numbers(text)[1]
  return n and n[1]
end

-- Content of the last \boxed{...} (balanced braces), LaTeX number notation simplified.
local function last_boxed(text)
  local start
  local from = 1
  while true do
    local s, e = text:find("\\boxed%s*{", from)
    if not s then break end
    start, from = e + 1, e + 1
  end
  if not start then return nil end
  local depth, j = 1, start
  while j <= #text and depth > 0 do
    local c = text:sub(j, j)
    if c == "{" then depth = depth + 1 elseif c == "}" then depth = depth - 1 end
    j = j + 1
  end
  local inner = text:sub(start, j - 2)
  inner = inner:gsub("\\[dt]?frac%s*{%s*(%-?[%d%.]+)%s*}%s*{%s*([%d%.]+)%s*}", "%1/%2")
  inner = inner:gsub("{,}", ","):gsub("\\[,!]", ""):gsub("\\%%", "%%"):gsub("\\%$", "$")
  return inner
end

-- The number following the last "answer is" / "answer:" (optional "final", "$", "**").
local function after_answer_phrase(text)
  local lower = text:lower()
  local found
  local from = 1
  while true do
    local s, e = lower:find("answer", from, true)
    if not s then break end
    from = e + 1
    local j = e + 1
    local function skip(p)
      local m = lower:match("^" .. p, j)
      if m then j = j + #m end
    end
    skip("[%s%*]*")
    skip("is")
    skip("[%s%*]*")
    skip(":")
    skip("[%s%*]*")
    skip("%\\?%$?")
    skip("[%s%*]*")
    if j > e + 1 and can_start(text, j) then
      local tok = number_at(text, j)
      if tok then found = tok end
    end
  end
  return found
end

-- The final answer of a text as a number string ("1,234", "-5", "3/4", "50%"), and the form it
-- was found in ("####", "boxed", "answer_is", "last_number"); nil when the text has no number.
local function extract_answer(text)
  if type(text) == "number" then return tostring(text), "number" end
  if type(text) ~= "string" then return nil end
  local tail = text:match(".*####(.*)$")
  if tail then
    local n = first_number(tail)
    if n then return n, "####" end
  end
  local boxed = last_boxed(text)
  if boxed then
    local n = first_number(boxed)
    if n then return n, "boxed" end
  end
  local n = after_answer_phrase(text)
  if n then return n, "answer_is" end
  local all = numbers(text)
  if #all > 0 then return all[#all][1], "last_number" end
  return nil
end

local function same_value(a, b, tolerance)
  local x, y = parse_number(a), parse_number(b)
  if x == nil or y == nil then return false end
  -- two integers are equal only when they are the same integer (1450001 is not 1450000)
  if x == math.floor(x) and y == math.floor(y) then return x == y end
  local tol = (tolerance or 1e-6) * math.max(1, math.abs(x), math.abs(y))
  return math.abs(x - y) <= tol
end

local function column_names(batch)
  local names = {}
  for k in pairs(batch) do names[#names + 1] = tostring(k) end
  table.sort(names)
  return table.concat(names, ", ")
end

local function make(opts)
  opts = opts or {}
  local name = opts.name or "gsm8k_accuracy"
  local R = {
    name = name,
    accuracy = true,   -- right (1) or wrong (0): evaluation reports it as the accuracy
    extract_answer = extract_answer,
    same_value = same_value,
    parse_number = parse_number,
    numbers = numbers,
  }
  function R.fn(completions, batch)
    local refs = batch.final_answer
    local from_text = false
    if refs == nil then refs, from_text = batch.answer, true end
    if refs == nil then
      error(("%s: the batch has neither a 'final_answer' nor an 'answer' column (columns: %s)")
        :format(name, column_names(batch)), 2)
    end
    local scores = {}
    for i, completion in ipairs(completions) do
      if type(completion) ~= "string" then
        error(("%s: completion %d is a %s, expected a string"):format(name, i, type(completion)), 2)
      end
      local ref = refs[i]
      if from_text then ref = extract_answer(ref) end
      if parse_number(ref) == nil then
        error(("%s: row %d: reference answer %s is not a number"):format(name, i,
          ref == nil and ("nil (batch." .. (from_text and "answer" or "final_answer") .. "[" .. i .. "])")
            or ("'" .. tostring(ref) .. "'")), 2)
      end
      local got = extract_answer(completion)
      scores[i] = (got ~= nil and same_value(got, ref, opts.tolerance)) and 1 or 0
    end
    return scores
  end
  return R
end

return require("remax.step.rewards").configurable(make)
