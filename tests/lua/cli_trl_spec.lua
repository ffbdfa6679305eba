-- The command line as a TRL user types it: dashes or underscores in every command, booleans in
-- any common spelling, TRL settings remax lacks refused with the reason, num_train_epochs,
-- `remax run --help` / `remax eval --help`, and plain logs under a launcher.
local config = require("remax.settings.config")
local generate = require("remax.cli.generate")
local gguf = require("remax.formats.gguf")
local support = require("support")
local tmpdir, write = support.tmpdir, support.write

local q = support.shell_quote

local function remax(args)
  local bin = require("remax.cli.main").build_dir() .. "/remax"
  local p = io.popen(("%s %s 2>&1; echo rc=$?"):format(q(bin), args))
  local out = p:read("*a")
  p:close()
  return out:gsub("rc=%d+%s*$", ""), tonumber(out:match("rc=(%d+)%s*$"))
end

local err_of = support.error_of

describe("command line", function()
  it("takes --max-new-tokens and --max_new_tokens alike, in every command", function()
    local o = config.parse_args({ "--max-completion-length", "64", "--learning-rate=3e-5", "--per_device_train_batch_size", "2" })
    assert.are.same({ max_completion_length = 64, learning_rate = 3e-5, per_device_train_batch_size = 2 }, o)
    local g = generate.parse({ "--model", "m", "--prompt", "x", "--max_new_tokens", "7", "--top_p", "0.5", "--top-k=3" })
    assert.are.equal(7, g["max-new-tokens"])
    assert.are.equal(0.5, g["top-p"])
    assert.are.equal(3, g["top-k"])
    local e = gguf.parse_args({ "--model", "m", "--gguf", "o.gguf", "--tokenizer_pre", "qwen2" })
    assert.are.equal("qwen2", e["tokenizer-pre"])
  end)

  it("reads booleans as true/false/True/False/1/0, and a bare flag as true", function()
    for word, want in pairs({ ["true"] = true, ["True"] = true, ["1"] = true, ["false"] = false, ["False"] = false,
      ["0"] = false, FALSE = false }) do
      assert.are.equal(want, config.parse_args({ "--use_lora", word }).use_lora, word)
      assert.are.equal(want, config.parse_args({ "--use_lora=" .. word }).use_lora, word)
    end
    assert.is_true(config.parse_args({ "--use_lora", "--beta", "0.1" }).use_lora)
    assert.is_true(config.parse_args({ "--use_lora" }).use_lora)
    assert.is_true(generate.parse({ "--model", "m", "--prompt", "x", "--chat", "True" }).chat)
    assert.is_nil(generate.parse({ "--model", "m", "--prompt", "x", "--chat", "0" }).chat)
    assert.is_true(generate.parse({ "--model", "m", "--chat", "--prompt", "x" }).chat)
  end)

  it("refuses TRL settings remax lacks with the reason, and suggests only close names", function()
    local function msg(key, value) return err_of(config.parse_args, { "--" .. key, value or "1" }) end
    assert.matches("use_vllm is not a remax setting: remax generates with its own engine", msg("use_vllm", "true"), 1, true)
    assert.matches("vllm_mode is not a remax setting: remax generates with its own engine", msg("vllm_mode", "colocate"), 1, true)
    assert.matches("bf16 is not a remax setting: use --dtype bf16", msg("bf16", "true"), 1, true)
    assert.matches("resume_from_checkpoint is not a remax setting: use --resume runs/<name>", msg("resume_from_checkpoint", "x"), 1, true)
    local far = msg("frobnicate")
    assert.matches("unknown setting 'frobnicate'", far, 1, true)
    assert.is_nil(far:find("did you mean", 1, true))
    assert.matches("did you mean 'learning_rate'", msg("learnig_rate", "1"), 1, true)
    -- in a recipe too
    local ok, err = pcall(config.resolve, { use_vllm = true }, {}, { where = "recipes/x.lua" })
    assert.is_false(ok)
    assert.matches("recipes/x.lua: use_vllm is not a remax setting", err, 1, true)
    -- supported: report_to, num_train_epochs, gradient_checkpointing, overwrite_output_dir
    local o = config.parse_args({ "--report_to", "csv", "--num_train_epochs", "2", "--gradient_checkpointing", "true",
      "--overwrite_output_dir", "True" })
    assert.are.same({ report_to = { "csv" }, num_train_epochs = 2, gradient_checkpointing = true, overwrite_output_dir = true }, o)
  end)

  it("prints help for remax run --help and remax eval --help", function()
    for _, cmd in ipairs({ "run --help", "eval --help", "run -h" }) do
      local out, rc = remax(cmd)
      assert.are.equal(0, rc, out)
      assert.matches("usage: remax " .. cmd:match("^%a+"), out, 1, true)
      assert.matches("--learning_rate", out, 1, true)
      assert.matches("--report_to", out, 1, true)
    end
  end)

  it("turns num_train_epochs into max_steps over the data, unless max_steps is given", function()
    local trainer = require("remax.run.run")
    local d = tmpdir()
    finally(function() os.execute("rm -rf " .. q(d)) end)
    write(d .. "/one.lua", "return { name = 'one', fn = function(c) local s = {} for i in ipairs(c) do s[i] = 1 end return s end }")
    support.prompts(d .. "/p.jsonl", 10, '{"prompt": "p %d", "answer": "a"}')
    local function recipe(extra)
      local r = { model_config = { architectures = { "Qwen2ForCausalLM" }, hidden_size = 16, intermediate_size = 32,
          num_hidden_layers = 1, num_attention_heads = 2, num_key_value_heads = 1, max_position_embeddings = 64,
          rope_theta = 10000, rms_norm_eps = 1e-6, tie_word_embeddings = true },
        data = d .. "/p.jsonl", rewards = { d .. "/one.lua" }, chat_template = "plain", num_generations = 2,
        max_completion_length = 4, per_device_train_batch_size = 2, gradient_accumulation_steps = 2,
        eval_size = 0, output_dir = d .. "/runs", save_steps = 0, log_completions = 0 }
      for k, v in pairs(extra) do r[k] = v end
      return r
    end
    -- 10 rows, 4 prompts per step: 2.5 epochs = 25 prompts = 7 steps (rounded up)
    local t = trainer.new(config.resolve(recipe({ run_name = "e" }), config.parse_args({ "--num_train_epochs", "2.5" })),
      { quiet = true, signals = false })
    assert.are.equal(7, t.cfg.max_steps)
    assert.are.equal(7, t.run:read_config().max_steps)
    assert.are.equal(7, t.stepper.policy.total_updates)
    local both = trainer.new(config.resolve(recipe({ run_name = "b", max_steps = 3, num_train_epochs = 2.5 })),
      { quiet = true, signals = false })
    assert.are.equal(3, both.cfg.max_steps)
    assert.matches("num_train_epochs = 0: expected a number in (0, 1e6]", err_of(config.resolve, { num_train_epochs = 0 }), 1, true)
  end)

  it("draws no live line (carriage returns, escapes) under mpirun, srun or TERM=dumb", function()
    local progress = require("remax.run.progress")
    local real = os.getenv
    for _, var in ipairs({ "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_PROCID" }) do
      os.getenv = function(k) if k == var then return "2" end return real(k) end
      local live = progress.live(1)
      os.getenv = real
      assert.is_false(live, var)
    end
    os.getenv = function(k) if k == "TERM" then return "dumb" end return real(k) end
    local live = progress.live(1)
    os.getenv = real
    assert.is_false(live)
    -- and a plain progress writes whole lines
    local buf = {}
    local out = { write = function(_, ...) for _, s in ipairs({ ... }) do buf[#buf + 1] = s end end, flush = function() end }
    local p = progress.new({ total = 3, out = out, tty = false })
    p:update(1, { reward = 0.5 })
    p:log("saved")
    p:status("eval 64/200 prompts")   -- a passing status: nothing in a log
    local text = table.concat(buf)
    assert.is_nil(text:find("[\r\27]"))
    assert.is_nil(text:find("eval 64", 1, true))
    assert.matches("step 1/3", text, 1, true)
    -- on a terminal the status follows the live line while an evaluation runs
    buf = {}
    local live_p = progress.new({ total = 3, out = out, tty = true })
    live_p.width = 200
    live_p:update(1, { reward = 0.5 })
    live_p:status("eval 64/200 prompts")
    text = table.concat(buf)
    assert.matches("\r[^\r]*step 1/3[^\r]*eval 64/200 prompts\27%[K$", text)
    -- and generation ticks about twice a second (a clock the test moves)
    local t = 0
    local ticking = progress.new({ total = 3, out = out, tty = true, clock = function() return t end })
    ticking.width = 200
    local tick = ticking:ticker("generating: token %d/%d")
    buf = {}
    tick(1, nil, nil, 256)
    assert.are.equal("", table.concat(buf))   -- too soon
    t = 0.6
    tick(37, nil, nil, 256)
    assert.matches("generating: token 37/256", table.concat(buf), 1, true)
    assert.is_nil(p:ticker("x %d/%d"))         -- off a terminal: no callback at all
  end)
end)
