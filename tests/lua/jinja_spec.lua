-- jinja_spec.lua: remax.text.jinja against the reference (tests/lua/jinja_ref.py): constructs one
-- by one against jinja2 set up as transformers sets it up; then the real chat templates of
-- Qwen2.5, Qwen3, Llama 3.1/3.2 (llama.cpp's models/templates), SmolLM2 and Gemma 2 (no tools
-- section) through remax.chat against transformers' own apply_chat_template, over a corpus of
-- conversations, with tools (Lua tables and Python functions), assistant tool calls (structured and
-- as text), tool results, the generation prompt and Qwen3's enable_thinking: the text character
-- for character, and its token ids on the tokenizers of tests/lua/tokenizer_ref.py.
local jinja = require("remax.text.jinja")
local support = require("support")
local cjson = require("cjson")
local read = support.read

local REF = "tests/lua/jinja_ref.py"

-- JSON: plain Lua tables with their keys sorted, template dicts (jinja.dict, jinja.from_json) in
-- their own order.
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
  local items = jinja.items(v)
  if items then
    local parts = {}
    for i, e in ipairs(items) do parts[i] = json(e[1]) .. ":" .. json(e[2]) end
    return "{" .. table.concat(parts, ",") .. "}"
  end
  if getmetatable(v) and v.n then   -- a template list
    local parts = {}
    for i = 1, v.n do parts[i] = json(v[i]) end
    return "[" .. table.concat(parts, ",") .. "]"
  end
  if #v > 0 or next(v) == nil then
    local parts = {}
    for i, x in ipairs(v) do parts[i] = json(x) end
    return "[" .. table.concat(parts, ",") .. "]"
  end
  local ks = {}
  for k in pairs(v) do ks[#ks + 1] = k end
  table.sort(ks)
  local parts = {}
  for i, k in ipairs(ks) do parts[i] = json(k) .. ":" .. json(v[k]) end
  return "{" .. table.concat(parts, ",") .. "}"
end

-- The reference's answers to a list of case JSON texts (one Python process).
local function reference(case_texts, tools_py)
  local path = support.tmpfile()
  support.write(path, "[" .. table.concat(case_texts, ",") .. "]")
  local res = cjson.decode(tools_py and support.run_reference(REF, path, tools_py) or support.run_reference(REF, path))
  assert(#res == #case_texts, "the reference answered " .. #res .. " of " .. #case_texts .. " cases")
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

-- Every construct case renders as jinja2 renders it, or both fail.
local function compare(cases)
  if not support.reference("jinja2") then return end
  local texts = {}
  for i, c in ipairs(cases) do
    texts[i] = '{"template":' .. json(c.template) .. ',"vars":' .. (next(c.vars) and json(c.vars) or "{}") .. "}"
  end
  local want = reference(texts)
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
    -- an assistant turn's reasoning under each of its names (Qwen3 renders the last turn's)
    { { role = "user", content = "Q1" }, { role = "assistant", content = "A1", reasoning_content = "r1" } },
    { { role = "user", content = "Q2" }, { role = "assistant", content = "A2", reasoning = "r2" } },
    { { role = "user", content = "Q3" }, { role = "assistant", content = "A3", thinking = "r3" } },
    { sys, { role = "user", content = "Q" }, { role = "user", content = "<tool_response>\nok\n</tool_response>" } },
    { { role = "user", content = "multi\nline\n\ncontent\n" }, { role = "assistant", content = "  padded  " },
      { role = "user", content = "tail" } },
  }
end


-- Tools as a recipe gives them (Lua tables) and, beside each, the same schema as a Python user
-- writes it for transformers, keys in get_json_schema's order (remax writes a Lua table's keys in
-- that order, its parameters by name).
local LUA_TOOLS = {
  calculator = { description = "Evaluate an arithmetic expression.", fn = function() end,
    parameters = { type = "object", required = { "expression" },
      properties = { expression = { type = "string", description = "The expression, e.g. \"6*7\"" },
        precision = { type = "integer", description = "Digits after the point", enum = { 0, 2, 4 } } } },
    ["return"] = { type = "number", description = "The value" } },
  now = { description = "The current time.", fn = function() end },
  search = { description = "Search the notes\nfor words.", fn = function() end,
    parameters = { type = "object", required = { "query", "tags" },
      properties = { query = { type = "string", description = "Words to look for" },
        tags = { type = "array", items = { type = "string" }, description = "Tags every hit carries" },
        limit = { type = "integer", nullable = true, description = "At most this many hits" } } } },
}
local LUA_TOOLS_JSON = {   -- by name, as tools.schemas lists them
  [[{"type": "function", "function": {"name": "calculator", "description": "Evaluate an arithmetic expression.",
    "parameters": {"type": "object", "properties": {
      "expression": {"type": "string", "description": "The expression, e.g. \"6*7\""},
      "precision": {"type": "integer", "enum": [0, 2, 4], "description": "Digits after the point"}},
    "required": ["expression"]}, "return": {"type": "number", "description": "The value"}}}]],
  [[{"type": "function", "function": {"name": "now", "description": "The current time.",
    "parameters": {"type": "object", "properties": {}}}}]],
  [[{"type": "function", "function": {"name": "search", "description": "Search the notes\nfor words.",
    "parameters": {"type": "object", "properties": {
      "limit": {"type": "integer", "nullable": true, "description": "At most this many hits"},
      "query": {"type": "string", "description": "Words to look for"},
      "tags": {"type": "array", "items": {"type": "string"}, "description": "Tags every hit carries"}},
    "required": ["query", "tags"]}}}]],
}

-- The same kind of tools as Python functions (TRL's way): remax reads their schemas through its
-- py: worker, transformers through get_json_schema. Parameters out of alphabetical order, a
-- return, choices, Optional, a Literal, a tool without parameters.
local TOOLS_PY = [=[
from typing import Literal, Optional


def get_weather(city: str, unit: Literal["celsius", "fahrenheit"] = "celsius") -> str:
    """Get the current weather in a city.

    Uses the nearest station.

    Args:
        city: The city's name, e.g. "Paris"
        unit: The temperature unit

    Returns:
        The weather, as text
    """
    return "22 C"


def calculator(expression: str, precision: Optional[int] = None) -> float:
    """Evaluate an arithmetic expression.

    Args:
        expression: The expression, e.g. "2 * (3 + 4)",
            on one or more lines
        precision (int): Digits after the point (choices: [0, 2, 4])
    """
    return 42.0


def now() -> str:
    """The current time."""
    return "noon"


def search(query: str, tags: list[str], limit: int = 5):
    """Search the notes.

    Args:
        query: Words to look for
        tags: Tags every hit must carry
        limit: At most this many hits
    """
    return []
]=]
local PY_TOOLS = { "calculator", "get_weather", "now", "search" }   -- by name, as tools.schemas lists them

-- Conversations with tool use: structured calls (arguments as a dict, in a chosen order, and as a
-- JSON string), a call written as text, tool results, two calls in one turn, no user message.
local function tool_corpus()
  local sys = { role = "system", content = "You can call tools." }
  local user = { role = "user", content = "Weather in Paris, and 6*7?" }
  local function call(name, args) return { type = "function", ["function"] = { name = name, arguments = args } } end
  local weather = call("get_weather", jinja.dict({ { "city", "Paris" }, { "unit", "celsius" } }))
  local search = call("search", jinja.dict({ { "query", "rain" }, { "tags", { "fr", "eu" } }, { "limit", 2 } }))
  local calc = call("calculator", '{"expression": "6*7"}')
  return {
    { user },
    { sys, user },
    { sys, user, { role = "assistant", content = "", tool_calls = { weather } },
      { role = "tool", content = "22 C, sunny", name = "get_weather" } },
    { user, { role = "assistant", content = "Let me search.", tool_calls = { search } },
      { role = "tool", content = "[]", name = "search" }, { role = "assistant", content = "Nothing found." },
      { role = "user", content = "And 6*7?" }, { role = "assistant", content = "", tool_calls = { calc } },
      { role = "tool", content = "42", name = "calculator" } },
    { user, { role = "assistant", content = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "6*7"}}\n</tool_call>' },
      { role = "tool", content = "42" }, { role = "assistant", content = "It is 42." } },
    { user, { role = "assistant", content = "", tool_calls = { weather, calc } },
      { role = "tool", content = "22 C" }, { role = "tool", content = "42" } },
    { sys },
  }
end

-- The real templates: llama.cpp's copies where it has them, else the committed fixture; the
-- tokenizer (tests/lua/tokenizer_ref.py) whose ids are compared.
local REAL = {
  { name = "qwen2.5", llama_cpp = "Qwen-Qwen2.5-7B-Instruct.jinja", tok = "qwen2" },
  { name = "qwen3", llama_cpp = "Qwen-Qwen3-0.6B.jinja", tok = "qwen2", thinking = true },
  { name = "llama3.1", llama_cpp = "meta-llama-Llama-3.1-8B-Instruct.jinja", tok = "llama3" },
  { name = "llama3.2", llama_cpp = "meta-llama-Llama-3.2-3B-Instruct.jinja", tok = "llama3" },
  { name = "smollm2", fixture = "tests/fixtures/chat_templates/smollm2.jinja", tok = "qwen2" },   -- no tools section
  { name = "gemma2", llama_cpp = "google-gemma-2-2b-it.jinja", tok = "qwen2" },   -- no tools section, no system role
}

describe("real chat templates match transformers' apply_chat_template", function()
  -- Every case, rendered once by each side: built on the first test that needs it.
  local run
  local function results()
    if run then return run end
    if not support.reference("transformers", "tokenizers", "jinja2") then return nil end
    local files = {}
    for _, r in ipairs(REAL) do
      files[r.name] = r.fixture or support.llama_cpp_file("models/templates/" .. r.llama_cpp)
      if not files[r.name] then return nil end
    end
    local remax = require("remax")
    local tools = require("remax.step.tools")
    local chat = remax.chat
    local folders = cjson.decode(support.run_reference("tests/lua/tokenizer_ref.py", "prepare"))
    local toks = { qwen2 = remax.tokenizer.load(folders.qwen2), llama3 = remax.tokenizer.load(folders.llama3) }
    local dir = support.tmpdir()
    support.write(dir .. "/chat_tools.py", TOOLS_PY)
    local py_list = {}
    for i, f in ipairs(PY_TOOLS) do py_list[i] = "py:" .. dir .. "/chat_tools.py:" .. f end
    local py_tools, registry = tools.check(py_list)
    local toolsets = {
      { name = "none" },
      { name = "Lua tables", schemas = tools.schemas(tools.check(LUA_TOOLS)), json = "[" .. table.concat(LUA_TOOLS_JSON, ",") .. "]" },
      { name = "Python functions", schemas = tools.schemas(py_tools) },
    }
    registry:close()
    local py_json = {}
    for i, f in ipairs(PY_TOOLS) do py_json[i] = '{"py":"' .. f .. '"}' end
    toolsets[3].json = "[" .. table.concat(py_json, ",") .. "]"

    local cases, texts = {}, {}
    local function add(r, messages, what, toolset)
      local thinking = r.thinking and { "unset", true, false } or { "unset" }
      for _, gen in ipairs({ true, false }) do
        for _, think in ipairs(thinking) do
          local c = { template = r, messages = messages, gen = gen, think = think, toolset = toolset,
            name = ("%s, %s, tools: %s, add_generation_prompt=%s, enable_thinking=%s"):format(r.name, what, toolset.name,
              tostring(gen), tostring(think)) }
          cases[#cases + 1] = c
          texts[#texts + 1] = ('{"chat":{"tokenizer":"%s","template":%s,"messages":%s,"tools":%s,"add_generation_prompt":%s,"kwargs":%s}}')
            :format(r.tok, json(r.source), json(messages), toolset.json or "null", tostring(gen),
              think == "unset" and "{}" or ('{"enable_thinking":' .. tostring(think) .. "}"))
        end
      end
    end
    for _, r in ipairs(REAL) do
      r.source = read(files[r.name])
      r.proxy = { chat_template = r.source, special_tokens = toks[r.tok].special_tokens, path = files[r.name] }
      for ci, messages in ipairs(corpus()) do add(r, messages, "conversation " .. ci, toolsets[1]) end
      for ci, messages in ipairs(tool_corpus()) do
        for _, ts in ipairs(toolsets) do add(r, messages, "tool conversation " .. ci, ts) end
      end
    end
    local want = reference(texts, dir .. "/chat_tools.py")
    for i, c in ipairs(cases) do
      local tok = toks[c.template.tok]
      local opts = { tokenizer = c.template.proxy, add_generation_prompt = c.gen,
        template_args = c.toolset.schemas and { tools = c.toolset.schemas } or nil }
      if c.think ~= "unset" then opts.enable_thinking = c.think end
      local ok, text = pcall(chat.render, c.messages, opts)
      c.want, c.got = want[i], ok and { text = text } or { error = text }
      if ok then c.got.ids = chat.encode(tok, c.messages, opts) end
    end
    run = cases
    return run
  end

  it("render every conversation as transformers does, character for character, or both fail", function()
    local cases = results(); if not cases then return end
    local failed, per = 0, {}
    for _, c in ipairs(cases) do
      local n = c.template.name
      per[n] = per[n] or { cases = 0, tools = 0, failures = 0 }
      per[n].cases = per[n].cases + 1
      if c.want.error then
        -- only the template's own raise_exception (roles that do not alternate, several tool calls...)
        assert.matches("^TemplateError", c.want.error, 1, false, c.name)
        assert(c.got.error, ("%s: transformers fails (%s) but remax rendered %s"):format(c.name, c.want.error, show(c.got.text or "")))
        assert.matches("raise_exception: ", c.got.error, 1, true)
        failed, per[n].failures = failed + 1, per[n].failures + 1
      else
        assert(c.got.text, ("%s: remax failed: %s"):format(c.name, tostring(c.got.error)))
        if c.got.text ~= c.want.text then
          error(("%s:\n  remax:        %s\n  transformers: %s"):format(c.name, show(c.got.text), show(c.want.text)), 0)
        end
        if c.toolset.schemas and c.want.text:find('"name": "now"', 1, true) then per[n].tools = per[n].tools + 1 end
      end
    end
    assert.is_true(#cases > 400 and failed < #cases / 4, ("%d cases, %d fail on both sides"):format(#cases, failed))
    -- the templates with a tools section wrote the tools' JSON; the others ran without
    for _, n in ipairs({ "qwen2.5", "qwen3", "llama3.1", "llama3.2" }) do assert.is_true(per[n].tools > 10, n) end
    for _, n in ipairs({ "smollm2", "gemma2" }) do assert.are.equal(0, per[n].tools, n) end
    assert.is_true(per.gemma2.failures > 0 and per["llama3.1"].failures > 0)
  end)

  it("encode those renderings to transformers' ids (the tokenizers of tokenizer_ref.py, no special tokens added)", function()
    local cases = results(); if not cases then return end
    local n = 0
    for _, c in ipairs(cases) do
      if c.want.ids and c.got.ids then
        assert.are.same(c.want.ids, c.got.ids, c.name)
        n = n + 1
      end
    end
    assert.is_true(n > 300)
  end)

  it("takes the committed fixtures that other specs use from llama.cpp's copies of the same templates", function()
    local fixtures = { ["qwen2.5"] = "Qwen-Qwen2.5-7B-Instruct.jinja", qwen3 = "Qwen-Qwen3-0.6B.jinja",
      ["llama3.1"] = "meta-llama-Llama-3.1-8B-Instruct.jinja", ["llama3.2"] = "meta-llama-Llama-3.2-3B-Instruct.jinja" }
    for name, file in pairs(fixtures) do
      local path = support.llama_cpp_file("models/templates/" .. file); if not path then return end
      assert.are.equal(read(path), read("tests/fixtures/chat_templates/" .. name .. ".jinja"), name)
    end
  end)

  it("renders the chat template transformers saved from a GGUF through remax.chat as transformers does", function()
    if not support.reference("transformers", "tokenizers") then return end
    local remax = require("remax")
    local folders = cjson.decode(support.run_reference("tests/lua/tokenizer_ref.py", "prepare"))
    local tok = remax.tokenizer.load(folders.qwen2)   -- qwen2's GGUF carries a template; llama-bpe's none
    assert.are.equal(read(folders.qwen2 .. "/chat_template.jinja"), tok.chat_template)
    local texts, convs = {}, corpus()
    for ci, messages in ipairs(convs) do
      texts[ci] = ('{"chat":{"tokenizer":"qwen2","template":%s,"messages":%s,"add_generation_prompt":true}}')
        :format(json(tok.chat_template), json(messages))
    end
    local want = reference(texts)
    for ci, messages in ipairs(convs) do
      assert(want[ci].text, "transformers failed: " .. tostring(want[ci].error))
      assert.are.equal(want[ci].text, remax.chat.render(messages, { tokenizer = tok }), "conversation " .. ci)
      assert.are.same(want[ci].ids, (remax.chat.encode(tok, messages)), "conversation " .. ci)
    end
  end)
end)
