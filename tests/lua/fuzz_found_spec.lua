-- Regression tests for what the Lua-side fuzz targets (tests/fuzz/fuzz_config.c, fuzz_data.c,
-- fuzz_jinja.c) found; docs/reliability.md lists the findings.
local model = require("remax.bind.model")
local cjson = require("cjson")

local err_of = require("support").error_of

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

-- What fuzz_jinja (and writing it) found in remax.text.jinja: templates a user hands remax that hung
-- the run, exhausted memory, overflowed the Lua stack, or raised Lua errors from inside the
-- interpreter. Each is now an error naming the template, its line and the limit.
describe("chat templates (fuzz_jinja)", function()
  local jinja = require("remax.text.jinja")
  local chat = require("remax.text.chat")

  local function render_err(src, vars)
    local ok, err = pcall(function() return jinja.compile(src, "t.jinja"):render(vars or {}) end)
    assert.is_false(ok, "expected an error for " .. src:sub(1, 80))
    return tostring(err)
  end

  it("stops runaway loops, huge strings and huge ranges at the limits, quickly", function()
    local cases = {
      { "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", "takes over 1000000 steps" },
      { "{{ range(10**9)|length }}", "range: over 100000 items" },
      { "{{ 'a' * 10**12 }}", "a string of 1000000000000 bytes is over the limit" },
      { "{% set ns = namespace(s='ab') %}{% for i in range(60) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}", "is over the limit of 16777216" },
      { "{% set ns = namespace(s=[1]) %}{% for i in range(60) %}{% set ns.s = ns.s + ns.s %}{% endfor %}", "steps" },
      { "{{ range(100000)|unique|length }}", "steps" },
      { "{{ [1]|batch(10**12, 0)|length }}", "steps" },
      { "{{ [1, 2]|batch(0) }}", "batch: the size must be a positive integer" },
      { "{% for i in range(100000) %}{{ 'x' * 1000000 }}{% endfor %}", "the rendering writes over 16777216 bytes" },
      { "{{ ('x' * 1000)|replace('', 'y' * 100000) }}", "over the limit" },
      { "{{ 'a\\nb'|indent(10**10) }}", "over the limit" },
      { "{{ [[1]]|tojson(indent=10**9) }}", "over the limit" },
    }
    for _, c in ipairs(cases) do
      local t0 = os.clock()
      local msg = render_err(c[1])
      assert.matches("^t%.jinja line 1: ", msg)
      assert.matches(c[2], msg, 1, true)
      assert.is_true(os.clock() - t0 < 20, c[1] .. " took " .. (os.clock() - t0) .. " s")
    end
  end)

  it("refuses nesting past limits.depth instead of overflowing the Lua stack", function()
    for _, c in ipairs({
      { "{{ " .. ("("):rep(5000) .. "1" .. (")"):rep(5000) .. " }}", "expressions nested over" },
      { "{{ " .. ("-"):rep(5000) .. "1 }}", "expressions nested over" },
      { "{{ " .. ("not "):rep(5000) .. "1 }}", "expressions nested over" },
      { "{{ 1" .. ("+1"):rep(20000) .. " }}", "expressions nested over" },
      { "{{ x" .. (".a"):rep(20000) .. " }}", "expressions nested over" },
      { "{{ x" .. ("|string"):rep(20000) .. " }}", "expressions nested over" },
      { ("{% if 1 %}"):rep(3000) .. ("{% endif %}"):rep(3000), "statements nested over" },
      { "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "macro calls nested over" },
      { "{% macro f() %}{% call f() %}x{% endcall %}{% endmacro %}{{ f() }}", "macro calls nested over" },
      { "{% set ns = namespace(l=[]) %}{% for i in range(5000) %}{% set ns.l = [ns.l] %}{% endfor %}{{ ns.l|tojson }}", "tojson: a value nested over" },
      { "{% set ns = namespace(l=[]) %}{% for i in range(5000) %}{% set ns.l = [ns.l] %}{% endfor %}{{ ns.l == ns.l }}", "a value nested over" },
      { "{% set ns = namespace(l=[]) %}{% for i in range(5000) %}{% set ns.l = [ns.l] %}{% endfor %}{{ ns.l }}", "a value nested over" },
    }) do
      local msg = render_err(c[1])
      assert.matches("^t%.jinja line %d+: ", msg)
      assert.matches(c[2] .. " 100 deep (remax.text.jinja.limits.depth)", msg, 1, true)
    end
    local cyclic = {}
    cyclic.self = cyclic
    assert.matches("a value nested over 100 deep", render_err("{{ x }}", { x = cyclic }), 1, true)
  end)

  it("reports a built-in given arguments it cannot take as the template's error, not a Lua one", function()
    -- was: "lua/remax/text/jinja.lua:1719: attempt to perform arithmetic on a nil value"
    assert.are.equal("t.jinja line 1: test 'divisibleby' cannot take (int, undefined)", render_err("{{ 4 is divisibleby string }}"))
    assert.are.equal("t.jinja line 2: method 'count' of str cannot take ()", render_err("\n{{ 'abc'.count() }}"))
    assert.matches("range: expected integers, got a str", render_err("{{ range('a') }}"), 1, true)
  end)

  it("refuses an empty subscript at compile time, naming the template and line", function()
    -- was: "c.jinja: internal error: lua/remax/text/jinja.lua:1280: attempt to index local 'e' (a nil value)"
    -- at render time: `x[]` parsed as a subscript without a key (a CI run of fuzz_jinja, 45 s)
    for _, src in ipairs({ "{{ a[] }}", "\n{{ W[]|sort(reverse=true)|list }}" }) do
      local ok, err = pcall(jinja.compile, src, "t.jinja")
      assert.is_false(ok)
      assert.matches("^t%.jinja line %d: expected an expression inside '%[%]'", err)
    end
    assert.are.equal("[2, 3]", jinja.compile("{{ a[1:] }}"):render({ a = { 1, 2, 3 } }))   -- slices still parse
  end)

  it("names the template without a Lua position when the error comes through remax.chat", function()
    -- was: "lua/remax/text/chat.lua:175: chat_template.jinja line 1: subscript of an undefined value"
    local tok = { chat_template = "{{ nope[0] }}", chat_template_path = "dir/chat_template.jinja" }
    local ok, err = pcall(chat.render, { { role = "user", content = "hi" } }, { tokenizer = tok })
    assert.is_false(ok)
    assert.are.equal("dir/chat_template.jinja line 1: subscript of an undefined value", err)
  end)
end)
