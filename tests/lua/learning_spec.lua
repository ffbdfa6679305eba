-- Learning smoke test: every estimator must actually learn a trivial task from scratch.
-- Reward 1 when the completion's first token is one fixed id, else 0; a random byte-level model
-- picks it with probability about 1/260. A wrong sign, a misaligned row (an advantage applied to
-- another prompt's row) or a broken baseline keeps the reward near chance; a right loop lifts the
-- mean training reward to >= 0.9 within the step budget.
local config = require("remax.settings.config")
local trainer = require("remax.run.run")

local TARGET = 55   -- the byte "7"

local support = require("support")
local TINY = support.tiny_model({ max_position_embeddings = 64 })
local tmpdir = support.tmpdir

local function run(algo, G, advantage, extra)
  local dir = tmpdir()
  local f = assert(io.open(dir .. "/p.jsonl", "wb"))
  for i = 1, 64 do f:write(('{"prompt": "task %d:", "answer": "7"}\n'):format(i)) end
  f:close()
  local first_token = { name = "first_token", fn = function(completions, batch)
    local s = {}
    for i = 1, #completions do s[i] = batch.completion_ids[i][1] == TARGET and 1 or 0 end
    return s
  end }
  local cfg = config.resolve({
    model_config = TINY, data = dir .. "/p.jsonl", rewards = { first_token }, chat_template = "plain",
    algo = algo, num_generations = G, max_completion_length = 1, per_device_train_batch_size = 16,
    gradient_accumulation_steps = 1, learning_rate = 3e-2, max_steps = 60, eval_size = 0,
    output_dir = dir .. "/runs", save_steps = 0, log_completions = 0, hot_reload = false, seed = 3,
    advantage = advantage, max_time = extra and extra.max_time,
  })
  local t = trainer.new(cfg, { quiet = true, signals = false })
  local rewards, reached = {}, nil
  if extra and extra.plain then
    local out = t:train()
    os.execute("rm -rf " .. dir)
    return out
  end
  t:train(function(tr)
    while tr:should_continue() do
      local m = tr:train_step()
      rewards[#rewards + 1] = m.reward
      -- done once two steps in a row are at >= 0.9
      if #rewards >= 2 and rewards[#rewards] >= 0.9 and rewards[#rewards - 1] >= 0.9 then
        reached = #rewards
        break
      end
    end
  end)
  os.execute("rm -rf " .. dir)
  return rewards, reached
end

describe("learning smoke test (first token = a fixed id)", function()
  for _, case in ipairs({ { "remax", 8 }, { "grpo", 8 }, { "rloo", 8 } }) do
    it(case[1] .. " lifts the mean training reward from chance to >= 0.9", function()
      local rewards, reached = run(case[1], case[2])
      assert.is_true(rewards[1] < 0.1, ("%s: step 1 reward %.3f is not near chance"):format(case[1], rewards[1]))
      assert.is_not_nil(reached, ("%s: reward after %d steps: %s"):format(case[1], #rewards,
        table.concat(rewards, " ", math.max(1, #rewards - 9))))
    end)
  end

  it("fails when the advantage has the wrong sign (so the check above can fail)", function()
    local function negated_remax(groups)
      local adv = {}
      for i, g in ipairs(groups) do
        adv[i] = {}
        for s, r in ipairs(g.samples) do adv[i][s] = -(r - g.greedy) end
      end
      return adv
    end
    local rewards, reached = run("remax", 8, negated_remax)
    assert.is_nil(reached)
    assert.is_true(rewards[#rewards] < 0.1)
  end)

  it("max_time stops after the step that passes the training-time budget", function()
    local out = run("remax", 2, nil, { max_time = 1e-9, plain = true })
    assert.are.equal(1, out.step)
    assert.is_true(out.history[1].time_elapsed_train > 0)
  end)
end)
