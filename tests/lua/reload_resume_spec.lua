-- Hot reload and resume agree (issue 36, item 1): a reload says what it changed, the run folder
-- records the settings in force (config.json) and their history (settings_history.jsonl), a
-- resume after Ctrl-C continues with the settings in force at its checkpoint, and an edit saved
-- together with a broken file is applied once that file loads.
local config = require("remax.settings.config")
local trainer = require("remax.run.run")
local resume = require("remax.run.resume")
local recipe_mod = require("remax.settings.recipe")
local runs = require("remax.run.folder")
local support = require("support")
local write = support.write

local TINY = "{ hidden_size = 16, intermediate_size = 32, num_hidden_layers = 1, num_attention_heads = 2, max_position_embeddings = 128 }"

-- A recipe at dir/recipe.lua with this learning rate and this reward file.
local function write_recipe(dir, lr, reward)
  write(dir .. "/recipe.lua", ([[
return {
  data = %q, rewards = { %q }, chat_template = "plain", eval_size = 0, output_dir = %q, run_name = "hot",
  save_steps = 0, log_completions = 0, model_config = %s, num_generations = 2, max_completion_length = 6,
  per_device_train_batch_size = 2, learning_rate = %s, lr_scheduler_type = "constant", max_steps = 8, seed = 7,
  dtype = "f32",
}
]]):format(dir .. "/p.jsonl", dir .. "/" .. reward, dir .. "/runs", TINY, lr))
  return dir .. "/recipe.lua"
end

-- A reward that raises SIGINT (as Ctrl-C does) once when the file dir/sigint exists.
local function write_sigint_reward(dir)
  write(dir .. "/sig.lua", ([[
local ffi = require("ffi")
pcall(ffi.cdef, "int raise(int sig);")
return { name = "sig", fn = function(c)
  local f = io.open(%q)
  if f then f:close(); os.remove(%q); ffi.C.raise(2) end
  local r = {}
  for i = 1, #c do r[i] = #c[i] %% 3 end
  return r
end }
]]):format(dir .. "/sigint", dir .. "/sigint"))
end

local function open_trainer(path, cfg)
  cfg = cfg or config.resolve(recipe_mod.load(path), {})
  local t = trainer.new(cfg, { quiet = true, signals = false, recipe_path = path, overrides = {} })
  t.said = {}
  t.say = function(self, text) self.said[#self.said + 1] = text end
  return t
end

local function said(t) return table.concat(t.said, "\n") end

describe("hot reload and resume", function()
  it("keeps the settings a reload put in force through Ctrl-C and resume, and undoes those past the checkpoint", function()
    local dir = support.train_dir(24)
    write_sigint_reward(dir)
    local path = write_recipe(dir, "1e-3", "sig.lua")
    local t = open_trainer(path)
    local run_dir = t.run.dir
    assert.are.equal(1e-3, t:train_step().lr)

    -- the edit, then Ctrl-C during step 2
    write_recipe(dir, "2e-3", "sig.lua")
    write(dir .. "/sigint", "")
    t.opts.signals = true
    local out = t:train()
    assert.is_true(out.interrupted)
    assert.are.equal(2, out.step)
    assert.matches("hot reload: " .. path .. " reloaded (reload 1); learning_rate: 0.001 -> 0.002", said(t), 1, true)
    t.run:close()

    -- the run folder says what is in force, and since when
    assert.are.equal(2e-3, t.run:read_config().learning_rate)
    local history = runs.read_jsonl(run_dir .. "/settings_history.jsonl")
    assert.are.same({ { step = 2, source = path, changes = { { key = "learning_rate", was = 1e-3, now = 2e-3 } } } }, history)
    local rows = t.run:metrics()
    assert.are.same({ 1e-3, 2e-3 }, { rows[1].lr, rows[2].lr })

    -- resume: step 3 runs with the reloaded value, and nothing says otherwise
    local cfg, changes = resume.resolve(recipe_mod.load(path), { resume = run_dir })
    assert.are.equal(2e-3, cfg.learning_rate)
    assert.is_nil(table.concat(resume.describe(run_dir, changes), "\n"):find("learning_rate", 1, true))
    local t2 = open_trainer(path, cfg)
    local m = t2:train_step()
    assert.are.same({ 3, 2e-3 }, { t2.step, m.lr })

    -- a reload after the last checkpoint, then the process dies: the resume goes back to the
    -- settings in force at the checkpoint (step 2) and says so
    write_recipe(dir, "4e-3", "sig.lua")
    assert.are.equal(1, t2:check_reload())
    assert.are.equal(4e-3, t2:train_step().lr)
    assert.are.equal(4e-3, t2.run:read_config().learning_rate)
    t2.run:close()
    cfg, changes = resume.resolve(recipe_mod.load(path), { resume = run_dir })
    assert.are.equal(2e-3, cfg.learning_rate)
    local text = table.concat(resume.describe(run_dir, changes), "\n")
    assert.matches("learning_rate = 0.002 as it was at the checkpoint (step 2; a hot reload set 0.004 from step 4)", text, 1, true)
    local t3 = open_trainer(path, cfg)
    assert.are.equal(2e-3, t3:train_step().lr)
    assert.are.equal(1, #runs.read_jsonl(run_dir .. "/settings_history.jsonl"))   -- step 4's reload is gone with step 4
    t3.run:close()
  end)

  it("applies an edit saved together with a broken reward once the reward loads", function()
    local dir = support.train_dir(24)
    write(dir .. "/r.lua", "return { name = 'r', fn = function(c) local s = {} for i = 1, #c do s[i] = 0.5 end return s end }")
    local path = write_recipe(dir, "1e-3", "r.lua")
    local t = open_trainer(path)
    t:train_step()
    -- one save: a new learning rate and a reward that fails its check
    write_recipe(dir, "2e-3", "r.lua")
    write(dir .. "/r.lua", "return { name = 'r', fn = function(c) error('broken') end }")
    assert.are.equal(0, t:check_reload())
    assert.are.equal(1e-3, t.cfg.learning_rate)
    assert.matches("failed", said(t), 1, true)
    local n = #t.said
    assert.are.equal(0, t:check_reload())   -- nothing new: not tried again every step
    assert.are.equal(n, #t.said)
    t:train_step()
    -- the reward is fixed: the pending recipe edit comes with it
    write(dir .. "/r.lua", "return { name = 'r', fn = function(c) local s = {} for i = 1, #c do s[i] = 0.75 end return s end }")
    assert.is_true(t:check_reload() >= 1)
    assert.are.equal(2e-3, t.cfg.learning_rate)
    local m = t:train_step()
    assert.are.same({ 0.75, 2e-3 }, { m.reward, m.lr })
    assert.are.equal(2e-3, t.run:read_config().learning_rate)
    t.run:close()
  end)
end)
