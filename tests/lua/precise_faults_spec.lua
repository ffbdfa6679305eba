-- Issue 35, finding 9: inputs that were accepted silently or answered with a misleading message
-- now get a precise message or a refusal, each naming the file, key or value.
local support = require("support")
local tmpdir, write, read = support.tmpdir, support.write, support.try_read
local q = support.shell_quote
local cli = require("remax.cli.main")
local cjson = require("cjson")

local function err_of(f, ...)
  local ok, e = pcall(f, ...)
  assert.is_false(ok, "expected an error")
  return tostring(e)
end

local function sh(cmd)
  local p = assert(io.popen(("OMP_NUM_THREADS=1 timeout -s KILL 120 sh -c %s 2>&1; echo \"rc=$?\""):format(q(cmd))))
  local out = p:read("*a")
  p:close()
  return out, tonumber(out:match("rc=(%d+)%s*$"))
end

describe("a resumed run's files", function()
  local resume = require("remax.run.resume")
  local runs = require("remax.run.folder")

  local function run_dir(config_text)
    local d = tmpdir() .. "/run"
    os.execute("mkdir -p " .. q(d))
    write(d .. "/config.json", config_text)
    return d
  end

  it("refuses keys config.json has that remax does not know, naming them", function()
    local d = run_dir('{"max_steps": 3, "lerning_rate": 0.1, "zzz_unknown": 1}')
    local msg = err_of(resume.resolve, {}, { resume = d })
    assert.matches(d .. "/config.json has settings remax does not know: lerning_rate (did you mean learning_rate?), zzz_unknown", msg, 1, true)
  end)

  it("says a config.json holding a JSON array is not an object of settings", function()
    local d = run_dir("[1, 2, 3]")
    assert.matches(d .. "/config.json is a JSON array; a run's config.json is an object of settings",
      err_of(resume.resolve, {}, { resume = d }), 1, true)
    d = run_dir("[]")
    assert.matches("is a JSON array", err_of(resume.resolve, {}, { resume = d }), 1, true)
  end)

  it("refuses --resume together with --overwrite_output_dir", function()
    local d = run_dir('{"max_steps": 3}')
    assert.matches("--resume " .. d .. " and overwrite_output_dir = true contradict each other",
      err_of(resume.resolve, {}, { resume = d, overwrite_output_dir = true }), 1, true)
  end)

  it("refuses a trainer_state.json whose step is not its folder's, and names a missing trainer_state.safetensors", function()
    local d = tmpdir() .. "/r"
    local run = runs.open(d, { config = { max_steps = 3 } })
    run:save_checkpoint(1, nil, { optimizer_step = 1, tensors = {} })
    run:save_checkpoint(2, nil, { optimizer_step = 2, tensors = {} })
    local state_path = d .. "/checkpoints/step-2/trainer_state.json"
    local state = cjson.decode(read(state_path))
    state.step = 99
    write(state_path, cjson.encode(state))
    assert.matches(state_path .. " says step 99 but its folder is step-2",
      err_of(run.load_checkpoint, run, d .. "/checkpoints/step-2"), 1, true)
    os.remove(d .. "/checkpoints/step-1/trainer_state.safetensors")
    assert.matches(d .. "/checkpoints/step-1/trainer_state.safetensors is missing (the optimizer state of step 1)",
      err_of(run.load_checkpoint, run, d .. "/checkpoints/step-1"), 1, true)
    run:release()
  end)

  it("says an unreadable run folder cannot be read, not that there is no run", function()
    if select(2, sh("command -v setpriv")) ~= 0 then return pending("setpriv is not installed") end
    local d = run_dir('{"max_steps": 3}')
    sh("chmod 700 " .. q(d))
    local as = select(2, sh('test "$(id -u)" = 0')) == 0 and "setpriv --reuid=65534 --regid=65534 --clear-groups " or ""
    local recipe = tmpdir() .. "/r.lua"
    write(recipe, "return { max_steps = 3 }")
    sh("chmod a+rx " .. q(recipe:match("^(.*)/")) .. " && chmod a+r " .. q(recipe))
    local out, rc = sh(("%s%s/remax run %s --resume %s"):format(as, cli.build_dir(), recipe, d))
    assert.are_not.equal(0, rc, out)
    if as == "" and out:find("no run there", 1, true) then return end   -- not root and the folder is ours: readable
    assert.is_truthy(out:find(("--resume %s: cannot read %s/config.json (Permission denied)"):format(d, d), 1, true), out)
  end)
end)

describe("settings", function()
  local config = require("remax.settings.config")

  it("refuses report_to none or all beside other entries", function()
    for _, list in ipairs({ { "none", "csv" }, { "csv", "all" } }) do
      local msg = err_of(config.resolve, { algo = "sft", report_to = list }, {})
      assert.matches(("report_to = %s: "):format(table.concat(list, ",")), msg, 1, true)
      assert.matches("cannot be combined with other entries", msg, 1, true)
    end
    assert.are.same({ "tensorboard", "csv" }, config.resolve({ algo = "sft", report_to = { "tensorboard", "csv" } }, {}).report_to)
  end)
end)

describe("remax generate", function()
  local generate = require("remax.cli.generate")
  local function parse_error(args)
    local argv = { "--model", "m", "--prompt", "hi" }
    for a in args:gmatch("%S+") do argv[#argv + 1] = a end
    return err_of(generate.parse, argv):match("^[^\n]*")
  end

  it("refuses an infinite temperature and seeds it cannot take exactly", function()
    assert.are.equal("generate: --temperature inf: expected a finite number >= 0 (0 = greedy)", parse_error("--temperature inf"))
    for _, seed in ipairs({ "-1", "1e30", "1e300", "9007199254740992" }) do
      assert.are.equal(("generate: --seed %s: expected a whole number in [0, 2^53)"):format(seed), parse_error("--seed " .. seed))
    end
    assert.are.equal(12345, generate.parse({ "--model", "m", "--prompt", "x", "--seed", "12345" }).seed)
    assert.are.equal("generate: --n 1e9: expected a whole number in [1, 65536]", parse_error("--n 1e9"))
  end)

  it("says how many new tokens fit in the model's positions", function()
    local remax = require("remax")
    local dir = tmpdir() .. "/m"
    remax.model.new(support.tiny_model({ vocab_size = 260, hidden_size = 16, intermediate_size = 32, num_attention_heads = 2,
      num_key_value_heads = 1, max_position_embeddings = 64 }), { seed = 1 }):save(dir)
    local fixture = require("remax.bind.ffi").home .. "/tests/fixtures/byte_tokenizer/"
    os.execute(("cp %s* %s/"):format(q(fixture), q(dir)))
    local out, rc = sh(("%s/remax generate --model %s --prompt-ids 1,2,3 --max-new-tokens 1e9"):format(cli.build_dir(), dir))
    assert.are_not.equal(0, rc, out)
    assert.is_nil(out:find("internal error", 1, true), out)
    assert.is_truthy(out:find("--max-new-tokens 1e9: the prompt's 3 tokens and the completion must fit in the model's "
      .. "max_position_embeddings = 64 (" .. dir .. "/config.json): at most 61 new tokens", 1, true), out)
    out, rc = sh(("%s/remax generate --model %s --prompt-ids 1,2,3 --max-new-tokens 61 --temperature 0"):format(cli.build_dir(), dir))
    assert.are.equal(0, rc, out)
  end)
end)

describe("a Hugging Face snapshot with broken links", function()
  it("names the links and says they are broken", function()
    local hf = require("remax.formats.hf_cache")
    local cache = tmpdir()
    local commit = "0123456789abcdef0123456789abcdef01234567"
    local repo = cache .. "/models--org--gone"
    os.execute(("mkdir -p %s/snapshots/%s %s/refs %s/blobs"):format(q(repo), commit, q(repo), q(repo)))
    write(repo .. "/refs/main", commit)
    write(repo .. "/blobs/aaa", "{}")
    os.execute(("ln -s ../../blobs/aaa %s/snapshots/%s/config.json"):format(q(repo), commit))
    os.execute(("ln -s ../../blobs/bbb %s/snapshots/%s/model.safetensors"):format(q(repo), commit))
    local real = os.getenv
    os.getenv = function(k) if k == "HF_HUB_CACHE" then return cache end return nil end
    local dir, err = hf.find("org/gone")
    os.getenv = real
    assert.is_nil(dir)
    assert.matches(("org/gone: %s/snapshots/%s: broken link: model.safetensors (-> ../../blobs/bbb)"):format(repo, commit), err, 1, true)
  end)
end)

describe("a full disk", function()
  it("is told with the file and errno, without remax's source positions", function()
    local dir = tmpdir()
    support.prompts(dir .. "/p.jsonl", 8)
    write(dir .. "/r.lua", ([[
return {
  model_config = { architectures = { "Qwen2ForCausalLM" }, hidden_size = 16, intermediate_size = 32,
    num_hidden_layers = 1, num_attention_heads = 2, num_key_value_heads = 1, max_position_embeddings = 64,
    rope_theta = 10000, rms_norm_eps = 1e-6, tie_word_embeddings = true },
  data = %q, rewards = { function(c) local s = {} for i = 1, #c do s[i] = #c[i] / 10 end return s end },
  chat_template = "plain", hot_reload = false, num_generations = 2, max_completion_length = 4, max_steps = 1,
  eval_size = 0, save_steps = 1, seed = 3, output_dir = %q, dtype = "f32", per_device_train_batch_size = 2,
}
]]):format(dir .. "/p.jsonl", dir .. "/runs"))
    local b = cli.build_dir()
    local out, rc = sh(("%s/remax run %s/r.lua --run_name full"):format(b, dir))
    assert.are.equal(0, rc, out)
    local size = #read(dir .. "/runs/full/checkpoints/step-1/model.safetensors")
    -- a file-size limit below a checkpoint: write() fails with EFBIG, as on a full disk
    out, rc = sh(("trap '' XFSZ && ulimit -f %d && %s/remax run %s/r.lua --resume %s/runs/full --max_steps 2"):format(
      math.floor(size / 2 / 512), b, dir, dir))
    assert.are_not.equal(0, rc, out)
    assert.is_truthy(out:find("checkpoint step-2 not saved", 1, true), out)
    assert.is_truthy(out:find("File too large", 1, true), out)
    assert.is_nil(out:find("%.lua:%d+:"), out)
  end)
end)
