-- remax.bind.tokenizer: Hugging Face byte-level BPE tokenizers (tokenizer.json) over the C engine.
--
--   local tok = remax.tokenizer.load("path/to/model")   -- dir/tokenizer.json (+ tokenizer_config.json)
--   local ids = tok:encode("Hello")                      -- { 9707 }  (0-based token ids, as in HF)
--   local s   = tok:decode(ids)                          -- "Hello"
--   tok.vocab_size, tok.eos_id, tok.pad_id, tok.bos_id, tok.eos_token, tok.chat_template
--   (chat_template: chat_template.jinja beside tokenizer.json, else tokenizer_config.json's)
local ffi = require("ffi")
local rx = require("remax.bind.ffi")
local C = rx.C

local M = {}

local Tokenizer = {}
Tokenizer.__index = Tokenizer

local function cstring(p, n)
  if p == nil then return nil end
  return n and ffi.string(p, n) or ffi.string(p)
end

--- Loads a tokenizer from a tokenizer.json file or a directory holding one.
function M.load(path)
  assert(type(path) == "string", "remax.tokenizer.load: path must be a string")
  local out = ffi.new("rx_tokenizer*[1]")
  rx.check(C.rx_tokenizer_load(out, path), 2)
  local h = ffi.gc(out[0], C.rx_tokenizer_free)
  local self = setmetatable({ handle = h, path = path }, Tokenizer)
  self.vocab_size = C.rx_tokenizer_vocab_size(h)
  local roles = { eos = C.RX_TOK_EOS, pad = C.RX_TOK_PAD, bos = C.RX_TOK_BOS, unk = C.RX_TOK_UNK }
  for name, role in pairs(roles) do
    local token = cstring(C.rx_tokenizer_role_token(h, role))
    self[name .. "_token"] = token
    self[name .. "_id"] = token and self:token_to_id(token) or nil
  end
  -- the role tokens tokenizer_config.json names (what transformers hands a chat template)
  self.special_tokens = { bos_token = self.bos_token, eos_token = self.eos_token, pad_token = self.pad_token,
    unk_token = self.unk_token }
  -- Hugging Face pads with EOS when no pad token is named.
  if self.pad_id == nil then self.pad_token, self.pad_id = self.eos_token, self.eos_id end
  self.chat_template = cstring(C.rx_tokenizer_chat_template(h))
  -- the folder of tokenizer.json: chat_template.jinja there wins over tokenizer_config.json's
  -- (as in transformers, which writes the template to that file since 4.43)
  local dir = path:match("%.json$") and (path:match("^(.*)/[^/]*$") or ".") or path
  self.chat_template_path = self.chat_template and (dir .. "/tokenizer_config.json chat_template") or nil
  if self.vocab_size < 1 then error(("%s: the tokenizer has no tokens (an empty vocabulary)"):format(path), 0) end
  require("remax.bind.hf_files").check_tokenizer_config(dir, self)
  local f = io.open(dir .. "/chat_template.jinja", "rb")
  if f then
    self.chat_template = f:read("*a")
    self.chat_template_path = dir .. "/chat_template.jinja"
    f:close()
  end
  return self
end

--- Encodes a string to a Lua array of ids. opts.add_special_tokens (default true, as in Hugging
--- Face) applies the file's post-processor template, e.g. a BOS token.
function Tokenizer:encode(text, opts)
  assert(type(text) == "string", "tokenizer:encode: text must be a string")
  local flags = 0
  if not opts or opts.add_special_tokens ~= false then flags = C.RX_TOK_ADD_SPECIAL end
  local cap = #text + 16
  local buf = ffi.new("int32_t[?]", cap)
  local n = ffi.new("int64_t[1]")
  local rc = C.rx_tokenizer_encode(self.handle, text, #text, flags, buf, cap, n)
  if rc ~= 0 and n[0] > cap then   -- NFC made the text longer: retry with the exact size
    cap = tonumber(n[0])
    buf = ffi.new("int32_t[?]", cap)
    rc = C.rx_tokenizer_encode(self.handle, text, #text, flags, buf, cap, n)
  end
  rx.check(rc, 2)
  local ids = {}
  for i = 0, tonumber(n[0]) - 1 do ids[i + 1] = buf[i] end
  return ids
end

--- Decodes ids (a Lua array) to the exact bytes. opts.skip_special_tokens leaves out special
--- tokens. The result may end inside a UTF-8 sequence: see M.incomplete_utf8_tail.
function Tokenizer:decode(ids, opts)
  local n = #ids
  local arr = ffi.new("int32_t[?]", n > 0 and n or 1)
  for i = 1, n do arr[i - 1] = ids[i] end
  local flags = (opts and opts.skip_special_tokens) and C.RX_TOK_SKIP_SPECIAL or 0
  local cap = n * 8 + 16
  local buf = ffi.new("char[?]", cap)
  local len = ffi.new("int64_t[1]")
  local rc = C.rx_tokenizer_decode(self.handle, arr, n, flags, buf, cap, len)
  if rc ~= 0 and len[0] > cap then
    cap = tonumber(len[0])
    buf = ffi.new("char[?]", cap)
    rc = C.rx_tokenizer_decode(self.handle, arr, n, flags, buf, cap, len)
  end
  rx.check(rc, 2)
  return ffi.string(buf, len[0])
end

--- The id of a token as written in tokenizer.json ("Ġthe", "<|im_end|>"), or nil.
function Tokenizer:token_to_id(s)
  local id = C.rx_tokenizer_token_to_id(self.handle, s, #s)
  if id < 0 then return nil end
  return id
end

--- The token string for an id as written in tokenizer.json, or nil.
function Tokenizer:id_to_token(id)
  local len = ffi.new("int64_t[1]")
  local p = C.rx_tokenizer_id_to_token(self.handle, id, len)
  if p == nil then return nil end
  return ffi.string(p, len[0])
end

function Tokenizer:is_special(id) return C.rx_tokenizer_is_special(self.handle, id) ~= 0 end

--- Ids of all special added tokens, ascending.
function Tokenizer:special_ids()
  local n = tonumber(C.rx_tokenizer_special_ids(self.handle, nil, 0))
  local buf = ffi.new("int32_t[?]", n > 0 and n or 1)
  C.rx_tokenizer_special_ids(self.handle, buf, n)
  local out = {}
  for i = 0, n - 1 do out[i + 1] = buf[i] end
  return out
end

-- Token ids generation stops at, without duplicates, in this order: tok's EOS (tok may be nil: a
-- model folder without a tokenizer); with
-- opts.chat_ends, the chat turn ends <|im_end|>, <|endoftext|>, <|eot_id|> that this tokenizer
-- has; generation_config.json's eos_token_id in model_dir (a number or a list: Llama 3.2 Instruct
-- also stops on <|eom_id|>); opts.names (tokens as written in tokenizer.json; one that is not a
-- token stops with its name); opts.ids.
function M.stop_ids(tok, model_dir, opts)
  opts = opts or {}
  local ids, seen = {}, {}
  local function add(id)
    if type(id) == "number" and not seen[id] then seen[id] = true; ids[#ids + 1] = id end
  end
  if tok then add(tok.eos_id) end
  if tok and opts.chat_ends then
    for _, s in ipairs({ "<|im_end|>", "<|endoftext|>", "<|eot_id|>" }) do add(tok:token_to_id(s)) end
  end
  -- generation_config.json, its ids checked against the model's vocabulary (config.json), else
  -- the tokenizer's
  local gen
  if model_dir then
    local hf_files = require("remax.bind.hf_files")
    local mc = hf_files.read_json(model_dir .. "/config.json")
    local vocab = mc and type(mc.vocab_size) == "number" and mc.vocab_size or (tok and tok.vocab_size)
    gen = hf_files.generation_config(model_dir, vocab)
  end
  if gen then
    local e = gen.eos_token_id
    if type(e) == "table" then for _, id in ipairs(e) do add(id) end else add(e) end
  end
  for _, s in ipairs(opts.names or {}) do
    local id = tok and tok:token_to_id(s)
    if not id then error(("stop: '%s' is not a token of this tokenizer"):format(s), 0) end
    add(id)
  end
  for _, id in ipairs(opts.ids or {}) do add(id) end
  return ids
end

--- How many trailing bytes of s begin a UTF-8 character that is not complete yet (0..3):
--- a streaming decoder prints s minus those bytes and keeps them for the next token.
function M.incomplete_utf8_tail(s)
  return tonumber(C.rx_utf8_incomplete_tail(s, #s))
end

--- Unicode NFC of s (invalid UTF-8 bytes pass through unchanged).
function M.nfc(s)
  local cap = 3 * #s + 16
  local buf = ffi.new("char[?]", cap)
  local n = ffi.new("int64_t[1]")
  rx.check(C.rx_unicode_nfc(s, #s, buf, cap, n), 2)
  return ffi.string(buf, n[0])
end

-- ---------------------------------------------------------------- byte-level tokenizer

M.byte_level_specials = { "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|pad|>" }

local function json_string(s)
  return '"' .. s:gsub('[%c"\\]', function(c)
    local named = { ['"'] = '\\"', ["\\"] = "\\\\", ["\n"] = "\\n", ["\r"] = "\\r", ["\t"] = "\\t" }
    return named[c] or string.format("\\u%04x", c:byte())
  end) .. '"'
end

local function utf8_char(cp)
  if cp < 0x80 then return string.char(cp) end
  return string.char(0xC0 + math.floor(cp / 64), 0x80 + cp % 64)   -- cp < 0x800 here
end

-- GPT-2's byte -> printable character table (the alphabet of byte-level BPE files).
local function byte_chars()
  local out, k = {}, 0
  for b = 0, 255 do
    local printable = (b >= 33 and b <= 126) or (b >= 161 and b <= 172) or (b >= 174 and b <= 255)
    if printable then out[b] = utf8_char(b) else out[b] = utf8_char(256 + k); k = k + 1 end
  end
  return out
end

--- The tokenizer.json text of the byte-level tokenizer of the built-in tiny models: ids 0..255
--- are the bytes, then the specials; no merges, no normalizer, no regex split.
function M.byte_level_json()
  local chars = byte_chars()
  local vocab, added = {}, {}
  for b = 0, 255 do vocab[#vocab + 1] = "    " .. json_string(chars[b]) .. ": " .. b end
  for i, s in ipairs(M.byte_level_specials) do
    vocab[#vocab + 1] = "    " .. json_string(s) .. ": " .. (255 + i)
    added[#added + 1] = string.format(
      '    {"id": %d, "content": %s, "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}',
      255 + i, json_string(s))
  end
  return table.concat({
    "{",
    '  "version": "1.0",',
    '  "truncation": null,',
    '  "padding": null,',
    '  "added_tokens": [\n' .. table.concat(added, ",\n") .. "\n  ],",
    '  "normalizer": null,',
    '  "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false},',
    '  "post_processor": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false},',
    '  "decoder": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false},',
    '  "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,',
    '    "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,',
    '    "vocab": {\n' .. table.concat(vocab, ",\n") .. "\n    },",
    '    "merges": []',
    "  }",
    "}",
    "",
  }, "\n")
end

function M.byte_level_config_json()
  return table.concat({
    "{",
    '  "tokenizer_class": "PreTrainedTokenizerFast",',
    '  "bos_token": null,',
    '  "eos_token": "<|endoftext|>",',
    '  "pad_token": "<|pad|>",',
    '  "unk_token": null,',
    '  "clean_up_tokenization_spaces": false,',
    '  "model_max_length": 1048576',
    "}",
    "",
  }, "\n")
end

local function write_atomic(path, text)
  local tmp = path .. ".tmp"
  local f = assert(io.open(tmp, "wb"))
  assert(f:write(text))
  assert(f:close())
  assert(os.rename(tmp, path))
end

--- Writes dir/tokenizer.json and dir/tokenizer_config.json of the byte-level tokenizer
--- (dir must exist). Returns dir.
function M.write_byte_level(dir)
  write_atomic(dir .. "/tokenizer.json", M.byte_level_json())
  write_atomic(dir .. "/tokenizer_config.json", M.byte_level_config_json())
  return dir
end

return M
