-- remax.settings.schema: what a value of a setting may be: its type (a number, a list of strings,
-- one of the choices, ...), then what its record (remax.settings.records) allows beyond the type:
-- the range, whether it must be whole, a list's length and its items' range, a string's form. Also
-- where a recipe file sets a key (its line, for refusals), and how values are shown in messages.
-- config.resolve runs these once per value, before anything is loaded; every refusal names the
-- setting, the value and where the value came from (the recipe's file:line, the command line, or
-- the default).
--
--   v = schema.check_type(decl, v, source)           -- the value (an alias resolved), or raises
--   local problem = schema.value_problem(decl, v)     -- nil, or "a number in (0, 1]"
--
-- A range is written as in mathematics: "[0, 1]", "(0, inf)", "[1, 2^31)". Defaults by type:
-- a number is finite, an integer is a whole number in [0, 2^31) (so 1e99 steps is refused, not
-- wrapped), a string is not empty.
local M = {}

local I31 = "[0, 2^31)"

---------------------------------------------------------------------------- ranges

local function bound(s)
  s = s:gsub("%s", "")
  if s == "inf" then return math.huge end
  if s == "-inf" then return -math.huge end
  local b, e = s:match("^(%d+)%^(%d+)$")
  if b then return tonumber(b) ^ tonumber(e) end
  return assert(tonumber(s), "schema: bad bound " .. s)
end

-- "[0, 1)" -> {lo = 0, hi = 1, lo_open = false, hi_open = true, text = "[0, 1)"}
local parsed = {}
function M.range(text)
  if parsed[text] then return parsed[text] end
  local l, a, b, r = text:match("^%s*([%[%(])([^,]+),([^%]%)]+)([%]%)])%s*$")
  assert(l, "schema: bad range " .. text)
  local out = { lo = bound(a), hi = bound(b), lo_open = l == "(", hi_open = r == ")", text = text }
  parsed[text] = out
  return out
end

local function in_range(v, rg)
  if rg.lo_open then if not (v > rg.lo) then return false end elseif not (v >= rg.lo) then return false end
  if rg.hi_open then if not (v < rg.hi) then return false end elseif not (v <= rg.hi) then return false end
  return true
end

-- The range of a record: its own, or [0, 2^31) for an integer.
function M.range_of(decl)
  return decl.range or (decl.type == "integer" and I31 or nil)
end

-- A number against a range: nil when it fits, else what was expected.
local function number_problem(v, rg, integer)
  local what = integer and "an integer" or "a number"
  if type(v) ~= "number" then return what end
  if v ~= v then return what .. " (not NaN)" end
  if (v == math.huge or v == -math.huge) then return ("a finite %s%s"):format(integer and "integer" or "number",
    rg and (" in " .. rg.text) or "") end
  if integer and v ~= math.floor(v) then return ("an integer%s"):format(rg and (" in " .. rg.text) or "") end
  if rg and not in_range(v, rg) then return ("%s in %s"):format(what, rg.text) end
  return nil
end

-- A single folder name (run_name): the run must stay inside output_dir.
local function name_problem(v)
  if v == "" then return "a folder name (not empty)" end
  if v:find("/", 1, true) or v:find("\\", 1, true) then return "a single folder name, without '/' (the run stays inside output_dir)" end
  if v == "." or v == ".." then return "a folder name other than '.' and '..' (the run stays inside output_dir)" end
  if v:find("%c") then return "a folder name without control characters" end
  return nil
end

-- What a value of decl must be, when it is not (nil when it is fine). The type was checked first.
function M.value_problem(decl, v)
  if v == nil then return nil end
  local l, range = decl, M.range_of(decl)
  local t = decl.type
  if t == "number" or t == "integer" then
    return number_problem(v, range and M.range(range), t == "integer")
  elseif t == "string" or (t == "data" and type(v) == "string") then
    if v == "" then return "a non-empty string" end
    if l.path and v:find("%z") then return "a path without NUL bytes" end
    if l.folder_name then return name_problem(v) end
  elseif t == "numbers" then
    if l.count and #v ~= l.count then return ("%d numbers"):format(l.count) end
    if l.min_items and #v < l.min_items then return "a non-empty list of numbers" end
    local rg = l.each and M.range(l.each)
    for i, x in ipairs(v) do
      local p = number_problem(x, rg, l.integer)
      if p then return ("a list of which item %d (%s) is %s"):format(i, tostring(x), p) end
    end
    if l.count == 2 and v[1] > v[2] then return "min,max with min <= max" end
  elseif t == "strings" then
    if l.min_items and #v < l.min_items then return "a non-empty list" end
    for i, x in ipairs(v) do
      if x == "" then return ("a list of non-empty strings (item %d is empty)"):format(i) end
    end
  end
  return nil
end

---------------------------------------------------------------------------- sources

-- The line of a recipe file where `key = ` is first written (nil when not found).
local texts = {}
function M.recipe_line(file, key)
  if type(file) ~= "string" then return nil end
  local text = texts[file]
  if text == nil then
    local f = io.open(file, "rb")
    text = f and f:read("*a") or false
    if f then f:close() end
    texts[file] = text
  end
  if not text then return nil end
  local n = 0
  for line in (text .. "\n"):gmatch("([^\n]*)\n") do
    n = n + 1
    if line:find("%f[%w_]" .. key .. "%s*=[^=]") or line:find("%[%s*[\"']" .. key .. "[\"']%s*%]%s*=[^=]") then return n end
  end
  return nil
end

-- Forget the recipe texts read (a hot reload reads the changed file again).
function M.forget_recipes() texts = {} end

---------------------------------------------------------------------------- types

-- An enum's choices: its list, or the names in a registry the step fills (remax.settings.registry).
function M.choices_of(decl)
  if type(decl.choices) == "string" then return require("remax.settings.registry").names(decl.choices) end
  return decl.choices
end

-- A value in words, for --help and messages: "nil", a string as it is, "function (file:line)",
-- a list joined by commas (reward tables by their names).
local function text(v)
  if v == nil then return "nil" end
  if type(v) == "string" then return v end
  if type(v) == "function" then
    local info = debug.getinfo(v, "S")
    return ("function (%s:%d)"):format(info.short_src, info.linedefined)
  end
  if type(v) == "table" then
    if #v > 0 then
      local parts = {}
      for i, x in ipairs(v) do
        parts[i] = type(x) == "table" and (x.name or (x.model and ("model:" .. tostring(x.model))) or "table") or text(x)
      end
      return table.concat(parts, ",")
    end
    return next(v) == nil and "{}" or "table"
  end
  return tostring(v)
end
M.text = text

-- Check a value's type (from a recipe, or parsed from the command line); returns the value (a
-- value alias resolved) or raises.
function M.check_type(decl, v, where)
  if v == nil then return nil end
  if decl.value_aliases and decl.value_aliases[v] ~= nil then v = decl.value_aliases[v] end
  local t = decl.type
  local function bad(expected)
    error(("%s%s = %s: expected %s"):format(where and (where .. ": ") or "", decl.name,
      type(v) == "string" and ("'" .. v .. "'") or text(v), expected), 0)
  end
  if t == "number" then
    if type(v) ~= "number" or v ~= v then bad("a number") end
  elseif t == "integer" then
    if type(v) ~= "number" or v ~= math.floor(v) then bad("an integer") end
    if v < 0 then bad("an integer >= 0") end
  elseif t == "boolean" then
    if type(v) ~= "boolean" then bad("true or false") end
  elseif t == "string" then
    if type(v) ~= "string" then bad("a string") end
  elseif t == "numbers" then
    if type(v) == "number" then v = { v } end
    if type(v) ~= "table" then bad("a list of numbers") end
    for _, x in ipairs(v) do if type(x) ~= "number" then bad("a list of numbers") end end
  elseif t == "strings" then
    if type(v) == "string" then v = { v } end
    if type(v) ~= "table" then bad("a list of strings") end
    for _, x in ipairs(v) do if type(x) ~= "string" then bad("a list of strings") end end
  elseif t == "enum" then
    local choices = M.choices_of(decl)
    if decl.unavailable and decl.unavailable[v] then
      error(("%s%s = '%s' is not available: %s"):format(where and (where .. ": ") or "", decl.name, tostring(v),
        decl.unavailable[v]), 0)
    end
    local ok = false
    for _, c in ipairs(choices) do if v == c then ok = true end end
    if not ok then bad("one of " .. table.concat(choices, ", ")) end
  elseif t == "rewards" then
    if type(v) == "string" or type(v) == "function" or (type(v) == "table" and (v.fn or v.model or v.worker)) then v = { v } end
    if type(v) ~= "table" then bad("a list of reward names, files, tables {name=, fn=}, reward models {model=} or functions") end
    for _, x in ipairs(v) do
      local tx = type(x)
      if not (tx == "string" or tx == "function" or (tx == "table" and (type(x.fn) == "function" or type(x.model) == "string" or type(x.worker) == "string"))) then
        bad("a list of reward names, files, tables {name=, fn=}, reward models {model=} or functions")
      end
    end
  elseif t == "data" then
    if type(v) ~= "string" and type(v) ~= "function" then bad("a file path, or (in a recipe) a function(split, n, cfg) -> rows") end
  elseif t == "template" then
    local names = "auto, tokenizer, qa, chatml, llama3, plain"
    if type(v) ~= "string" and type(v) ~= "function" then
      bad(("a template name (%s: a string) or (in a recipe) a function(messages, opts) -> string; got a %s"):format(names, type(v)))
    end
    if type(v) == "string" and not ({ auto = 1, tokenizer = 1, qa = 1, chatml = 1, llama3 = 1, plain = 1 })[v] then
      bad(("%s or a function(messages, opts)%s"):format(names, v:find("{[{%%]") and
        "; a Jinja template is the tokenizer's: put it in chat_template.jinja beside tokenizer.json and use chat_template = tokenizer" or ""))
    end
  elseif t == "environment" then
    if type(v) ~= "table" and type(v) ~= "function" and not (type(v) == "string" and (v:match("^py:") or v:match("^cmd:") or v:match("^https?://"))) then
      bad("a table {reset=, step=}, a function(sample) -> one, py:FILE.py:CLASS, cmd:PROGRAM or http://HOST:PORT/PATH")
    end
  elseif t == "call_format" then
    if type(v) ~= "function" and not ({ qwen = 1, hermes = 1, qwen3_coder = 1, mistral = 1, llama3 = 1 })[v] then
      bad("qwen, hermes, qwen3_coder, mistral, llama3 or a function(text) -> calls")
    end
  elseif t == "advantage" then
    if type(v) ~= "function" then bad("a function(groups, opts, state) -> advantages (use algo for a name)") end
  elseif t == "table" then
    if type(v) ~= "table" then bad("a table") end
  elseif t == "function" then
    if type(v) ~= "function" then bad("a function") end
  end
  return v
end


---------------------------------------------------------------------------- values shown

local function show(v)
  if type(v) == "string" then return ("'%s'"):format(v) end
  if type(v) == "number" then
    if v ~= v then return "nan" end
    if v == math.huge then return "inf" end
    if v == -math.huge then return "-inf" end
    return tostring(v)
  end
  if type(v) == "table" then
    local parts = {}
    for i, x in ipairs(v) do parts[i] = type(x) == "table" and (x.name or "table") or tostring(x) end
    return "{" .. table.concat(parts, ", ") .. "}"
  end
  return tostring(v)
end
M.show = show

-- "SOURCE: key = value: expected WHAT"
function M.refusal(source, key, v, expected)
  return ("%s: %s = %s: expected %s"):format(source, key, show(v), expected)
end

-- report_to's entries (TRL's names): what remax writes (remax.run.report), and the services it
-- refuses, by their names in words.
M.report_to_choices = { tensorboard = true, csv = true, none = true, all = true }
M.report_to_services = { wandb = "Weights & Biases", mlflow = "MLflow", comet_ml = "Comet", neptune = "Neptune",
  clearml = "ClearML", dagshub = "DagsHub", dvclive = "DVCLive", swanlab = "SwanLab", trackio = "Trackio",
  azure_ml = "Azure ML", codecarbon = "CodeCarbon", flyte = "Flyte", aim = "Aim" }

-- The error for a report_to entry that is not offered, or nil when it is.
function M.report_to_refusal(name)
  if M.report_to_choices[name] then return nil end
  local service = M.report_to_services[name]
  if service then
    return ("report_to = %s: %s is not supported (the engine has no network dependency); every step's metrics are in "
      .. "runs/<name>/metrics.jsonl, and report_to = tensorboard writes event files TensorBoard reads "
      .. "(a script can forward metrics.jsonl to %s)"):format(name, service, service)
  end
  return ("report_to = %s: expected tensorboard, csv, none or all (a list: --report_to tensorboard,csv)"):format(name)
end

return M
