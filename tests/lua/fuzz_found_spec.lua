-- Regression tests for what the Lua-side fuzz targets (tests/fuzz/fuzz_config.c, fuzz_data.c)
-- found; docs/reliability.md lists the findings.
local model = require("remax.model")
local cjson = require("cjson")

local function err_of(f, ...)
  local ok, err = pcall(f, ...)
  assert.is_false(ok, "expected an error")
  return tostring(err)
end

local BASE = '{"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 4, "vocab_size": 16%s}'

describe("config.json resolution (fuzz_config)", function()
  it("refuses sizes that are not whole numbers in 1..2^31-1, naming the file and key", function()
    -- cjson reads NaN, Infinity and hex; a fraction was truncated, a huge value wrapped to int64
    for _, bad in ipairs({ '"hidden_size": 32.5', '"hidden_size": NaN', '"hidden_size": Infinity',
      '"num_hidden_layers": 1e300', '"head_dim": 0', '"num_key_value_heads": -2', '"vocab_size": 4294967296' }) do
      local key = bad:match('"([%w_]+)"')
      local cfg = cjson.decode(BASE:format(""))
      for k, v in pairs(cjson.decode("{" .. bad .. "}")) do cfg[k] = v end
      local msg = err_of(model.resolve_config, cfg, "dir/config.json")
      assert.matches("dir/config.json: key '" .. key .. "'", msg, 1, true)
      assert.matches("whole number", msg, 1, true)
    end
  end)

  it("refuses an architectures value that is not a list (it was indexed as one)", function()
    local msg = err_of(model.resolve_config, cjson.decode(BASE:format(', "architectures": 7')), "c.json")
    assert.matches("c.json: key 'architectures' is a number, expected a list of names", msg, 1, true)
  end)

  it("refuses non-positive rms_norm_eps and rope_theta", function()
    local msg = err_of(model.resolve_config, cjson.decode(BASE:format(', "rope_theta": -1')), "c.json")
    assert.matches("c.json: key 'rope_theta' is -1, expected a positive number", msg, 1, true)
  end)

  it("refuses a config of 10^12 parameters before allocating, saying what it needs", function()
    local cfg = cjson.decode('{"hidden_size": 1000000, "intermediate_size": 1000000, "num_hidden_layers": 1000,'
      .. ' "num_attention_heads": 8, "vocab_size": 1000000}')
    local msg = err_of(model.new, cfg)
    assert.matches("parameters in", msg, 1, true)
    assert.matches("more than this machine's", msg, 1, true)
  end)
end)
