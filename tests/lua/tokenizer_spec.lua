-- tokenizer_spec.lua: remax's byte-level BPE against Hugging Face `tokenizers` itself
-- (tests/lua/tokenizer_ref.py) on real vocabularies: Qwen2/Qwen2.5/Qwen3's, Qwen3.5's split and
-- Llama 3's, from llama.cpp's vocab-only GGUFs through transformers' GGUF tokenizer loading into
-- .cache/tokenizers; llama.cpp's own test vectors for both; then the Lua API and the byte-level
-- tokenizer of the tiny models.
local remax = require("remax")
local support = require("support")
local cjson = require("cjson")
local T = remax.tokenizer

local REF = "tests/lua/tokenizer_ref.py"
-- reference name -> llama.cpp's vocabulary file
local VOCABS = { { "qwen2", "qwen2" }, { "qwen35", "qwen35" }, { "llama3", "llama-bpe" } }
local FIXTURE = "tests/fixtures/byte_tokenizer"

local function json_string(s)
  return '"' .. s:gsub('[%c"\\]', function(c)
    return ({ ['"'] = '\\"', ["\\"] = "\\\\", ["\n"] = "\\n", ["\r"] = "\\r", ["\t"] = "\\t" })[c]
      or string.format("\\u%04x", c:byte())
  end) .. '"'
end

local function json_strings(list)
  local parts = {}
  for i, s in ipairs(list) do parts[i] = json_string(s) end
  return "[" .. table.concat(parts, ",") .. "]"
end

local function utf8_char(cp)
  if cp < 0x80 then return string.char(cp) end
  if cp < 0x800 then return string.char(0xC0 + math.floor(cp / 64), 0x80 + cp % 64) end
  if cp < 0x10000 then
    return string.char(0xE0 + math.floor(cp / 4096), 0x80 + math.floor(cp / 64) % 64, 0x80 + cp % 64)
  end
  return string.char(0xF0 + math.floor(cp / 262144), 0x80 + math.floor(cp / 4096) % 64,
    0x80 + math.floor(cp / 64) % 64, 0x80 + cp % 64)
end

-- A deterministic generator (LCG) of mixed lines: prose, code, numbers, scripts, emoji, marks.
local function generated_lines(n)
  local state = 12345
  local function rnd(k)
    state = (state * 1103515245 + 12345) % 2147483648
    return state % k + 1
  end
  local pools = {
    { "the", "The", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "reinforcement", "learning",
      "gradient", "it's", "don't", "WE'LL", "they're", "I'd", "you've", "I'M", "O'Neil", "x's" },
    { "0", "7", "42", "1234", "3.14159", "1,000,000", "2024-06-01", "12345678901234567890", "0x1F", "-17" },
    { "def", "return", "{", "}", "(x)", "==", "!=", "->", "//", "/*", "*/", "\t", "    ", "foo_bar", "a[i]+=1;" },
    { "你好", "世界", "機械学習", "こんにちは", "한국어", "강화", "مرحبا", "بالعالم", "Привет", "мир", "Γειά", "שלום" },
    { "👍", "👍🏽", "👨‍👩‍👧‍👦", "🇫🇷", "🇯🇵", "❤️", "🧑🏿‍💻", "😀😃😄", "✅", "🏳️‍🌈" },
    { "café", "cafe\204\129", "naïve", "nai\204\136ve", "Å", "A\204\138", "ệ", "e\204\163\204\130",
      "e\204\130\204\163", "한\225\132\146", "\225\132\146\225\133\161\225\134\171", "ﬁ", "Ω", "\226\132\166" },
    { " ", "  ", "   ", "\n", "\n\n", "\r\n", "\t", " \n ", "\n   \n", "...", "!!!", "?!", "—", "«»", "\"q\"" },
    { "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|begin_of_text|>", "<|eot_id|>", "<think>", "</think>",
      "<|start_header_id|>", "<|end_header_id|>" },
  }
  local lines = {}
  for i = 1, n do
    local parts = {}
    for _ = 1, rnd(14) do
      local pool = pools[rnd(#pools)]
      if pool == pools[8] and rnd(3) > 1 then pool = pools[1] end
      parts[#parts + 1] = pool[rnd(#pool)]
      if rnd(3) ~= 1 then parts[#parts + 1] = " " end
    end
    lines[i] = table.concat(parts)
  end
  return lines
end

local handpicked = {
  "Hello, world! This is a test of the tokenizer.",
  "The quick brown fox jumps over the lazy dog.",
  "it's don't they're we've I'm you'll he'd IT'S DON'T THEY'RE WE'VE I'M YOU'LL HE'D",
  "'s 't 're 've 'm 'll 'd 'S 'T 'RE",
  "1 12 123 1234 12345 123456 1234567 3.14159265358979 10,000,000 2^64 = 18446744073709551616",
  "def f(x):\n\tif x > 0:\n\t\treturn x * 2\n    return -x\n",
  "    indented\n        more\n\n\n\nblank lines   \n   trailing   ",
  "line one\r\nline two\r\n\r\n",
  "   ",
  "\n",
  "\n\n\n",
  " leading space",
  "trailing space ",
  "tab\tseparated\tvalues\t",
  "你好，世界！机器学习很有趣。",
  "日本語のテキストとカタカナ、ひらがな。",
  "한국어 텍스트입니다.",
  "مرحبا بالعالم، هذا اختبار.",
  "Привет, мир! Ελληνικά. עברית.",
  "👍👍🏻👍🏿 👨‍👩‍👧‍👦 🧑🏽‍💻 🇺🇸🇫🇷🇯🇵 ❤️‍🔥 🏳️‍🌈",
  "café naïve résumé Ångström",
  "cafe\204\129 nai\204\136ve re\204\129sume\204\129 A\204\138ngstro\204\136m",
  "e\204\163\204\130 e\204\130\204\163 \225\132\146\225\133\161\225\134\171 \226\132\171 \226\132\166",
  "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
  "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>",
  "<|endoftext|><|endoftext|>text<|endoftext|>",
  "<think>\nreasoning\n</think>\n\nanswer",
  "<|im_start|> spaced <|im_end|>",
  "<|im_start",
  "",
  "a",
  "!!!??...---***",
  "https://example.com/path?query=1&x=y#frag",
  "email@example.com",
  "x = {'a': [1, 2, 3], \"b\": None}",
  string.rep("=", 300),
  string.rep("ab", 200),
  string.rep(" ", 100) .. "x",
}

-- Short strings of code points picked from the corners: Unicode spaces, line separators, marks,
-- controls, NUL, digits of other scripts, Hangul jamo, long s (case folding of 's), private use,
-- and U+0085, U+FEFF, U+180E, on which regex engines disagree about \s (docs/tokenizer.md).
local function corner_strings(n)
  local pool = { 0x20, 0x20, 0x0A, 0x0D, 0x09, 0x0B, 0x0C, 0x27, 0x61, 0x73, 0x53, 0x74, 0x31, 0x32, 0x2E, 0x21,
    0xA0, 0x1680, 0x2003, 0x2028, 0x3000, 0x200B, 0x17F, 0x301, 0x308, 0x4E2D, 0x1F44D, 0x1F3FD, 0x200D, 0xE9,
    0x2160, 0xB2, 0x663, 0x5D0, 0x1100, 0x1161, 0x11A8, 0xAC00, 0x212B, 0x0, 0x1, 0x7F, 0xFFFD, 0x10FFFD, 0xE000,
    0x85, 0xFEFF, 0x180E }
  local state, out = 3, {}
  for i = 1, n do
    local t = {}
    for j = 1, 1 + state % 12 do
      state = (state * 1103515245 + 12345) % 2147483648
      t[j] = utf8_char(pool[math.floor(state / 65536) % #pool + 1])
    end
    out[i] = table.concat(t)
  end
  return out
end

local function all_texts()
  local texts = {}
  for _, s in ipairs(handpicked) do texts[#texts + 1] = s end
  for _, s in ipairs(generated_lines(300)) do texts[#texts + 1] = s end
  for _, s in ipairs(corner_strings(500)) do texts[#texts + 1] = s end
  return texts
end

local function first_difference(a, b)
  for i = 1, math.max(#a, #b) do
    if a[i] ~= b[i] then return i end
  end
end

local function show_ids(ids) return "[" .. table.concat(ids, ",") .. "]" end

-- The reference's answers for the whole spec file, from one Python process: per vocabulary its
-- folder (for remax to load the same tokenizer.json), the ids of every text without and with
-- special tokens, and llama.cpp's vectors with `tokenizers`' ids for them; the NFC of every text;
-- the fixture's ids. nil (the test is then pending, or failing under REMAX_REFERENCES_REQUIRED)
-- when the reference or llama.cpp's files are missing.
local answers
local function reference()
  if answers then return answers end
  if not support.reference("tokenizers", "transformers") then return nil end
  for _, v in ipairs(VOCABS) do
    for _, ext in ipairs({ "", ".inp", ".out" }) do
      if not support.llama_cpp_file("models/ggml-vocab-" .. v[2] .. ".gguf" .. ext) then return nil end
    end
  end
  local texts = all_texts()
  local fixture_texts = { "hello", "<|im_start|>user\nhé 👍<|im_end|>", "", "  \n\t" }
  local jobs = {}
  for _, v in ipairs(VOCABS) do
    jobs[#jobs + 1] = ('{"op":"encode","tokenizer":"%s","texts":%s}'):format(v[1], json_strings(texts))
    jobs[#jobs + 1] = ('{"op":"vectors","tokenizer":"%s"}'):format(v[1])
  end
  jobs[#jobs + 1] = ('{"op":"nfc","texts":%s}'):format(json_strings(texts))
  jobs[#jobs + 1] = ('{"op":"encode","tokenizer":%s,"texts":%s}'):format(json_string(FIXTURE), json_strings(fixture_texts))
  local path = support.tmpfile()
  support.write(path, "[" .. table.concat(jobs, ",") .. "]")
  local folders = cjson.decode(support.run_reference(REF, "prepare"))
  local out = cjson.decode(support.run_reference(REF, "run", path))
  local a = { texts = texts, vocab = {}, nfc = out[#out - 1].texts, fixture = { texts = fixture_texts, ids = out[#out].plain } }
  for i, v in ipairs(VOCABS) do
    a.vocab[v[1]] = { dir = folders[v[1]], ids = out[2 * i - 1], vectors = out[2 * i] }
  end
  answers = a
  return a
end

local loaded = {}
local function load_model(name)   -- loading a 150k-token file takes ~0.2 s: once per spec run
  loaded[name] = loaded[name] or T.load(answers.vocab[name].dir)
  return loaded[name]
end

describe("tokenizer vs Hugging Face tokenizers", function()
  for _, v in ipairs(VOCABS) do
    local name = v[1]
    it(name .. ": the tokenizer.json made from llama.cpp's " .. v[2] .. " vocabulary gives llama.cpp's own test vectors", function()
      local a = reference(); if not a then return end
      local vec = a.vocab[name].vectors
      assert.is_true(#vec.inputs >= 40)
      for i, s in ipairs(vec.inputs) do
        assert.are.same(vec.want[i], vec.got[i], ("%s vector %d %q: tokenizers %s, llama.cpp %s"):format(name, i, s,
          show_ids(vec.got[i]), show_ids(vec.want[i])))
      end
    end)

    it(name .. ": remax gives llama.cpp's test vectors", function()
      local a = reference(); if not a then return end
      local tok = load_model(name)
      local vec = a.vocab[name].vectors
      for i, s in ipairs(vec.inputs) do
        local got = tok:encode(s, { add_special_tokens = false })
        assert.are.same(vec.want[i], got, ("%s vector %d %q: remax %s, llama.cpp %s"):format(name, i, s, show_ids(got),
          show_ids(vec.want[i])))
      end
    end)

    it(name .. ": ids equal tokenizers' on the handpicked, generated and corner texts, with and without special tokens", function()
      local a = reference(); if not a then return end
      local tok = load_model(name)
      local ref = a.vocab[name].ids
      for _, mode in ipairs({ { false, ref.plain }, { true, ref.special } }) do
        local add, want = mode[1], mode[2]
        assert.are.equal(#a.texts, #want)
        for i, s in ipairs(a.texts) do
          local got = tok:encode(s, { add_special_tokens = add })
          local k = first_difference(got, want[i])
          if k then
            error(string.format("%s text %d %q (add_special_tokens=%s): id %d is %s, tokenizers %s\n got  %s\n want %s",
              name, i, s, tostring(add), k, tostring(got[k]), tostring(want[i][k]), show_ids(got), show_ids(want[i])))
          end
        end
      end
    end)

    it(name .. ": decode(encode(x)) gives x back (NFC-normalised where the file declares NFC)", function()
      local a = reference(); if not a then return end
      local tok = load_model(name)
      local normalizer = cjson.decode(support.read(a.vocab[name].dir .. "/tokenizer.json")).normalizer
      local nfc = type(normalizer) == "table" and normalizer.type == "NFC"
      assert.are.equal(name == "qwen2", nfc)
      for _, s in ipairs(a.texts) do
        assert.are.equal(nfc and T.nfc(s) or s, tok:decode(tok:encode(s, { add_special_tokens = false })))
      end
    end)
  end

  it("NFC equals Python's unicodedata.normalize('NFC')", function()
    local a = reference(); if not a then return end
    assert.are.equal(#a.texts, #a.nfc)
    for i, s in ipairs(a.texts) do assert.are.equal(a.nfc[i], T.nfc(s), ("text %d %q"):format(i, s)) end
  end)
end)

describe("tokenizer Lua API", function()
  -- the tokenizer_config.json transformers' save_pretrained writes from the GGUF
  local function config(name) return cjson.decode(support.read(answers.vocab[name].dir .. "/tokenizer_config.json")) end
  local function file(name) return cjson.decode(support.read(answers.vocab[name].dir .. "/tokenizer.json")) end

  it("reads the role tokens from tokenizer_config.json and the chat template from chat_template.jinja", function()
    if not reference() then return end
    local q, qc = load_model("qwen2"), config("qwen2")
    assert.are.equal(qc.eos_token, q.eos_token)
    assert.are.equal(q:token_to_id(qc.eos_token), q.eos_id)
    assert.are.equal(q:token_to_id(qc.pad_token), q.pad_id)
    assert.are.equal(q:token_to_id(qc.bos_token), q.bos_id)
    assert.are.equal(support.read(answers.vocab.qwen2.dir .. "/chat_template.jinja"), q.chat_template)
    assert.is_truthy(q.chat_template:find("<|im_start|>", 1, true))
    local l, lc = T.load(answers.vocab.llama3.dir .. "/tokenizer.json"), config("llama3")
    assert.are.equal("<|begin_of_text|>", lc.bos_token)
    assert.are.equal(l:token_to_id("<|begin_of_text|>"), l.bos_id)
    assert.are.equal(l:token_to_id("<|end_of_text|>"), l.eos_id)
    assert.are.equal(l.eos_id, l.pad_id)   -- no pad_token: pad falls back to eos
    assert.is_nil(l.chat_template)          -- the GGUF carries none
    assert.are.equal(128256, l.vocab_size)
  end)

  it("maps tokens and ids both ways and lists the special ids", function()
    if not reference() then return end
    local q = load_model("qwen2")
    local id = q:token_to_id("Ġthe")
    assert.is_number(id)
    assert.are.equal("Ġthe", q:id_to_token(id))
    assert.are.same({ id }, q:encode(" the"))
    assert.is_nil(q:token_to_id("no such token at all"))
    assert.is_nil(q:id_to_token(-1))
    assert.is_nil(q:id_to_token(q.vocab_size))
    local set = {}
    for _, s in ipairs(q:special_ids()) do set[s] = true end
    local special, plain = 0, 0
    for _, t in ipairs(file("qwen2").added_tokens) do
      assert.are.equal(t.special or nil, set[t.id], t.content)
      assert.are.equal(t.special, q:is_special(t.id), t.content)
      if t.special then special = special + 1 else plain = plain + 1 end
    end
    assert.is_true(special >= 3 and plain > 0)   -- <|im_start|> ...; added tokens that are not special
    assert.is_true(set[q:token_to_id("<|im_start|>")])
    assert.is_true(q:is_special(q.eos_id))
  end)

  it("skips special tokens on request and rejects unknown ids", function()
    if not reference() then return end
    local q = load_model("qwen2")
    local plain   -- an added token that is not special: skip_special_tokens keeps it
    for _, t in ipairs(file("qwen2").added_tokens) do if not t.special then plain = t.content break end end
    local ids = q:encode("<|im_start|>user\nhi<|im_end|>" .. plain)
    assert.are.equal(q:token_to_id(plain), ids[#ids])
    assert.are.equal("<|im_start|>user\nhi<|im_end|>" .. plain, q:decode(ids))
    assert.are.equal("user\nhi" .. plain, q:decode(ids, { skip_special_tokens = true }))
    assert.has_error(function() q:decode({ 1, q.vocab_size + 5 }) end)
  end)

  it("decodes a sequence that stops inside a UTF-8 character to the raw bytes", function()
    if not reference() then return end
    local q = load_model("qwen2")
    local s = "🧑🏽‍💻 ok"
    local ids = q:encode(s)
    local streamed, pending = {}, ""
    for i = 1, #ids do
      local piece = pending .. q:decode({ ids[i] })
      local tail = T.incomplete_utf8_tail(piece)
      streamed[#streamed + 1] = piece:sub(1, #piece - tail)
      pending = piece:sub(#piece - tail + 1)
    end
    assert.are.equal("", pending)
    assert.are.equal(s, table.concat(streamed))
    -- some tokens hold part of a character: decode gives their raw bytes, and those bytes
    -- concatenated are the text
    local raw, partial = {}, 0
    for i = 1, #ids do
      raw[i] = q:decode({ ids[i] })
      if T.incomplete_utf8_tail(raw[i]) > 0 then partial = partial + 1 end
    end
    assert.is_true(partial > 0)
    assert.are.equal(s, table.concat(raw))
    assert.are.equal(2, T.incomplete_utf8_tail("ok\226\128"))
    assert.are.equal(0, T.incomplete_utf8_tail("ok\226\128\141"))
    assert.are.equal(0, T.incomplete_utf8_tail("ok\128"))
  end)

  it("fails with a message naming the file for a missing or foreign tokenizer", function()
    assert.has_error(function() T.load("/nonexistent/dir") end, "/nonexistent/dir: No such file or directory")
    local dir = support.tmpdir()
    local f = assert(io.open(dir .. "/tokenizer.json", "wb"))
    f:write('{"model": {"type": "WordPiece", "vocab": {"a": 0}}}')
    f:close()
    local ok, err = pcall(T.load, dir)
    assert.is_false(ok)
    assert.is_truthy(err:find(dir .. "/tokenizer.json", 1, true), err)
    assert.is_truthy(err:find("WordPiece", 1, true), err)
    os.remove(dir .. "/tokenizer.json")
    os.remove(dir)
  end)
end)

describe("byte-level tokenizer of the tiny models", function()
  local fixture = "tests/fixtures/byte_tokenizer"

  it("writes the same files as the committed fixture", function()
    local function slurp(p) local f = assert(io.open(p, "rb")); local s = f:read("*a"); f:close(); return s end
    local dir = support.tmpdir()
    T.write_byte_level(dir)
    assert.are.equal(slurp(fixture .. "/tokenizer.json"), slurp(dir .. "/tokenizer.json"))
    assert.are.equal(slurp(fixture .. "/tokenizer_config.json"), slurp(dir .. "/tokenizer_config.json"))
    os.remove(dir .. "/tokenizer.json")
    os.remove(dir .. "/tokenizer_config.json")
    os.remove(dir)
  end)

  it("takes a list of chat templates' default, and refuses a chat_template that is no template, naming the file", function()
    local dir = support.tmpdir()
    T.write_byte_level(dir)
    local cfg_path = dir .. "/tokenizer_config.json"
    local f = assert(io.open(cfg_path, "rb")); local base = f:read("*a"); f:close()
    local function with(value)
      local text = base:gsub('"chat_template"%s*:%s*"[^\n]-",?', ""):gsub("^%s*{", '{"chat_template": ' .. value .. ",", 1)
      support.write(cfg_path, text)
      return pcall(T.load, dir .. "/tokenizer.json")
    end
    local ok, tok = with('[{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D{{ 1 }}"}]')
    assert.is_true(ok, tostring(tok))
    assert.are.equal("D{{ 1 }}", tok.chat_template)
    ok, tok = with('[{"name": "tool_use", "template": "T"}]')
    assert.is_true(ok, tostring(tok))
    assert.is_nil(tok.chat_template)
    local err
    ok, err = with("42")
    assert.is_false(ok)
    assert.matches(cfg_path .. ": chat_template must be a string (a Jinja template) or a list", tostring(err), 1, true)
    assert.matches("got number", tostring(err), 1, true)
  end)

  it("round-trips arbitrary bytes, NUL and invalid UTF-8 included, one id per byte", function()
    local tok = T.load(fixture)
    assert.are.equal(260, tok.vocab_size)
    assert.are.equal(tok:token_to_id("<|endoftext|>"), tok.eos_id)
    assert.are.equal(tok:token_to_id("<|pad|>"), tok.pad_id)
    local state = 7
    for _ = 1, 50 do
      local bytes = {}
      for i = 1, 1 + state % 300 do
        state = (state * 1103515245 + 12345) % 2147483648
        bytes[i] = string.char(math.floor(state / 65536) % 256)
      end
      local s = table.concat(bytes)
      local ids = tok:encode(s)
      assert.are.equal(#s, #ids)
      for i = 1, #s do assert.are.equal(s:byte(i), ids[i]) end
      assert.are.equal(s, tok:decode(ids))
    end
    local s = "a\0b\255\254\192\128 <|im_start|>x<|im_end|>"
    local ids = tok:encode(s)
    assert.are.equal(tok:token_to_id("<|im_start|>"), ids[9])
    assert.are.equal(s, tok:decode(ids))
    assert.are.equal("a\0b\255\254\192\128 x", tok:decode(ids, { skip_special_tokens = true }))
  end)

  it("matches tokenizers on valid UTF-8", function()
    local a = reference(); if not a then return end
    local tok = T.load(fixture)
    for i, s in ipairs(a.fixture.texts) do assert.are.same(a.fixture.ids[i], tok:encode(s), ("%q"):format(s)) end
  end)
end)
