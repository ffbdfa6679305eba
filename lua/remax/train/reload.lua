-- remax.train.reload: hot reload. Between steps a changed reward file, or the recipe, is loaded
-- again and tried on the last completions; a version that fails keeps the old one (saying why).
-- From the recipe only the settings marked hot take effect (the rest need a restart).
local config = require("remax.train.config")
local rewards = require("remax.train.rewards")
local recipe_mod = require("remax.train.recipe")
local data = require("remax.train.data")
local fs = require("remax.bind.fs")
local file_exists, read_file = fs.exists, fs.read_text

local M = {}
local methods = {}   -- installed on remax.train.trainer's Trainer
M.methods = methods

local function source_of(r)
  if r.path then return r.path end
  return r.file
end

function methods.snapshot_watch(self)
  self.watch = {}
  local function add(path)
    if path and not self.watch[path] and file_exists(path) then self.watch[path] = read_file(path) end
  end
  if self.recipe_path then add(self.recipe_path) end
  for _, r in ipairs(self.rewards) do add(source_of(r)) end
end

-- Reload changed reward files (and the recipe), each checked on the last step's completions;
-- a version that fails keeps the old one. A file's text counts as seen only once it loaded
-- (self.watch); a failed text is remembered (self.tried) so it is not tried again every step,
-- and the next change to any watched file retries every file still pending, so an edit saved
-- together with a broken one is applied once the broken one is fixed. Returns how many reloads
-- succeeded.
function methods.check_reload(self)
  if not self.cfg.hot_reload or self.dist.size > 1 then return 0 end   -- ranks could see a change at different steps
  self.tried = self.tried or {}
  local pending, fresh = {}, false
  for path, text in pairs(self.watch) do
    local now_text = read_file(path)
    if now_text and now_text ~= text then
      pending[#pending + 1] = path
      if now_text ~= self.tried[path] then fresh = true end
      self.tried[path] = now_text
    end
  end
  if not fresh then return 0 end
  table.sort(pending)
  local changed = pending
  local done = {}
  local recipe_changed = false
  local function loaded(path)
    self.watch[path] = self.tried[path]
    self.tried[path] = nil
  end
  for _, path in ipairs(changed) do
    local by_name = false
    for i, r in ipairs(self.rewards) do
      if r.path == path then
        by_name = true
        local ok, new = pcall(function()
          local nr = r.reload and r.reload() or rewards.load_file(path)   -- a "py:" reward starts a new worker
          local tok, terr = pcall(self.trial, self, nr)
          if not tok then
            if nr.close then nr.close() end
            error(terr, 0)
          end
          return nr
        end)
        if ok then
          if r.close then r.close() end
          self.rewards[i] = new
          loaded(path)
          self:note_reload(path)
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
    local ok, changes = pcall(self.reload_recipe, self)
    if ok then
      -- the recipe loaded every reward file again too: each pending text is now in force
      for _, path in ipairs(changed) do if self.tried[path] then loaded(path) end end
      self:note_reload(self.recipe_path, changes)
      done[#done + 1] = self.recipe_path
    else
      self:say(("hot reload: %s changed but failed to load, keeping the previous version (tried again at the next change): %s")
        :format(self.recipe_path, tostring(changes)))
    end
  end
  -- new reward functions may live in new files
  for _, r in ipairs(self.rewards) do
    local p = source_of(r)
    if p and self.watch[p] == nil and file_exists(p) then self.watch[p] = read_file(p) end
  end
  return #done
end

-- Says what a reload changed (setting: old -> new); for settings, records them in the run
-- folder: config.json again (the settings in force) and a line of settings_history.jsonl with
-- the first step that runs with them (remax.run.history).
function methods.note_reload(self, path, changes)
  self.reloads = self.reloads + 1
  self.pending_reloads = self.pending_reloads or {}
  table.insert(self.pending_reloads, path)
  local parts = {}
  for i, c in ipairs(changes or {}) do parts[i] = ("%s: %s -> %s"):format(c.key, config.show(c.was), config.show(c.now)) end
  self:say(("hot reload: %s reloaded (reload %d)%s"):format(path, self.reloads,
    #parts > 0 and ("; " .. table.concat(parts, ", ")) or (changes and "; no setting changed" or "")))
  if changes and #changes > 0 and self.run and self.run.dir and self.dist.is_root ~= false then
    if self.run.write_config then self.run:write_config(config.serializable(self.cfg)) end
    require("remax.run.history").append(self.run.dir, self.step + 1, path, changes)
  end
end

-- Before the first step there are no completions yet: the trial runs on the first training
-- rows, with their answers (or "0") standing in for completions, as the start-up probe does.
function methods.probe_scored(self)
  local n = math.min(#self.train_ds.rows, 4)
  local rows, completions = {}, {}
  for i = 1, n do
    rows[i] = self.train_ds.rows[i]
    local a = rows[i][self.cfg.answer_column or "answer"]
    completions[i] = type(a) == "string" and a or "0"
  end
  local batch = data.collate(rows)
  batch.prompt_ids, batch.completion_ids, batch.greedy, batch.finish = {}, {}, {}, {}
  for i = 1, n do
    batch.prompt_ids[i] = self:encode_prompt(rows[i].prompt)
    batch.completion_ids[i] = self.tok:encode(completions[i], { add_special_tokens = false })
    batch.greedy[i], batch.finish[i] = false, "stop"
    if type(rows[i].prompt) == "table" then
      batch.completion_messages = batch.completion_messages or {}
      batch.completion_messages[i] = { { role = "assistant", content = completions[i] } }
    end
  end
  return { completions = completions, batch = batch }
end

-- A reward must run on (a few of) the last completions (before the first step: the first
-- training rows) and give finite numbers or nil.
function methods.trial(self, r)
  local ro = self.last_scored or self:probe_scored()
  local n = math.min(#ro.completions, 4)
  local comps, batch = {}, {}
  for i = 1, n do comps[i] = ro.completions[i] end
  for k, col in pairs(ro.batch) do
    if type(col) == "table" then
      batch[k] = {}
      for i = 1, n do batch[k][i] = col[i] end
    end
  end
  rewards.run_one(r, comps, batch, { timeout = rewards.limit(self.cfg.reward_timeout) })
end

-- Re-run the recipe with the same command-line overrides; take its rewards, advantage and the
-- settings marked hot. Other changed settings need a restart (printed, ignored).
function methods.reload_recipe(self)
  local rtab = recipe_mod.load(self.recipe_path)
  local cfg = config.resolve(rtab, self.opts.overrides, { where = self.recipe_path, running = true })
  local list = rewards.load_all(cfg.rewards, { base = self.recipe_dir, device = self.cfg.device,
    dtype = self.cfg.device ~= "cpu" and self.cfg.dtype or nil })
  for _, r in ipairs(list) do self:trial(r) end
  if cfg.reward_weights and #cfg.reward_weights ~= #list then
    error("reward_weights does not match the rewards", 0)
  end
  local ignored = {}
  for _, k in ipairs(config.order) do
    local decl = config.keys[k]
    if k ~= "rewards" and not decl.hot and type(cfg[k]) ~= "function" and type(cfg[k]) ~= "table" and cfg[k] ~= self.cfg[k]
      and k ~= "resume" and k ~= "run_name" then
      ignored[#ignored + 1] = k
    end
  end
  local old_beta = self.cfg.beta
  local before = {}
  for _, k in ipairs(config.order) do
    if config.keys[k].hot then before[k] = self.cfg[k]; self.cfg[k] = cfg[k] end
  end
  config.derive(self.cfg)   -- the KL mode, sampling plan, ... of the new hot values
  if self.cfg.needs_reference and not self.ref then
    -- the KL term needs the frozen reference model, which a run started with beta = 0 lacks
    local ok, err = pcall(self.load_reference, self)
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
  self.rewards = list
  if #ignored > 0 then
    self:say("hot reload: changes to " .. table.concat(ignored, ", ") .. " take effect only after a restart")
  end
  -- the hot settings that now differ: what the reload says and the run folder records
  local changes = {}
  for _, k in ipairs(config.order) do
    if config.keys[k].hot and type(self.cfg[k]) ~= "function" and config.show(before[k]) ~= config.show(self.cfg[k]) then
      changes[#changes + 1] = { key = k, was = before[k], now = self.cfg[k] }
    end
  end
  return changes
end

return M
