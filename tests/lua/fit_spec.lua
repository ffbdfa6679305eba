-- remax.step.fit: the activation bytes of a forward, counted in Lua before the engine allocates them,
-- equal the engine's own count after real forwards (so a change to engine/model/model.c's
-- plan shows up here); a micro-batch that cannot fit is refused, saying how many rows would.
local remax = require("remax")
local fit = require("remax.step.fit")

local function config(extra)
  local c = { architectures = { "Qwen2ForCausalLM" }, hidden_size = 48, intermediate_size = 80, num_hidden_layers = 2,
    num_attention_heads = 6, num_key_value_heads = 2, vocab_size = 300, max_position_embeddings = 128,
    rope_theta = 10000, rms_norm_eps = 1e-6, tie_word_embeddings = true }
  for k, v in pairs(extra or {}) do c[k] = v end
  return c
end

local function rows(B, T)
  local out = {}
  for b = 1, B do
    out[b] = {}
    for t = 1, T do out[b][t] = (b * 7 + t * 3) % 300 end
  end
  return out
end

describe("remax.step.fit", function()
  it("counts the activation plan and head chunk as the engine does", function()
    for _, case in ipairs({
      { config(), 3, 17, { train = true } },
      { config(), 2, 9, { train = true, checkpoint = true } },
      { config(), 5, 11, {} },
      { config({ architectures = { "Qwen3ForCausalLM" }, head_dim = 16 }), 2, 13, { train = true } },
      { config({ vocab_size = 70000, hidden_size = 16, intermediate_size = 24, num_attention_heads = 2 }), 4, 50, { train = true } },
    }) do
      local cfg, B, T, opts = case[1], case[2], case[3], case[4]
      local m = remax.model.new(cfg, { seed = 1 })
      m:logprobs(rows(B, T), nil, { train = opts.train, checkpoint = opts.checkpoint })
      local acts, head = fit.activation_bytes(m:cfg(), B, T, opts)
      local mem = m:memory()
      assert.are.equal(mem.activations, acts, ("activations of %s B=%d T=%d"):format(cfg.architectures[1], B, T))
      assert.are.equal(mem.head, head)
    end
  end)

  it("refuses a micro-batch that cannot fit, with the rows that would and gradient checkpointing", function()
    local m = remax.model.new(config(), { seed = 1 })
    local c = m:cfg()
    local one, h1 = fit.activation_bytes(c, 1, 64, { train = true })
    local grads = 0   -- check_train counts the activations alone
    local ten, h10 = fit.activation_bytes(c, 10, 64, { train = true })
    -- room for 3 rows of 64 tokens and not 4, nothing held yet
    local three, h3 = fit.activation_bytes(c, 3, 64, { train = true })
    local four, h4 = fit.activation_bytes(c, 4, 64, { train = true })
    local avail = math.floor((three + h3 + four + h4) / 2) + grads
    assert.is_true(ten + h10 + grads > avail and one + h1 < avail)
    local ok, msg = pcall(fit.check_train, m, 10, 64, { available = avail, what = "step 3" })
    assert.is_false(ok)
    assert.matches("^step 3: a training micro%-batch of 10 rows x 64 tokens needs", msg)
    assert.matches("3 rows of 64 tokens would fit", msg, 1, true)
    -- enough room: nothing said
    fit.check_train(m, 3, 64, { available = avail })
    -- refused before allocating: the model's plan is still empty
    assert.are.equal(0, m:memory().activations)
    local ck, hk = fit.activation_bytes(c, 10, 64, { train = true, checkpoint = true })
    if ck + hk + grads <= avail then assert.matches("gradient_checkpointing = true fits it", msg, 1, true) end
  end)
end)
