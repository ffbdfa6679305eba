-- A generator test over every setting, in the spirit of tests/fuzz/: random values of every kind
-- (types, NaN, +-inf, huge, negative, empty, fractions, hostile strings), given in a recipe file
-- and on the command line, one setting at a time and several at once. Each value is either
-- accepted, and then meaningful (checked below by rules written apart from the schema), or refused
-- with a message that names the setting and where its value came from -- never a Lua fault, an
-- empty message, or a position in remax's sources. Deterministic: the seed is fixed; set
-- REMAX_FUZZ_SEED and REMAX_FUZZ_ROUNDS to explore.
local config = require("remax.settings.config")
local choices_of = require("remax.settings.schema").choices_of   -- an enum's list (algo's: the registered algorithms)
local errors = require("remax.cli.errors")
local support = require("support")
local cjson = require("cjson")

local SEED = tonumber(os.getenv("REMAX_FUZZ_SEED") or "") or 26
local ROUNDS = tonumber(os.getenv("REMAX_FUZZ_ROUNDS") or "") or 12

-- What an accepted value must mean, written from the settings' documentation, not from the
-- schema: a rule per setting that has one beyond its type.
local function whole(v, lo, hi) return v == math.floor(v) and v >= lo and v < hi end
local function finite(v) return v == v and v > -math.huge and v < math.huge end
local MEANINGFUL = {
  learning_rate = function(v) return v >= 0 and v <= 1 end,
  warmup_ratio = function(v) return v >= 0 and v <= 1 end,
  top_p = function(v) return v > 0 and v <= 1 end,
  min_p = function(v) return v >= 0 and v <= 1 end,
  repetition_penalty = function(v) return v > 0 and finite(v) end,
  temperature = function(v) return v >= 0 end,
  top_k = function(v) return whole(v, 0, 2 ^ 31) end,
  beta = function(v) return v >= 0 end,
  epsilon = function(v) return v >= 0 and v <= 1 end,
  delta = function(v) return v > 1 end,
  adam_beta1 = function(v) return v >= 0 and v < 1 end,
  adam_beta2 = function(v) return v >= 0 and v < 1 end,
  adam_epsilon = function(v) return v > 0 end,
  weight_decay = function(v) return v >= 0 end,
  max_grad_norm = function(v) return v >= 0 end,
  lora_dropout = function(v) return v >= 0 and v < 1 end,
  lora_r = function(v) return whole(v, 1, 2 ^ 31) end,
  lora_alpha = function(v) return v > 0 end,
  baseline_momentum = function(v) return v >= 0 and v < 1 end,
  top_entropy_quantile = function(v) return v > 0 and v <= 1 end,
  reward_timeout = function(v) return v >= 0 end,
  max_time = function(v) return v >= 0 end,
  advantage_clip = function(v) return v >= 0 end,
  num_generations = function(v) return whole(v, 0, 2 ^ 31) end,
  num_iterations = function(v) return whole(v, 1, 2 ^ 31) end,
  per_device_train_batch_size = function(v) return whole(v, 1, 2 ^ 31) end,
  gradient_accumulation_steps = function(v) return whole(v, 1, 2 ^ 31) end,
  per_device_eval_batch_size = function(v) return whole(v, 1, 2 ^ 31) end,
  max_prompt_length = function(v) return whole(v, 1, 2 ^ 31) end,
  max_completion_length = function(v) return whole(v, 1, 2 ^ 31) end,
  logging_steps = function(v) return whole(v, 1, 2 ^ 31) end,
  save_total_limit = function(v) return whole(v, 1, 2 ^ 31) end,
  train_size = function(v) return whole(v, 1, 2 ^ 31) and v <= 1e7 end,   -- made up front
  seed = function(v) return whole(v, 0, 2 ^ 32) end,
  run_name = function(v) return v ~= "" and v ~= "." and v ~= ".." and not v:find("/", 1, true) end,
  rewards = function(v, cfg) return cfg.algo == "sft" or #v >= 1 end,
}

-- The rules every accepted value of a type must meet.
local function type_ok(decl, v)
  local t = decl.type
  if v == nil then return true end
  if t == "number" then return type(v) == "number" and finite(v) end
  if t == "integer" then return type(v) == "number" and whole(v, 0, 2 ^ 32) end
  if t == "string" then return type(v) == "string" and v ~= "" end
  if t == "boolean" then return type(v) == "boolean" end
  if t == "data" then return (type(v) == "string" and v ~= "") or type(v) == "function" end
  if t == "numbers" then
    if type(v) ~= "table" then return false end
    for _, x in ipairs(v) do if not (type(x) == "number" and finite(x)) then return false end end
    return true
  end
  if t == "strings" then
    if type(v) ~= "table" then return false end
    for _, x in ipairs(v) do if type(x) ~= "string" or x == "" then return false end end
    return true
  end
  if decl.choices then
    for _, c in ipairs(choices_of(decl)) do if v == c then return true end end
    return false
  end
  return true
end

---------------------------------------------------------------------------- values

local rng
local function pick(list) return list[rng(#list)] end

local NUMBERS = { 0 / 0, 1 / 0, -1 / 0, 1e99, -1e99, 2 ^ 31, 2 ^ 31 - 1, 2 ^ 32, 2 ^ 53, 2 ^ 24 + 1, -1, -0.5, 0, 1,
  2, 0.5, 1e-300, 0.999, 1.0000001, 3, 10, 64, 1000, 1e6, 1e9 }
local STRINGS = { "", " ", "x", "../../x", "..", ".", "a/b", "nan", "inf", "-inf", "1e99", "-1", "0", "1", "0.5",
  "true", "false", "yes", "{}", "[]", "\0", "\n", "a\tb", ("z"):rep(300), "remax", "grpo", "sft", "cuda", "bf16",
  "direct:0.65,equations:0.35", "direct:1e999", "q_proj", "all-linear", "gsm8k", "1,2", "1,x", ",", "3,1" }

local function number()
  local r = rng(4)
  if r == 1 then return pick(NUMBERS) end
  if r == 2 then return (rng(2001) - 1001) end                       -- small integers
  if r == 3 then return (rng() - 0.5) * 10 ^ (rng(41) - 21) end      -- floats of any scale
  return rng(2 ^ 20)
end

-- A value for a recipe table: any Lua type, shaped at times like the setting's own type.
local function recipe_value(decl)
  local r = rng(10)
  if r == 1 then return pick({ true, false }) end
  if r == 2 then return pick(STRINGS) end
  if r == 3 then return {} end
  if r == 4 then return function() end end
  if r == 5 then
    local t = {}
    for i = 1, rng(4) - 1 do t[i] = rng(2) == 1 and number() or pick(STRINGS) end
    return t
  end
  if r == 6 and decl.choices then return pick(choices_of(decl)) end
  if r == 7 and decl.default ~= nil then return decl.default end
  return number()
end

-- A string for the command line.
local function cli_value()
  local r = rng(4)
  if r == 1 then return pick(STRINGS) end
  local n = number()
  if r == 2 then return ("%.17g"):format(n) end
  if r == 3 then return tostring(n) .. "," .. tostring(number()) end
  return tostring(n)
end

local function show(v)
  if type(v) == "string" then return ("%q"):format(v) end
  if type(v) == "table" then
    local parts = {}
    for i, x in ipairs(v) do parts[i] = show(x) end
    return "{" .. table.concat(parts, ", ") .. "}"
  end
  return tostring(v)
end

---------------------------------------------------------------------------- the checks

local dir = support.tmpdir()
local recipe_path = dir .. "/fuzz_recipe.lua"

-- A recipe file holding `key = ...` on line 2+i, so that a refusal can name its line.
local function write_recipe(keys)
  local lines = { "-- generated by settings_fuzz_spec", "return {" }
  for _, k in ipairs(keys) do lines[#lines + 1] = ("  %s = nil,"):format(k) end
  lines[#lines + 1] = "}"
  support.write(recipe_path, table.concat(lines, "\n") .. "\n")
end

-- Resolves; on a refusal checks the message, on success what the values mean. Returns a
-- failure description, or nil.
local function try(recipe, argv, keys, sources)
  local ok, cfg = pcall(function()
    local overrides = config.parse_args(argv)
    return config.resolve(recipe, overrides, { where = recipe_path })
  end)
  local case = ("recipe %s, command line %s"):format(show(recipe), show(argv))
  if not ok then
    local msg = cfg
    if type(msg) ~= "string" then return case .. ": the error is a " .. type(msg) end
    if not msg:find("%S") then return case .. ": an empty message" end
    if errors.split_position(msg) then return case .. ": the message starts with a remax source position: " .. msg end
    if errors.message(msg):find("^internal error") then return case .. ": an internal error: " .. msg end
    -- it names one of the settings given, with that setting's source
    for _, k in ipairs(keys) do
      if msg:find(k, 1, true) and (msg:find(sources[k], 1, true) or msg:find("--" .. k, 1, true)) then return nil end
    end
    return case .. ": the message names none of " .. table.concat(keys, ", ") .. " with its source: " .. msg
  end
  for _, k in ipairs(keys) do
    local decl, v = config.keys[k], cfg[k]
    if not type_ok(decl, v) then return ("%s: accepted %s = %s, not a %s"):format(case, k, show(v), decl.type) end
    if v ~= nil and MEANINGFUL[k] and not MEANINGFUL[k](v, cfg) then
      return ("%s: accepted %s = %s, which has no meaning"):format(case, k, show(v))
    end
  end
  -- an accepted configuration is one a run can write down (config.json) and plan (the derived settings)
  local enc_ok, err = pcall(cjson.encode, config.serializable(cfg))
  if not enc_ok then return case .. ": accepted, but config.json cannot be written: " .. tostring(err) end
  if cfg.sampling == nil and cfg.kl_mode == nil then return case .. ": accepted, but nothing was derived" end
  return nil
end

describe("every setting, given random values", function()
  local failures, tried, refused = {}, 0, 0
  local function record(f) if f and #failures < 20 then failures[#failures + 1] = f end end

  setup(function()
    local state = SEED
    -- a small linear congruential generator: the same sequence on every machine
    rng = function(n)
      state = (state * 1103515245 + 12345) % 2 ^ 31
      local u = state / 2 ^ 31
      if n then return math.floor(u * n) + 1 end
      return u
    end
  end)

  it("is accepted with a meaning, or refused naming the setting and its source (one at a time)", function()
    failures = {}
    for _, k in ipairs(config.order) do
      local decl = config.keys[k]
      write_recipe({ k })
      for _ = 1, ROUNDS do
        -- in the recipe
        local recipe = { [k] = recipe_value(decl) }
        local f = try(recipe, {}, { k }, { [k] = recipe_path .. ":3" })
        record(f)
        tried = tried + 1
        -- on the command line (recipe-only settings are refused there by name)
        local argv = { "--" .. k, cli_value() }
        f = try({}, argv, { k }, { [k] = "command line" })
        record(f)
        tried = tried + 1
      end
    end
    assert.are.same({}, failures)
    assert.is_true(tried >= #config.order * 2 * ROUNDS)
  end)

  it("holds when several settings are given at once", function()
    failures = {}
    for _ = 1, ROUNDS * 20 do
      local keys, recipe, sources, argv = {}, {}, {}, {}
      local n = rng(4)
      for _ = 1, n do
        local k = pick(config.order)
        if not sources[k] then keys[#keys + 1] = k end
        sources[k] = "?"
      end
      write_recipe(keys)
      for i, k in ipairs(keys) do
        if rng(2) == 1 then
          recipe[k], sources[k] = recipe_value(config.keys[k]), recipe_path .. ":" .. (i + 2)
        else
          argv[#argv + 1], argv[#argv + 2], sources[k] = "--" .. k, cli_value(), "command line"
        end
      end
      local f = try(recipe, argv, keys, sources)
      if f then refused = refused + 1 end
      record(f)
    end
    assert.are.same({}, failures)
  end)

  teardown(function() os.execute("rm -rf '" .. dir .. "'") end)
end)
