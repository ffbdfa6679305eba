-- The engine's per-phase timer (engine/core/profile.c): what bench/train_step.lua --profile and
-- REMAX_PROFILE=1 read. Off it counts nothing; on, every phase of a training step shows up, nested
-- phases are not counted twice, and the phases never add up to more than the step's wall time.
local remax = require("remax")
local ffi = require("ffi")
local C = require("remax.bind.ffi").C
local now = require("remax.bind.clock").now

local cfg = {
  architectures = { "Qwen2ForCausalLM" }, vocab_size = 40, hidden_size = 16, intermediate_size = 24,
  num_hidden_layers = 2, num_attention_heads = 4, num_key_value_heads = 2, rms_norm_eps = 1e-6,
  rope_theta = 10000, tie_word_embeddings = false, max_position_embeddings = 128,
}
local rows = { { 1, 5, 9, 13, 2 }, { 7, 3 }, { 30, 31, 32, 33, 34, 35 } }

local function read()
  local out, secs, calls = {}, ffi.new("double[1]"), ffi.new("int64_t[1]")
  for i = 0, C.rx_profile_phases() - 1 do
    local name = ffi.string(C.rx_profile_read(i, secs, calls))
    out[name] = { seconds = secs[0], calls = tonumber(calls[0]) }
  end
  return out
end

local function step(m, opt)
  m:zero_grad()
  local lp = m:logprobs(rows, nil, { train = true })
  local d = {}
  for b, row in ipairs(lp:totable()) do
    d[b] = {}
    for t, v in ipairs(row) do d[b][t] = v ~= 0 and -1 or 0 end
  end
  m:backward(d)
  opt:step()
end

describe("profile", function()
  local was
  before_each(function() was = C.rx_profile_enabled() end)
  after_each(function() C.rx_profile_enable(was); C.rx_profile_reset() end)

  it("counts nothing while off", function()
    C.rx_profile_enable(0)
    C.rx_profile_reset()
    local m = remax.model.new(cfg, { seed = 1 })
    step(m, remax.optim.adamw(m, { lr = 1e-3 }))
    for name, p in pairs(read()) do
      assert.are.equal(0, p.calls, name)
      assert.are.equal(0, p.seconds, name)
    end
  end)

  it("times every phase of a training step, within the step's wall time", function()
    local m = remax.model.new(cfg, { seed = 1 })
    local opt = remax.optim.adamw(m, { lr = 1e-3 })
    step(m, opt)   -- plans the activations
    C.rx_profile_enable(1)
    C.rx_profile_reset()
    local t0 = now()
    step(m, opt)
    local wall = now() - t0
    C.rx_profile_enable(0)
    local p, total = read(), 0
    local L, n_params = cfg.num_hidden_layers, #m.names
    -- 7 projections a layer; norms: 2 a layer and the final one; AdamW: two calls over the flat
    -- buffer (the matrices with weight decay, then the norms and biases without), however many
    -- tensors
    assert.are.equal(7 * L, p["linear forward (GEMM)"].calls)
    assert.are.equal(7 * L, p["linear backward (GEMM)"].calls)
    assert.are.equal(2 * L + 1, p["rmsnorm forward"].calls)
    assert.are.equal(2 * L + 1, p["rmsnorm backward"].calls)
    assert.are.equal(L, p["attention forward"].calls)
    assert.are.equal(L, p["attention backward"].calls)
    assert.is_true(n_params > 2)
    assert.are.equal(2, p["adamw"].calls)
    assert.are.equal(1, p["zero_grad"].calls)
    assert.are.equal(2, p["embedding"].calls)
    -- logits once in the forward and recomputed in the backward (one chunk here)
    assert.are.equal(2, p["head logits (GEMM)"].calls)
    assert.are.equal(1, p["head log-softmax forward"].calls)
    for name, v in pairs(p) do
      assert.is_true(v.seconds >= 0, name)
      if v.calls > 0 then assert.is_true(v.seconds > 0, name) end
      total = total + v.seconds
    end
    assert.is_true(total <= wall, ("phases add up to %g s, more than the step's %g s"):format(total, wall))
    -- the timer stays off once disabled
    C.rx_profile_reset()
    step(m, opt)
    assert.are.equal(0, read()["adamw"].calls)
  end)
end)
