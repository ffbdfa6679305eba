-- remax.step.model_reward: a learned reward model as a reward function. A Hugging Face
-- Qwen2ForSequenceClassification / LlamaForSequenceClassification folder (the decoder plus a
-- bias-free score head [num_labels = 1, hidden]) scores prompt + completion, rendered with the
-- reward model's own chat template and tokenizer, at the last token that is not padding, as
-- transformers does. Batched, inference only, on the model's device. See docs/rewards.md.
-- (The engine's part, hidden states at a position and the score head, is remax.bind.classifier.)
--
--   rewards = { "gsm8k", "model:path/to/rm" }
--   rewards = { { model = "path/to/rm", weight = 0.5, batch_size = 8, name = "rm" } }
--   local rm = require("remax").reward_model.load("path/to/rm"); rm:score(prompts, completions)
local cjson = require("cjson")
local tensor = require("remax.bind.tensor")
local classifier = require("remax.bind.classifier")
local chat = require("remax.text.chat")
local hf_cache = require("remax.formats.hf_cache")

local M = {}
local RewardModel = {}
RewardModel.__index = RewardModel
M.RewardModel = RewardModel   -- its render, encode and score_ids are what remax.step.reward_model trains with

-- The sequence-classification architectures and the decoder each one wraps.
M.architectures = { Qwen2ForSequenceClassification = "Qwen2ForCausalLM",
  LlamaForSequenceClassification = "LlamaForCausalLM" }

M.DEFAULT_BATCH_SIZE = 16

local function json_value(v) if v == cjson.null then return nil end return v end

-- Loads a reward model folder. opts: dtype ("f32"), device, weight_dtype ("auto": the decoder's
-- weights stay bf16 when the checkpoint stores them in bf16, halving its memory; "f32", "bf16").
-- On cuda with dtype "bf16" the decoder is a frozen bf16 model (bf16 weights alone) unless
-- weight_dtype = "f32". The score head stays f32 (the hidden states are widened to f32 for it).
-- Errors name the folder.
function M.load(dir, opts)
  opts = opts or {}
  if type(dir) ~= "string" or dir == "" then error("reward model: expected a folder path", 2) end
  dir = dir:gsub("/+$", "")
  dir = hf_cache.find(dir) or dir   -- a Hugging Face name found in the cache
  local model_mod = require("remax.bind.model")
  local ok, cfg = pcall(model_mod.read_config, dir)
  if not ok then
    error(("reward model %s: %s"):format(dir, (tostring(cfg):gsub("^[^:]*:%d+: ", ""):gsub("^model%.load: ", ""))), 0)
  end
  local arch = cfg.architectures and json_value(cfg.architectures[1])
  local decoder = M.architectures[arch]
  if not decoder then
    local known = {}
    for k in pairs(M.architectures) do known[#known + 1] = k end
    table.sort(known)
    error(("reward model %s: config.json architecture '%s' is not a sequence classifier remax can run (%s)"):format(
      dir, tostring(arch), table.concat(known, ", ")), 0)
  end
  local labels = json_value(cfg.num_labels)
  if labels == nil and type(cfg.id2label) == "table" then
    labels = 0
    for _ in pairs(cfg.id2label) do labels = labels + 1 end
  end
  labels = labels or 2   -- transformers' PretrainedConfig default
  if labels ~= 1 then
    error(("reward model %s: num_labels = %s; a reward model has one score (num_labels = 1)"):format(dir, tostring(labels)), 0)
  end
  -- the decoder without its language-model head: tied, so no [vocab, hidden] matrix is allocated
  local dcfg = {}
  for k, v in pairs(cfg) do dcfg[k] = v end
  dcfg.architectures = { decoder }
  dcfg.tie_word_embeddings = true
  -- bf16 storage under f32 compute ("auto") is a CPU feature of the engine; on a device under
  -- bf16 compute the decoder is a frozen bf16 model (no f32 masters)
  local on_cpu = (opts.device or "cpu") == "cpu"
  local wdt = opts.weight_dtype or (on_cpu and "auto" or (opts.dtype == "bf16" and "bf16" or nil))
  local okm, model = pcall(model_mod.load, dir, { config = dcfg, dtype = opts.dtype, device = opts.device,
    weight_dtype = wdt,
    skip = { ["score.weight"] = true, ["lm_head.weight"] = true } })
  if not okm then error(("reward model %s: %s"):format(dir, tostring(model)), 0) end
  local st = require("remax.bind.safetensors").open(dir)
  if st:has("score.bias") then st:close(); error(("reward model %s: score.bias is present; the head has no bias"):format(dir), 0) end
  if not st:has("score.weight") then st:close(); error(("reward model %s: tensor 'score.weight' is missing"):format(dir), 0) end
  local hidden = tonumber(model:cfg().hidden_size)
  local info = st:info("score.weight")
  if #info.shape ~= 2 or info.shape[1] ~= 1 or info.shape[2] ~= hidden then
    st:close()
    error(("reward model %s: score.weight has shape [%s], expected [1,%d]"):format(dir, table.concat(info.shape, ","), hidden), 0)
  end
  -- the head in the decoder's dtype (f32 for a bf16 decoder)
  local dtype = tonumber(model:cfg().dtype)
  local head = tensor.new({ 1, hidden }, dtype == tensor.dtype("bf16") and "f32" or dtype)
  st:read_into("score.weight", head)
  st:close()
  local okt, tok = pcall(require("remax.bind.tokenizer").load, dir)
  if not okt then error(("reward model %s: %s"):format(dir, tostring(tok)), 0) end
  local self = setmetatable({ dir = dir, model = model, tok = tok, head = head, padding_free = opts.padding_free ~= false,
    pad_id = json_value(cfg.pad_token_id), max_length = json_value(cfg.max_position_embeddings) }, RewardModel)
  self.template = tok.chat_template and chat.detect(tok.chat_template) and { tokenizer = tok } or { template = "plain" }
  return self
end

-- The text the reward model reads: the conversation (a string prompt is one user message) with
-- the completion as the assistant's reply, in the reward model's chat template.
function RewardModel:render(prompt, completion)
  local messages = {}
  for i, m in ipairs(chat.messages(prompt)) do messages[i] = m end
  messages[#messages + 1] = { role = "assistant", content = completion }
  local o = { add_generation_prompt = false }
  for k, v in pairs(self.template) do o[k] = v end
  return chat.render(messages, o)
end

function RewardModel:encode(text)
  -- templates that write BOS themselves (Llama 3) must not get a second one from the tokenizer
  local bos = self.tok.bos_token
  local has_bos = bos and text:sub(1, #bos) == bos
  return self.tok:encode(text, { add_special_tokens = not has_bos })
end

-- transformers' pooling: the rightmost position whose token is not pad_token_id (within the
-- row's real tokens); a row of pad tokens only is scored at its last real token.
function M.score_index(ids, pad_id)
  for t = #ids, 1, -1 do
    if pad_id == nil or ids[t] ~= pad_id then return t end
  end
  return #ids
end

-- Scores of token rows (lists of ids), batch_size rows per forward, padded on the right (or
-- the left: the same numbers).
function RewardModel:score_ids(rows, batch_size, pad_left)
  batch_size = batch_size or M.DEFAULT_BATCH_SIZE
  local out = {}
  local dtype = tonumber(self.model:cfg().dtype)
  for first = 1, #rows, batch_size do
    local chunk = {}
    for i = first, math.min(#rows, first + batch_size - 1) do chunk[#chunk + 1] = rows[i] end
    local tok, mask = require("remax.bind.model").pad_rows(chunk, pad_left)
    local T = tok:size(2)
    local positions = {}
    for b, ids in ipairs(chunk) do positions[b] = (pad_left and T - #ids or 0) + M.score_index(ids, self.pad_id) - 1 end
    local h, err = classifier.hidden_at(self.model, tok, mask, positions)
    if not h then error(("reward model %s: %s"):format(self.dir, err), 0) end
    if dtype == tensor.dtype("bf16") then h = h:to("f32") end   -- a bf16 decoder: the head in f32
    local s = classifier.head(h, self.head, 2)
    for b = 1, #chunk do out[first + b - 1] = s:get(b, 1) end
  end
  return out
end

-- The same scores through packed forwards (padding-free): batch_size rows end to end per
-- forward, attention within each row, the hidden state read at each row's scoring position
-- (rx_model_hidden_at_packed). No padding is computed; the numbers are the padded ones up to
-- summation order.
function RewardModel:score_ids_packed(rows, batch_size)
  batch_size = batch_size or M.DEFAULT_BATCH_SIZE
  local out = {}
  local dtype = tonumber(self.model:cfg().dtype)
  for first = 1, #rows, batch_size do
    local last = math.min(#rows, first + batch_size - 1)
    local chunk, positions = {}, {}
    for i = first, last do
      chunk[#chunk + 1] = rows[i]
      positions[#positions + 1] = M.score_index(rows[i], self.pad_id) - 1
    end
    local h, err = classifier.hidden_at_packed(self.model, chunk, positions)
    if not h then error(("reward model %s: %s"):format(self.dir, err), 0) end
    if dtype == tensor.dtype("bf16") then h = h:to("f32") end
    local s = classifier.head(h, self.head, 2)
    for b = 1, #chunk do out[first + b - 1] = s:get(b, 1) end
  end
  return out
end

-- Scores of completions of prompts (strings or message lists), one number each: packed
-- (score_ids_packed) unless self.padding_free is false (padding_free = false: padded batches).
function RewardModel:score(prompts, completions, batch_size)
  local rows = {}
  for i, c in ipairs(completions) do
    local prompt = prompts[i]
    if prompt == nil then error(("reward model %s: completion %d has no prompt"):format(self.dir, i), 0) end
    local ids = self:encode(self:render(prompt, c))
    if #ids == 0 then error(("reward model %s: completion %d renders to no tokens"):format(self.dir, i), 0) end
    if self.max_length and #ids > self.max_length then
      error(("reward model %s: completion %d is %d tokens with its prompt, more than max_position_embeddings = %d"):format(
        self.dir, i, #ids, self.max_length), 0)
    end
    rows[i] = ids
  end
  if self.padding_free == false then return self:score_ids(rows, batch_size) end
  return self:score_ids_packed(rows, batch_size)
end

-- "model:path" or {model = path, weight =, batch_size =, name =} -> a reward {name=, fn=,
-- weight=, where=}. The model loads once, when the reward is made.
function M.is_spec(spec)
  return (type(spec) == "string" and spec:sub(1, 6) == "model:") or (type(spec) == "table" and spec.model ~= nil
    and spec.fn == nil)
end

function M.reward(spec, opts)
  opts = opts or {}
  local path, weight, batch_size, name
  if type(spec) == "string" then path = spec:sub(7)
  else path, weight, batch_size, name = spec.model, spec.weight, spec.batch_size, spec.name end
  if type(path) ~= "string" or path == "" then error("reward model: model = must be a folder path", 0) end
  if weight ~= nil and type(weight) ~= "number" then error(("reward model %s: weight must be a number"):format(path), 0) end
  if batch_size ~= nil and (type(batch_size) ~= "number" or batch_size < 1 or batch_size ~= math.floor(batch_size)) then
    error(("reward model %s: batch_size = %s must be an integer >= 1"):format(path, tostring(batch_size)), 0)
  end
  local rm = M.load(path, { dtype = opts.dtype, device = opts.device })
  rm.padding_free = opts.padding_free ~= false   -- the Step sets it from the run's padding_free (rewards.run_one)
  local r = { name = name or ("rm:" .. (path:gsub("/+$", ""):match("([^/]+)$") or path)), weight = weight,
    model_dir = path, reward_model = rm, where = "reward model " .. path, file = nil }
  r.fn = function(completions, batch)
    local prompts = batch and batch.prompt
    if type(prompts) ~= "table" then error(("reward model %s: the batch has no prompt column"):format(path), 0) end
    return rm:score(prompts, completions, batch_size)
  end
  return r
end

return M
