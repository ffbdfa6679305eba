-- Padding-free training under MPI (issue 38): `mpirun -np 2 --zero_stage 2` packed
-- (padding_free = true, whose ranks balance their rows by tokens: remax.step.micro's balance)
-- against padded (padding_free = false, each rank its own prompts' rows), both from the same
-- start on the same global batch: the losses and the weights after 2 steps agree within 1e-6
-- relative in f32 (the weights: of their L2 norm). And packed on 2 ranks against packed in one
-- process with 2 accumulation steps: the token balance is a function of the global batch, so
-- the two add the same packs' gradients in the same order and end with the same bits. Skips, saying why, without mpirun or
-- the MPI backend (libremax_mpi.so).
local cli = require("remax.cli.main")
local cjson = require("cjson")

local support = require("support")
local tmpdir, write = support.tmpdir, support.write
local read = support.try_read


local skip = support.mpi_missing()
if skip then print("packing_dist_spec: skipping: " .. skip) end

-- Prompts of varied lengths (so the ranks' rows hold different token counts) and a reward with
-- a spread, so that advantages are not all zero.
local function recipe(dir)
  local lines = {}
  for i = 1, 16 do
    lines[i] = cjson.encode({ prompt = ("q%d "):format(i) .. ("word "):rep((i * 7) % 11), answer = tostring(i) })
  end
  write(dir .. "/p.jsonl", table.concat(lines, "\n") .. "\n")
  write(dir .. "/r.lua", ([[
return {
  model_config = { architectures = { "Qwen2ForCausalLM" }, hidden_size = 16, intermediate_size = 32,
    num_hidden_layers = 2, num_attention_heads = 2, num_key_value_heads = 1, max_position_embeddings = 128,
    rope_theta = 10000, rms_norm_eps = 1e-6, tie_word_embeddings = true },
  data = %q, chat_template = "plain", hot_reload = false,
  rewards = { { name = "lower", fn = function(completions, batch)
    local s = {}
    for i = 1, #completions do
      local ids, n = batch.completion_ids[i], 0
      for _, id in ipairs(ids) do if id >= 97 and id <= 122 then n = n + 1 end end
      s[i] = n / math.max(#ids, 1)
    end
    return s
  end } },
  algo = "grpo", num_generations = 3, generate_greedy = false, max_completion_length = 8, temperature = 1.5,
  learning_rate = 1e-2, max_grad_norm = 1.0, max_steps = 2, eval_size = 0, save_steps = 0, log_completions = 1,
  seed = 11, output_dir = %q, dtype = "f32", skip_zero_advantage = false, stop_strings = { "x" },
}
]]):format(dir .. "/p.jsonl", dir .. "/runs"))
  return dir .. "/r.lua"
end

local function remax(ranks, args) return support.run_remax(ranks, args) end
local jsonl, compare_weights = support.jsonl, support.compare_weights

local describe_mpi = skip and pending or describe

describe_mpi("padding-free training under mpirun -np 2", function()
  local dir, rfile
  setup(function()
    dir = tmpdir()
    rfile = recipe(dir)
  end)

  it("trains packed as padded with ZeRO-2, and packed on 2 ranks as packed in one process", function()
    local runs = {
      { name = "pad2", ranks = 2, args = "--padding_free false --zero_stage 2 --per_device_train_batch_size 2 --gradient_accumulation_steps 2" },
      { name = "pack2", ranks = 2, args = "--padding_free true --zero_stage 2 --per_device_train_batch_size 2 --gradient_accumulation_steps 2" },
      { name = "packw", ranks = 2, args = "--padding_free true --zero_stage 2 --per_device_train_batch_size 4" },
      { name = "pack1", ranks = 1, args = "--padding_free true --per_device_train_batch_size 4 --gradient_accumulation_steps 2" },
    }
    for _, r in ipairs(runs) do
      local out, rc = remax(r.ranks, ("run %s %s --run_name %s"):format(rfile, r.args, r.name))
      assert.are.equal(0, rc, out)
    end
    local function path(name) return dir .. "/runs/" .. name end
    -- the same rollouts: the layout changes the training forward only
    local ca, cb = jsonl(path("pad2") .. "/completions.jsonl"), jsonl(path("pack2") .. "/completions.jsonl")
    assert.are.equal(#ca, #cb)
    assert.is_true(#ca > 0)
    local lens = {}
    for i = 1, #ca do
      assert.are.equal(ca[i].completion, cb[i].completion)
      lens[#ca[i].completion] = true
    end
    local ma, mb = jsonl(path("pad2") .. "/metrics.jsonl"), jsonl(path("pack2") .. "/metrics.jsonl")
    assert.are.equal(2, #ma)
    assert.are.equal(#ma, #mb)
    local worst_loss = 0
    for i = 1, #ma do
      for _, k in ipairs({ "loss", "grad_norm", "entropy" }) do
        local x, y = ma[i][k], mb[i][k]
        local d = math.abs(x - y) / math.max(math.abs(x), math.abs(y), 1e-3)
        worst_loss = math.max(worst_loss, d)
        assert.is_true(d < 1e-6, ("step %d: %s padded %.9g, packed %.9g"):format(i, k, x, y))
      end
    end
    local worst, _, l2 = compare_weights(path("pad2") .. "/checkpoints/step-2", path("pack2") .. "/checkpoints/step-2")
    print(("packing_dist_spec: 2 ranks ZeRO-2 packed vs padded: loss/grad_norm/entropy within %.3g, weights within %.3g (largest), %.3g (L2)")
      :format(worst_loss, worst, l2))
    -- the bound is on the weights' L2 norm: AdamW's first steps move every element by about the
    -- learning rate whatever its gradient's size, so an element whose gradient is summation noise
    -- (1e-9) may move either way; the largest per-element difference is printed, not bounded
    assert.is_true(l2 < 1e-6, ("weights differ by %.3g of their norm"):format(l2))
    -- packed on 2 ranks of one micro-batch each (rows balanced over the 2 slots of the global
    -- batch) against one process with the same 2 micro-batch slots: the same packs, their
    -- gradients added in the same order (as dist_spec's padded runs are)
    local c1, cw = jsonl(path("pack1") .. "/completions.jsonl"), jsonl(path("packw") .. "/completions.jsonl")
    assert.are.equal(#c1, #cw)
    for i = 1, #c1 do assert.are.equal(c1[i].completion, cw[i].completion) end
    local w1, bits = compare_weights(path("pack1") .. "/checkpoints/step-2", path("packw") .. "/checkpoints/step-2")
    print(("packing_dist_spec: packed 2 ranks vs 1 process: %s (largest %.3g)"):format(bits and "bit-identical" or "differ", w1))
    assert.is_true(bits, ("packed on 2 ranks and in one process differ by %.3g"):format(w1))
  end)
end)
