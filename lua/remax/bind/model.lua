-- remax.bind.model: Llama / Qwen2 decoders from Hugging Face checkpoints (or random), their
-- log-probabilities, gradients and checkpoints.
--
--   local model = remax.model.load("path/to/model")
--   local lp = model:logprobs({{1, 2, 3}, {4, 5}})      -- [B, T]: log p(token_t | tokens_<t)
--   model:backward(dlogp)                                -- accumulates gradients
--   model:save("path/to/out")
local ffi = require("ffi")
local cjson = require("cjson")
local rx = require("remax.bind.ffi")
local tensor = require("remax.bind.tensor")
local C, check = rx.C, rx.check

local M = {}
local Model = {}
Model.__index = Model
M.Model = Model

M.architectures = { Qwen2ForCausalLM = "qwen2", Qwen3ForCausalLM = "qwen3", LlamaForCausalLM = "llama" }

local fs = require("remax.bind.fs")
local write_atomic = fs.write_atomic

local function read_file(path)
  local text = fs.read_text(path)
  if not text then return nil, fs.exists(path) and "cannot read it" or "no such file" end
  return text
end

local function json_value(v)
  if v == cjson.null then return nil end
  return v
end

-- Resolves a Hugging Face config table into the engine's rx_model_config, checking every key
-- the engine relies on. `where` names the source in messages.
function M.resolve_config(cfg, where)
  where = where or "config"
  -- Sizes are whole numbers from 1 to 2^31 - 1: a fraction, NaN, infinity or a huge value is a
  -- broken file, said here rather than truncated or wrapped by the conversion to int64.
  local function size(key, v)
    if type(v) ~= "number" then
      error(("%s: key '%s' is %s, expected a number"):format(where, key, v == nil and "missing" or type(v)), 4)
    end
    if not (v >= 1 and v < 2 ^ 31 and v == math.floor(v)) then
      error(("%s: key '%s' is %s, expected a whole number from 1 to 2^31 - 1"):format(where, key, tostring(v)), 4)
    end
    return v
  end
  local function need(key) return size(key, json_value(cfg[key])) end
  local function optional(key, default)
    local v = json_value(cfg[key])
    if v == nil then return default end
    return size(key, v)
  end
  local function positive(key, default)
    local v = json_value(cfg[key])
    if v == nil then return default end
    if type(v) ~= "number" or not (v > 0 and v < math.huge) then
      error(("%s: key '%s' is %s, expected a positive number"):format(where, key, tostring(v)), 3)
    end
    return v
  end
  require("remax.bind.hf_files").check_model_config(cfg, where)
  local archs = json_value(cfg.architectures)
  if archs ~= nil and type(archs) ~= "table" then
    error(("%s: key 'architectures' is a %s, expected a list of names"):format(where, type(archs)), 2)
  end
  local arch = archs and json_value(archs[1]) or "Qwen2ForCausalLM"
  local family = M.architectures[arch]
  if not family then
    local known = {}
    for k in pairs(M.architectures) do known[#known + 1] = k end
    table.sort(known)
    error(("%s: architecture '%s' is not supported (supported: %s)"):format(where, tostring(arch), table.concat(known, ", ")), 2)
  end
  local rs = json_value(cfg.rope_scaling)
  local rope_kind = "default"
  if rs ~= nil then
    rope_kind = type(rs) == "table" and json_value(rs.rope_type or rs.type) or tostring(rs)
    if rope_kind ~= "default" and rope_kind ~= "llama3" then
      error(("%s: rope_scaling of type '%s' is not supported (supported: none, 'default', 'llama3')"):format(
        where, tostring(rope_kind)), 2)
    end
  end
  if json_value(cfg.use_sliding_window) == true then
    error(where .. ": use_sliding_window = true is not supported (sliding-window attention)", 2)
  end
  local act = json_value(cfg.hidden_act) or "silu"
  if act ~= "silu" then error(("%s: hidden_act '%s' is not supported (silu)"):format(where, tostring(act)), 2) end
  local heads = need("num_attention_heads")
  local hidden = need("hidden_size")
  local out = ffi.new("rx_model_config")
  out.vocab_size = need("vocab_size")
  out.hidden_size = hidden
  out.intermediate_size = need("intermediate_size")
  out.num_hidden_layers = need("num_hidden_layers")
  out.num_attention_heads = heads
  out.num_key_value_heads = optional("num_key_value_heads", heads)
  out.head_dim = optional("head_dim", math.max(1, math.floor(hidden / heads)))
  out.max_position_embeddings = optional("max_position_embeddings", 32768)
  out.rms_norm_eps = positive("rms_norm_eps", 1e-6)
  out.rope_theta = positive("rope_theta", 10000)
  if rope_kind == "llama3" then
    local function scaling(key)
      local v = json_value(rs[key])
      if type(v) ~= "number" then
        error(("%s: rope_scaling.%s is %s, expected a number (rope_type 'llama3')"):format(
          where, key, v == nil and "missing" or type(v)), 3)
      end
      return v
    end
    out.rope_scaling = C.RX_ROPE_LLAMA3
    out.rope_factor = scaling("factor")
    out.rope_low_freq_factor = scaling("low_freq_factor")
    out.rope_high_freq_factor = scaling("high_freq_factor")
    out.rope_original_max_position_embeddings = scaling("original_max_position_embeddings")
  end
  out.tie_word_embeddings = json_value(cfg.tie_word_embeddings) and 1 or 0
  local bias = json_value(cfg.attention_bias)
  if bias == nil then bias = (family == "qwen2") end
  out.attention_bias = bias and 1 or 0
  out.qk_norm = family == "qwen3" and 1 or 0
  if json_value(cfg.mlp_bias) then error(where .. ": mlp_bias = true is not supported", 2) end
  return out, family
end

local function wrap(handle, cfg_table, opts)
  local self = setmetatable({ handle = handle, config = cfg_table, opts = opts or {} }, Model)
  self.names, self.index = {}, {}
  local n = tonumber(C.rx_model_param_count(handle))
  for i = 0, n - 1 do
    local name = ffi.string(C.rx_model_param_name(handle, i))
    self.names[#self.names + 1] = name
    self.index[name] = i
  end
  return self
end

local function create(cfg_table, opts, where)
  opts = opts or {}
  local cfg = M.resolve_config(cfg_table, where)
  cfg.dtype = tensor.dtype(opts.dtype or "f32")
  -- weight_dtype: trainable weights in the compute dtype (f32 masters under bf16 compute), or
  -- bf16: frozen weights (bf16 matrices under f32 compute on the cpu; every parameter in bf16
  -- alone under bf16 compute on cuda: no masters, no gradients)
  cfg.weight_dtype = cfg.dtype == C.RX_BF16 and C.RX_F32 or cfg.dtype
  if opts.weight_dtype ~= nil and opts.weight_dtype ~= "auto" then
    local ok, wdt = pcall(tensor.dtype, opts.weight_dtype)
    if not ok or (wdt ~= cfg.dtype and wdt ~= C.RX_BF16 and wdt ~= C.RX_F32) then
      error(("%s: weight_dtype '%s': expected f32 (trainable weights) or bf16 (frozen weights, a half or a third of the memory)"):format(
        where, tostring(opts.weight_dtype)), 3)
    end
    cfg.weight_dtype = wdt
  end
  local device = tensor.device_id(opts.device or "cpu")
  if not device then
    error(("%s: device '%s' is not a device remax knows (%s)"):format(where, tostring(opts.device), tensor.device_list), 3)
  end
  cfg.device = device
  local out = ffi.new("rx_model*[1]")
  check(C.rx_model_new(out, cfg), 3)
  return wrap(ffi.gc(out[0], C.rx_model_free), cfg_table, opts)
end

-- A randomly initialised model: weights ~ N(0, initializer_range), norms 1, biases 0.
-- Random numbers come from Philox keyed by (seed, parameter), so any config is reproducible.
function M.new(cfg_table, opts)
  opts = opts or {}
  local self = create(cfg_table, opts, "model.new")
  local std = opts.init_std or json_value(cfg_table.initializer_range) or 0.02
  local seed = opts.seed or 0
  for i, name in ipairs(self.names) do
    local p = C.rx_model_param(self.handle, i - 1)
    if name:match("norm%.weight$") then p:fill_(1)
    elseif name:match("%.bias$") then p:fill_(0)
    else p:normal_(seed, i * 2 ^ 40, 0, std) end
  end
  return self
end

-- config.json of a Hugging Face folder as a table.
function M.read_config(dir)
  local cfg_path = dir .. "/config.json"
  local text, err = read_file(cfg_path)
  if not text then error(("model.load: cannot read %s (%s)"):format(cfg_path, tostring(err)), 3) end
  local ok, cfg_table = pcall(cjson.decode, text)
  if not ok or type(cfg_table) ~= "table" then
    error(("model.load: %s is not a JSON object (%s)"):format(cfg_path, tostring(cfg_table)), 3)
  end
  return cfg_table, cfg_path
end

-- Loads config.json and model.safetensors (or a sharded index) from a Hugging Face folder.
-- opts.config: the config table to use instead of the folder's config.json (a caller that
-- adapts it, e.g. a reward model's); opts.skip: tensor names of the checkpoint to leave unread.
function M.load(dir, opts)
  opts = opts or {}
  if not opts.config and not fs.exists(dir .. "/config.json") and fs.exists(dir .. "/adapter_config.json") then
    -- a PEFT adapter folder (a LoRA checkpoint): remax.bind.lora.register() installs its loader
    if not M.adapter_loader then
      error(("model.load: %s is a LoRA adapter folder; load it with require(\"remax.bind.lora\").load_with_base"):format(dir), 2)
    end
    return M.adapter_loader(dir, opts)
  end
  local cfg_table, cfg_path
  if opts.config then cfg_table, cfg_path = opts.config, dir .. "/config.json"
  else cfg_table, cfg_path = M.read_config(dir) end
  local st = require("remax.bind.safetensors").open(dir)
  if opts.weight_dtype == "auto" then
    local o = {}
    for k, v in pairs(opts) do o[k] = v end
    o.weight_dtype = tensor.dtype(opts.dtype or "f32") == C.RX_F32 and M.stored_weight_dtype(st, opts.skip) or nil
    opts = o
  end
  local self = create(cfg_table, opts, cfg_path)
  self.source_dir = dir
  local in_file = {}
  for _, name in ipairs(st:names()) do in_file[name] = true end
  for i, name in ipairs(self.names) do
    if not in_file[name] then
      error(("model.load: %s: tensor '%s' is missing (config.json wants it)"):format(dir, name), 2)
    end
    local info = st:info(name)
    local p = C.rx_model_param(self.handle, i - 1)
    local want = p:size()
    if table.concat(info.shape, ",") ~= table.concat(want, ",") then
      error(("model.load: %s: tensor '%s' has shape [%s] in the checkpoint, config.json wants [%s]"):format(
        dir, name, table.concat(info.shape, ","), table.concat(want, ",")), 2)
    end
    st:read_into(name, p)
    in_file[name] = nil
  end
  for name in pairs(in_file) do
    -- tied checkpoints sometimes keep a copy of the head; rotary caches are derived, not learned
    local harmless = name:match("rotary_emb%.inv_freq$") or (name == "lm_head.weight" and self:tied())
      or (opts.skip and opts.skip[name])
    if not harmless then
      error(("model.load: %s: tensor '%s' is in the checkpoint but not in a %s model of this config"):format(
        dir, name, tostring(cfg_table.architectures and cfg_table.architectures[1] or "Qwen2ForCausalLM")), 2)
    end
  end
  return self
end

-- "bf16" when a checkpoint stores every weight matrix in bf16 (keeping them in bf16 then loses
-- nothing: the "auto" storage of frozen copies), else "f32". skip: names not to look at.
function M.stored_weight_dtype(st, skip)
  local any = false
  for _, name in ipairs(st:names()) do
    local info = st:info(name)
    if #info.shape == 2 and not name:match("rotary_emb") and not (skip and skip[name]) then
      if info.format ~= "BF16" then return "f32" end
      any = true
    end
  end
  return any and "bf16" or "f32"
end

-- The dtype the weight matrices are kept in ("f32" or "bf16").
function Model:weight_dtype()
  return ffi.string(C.rx_dtype_name(C.rx_model_weight_dtype(C.rx_model_get_config(self.handle))))
end

-- The dtype the weight matrices' GEMMs read ("bf16" for a bf16 model, whose working copy they
-- read, or for bf16 storage; else the compute dtype). A bf16 model on the cpu computes its
-- activations in f32, so its cfg().dtype reads f32.
function Model:gemm_dtype()
  return ffi.string(C.rx_dtype_name(C.rx_model_gemm_dtype(self.handle)))
end

function Model:tied() return C.rx_model_get_config(self.handle).tie_word_embeddings ~= 0 end
function Model:cfg() return C.rx_model_get_config(self.handle) end

-- Where the parameters, gradients and activations live: "cpu" or "cuda".
function Model:device_name() return tensor.device_name(self:cfg().device) end

-- The dtype of statistics (log-probs, entropies and their gradients): f32 for a bf16 model.
local function stats_dtype(self)
  local dt = tonumber(self:cfg().dtype)
  return dt == tonumber(C.RX_BF16) and tonumber(C.RX_F32) or dt
end

-- name -> tensor views of the parameters (valid while the model lives).
function Model:params()
  local t = {}
  for i, name in ipairs(self.names) do t[name] = C.rx_model_param(self.handle, i - 1) end
  return t
end

function Model:grads()
  local t = {}
  for i, name in ipairs(self.names) do t[name] = C.rx_model_grad(self.handle, i - 1) end
  return t
end

function Model:param(name)
  local i = self.index[name]
  if not i then error(("no parameter named '%s'"):format(tostring(name)), 2) end
  return C.rx_model_param(self.handle, i)
end

function Model:grad(name)
  local i = self.index[name]
  if not i then error(("no parameter named '%s'"):format(tostring(name)), 2) end
  return C.rx_model_grad(self.handle, i)
end

function Model:zero_grad() C.rx_model_zero_grad(self.handle) end

-- Adapters (LoRA) install themselves on a model: model.lora holds their description and
-- model.adapters the module that owns them (params, num_parameters, save), so this binding
-- never requires remax.bind.lora. M.adapter_loader, set by that module, loads adapter folders.
M.adapter_loader = nil

-- What an optimizer updates: name -> tensor tables of parameters and gradients: the adapters
-- when the model has LoRA adapters (the base is frozen), else every parameter.
function Model:trainable()
  if self.adapters then return self.adapters.params(self) end
  return self:params(), self:grads()
end

-- The gradients of the trained tensors as a list in a fixed order (the adapters' with LoRA, else
-- every parameter's): what micro-batches accumulate and ranks all-reduce.
function Model:trainable_grads()
  local list = {}
  if self.lora then
    for i = 1, #self.lora.names do list[i] = C.rx_model_lora_grad(self.handle, i - 1) end
  else
    for i = 1, #self.names do list[i] = C.rx_model_grad(self.handle, i - 1) end
  end
  return list
end

-- The trained tensors as the engine lays them out (rx_model_flat): { params, grads = two 1-D
-- views over one arena each (the adapters' with LoRA, else every parameter's; alignment padding
-- between tensors, always 0), n = their elements, matrices = how many of them hold weight
-- matrices (they come first), names = the trained tensors' names, offsets = name -> its first
-- element in both }. Made once per model (the views live as long as the model); it allocates the
-- gradients if none exist yet. Fails for a model with frozen (bf16-stored) weights.
function Model:flat()
  if self.flat_layout then return self.flat_layout end
  local p, g, mat = ffi.new("rx_tensor*[1]"), ffi.new("rx_tensor*[1]"), ffi.new("int64_t[1]")
  check(C.rx_model_flat(self.handle, p, g, mat), 2)
  local names = self.lora and self.lora.names or self.names
  local params = self:trainable()
  local out = { params = p[0], grads = g[0], n = tonumber(p[0].numel), matrices = tonumber(mat[0]), names = names,
    offsets = {} }
  local base, es = ffi.cast("char*", p[0].data), tonumber(C.rx_dtype_size(p[0].dtype))
  for _, name in ipairs(names) do
    local t = params[name]
    local at = tonumber(ffi.cast("char*", t.data) - base) / es
    if at < 0 or at + tonumber(t.numel) > out.n or at % 1 ~= 0 then   -- the engine's promise, checked once
      error(("model:flat(): %s lies outside the flat buffer of %d elements (at %s)"):format(name, out.n, tostring(at)), 2)
    end
    out.offsets[name] = at
  end
  self.flat_layout = out
  return out
end

-- Gradient accumulation over micro-batches: each micro-batch's gradient is computed from zero and
-- then added to the sum of the earlier ones (G1 + G2 + ...), so one process with two micro-batches
-- and two ranks with one each (summed by the all-reduce) give the same bits. hold_grads moves the
-- sum so far aside (one buffer the size of the flat gradient buffer, on the model's device, made
-- on first use) and zeroes the gradients; add_held_grads adds it back after the next
-- micro-batch's backward: one copy and one add over the whole buffer.
function Model:hold_grads()
  local g = self:flat().grads
  if not self.held then self.held = tensor.new({ tonumber(g.numel) }, g:dtype_name(), g:device_name()) end
  self.held:copy_(g)
  self:zero_grad()
end

function Model:add_held_grads()
  local g = self:flat().grads
  check(C.rx_add(g, g, self.held))
end

function Model:num_trainable()
  if self.adapters then return self.adapters.num_parameters(self) end
  return self:num_parameters()
end

function Model:num_parameters()
  local n = 0
  for i = 1, #self.names do n = n + tonumber(C.rx_model_param(self.handle, i - 1).numel) end
  return n
end

-- Token rows (Lua lists of ids, any lengths) -> i32 tokens and mask [B, T], right-padded.
function M.pad_rows(rows, pad_left)
  if type(rows) ~= "table" or #rows == 0 then error("tokens: expected a non-empty list of token rows", 3) end
  local T = 0
  for b, row in ipairs(rows) do
    if type(row) ~= "table" then error(("tokens: row %d is a %s, expected a list of ids"):format(b, type(row)), 3) end
    T = math.max(T, #row)
  end
  if T == 0 then error("tokens: every row is empty", 3) end
  local B = #rows
  local tok, mask = tensor.new({ B, T }, "i32"), tensor.new({ B, T }, "i32")
  local tp, mp = ffi.cast("int32_t*", tok.data), ffi.cast("int32_t*", mask.data)
  for b, row in ipairs(rows) do
    local off = pad_left and (T - #row) or 0
    for t, id in ipairs(row) do
      if type(id) ~= "number" or id ~= math.floor(id) then
        error(("tokens: row %d, position %d: %s is not an integer token id"):format(b, t, tostring(id)), 3)
      end
      tp[(b - 1) * T + off + t - 1] = id
      mp[(b - 1) * T + off + t - 1] = 1
    end
  end
  return tok, mask
end

-- log p(token_t | tokens_<t) as a [B, T] tensor (0 at each row's first token and at padding).
-- tokens: list of rows, or an i32 [B, T] tensor with a mask tensor (nil: no padding).
-- opts: train (keep activations for backward), checkpoint (recompute layers in backward),
-- entropy (also return per-token entropy), head_chunk_rows, head_chunk_vocab.
function Model:logprobs(tokens, mask, opts)
  opts = opts or {}
  if type(tokens) == "table" and not ffi.istype("rx_tensor", tokens) then
    tokens, mask = M.pad_rows(tokens, opts.pad_left)
  end
  local B, T = tokens:size(1), tokens:size(2)
  local dtype = stats_dtype(self)
  local logp = tensor.new({ B, T }, dtype)
  local ent = opts.entropy and tensor.new({ B, T }, dtype) or nil
  local fo = ffi.new("rx_forward_opts")
  fo.train = opts.train and 1 or 0
  fo.checkpoint = opts.checkpoint and 1 or 0
  fo.head_chunk_rows = opts.head_chunk_rows or 0
  fo.head_chunk_vocab = opts.head_chunk_vocab or 0
  check(C.rx_model_logprobs(self.handle, tokens, mask, logp, ent, fo), 2)
  self.last_shape = { B, T }
  return logp, ent, mask
end

-- The same over packed rows (padding-free): rows (Lua lists of ids, each at least one token)
-- laid end to end as [1, N], each computed as if alone (attention within the row, positions
-- restarting at 0). Returns logp [1, N] (0 at each row's first token), entropy [1, N] or nil,
-- and the rows' first indices starts[r] (0-based: row r is logp[0, starts[r] .. starts[r+1]-1],
-- starts[#rows + 1] = N). model:backward then takes dlogp (and dentropy) [1, N].
function Model:logprobs_packed(rows, opts)
  opts = opts or {}
  if type(rows) ~= "table" or #rows == 0 then error("logprobs_packed: expected a non-empty list of token rows", 2) end
  local N, starts = 0, { 0 }
  for r, row in ipairs(rows) do
    if type(row) ~= "table" or #row == 0 then
      error(("logprobs_packed: row %d is %s, expected a list of at least one token id"):format(r,
        type(row) == "table" and "empty" or type(row)), 2)
    end
    N = N + #row
    starts[r + 1] = N
  end
  local tok, cu = tensor.new({ 1, N }, "i32"), tensor.new({ #rows + 1 }, "i32")
  local tp, cp = ffi.cast("int32_t*", tok.data), ffi.cast("int32_t*", cu.data)
  for r, row in ipairs(rows) do
    local at = starts[r]
    cp[r - 1] = at
    for t, id in ipairs(row) do
      if type(id) ~= "number" or id ~= math.floor(id) then
        error(("logprobs_packed: row %d, position %d: %s is not an integer token id"):format(r, t, tostring(id)), 2)
      end
      tp[at + t - 1] = id
    end
  end
  cp[#rows] = N
  local dtype = stats_dtype(self)
  local logp = tensor.new({ 1, N }, dtype)
  local ent = opts.entropy and tensor.new({ 1, N }, dtype) or nil
  local fo = ffi.new("rx_forward_opts")
  fo.train = opts.train and 1 or 0
  fo.checkpoint = opts.checkpoint and 1 or 0
  fo.head_chunk_rows = opts.head_chunk_rows or 0
  fo.head_chunk_vocab = opts.head_chunk_vocab or 0
  check(C.rx_model_logprobs_packed(self.handle, tok, cu, logp, ent, fo), 2)
  self.last_shape = { 1, N }
  return logp, ent, starts
end

-- Sizes the activation plan once for micro-batches of up to `tokens` tokens (packed rows):
-- later forwards reuse it instead of growing it step by step.
function Model:reserve(tokens, opts)
  opts = opts or {}
  local fo = ffi.new("rx_forward_opts")
  fo.train = opts.train and 1 or 0
  fo.checkpoint = opts.checkpoint and 1 or 0
  check(C.rx_model_reserve(self.handle, tokens, fo), 2)
end

-- Bytes of the activation plan and of the head's logits tile for a (B, T) forward of a model
-- of config c (model:cfg()), as the engine computes them (rx_model_plan_bytes).
function M.plan_bytes(c, B, T, opts)
  opts = opts or {}
  local fo = ffi.new("rx_forward_opts", { opts.train and 1 or 0, opts.train and opts.checkpoint and 1 or 0, 0, 0 })
  local acts, head = ffi.new("int64_t[1]"), ffi.new("int64_t[1]")
  check(C.rx_model_plan_bytes(c, B, T, fo, acts, head), 3)
  return tonumber(acts[0]), tonumber(head[0])
end

-- Whether a model of config c (model:cfg()) scales RoPE as Llama 3.1 does (rope_scaling
-- "llama3"), and then, per frequency, the divisor that scaling applies (the plain frequency over
-- the scaled one, from rx_rope_frequencies: what llama.cpp's rope_freqs holds), f32 [head_dim / 2].
function M.rope_llama3(c) return c.rope_scaling == C.RX_ROPE_LLAMA3 end

function M.rope_factors(c, level)
  local n = tonumber(c.head_dim) / 2
  local plain_cfg = ffi.new("rx_model_config")
  ffi.copy(plain_cfg, c, ffi.sizeof("rx_model_config"))
  plain_cfg.rope_scaling = C.RX_ROPE_DEFAULT
  local plain, scaled = ffi.new("double[?]", n), ffi.new("double[?]", n)
  check(C.rx_rope_frequencies(plain_cfg, plain), (level or 1) + 1)
  check(C.rx_rope_frequencies(c, scaled), (level or 1) + 1)
  local factors = tensor.new({ n }, "f32")
  local fp = ffi.cast("float *", factors.data)
  for i = 0, n - 1 do fp[i] = plain[i] / scaled[i] end
  return factors
end

-- Accumulates d(sum(dlogp * logp))/d(params) for the last train forward; with dentropy (same
-- shape), d(sum(dlogp * logp + dentropy * entropy))/d(params) (an entropy bonus).
function Model:backward(dlogp, dentropy)
  local dt = stats_dtype(self)
  if type(dlogp) == "table" and not ffi.istype("rx_tensor", dlogp) then dlogp = tensor.from(dlogp, dt) end
  if dentropy == nil then
    check(C.rx_model_backward(self.handle, dlogp), 2)
    return
  end
  if type(dentropy) == "table" and not ffi.istype("rx_tensor", dentropy) then dentropy = tensor.from(dentropy, dt) end
  check(C.rx_model_backward_entropy(self.handle, dlogp, dentropy), 2)
end

function Model:memory()
  local mu = ffi.new("rx_model_memory")
  C.rx_model_memory_usage(self.handle, mu)
  return { params = tonumber(mu.param_bytes), grads = tonumber(mu.grad_bytes),
    activations = tonumber(mu.activation_bytes), head = tonumber(mu.head_bytes) }
end

-- Generation with a KV cache (remax.bind.generate, which documents the options): prompts is a
-- list of token-id lists; returns {rows = {...}, tokens_generated = n, ...}.
function Model:generate(prompts, opts) return require("remax.bind.generate").run(self, prompts, opts) end

-- The one check of sampling settings at the Lua boundary (remax.bind.generate).
function M.sampling_problem(s, where) return require("remax.bind.generate").sampling_problem(s, where) end

-- Logits of the next token after each row (full forward, no cache): [B, vocab].
function Model:next_logits(tokens, mask)
  if type(tokens) == "table" and not ffi.istype("rx_tensor", tokens) then tokens, mask = M.pad_rows(tokens) end
  local out = tensor.new({ tokens:size(1), tonumber(self:cfg().vocab_size) }, tonumber(self:cfg().dtype))
  local rc = C.rx_model_next_logits(self.handle, tokens, mask, out)
  if rc ~= 0 then error(rx.last_error(), 2) end
  return out
end

local tokenizer_files = { "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
  "generation_config.json", "vocab.json", "merges.txt" }

local function copy_tokenizer_files(self, dir)
  if self.source_dir and self.source_dir ~= dir then
    for _, f in ipairs(tokenizer_files) do
      local text = read_file(self.source_dir .. "/" .. f)
      if text then write_atomic(dir .. "/" .. f, text) end
    end
  end
end

-- Writes a Hugging Face folder: config.json, model.safetensors, and the tokenizer files of the
-- folder the model came from. opts.dtype: "f32" (default: the compute dtype) or "bf16".
-- A model with LoRA adapters writes them as PEFT does (adapter_model.safetensors,
-- adapter_config.json; the base stays where it is); remax.bind.lora.save_merged writes it whole.
function Model:save(dir, opts)
  if self.adapters then
    self.adapters.save(self, dir, opts)
    copy_tokenizer_files(self, dir)
    return
  end
  self:save_full(dir, opts)
end

-- The whole model in Hugging Face layout; opts.replace: name -> tensor saved in place of a
-- parameter (merged LoRA weights); opts.extra: name -> tensor saved beside the parameters (a
-- reward model's score.weight); opts.config: config.json fields set last (its architectures).
function Model:save_full(dir, opts)
  opts = opts or {}
  fs.mkdir_p(dir)
  local save_dtype = opts.dtype and tensor.dtype(opts.dtype) or tonumber(self:cfg().dtype)
  local tensors = {}
  for i, name in ipairs(self.names) do
    local p = (opts.replace and opts.replace[name]) or C.rx_model_param(self.handle, i - 1)
    tensors[name] = (tonumber(p.dtype) == save_dtype) and p or p:to(save_dtype)
  end
  for name, t in pairs(opts.extra or {}) do tensors[name] = (tonumber(t.dtype) == save_dtype) and t or t:to(save_dtype) end
  require("remax.bind.safetensors").save(dir .. "/model.safetensors", tensors, { format = "pt" })
  local cfg = {}
  for k, v in pairs(self.config) do cfg[k] = v end
  local c = self:cfg()
  cfg.architectures = cfg.architectures or { "Qwen2ForCausalLM" }
  cfg.model_type = cfg.model_type or M.architectures[cfg.architectures[1]] or "qwen2"
  cfg.vocab_size, cfg.hidden_size = tonumber(c.vocab_size), tonumber(c.hidden_size)
  cfg.intermediate_size, cfg.num_hidden_layers = tonumber(c.intermediate_size), tonumber(c.num_hidden_layers)
  cfg.num_attention_heads, cfg.num_key_value_heads = tonumber(c.num_attention_heads), tonumber(c.num_key_value_heads)
  cfg.head_dim, cfg.max_position_embeddings = tonumber(c.head_dim), tonumber(c.max_position_embeddings)
  cfg.rms_norm_eps, cfg.rope_theta = c.rms_norm_eps, c.rope_theta
  cfg.tie_word_embeddings = c.tie_word_embeddings ~= 0
  cfg.hidden_act = cfg.hidden_act or "silu"
  cfg.torch_dtype = ({ [tonumber(C.RX_F32)] = "float32", [tonumber(C.RX_BF16)] = "bfloat16",
    [tonumber(C.RX_F16)] = "float16", [tonumber(C.RX_F64)] = "float64" })[save_dtype]
  for k, v in pairs(opts.config or {}) do cfg[k] = v end
  write_atomic(dir .. "/config.json", cjson.encode(cfg))
  copy_tokenizer_files(self, dir)
  self.source_dir = self.source_dir or dir
end

return M
