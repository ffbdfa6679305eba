-- A failed start removes what it made (issue 35, docs/runs.md): a new run that stops before its
-- first step ends (a chat template that fails to render, a prompt longer than the model's
-- positions) leaves no runs/<name>/ behind; a run that finished a step keeps its folder.
local cli = require("remax.cli.main")
local support = require("support")
local tmpdir, write, read = support.tmpdir, support.write, support.try_read
local fs = require("remax.bind.fs")

local function sh(cmd)
  local p = assert(io.popen(("OMP_NUM_THREADS=1 timeout -s KILL 120 %s 2>&1; echo \"rc=$?\""):format(cmd)))
  local out = p:read("*a")
  p:close()
  return out, tonumber(out:match("rc=(%d+)%s*$"))
end

local MODEL = [[model_config = { architectures = { "Qwen2ForCausalLM" }, hidden_size = 16, intermediate_size = 32,
    num_hidden_layers = 1, num_attention_heads = 2, num_key_value_heads = 1, max_position_embeddings = %d,
    rope_theta = 10000, rms_norm_eps = 1e-6, tie_word_embeddings = true },]]

local function recipe(dir, name, fields)
  write(dir .. "/" .. name, ([[
local calls = 0
return {
  %s
  data = %q, rewards = { function(c) calls = calls + 1
    if calls == tonumber(os.getenv("FAIL_CALL") or -1) then error("reward made to fail") end
    local s = {} for i = 1, #c do s[i] = #c[i] / 10 end return s end },
  hot_reload = false, num_generations = 2, max_completion_length = 4, max_steps = 3, eval_size = 0,
  save_steps = 1, seed = 3, output_dir = %q, dtype = "f32", per_device_train_batch_size = 2,
}
]]):format(fields, dir .. "/p.jsonl", dir .. "/runs"))
  return dir .. "/" .. name
end

describe("a run that fails before its first step", function()
  local dir, b
  setup(function()
    dir = tmpdir()
    b = cli.build_dir()
    support.prompts(dir .. "/p.jsonl", 16)
  end)

  local function fails_leaving_nothing(rfile, name, message, extra)
    local out, rc = sh(("%s/remax run %s --run_name %s %s"):format(b, rfile, name, extra or ""))
    assert.are_not.equal(0, rc, out)
    assert.is_truthy(out:find(message, 1, true), out)
    assert.is_false(fs.is_dir(dir .. "/runs/" .. name), name .. " was left behind: " .. table.concat(fs.list_dir(dir .. "/runs/" .. name), ", "))
  end

  it("removes the folder when a prompt is longer than the model's positions", function()
    local r = recipe(dir, "short.lua", MODEL:format(16) .. ' chat_template = "plain",')
    fails_leaving_nothing(r, "short", "exceeds max_position_embeddings = 16", "--max_prompt_length 100")
  end)

  it("removes the folder when a recipe's template function fails", function()
    local r = recipe(dir, "fn.lua", MODEL:format(128) .. ' chat_template = function() error("template broke") end,')
    fails_leaving_nothing(r, "fn", "template broke")
  end)

  it("removes the folder when the tokenizer's chat template fails to render", function()
    -- a model folder: random weights, the byte tokenizer, a template that calls an unknown filter
    local remax = require("remax")
    local mdir = dir .. "/model"
    remax.model.new(support.tiny_model({ vocab_size = 260, hidden_size = 16, intermediate_size = 32, num_attention_heads = 2,
      num_key_value_heads = 1, max_position_embeddings = 128 }), { seed = 1 }):save(mdir)
    local cjson = require("cjson")
    local fixture = require("remax.bind.ffi").home .. "/tests/fixtures/byte_tokenizer/"
    write(mdir .. "/tokenizer.json", support.read(fixture .. "tokenizer.json"))
    local tc = cjson.decode(support.read(fixture .. "tokenizer_config.json"))
    tc.chat_template = "{% for m in messages %}{{ m.content | no_such_filter }}{% endfor %}"
    write(mdir .. "/tokenizer_config.json", cjson.encode(tc))
    local r = recipe(dir, "jinja.lua", ("model = %q,"):format(mdir))
    fails_leaving_nothing(r, "jinja", "no_such_filter")
  end)

  it("keeps a run that finished a step, and a resumed run's folder", function()
    local r = recipe(dir, "late.lua", MODEL:format(128) .. ' chat_template = "plain",')
    -- reward call 1 is the check at setup, 2 is step 1, 3 is step 2
    local out, rc = sh(("env FAIL_CALL=3 %s/remax run %s --run_name late"):format(b, r))
    assert.are_not.equal(0, rc, out)
    assert.is_truthy(out:find("reward made to fail", 1, true), out)
    assert.is_truthy(read(dir .. "/runs/late/checkpoints/step-1/trainer_state.json"), out)
    -- a resume that fails at once keeps the run
    out, rc = sh(("env FAIL_CALL=2 %s/remax run %s --resume %s/runs/late"):format(b, r, dir))
    assert.are_not.equal(0, rc, out)
    assert.is_truthy(read(dir .. "/runs/late/config.json"), out)
  end)
end)
