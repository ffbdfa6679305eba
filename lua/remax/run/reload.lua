-- remax.run.reload: hot reload. Between steps a changed reward file, or the recipe, is loaded
-- again and tried on the last completions; a version that fails keeps the old one (saying why).
-- From the recipe only the settings marked hot take effect (the rest need a restart).
local config = require("remax.settings.config")
local rewards = require("remax.step.rewards")
local recipe_mod = require("remax.settings.recipe")
local agree = require("remax.run.agree")
local fs = require("remax.bind.fs")
local file_exists, read_file = fs.exists, fs.read_text

local M = {}
-- Each function takes the Run (remax.run.run); the rewards it swaps are the Step's, through
-- stepper:reward_functions, trial, set_reward and set_rewards.

local note_reload, reload_recipe   -- defined below

-- The recipe's code a reload puts in force besides the hot settings: the episode's tools, its
-- environment and its tool-call parser (the Step makes them again when they change).
M.CODE = { "tools", "environment", "tool_call_format" }
local is_code = {}
for _, k in ipairs(M.CODE) do is_code[k] = true end


local function source_of(r)
  if r.path then return r.path end
  return r.file
end

-- The files the functions in v (a function, or tables of them) are defined in.
local function code_files(v, add, seen)
  if type(v) == "function" then
    local src = debug.getinfo(v, "S").source
    if src:sub(1, 1) == "@" then add(src:sub(2)) end
  elseif type(v) == "table" and not seen[v] then
    seen[v] = true
    for _, x in pairs(v) do code_files(x, add, seen) end
  end
end

function M.snapshot(self)
  self.watch = {}
  local function add(path)
    if path and not self.watch[path] and file_exists(path) then self.watch[path] = read_file(path) end
  end
  if self.recipe_path then add(self.recipe_path) end
  for _, r in ipairs(self.stepper:reward_functions()) do add(source_of(r)) end
  -- a tool, environment or parser kept in a file of its own (the recipe loads it): an edit
  -- there reloads the recipe
  local seen = {}
  for _, k in ipairs(M.CODE) do code_files(self.cfg[k], add, seen) end
end

-- Reload changed reward files (and the recipe), each checked on the last step's completions;
-- a version that fails keeps the old one. A file's text counts as seen only once it loaded
-- (self.watch); a failed text is remembered (self.tried) so it is not tried again every step,
-- and the next change to any watched file retries every file still pending, so an edit saved
-- together with a broken one is applied once the broken one is fixed. Returns how many reloads
-- succeeded.
function M.check(self)
  if not self.cfg.hot_reload or self.dist.size > 1 then return 0 end   -- ranks could see a change at different steps
  self.tried = self.tried or {}
  local changed, fresh = {}, false
  for path, text in pairs(self.watch) do
    local now_text = read_file(path)
    if now_text and now_text ~= text then
      changed[#changed + 1] = path
      if now_text ~= self.tried[path] then fresh = true end
      self.tried[path] = now_text
    end
  end
  if not fresh then return 0 end
  table.sort(changed)
  local done = {}
  local recipe_changed = false
  local function loaded(path)
    self.watch[path] = self.tried[path]
    self.tried[path] = nil
  end
  for _, path in ipairs(changed) do
    local by_name = false
    for i, r in ipairs(self.stepper:reward_functions()) do
      if r.path == path then
        by_name = true
        local ok, new = pcall(function()
          local nr = r.reload and r.reload() or rewards.load_file(path)   -- a "py:" reward starts a new worker
          local tok, terr = pcall(self.stepper.trial, self.stepper, nr, self.train_ds.rows)
          if not tok then
            if nr.close then nr.close() end
            error(terr, 0)
          end
          return nr
        end)
        if ok then
          if r.close then r.close() end
          self.stepper:set_reward(i, new)
          loaded(path)
          note_reload(self, path)
          done[#done + 1] = path
        else
          self:say(("hot reload: %s changed but failed its check, keeping the previous version (tried again at its next change): %s")
            :format(path, tostring(new)))
        end
      end
    end
    if not by_name then recipe_changed = true end
  end
  if recipe_changed and self.recipe_path then
    local ok, changes, code = pcall(reload_recipe, self)
    if ok then
      -- the recipe loaded every reward file again too: each pending text is now in force
      for _, path in ipairs(changed) do if self.tried[path] then loaded(path) end end
      note_reload(self, self.recipe_path, changes, code)
      done[#done + 1] = self.recipe_path
    else
      self:say(("hot reload: %s changed but failed to load, keeping the previous version (tried again at the next change): %s")
        :format(self.recipe_path, tostring(changes)))
    end
  end
  -- new reward functions may live in new files
  local function add(p)
    if p and self.watch[p] == nil and file_exists(p) then self.watch[p] = read_file(p) end
  end
  for _, r in ipairs(self.stepper:reward_functions()) do add(source_of(r)) end
  local seen = {}
  for _, k in ipairs(M.CODE) do code_files(self.cfg[k], add, seen) end
  return #done
end

-- Says what a reload changed (setting: old -> new); for settings, records them in the run
-- folder: config.json again (the settings in force) and a line of settings_history.jsonl with
-- the first step that runs with them (remax.run.history).
-- code: the recipe's functions and tools whose code changed, {key =, was =, now =} (not in the
-- settings' history: a resume runs the recipe's code as it is then).
function note_reload(self, path, changes, code)
  self.reloads = self.reloads + 1
  self.pending_reloads = self.pending_reloads or {}
  table.insert(self.pending_reloads, path)
  local parts = {}
  for i, c in ipairs(changes or {}) do parts[i] = ("%s: %s -> %s"):format(c.key, config.show(c.was), config.show(c.now)) end
  for _, c in ipairs(code or {}) do
    if type(c.was) == "string" or type(c.now) == "string" or c.was == nil or c.now == nil then   -- a format's name, a py: spec
      parts[#parts + 1] = ("%s: %s -> %s"):format(c.key, config.show(c.was), config.show(c.now))
    else
      parts[#parts + 1] = ("%s: its code changed"):format(c.key)
    end
  end
  self:say(("hot reload: %s reloaded (reload %d)%s"):format(path, self.reloads,
    #parts > 0 and ("; " .. table.concat(parts, ", ")) or (changes and "; no setting changed" or "")))
  if changes and #changes > 0 and self.run and self.run.dir and self.dist.is_root ~= false then
    if self.run.write_config then self.run:write_config(config.serializable(self.cfg)) end
    require("remax.run.history").append(self.run.dir, self.step + 1, path, changes)
  end
end

-- Re-run the recipe with the same command-line overrides; take its rewards, advantage, tools,
-- environment, tool-call parser and the settings marked hot. Other changed settings need a
-- restart (printed, ignored). Functions and tables are compared by what their code is
-- (remax.run.agree.identity), not by where they are defined: an edited tool is picked up and said.
-- Returns the changed settings and those whose code changed ({key =, was =, now =}).
function reload_recipe(self)
  local rtab = recipe_mod.load(self.recipe_path)
  local cfg = config.resolve(rtab, self.opts.overrides, { where = self.recipe_path })
  local list = rewards.load_all(cfg.rewards, { base = self.recipe_dir, device = self.cfg.device,
    dtype = self.cfg.device ~= "cpu" and self.cfg.dtype or nil, max_line_bytes = self.cfg.reward_max_line_bytes })
  for _, r in ipairs(list) do self.stepper:trial(r, self.train_ds.rows) end
  if cfg.reward_weights and #cfg.reward_weights ~= #list then
    error("reward_weights does not match the rewards", 0)
  end
  local ignored = {}
  for _, k in ipairs(config.order) do
    local decl = config.keys[k]
    if k ~= "rewards" and not decl.hot and not is_code[k] and type(cfg[k]) ~= "function" and type(cfg[k]) ~= "table"
      and cfg[k] ~= self.cfg[k] and k ~= "resume" and k ~= "run_name" then
      ignored[#ignored + 1] = k
    end
  end
  -- new tools and a new environment are checked before they are put in force
  if agree.show(cfg.tools) ~= agree.show(self.cfg.tools) or agree.show(cfg.environment) ~= agree.show(self.cfg.environment) then
    local ropts = { base = self.recipe_dir, max_line = self.cfg.reward_max_line_bytes }
    local ok, err = pcall(function()
      if cfg.tools then require("remax.step.tools").check(cfg.tools, "tools", ropts) end
      if cfg.environment then require("remax.step.environment").check(cfg.environment, "environment", ropts) end
    end)
    if ropts.registry then ropts.registry:close() end
    if not ok then error(err, 0) end
  end
  local code = {}
  for _, k in ipairs(config.order) do
    local v = self.cfg[k]
    if (is_code[k] or (config.keys[k].hot and (type(v) == "function" or type(cfg[k]) == "function")))
      and agree.show(v) ~= agree.show(cfg[k]) then
      code[#code + 1] = { key = k, was = v, now = cfg[k] }
      if is_code[k] then self.cfg[k] = cfg[k] end   -- the hot ones are set below
    end
  end
  local old_beta = self.cfg.beta
  local before = {}
  for _, k in ipairs(config.order) do
    if config.keys[k].hot then before[k] = self.cfg[k]; self.cfg[k] = cfg[k] end
  end
  config.derive(self.cfg)   -- the KL mode, sampling plan, ... of the new hot values
  if self.cfg.needs_reference and not self.stepper:has_reference() then
    -- the KL term needs the frozen reference model, which a run started with beta = 0 lacks
    local ok, err = pcall(self.stepper.load_reference, self.stepper)
    if ok then
      self:say(("hot reload: beta = %s: reference model loaded from %s"):format(tostring(cfg.beta),
        self.model_source or "the fresh model's initial weights"))
    else
      self:say(("hot reload: beta = %s needs the reference model, which failed to load (%s); keeping beta = %s")
        :format(tostring(cfg.beta), tostring(err), tostring(old_beta)))
      self.cfg.beta = old_beta
      config.derive(self.cfg)
    end
  end
  self.cfg.rewards = cfg.rewards
  self.stepper:set_rewards(list)
  if #ignored > 0 then
    self:say("hot reload: changes to " .. table.concat(ignored, ", ") .. " take effect only after a restart")
  end
  -- the hot settings that now differ: what the reload says and the run folder records
  local changes = {}
  local said = {}
  for _, c in ipairs(code) do said[c.key] = true end
  for _, k in ipairs(config.order) do
    if config.keys[k].hot and not said[k] and type(self.cfg[k]) ~= "function" and type(before[k]) ~= "function"
      and config.show(before[k]) ~= config.show(self.cfg[k]) then
      changes[#changes + 1] = { key = k, was = before[k], now = self.cfg[k] }
    end
  end
  return changes, code
end

return M
