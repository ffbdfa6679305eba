-- length: a penalty for completions longer than a target,
--   score = -coef * min(cap, max(0, len - target) / target)
-- so a completion at or under the target scores 0 and one twice the target scores -coef
-- (with the default cap of 1, nothing goes below -coef).
-- Options (via length.with{...}): target (default 1000), coef (0.1), cap (1; false for none),
-- measure: "chars" (bytes, default), "words", or function(completion, i, batch) -> length.

local MEASURES = {
  chars = function(text) return #text end,
  words = function(text)
    local n = 0
    for _ in text:gmatch("%S+") do n = n + 1 end
    return n
  end,
}

local function make(opts)
  opts = opts or {}
  local R = { name = opts.name or "length_penalty" }
  local target, coef = opts.target or 1000, opts.coef or 0.1
  local cap = opts.cap == nil and 1 or opts.cap
  if type(target) ~= "number" or target <= 0 then
    error(("%s: target must be a positive number, got %s"):format(R.name, tostring(target)), 0)
  end
  if type(coef) ~= "number" then
    error(("%s: coef must be a number, got %s"):format(R.name, tostring(coef)), 0)
  end
  local measure = opts.measure or "chars"
  if type(measure) == "string" then
    if not MEASURES[measure] then
      error(("%s: unknown measure '%s' (valid: 'chars', 'words', or a function)"):format(R.name, measure), 0)
    end
    measure = MEASURES[measure]
  elseif type(measure) ~= "function" then
    error(("%s: measure is a %s (valid: 'chars', 'words', or a function)"):format(R.name, type(measure)), 0)
  end
  function R.fn(completions, batch)
    local scores = {}
    for i, c in ipairs(completions) do
      if type(c) ~= "string" then
        error(("%s: completion %d is a %s, expected a string"):format(R.name, i, type(c)), 2)
      end
      local over = math.max(0, measure(c, i, batch) - target) / target
      if cap then over = math.min(cap, over) end
      scores[i] = over > 0 and -coef * over or 0
    end
    return scores
  end
  return R
end

return require("remax.step.rewards").configurable(make)
