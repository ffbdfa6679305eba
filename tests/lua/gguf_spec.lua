-- gguf_spec.lua: remax export --gguf (lua/remax/formats/gguf.lua), checked by llama.cpp's own code.
-- Every file the checks read is exported once (the fixture below); then one process of
-- tests/lua/llamacpp_ref.py reads them all with gguf-py (the `gguf` package's GGUFReader: every key
-- and tensor, the data dequantized by gguf.quants) and loads them in llama.cpp through
-- llama-cpp-python (libllama's C API: next-token log-probs, llama_tokenize / llama_token_to_piece,
-- llama_chat_apply_template). The real tokenizers are transformers' conversion of llama.cpp's
-- vocab files (models/ggml-vocab-qwen2.gguf and -llama-bpe.gguf, from llama-cpp-python's sdist),
-- as tokenizer_spec.lua has them (.cache/tokenizers). Crash safety and the refusal of paths that
-- are not regular files need no reference.
local remax = require("remax")
local cjson = require("cjson")
local ffi = require("ffi")
local bit = require("bit")
local gguf = require("remax.formats.gguf")
local support = require("support")
local tmpdir, write = support.tmpdir, support.write

local REF = "tests/lua/llamacpp_ref.py"

local function exists(path)
  local f = io.open(path, "rb")
  if f then f:close() end
  return f ~= nil
end

local function tiny(arch, extra)
  return support.tiny_model({ architectures = { arch }, vocab_size = 300, hidden_size = 64, intermediate_size = 96,
    max_position_embeddings = 128, tie_word_embeddings = false }, extra)
end

-- Llama 3.1's rope_scaling with a short original context, so that 40 tokens reach past it
local LLAMA31 = { tie_word_embeddings = true, rope_theta = 500000, rope_scaling = { rope_type = "llama3", factor = 8,
  low_freq_factor = 1, high_freq_factor = 4, original_max_position_embeddings = 16 } }
local QWEN3 = { head_dim = 32, tie_word_embeddings = true, rope_theta = 1000000 }

-- A model folder (random weights of std 0.1: log-probs spread over several nats, so that
-- an error shows) with the byte-level tokenizer or a real one, loaded back as a user would.
local function folder(cfg, seed, tokenizer_dir)
  local dir = tmpdir()
  remax.model.new(cfg, { seed = seed, init_std = 0.1 }):save(dir)
  if tokenizer_dir then
    for _, f in ipairs({ "tokenizer.json", "tokenizer_config.json", "chat_template.jinja" }) do
      local text = support.try_read(tokenizer_dir .. "/" .. f)
      if text then write(dir .. "/" .. f, text) end
    end
  else
    remax.tokenizer.write_byte_level(dir)
  end
  return dir, remax.model.load(dir), remax.tokenizer.load(dir)
end

local function export(model, tok, path, wtype, extra)
  local opts = { type = wtype, tokenizer = tok }
  for k, v in pairs(extra or {}) do opts[k] = v end
  return gguf.export(model, path, opts)
end

local function read_bytes(path, offset, n)
  local f = assert(io.open(path, "rb"))
  f:seek("set", offset)
  local s = f:read(n)
  f:close()
  return s
end

-- The real tokenizers, as tokenizer_spec.lua has them: tests/lua/tokenizer_ref.py prepare makes
-- each once into .cache/tokenizers/NAME, by transformers' GGUF conversion of llama.cpp's vocab
-- file (which llama.cpp's converter wrote from the model's own tokenizer.json). NAME -> { dir,
-- vocab file }, or nil after reporting the test skipped.
local VOCABS = { qwen2 = "models/ggml-vocab-qwen2.gguf", llama3 = "models/ggml-vocab-llama-bpe.gguf" }
local function real_tokenizers()
  local out = {}
  for name, rel in pairs(VOCABS) do
    local vocab = support.llama_cpp_file(rel)
    if not vocab then return nil end
    out[name] = { vocab = vocab }
  end
  local dirs = cjson.decode(support.run_reference("tests/lua/tokenizer_ref.py", "prepare"))
  for name, t in pairs(out) do t.dir = assert(dirs[name], "tokenizer_ref.py prepare made no " .. name) end
  return out
end

-- llama.cpp's own tokenizer test texts for a vocab (models/ggml-vocab-NAME.gguf.inp)
local function vocab_texts(vocab)
  local s = support.read(vocab .. ".inp")
  local out = {}
  for text in (s):gmatch("(.-)\n__ggml_vocab_test__\n") do out[#out + 1] = text end
  assert(#out > 30, vocab .. ".inp holds too few texts")
  return out
end

-- remax's log p(next token) over the vocabulary after every prefix of a row.
local function remax_logprobs(model, row)
  local prefixes = {}
  for t = 1, #row do
    prefixes[t] = {}
    for i = 1, t do prefixes[t][i] = row[i] end
  end
  local out = {}
  for t, logits in ipairs(model:next_logits(prefixes):totable()) do
    local mx = -math.huge
    for _, v in ipairs(logits) do mx = math.max(mx, v) end
    local s = 0
    for _, v in ipairs(logits) do s = s + math.exp(v - mx) end
    local lse = mx + math.log(s)
    out[t] = {}
    for i, v in ipairs(logits) do out[t][i] = v - lse end
  end
  return out
end

local ROWS = { { 1, 5, 9, 13, 2, 77, 100, 250, 3, 4, 256, 40 }, {} }
for i = 1, 40 do ROWS[2][i] = (i * 37) % 256 end

local TEXTS = { "Hello world", "  two  spaces\n\nand\ttabs ", "I'm sure they'll've done it", "12345 + 678 = 13023",
  "naïve café, Zürich 東京 🙂", "def f(x):\n    return x**2  # square", "<|im_start|>user\nhi<|im_end|>",
  "<|begin_of_text|>text<|eot_id|>", "<think>\nok\n</think>" }

local CONVERSATIONS = {
  { { role = "user", content = "What is 7 * 6?" } },
  { { role = "system", content = "Answer briefly." }, { role = "user", content = "Hi" },
    { role = "assistant", content = "Hello! How can I help?" }, { role = "user", content = "2+2?" } },
}

---------------------------------------------------------------------------- the fixture

-- One case per file: what made it, and after the reference ran, .gguf (gguf-py's reading: .keys
-- and .tensors in file order, .kv[key] = { key, types, value or count }, .tensors_by_name[name])
-- and .llama (llama.cpp's results); llamacpp_ref.py's header says what each holds.
local function case_values(c, info)   -- gguf-py's values of a tensor (dequantized), as a Lua list
  local p = ffi.cast("const float *", c.blob) + info.at
  local out = {}
  for i = 0, info.n_elements - 1 do out[i + 1] = p[i] end
  return out
end

local function build()
  local cases, jobs = {}, {}
  -- read: gguf-py reads every key and tensor (values: the data too; arrays: the arrays' elements);
  -- llama: a job for llama.cpp
  local function add(case, path, read, llama)
    if read and read.values then read.values = path .. ".f32" end
    case.path, case.values = path, read and read.values
    jobs[#jobs + 1] = { path = path, read = read, llama = llama }
    cases[#cases + 1] = case
    return case
  end
  local f = {}
  local real = real_tokenizers()
  if not real then return nil end

  do   -- Qwen2, f32, named
    local dir, m, tok = folder(tiny("Qwen2ForCausalLM"), 1)
    local out = export(m, tok, dir .. "/model.gguf", "f32", { name = "tiny" })
    f.qwen2 = add({ model = m, out = out }, dir .. "/model.gguf", { values = true })
  end
  do   -- Llama 3.1-style, f32
    local dir, m, tok = folder(tiny("LlamaForCausalLM", LLAMA31), 2)
    export(m, tok, dir .. "/model.gguf", "f32")
    f.llama31 = add({ model = m }, dir .. "/model.gguf", { values = true })
  end
  do   -- Qwen3 with ffn_down rows of 80 values (not whole q8_0 blocks): q8_0, bf16, f16; the same
       -- model keeping its weights in bf16: bf16 and f32
    local cfg = tiny("Qwen3ForCausalLM", QWEN3)
    cfg.intermediate_size = 80
    local dir, m, tok = folder(cfg, 4)
    local out = export(m, tok, dir .. "/q.gguf", "q8_0")
    f.q8_0 = add({ model = m, out = out }, dir .. "/q.gguf", { values = true })
    for _, wtype in ipairs({ "bf16", "f16" }) do
      export(m, tok, dir .. "/" .. wtype .. ".gguf", wtype)
      f[wtype] = add({ model = m }, dir .. "/" .. wtype .. ".gguf", {})
    end
    local m16 = remax.model.load(dir, { weight_dtype = "bf16" })
    assert.are.equal("bf16", m16:weight_dtype())
    export(m16, tok, dir .. "/w16.gguf", "bf16")
    f.w16 = add({ model = m16 }, dir .. "/w16.gguf", {})
    export(m16, tok, dir .. "/w32.gguf", "f32")
    f.w32 = add({ model = m16 }, dir .. "/w32.gguf", { values = true })
  end
  do   -- LoRA adapters on v_proj, merged on export
    local dir, m, tok = folder(tiny("Qwen2ForCausalLM"), 12)
    local lora = require("remax.bind.lora")
    lora.apply(m, { r = 2, alpha = 4, target_modules = { "v_proj" } })
    for name, t in pairs(lora.params(m)) do
      if name:match("lora_B") then t:normal_(3, #name, 0, 0.3) end
    end
    export(m, tok, dir .. "/l.gguf", "f32")
    f.lora = add({ model = m }, dir .. "/l.gguf", { values = true })
  end
  do   -- `remax export` itself, q8_0
    local dir = folder(tiny("LlamaForCausalLM", LLAMA31), 8)
    local p = assert(io.popen(("%s export --model %s --gguf %s/m.gguf --type q8_0 2>/dev/null"):format(
      support.remax_binary(), dir, dir)))
    local said = p:read("*a")
    p:close()
    f.cli = add({ dir = dir, said = said }, dir .. "/m.gguf", {})
  end
  -- The real tokenizers (Qwen2's 151936 tokens, with 64 embedding rows more than it names;
  -- Llama 3's 128256), bf16; llama.cpp's own vocab files beside them, as gguf-py reads them.
  for _, c in ipairs({ { "tok_qwen", "Qwen3ForCausalLM", real.qwen2.dir, real.qwen2.vocab, 151936 + 64 },
    { "tok_llama", "LlamaForCausalLM", real.llama3.dir, real.llama3.vocab, 128256 } }) do
    local cfg = tiny(c[2], { head_dim = 16, tie_word_embeddings = true, vocab_size = c[5], hidden_size = 32,
      intermediate_size = 32, num_hidden_layers = 1 })
    local dir, m, tok = folder(cfg, 5, c[3])
    local path = dir .. "/t.gguf"
    local out = export(m, tok, path, "bf16")
    local texts = {}
    for _, t in ipairs(TEXTS) do texts[#texts + 1] = t end
    for _, t in ipairs(vocab_texts(c[4])) do texts[#texts + 1] = t end
    f[c[1]] = add({ dir = dir, model = m, tok = tok, out = out, texts = texts, rows = c[5] }, path, { arrays = true },
      { vocab_only = true, texts = texts })
    local base = c[4]:match("[^/]*$")
    f[c[1]].vocab = add({}, c[4], { arrays = true, cache = support.REFERENCE_HOME .. "/gguf-vocab/" .. base .. ".json" })
  end
  -- Chat templates in files of the byte-level tokenizer: remax's rendering of each conversation
  f.chat = {}
  for _, name in ipairs({ "qwen3", "qwen2.5", "llama3.1" }) do
    local dir, m = folder(tiny("Qwen2ForCausalLM"), 11)
    local template = support.read("tests/fixtures/chat_templates/" .. name .. ".jinja")
    write(dir .. "/chat_template.jinja", template)
    local tok = remax.tokenizer.load(dir)
    export(m, tok, dir .. "/m.gguf", "f32")
    local renders, ids, chats = {}, {}, {}
    for k, messages in ipairs(CONVERSATIONS) do
      ids[k], renders[k] = remax.chat.encode(tok, messages)
      chats[k] = { messages = messages, add_generation_prompt = true }
    end
    f.chat[#f.chat + 1] = add({ name = name, template = template, ids = ids, renders = renders },
      dir .. "/m.gguf", nil, { vocab_only = true, chats = chats, renders = renders })
  end
  -- Next-token log-probs: three architectures at each --type, remax's in f32 on the checkpoint
  f.logprobs = {}
  for _, c in ipairs({ { "Qwen2ForCausalLM", {} }, { "LlamaForCausalLM", LLAMA31 }, { "Qwen3ForCausalLM", QWEN3 } }) do
    local dir, m, tok = folder(tiny(c[1], c[2]), 9)
    local ref = {}
    for r, row in ipairs(ROWS) do ref[r] = remax_logprobs(m, row) end
    for _, wtype in ipairs({ "f32", "f16", "bf16", "q8_0" }) do
      local path = ("%s/%s.gguf"):format(dir, wtype)
      export(m, tok, path, wtype)
      f.logprobs[#f.logprobs + 1] = add({ arch = c[1], wtype = wtype, ref = ref }, path, nil, { rows = ROWS, threads = 1 })
    end
  end

  local req = tmpdir() .. "/request.json"
  write(req, cjson.encode({ jobs = jobs }))
  local results = cjson.decode(support.run_reference(REF, "check", req)).results
  assert(#results == #cases, "the reference answered " .. #results .. " of " .. #cases .. " jobs")
  for i, c in ipairs(cases) do
    local g = results[i].gguf
    if g then
      g.kv, g.tensors_by_name = {}, {}
      for _, e in ipairs(g.keys) do g.kv[e.key] = e end
      for _, t in ipairs(g.tensors) do g.tensors_by_name[t.name] = t end
      c.gguf = g
      if c.values then c.blob = support.read(c.values) end
    end
    c.llama = results[i].llama
  end
  f.all = cases
  return f
end

-- The fixture, built by the first test that asks (nil when a reference is missing: that test and
-- every other that asks is reported skipped, naming the install line).
local fixture, fixture_error
local function files()
  if not support.reference("gguf", "llama_cpp") then return nil end
  if fixture_error then error(fixture_error, 0) end
  if fixture == nil then
    local ok, res = pcall(build)
    if not ok then
      fixture_error = "building the files and reading them with the references failed: " .. tostring(res)
      error(fixture_error, 0)
    end
    fixture = res or false
  end
  if fixture == false then
    support.llama_cpp_file("models/ggml-vocab-qwen2.gguf")   -- says why, as the first test heard
    return nil
  end
  return fixture
end

-- gguf-py's reading of a key: its value and its types ({ "UINT32" }, { "ARRAY", "STRING" })
local function kv(c, key)
  local e = c.gguf.kv[key]
  if e == nil then return nil end
  return e.value, e.types
end

describe("gguf export, read by gguf-py", function()
  it("writes GGUF v3 with the keys and tensor names llama.cpp's converter writes for Qwen2", function()
    local F = files(); if not F then return end
    local c, m = F.qwen2, F.qwen2.model
    local g = c.gguf
    assert.are.equal(3, g.version)
    assert.are.equal(32, g.alignment)
    assert.is_nil(kv(c, "general.alignment"))   -- the default, not written
    assert.are.same({ "qwen2", { "STRING" } }, { kv(c, "general.architecture") })
    assert.are.same({ "model", { "STRING" } }, { kv(c, "general.type") })
    assert.are.same({ "tiny", { "STRING" } }, { kv(c, "general.name") })
    assert.are.same({ 0, { "UINT32" } }, { kv(c, "general.file_type") })
    assert.are.same({ 2, { "UINT32" } }, { kv(c, "general.quantization_version") })
    for key, want in pairs({ block_count = 2, context_length = 128, embedding_length = 64, feed_forward_length = 96,
      ["attention.head_count"] = 4, ["attention.head_count_kv"] = 2 }) do
      assert.are.same({ want, { "UINT32" } }, { kv(c, "qwen2." .. key) }, key)
    end
    assert.are.same({ 10000, { "FLOAT32" } }, { kv(c, "qwen2.rope.freq_base") })
    local eps, eps_types = kv(c, "qwen2.attention.layer_norm_rms_epsilon")
    assert.are.same({ "FLOAT32" }, eps_types)
    assert.is_true(math.abs(eps - 1e-6) < 1e-12)
    assert.are.same({ "gpt2", { "STRING" } }, { kv(c, "tokenizer.ggml.model") })
    assert.are.same({ "default", { "STRING" } }, { kv(c, "tokenizer.ggml.pre") })   -- no merges: any split gives the same ids
    assert.are.same({ "ARRAY", "STRING" }, g.kv["tokenizer.ggml.tokens"].types)
    assert.are.same({ "ARRAY", "INT32" }, g.kv["tokenizer.ggml.token_type"].types)
    assert.are.equal(300, g.kv["tokenizer.ggml.tokens"].count)   -- one per embedding row
    assert.is_nil(kv(c, "qwen2.vocab_size"))   -- the converter writes it for Llama only
    -- every parameter under its llama.cpp name, HF [out, in] as ggml dims {in, out}, data at 32-byte offsets
    local t = g.tensors_by_name
    assert.are.equal(#m.names, #g.tensors)
    assert.are.same({ 64, 300 }, t["token_embd.weight"].shape)
    assert.are.same({ 64, 300 }, t["output.weight"].shape)   -- untied: its own head
    assert.are.same({ 64, 32 }, t["blk.1.attn_k.weight"].shape)
    assert.are.same({ 32 }, t["blk.0.attn_v.bias"].shape)
    assert.are.same({ 96, 64 }, t["blk.1.ffn_down.weight"].shape)
    for _, name in ipairs({ "output_norm.weight", "blk.0.attn_norm.weight", "blk.0.ffn_norm.weight", "blk.1.attn_output.weight",
      "blk.1.ffn_gate.weight", "blk.1.ffn_up.weight", "blk.0.attn_q.bias" }) do
      assert.is_not_nil(t[name], name)
    end
    for _, info in ipairs(g.tensors) do
      assert.are.equal("F32", info.type, info.name)
      assert.are.equal(0, (info.offset - g.data_offset) % 32, info.name)
    end
    for hf, p in pairs(m:params()) do
      assert.are.same(p:values(), case_values(c, t[gguf.tensor_name(hf)]), hf)
    end
    local last = g.tensors[#g.tensors]
    assert.are.equal(c.out.bytes, last.offset + last.n_bytes)   -- nothing after the last tensor
    assert.are.equal(c.out.bytes, io.open(c.path, "rb"):seek("end"))
    -- an ordinary file: 0644 less the umask, as any other file a user writes
    local umask = tonumber(io.popen("sh -c umask"):read("*a"), 8)
    local mode = tonumber(io.popen("stat -c %a " .. c.path):read("*a"), 8)
    assert.are.equal(bit.band(tonumber("644", 8), bit.bnot(umask)), mode)
  end)

  it("reorders Llama's q/k rows for llama.cpp's rope (not Qwen2's), ties embeddings, stores Llama 3.1 rope factors", function()
    local F = files(); if not F then return end
    local c, m = F.llama31, F.llama31.model
    local t = c.gguf.tensors_by_name
    assert.are.equal("llama", kv(c, "general.architecture"))
    assert.are.same({ 300, { "UINT32" } }, { kv(c, "llama.vocab_size") })
    assert.are.same({ 16, { "UINT32" } }, { kv(c, "llama.rope.dimension_count") })
    assert.is_nil(t["output.weight"])   -- tied: llama.cpp reads token_embd as the head
    -- row 2j+s of head h in the file is Hugging Face row s*d/2 + j (d = 16 values per head, 64 per row)
    for _, q in ipairs({ { "q", 4 }, { "k", 2 } }) do
      local hf = m:param("model.layers.1.self_attn." .. q[1] .. "_proj.weight"):values()
      local file = case_values(c, t["blk.1.attn_" .. q[1] .. ".weight"])
      assert.are.same({ 64, q[2] * 16 }, t["blk.1.attn_" .. q[1] .. ".weight"].shape)
      for h = 0, q[2] - 1 do
        for j = 0, 7 do
          for s = 0, 1 do
            local from, to = (h * 16 + s * 8 + j) * 64, (h * 16 + 2 * j + s) * 64
            for i = 1, 64 do assert.are.equal(hf[from + i], file[to + i]) end
          end
        end
      end
    end
    assert.are.same(m:param("model.layers.0.self_attn.v_proj.weight"):values(), case_values(c, t["blk.0.attn_v.weight"]))
    -- rope_freqs: the divisor of each frequency, 1 (short wavelengths) ... factor (long), as HF computes it
    assert.are.same({ 8 }, t["rope_freqs.weight"].shape)
    assert.are.equal("F32", t["rope_freqs.weight"].type)
    local factors = case_values(c, t["rope_freqs.weight"])
    local low_wavelen, high_wavelen = 16 / 1, 16 / 4
    for i = 0, 7 do
      local freq = 500000 ^ (-2 * i / 16)
      local wavelen = 2 * math.pi / freq
      local want
      if wavelen < high_wavelen then want = 1
      elseif wavelen > low_wavelen then want = 8
      else
        local smooth = (16 / wavelen - 1) / (4 - 1)
        want = 1 / ((1 - smooth) / 8 + smooth)
      end
      assert.is_true(math.abs(factors[i + 1] - want) <= 1e-6 * want, ("rope factor %d: %g, want %g"):format(i, factors[i + 1], want))
    end
    assert.are.equal(8, factors[8])   -- the longest wavelength: divided by the whole factor
    assert.is_true(factors[1] > 1 and factors[1] < 8)   -- interpolated (wavelength 2 pi, between 16/4 and 16/1)
    -- Qwen2 keeps Hugging Face's row order (llama.cpp runs it with NeoX rope)
    local qc = F.qwen2
    assert.are.same(qc.model:param("model.layers.0.self_attn.q_proj.weight"):values(),
      case_values(qc, qc.gguf.tensors_by_name["blk.0.attn_q.weight"]))
    -- llama3 rope factors only exist in llama.cpp's llama graph: a Qwen2 with them is refused
    local dir = tmpdir()
    local bad = remax.model.new(tiny("Qwen2ForCausalLM", { rope_scaling = LLAMA31.rope_scaling }), { seed = 1 })
    local ok, err = pcall(export, bad, remax.tokenizer.load(remax.tokenizer.write_byte_level(dir)), dir .. "/bad.gguf", "f32")
    assert.is_false(ok)
    assert.matches("rope_scaling 'llama3' on a Qwen2ForCausalLM model", err)
    assert.is_false(exists(dir .. "/bad.gguf"))
  end)

  it("stores q8_0 as ggml's blocks (f16 scale max|x|/127, 32 int8 rounded), bf16/f16 rounded to nearest even, norms in f32", function()
    local F = files(); if not F then return end
    local c, m = F.q8_0, F.q8_0.model
    local t = c.gguf.tensors_by_name
    assert.are.same({ 7, { "UINT32" } }, { kv(c, "general.file_type") })
    assert.are.equal("Q8_0", t["blk.0.attn_q.weight"].type)
    assert.are.equal("Q8_0", t["token_embd.weight"].type)
    assert.are.equal("F16", t["blk.0.ffn_down.weight"].type)
    assert.are.equal(2, #c.out.notes)   -- both layers' ffn_down
    assert.matches("blk.0.ffn_down.weight written as f16: rows of 80 values are not whole blocks of 32", c.out.notes[1])
    for _, name in ipairs({ "blk.0.attn_q_norm.weight", "blk.0.attn_k_norm.weight", "blk.1.attn_norm.weight", "output_norm.weight" }) do
      assert.are.equal("F32", t[name].type, name)
    end
    assert.are.same({ 32 }, t["blk.0.attn_q_norm.weight"].shape)
    assert.are.same({ 32, { "UINT32" } }, { kv(c, "qwen3.attention.key_length") })
    -- the bytes of blk.0.attn_q.weight (64 x 128 values, 256 blocks of 34 bytes) where gguf-py finds them
    local info = t["blk.0.attn_q.weight"]
    assert.are.same({ 64, 128 }, info.shape)
    assert.are.equal(256 * 34, info.n_bytes)
    local raw = read_bytes(c.path, info.offset, 256 * 34)
    local x = m:param("model.layers.0.self_attn.q_proj.weight"):values()
    local dequantized = case_values(c, info)   -- gguf-py's
    local amax = {}
    for b = 0, 255 do
      local a = 0
      for j = 1, 32 do a = math.max(a, math.abs(x[b * 32 + j])) end
      amax[b + 1] = a / 127
    end
    local want_d = remax.tensor.from(amax):to("f16")
    local dp = ffi.cast("const uint8_t *", want_d.data)
    local file_d = remax.tensor.new({ 256 }, "f16")
    local fp = ffi.cast("uint8_t *", file_d.data)
    for b = 0, 255 do
      assert.are.equal(dp[2 * b], raw:byte(34 * b + 1), "scale byte 0 of block " .. b)
      assert.are.equal(dp[2 * b + 1], raw:byte(34 * b + 2), "scale byte 1 of block " .. b)
      fp[2 * b], fp[2 * b + 1] = raw:byte(34 * b + 1), raw:byte(34 * b + 2)
    end
    local d = file_d:to("f32"):values()
    for b = 0, 255 do
      for j = 1, 32 do
        local q = raw:byte(34 * b + 2 + j)
        if q >= 128 then q = q - 256 end
        local v = x[b * 32 + j] / amax[b + 1]
        local want = v >= 0 and math.floor(v + 0.5) or -math.floor(-v + 0.5)
        assert.is_true(q == want or (math.abs(q - want) == 1 and math.abs(v % 1 - 0.5) < 1e-4),
          ("block %d value %d: q %d, want %d (x / d = %.9g)"):format(b, j, q, want, v))
        -- gguf-py reads d * q; within half a step of x, plus the f16 rounding of d (2^-11 relative, times |q| <= 127)
        assert.are.equal(d[b + 1] * q, dequantized[b * 32 + j])
        assert.is_true(math.abs(dequantized[b * 32 + j] - x[b * 32 + j]) <= d[b + 1] * (0.5 + 127 * 2 ^ -11) * 1.001)
      end
    end
    -- ffn_down's f16 fallback: gguf-py reads remax's f16 rounding of the checkpoint
    assert.are.same(m:param("model.layers.1.mlp.down_proj.weight"):to("f16"):to("f32"):values(),
      case_values(c, t["blk.1.ffn_down.weight"]))
    -- bf16 and f16 files hold exactly what remax's own rounding gives
    for _, wtype in ipairs({ "bf16", "f16" }) do
      local w = F[wtype]
      local i2 = w.gguf.tensors_by_name["blk.1.ffn_up.weight"]
      assert.are.equal(wtype:upper(), i2.type)
      assert.are.same({ gguf.file_types[wtype], { "UINT32" } }, { kv(w, "general.file_type") })
      local want = m:param("model.layers.1.mlp.up_proj.weight"):to(wtype)
      local n = want:nelement() * 2
      assert.are.equal(n, i2.n_bytes)
      assert.is_true(ffi.string(want.data, n) == read_bytes(w.path, i2.offset, n), wtype .. " bytes differ")
      assert.are.equal("F32", w.gguf.tensors_by_name["blk.1.ffn_norm.weight"].type)
    end
    -- a model keeping its weights in bf16 (weight_dtype) writes the same bf16 file, and widens exactly to f32
    local a, b = F.bf16, F.w16
    assert.are.equal(#a.gguf.tensors, #b.gguf.tensors)
    for _, ia in ipairs(a.gguf.tensors) do
      local ib = b.gguf.tensors_by_name[ia.name]
      assert.are.equal(ia.type, ib.type, ia.name)
      assert.is_true(read_bytes(a.path, ia.offset, ia.n_bytes) == read_bytes(b.path, ib.offset, ib.n_bytes), ia.name)
    end
    local i32 = F.w32.gguf.tensors_by_name["blk.0.attn_k.weight"]
    assert.are.equal("F32", i32.type)
    assert.are.same(m:param("model.layers.0.self_attn.k_proj.weight"):to("bf16"):to("f32"):values(), case_values(F.w32, i32))
  end)

  it("writes the real Qwen2 and Llama 3 tokenizers as llama.cpp's converter wrote them in its vocab files", function()
    local F = files(); if not F then return end
    for _, c in ipairs({ F.tok_qwen, F.tok_llama }) do
      -- llama.cpp's own file for the same tokenizer (models/ggml-vocab-*.gguf, which its
      -- converter wrote from the model's tokenizer.json), as gguf-py reads it
      local vocab = {}
      for _, e in ipairs(c.vocab.gguf.keys) do vocab[e.key] = e.value end
      local tokens, types, merges = kv(c, "tokenizer.ggml.tokens"), kv(c, "tokenizer.ggml.token_type"),
        kv(c, "tokenizer.ggml.merges")
      local n = #vocab["tokenizer.ggml.tokens"]
      assert.are.equal(c.rows, #tokens)   -- one per embedding row
      assert.are.equal(#tokens, #types)
      for id = 1, n do
        if tokens[id] ~= vocab["tokenizer.ggml.tokens"][id] or types[id] ~= vocab["tokenizer.ggml.token_type"][id] then
          error(("token %d: remax wrote %q type %d, llama.cpp's vocab file has %q type %d"):format(id - 1, tokens[id],
            types[id], vocab["tokenizer.ggml.tokens"][id], vocab["tokenizer.ggml.token_type"][id]))
        end
      end
      for id = n + 1, #tokens do   -- embedding rows no token names
        assert.are.equal(("[PAD%d]"):format(id - 1), tokens[id])
        assert.are.equal(gguf.token_types.unused, types[id])
      end
      assert.are.equal(#vocab["tokenizer.ggml.merges"], #merges)
      for i, mrg in ipairs(vocab["tokenizer.ggml.merges"]) do
        if merges[i] ~= mrg then error(("merge %d: remax wrote %q, llama.cpp's vocab file has %q"):format(i, merges[i], mrg)) end
      end
      assert.are.equal(vocab["tokenizer.ggml.pre"], kv(c, "tokenizer.ggml.pre"))
      assert.are.equal(vocab["tokenizer.ggml.pre"], c.out.pre)
      assert.are.equal("gpt2", kv(c, "tokenizer.ggml.model"))
      for _, role in ipairs({ "bos", "eos", "padding" }) do
        local key = "tokenizer.ggml." .. role .. "_token_id"
        assert.are.equal(vocab[key], kv(c, key), key)
      end
      -- BOS added exactly when remax's encode adds it (the Llama 3 tokenizer.json's post-processor)
      local adds = #c.tok:encode("a") > #c.tok:encode("a", { add_special_tokens = false })
      assert.are.equal(adds, kv(c, "tokenizer.ggml.add_bos_token"))
      assert.are.equal(c.tok.chat_template, kv(c, "tokenizer.chat_template"))
    end
    assert.is_string(kv(F.tok_qwen, "tokenizer.chat_template"))
    assert.is_true(kv(F.tok_llama, "tokenizer.ggml.add_bos_token"))
    -- a pre_tokenizer llama.cpp does not know by name: refused, unless a name is given
    local c = F.tok_qwen
    local changed = support.read(c.dir .. "/tokenizer.json"):gsub("\\\\p{N}|", "\\\\p{N}{1,2}|", 1)
    write(c.dir .. "/tokenizer.json", changed)
    local tok2 = remax.tokenizer.load(c.dir)
    local ok, err = pcall(export, c.model, tok2, c.dir .. "/x.gguf", "bf16")
    assert.is_false(ok)
    assert.matches("the pre_tokenizer %(Split%(.*p{N}{1,2}.*%), ByteLevel%(use_regex=false%)%) is none that llama.cpp knows", err)
    assert.matches("pass %-%-tokenizer%-pre NAME", err)
    assert.is_false(exists(c.dir .. "/x.gguf"))
    assert.are.equal("qwen2", export(c.model, tok2, c.dir .. "/x.gguf", "bf16", { pre = "qwen2" }).pre)
  end)

  it("writes a model with LoRA adapters merged: W + (alpha/r) B A", function()
    local F = files(); if not F then return end
    local c, m = F.lora, F.lora.model
    local t = c.gguf.tensors_by_name
    local i = m.index["model.layers.1.self_attn.v_proj.weight"]
    local merged = remax.tensor.new(m:param("model.layers.1.self_attn.v_proj.weight"):size(), "f32")
    remax.ffi.check(remax.ffi.C.rx_model_lora_merged(m.handle, i, merged))
    local file = case_values(c, t["blk.1.attn_v.weight"])
    assert.are.same(merged:values(), file)
    assert.are_not.same(m:param("model.layers.1.self_attn.v_proj.weight"):values(), file)
    assert.are.same(m:param("model.layers.1.self_attn.q_proj.weight"):values(), case_values(c, t["blk.1.attn_q.weight"]))
    for _, info in ipairs(c.gguf.tensors) do assert.is_nil(info.name:find("lora"), info.name) end
  end)

  it("runs as `remax export` and says what it wrote; bad arguments get the usage", function()
    local F = files(); if not F then return end
    local c = F.cli
    assert.matches("wrote " .. c.path:gsub("%p", "%%%0") .. ": llama, q8_0 weights, 21 tensors", c.said)
    assert.are.equal(21, #c.gguf.tensors)
    assert.are.equal("Q8_0", c.gguf.tensors_by_name["blk.0.ffn_up.weight"].type)
    local bin = support.remax_binary()
    local p = assert(io.popen(("%s export --model %s --gguf %s/m.gguf --type q4 2>&1"):format(bin, c.dir, c.dir)))
    assert.matches("%-%-type q4: expected f32, bf16, f16 or q8_0", p:read("*a"))
    p:close()
    p = assert(io.popen(("%s export --gguf x.gguf 2>&1"):format(bin)))
    assert.matches("missing %-%-model DIR", p:read("*a"))
    p:close()
  end)

  it("remax.formats.gguf.read, remax's own reader, reads every key and tensor as gguf-py does", function()
    local F = files(); if not F then return end
    for _, c in ipairs(F.all) do
      if c.gguf then
        local mine = gguf.read(c.path)
        assert.are.equal(c.gguf.version, mine.version)
        assert.are.equal(c.gguf.data_offset, mine.data_offset, c.path)
        assert.are.equal(#c.gguf.keys, #mine.keys, c.path)
        for k, e in ipairs(c.gguf.keys) do
          assert.are.equal(e.key, mine.keys[k], c.path)
          local vt = mine.kv_types[e.key]
          local want_type = type(vt) == "table" and { "ARRAY", vt[2] } or { vt }
          local names = { [gguf.value_types.u32] = "UINT32", [gguf.value_types.i32] = "INT32", [gguf.value_types.f32] = "FLOAT32",
            [gguf.value_types.str] = "STRING", [gguf.value_types.bool] = "BOOL", [gguf.value_types.arr] = "ARRAY" }
          for i, x in ipairs(want_type) do want_type[i] = names[x] or x end
          if e.count == 0 and #e.types == 1 then want_type = { want_type[1] } end   -- gguf-py: no element, no element type
          assert.are.same(e.types, want_type, e.key)
          if e.value ~= nil and e.types[1] == "FLOAT32" then
            assert.is_true(math.abs(e.value - mine.kv[e.key]) <= 1e-7 * math.abs(e.value), e.key)
          elseif e.value ~= nil then
            assert.are.same(e.value, mine.kv[e.key], e.key)
          else
            assert.are.equal(e.count, #mine.kv[e.key], e.key)
          end
        end
        assert.are.equal(#c.gguf.tensors, #mine.tensors)
        for k, t in ipairs(c.gguf.tensors) do
          local r = mine.tensors[k]
          assert.are.same({ t.name, t.shape, t.type:lower(), t.offset }, { r.name, r.dims, r.type, r.offset })
          if c.blob then assert.are.same(case_values(c, t), gguf.read_tensor(c.path, r):values(), t.name) end
        end
      end
    end
  end)
end)

describe("gguf export, without a reference", function()
  it("writes through a temporary file: a failed write names the file and errno and leaves the old file", function()
    local dir, m, tok = folder(tiny("Qwen2ForCausalLM"), 7)
    local path = dir .. "/model.gguf"
    write(path, "the old file")
    -- a file size limit of 64 KiB: write() fails with EFBIG half way through the tensors
    local cmd = ("cd %s && bash -c \"trap '' XFSZ; ulimit -f 64; exec %s export --model %s --gguf %s --type f32\" 2>&1; echo \"exit $?\""):format(
      os.getenv("PWD") or ".", support.remax_binary(), dir, path)
    local p = assert(io.popen(cmd))
    local msg = p:read("*a")
    p:close()
    assert.is_nil(msg:match("exit 0\n$"), msg)
    assert.matches("cannot write " .. dir:gsub("%p", "%%%0") .. "/model%.gguf%.tmp%.%d+ %(errno 27, File too large%)", msg)
    assert.are.equal("the old file", io.open(path):read("*a"))
    for name in io.popen("ls " .. dir):lines() do assert.is_nil(name:match("%.tmp"), name) end
    -- a folder that does not exist
    local ok2, err = pcall(export, m, tok, dir .. "/no/such/dir/m.gguf", "f32")
    assert.is_false(ok2)
    assert.matches("cannot create " .. dir:gsub("%p", "%%%0") .. "/no/such/dir/m%.gguf%.tmp%.%d+ %(errno 2, No such file or directory%)", err)
  end)
  it("writes only to a regular file path: a device node, a fifo or a folder is refused, naming it, and stays", function()
    local dir, m, tok = folder(tiny("Qwen2ForCausalLM"), 7)
    local fs = require("remax.bind.fs")
    local function kind(p)
      local h = io.popen("stat -c %F " .. p)
      local k = h:read("*l")
      h:close()
      return k
    end
    assert.are.equal(0, os.execute("mkfifo " .. dir .. "/pipe"))
    local ok, err = pcall(export, m, tok, dir .. "/pipe", "f32")
    assert.is_false(ok)
    assert.matches("gguf " .. dir .. "/pipe is a fifo, not a regular file", err, 1, true)
    assert.are.equal("fifo", kind(dir .. "/pipe"))
    os.execute("mkdir " .. dir .. "/sub")
    err = select(2, pcall(export, m, tok, dir .. "/sub", "f32"))
    assert.matches("gguf " .. dir .. "/sub is a folder, not a regular file", err, 1, true)
    -- a device node made here (the null device's numbers, 1:3), never the real /dev; as root only
    local dev = dir .. "/full"
    if os.execute("mknod " .. dev .. " c 1 3 2>/dev/null") == 0 then
      local bin = support.remax_binary()
      local p = assert(io.popen(("%s export --model %s --gguf %s 2>&1; echo \"exit $?\""):format(bin, dir, dev)))
      local out = p:read("*a")
      p:close()
      assert.matches("export --gguf " .. dev .. " is a character device, not a regular file", out, 1, true)
      assert.matches("exit 1\n$", out)
      assert.is_nil(out:find("wrote", 1, true))
      assert.are.equal("character special file", kind(dev))
    else
      print("(not root: the device node part is skipped; the fifo and the folder ran)")
    end
    -- every other file remax writes through fs.write_atomic is refused the same way
    err = select(2, pcall(fs.write_atomic, dir .. "/pipe", "x"))
    assert.matches(dir .. "/pipe is a fifo, not a regular file", err, 1, true)
    for name in io.popen("ls " .. dir):lines() do assert.is_nil(name:match("%.tmp"), name) end
  end)
end)

describe("gguf export, loaded by llama.cpp (llama-cpp-python)", function()
  -- max |log p_llama.cpp - log p_remax| over every position and every token of the vocabulary,
  -- remax in f32 on the checkpoint's weights. f32 is the issue's bound; the others are about
  -- twice what these models show (f16 0.005, bf16 0.035, q8_0 0.10): llama.cpp also rounds the
  -- activations to the weights' type (q8_0: blocks of 32) before each product.
  local BOUND = { f32 = 1e-3, f16 = 1e-2, bf16 = 7e-2, q8_0 = 0.2 }

  it("gives the next-token log-probs remax gives: Qwen2, Llama 3.1-style and Qwen3 at f32, f16, bf16, q8_0", function()
    local F = files(); if not F then return end
    for _, c in ipairs(F.logprobs) do
      local got_rows = c.llama.logprobs
      local worst, lowest = 0, 0
      assert.are.equal(#ROWS, #got_rows)
      for r, row in ipairs(ROWS) do
        assert.are.equal(#row, #got_rows[r])
        for t = 1, #row do
          local want, got = c.ref[r][t], got_rows[r][t]
          assert.are.equal(300, #got)
          for k = 1, 300 do
            worst = math.max(worst, math.abs(want[k] - got[k]))
            lowest = math.min(lowest, want[k])
          end
        end
      end
      assert.is_true(lowest < -5, "the model's log-probs are too flat to show an error")   -- the test can fail
      assert.is_true(worst <= BOUND[c.wtype], ("%s %s: max |log p difference| %.3g > %g"):format(c.arch, c.wtype, worst, BOUND[c.wtype]))
    end
  end)

  it("tokenizes as remax does with the real Qwen2 and Llama 3 tokenizers, and detokenizes back", function()
    local F = files(); if not F then return end
    for _, c in ipairs({ F.tok_qwen, F.tok_llama }) do
      local res, tok = c.llama, c.tok
      assert.are.equal(c.rows, res.n_vocab)
      for k, text in ipairs(c.texts) do
        local ids = tok:encode(text, { add_special_tokens = false })
        assert.are.same(ids, res.tokens[k], text)
        assert.are.equal(text, res.detokenized[k])   -- llama.cpp's pieces give the text back
        assert.are.equal(tok:decode(ids), res.detokenized[k])
      end
      assert.are.equal(tok.eos_id, res.eos)
      if tok.bos_id then assert.are.equal(tok.bos_id, res.bos) end
      -- llama.cpp prepends BOS exactly when remax's encode adds it
      local adds = #tok:encode("a") > #tok:encode("a", { add_special_tokens = false })
      assert.are.equal(adds, res.add_bos)
    end
  end)

  it("reads the chat template remax uses, renders the turns as remax does, and tokenizes the prompt to remax's ids (Qwen3, Qwen2.5, Llama 3.1 templates)", function()
    local F = files(); if not F then return end
    -- llama.cpp's C function llama_chat_apply_template runs no Jinja: it recognises the template's
    -- format (ChatML for Qwen, Llama 3's headers) and writes the messages in it. The whole prompt
    -- is compared where the template adds nothing of its own; otherwise from the first user turn on
    -- (Qwen2.5 writes its default system message when there is none, Llama 3.1 a date header).
    local whole = { qwen3 = { true, true }, ["qwen2.5"] = { false, true }, ["llama3.1"] = { false, false } }
    for _, c in ipairs(F.chat) do
      local res = c.llama
      assert.are.equal(c.template, res.template, c.name)
      for k in ipairs(CONVERSATIONS) do
        local what = ("%s conversation %d"):format(c.name, k)
        local mine, theirs = c.renders[k], res.chats[k]
        assert.is_string(theirs, what .. ": llama.cpp knows no format for the template")
        if whole[c.name][k] then
          assert.are.equal(mine, theirs, what)
        else
          local user = c.name == "llama3.1" and "<|start_header_id|>user<|end_header_id|>" or "<|im_start|>user"
          local from_mine, from_theirs = mine:find(user, 1, true), theirs:find(user, 1, true)
          assert.is_not_nil(from_mine, what)
          assert.is_not_nil(from_theirs, what)
          assert.are.equal(mine:sub(from_mine), theirs:sub(from_theirs), what)
          assert.are_not.equal(mine, theirs, what .. ": the template adds nothing, compare it whole")
        end
        assert.are.same(c.ids[k], res.render_tokens[k], what)
      end
    end
  end)
end)
