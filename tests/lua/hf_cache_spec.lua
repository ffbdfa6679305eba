-- Hugging Face model names resolved through a cache folder this spec builds in the Hugging Face
-- layout (models--org--name/refs/main, snapshots/<commit>/), and `remax generate --model ORG/NAME`.
local hf = require("remax.formats.hf_cache")
local remax = require("remax")
local support = require("support")
local tmpdir, write = support.tmpdir, support.write

local q = support.shell_quote

-- Runs f with os.getenv answering from env (and nothing else).
local function with_env(env, f)
  local real = os.getenv
  os.getenv = function(k) return env[k] end
  local ok, a, b = pcall(f)
  os.getenv = real
  if not ok then error(a, 0) end
  return a, b
end

local COMMIT_A = "0123456789abcdef0123456789abcdef01234567"
local COMMIT_B = "89abcdef0123456789abcdef0123456789abcdef"

-- A repository in a cache: snapshots for each commit (config.json only unless a model is saved
-- there), refs/main pointing at main_commit.
local function make_repo(cache, id, commits, main_commit)
  local repo = cache .. "/models--" .. id:gsub("/", "--")
  for _, c in ipairs(commits) do
    os.execute(("mkdir -p %s/snapshots/%s"):format(q(repo), c))
    write(("%s/snapshots/%s/config.json"):format(repo, c), '{"commit": "' .. c .. '"}')
  end
  if main_commit then
    os.execute(("mkdir -p %s/refs"):format(q(repo)))
    write(repo .. "/refs/main", main_commit .. "\n")
  end
  return repo
end

describe("Hugging Face cache names", function()
  local root
  setup(function() root = tmpdir() end)
  teardown(function() os.execute("rm -rf " .. q(root)) end)

  it("finds a snapshot through refs/main, in HF_HUB_CACHE, HF_HOME/hub and ~/.cache/huggingface/hub", function()
    local hub = root .. "/hub"
    local repo = make_repo(hub, "Qwen/Qwen2.5-0.5B-Instruct", { COMMIT_A, COMMIT_B }, COMMIT_B)
    local want = repo .. "/snapshots/" .. COMMIT_B
    assert.are.equal(want, with_env({ HF_HUB_CACHE = hub }, function() return hf.model_dir("Qwen/Qwen2.5-0.5B-Instruct") end))
    -- an explicit revision: a commit folder, or a ref
    assert.are.equal(repo .. "/snapshots/" .. COMMIT_A,
      with_env({ HF_HUB_CACHE = hub }, function() return hf.model_dir("Qwen/Qwen2.5-0.5B-Instruct@" .. COMMIT_A) end))
    os.execute(("mkdir -p %s/refs && printf %s > %s/refs/v1"):format(q(repo), COMMIT_A, q(repo)))
    assert.are.equal(repo .. "/snapshots/" .. COMMIT_A,
      with_env({ HF_HUB_CACHE = hub }, function() return hf.model_dir("Qwen/Qwen2.5-0.5B-Instruct@v1") end))

    local home = root .. "/home"
    local r2 = make_repo(home .. "/hfhome/hub", "org/a-model", { COMMIT_A }, COMMIT_A)
    assert.are.equal(r2 .. "/snapshots/" .. COMMIT_A,
      with_env({ HF_HOME = home .. "/hfhome", HOME = home }, function() return hf.model_dir("org/a-model") end))
    local r3 = make_repo(home .. "/.cache/huggingface/hub", "org/b", { COMMIT_B }, nil)   -- no refs/main, one snapshot
    assert.are.equal(r3 .. "/snapshots/" .. COMMIT_B,
      with_env({ HOME = home }, function() return hf.model_dir("org/b") end))
    -- a local folder wins over the cache
    os.execute(("mkdir -p %s/org/a-model"):format(q(root)))
    write(root .. "/org/a-model/config.json", "{}")
    assert.are.equal(root .. "/org/a-model",
      with_env({ HOME = home }, function() return hf.model_dir(root .. "/org/a-model") end))
  end)

  it("says where it looked and the hf download command when a name is not cached", function()
    local hub = root .. "/hub2"
    local err = select(2, with_env({ HF_HUB_CACHE = hub, HOME = root .. "/nohome" }, function()
      return pcall(hf.model_dir, "Qwen/Qwen2.5-7B", "model") end))
    assert.matches("model Qwen/Qwen2.5-7B: not a model folder here, and not in the Hugging Face cache", err, 1, true)
    assert.matches("looked in " .. hub .. "/models--Qwen--Qwen2.5-7B, " .. root .. "/nohome/.cache/huggingface/hub/models--Qwen--Qwen2.5-7B", err, 1, true)
    assert.matches("download it with: hf download Qwen/Qwen2.5-7B", err, 1, true)
    -- a partial download and an ambiguous cache are named
    local repo = make_repo(hub, "org/partial", { COMMIT_A }, COMMIT_A)
    os.remove(repo .. "/snapshots/" .. COMMIT_A .. "/config.json")
    err = select(2, with_env({ HF_HUB_CACHE = hub }, function() return pcall(hf.model_dir, "org/partial") end))
    assert.matches("has no config.json (a partial download?", err, 1, true)
    make_repo(hub, "org/two", { COMMIT_A, COMMIT_B }, nil)
    err = select(2, with_env({ HF_HUB_CACHE = hub }, function() return pcall(hf.model_dir, "org/two") end))
    assert.matches("has no refs/main and 2 snapshots", err, 1, true)
    assert.matches("org/two@<commit>", err, 1, true)
    -- a path that is not a repository id is only a missing folder
    err = select(2, pcall(hf.model_dir, "runs/x/checkpoints/step-20"))
    assert.are.equal("runs/x/checkpoints/step-20: no model there (no runs/x/checkpoints/step-20/config.json)", err)
  end)

  it("runs remax generate --model ORG/NAME from the cache", function()
    local hub = root .. "/hub3"
    local snap = make_repo(hub, "tiny-org/tiny", { COMMIT_A }, COMMIT_A) .. "/snapshots/" .. COMMIT_A
    local tok = remax.tokenizer.load("tests/fixtures/byte_tokenizer")
    local m = remax.model.new({ architectures = { "Qwen2ForCausalLM" }, vocab_size = tok.vocab_size, hidden_size = 16,
      intermediate_size = 24, num_hidden_layers = 2, num_attention_heads = 4, num_key_value_heads = 2, rms_norm_eps = 1e-6,
      rope_theta = 10000, tie_word_embeddings = false, max_position_embeddings = 128 }, { seed = 3, init_std = 0.3 })
    m:save(snap)
    os.execute(("cp tests/fixtures/byte_tokenizer/tokenizer.json %s/"):format(q(snap)))
    local bin = require("remax.cli.main").build_dir() .. "/remax"
    local p = io.popen(("HF_HUB_CACHE=%s %s generate --model tiny-org/tiny --prompt-ids 104,105 --max-new-tokens 4 --temperature 0 2>&1; echo rc=$?")
      :format(q(hub), q(bin)))
    local out = p:read("*a")
    p:close()
    assert.matches("rc=0", out, 1, true)
    local want = m:generate({ { 104, 105 } }, { temperature = 0, max_new_tokens = 4, seed = 0, stop = { 256, 258 } })
    local text = tok:decode(want.rows[1].tokens, { skip_special_tokens = true })
    assert.is_true(#text > 0)
    assert.is_truthy(out:find(text, 1, true), out)
    p = io.popen(("HF_HUB_CACHE=%s HOME=%s %s generate --model tiny-org/absent --prompt-ids 1 2>&1; echo rc=$?")
      :format(q(hub), q(root), q(bin)))
    out = p:read("*a")
    p:close()
    assert.matches("hf download tiny-org/absent", out, 1, true)
    assert.is_nil(out:match("rc=0"))
  end)
end)
