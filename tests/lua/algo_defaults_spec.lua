-- GRPO, RLOO and REINFORCE generate no greedy row unless asked (only ReMax needs it), and a
-- setting that does nothing under the chosen algorithm is named once when the run starts.
local config = require("remax.settings.config")
local trainer = require("remax.run.run")
local support = require("support")

-- the completion's length in tokens
local LEN = [[
return { name = "len", fn = function(completions, batch)
  local s = {}
  for i, c in ipairs(completions) do s[i] = #batch.completion_ids[i] end
  return s
end }
]]

local function setup() return support.train_dir(8, { reward_file = "len.lua", reward = LEN }) end

local function recipe(d, extra)
  return support.run_settings(d, {
    model_config = support.tiny_model(), rewards = { d .. "/len.lua" }, num_generations = 3, max_completion_length = 6,
    per_device_train_batch_size = 2, learning_rate = 1e-3, max_steps = 2, seed = 3,
  }, extra)
end

describe("algorithm defaults", function()
  it("generates the greedy row for remax only, unless generate_greedy asks", function()
    assert.is_true(config.resolve({ algo = "remax" }).generate_greedy)
    for _, algo in ipairs({ "grpo", "rloo", "reinforce" }) do
      assert.is_false(config.resolve({ algo = algo }).generate_greedy, algo)
    end
    assert.is_true(config.resolve({ algo = "grpo" }, config.parse_args({ "--generate_greedy", "true" })).generate_greedy)
    assert.is_true(config.resolve({ algo = "grpo", advantage = function() end }).generate_greedy)   -- a recipe estimator may read it
    local ok, err = pcall(config.resolve, { algo = "remax", generate_greedy = false })
    assert.is_false(ok)
    assert.matches("algo = remax needs generate_greedy = true", err, 1, true)

    -- a GRPO step: num_generations rows per prompt and no reward_greedy; with the row asked for, one more
    local d = setup()
    local t = trainer.new(config.resolve(recipe(d, { algo = "grpo" })), { quiet = true, signals = false })
    local ro = t:rollout(t:next_batch())
    assert.are.equal(2 * 3, #ro.rows)
    local m = t:train_step()
    assert.is_nil(m.reward_greedy)
    assert.is_number(m.reward)
    local g = trainer.new(config.resolve(recipe(d, { algo = "grpo", generate_greedy = true })), { quiet = true, signals = false })
    assert.are.equal(2 * 4, #g:rollout(g:next_batch()).rows)
    assert.is_number(g:train_step().reward_greedy)
  end)

  it("names settings that do nothing under the chosen algorithm, once, when the run starts", function()
    local notes = config.resolve({ algo = "remax", scale_rewards = "batch", epsilon = 0.3, lora_r = 8 }).inert_notes
    local text = table.concat(notes, "\n")
    assert.matches("scale_rewards = batch has no effect here: only algo = grpo uses it", text, 1, true)
    assert.matches("epsilon = 0.3 has no effect here: the ratio pi/pi_old is 1 with num_iterations = 1", text, 1, true)
    assert.matches("lora_r = 8 has no effect here: use_lora = false", text, 1, true)
    assert.are.equal(3, #notes)
    -- the same settings where they act, defaults, and settings not given: no note
    assert.are.same({}, config.resolve({ algo = "grpo", scale_rewards = "batch", num_iterations = 2, epsilon = 0.3 }).inert_notes)
    assert.are.same({}, config.resolve({ algo = "remax", scale_rewards = "group" }).inert_notes)
    assert.are.same({}, config.resolve({}).inert_notes)
    notes = config.resolve({ algo = "grpo" }, config.parse_args({ "--kl_estimator", "k1" })).inert_notes
    assert.matches("kl_estimator = k1 has no effect here: beta = 0", notes[1], 1, true)

    -- printed once by the trainer (not again on a hot reload of the recipe)
    local d = setup()
    local printed = {}
    local real = _G.print
    _G.print = function(s) printed[#printed + 1] = tostring(s) end
    local ok, t = pcall(trainer.new, config.resolve(recipe(d, { algo = "remax", scale_rewards = "none" })), { signals = false })
    _G.print = real
    assert.is_true(ok, tostring(t))
    local count = 0
    for _, line in ipairs(printed) do
      if line:find("scale_rewards = none has no effect here", 1, true) then count = count + 1 end
    end
    assert.are.equal(1, count)
  end)
end)
