-- remax.run.resume: the settings of a resumed run. `--resume runs/<name>` continues with the
-- run's own config.json; only settings given again on the command line change it (each change is
-- printed), and settings a run cannot change half-way are refused, naming them. See docs/runs.md.
--
--   local cfg, changes = resume.resolve(recipe_table, overrides, { where = "recipes/x.lua" })
local config = require("remax.settings.config")
local runs = require("remax.run.folder")

local M = {}

-- What a resume does with each setting is its record's resume rule (remax.settings.records):
-- { fixed = why } cannot change (the model and its shape, the algorithm, what the data order and
-- the sampling seeds derive from), "opening" is never taken from config.json (where the run is and
-- how it was opened), and the rest keep the run's value unless the command line gives another.
local function fixed(k) local r = config.keys[k].resume return type(r) == "table" and r.fixed or nil end
local function opening(k) return config.keys[k].resume == "opening" end

-- A value a recipe holds that config.json cannot give back (a function, or a list holding one).
local function opaque(v)
  if type(v) == "function" then return true end
  if type(v) == "table" then
    for _, x in pairs(v) do if type(x) == "function" or type(x) == "table" then return true end end
  end
  return false
end

local function read_config(dir)
  local path = dir .. "/config.json"
  local f, err = io.open(path, "rb")
  if not f then
    local fs = require("remax.bind.fs")
    if not fs.is_dir(dir) and fs.exists(dir) then error(("--resume %s: not a folder (a run folder holds config.json)"):format(dir), 0) end
    if fs.exists(path) or (err and not err:find("No such file", 1, true)) then
      -- an unreadable run folder or file is not "no run"
      error(("--resume %s: cannot read %s (%s)"):format(dir, path, (tostring(err):gsub("^[^:]*: ", ""))), 0)
    end
    error(("--resume %s: no run there (no config.json)"):format(dir), 0)
  end
  local text, rerr = f:read("*a")
  f:close()
  if not text then error(("--resume %s: cannot read %s (%s)"):format(dir, path, tostring(rerr)), 0) end
  local ok, saved = pcall(runs.decode, text, path)
  if not ok then error(("--resume %s: %s"):format(dir, (tostring(saved):gsub("^runs: ", ""))), 0) end
  if type(saved) ~= "table" then error(("--resume %s: %s holds no settings (%s)"):format(dir, path, saved == nil and "null" or type(saved)), 0) end
  if #saved > 0 or (next(saved) == nil and text:match("^%s*%[")) then
    error(("--resume %s: %s is a JSON array; a run's config.json is an object of settings (\"key\": value)"):format(dir, path), 0)
  end
  -- keys this remax does not know: a config.json from another version, or edited by hand
  local unknown = {}
  for k in pairs(saved) do
    if type(k) ~= "string" or not config.keys[k] then unknown[#unknown + 1] = tostring(k) end
  end
  if #unknown > 0 then
    table.sort(unknown)
    local hints = {}
    for _, k in ipairs(unknown) do
      local near = config.closest(k)
      local close = near and config.edit_distance(k, near) <= math.max(2, math.floor(#k / 3))
      hints[#hints + 1] = close and ("%s (did you mean %s?)"):format(k, near) or k
    end
    error(("--resume %s: %s has settings remax does not know: %s (written by another remax version, or edited by "
      .. "hand? remove them, or resume with the remax that wrote it)"):format(dir, path, table.concat(hints, ", ")), 0)
  end
  return saved
end

-- Equal settings; data paths are compared as absolute paths (config.json records them so, and
-- a resume may run from another folder or name the file either way).
local function same(a, b, k)
  if k and config.recorded_paths[k] and type(a) == "string" and type(b) == "string" then
    local fs = require("remax.bind.fs")
    return fs.absolute(a) == fs.absolute(b)
  end
  return config.show(a) == config.show(b)
end

-- recipe table + command-line overrides (which hold resume) -> the resumed run's config and the
-- list of changes { {key =, was =, now =, from = "command line"|"recipe"} }. Raises naming every
-- setting that cannot change on resume.
function M.resolve(recipe, overrides, opts)
  opts = opts or {}
  local dir = (overrides.resume or recipe.resume):gsub("/+$", "")
  if overrides.overwrite_output_dir == true or (recipe or {}).overwrite_output_dir == true then
    error(("--resume %s and overwrite_output_dir = true contradict each other: resuming continues the run, "
      .. "overwrite_output_dir would erase it; give one of them"):format(dir), 0)
  end
  local saved = read_config(dir)
  -- the recipe supplies what JSON cannot hold (functions) and keys the run did not record
  local merged = {}
  for k, v in pairs(recipe or {}) do merged[k] = v end
  -- the recipe as it is now, with defaults (a recipe that is only valid with the run's command
  -- config.json holds the settings of the newest hot reload; those that took effect after the
  -- checkpoint are undone, so the run continues with the settings in force at it
  local history = require("remax.run.history")
  local ckpts = runs.checkpoints(dir)
  local at = ckpts[#ckpts] and ckpts[#ckpts].step or 0
  local undone
  saved, undone = history.at_step(saved, history.read(dir), at)
  -- line is taken as written)
  local rok, recipe_cfg = pcall(config.resolve, recipe, {}, { where = opts.where })
  if not rok then recipe_cfg = recipe end
  for k, v in pairs(saved) do
    local decl = config.keys[k]
    if decl and not opening(k) and not opaque(recipe_cfg[k]) and not opaque(recipe[k])
      and not (type(v) == "string" and v:match("^function ")) then
      merged[k] = v
    end
  end
  merged.resume = dir
  local cfg = config.resolve(merged, overrides, { where = dir .. "/config.json" })
  local changes, refused = {}, {}
  for _, k in ipairs(config.order) do
    if not opening(k) and not opaque(cfg[k]) and not same(saved[k], cfg[k], k) then
      local from = overrides[k] ~= nil and "command line" or "recipe"
      if fixed(k) then
        refused[#refused + 1] = ("%s (%s -> %s: %s)"):format(k, config.show(saved[k]), config.show(cfg[k]), fixed(k))
      elseif saved[k] ~= nil or from == "command line" then
        changes[#changes + 1] = { key = k, was = saved[k], now = cfg[k], from = from }
      end
    end
  end
  if #refused > 0 then
    error(("--resume %s: these settings cannot change when a run resumes: %s. Resume with the run's own values, "
      .. "or start a new run (another --run_name, or --overwrite_output_dir)"):format(dir, table.concat(refused, "; ")), 0)
  end
  -- settings the recipe now gives otherwise, which the run keeps (said, so an edit is not lost silently)
  for _, k in ipairs(config.order) do
    if not opening(k) and overrides[k] == nil and saved[k] ~= nil and not opaque(recipe_cfg[k])
      and not same(recipe_cfg[k], cfg[k], k) then
      changes[#changes + 1] = { key = k, was = saved[k], now = cfg[k], recipe = recipe_cfg[k], from = "kept" }
    end
  end
  for _, u in ipairs(undone) do
    changes[#changes + 1] = { key = u.key, was = u.was, now = saved[u.key], from = "history", step = u.step, checkpoint = at }
  end
  return cfg, changes
end

-- The lines that say what a resume changes.
function M.describe(dir, changes)
  local lines = {}
  for _, c in ipairs(changes) do
    if c.from == "history" then
      lines[#lines + 1] = ("resume %s: %s = %s as it was at the checkpoint (step %d; a hot reload set %s from step %d)")
        :format(dir, c.key, config.show(c.now), c.checkpoint, config.show(c.was), c.step)
    elseif c.from == "kept" then
      lines[#lines + 1] = ("resume %s: %s = %s as the run had it (the recipe now says %s; give --%s to change it)")
        :format(dir, c.key, config.show(c.now), config.show(c.recipe), c.key)
    else
      lines[#lines + 1] = ("resume %s: %s = %s (was %s; from the %s)"):format(dir, c.key, config.show(c.now),
        config.show(c.was), c.from)
    end
  end
  return lines
end

return M
