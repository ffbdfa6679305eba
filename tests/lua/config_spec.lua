local config = require("remax.settings.config")
local err_of = require("support").error_of

describe("config", function()
  it("declares every key with a type, a meaning and a group", function()
    assert.is_true(#config.order > 40)
    for _, k in ipairs(config.order) do
      local d = config.keys[k]
      assert.is_string(d.type, k)
      assert.is_true(#config.help_of(d) > 10, k .. " has a meaning")
    end
    for _, trl in ipairs({ "num_generations", "max_prompt_length", "max_completion_length", "temperature", "top_p",
      "beta", "learning_rate", "lr_scheduler_type", "warmup_ratio", "per_device_train_batch_size",
      "gradient_accumulation_steps", "max_grad_norm", "reward_weights", "logging_steps", "eval_steps", "save_steps",
      "save_total_limit", "log_completions", "seed", "max_steps", "output_dir", "run_name", "model", "data" }) do
      assert.is_not_nil(config.keys[trl], "TRL name " .. trl)
    end
  end)

  it("parses typed command-line overrides", function()
    local o, help = config.parse_args({ "--learning_rate", "3e-5", "--gradient_checkpointing", "--reward_weights",
      "1,0.5", "--algo=grpo", "--run_name", "x", "--eval_on_start", "false", "--rewards", "gsm8k,format",
      "--max_steps", "7" })
    assert.is_false(help)
    assert.are.equal(3e-5, o.learning_rate)
    assert.are.equal(true, o.gradient_checkpointing)
    assert.are.same({ 1, 0.5 }, o.reward_weights)
    assert.are.equal("grpo", o.algo)
    assert.are.equal("x", o.run_name)
    assert.are.equal(false, o.eval_on_start)
    assert.are.same({ "gsm8k", "format" }, o.rewards)
    assert.are.equal(7, o.max_steps)
    local cfg = config.resolve({ learning_rate = 1e-6, max_steps = 3, num_generations = 2 }, o)
    assert.are.equal(3e-5, cfg.learning_rate, "the command line wins over the recipe")
    assert.are.equal(7, cfg.max_steps)
    assert.are.equal(2, cfg.num_generations, "recipe values stay")
    assert.are.equal("seq-mean-token-mean", cfg.loss_agg_mode, "defaults fill the rest")
  end)

  it("stops on an unknown key with the closest valid name", function()
    assert.matches("unknown setting 'learnig_rate'; did you mean 'learning_rate'",
      err_of(config.parse_args, { "--learnig_rate", "1" }), 1, true)
    assert.matches("recipes/x.lua: unknown setting 'num_generation'; did you mean 'num_generations'",
      err_of(config.resolve, { num_generation = 4 }, {}, { where = "recipes/x.lua" }), 1, true)
    assert.matches("did you mean 'gradient_accumulation_steps'",
      err_of(config.parse_args, { "--grad_accumulation_steps", "2" }), 1, true)
    assert.are.equal(2, config.edit_distance("beta", "beat"))
    assert.are.equal(1, config.edit_distance("beta", "bet"))
  end)

  it("names the key and value of a bad override or recipe value", function()
    assert.matches("--max_steps '1.5': expected an integer >= 0", err_of(config.parse_args, { "--max_steps", "1.5" }), 1, true)
    assert.matches("--beta 'lots': expected a number", err_of(config.parse_args, { "--beta", "lots" }), 1, true)
    assert.matches("--gradient_checkpointing 'maybe': expected true or false",
      err_of(config.parse_args, { "--gradient_checkpointing", "maybe" }), 1, true)
    assert.matches("--reward_weights '1,x': expected a comma-separated list of numbers",
      err_of(config.parse_args, { "--reward_weights", "1,x" }), 1, true)
    assert.matches("algo = 'ppo': expected one of remax, grpo, rloo, reinforce, sft",
      err_of(config.parse_args, { "--algo", "ppo" }), 1, true)
    assert.matches("--model_config: model_config can only be set in the recipe",
      err_of(config.parse_args, { "--model_config", "x" }), 1, true)
    assert.matches("--temperature (no value): expected a value", err_of(config.parse_args, { "--temperature" }), 1, true)
    assert.matches("r.lua: beta = 'high': expected a number",
      err_of(config.resolve, { beta = "high" }, {}, { where = "r.lua" }), 1, true)
    assert.matches("reward_weights has 1 weights for 2 reward functions",
      err_of(config.resolve, { rewards = { "gsm8k", "format" }, reward_weights = { 1 } }), 1, true)
    assert.matches("algo = rloo needs num_generations >= 2",
      err_of(config.resolve, { algo = "rloo", num_generations = 1 }), 1, true)
    -- bf16 trains on the cpu too (mixed precision); auto resolves to one of the two
    assert.are.equal("bf16", config.resolve({ dtype = "bf16" }).dtype)
    assert.is_truthy(({ f32 = true, bf16 = true })[config.resolve({}).dtype])
    assert.matches("frozen_dtype = 'f16': expected one of auto, f32, bf16",
      err_of(config.parse_args, { "--frozen_dtype", "f16" }), 1, true)
    assert.matches("dtype = 'f8': expected one of auto, f32, bf16", err_of(config.parse_args, { "--dtype", "f8" }), 1, true)
    assert.matches("chat_template = 'mistral': expected auto, tokenizer, qa, chatml, llama3, plain",
      err_of(config.resolve, { chat_template = "mistral" }), 1, true)
  end)

  it("--help lists every key with its resolved value, default and meaning", function()
    local o, help = config.parse_args({ "--help", "--beta", "0.25" })
    assert.is_true(help)
    local text = config.help(config.resolve({ learning_rate = 2e-5 }, o))
    for _, k in ipairs(config.order) do assert.matches("--" .. k .. " ", text, 1, true) end
    assert.matches("%-%-beta%s+0.25 %*  %(default 0", text)
    assert.matches("%-%-learning_rate%s+2e%-05 %*  %(default 1e%-05", text)
    assert.matches("KL coefficient to the frozen reference model", text, 1, true)
  end)

  it("serialises functions and reward tables for config.json", function()
    local f = function() end
    local s = config.serializable(config.resolve({ rewards = { "gsm8k", { name = "mine", fn = f } }, loop = f }))
    assert.are.same("gsm8k", s.rewards[1])
    assert.are.same("mine", s.rewards[2])
    assert.matches("^function %(.*config_spec.lua:%d+%)$", s.loop)
  end)
end)

describe("settings as records", function()
  -- the fields a record may hold (remax.settings.records documents each): a typo such as
  -- `rnage` would otherwise be ignored
  local FIELDS = { name = 1, type = 1, default = 1, default_of = 1, help = 1, range = 1, each = 1, min_items = 1,
    count = 1, path = 1, folder_name = 1, choices = 1, value_aliases = 1, unavailable = 1, aliases = 1, hot = 1,
    alias_values = 1, inert = 1, check = 1, note = 1, resume = 1 }
  local TYPES = { number = 1, integer = 1, boolean = 1, string = 1, numbers = 1, strings = 1, enum = 1, data = 1,
    rewards = 1, template = 1, advantage = 1, environment = 1, call_format = 1, table = 1, ["function"] = 1 }

  it("hold only known fields, a known type, and a resume rule of a known form", function()
    for _, k in ipairs(config.order) do
      local d = config.keys[k]
      for f in pairs(d) do assert.is_truthy(FIELDS[f], ("%s: unknown record field '%s'"):format(k, f)) end
      assert.is_truthy(TYPES[d.type], k .. ": type " .. tostring(d.type))
      assert.are.equal(d.type == "enum", d.choices ~= nil, k .. ": an enum has choices, and only an enum")
      assert.is_true(d.resume == nil or d.resume == "opening" or (type(d.resume) == "table" and type(d.resume.fixed) == "string"), k)
      if d.default ~= nil and d.type ~= "enum" and d.type ~= "rewards" then
        assert.is_nil(require("remax.settings.schema").value_problem(d, d.default), k .. ": its default is in its range")
      end
    end
  end)

  it("take algo's and loss_type's choices from the step's records, one file each", function()
    local algos = require("remax.step.algos")
    assert.are.equal("remax|grpo|rloo|reinforce|sft|reward", config.type_text(config.keys.algo))
    assert.are.equal("grpo|bnpo|dr_grpo|dapo|cispo|sapo", config.type_text(config.keys.loss_type))
    for _, a in ipairs(algos.algorithms()) do
      assert.are.equal(a.name, config.resolve({ algo = a.name, rewards = { "gsm8k" } }).algo)
      assert.is_string(a.choice, a.name)
      assert.are.equal(a.samples, a.estimator ~= nil, a.name .. ": an RL algorithm has an estimator")
    end
    assert.are.equal("remax, grpo, rloo, reinforce (RL with that advantage estimator), sft (cross-entropy on prompt -> answer), "
      .. "or reward (a reward model from preference pairs: Bradley-Terry, as TRL's RewardTrainer)", config.help_of(config.keys.algo))
    -- the checks ask the records: the greedy row, the fewest generations
    assert.matches("algo = remax needs generate_greedy = true (the greedy row is its baseline)",
      err_of(config.resolve, { generate_greedy = false }), 1, true)
    assert.matches("algo = grpo needs num_generations >= 2 (a group of one has no spread)",
      err_of(config.resolve, { algo = "grpo", num_generations = 1 }), 1, true)
    assert.is_true(config.resolve({ algo = "grpo", generate_greedy = true }).generate_greedy)
    assert.is_false(config.resolve({ algo = "grpo" }).generate_greedy)
  end)

  it("take TRL's name of a setting as the setting (aliases), recorded under remax's name", function()
    -- TRL's max_tool_calling_iterations counts rounds of tool calls: N of them are N + 1 turns
    local o = config.parse_args({ "--max_tool_calling_iterations", "3" })
    assert.are.same({ max_turns = 4 }, o)
    local cfg = config.resolve({ max_tool_calling_iterations = 5 }, {}, { where = "r.lua" })
    assert.are.equal(6, cfg.max_turns)
    assert.are.equal(6, config.serializable(cfg).max_turns)
    assert.is_nil(config.serializable(cfg).max_tool_calling_iterations)
    assert.are.equal(4, config.resolve({ max_tool_calling_iterations = 5 }, o).max_turns, "the command line wins")
    assert.are.equal(1, config.resolve({ max_tool_calling_iterations = 0 }).max_turns)
    assert.matches("command line: max_turns and max_tool_calling_iterations are the same setting",
      err_of(config.parse_args, { "--max_turns", "2", "--max_tool_calling_iterations", "3" }), 1, true)
    assert.matches("r.lua: max_turns and max_tool_calling_iterations are the same setting",
      err_of(config.resolve, { max_turns = 2, max_tool_calling_iterations = 3 }, {}, { where = "r.lua" }), 1, true)
    assert.matches("r.lua: max_tool_calling_iterations = -1: expected an integer >= 0",
      err_of(config.resolve, { max_tool_calling_iterations = -1 }, {}, { where = "r.lua" }), 1, true)
    assert.matches("r.lua: max_tool_calling_iterations = 1024: expected an integer in [0, 1023]",
      err_of(config.resolve, { max_tool_calling_iterations = 1024 }, {}, { where = "r.lua" }), 1, true)
  end)

  it("give sapo's temperatures TRL's defaults under loss_type = sapo, and none otherwise", function()
    local c = config.resolve({ loss_type = "sapo" })
    assert.are.same({ 1.0, 1.05 }, { c.sapo_temperature_pos, c.sapo_temperature_neg })
    assert.are.equal("default", config.source(c, "sapo_temperature_pos"))
    assert.are.equal(0.5, config.resolve({ loss_type = "sapo", sapo_temperature_neg = 0.5 }).sapo_temperature_neg)
    c = config.resolve({})
    assert.is_nil(c.sapo_temperature_pos)
    assert.is_nil(config.serializable(c).sapo_temperature_neg, "config.json of other runs is as before")
  end)

  it("say which cispo and sapo settings do nothing", function()
    local function notes(t) return table.concat(config.resolve(t).inert_notes, "\n") end
    assert.matches("sapo_temperature_pos = 2 has no effect here: only loss_type = sapo uses it",
      notes({ sapo_temperature_pos = 2, num_iterations = 2 }), 1, true)
    assert.matches("sapo_temperature_neg = 2 has no effect here: the ratio pi/pi_old is 1 with num_iterations = 1",
      notes({ loss_type = "sapo", sapo_temperature_neg = 2 }), 1, true)
    assert.are.same({}, config.resolve({ loss_type = "sapo", sapo_temperature_neg = 2, num_iterations = 2 }).inert_notes)
    assert.matches("epsilon = 0.3 has no effect here: loss_type = sapo does not use it",
      notes({ loss_type = "sapo", epsilon = 0.3, num_iterations = 2 }), 1, true)
    assert.matches("delta = 1.5 has no effect here: loss_type = cispo does not use it",
      notes({ loss_type = "cispo", delta = 1.5, num_iterations = 2 }), 1, true)
    -- cispo's cap acts at ratio 1 too
    assert.are.same({}, config.resolve({ loss_type = "cispo", epsilon_high = 5 }).inert_notes)
    assert.matches("epsilon_high = 5 has no effect here: the ratio pi/pi_old is 1",
      notes({ epsilon_high = 5 }), 1, true)
  end)
end)

describe("config.resolve's derived settings", function()
  it("decides the KL mode and the reference once", function()
    local function kl(t) local c = config.resolve(t); return c.kl_mode, c.needs_reference end
    assert.are.same({ "none", false }, { kl({}) })
    assert.are.same({ "k3", true }, { kl({ beta = 0.1 }) })
    assert.are.same({ "k1", true }, { kl({ beta = 0.1, kl_estimator = "k1" }) })
    assert.are.same({ "none", false }, { kl({ beta = 0.1, algo = "sft" }) })   -- SFT has no KL term
  end)

  it("plans the sampled and greedy rows of a step", function()
    local c = config.resolve({ num_generations = 3, temperature = 0.7 })
    assert.are.same({ 0.7, 0.7, 0.7, 0 }, c.sampling.temperatures)
    assert.are.equal(4, c.sampling.slots)
    c = config.resolve({ algo = "grpo", num_generations = 2, generate_greedy = false })
    assert.are.same({ 1, 1 }, c.sampling.temperatures)
    assert.is_false(c.sampling.greedy)
  end)

  it("skips zero-advantage rows only when the advantage is all that reaches the loss", function()
    assert.is_true(config.resolve({}).skip_zero_rows)
    assert.is_false(config.resolve({ beta = 0.01 }).skip_zero_rows)
    assert.is_false(config.resolve({ entropy_coef = 0.01 }).skip_zero_rows)
    assert.is_false(config.resolve({ top_entropy_quantile = 0.5 }).skip_zero_rows)
    assert.is_false(config.resolve({ skip_zero_advantage = false }).skip_zero_rows)
  end)

  it("takes the aggregation from loss_type, else loss_agg_mode", function()
    local algos = require("remax.step.algos")
    assert.are.equal("seq-mean-token-mean", config.resolve({}).aggregation)
    assert.are.equal(algos.loss_type("dapo").aggregation, config.resolve({ loss_type = "dapo" }).aggregation)
    assert.are.equal("token-mean", config.resolve({ loss_type = "cispo" }).aggregation)
    assert.are.equal("seq-mean-token-mean", config.resolve({ loss_type = "sapo" }).aggregation)
    assert.are.equal("token-mean", config.resolve({ loss_agg_mode = "token-mean" }).aggregation)
  end)

  it("derives again after a change (what hot reload does)", function()
    local c = config.resolve({})
    c.beta = 0.2
    config.derive(c)
    assert.are.equal("k3", c.kl_mode)
    assert.is_false(c.skip_zero_rows)
  end)

  it("checks sampling settings once, in the schema, naming their source", function()
    assert.matches("recipe: temperature = -1: expected a number in [0, inf)", err_of(config.resolve, { temperature = -1 }), 1, true)
    assert.matches("recipe: top_p = 0: expected a number in (0, 1]", err_of(config.resolve, { top_p = 0 }), 1, true)
    assert.matches("recipe: min_p = 1.5: expected a number in [0, 1]", err_of(config.resolve, { min_p = 1.5 }), 1, true)
    assert.matches("command line: repetition_penalty = 0: expected a number in (0, inf)",
      err_of(config.resolve, {}, (config.parse_args({ "--repetition_penalty", "0" }))), 1, true)
    assert.matches("recipe: repetition_penalty = inf: expected a finite number",
      err_of(config.resolve, { repetition_penalty = 1 / 0 }), 1, true)
    local c = config.resolve({ min_p = 0.05 }, (config.parse_args({ "--repetition_penalty", "1.2" })))
    assert.are.equal(0.05, c.min_p)
    assert.are.equal(1.2, c.repetition_penalty)
    assert.are.same({ "\n\n", "Question:" }, config.resolve({ stop_strings = { "\n\n", "Question:" } }).stop_strings)
    assert.matches("stop_strings", err_of(config.resolve, { stop_strings = {} }), 1, true)
    assert.are.equal(0, config.resolve({}).min_p)              -- off by default, as in TRL
    assert.are.equal(1, config.resolve({}).repetition_penalty)
    -- what the model's own check (the last guard) would let through
    assert.matches("recipe: temperature = inf: expected a finite number", err_of(config.resolve, { temperature = 1 / 0 }), 1, true)
  end)

  it("keeps derived settings out of config.json and --help", function()
    local s = config.serializable(config.resolve({ beta = 0.1 }))
    assert.is_nil(s.kl_mode)
    assert.is_nil(s.sampling)
    assert.are.equal("cpu", s.device)
  end)
end)

describe("the device setting", function()
  it("is cpu by default and refuses a typo instead of falling back to the CPU", function()
    assert.are.equal("cpu", config.resolve({}).device)
    assert.matches("device = 'gpu': expected one of cpu, cuda", err_of(config.resolve, { device = "gpu" }), 1, true)
    assert.matches("command line: device = 'gpu': expected one of cpu, cuda", err_of(config.parse_args, { "--device", "gpu" }), 1, true)
  end)

  it("takes cuda where a device exists, and otherwise refuses it saying why", function()
    if require("remax.bind.tensor").has_cuda() then
      assert.are.equal("cuda", config.resolve({ device = "cuda" }).device)
      return
    end
    local err = err_of(config.resolve, { device = "cuda" })
    assert.matches("recipe: device = cuda: ", err, 1, true)
    assert.matches("no CUDA device or was built without CUDA", err, 1, true)
    assert.matches("use device = cpu", err, 1, true)
  end)

  it("is checked by model.new too: a typo there is an error", function()
    local model = require("remax.bind.model")
    local tiny = require("support").tiny_model({ vocab_size = 16, num_hidden_layers = 1 })
    assert.matches("device 'gpu' is not a device remax knows (cpu, cuda)", err_of(model.new, tiny, { device = "gpu" }), 1, true)
    assert.is_table(model.new(tiny, { device = "cpu" }))
  end)
end)

describe("the data setting", function()
  it("takes a file or, in a recipe, a function", function()
    local fn = function(split, n) return {} end
    assert.are.equal(fn, config.resolve({ data = fn }).data)
    assert.are.equal("x.jsonl", config.resolve({}, { data = "x.jsonl" }).data)
    assert.matches("data = 3: expected a file path, or (in a recipe) a function", err_of(config.resolve, { data = 3 }), 1, true)
  end)
end)
