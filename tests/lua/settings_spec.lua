-- Every setting checked once, every message names its source (issue 26): the schema's refusals,
-- the files of a model folder, data files, the messages the command line prints, a run that
-- stays in its folder, os.exit from user code, and the reward_timeout default.
local config = require("remax.settings.config")
local setup = require("remax.run.setup")
local errors = require("remax.cli.errors")
local rewards = require("remax.step.rewards")
local data = require("remax.formats.data")
local support = require("support")
local tmpdir, write = support.tmpdir, support.write
local cjson = require("cjson")

local err_of = support.error_of

local function resolve_args(recipe, argv, where)
  return config.resolve(recipe, config.parse_args(argv or {}), { where = where })
end

local binary = support.remax_binary

-- Runs the remax program; returns its output (stdout and stderr) and exit status.
local function remax(args, dir)
  local p = assert(io.popen(("cd '%s' && '%s' %s 2>&1; echo \"rc=$?\""):format(dir or ".", binary(), args)))
  local out = p:read("*a")
  p:close()
  local rc = tonumber(out:match("rc=(%d+)%s*$"))
  return out:gsub("rc=%d+%s*$", ""), rc
end

describe("the settings schema", function()
  it("refuses the nonsense the issue lists, naming the setting, the value and the command line", function()
    assert.are.equal("command line: learning_rate = inf: expected a finite number in [0, 1]",
      err_of(resolve_args, {}, { "--learning_rate", "inf" }))
    assert.are.equal("command line: learning_rate = -1: expected a number in [0, 1]",
      err_of(resolve_args, {}, { "--learning_rate", "-1" }))
    assert.are.equal("command line: max_steps = 1e+99: expected an integer in [0, 2^31)",
      err_of(resolve_args, {}, { "--max_steps", "1e99" }))
    assert.matches("^command line: run_name = '%.%./%.%./x': expected a single folder name",
      err_of(resolve_args, {}, { "--run_name", "../../x" }))
  end)

  it("names the recipe's file and line", function()
    local dir = tmpdir()
    local path = dir .. "/r.lua"
    write(path, "return {\n  learning_rate = 1e-5,\n  rewards = {},\n  num_generations = 1e9,\n}\n")
    local recipe = dofile(path)
    assert.are.equal(path .. ":4: num_generations = 1000000000: expected an integer in [0, 2^24]",
      err_of(config.resolve, recipe, {}, { where = path }))
    recipe.num_generations = 4
    local msg = err_of(config.resolve, recipe, {}, { where = path })
    assert.matches("^" .. path:gsub("%p", "%%%0") .. ":3: rewards = {}: an RL run needs at least one reward function", msg)
    -- sft needs no reward
    recipe.algo = "sft"
    assert.are.same({}, config.resolve(recipe, {}, { where = path }).rewards)
    os.execute("rm -rf '" .. dir .. "'")
  end)

  it("refuses NaN and infinities from a recipe, and whole-number settings with fractions", function()
    assert.matches("recipe: beta = nan: expected a number", err_of(config.resolve, { beta = 0 / 0 }), 1, true)
    assert.matches("recipe: max_grad_norm = inf: expected a finite number", err_of(config.resolve, { max_grad_norm = 1 / 0 }), 1, true)
    assert.matches("recipe: entropy_coef = -inf: expected a finite number", err_of(config.resolve, { entropy_coef = -1 / 0 }), 1, true)
    assert.matches("recipe: max_steps = 2.5: expected an integer", err_of(config.resolve, { max_steps = 2.5 }), 1, true)
    assert.matches("recipe: output_dir = '': expected a non-empty string", err_of(config.resolve, { output_dir = "" }), 1, true)
  end)

  -- the Run checks it (it reads the model's config), before any model loads
  it("refuses a num_generations whose generation cannot fit in memory, before any model loads", function()
    local real = setup.available_bytes
    setup.available_bytes = function() return 2 ^ 30 end   -- a machine with 1 GiB free
    local ok, msg = pcall(setup.check_memory, config.resolve({ num_generations = 100000, per_device_train_batch_size = 8 }))
    setup.available_bytes = real
    assert.is_false(ok)
    assert.matches("^recipe: num_generations = 100000: one step's generation needs at least [%d.]+ GiB %(the KV cache " ..
      "of every row and the activations%), but 1.0 GiB of memory is available: per_device_train_batch_size = 8 %(recipe%) prompts x " ..
      "%(num_generations = 100000 %(recipe%) %+ 1 greedy%) rows x %(max_prompt_length = 512 %(default%) %+ " ..
      "max_completion_length = 256 %(default%)%) tokens", msg)
    -- the defaults fit
    setup.available_bytes = function() return 2 ^ 30 end
    ok = pcall(setup.check_memory, config.resolve({}))
    setup.available_bytes = real
    assert.is_true(ok)
  end)

  it("asks the engine for generation's memory: its KV cache is 2 x layers x rows x positions x kv width x 4 bytes", function()
    local cfg = config.resolve({ model_config = { hidden_size = 64, intermediate_size = 128, num_hidden_layers = 3,
      num_attention_heads = 4, num_key_value_heads = 2, vocab_size = 300, max_position_embeddings = 2048 } })
    local total, cache = setup.generation_bytes(cfg, 10, 2)
    local positions = cfg.max_prompt_length + cfg.max_completion_length
    assert.are.equal(2 * 3 * 10 * positions * (2 * 16) * 4, cache)
    assert.is_true(total > cache, "activations and the sampler come on top")
    local more = setup.generation_bytes(cfg, 20, 2)
    assert.is_true(more - total >= cache, "twice the rows: at least the KV cache again")
  end)

  it("counts an episode row's observations in the cache, up to max_episode_length (default: the model's positions)", function()
    local calc = { description = "add", parameters = { type = "object", properties = {} }, fn = function() return "1" end }
    local model = { hidden_size = 64, intermediate_size = 128, num_hidden_layers = 3, num_attention_heads = 4,
      num_key_value_heads = 2, vocab_size = 300, max_position_embeddings = 32768 }
    local per_position = 2 * 3 * (2 * 16) * 4   -- K and V, layers, kv width, f32
    local single = config.resolve({ model_config = model })
    local _, cache = setup.generation_bytes(single, 10, 2)
    assert.are.equal(10 * (512 + 256) * per_position, cache)
    -- with tools and no max_episode_length a row keeps the model's positions
    local open = config.resolve({ model_config = model, tools = { calc = calc } })
    _, cache = setup.generation_bytes(open, 10, 2)
    assert.are.equal(10 * 32768 * per_position, cache)
    -- as the episodes ask the engine: prompt + completion + the observations' room (longest - completion)
    local bounded = config.resolve({ model_config = model, tools = { calc = calc }, max_episode_length = 1024 })
    _, cache = setup.generation_bytes(bounded, 10, 2)
    assert.are.equal(10 * (512 + 256 + (1024 - 256)) * per_position, cache)
    -- on a machine where that does not fit, the refusal says to set max_episode_length
    local real = setup.available_bytes
    setup.available_bytes = function() return 2 ^ 30 end
    local ok, msg = pcall(setup.check_memory, config.resolve({ model_config = model, tools = { calc = calc },
      per_device_train_batch_size = 32 }))
    local ok_bounded = pcall(setup.check_memory, config.resolve({ model_config = model, tools = { calc = calc },
      per_device_train_batch_size = 32, max_episode_length = 1024 }))
    setup.available_bytes = real
    assert.is_false(ok)
    assert.matches("^max_episode_length is not set: one step's generation needs at least", msg)
    assert.matches("observations, all within max_episode_length = 32768 (default: the model's max_position_embeddings)", msg, 1, true)
    assert.matches("; set max_episode_length", msg, 1, true)
    assert.is_true(ok_bounded)
  end)

  it("names the source of a cross-setting refusal", function()
    assert.are.equal("command line: algo = grpo needs num_generations >= 2 (a group of one has no spread)",
      err_of(resolve_args, { algo = "grpo" }, { "--num_generations", "1" }))
    assert.matches("^command line: weight_decay = 20: with learning_rate = 0.1 %(default%)",
      err_of(resolve_args, { learning_rate = 0.1 }, { "--weight_decay", "20" }):gsub("%(recipe%)", "(default)"))
  end)
end)

describe("the files of a model folder", function()
  local home = os.getenv("REMAX_HOME") or "."
  local src = home .. "/models/tiny-gsm8k"
  local model = require("remax.bind.model")
  local tokenizer = require("remax.bind.tokenizer")
  local dir = tmpdir()
  -- a copy of the tiny model with one JSON file edited
  local function folder(file, edit)
    local d = dir .. "/m" .. tostring(math.random(1e9))
    os.execute(("cp -r '%s' '%s'"):format(src, d))
    local path = d .. "/" .. file
    local f = io.open(path, "rb")
    local t = f and cjson.decode(f:read("*a")) or {}
    if f then f:close() end
    edit(t)
    write(path, cjson.encode(t))
    return d, path
  end

  it("refuses config.json values remax would misread, naming the file and the key", function()
    local cases = {
      { function(c) c.eos_token_id = 999 end, "eos_token_id = 999: 999 is not a token id (the vocabulary has ids 0..259)" },
      { function(c) c.tie_word_embeddings = "yes" end, "tie_word_embeddings = 'yes': expected true or false" },
      { function(c) c.architectures = cjson.empty_array or setmetatable({}, cjson.array_mt) end, "architectures = []" },
      { function(c) c.quantization_config = { quant_method = "gptq", bits = 4 } end,
        "quantization_config (quant_method 'gptq'): the weights are quantized" },
      { function(c) c.rope_scaling = { rope_type = "yarn", factor = 4 } end, "rope_scaling of type 'yarn' is not supported" },
    }
    for _, case in ipairs(cases) do
      local d, path = folder("config.json", case[1])
      local msg = err_of(model.load, d)
      assert.matches(path .. ": " .. case[2], msg, 1, true)
    end
  end)

  it("checks generation_config.json, naming it", function()
    local d, path = folder("generation_config.json", function(g) g.max_new_tokens = -5 end)
    local tok = tokenizer.load(d)
    assert.are.equal(path .. ": max_new_tokens = -5: expected a whole number >= 1", err_of(tokenizer.stop_ids, tok, d))
    d, path = folder("generation_config.json", function(g) g.eos_token_id = { 256, 5000 } end)
    assert.matches(path .. ": eos_token_id = [256,5000]: 5000 is not a token id", err_of(tokenizer.stop_ids, tok, d), 1, true)
    d = folder("generation_config.json", function(g) g.eos_token_id = { 256, 3 } end)
    assert.are.same({ 256, 3 }, tokenizer.stop_ids(tok, d))
  end)

  it("refuses a tokenizer_config.json bos_token that is not a token when add_bos_token is set", function()
    local d, path = folder("tokenizer_config.json", function(c) c.bos_token = "<s>"; c.add_bos_token = true end)
    assert.matches(path .. ": bos_token = '<s>' is not a token of " .. d .. "/tokenizer.json but add_bos_token = true",
      err_of(tokenizer.load, d), 1, true)
    d = folder("tokenizer_config.json", function(c) c.bos_token = "<s>"; c.add_bos_token = false end)
    require("remax.bind.hf_files").quiet = true
    assert.is_truthy(tokenizer.load(d))   -- ignored, with a warning
    require("remax.bind.hf_files").quiet = nil
  end)

  it("names a tokenizer.json with an empty vocabulary", function()
    local d, path = folder("tokenizer.json", function(t) t.model.vocab, t.model.merges, t.added_tokens = {}, {}, {} end)
    local f = io.open(path, "rb")
    local text = f:read("*a"):gsub('"merges":{}', '"merges":[]'):gsub('"added_tokens":{}', '"added_tokens":[]')
    f:close()
    write(path, text)   -- (this lua-cjson writes an empty table as {})
    local msg = err_of(tokenizer.load, d)
    assert.matches(d .. "/tokenizer.json", msg, 1, true)
    assert.matches("empty", msg, 1, true)
  end)

  it("refuses adapter_config.json values that would misread the adapters", function()
    local lora = require("remax.bind.lora")
    local base = '"peft_type": "LORA", "bias": "none", "target_modules": ["q_proj"]'
    local cases = {
      { '"r": 0, "lora_alpha": 8', "r = 0: expected a whole number from 1 to 65536" },
      { '"r": 4.5, "lora_alpha": 8', "r = 4.5: expected a whole number" },
      { '"r": 4, "lora_alpha": -1', "lora_alpha = -1: expected a finite number > 0" },
      { '"r": 4, "lora_alpha": 8, "lora_dropout": 1.5', "lora_dropout = 1.5: expected a number in [0, 1)" },
      { '"r": 4, "lora_alpha": 8, "layers_to_transform": [0]', "layers_to_transform is set, which remax does not apply" },
      { '"r": 4, "lora_alpha": 8, "modules_to_save": ["lm_head"]', "modules_to_save is set" },
    }
    for _, case in ipairs(cases) do
      local d = tmpdir()
      write(d .. "/adapter_config.json", "{" .. base .. ", " .. case[1] .. "}")
      assert.matches(d .. "/adapter_config.json: " .. case[2], err_of(lora.read_config, d), 1, true)
    end
    local d = tmpdir()
    write(d .. "/adapter_config.json", "{" .. base .. ', "r": 4, "lora_alpha": 8, "lora_dropout": 0.05, "modules_to_save": null}')
    assert.are.equal(4, lora.read_config(d).r)
  end)

  it("names a safetensors file whose header length is one byte short", function()
    local d = folder("config.json", function() end)
    local path = d .. "/model.safetensors"
    local f = io.open(path, "rb")
    local bytes = f:read("*a")
    f:close()
    local n = 0
    for i = 8, 1, -1 do n = n * 256 + bytes:byte(i) end
    local head = {}
    for i = 1, 8 do head[i] = string.char(math.floor((n - 1) / 256 ^ (i - 1)) % 256) end
    write(path, table.concat(head) .. bytes:sub(9))
    local msg = err_of(model.load, d)
    assert.matches(path .. ": the tensors end at byte", msg, 1, true)
    assert.matches("the header length in the first 8 bytes is likely wrong", msg, 1, true)
  end)

  teardown(function() os.execute("rm -rf '" .. dir .. "'") end)
end)

describe("data files", function()
  local dir = tmpdir()
  it("accepts a JSONL file that starts with a UTF-8 byte-order mark", function()
    write(dir .. "/bom.jsonl", '\239\187\191{"question": "1+1?", "answer": "2"}\n{"question": "2+2?", "answer": "4"}\n')
    local ds = data.load(dir .. "/bom.jsonl")
    assert.are.equal(2, ds:size())
    assert.are.equal("1+1?", ds.rows[1].prompt)
  end)

  it("names a folder, a device and a missing file", function()
    assert.are.equal("remax.data: " .. dir .. " is a folder, expected a file", err_of(data.load, dir))
    assert.matches("remax.data: /dev/zero is not a text file: byte 1 is NUL", err_of(data.load, "/dev/zero"), 1, true)
  end)

  it("refuses a row whose prompt is empty, naming the line", function()
    write(dir .. "/e.jsonl", '{"question": "ok"}\n{"question": ""}\n')
    assert.matches(dir .. "/e.jsonl:2: prompt column 'question' is empty", err_of(data.load, dir .. "/e.jsonl"), 1, true)
    write(dir .. "/m.jsonl", '{"prompt": [{"role": "user", "content": "  "}]}\n')
    assert.matches(dir .. "/m.jsonl:1: prompt column 'prompt': every message's content is empty",
      err_of(data.load, dir .. "/m.jsonl"), 1, true)
  end)
  teardown(function() os.execute("rm -rf '" .. dir .. "'") end)
end)

describe("the messages the command line prints", function()
  it("calls a Lua fault in remax an internal error, with the position after the message", function()
    assert.are.equal("internal error: attempt to index local 'text' (a nil value) (at lua/remax/step/data.lua:164); " ..
      errors.REPORT, errors.message("lua/remax/step/data.lua:164: attempt to index local 'text' (a nil value)"))
    assert.are.equal("internal error: an error with an empty message (at /x/lua/remax/step/step.lua:461); " .. errors.REPORT,
      errors.message("/x/lua/remax/step/step.lua:461: "))
    assert.matches("^internal error: an error with an empty message", errors.message(""))
    assert.matches("^internal error: an error with nothing after 'generate:'", errors.message("generate: "))
    assert.matches("^internal error: an error value that is not text %(a nil%)", errors.message(nil))
    assert.matches("^internal error: 'struct rx_tensor' has no member named 'x' %(at lua/remax/step/step.lua:5%)",
      errors.message("lua/remax/step/step.lua:5: 'struct rx_tensor' has no member named 'x'"))
  end)

  it("prints a user error raised with a level without the position in front", function()
    assert.are.equal("models/x/config.json: key 'vocab_size' is missing",
      errors.message("lua/remax/bind/model.lua:50: models/x/config.json: key 'vocab_size' is missing"))
    assert.are.equal("recipes/x.lua:3: beta = -1: expected a number in [0, inf)",
      errors.message("recipes/x.lua:3: beta = -1: expected a number in [0, inf)"))
  end)

  it("never prints an empty message or one that starts with a Lua position", function()
    local dir = tmpdir()
    write(dir .. "/r.lua", "return { max_steps = 1 }\n")
    write(dir .. "/num.lua", "return 7\n")
    write(dir .. "/str.lua", "return 'hello'\n")
    write(dir .. "/bad.lua", "local t = nil\nreturn t.x\n")
    os.execute("mkdir -p '" .. dir .. "/folder'")
    local cases = {
      { "run r.lua --learning_rate inf", "^remax: command line: learning_rate = inf: expected a finite number in %[0, 1%]\n$" },
      { "run r.lua --data folder", "remax.data: folder is a folder, expected a file" },
      { "run r.lua --data /dev/zero", "/dev/zero is not a text file" },
      { "run str.lua", "^remax: str.lua returned a string %(hello%); a recipe returns a table of settings" },
      { "run bad.lua", "^remax: bad.lua failed: bad.lua:2: attempt to index" },
    }
    for _, case in ipairs(cases) do
      local out, rc = remax(case[1], dir)
      assert.are.equal(1, rc, case[1] .. ": " .. out)
      assert.matches(case[2], out, nil, case[2]:sub(1, 1) ~= "^", case[1] .. ": " .. out)
      local last = out:match("remax: ([^\n]*)")
      assert.is_truthy(last and last:find("%S"), out)
      assert.is_falsy(last:match("^[^%s:]+%.lua:%d+:"), out)
    end
    local out, rc = remax("run num.lua", dir)
    assert.are.equal(7, rc)
    assert.matches("num.lua returned 7, not a recipe table", out, 1, true)
    os.execute("rm -rf '" .. dir .. "'")
  end)
end)

describe("user code that calls os.exit", function()
  -- Writes dir/p.jsonl (8 prompts) and dir/r.lua: a recipe of a one-layer model (its lines 1 to
  -- 3, which the line numbers in the messages below count) and then `fields`, recipe text.
  local function write_run(dir, fields)
    support.prompts(dir .. "/p.jsonl", 8, '{"prompt": "a prompt %d"}')
    write(dir .. "/r.lua", [[
return { model_config = { architectures = { "Qwen2ForCausalLM" }, hidden_size = 32, intermediate_size = 64,
  num_hidden_layers = 1, num_attention_heads = 4, num_key_value_heads = 2, max_position_embeddings = 256,
  rope_theta = 10000, rms_norm_eps = 1e-6, tie_word_embeddings = true },
]] .. fields)
  end

  it("stops a run through the reward's failure path, naming the reward and keeping the last checkpoint", function()
    local dir = tmpdir()
    write(dir .. "/quit.lua", [[
local calls = 0
return { name = "quitter", fn = function(c)
  calls = calls + 1
  if calls == 3 then os.exit(0) end   -- the probe, step 1, then step 2
  local s = {}
  for i = 1, #c do s[i] = 0.5 end
  return s
end }
]])
    write_run(dir, ([[
  data = "%s/p.jsonl", rewards = { "%s/quit.lua" }, chat_template = "plain", num_generations = 2,
  max_completion_length = 4, per_device_train_batch_size = 2, learning_rate = 1e-3, max_steps = 3, eval_size = 0,
  output_dir = "%s/runs", run_name = "q", save_steps = 10, log_completions = 0, seed = 3 }
]]):format(dir, dir, dir))
    local out, rc = remax("run r.lua", dir)
    assert.are.equal(1, rc, out)
    assert.matches("reward 'quitter' (" .. dir .. "/quit.lua:2) failed at step 2", out, 1, true)
    assert.matches(dir .. "/quit.lua:4 called os.exit(0)", out, 1, true)
    local f = io.open(dir .. "/runs/q/checkpoints/step-1/trainer_state.json")
    assert.is_truthy(f, "the checkpoint of step 1: " .. out)
    if f then f:close() end
    os.execute("rm -rf '" .. dir .. "'")
  end)

  it("stops a run whose recipe function calls it, keeping the checkpoint of the last finished step", function()
    local dir = tmpdir()
    write_run(dir, ([[
  data = "%s/p.jsonl", rewards = { { name = "half", fn = function(c) local s = {} for i = 1, #c do s[i] = 0.5 end return s end } },
  chat_template = "plain", num_generations = 2, max_completion_length = 4, per_device_train_batch_size = 2,
  max_steps = 3, eval_size = 0, output_dir = "%s/runs", run_name = "q", save_steps = 10, log_completions = 0,
  loop = function(t)
    t:train_step()
    os.exit(0)
  end }
]]):format(dir, dir))
    local out, rc = remax("run r.lua", dir)
    assert.are.equal(1, rc, out)
    assert.matches("remax: r.lua:9 called os.exit(0)", out, 1, true)
    assert.matches("checkpoint step-1 saved (user code called os.exit)", out, 1, true)
    local f = io.open(dir .. "/runs/q/checkpoints/step-1/trainer_state.json")
    assert.is_truthy(f, out)
    if f then f:close() end
    os.execute("rm -rf '" .. dir .. "'")
  end)

  it("is trapped around a reward called from Lua too", function()
    local r = rewards.normalize({ name = "x", fn = function() os.exit(3) end }, 1)
    local msg = err_of(rewards.run_one, r, { "a" }, {}, {})
    assert.matches("reward 'x' .- failed.-called os.exit%(3%)", msg)
    assert.are.equal(require("remax.step.guard").real_exit, os.exit)
  end)
end)

describe("reward_timeout", function()
  it("defaults to a minute, or four times the generation time when that is longer", function()
    assert.is_nil(config.resolve({}).reward_timeout)
    assert.are.equal(60, rewards.limit(nil, 0.5))
    assert.are.equal(240, rewards.limit(nil, 60))
    assert.are.equal(5, rewards.limit(5, 60))
  end)

  it("says in the progress line when a reward is slow", function()
    assert.is_true(rewards.is_slow(20, 1, 60))     -- a third of its limit
    assert.is_true(rewards.is_slow(2, 0.5, 60))    -- longer than the generation
    assert.is_false(rewards.is_slow(0.2, 1, 60))
    local p = require("remax.run.progress").new({ total = 10, label = "x", tty = false,
      out = { write = function() end, flush = function() end } })
    assert.matches("reward slow 20.0s", p:format(1, { reward = 0.5, reward_slow = 20 }), 1, true)
    assert.is_falsy(p:format(1, { reward = 0.5 }):find("slow", 1, true))
  end)
end)
