-- messages_spec: messages that say what to change (issue 45, family 9): a user error that ends
-- in ':' is not called a bug in remax, a chat_template list without a 'default' entry says what
-- the list has, a rank 0 that stopped is named, a max_tokens_per_microbatch far above every row
-- trains (and one too large for memory says which budget fits), and the agent settings say when
-- they do nothing.
local remax = require("remax")
local cjson = require("cjson")
local errors = require("remax.cli.errors")
local prefs = require("remax.step.preferences")
local chat = require("remax.text.chat")
local config = require("remax.settings.config")
local setup = require("remax.run.setup")
local trainer = require("remax.run.run")
local fit = require("remax.step.fit")
local support = require("support")
local write, tmpdir = support.write, support.tmpdir

describe("a user error that ends in ':'", function()
  it("is printed as the user's, not as a bug in remax; a bare prefix still is one", function()
    local msg = "/data/p.jsonl:1: missing column 'chosen' (every pair needs 'chosen' and 'rejected'); columns:"
    assert.are.equal(msg, errors.message(msg))
    assert.matches("^internal error: an error with nothing after 'generate:'", errors.message("generate: "))
  end)

  it("does not come from an empty JSON object in a pairs file: its columns are said to be none", function()
    local path = tmpdir() .. "/p.jsonl"
    write(path, "{}\n")
    local ok, err = pcall(prefs.load, path)
    assert.is_false(ok)
    assert.are.equal(path .. ":1: missing column 'chosen' (every pair needs 'chosen' and 'rejected'); columns: none (an empty object)",
      errors.message(err))
  end)
end)

describe("a chat_template list without a 'default' entry", function()
  local dir = tmpdir()
  remax.tokenizer.write_byte_level(dir)
  local cfg = cjson.decode(support.read(dir .. "/tokenizer_config.json"))
  cfg.chat_template = { { name = "tool_use", template = "T{{ 1 }}" }, { name = "rag", template = "R" } }
  write(dir .. "/tokenizer_config.json", cjson.encode(cfg))
  local tok = remax.tokenizer.load(dir)

  it("says what the list has, where a template is needed", function()
    local ok, err = pcall(chat.render, { { role = "user", content = "hi" } }, { template = "tokenizer", tokenizer = tok })
    assert.is_false(ok)
    assert.matches("the tokenizer's chat_template in " .. dir .. "/tokenizer_config.json is a list of named templates without "
      .. "a 'default' entry (it has: tool_use, rag)", err, 1, true)
    assert.is_nil(err:find("has no chat_template", 1, true), err)
  end)

  it("is refused under chat_template = auto instead of rendering with qa behind the user's back", function()
    local ok, err = pcall(setup.template, config.resolve({ chat_template = "auto", rewards = { "length" } }), tok)
    assert.is_false(ok)
    assert.matches("chat_template = auto: the tokenizer's chat_template in ", err, 1, true)
    assert.matches("(it has: tool_use, rag)", err, 1, true)
    assert.are.equal("chatml", select(2, setup.template(config.resolve({ chat_template = "chatml", rewards = { "length" } }), tok)))
  end)
end)

describe("max_tokens_per_microbatch", function()
  local function new(extra)
    local dir = support.train_dir(8)
    local s = support.run_settings(dir, { model_config = support.tiny_model({ num_hidden_layers = 1 }), num_generations = 2,
      max_completion_length = 4, per_device_train_batch_size = 2, max_steps = 1, dtype = "f32" }, extra)
    return trainer.new(config.resolve(s), { quiet = true, signals = false })
  end

  it("far above every row trains: the activation plan is the longest pack's, not the budget's", function()
    local t = new({ max_tokens_per_microbatch = 1000000000 })
    local m = t:train_step()
    assert.is_number(m.loss)
    t.run:close()
  end)

  it("whose packs cannot fit says which budget fits, not a batch size", function()
    local t = new({ max_tokens_per_microbatch = 64 })
    local real = fit.available_bytes
    local c = t.model:cfg()
    local a, h = fit.activation_bytes(c, 1, 10, { train = true })
    -- room for a pack of 10 tokens, the model's own plan holding nothing
    fit.available_bytes = function() return a + h end
    t.model.memory = function() return { activations = 0, head = 0 } end
    local ok, err = pcall(t.train_step, t)
    fit.available_bytes, t.model.memory = real, nil
    assert.is_false(ok)
    assert.matches("^step 1: a pack of %d+ tokens %(max_tokens_per_microbatch = 64%) needs [%d.]+ [MG]iB of activations, "
      .. "but [%d.]+ [MG]iB of memory is available; max_tokens_per_microbatch = %d+ would fit", err)
    assert.is_nil(err:find("per_device_train_batch_size", 1, true), err)
    t.run:close()
  end)
end)

describe("the agent settings without tools or an environment", function()
  it("say that they do nothing", function()
    local notes = table.concat(config.resolve({ max_turns = 3, tool_timeout = 5, strict_episodes = true,
      tool_call_format = "llama3", rewards = { "length" } }).inert_notes, "\n")
    for _, k in ipairs({ "max_turns = 3", "tool_timeout = 5", "strict_episodes = true" }) do
      assert.matches("note: " .. k .. " has no effect here: there are no tools and no environment", notes, 1, true)
    end
    assert.matches("note: tool_call_format = llama3 has no effect here: there are no tools to call", notes, 1, true)
    notes = table.concat(config.resolve({ max_tool_calling_iterations = 2, rewards = { "length" } }).inert_notes, "\n")
    assert.matches("note: max_tool_calling_iterations (max_turns) = 3 has no effect here", notes, 1, true)
    assert.are.same({}, config.resolve({ max_turns = 3, tool_timeout = 5, environment = { step = print },
      rewards = { "length" } }).inert_notes)
  end)
end)

local skip = support.mpi_missing()
local describe_mpi = skip and pending or describe

describe_mpi("rank 0 stopped (SIGSTOP) in a two-rank run", function()
  it("is named by the rank that waited for it", function()
    local dir = tmpdir()
    write(dir .. "/stop.lua", [[
local ffi = require("ffi")
pcall(ffi.cdef, "int getpid(void); int kill(int pid, int sig);")
local calls = 0
return { name = "stop", fn = function(c)
  calls = calls + 1
  if os.getenv("OMPI_COMM_WORLD_RANK") == "0" and calls == 3 then ffi.C.kill(ffi.C.getpid(), 19) end
  local s = {}
  for i = 1, #c do s[i] = 0.5 end
  return s
end }
]])
    support.prompts(dir .. "/p.jsonl", 16)
    write(dir .. "/r.lua", ([[
return {
  model_config = { architectures = { "Qwen2ForCausalLM" }, hidden_size = 16, intermediate_size = 32,
    num_hidden_layers = 1, num_attention_heads = 2, num_key_value_heads = 1, max_position_embeddings = 128,
    rope_theta = 10000, rms_norm_eps = 1e-6, tie_word_embeddings = true },
  data = %q, rewards = { %q }, chat_template = "plain", hot_reload = false, num_generations = 2,
  max_completion_length = 4, max_steps = 5, eval_size = 0, save_steps = 0, log_completions = 0, seed = 7,
  output_dir = %q, dtype = "f32", per_device_train_batch_size = 2, dist_timeout = 3,
}
]]):format(dir .. "/p.jsonl", dir .. "/stop.lua", dir .. "/runs"))
    local out, rc = support.run_remax(2, "run " .. dir .. "/r.lua")
    assert.are_not.equal(0, rc, out)
    assert.matches("remax (rank 1 of 2): ", out, 1, true)
    assert.matches("waited 3 s (dist_timeout) for rank(s) 0, which did not come", out, 1, true)
    assert.is_nil(out:find("rank(s) ?", 1, true), out)
  end)
end)
