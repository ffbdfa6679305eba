-- remax.formats.gguf: a model as a GGUF v3 file for llama.cpp and Ollama (what llama.cpp's
-- convert_hf_to_gguf.py writes for Qwen2, Qwen3 and Llama: metadata keys, tensor names, the
-- Q/K row order llama.cpp's Llama graph wants, the byte-level BPE tokenizer and chat template),
-- and a reader for the header, metadata and tensor table of any GGUF file.
--
--   remax.formats.gguf.export(model, "out.gguf", { type = "q8_0", tokenizer = tok })
--   local g = remax.formats.gguf.read("out.gguf")   -- g.kv["general.architecture"], g.tensors[i].name
--
-- docs/gguf.md says what is written and why.
local ffi = require("ffi")
local bit = require("bit")
local cjson = require("cjson")
local signals = require("remax.bind.signals")
local fs = require("remax.bind.fs")
local tensor = require("remax.bind.tensor")
local model_mod = require("remax.bind.model")
local lora = require("remax.bind.lora")

local M = {}

M.ALIGNMENT = 32     -- general.alignment's default; remax does not write the key
M.QUANT_VERSION = 2  -- GGML_QNT_VERSION

-- ggml tensor types remax writes: id, bytes per block, values per block
M.types = {
  f32 = { id = 0, block_bytes = 4, block = 1 },
  f16 = { id = 1, block_bytes = 2, block = 1 },
  q8_0 = { id = 8, block_bytes = 34, block = 32 },   -- f16 scale d, then 32 int8: x = d * q
  bf16 = { id = 30, block_bytes = 2, block = 1 },
}
local type_names = {}
for name, t in pairs(M.types) do type_names[t.id] = name end
M.type_names = type_names

-- general.file_type (llama.cpp's llama_ftype) for each --type
M.file_types = { f32 = 0, f16 = 1, q8_0 = 7, bf16 = 32 }

-- GGUF metadata value types
local V = { u8 = 0, i8 = 1, u16 = 2, i16 = 3, u32 = 4, i32 = 5, f32 = 6, bool = 7, str = 8, arr = 9,
  u64 = 10, i64 = 11, f64 = 12 }
M.value_types = V

-- tokenizer.ggml.token_type values (llama.cpp's llama_token_type)
M.token_types = { normal = 1, unknown = 2, control = 3, user_defined = 4, unused = 5, byte = 6 }

-- remax model families -> general.architecture
M.architectures = { qwen2 = "qwen2", qwen3 = "qwen3", llama = "llama" }

-- The pre-tokenizer regexes of the tokenizer.json files llama.cpp knows by name. llama.cpp
-- splits text with its own copy of each; the name in tokenizer.ggml.pre picks it.
M.QWEN2_REGEX = [[(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+]]
M.LLAMA3_REGEX = [[(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+]]
M.known_pre = { "qwen2", "llama-bpe", "gpt-2", "default" }

-- ---------------------------------------------------------------- little-endian encoding

local scratch = ffi.new("union { uint8_t b[8]; uint32_t u32; int32_t i32; float f32; double f64; uint64_t u64; int64_t i64; }")

local function u32(v) scratch.u32 = v; return ffi.string(scratch.b, 4) end
local function i32(v) scratch.i32 = v; return ffi.string(scratch.b, 4) end
local function u64(v) scratch.u64 = v; return ffi.string(scratch.b, 8) end
local function f32(v) scratch.f32 = v; return ffi.string(scratch.b, 4) end
local function gstr(s) return u64(#s) .. s end

-- Appends the bytes of one metadata value of type vt to the list out.
local function encode_value(out, vt, v, key)
  if vt == V.str then
    if type(v) ~= "string" then error(("gguf: metadata %s: expected a string, got %s"):format(key, type(v)), 0) end
    out[#out + 1] = gstr(v)
  elseif vt == V.u32 then
    if not (type(v) == "number" and v >= 0 and v < 2 ^ 32 and v == math.floor(v)) then
      error(("gguf: metadata %s = %s is not a 32-bit unsigned integer"):format(key, tostring(v)), 0)
    end
    out[#out + 1] = u32(v)
  elseif vt == V.i32 then out[#out + 1] = i32(v)
  elseif vt == V.f32 then out[#out + 1] = f32(v)
  elseif vt == V.bool then out[#out + 1] = v and "\1" or "\0"
  elseif vt == V.u64 then out[#out + 1] = u64(v)
  else error("gguf: cannot write metadata value type " .. tostring(vt), 0) end
end

-- kv: list of { key, value type, value } (arrays: { key, V.arr, values, element type }).
local function encode_kv(kv)
  local out = {}
  for _, e in ipairs(kv) do
    local key, vt, v = e[1], e[2], e[3]
    out[#out + 1] = gstr(key)
    out[#out + 1] = u32(vt)
    if vt == V.arr then
      local et = e[4]
      out[#out + 1] = u32(et)
      out[#out + 1] = u64(#v)
      for i = 1, #v do encode_value(out, et, v[i], key) end
    else
      encode_value(out, vt, v, key)
    end
  end
  return table.concat(out)
end

-- ---------------------------------------------------------------- tensor names and data

-- Hugging Face parameter name -> GGUF tensor name (llama.cpp's tensor_mapping for these models).
local layer_names = {
  ["input_layernorm.weight"] = "attn_norm.weight",
  ["self_attn.q_proj.weight"] = "attn_q.weight", ["self_attn.q_proj.bias"] = "attn_q.bias",
  ["self_attn.k_proj.weight"] = "attn_k.weight", ["self_attn.k_proj.bias"] = "attn_k.bias",
  ["self_attn.v_proj.weight"] = "attn_v.weight", ["self_attn.v_proj.bias"] = "attn_v.bias",
  ["self_attn.o_proj.weight"] = "attn_output.weight",
  ["self_attn.q_norm.weight"] = "attn_q_norm.weight", ["self_attn.k_norm.weight"] = "attn_k_norm.weight",
  ["post_attention_layernorm.weight"] = "ffn_norm.weight",
  ["mlp.gate_proj.weight"] = "ffn_gate.weight", ["mlp.up_proj.weight"] = "ffn_up.weight",
  ["mlp.down_proj.weight"] = "ffn_down.weight",
}
local top_names = { ["model.embed_tokens.weight"] = "token_embd.weight", ["model.norm.weight"] = "output_norm.weight",
  ["lm_head.weight"] = "output.weight" }

function M.tensor_name(hf)
  if top_names[hf] then return top_names[hf] end
  local n, rest = hf:match("^model%.layers%.(%d+)%.(.+)$")
  local mapped = rest and layer_names[rest]
  if not mapped then return nil end
  return ("blk.%s.%s"):format(n, mapped)
end

-- llama.cpp's Llama graph rotates adjacent pairs (x[2i], x[2i+1]) where Hugging Face rotates
-- halves (x[i], x[i + d/2]): the converter reorders each head's rows of q_proj and k_proj
-- (weights and biases) so that row 2j+s of a head is Hugging Face row s*d/2 + j. Qwen2 and Qwen3
-- use llama.cpp's NeoX rope, which rotates halves: no reordering there.
-- inverse = true undoes it (the GGUF row order back to Hugging Face's).
function M.permute_rows(src, heads, inverse)
  local shape = src:size()
  local rows = shape[1]
  local cols = #shape > 1 and shape[2] or 1
  local d = rows / heads
  if d ~= math.floor(d) or d % 2 ~= 0 then
    error(("gguf: cannot reorder %d rows into %d heads of even size"):format(rows, heads), 0)
  end
  local out = tensor.new(shape, "f32")
  local s, o = ffi.cast("float *", src.data), ffi.cast("float *", out.data)
  local half, row_bytes = d / 2, cols * 4
  for h = 0, heads - 1 do
    for j = 0, half - 1 do
      for p = 0, 1 do
        local gguf_row, hf_row = h * d + 2 * j + p, h * d + p * half + j
        if inverse then gguf_row, hf_row = hf_row, gguf_row end
        ffi.copy(o + gguf_row * cols, s + hf_row * cols, row_bytes)
      end
    end
  end
  return out
end

-- Q8_0 blocks of a contiguous f32 tensor whose rows have a multiple of 32 values, as ggml's
-- quantize_row_q8_0 makes them: d = max|x| / 127 (stored as f16), q = round(x / d) (half away
-- from zero). Returns a uint8 buffer and its size.
function M.quantize_q8_0(src)
  local n = tonumber(src.numel)
  local nb = n / 32
  local x = ffi.cast("float *", src.data)
  local scales = tensor.new({ nb }, "f32")
  local sp = ffi.cast("float *", scales.data)
  local q = ffi.new("int8_t[?]", n)
  local floor = math.floor
  for b = 0, nb - 1 do
    local base = b * 32
    local amax = 0
    for j = base, base + 31 do
      local v = x[j]
      if v < 0 then v = -v end
      if v > amax then amax = v end
    end
    local d = amax / 127
    sp[b] = d
    d = sp[b]   -- the f32 value, as ggml computes id from it
    local id = d ~= 0 and 1 / d or 0
    for j = base, base + 31 do
      local v = x[j] * id
      if v >= 0 then q[j] = floor(v + 0.5) else q[j] = -floor(-v + 0.5) end
    end
  end
  local h = scales:to("f16")
  local hp = ffi.cast("uint8_t *", h.data)
  local size = nb * 34
  local out = ffi.new("uint8_t[?]", size)
  for b = 0, nb - 1 do
    out[b * 34] = hp[b * 2]
    out[b * 34 + 1] = hp[b * 2 + 1]
    ffi.copy(out + b * 34 + 2, q + b * 32, 32)
  end
  return out, size
end

-- ---------------------------------------------------------------- tokenizer metadata

local function json_value(v)
  if v == cjson.null then return nil end
  return v
end

local function read_json(path, what)
  local text = fs.read_text(path)
  if not text then return nil end
  local ok, t = pcall(cjson.decode, text)
  if not ok or type(t) ~= "table" then
    error(("gguf: %s is not a JSON object (%s)"):format(path, tostring(t)), 0)
  end
  return t
end

-- The folder of a tokenizer (its path is the folder or its tokenizer.json).
local function tokenizer_dir(tok)
  local p = tok.path
  if p:match("%.json$") then return p:match("^(.*)/[^/]*$") or "." end
  return p
end

-- llama.cpp's name for the pre-tokenizer of a tokenizer.json table, or nil and a description of
-- what the file has. A vocabulary without merges encodes byte by byte whatever the split, so any
-- name fits it; "default" is written.
function M.pre_tokenizer_name(tj)
  local model = tj.model or {}
  local merges = json_value(model.merges)
  if merges == nil or #merges == 0 then return "default" end
  local pre = json_value(tj.pre_tokenizer)
  if pre == nil then return nil, "no pre_tokenizer" end
  local steps = pre.type == "Sequence" and (pre.pretokenizers or {}) or { pre }
  local desc = {}
  for i, s in ipairs(steps) do
    local d = tostring(s.type)
    if s.type == "Split" and type(s.pattern) == "table" then
      d = ("Split(%s)"):format(cjson.encode(s.pattern.Regex or s.pattern.String))
    elseif s.type == "ByteLevel" then
      d = ("ByteLevel(use_regex=%s)"):format(tostring(s.use_regex ~= false))
    end
    desc[i] = d
  end
  local description = table.concat(desc, ", ")
  local function byte_level(s, regex)
    return s and s.type == "ByteLevel" and (s.use_regex ~= false) == regex and not s.add_prefix_space
  end
  if #steps == 2 and steps[1].type == "Split" and type(steps[1].pattern) == "table" and steps[1].behavior == "Isolated"
    and not steps[1].invert and byte_level(steps[2], false) then
    local re = steps[1].pattern.Regex
    if re == M.QWEN2_REGEX then return "qwen2" end
    if re == M.LLAMA3_REGEX then return "llama-bpe" end
  end
  if #steps == 1 and byte_level(steps[1], true) then return "gpt-2" end
  return nil, description
end

-- Does an added token look like a control token (convert_hf_to_gguf.py marks "<|...|>" so)?
local function looks_special(s) return s:sub(1, 2) == "<|" and s:sub(-2) == "|>" end

-- tokenizer.ggml.* and tokenizer.chat_template entries for a remax tokenizer and a model of
-- vocab_size rows. opts.pre overrides the pre-tokenizer name; opts.config is config.json.
function M.tokenizer_metadata(tok, vocab_size, opts)
  opts = opts or {}
  local dir = tokenizer_dir(tok)
  local tj_path = tok.path:match("%.json$") and tok.path or (dir .. "/tokenizer.json")
  local tj = read_json(tj_path)
  if not tj then error(("gguf: cannot read %s"):format(tj_path), 0) end
  local model = tj.model or {}
  if model.type ~= nil and model.type ~= "BPE" then
    error(("gguf: %s: model.type '%s' is not byte-level BPE (only tokenizer.ggml.model = gpt2 is written)"):format(
      tj_path, tostring(model.type)), 0)
  end
  if json_value(model.byte_fallback) then
    error(("gguf: %s: byte_fallback BPE (SentencePiece style) is not written; only byte-level BPE (gpt2)"):format(tj_path), 0)
  end
  local pre, desc = opts.pre, nil
  if pre == nil then
    pre, desc = M.pre_tokenizer_name(tj)
    if not pre then
      error(("gguf: %s: the pre_tokenizer (%s) is none that llama.cpp knows by name; pass --tokenizer-pre NAME "
        .. "(one of %s, or another name llama.cpp's llama-vocab.cpp lists) to choose the split llama.cpp applies, "
        .. "knowing it may tokenize some texts differently from remax"):format(tj_path, desc, table.concat(M.known_pre, ", ")), 0)
    end
  elseif type(pre) ~= "string" or not pre:match("^[%w%._%-]+$") then
    error(("gguf: tokenizer pre-tokenizer name %s: expected a name such as qwen2 or llama-bpe"):format(tostring(pre)), 0)
  end

  -- tokens by id: the vocab, the added tokens over it, [PADn] for ids the vocab lacks
  local tokens, types = {}, {}
  local function put(id, s, ty, where)
    if type(id) ~= "number" or id < 0 or id ~= math.floor(id) then
      error(("gguf: %s: %s has id %s, expected an integer >= 0"):format(tj_path, where, tostring(id)), 0)
    end
    if id >= vocab_size then
      error(("gguf: %s: %s has id %d, but the model has vocab_size = %d rows"):format(tj_path, where, id, vocab_size), 0)
    end
    tokens[id + 1], types[id + 1] = s, ty
  end
  for s, id in pairs(json_value(model.vocab) or {}) do put(id, s, M.token_types.normal, ("vocab token %q"):format(s)) end
  for _, a in ipairs(json_value(tj.added_tokens) or {}) do
    local content = a.content
    local control = json_value(a.special) or looks_special(content)
    put(a.id, content, control and M.token_types.control or M.token_types.user_defined, ("added token %q"):format(content))
  end
  for i = 1, vocab_size do
    if tokens[i] == nil then tokens[i], types[i] = ("[PAD%d]"):format(i - 1), M.token_types.unused end
  end

  -- merges as "a b" strings; a space inside a part is written as U+0120, as the converter does
  local merges = {}
  for i, m in ipairs(json_value(model.merges) or {}) do
    if type(m) == "string" then merges[i] = m
    elseif type(m) == "table" and #m == 2 then
      merges[i] = m[1]:gsub(" ", "\196\160") .. " " .. m[2]:gsub(" ", "\196\160")
    else
      error(("gguf: %s: model.merges[%d] is neither \"a b\" nor [\"a\", \"b\"]"):format(tj_path, i), 0)
    end
  end

  local kv = {
    { "tokenizer.ggml.model", V.str, "gpt2" },
    { "tokenizer.ggml.pre", V.str, pre },
    { "tokenizer.ggml.tokens", V.arr, tokens, V.str },
    { "tokenizer.ggml.token_type", V.arr, types, V.i32 },
    { "tokenizer.ggml.merges", V.arr, merges, V.str },
  }
  -- special tokens: tokenizer_config.json's role tokens, then config.json's *_token_id
  local named = tok.special_tokens or {}
  local cfg = opts.config or {}
  for _, role in ipairs({ { "bos", "bos_token_id" }, { "eos", "eos_token_id" }, { "unk", "unknown_token_id" },
    { "pad", "padding_token_id" } }) do
    local token = named[role[1] .. "_token"]
    local id = token and tok:token_to_id(token)
    if id == nil then
      local v = json_value(cfg[role[1] .. "_token_id"])
      if type(v) == "number" and v >= 0 and v < vocab_size then id = v end
    end
    if id ~= nil then kv[#kv + 1] = { "tokenizer.ggml." .. role[2], V.u32, id } end
  end
  -- add_bos / add_eos: what remax's encode adds (the tokenizer.json post-processor), so that
  -- llama.cpp's tokenize with special tokens gives the same ids
  local plain = tok:encode("a", { add_special_tokens = false })
  local full = tok:encode("a")
  local add_bos = #full > #plain and tok.bos_id ~= nil and full[1] == tok.bos_id
  local add_eos = #full > #plain and tok.eos_id ~= nil and full[#full] == tok.eos_id
  kv[#kv + 1] = { "tokenizer.ggml.add_bos_token", V.bool, add_bos }
  kv[#kv + 1] = { "tokenizer.ggml.add_eos_token", V.bool, add_eos }
  if type(tok.chat_template) == "string" and tok.chat_template ~= "" then
    kv[#kv + 1] = { "tokenizer.chat_template", V.str, tok.chat_template }
  end
  return kv, pre
end

-- ---------------------------------------------------------------- model metadata and tensors

-- The export plan of a model: architecture, metadata entries (tokenizer excluded) and the list
-- of tensors { name, dims (ggml order: fastest first), type, bytes, source = function -> (ptr, n) }.
function M.plan(model, opts)
  opts = opts or {}
  local wtype = opts.type or "f32"
  if not M.types[wtype] then
    error(("gguf: --type %s is not one of f32, bf16, f16, q8_0"):format(tostring(wtype)), 0)
  end
  local c = model:cfg()
  local cfg = model.config or {}
  local arch_hf = cfg.architectures and cfg.architectures[1] or "Qwen2ForCausalLM"
  local family = model_mod.architectures[arch_hf]
  local arch = family and M.architectures[family]
  if not arch then error(("gguf: architecture '%s' has no GGUF mapping"):format(tostring(arch_hf)), 0) end
  local llama3_rope = model_mod.rope_llama3(c)
  if llama3_rope and arch ~= "llama" then
    error(("gguf: rope_scaling 'llama3' on a %s model: llama.cpp's %s graph has no rope factors (only its llama "
      .. "graph reads rope_freqs)"):format(arch_hf, arch), 0)
  end
  local heads, kv_heads, head_dim = tonumber(c.num_attention_heads), tonumber(c.num_key_value_heads), tonumber(c.head_dim)
  local hidden = tonumber(c.hidden_size)

  local kv = {
    { "general.architecture", V.str, arch },
    { "general.type", V.str, "model" },
    { "general.name", V.str, opts.name or "remax model" },
    { arch .. ".block_count", V.u32, tonumber(c.num_hidden_layers) },
    { arch .. ".context_length", V.u32, tonumber(c.max_position_embeddings) },
    { arch .. ".embedding_length", V.u32, hidden },
    { arch .. ".feed_forward_length", V.u32, tonumber(c.intermediate_size) },
    { arch .. ".attention.head_count", V.u32, heads },
    { arch .. ".attention.head_count_kv", V.u32, kv_heads },
    { arch .. ".rope.freq_base", V.f32, c.rope_theta },
    { arch .. ".attention.layer_norm_rms_epsilon", V.f32, c.rms_norm_eps },
  }
  if json_value(cfg.head_dim) ~= nil or head_dim * heads ~= hidden then
    kv[#kv + 1] = { arch .. ".attention.key_length", V.u32, head_dim }
    kv[#kv + 1] = { arch .. ".attention.value_length", V.u32, head_dim }
  end
  kv[#kv + 1] = { "general.file_type", V.u32, M.file_types[wtype] }
  if arch == "llama" then
    kv[#kv + 1] = { arch .. ".vocab_size", V.u32, tonumber(c.vocab_size) }
    kv[#kv + 1] = { arch .. ".rope.dimension_count", V.u32, head_dim }
  end
  kv[#kv + 1] = { "general.quantization_version", V.u32, M.QUANT_VERSION }

  local merged = opts.merged or {}
  local list = {}
  local function add(name, dims, ttype, produce)
    local t = M.types[ttype]
    local bytes = (dims[1] / t.block) * t.block_bytes
    for i = 2, #dims do bytes = bytes * dims[i] end
    list[#list + 1] = { name = name, dims = dims, type = ttype, bytes = bytes, produce = produce }
  end

  if llama3_rope then
    -- rope_freqs: per frequency the divisor llama.cpp applies, plain / scaled from the engine
    local factors = model_mod.rope_factors(c, 2)
    add("rope_freqs.weight", { head_dim / 2 }, "f32", function() return factors end)
  end

  for i, hf in ipairs(model.names) do
    local name = M.tensor_name(hf)
    if not name then error(("gguf: parameter '%s' has no GGUF tensor name"):format(hf), 0) end
    local p = model:param(hf)
    local shape = p:size()
    local dims = {}
    for d = #shape, 1, -1 do dims[#dims + 1] = shape[d] end   -- ggml order: fastest first
    local ttype = wtype
    local note
    if #shape == 1 or name:match("_norm%.weight$") then ttype = "f32" end
    if ttype == "q8_0" and dims[1] % 32 ~= 0 then
      ttype, note = "f16", ("rows of %d values are not whole blocks of 32"):format(dims[1])
    end
    local permute_heads
    if arch == "llama" then
      if hf:match("q_proj%.weight$") or hf:match("q_proj%.bias$") then permute_heads = heads end
      if hf:match("k_proj%.weight$") or hf:match("k_proj%.bias$") then permute_heads = kv_heads end
    end
    add(name, dims, ttype, function()
      local src = merged[hf] or p
      if permute_heads or ttype == "q8_0" or not src:is_contiguous() then
        src = (tonumber(src.dtype) == tensor.dtype("f32") and src:is_contiguous()) and src or src:to("f32")
      end
      if permute_heads then src = M.permute_rows(src, permute_heads) end
      return src
    end)
    list[#list].note = note
  end
  return { arch = arch, kv = kv, tensors = list, type = wtype }
end

-- ---------------------------------------------------------------- writing

local zeros = ffi.new("uint8_t[?]", M.ALIGNMENT)
local function pad_to(n) return (M.ALIGNMENT - n % M.ALIGNMENT) % M.ALIGNMENT end

-- The bytes of one planned tensor: (pointer, size, keep-alive).
local function tensor_bytes(t)
  local src = t.produce()
  if src:device_name() ~= "cpu" then src = src:to("cpu") end   -- a device model's weights, through a host copy
  if t.type == "q8_0" then
    local buf, size = M.quantize_q8_0(src)
    return buf, size, buf
  end
  if tonumber(src.dtype) ~= tensor.dtype(t.type) or not src:is_contiguous() then src = src:to(t.type) end
  local size = tonumber(src.numel) * (t.type == "f32" and 4 or 2)
  return src.data, size, src
end

-- Writes the planned model and tokenizer metadata to path: the bytes go to path.tmp.<pid>, which
-- is fsynced and renamed over path (a failure or Ctrl-C removes it and leaves path as it was).
-- opts.progress(done_bytes, total_bytes, tensor_name) is called after each tensor.
function M.write(path, plan, extra_kv, opts)
  opts = opts or {}
  local kv = {}
  for _, e in ipairs(plan.kv) do kv[#kv + 1] = e end
  for _, e in ipairs(extra_kv or {}) do kv[#kv + 1] = e end
  local head = { "GGUF", u32(3), u64(#plan.tensors), u64(#kv), encode_kv(kv) }
  local offset, total = 0, 0
  for _, t in ipairs(plan.tensors) do
    head[#head + 1] = gstr(t.name) .. u32(#t.dims)
    for _, d in ipairs(t.dims) do head[#head + 1] = u64(d) end
    head[#head + 1] = u32(M.types[t.type].id) .. u64(offset)
    t.offset = offset
    offset = offset + t.bytes + pad_to(t.bytes)
    total = total + t.bytes
  end
  local header = table.concat(head)
  header = header .. string.rep("\0", pad_to(#header))

  fs.check_output(path, "gguf")   -- a device, fifo or folder is refused, never renamed over
  local out = fs.open_atomic(path)   -- path.tmp.<pid>, renamed over path at the end
  local tmp = out.tmp
  local installed = signals.install()
  local ok, err = pcall(function()
    out:write(header, #header)
    local done = 0
    for _, t in ipairs(plan.tensors) do
      if installed and signals.pending() then error(("interrupted: %s removed, %s left as it was"):format(tmp, path), 0) end
      local ptr, size, keep = tensor_bytes(t)
      if size ~= t.bytes then error(("gguf: %s: %d bytes made, %d planned"):format(t.name, size, t.bytes), 0) end
      out:write(ptr, size)
      local pad = pad_to(size)
      if pad > 0 then out:write(zeros, pad) end
      keep = nil
      done = done + size
      if opts.progress then opts.progress(done, total, t.name) end
    end
    out:sync()
  end)
  out:close()
  if installed then signals.clear() end
  if not ok then
    out:remove()
    error(err, 0)
  end
  out:install()
  return { bytes = #header + offset, tensors = #plan.tensors, metadata = #kv }
end

-- Merged W + (alpha/r) B A for every adapted weight of a model with LoRA adapters.
local function lora_merged(model)
  if not model.lora then return {} end
  return lora.merged(model)
end

-- Writes model (with its tokenizer) to path as GGUF. opts: type ("f32", "bf16", "f16", "q8_0"),
-- tokenizer (a remax tokenizer; required), pre (tokenizer.ggml.pre name instead of the one
-- recognised), name (general.name), progress (see M.write). Returns a summary table.
function M.export(model, path, opts)
  opts = opts or {}
  if type(path) ~= "string" or path == "" then error("gguf.export: expected an output path", 2) end
  if not opts.tokenizer then error("gguf.export: opts.tokenizer is required (llama.cpp needs the vocabulary)", 2) end
  local plan = M.plan(model, { type = opts.type, name = opts.name, merged = lora_merged(model) })
  local tok_kv, pre = M.tokenizer_metadata(opts.tokenizer, tonumber(model:cfg().vocab_size),
    { pre = opts.pre, config = model.config })
  local out = M.write(path, plan, tok_kv, opts)
  out.arch, out.type, out.pre = plan.arch, plan.type, pre
  out.notes = {}
  for _, t in ipairs(plan.tensors) do
    if t.note then out.notes[#out.notes + 1] = ("%s written as %s: %s"):format(t.name, t.type, t.note) end
  end
  return out
end

-- ---------------------------------------------------------------- reading

local Reader = {}
Reader.__index = Reader

function Reader:need(n)
  while #self.buf - self.pos + 1 < n do
    local more = self.f:read(math.max(n, 1048576))
    if not more then error(("gguf: %s: file ends at byte %d inside the header"):format(self.path, self.base + #self.buf), 0) end
    self.base = self.base + self.pos - 1
    self.buf = self.buf:sub(self.pos) .. more
    self.pos = 1
  end
  local s = self.buf:sub(self.pos, self.pos + n - 1)
  self.pos = self.pos + n
  return s
end

function Reader:tell() return self.base + self.pos - 1 end

local function scalar(r, ctype, n)
  local s = r:need(n)
  ffi.copy(scratch.b, s, n)
  return scratch[ctype]
end

local readers
readers = {
  [V.u8] = function(r) return r:need(1):byte() end,
  [V.i8] = function(r) local b = r:need(1):byte() return b >= 128 and b - 256 or b end,
  [V.u16] = function(r) local a, b = r:need(2):byte(1, 2) return a + b * 256 end,
  [V.i16] = function(r) local a, b = r:need(2):byte(1, 2) local v = a + b * 256 return v >= 32768 and v - 65536 or v end,
  [V.u32] = function(r) return tonumber(scalar(r, "u32", 4)) end,
  [V.i32] = function(r) return tonumber(scalar(r, "i32", 4)) end,
  [V.f32] = function(r) return tonumber(scalar(r, "f32", 4)) end,
  [V.bool] = function(r) return r:need(1) ~= "\0" end,
  [V.str] = function(r) local n = tonumber(scalar(r, "u64", 8)) return r:need(n) end,
  [V.u64] = function(r) return tonumber(scalar(r, "u64", 8)) end,
  [V.i64] = function(r) return tonumber(scalar(r, "i64", 8)) end,
  [V.f64] = function(r) return tonumber(scalar(r, "f64", 8)) end,
}

-- Reads a GGUF file's header: { version, kv = {key = value (arrays as Lua lists)}, kv_types =
-- {key = value type (arrays: {V.arr, element type})}, keys (in file order), tensors = { {name,
-- dims, type (a name such as "q8_0" or the ggml id), offset (absolute)} }, alignment }.
function M.read(path)
  local f, err = io.open(path, "rb")
  if not f then error(("gguf: cannot open %s (%s)"):format(path, tostring(err)), 0) end
  local r = setmetatable({ f = f, buf = "", pos = 1, base = 0, path = path }, Reader)
  local ok, res = pcall(function()
    if r:need(4) ~= "GGUF" then error(("gguf: %s is not a GGUF file (no GGUF magic)"):format(path), 0) end
    local version = readers[V.u32](r)
    local n_tensors, n_kv = readers[V.u64](r), readers[V.u64](r)
    local out = { version = version, kv = {}, kv_types = {}, keys = {}, tensors = {} }
    for _ = 1, n_kv do
      local key = readers[V.str](r)
      local vt = readers[V.u32](r)
      if vt == V.arr then
        local et, n = readers[V.u32](r), readers[V.u64](r)
        local read = readers[et] or error(("gguf: %s: key %s: unknown array element type %d"):format(path, key, et), 0)
        local vals = {}
        for i = 1, n do vals[i] = read(r) end
        out.kv[key], out.kv_types[key] = vals, { V.arr, et }
      else
        local read = readers[vt] or error(("gguf: %s: key %s: unknown value type %d"):format(path, key, vt), 0)
        out.kv[key], out.kv_types[key] = read(r), vt
      end
      out.keys[#out.keys + 1] = key
    end
    for i = 1, n_tensors do
      local name = readers[V.str](r)
      local nd = readers[V.u32](r)
      local dims = {}
      for d = 1, nd do dims[d] = readers[V.u64](r) end
      local ty = readers[V.u32](r)
      out.tensors[i] = { name = name, dims = dims, type = type_names[ty] or ty, offset = readers[V.u64](r) }
    end
    local align = out.kv["general.alignment"] or M.ALIGNMENT
    local data = r:tell()
    data = data + (align - data % align) % align
    for _, t in ipairs(out.tensors) do t.offset = t.offset + data end
    out.alignment, out.data_offset = align, data
    return out
  end)
  f:close()
  if not ok then error(res, 0) end
  return res
end

-- The values of a tensor of a file M.read returned, as an f32 tensor of the GGUF dims reversed
-- (the Hugging Face shape): f32, f16, bf16 converted, q8_0 dequantized (d * q).
function M.read_tensor(path, info)
  local shape = {}
  for d = #info.dims, 1, -1 do shape[#shape + 1] = info.dims[d] end
  local t = M.types[info.type]
  if not t then error(("gguf: %s: tensor %s has type %s, which remax does not read"):format(path, info.name, tostring(info.type)), 0) end
  local n = 1
  for _, d in ipairs(info.dims) do n = n * d end
  local bytes = n / t.block * t.block_bytes
  local f = assert(io.open(path, "rb"))
  f:seek("set", info.offset)
  local s = f:read(bytes)
  f:close()
  if not s or #s ~= bytes then error(("gguf: %s: tensor %s is cut short"):format(path, info.name), 0) end
  local out = tensor.new(shape, "f32")
  if info.type == "q8_0" then
    local scales = tensor.new({ n / 32 }, "f16")
    local sp, src = ffi.cast("uint8_t *", scales.data), ffi.cast("const uint8_t *", s)
    for b = 0, n / 32 - 1 do sp[2 * b], sp[2 * b + 1] = src[34 * b], src[34 * b + 1] end
    local d = ffi.cast("float *", scales:to("f32").data)
    local o = ffi.cast("float *", out.data)
    local q = ffi.cast("const int8_t *", src)
    for b = 0, n / 32 - 1 do
      for j = 0, 31 do o[b * 32 + j] = d[b] * q[34 * b + 2 + j] end
    end
    return out
  end
  local raw = tensor.new(shape, info.type)
  ffi.copy(raw.data, s, bytes)
  return info.type == "f32" and raw or raw:to("f32")
end

-- ---------------------------------------------------------------- remax export

M.usage = [[
usage: remax export --model DIR --gguf OUT.gguf [--type f32|bf16|f16|q8_0] [options]

  --model DIR           a model remax loads: a Hugging Face folder (config.json, model.safetensors
                        or shards, tokenizer.json), a run's checkpoints/step-N, or a LoRA adapter
                        folder (written merged: W + (alpha/r) B A)
  --gguf OUT.gguf       the file to write (through OUT.gguf.tmp.<pid>, renamed when complete)
  --type T              weight type of the 2-D tensors: f32, bf16, f16 or q8_0 (default: the
                        checkpoint's torch_dtype: bf16 for bfloat16, f16 for float16, else f32);
                        norms, biases and rope factors stay f32, as llama.cpp's converter keeps them
  --tokenizer-pre NAME  tokenizer.ggml.pre to write when the tokenizer's pre_tokenizer is none
                        llama.cpp knows (recognised: qwen2, llama-bpe, gpt-2; default without merges)
  --name NAME           general.name (default: the model folder's name)
]]

local export_flags = { model = true, gguf = true, type = true, ["tokenizer-pre"] = true, name = true }

function M.parse_args(argv)
  local o = {}
  local i = 1
  while i <= #argv do
    local a = argv[i]
    if a == "--help" or a == "-h" then o.help = true; i = i + 1
    else
      local key, inline = a:match("^%-%-([%w%-_]+)=(.*)$")
      key = key or a:match("^%-%-([%w%-_]+)$")
      key = key and key:gsub("_", "-")   -- --tokenizer_pre is --tokenizer-pre
      if not key or not export_flags[key] then
        error(("export: unknown argument '%s'\n\n%s"):format(a, M.usage), 0)
      end
      local v = inline or argv[i + 1]
      if v == nil then error(("export: --%s needs a value\n\n%s"):format(key, M.usage), 0) end
      o[key] = v
      i = i + (inline and 1 or 2)
    end
  end
  if o.help then return o end
  if not o.model then error("export: missing --model DIR\n\n" .. M.usage, 0) end
  if not o.gguf then error("export: missing --gguf OUT.gguf\n\n" .. M.usage, 0) end
  if o.type and not M.types[o.type] then
    error(("export: --type %s: expected f32, bf16, f16 or q8_0"):format(o.type), 0)
  end
  return o
end

local function human_bytes(n)
  if n >= 2 ^ 30 then return ("%.2f GiB"):format(n / 2 ^ 30) end
  return ("%.1f MiB"):format(n / 2 ^ 20)
end

function M.main(...)
  local o = M.parse_args({ ... })
  if o.help then io.write(M.usage) return 0 end
  fs.check_output(o.gguf, "export --gguf", { parent = true })   -- before minutes of loading
  o.model = require("remax.formats.hf_cache").model_dir(o.model, "export: --model")   -- a folder or a cached name
  require("remax.bind.lora").register()   -- --model may be a LoRA checkpoint (adapters over their base)
  local now = require("remax.bind.clock").now
  local t0 = now()
  -- weights stay as the checkpoint stores them (bf16 or f32): half the memory for a bf16 one,
  -- and any --type is made from the stored values
  local model = require("remax.bind.model").load(o.model, { weight_dtype = "auto" })
  local tok_dir = fs.exists(o.model .. "/tokenizer.json") and o.model or model.source_dir
  if not tok_dir or not fs.exists(tok_dir .. "/tokenizer.json") then
    error(("export: %s has no tokenizer.json (nor has the base model); llama.cpp needs the vocabulary"):format(o.model), 0)
  end
  local tok = require("remax.bind.tokenizer").load(tok_dir)
  local wtype = o.type
  if not wtype then
    local td = json_value((model.config or {}).torch_dtype)
    wtype = (td == "bfloat16" and "bf16") or (td == "float16" and "f16") or "f32"
  end
  local name = o.name or (o.model:gsub("/+$", ""):match("([^/]+)$")) or "remax model"
  local tty = require("remax.bind.fs").is_tty(2)
  local last = -1
  local function progress(done, total, tname)
    local pct = total > 0 and math.floor(100 * done / total) or 100
    if tty then
      io.stderr:write(("\rexport: %3d%%  %s of %s  %s\27[K"):format(pct, human_bytes(done), human_bytes(total), tname))
    elseif pct >= last + 10 or done == total then
      io.stderr:write(("export: %3d%%  %s of %s\n"):format(pct, human_bytes(done), human_bytes(total)))
      last = pct
    end
    io.stderr:flush()
  end
  local out = M.export(model, o.gguf, { type = wtype, tokenizer = tok, pre = o["tokenizer-pre"], name = name,
    progress = progress })
  if tty then io.stderr:write("\n") end
  for _, note in ipairs(out.notes) do print("note: " .. note) end
  print(("wrote %s: %s, %s weights, %d tensors, %s, tokenizer pre %s, %.1f s"):format(o.gguf, out.arch, out.type,
    out.tensors, human_bytes(out.bytes), out.pre, now() - t0))
  return 0
end

return M
