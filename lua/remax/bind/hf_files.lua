-- remax.bind.hf_files: the small JSON files of a Hugging Face folder that remax reads besides
-- the weights and tokenizer.json -- config.json's token ids, generation_config.json,
-- tokenizer_config.json -- checked for what remax uses, with a warning for what it ignores
-- that changes the meaning. Every message names the file and the key. Plain Lua, but here beside
-- the bindings that load a folder (remax.bind.model, remax.bind.tokenizer), which run these
-- checks: bind/ is the bottom layer, below formats/.
--
--   hf_files.check_model_config(cfg, "m/config.json")        -- raises on nonsense
--   local gen = hf_files.generation_config("m", vocab_size)   -- nil when absent
--   hf_files.check_tokenizer_config("m", tok)
--   hf_files.warn("...")                                      -- "remax: warning: ..." once
local cjson = require("cjson")
local fs = require("remax.bind.fs")

local M = {}

M.warnings = {}   -- every warning given, in order (tests read it)
local said = {}

-- Writes "remax: warning: msg" to stderr, once per message.
function M.warn(msg)
  if said[msg] then return end
  if #M.warnings >= 100 then M.warnings, said = {}, {} end   -- a long-lived process stays small
  said[msg] = true
  M.warnings[#M.warnings + 1] = msg
  if not M.quiet then io.stderr:write("remax: warning: ", msg, "\n") end
end

local function value(v) if v == cjson.null then return nil end return v end

local function show(v)
  if v == cjson.null then return "null" end
  if type(v) == "string" then return ("'%s'"):format(v) end
  if type(v) == "table" then
    local ok, s = pcall(cjson.encode, v)
    return ok and s or "a table"
  end
  return tostring(v)
end

-- A JSON file of the folder as a table; nil when the file is absent. A file that is there but
-- unreadable or not a JSON object stops, naming it.
function M.read_json(path)
  if not fs.exists(path) and not fs.is_dir(path) then return nil end
  local text = fs.read_text_file(path)
  local ok, v = pcall(cjson.decode, text)
  if not ok then error(("%s: not valid JSON (%s)"):format(path, tostring(v)), 0) end
  if type(v) ~= "table" or (next(v) ~= nil and #v > 0) then error(("%s: expected a JSON object"):format(path), 0) end
  return v
end

-- A token id key (eos_token_id, ...): an integer in [0, vocab) or a list of them; nil stays nil.
local function token_ids(path, key, v, vocab, allow_negative)
  v = value(v)
  if v == nil then return nil end
  local list = type(v) == "table" and v or { v }
  if type(v) == "table" and #v == 0 and next(v) ~= nil then
    error(("%s: %s = %s: expected a token id or a list of token ids"):format(path, key, show(v)), 0)
  end
  for i, id in ipairs(list) do
    -- pad_token_id = -1 is how some configs say "none"
    if not (allow_negative and id == -1) then
      if type(id) ~= "number" or id ~= math.floor(id) or id < 0 or (vocab and id >= vocab) then
        error(("%s: %s = %s: %s is not a token id%s"):format(path, key, show(v), show(id),
          vocab and (" (the vocabulary has ids 0.." .. (vocab - 1) .. ")") or " (expected an integer >= 0)"), 0)
      end
    end
  end
  return v
end
M.token_ids = token_ids

-- config.json beyond the sizes remax.bind.model.resolve_config checks: the special token ids
-- against the vocabulary, flags that must be booleans, and what remax would misread.
function M.check_model_config(cfg, path)
  local vocab = value(cfg.vocab_size)
  if type(vocab) ~= "number" then vocab = nil end
  for _, key in ipairs({ "eos_token_id", "bos_token_id" }) do token_ids(path, key, cfg[key], vocab) end
  token_ids(path, "pad_token_id", cfg.pad_token_id, vocab, true)
  for _, key in ipairs({ "tie_word_embeddings", "attention_bias", "mlp_bias", "use_sliding_window" }) do
    local v = value(cfg[key])
    if v ~= nil and type(v) ~= "boolean" then
      error(("%s: %s = %s: expected true or false"):format(path, key, show(v)), 0)
    end
  end
  local archs = value(cfg.architectures)
  if type(archs) == "table" then
    if #archs == 0 then
      error(("%s: architectures = []: expected a list naming the model class, e.g. [\"Qwen2ForCausalLM\"]")
        :format(path), 0)
    end
    if #archs > 1 then
      M.warn(("%s: architectures lists %d classes; remax builds the first, %s"):format(path, #archs, show(archs[1])))
    end
  end
  local q = value(cfg.quantization_config)
  if q ~= nil then
    local method = type(q) == "table" and value(q.quant_method) or nil
    error(("%s: quantization_config%s: the weights are quantized, and remax reads weights as stored floats " ..
      "(f32, bf16, f16), so it would misread them; use the unquantized checkpoint"):format(path,
      method and (" (quant_method " .. show(method) .. ")") or ""), 0)
  end
end

-- generation_config.json of a folder, checked (nil when absent): the stop ids remax uses, and
-- the sampling defaults it does not apply but that must still make sense in a file it reads.
function M.generation_config(dir, vocab)
  local path = dir .. "/generation_config.json"
  local gen = M.read_json(path)
  if not gen then return nil end
  for _, key in ipairs({ "eos_token_id", "bos_token_id", "decoder_start_token_id" }) do
    token_ids(path, key, gen[key], vocab)
  end
  token_ids(path, "pad_token_id", gen.pad_token_id, vocab, true)
  local function check(key, ok, expected)
    local v = value(gen[key])
    if v ~= nil and not ok(v) then error(("%s: %s = %s: expected %s"):format(path, key, show(v), expected), 0) end
  end
  local function count(v) return type(v) == "number" and v == math.floor(v) and v >= 1 and v < 2 ^ 31 end
  check("max_new_tokens", count, "a whole number >= 1")
  check("max_length", count, "a whole number >= 1")
  check("min_new_tokens", function(v) return type(v) == "number" and v == math.floor(v) and v >= 0 end, "a whole number >= 0")
  check("temperature", function(v) return type(v) == "number" and v >= 0 and v < math.huge end, "a finite number >= 0")
  check("top_p", function(v) return type(v) == "number" and v > 0 and v <= 1 end, "a number in (0, 1]")
  check("top_k", function(v) return type(v) == "number" and v == math.floor(v) and v >= 0 end, "a whole number >= 0")
  check("do_sample", function(v) return type(v) == "boolean" end, "true or false")
  check("repetition_penalty", function(v) return type(v) == "number" and v > 0 and v < math.huge end, "a finite number > 0")
  return gen
end

-- tokenizer_config.json against the loaded tokenizer: a role token it names (bos_token,
-- eos_token, ...) must be a token; add_bos_token / add_eos_token are booleans, and remax adds
-- what tokenizer.json's post-processor adds (as transformers' fast tokenizers do).
function M.check_tokenizer_config(dir, tok)
  local path = dir .. "/tokenizer_config.json"
  local ok, cfg = pcall(M.read_json, path)
  if not ok or not cfg then return end   -- the C loader already read it (or there is none)
  for _, key in ipairs({ "add_bos_token", "add_eos_token" }) do
    local v = value(cfg[key])
    if v ~= nil and type(v) ~= "boolean" then error(("%s: %s = %s: expected true or false"):format(path, key, show(v)), 0) end
  end
  -- a list of named templates without a "default" one: the tokenizer has none in force (as in
  -- transformers, which asks for a name); the names are kept for the messages that say so
  local ct = value(cfg.chat_template)
  if type(ct) == "table" and not tok.chat_template then
    local names = {}
    for _, entry in ipairs(ct) do
      if type(entry) == "table" and type(value(entry.name)) == "string" then names[#names + 1] = entry.name end
    end
    tok.chat_template_names, tok.chat_template_file = names, path
  end
  local tokenizer_file = tok.path:match("%.json$") and tok.path or (dir .. "/tokenizer.json")
  for _, role in ipairs({ "bos", "eos", "pad", "unk" }) do
    local key = role .. "_token"
    local v = value(cfg[key])
    if type(v) == "table" then v = value(v.content) end
    if type(v) == "string" and tok:token_to_id(v) == nil then
      local adds = value(cfg["add_" .. role .. "_token"]) == true
      if adds or role == "eos" then
        error(("%s: %s = %s is not a token of %s%s"):format(path, key, show(v), tokenizer_file,
          adds and (" but add_" .. role .. "_token = true") or " (generation would never stop on it)"), 0)
      end
      M.warn(("%s: %s = %s is not a token of %s; remax ignores it"):format(path, key, show(v), tokenizer_file))
    end
  end
end

return M
