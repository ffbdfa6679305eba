-- format: reward `match` (default 1) when a completion has the expected shape, else `miss` (0).
-- Default shape: the completion ends with "#### <number>" (GSM8K's final-answer line).
--   local format = dofile("rewards/format.lua")                    -- the default shape
--   format.with({ pattern = "\\boxed{.-}%s*$", match = 0.5 })    -- configured copy
-- pattern: a Lua pattern (string.find), a list of them (all must match), or a
--          function(completion, i, batch) -> boolean.

local DEFAULT_PATTERN = "####%s*%-?%$?%d[%d,]*%.?%d*%s*$"

local function matcher(pattern, name)
  if type(pattern) == "function" then return pattern end
  local list = type(pattern) == "table" and pattern or { pattern }
  for k, p in ipairs(list) do
    if type(p) ~= "string" then
      error(("%s: pattern %d is a %s; valid: a Lua pattern string, a list of them, or a function"):format(name, k, type(p)), 4)
    end
    local ok, err = pcall(string.find, "", p)
    if not ok then error(("%s: bad Lua pattern '%s': %s"):format(name, p, err), 4) end
  end
  return function(text)
    for _, p in ipairs(list) do
      if not text:find(p) then return false end
    end
    return true
  end
end

local function make(opts)
  opts = opts or {}
  local R = { name = opts.name or "format" }
  local matches = matcher(opts.pattern or DEFAULT_PATTERN, R.name)
  local hit, miss = opts.match or 1, opts.miss or 0
  function R.fn(completions, batch)
    local scores = {}
    for i, c in ipairs(completions) do
      if type(c) ~= "string" then
        error(("%s: completion %d is a %s, expected a string"):format(R.name, i, type(c)), 2)
      end
      scores[i] = matches(c, i, batch) and hit or miss
    end
    return scores
  end
  return R
end

return require("remax.step.rewards").configurable(make)
