-- Values a TRL user copies whose meaning differs here are said at the start (issue 36, item 6):
-- per_device_train_batch_size counts prompts, plain-string prompts go through the chat
-- template, --data without --eval_data skips evaluation, --use_peft is use_lora.
local config = require("remax.settings.config")
local inert = require("remax.settings.inert")
local support = require("support")

local function notes(cfg) return table.concat(cfg.inert_notes, "\n") end

describe("notes for TRL users", function()
  it("says that per_device_train_batch_size counts prompts, with the rows it makes", function()
    local cfg = config.resolve({ per_device_train_batch_size = 16, num_generations = 8 })
    assert.are.equal("remax", cfg.algo)
    assert.matches("per_device_train_batch_size = 16 counts prompts (TRL counts completions): each micro-batch is "
      .. "16 prompts x 9 rows (8 generations + 1 greedy) = 144 rows; TRL's per_device_train_batch_size = 16 with "
      .. "num_generations = 8 is per_device_train_batch_size = 2 here", notes(cfg), 1, true)
    cfg = config.resolve({ algo = "grpo", per_device_train_batch_size = 6, num_generations = 4 })
    assert.matches("6 prompts x 4 rows (4 generations) = 24 rows", notes(cfg), 1, true)
    assert.matches("is per_device_train_batch_size = 6 / 4 (not a whole number of prompts) here", notes(cfg), 1, true)
    -- not given: nothing to correct
    assert.is_nil(notes(config.resolve({})):find("counts prompts", 1, true))
  end)

  it("says that --data without --eval_data skips evaluation", function()
    local dir = support.train_dir(4)
    local recipe = { data = function() return {} end }
    local cfg = config.resolve(recipe, config.parse_args({ "--data", dir .. "/p.jsonl" }))
    assert.matches("note: --data " .. dir .. "/p.jsonl without --eval_data: this run skips evaluation", notes(cfg), 1, true)
    cfg = config.resolve(recipe, config.parse_args({ "--data", dir .. "/p.jsonl", "--eval_data", dir .. "/p.jsonl" }))
    assert.is_nil(notes(cfg):find("skips evaluation", 1, true))
    cfg = config.resolve(recipe, config.parse_args({ "--data", dir .. "/p.jsonl", "--eval_size", "0" }))
    assert.is_nil(notes(cfg):find("skips evaluation", 1, true))
  end)

  it("points --use_peft at use_lora", function()
    local err = support.error_of(function() return config.resolve({}, config.parse_args({ "--use_peft", "true" })) end)
    assert.matches("use_peft is not a remax setting: remax's name is use_lora (--use_lora true", err, 1, true)
    err = support.error_of(config.resolve, { use_peft = true })
    assert.matches("use_lora", err, 1, true)
  end)

  it("says that plain-string prompts of a data file go through the chat template", function()
    local rows = { { prompt = "Question: 2+2?" } }
    local text = table.concat(inert.data_notes(rows, "qa", "train.jsonl"), "\n")
    assert.matches("note: the prompts of train.jsonl are plain strings (TRL's standard format", text, 1, true)
    assert.matches("set chat_template = \"plain\"", text, 1, true)
    assert.matches("already start with \"Question:\", and the qa template adds another", text, 1, true)
    assert.are.same({}, inert.data_notes(rows, "plain", "train.jsonl"))
    assert.are.same({}, inert.data_notes({ { prompt = { { role = "user", content = "hi" } } } }, "chatml", "t.jsonl"))
    assert.is_nil(table.concat(inert.data_notes({ { prompt = "2+2?" } }, "chatml", "t"), ""):find("Question", 1, true))
  end)
  it("a run from a data file says so, with or without map_row (map_row used to crash the start)", function()
    local dir = support.train_dir(4)
    support.write(dir .. "/r.lua", ([[
return { data = %q, rewards = { %q }, chat_template = "qa", eval_size = 0, save_steps = 0,
  log_completions = 0, max_steps = 1, per_device_train_batch_size = 2, num_generations = 2,
  max_completion_length = 4, output_dir = %q,
  model_config = { architectures = { "Qwen2ForCausalLM" }, hidden_size = 16, intermediate_size = 32,
    num_hidden_layers = 1, num_attention_heads = 2, num_key_value_heads = 1, max_position_embeddings = 128 },
  map_row = function(row) row.prompt = row.prompt .. "?" return row end }
]]):format(dir .. "/p.jsonl", dir .. "/lower.lua", dir .. "/runs"))
    local out, rc = support.run_remax(1, "run " .. dir .. "/r.lua --hot_reload false")
    assert.are.equal(0, rc, out)
    assert.matches("note: the prompts of " .. dir .. "/p.jsonl are plain strings", out, 1, true)
  end)
end)
