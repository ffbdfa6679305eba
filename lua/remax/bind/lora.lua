-- remax.bind.lora: LoRA adapters on a model (the engine does the math: engine/model/lora.c), saved
-- and loaded in PEFT's format, merged into a full Hugging Face model, and the reference model
-- of a KL penalty as the same model with its adapters off. See docs/lora.md.
--
--   local lora = require("remax.bind.lora")
--   lora.apply(model, { r = 16, alpha = 32, dropout = 0.05, target_modules = "all-linear" })
--   local params, grads = model:trainable()       -- the adapters only
--   local ref = lora.reference(model)              -- ref:logprobs(...) = the base model's
--   model:save("out")                              -- adapter_model.safetensors + adapter_config.json
--   lora.save_merged(model, "merged")              -- config.json + model.safetensors, W + (alpha/r) B A
local ffi = require("ffi")
local cjson = require("cjson")
local rx = require("remax.bind.ffi")
local tensor = require("remax.bind.tensor")
local fs = require("remax.bind.fs")
local bit = require("bit")
local C, check = rx.C, rx.check

local M = {}

-- PEFT's module names, in the engine's projection order (RX_PROJ_Q = 0 ... RX_PROJ_DOWN = 6).
M.modules = { "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj" }
-- PEFT's default for Llama and Qwen2 when target_modules is not given.
M.default_targets = { "q_proj", "v_proj" }
-- PeftModel -> LoraModel -> the transformers model: PEFT's saved names carry this prefix.
M.PREFIX = "base_model.model."
M.CONFIG_FILE, M.WEIGHTS_FILE = "adapter_config.json", "adapter_model.safetensors"

local index_of = {}
for i, name in ipairs(M.modules) do index_of[name] = i - 1 end

-- target_modules (a name, a list of names, "a,b", or "all-linear") -> bit mask, sorted names.
function M.targets(spec, where)
  where = where or "lora_target_modules"
  if spec == nil then spec = M.default_targets end
  local list = {}
  if type(spec) == "string" then
    for part in spec:gmatch("[^,%s]+") do list[#list + 1] = part end
  elseif type(spec) == "table" then
    for i, v in ipairs(spec) do
      if type(v) ~= "string" then error(("%s[%d] is a %s, expected a module name"):format(where, i, type(v)), 0) end
      for part in v:gmatch("[^,%s]+") do list[#list + 1] = part end
    end
  else
    error(("%s is a %s, expected module names or \"all-linear\""):format(where, type(spec)), 0)
  end
  local mask, names, seen = 0, {}, {}
  for _, name in ipairs(list) do
    if name == "all-linear" then
      for i, n in ipairs(M.modules) do
        if not seen[n] then seen[n] = true; names[#names + 1] = n; mask = bit.bor(mask, bit.lshift(1, i - 1)) end
      end
    else
      local i = index_of[name]
      if not i then
        error(("%s: '%s' is not a linear layer of this model (valid: %s, or all-linear)"):format(where, name,
          table.concat(M.modules, ", ")), 0)
      end
      if not seen[name] then seen[name] = true; names[#names + 1] = name; mask = bit.bor(mask, bit.lshift(1, i)) end
    end
  end
  if mask == 0 then error(("%s names no module (valid: %s, or all-linear)"):format(where, table.concat(M.modules, ", ")), 0) end
  table.sort(names)
  return mask, names
end

-- Adds adapters to model. opts: r (default 16), alpha (32), dropout (0.05), target_modules
-- (PEFT's names or "all-linear"; default q_proj, v_proj as PEFT picks for Llama and Qwen2), seed.
function M.apply(model, opts)
  opts = opts or {}
  if model.lora then error("lora.apply: the model already has adapters", 2) end
  local r, alpha, dropout = opts.r or 16, opts.alpha or 32, opts.dropout or 0.05
  if type(r) ~= "number" or r < 1 or r ~= math.floor(r) then error(("lora_r = %s: expected an integer >= 1"):format(tostring(r)), 0) end
  if type(alpha) ~= "number" or alpha ~= alpha then error(("lora_alpha = %s: expected a number"):format(tostring(alpha)), 0) end
  if type(dropout) ~= "number" or not (dropout >= 0 and dropout < 1) then
    error(("lora_dropout = %s: expected a number in [0, 1)"):format(tostring(dropout)), 0)
  end
  local mask, names = M.targets(opts.target_modules)
  local lc = ffi.new("rx_lora_config")
  lc.r, lc.alpha, lc.dropout, lc.targets, lc.seed = r, alpha, dropout, mask, opts.seed or 0
  check(C.rx_model_lora_init(model.handle, lc), 2)
  model.lora = { r = r, alpha = alpha, dropout = dropout, target_modules = names, names = {}, index = {},
    base = model.source_dir }
  model.adapters = M   -- the model reaches params, num_parameters and save through this
  model.flat_layout, model.held = nil, nil   -- the trained tensors are the adapters from here on
  for i = 0, tonumber(C.rx_model_lora_count(model.handle)) - 1 do
    local name = ffi.string(C.rx_model_lora_name(model.handle, i))
    model.lora.names[#model.lora.names + 1] = name
    model.lora.index[name] = i
  end
  return model
end

-- name -> adapter tensor views, and their gradients.
function M.params(model)
  local p, g = {}, {}
  for i, name in ipairs(model.lora.names) do
    p[name] = C.rx_model_lora_param(model.handle, i - 1)
    g[name] = C.rx_model_lora_grad(model.handle, i - 1)
  end
  return p, g
end

function M.num_parameters(model)
  local n = 0
  for i = 1, #model.lora.names do n = n + tonumber(C.rx_model_lora_param(model.handle, i - 1).numel) end
  return n
end

-- Runs fn() with the adapters off (the base model), and turns them back on even when fn fails.
function M.without_adapters(model, fn, ...)
  C.rx_model_lora_set_enabled(model.handle, 0)
  local out = { pcall(fn, ...) }
  C.rx_model_lora_set_enabled(model.handle, 1)
  if not out[1] then error(out[2], 0) end
  return unpack(out, 2, table.maxn(out))
end

-- The frozen reference of a KL penalty: the same weights with the adapters off. No memory of
-- its own. It has what the trainer asks of a reference: logprobs (inference only).
function M.reference(model)
  return {
    is_lora_reference = true,
    logprobs = function(_, tokens, mask, opts)
      if opts and opts.train then error("lora reference: no train forwards (the reference is frozen)", 2) end
      return M.without_adapters(model, model.logprobs, model, tokens, mask, opts)
    end,
    logprobs_packed = function(_, rows, opts)   -- padding-free training (remax.step.pack)
      if opts and opts.train then error("lora reference: no train forwards (the reference is frozen)", 2) end
      return M.without_adapters(model, model.logprobs_packed, model, rows, opts)
    end,
  }
end

---------------------------------------------------------------------------- PEFT's format

-- adapter_config.json as PEFT's LoraConfig writes it (PEFT 0.10-0.12 key set; later versions
-- add keys with defaults and read these files unchanged).
function M.peft_config(model, base_path)
  local l = model.lora
  local null = cjson.null
  return {
    alpha_pattern = {}, auto_mapping = null,
    base_model_name_or_path = base_path or null, bias = "none", fan_in_fan_out = false,
    inference_mode = true, init_lora_weights = true, layer_replication = null, layers_pattern = null,
    layers_to_transform = null, loftq_config = {}, lora_alpha = l.alpha, lora_dropout = l.dropout,
    megatron_config = null, megatron_core = "megatron.core", modules_to_save = null, peft_type = "LORA",
    r = l.r, rank_pattern = {}, revision = null, target_modules = l.target_modules, task_type = "CAUSAL_LM",
    use_dora = false, use_rslora = false,
  }
end

-- JSON text with sorted keys, 2-space indent, {} for empty tables (PEFT writes {} for the
-- pattern dicts and loftq_config) and [] only for target_modules.
local function encode_config(cfg)
  local keys = {}
  for k in pairs(cfg) do keys[#keys + 1] = k end
  table.sort(keys)
  local lines = {}
  for _, k in ipairs(keys) do
    local v = cfg[k]
    local text
    if type(v) == "table" and k == "target_modules" then
      local parts = {}
      for i, s in ipairs(v) do parts[i] = "    " .. cjson.encode(s) end
      text = "[\n" .. table.concat(parts, ",\n") .. "\n  ]"
    elseif type(v) == "table" then
      text = "{}"
    elseif type(v) == "number" and v == math.floor(v) and math.abs(v) < 2 ^ 53 then
      text = ("%d"):format(v)
    elseif type(v) == "number" then
      text = ("%.17g"):format(v)
    else
      text = cjson.encode(v)
    end
    lines[#lines + 1] = ("  %s: %s"):format(cjson.encode(k), text)
  end
  return "{\n" .. table.concat(lines, ",\n") .. "\n}\n"
end

-- Writes adapter_model.safetensors (PEFT's names, the compute dtype, or opts.dtype) and
-- adapter_config.json into dir. The train-forward count (for the dropout masks of a resumed
-- run) rides in the safetensors metadata, which PEFT ignores.
function M.save(model, dir, opts)
  opts = opts or {}
  fs.mkdir_p(dir)
  local tensors = {}
  local save_dtype = opts.dtype and tensor.dtype(opts.dtype) or nil
  for i, name in ipairs(model.lora.names) do
    local p = C.rx_model_lora_param(model.handle, i - 1)
    tensors[M.PREFIX .. name] = (save_dtype and tonumber(p.dtype) ~= save_dtype) and p:to(save_dtype) or p
  end
  require("remax.bind.safetensors").save(dir .. "/" .. M.WEIGHTS_FILE, tensors, {
    format = "pt", remax_lora_forward_count = (tostring(C.rx_model_lora_forward_count(model.handle)):gsub("ULL$", "")),
  })
  fs.write_atomic(dir .. "/" .. M.CONFIG_FILE, encode_config(M.peft_config(model, opts.base_model or model.lora.base)))
end

-- adapter_config.json of dir, checked for what remax can load.
function M.read_config(dir)
  local path = dir .. "/" .. M.CONFIG_FILE
  local text = fs.read_text(path)
  if not text then error(("%s: cannot read it (not a LoRA adapter folder?)"):format(path), 0) end
  local ok, cfg = pcall(cjson.decode, text)
  if not ok or type(cfg) ~= "table" then error(("%s is not a JSON object (%s)"):format(path, tostring(cfg)), 0) end
  if cfg.peft_type ~= "LORA" then error(("%s: peft_type = %s, remax loads LORA adapters"):format(path, tostring(cfg.peft_type)), 0) end
  for _, k in ipairs({ "use_dora", "use_rslora", "fan_in_fan_out" }) do
    if cfg[k] == true then error(("%s: %s = true is not supported"):format(path, k), 0) end
  end
  for _, k in ipairs({ "rank_pattern", "alpha_pattern" }) do
    if type(cfg[k]) == "table" and next(cfg[k]) ~= nil then error(("%s: %s is not supported (one r and alpha for every module)"):format(path, k), 0) end
  end
  if cfg.bias ~= nil and cfg.bias ~= "none" then error(("%s: bias = %s is not supported (none)"):format(path, tostring(cfg.bias)), 0) end
  if type(cfg.r) ~= "number" or type(cfg.lora_alpha) ~= "number" then error(("%s: r and lora_alpha must be numbers"):format(path), 0) end
  if not (cfg.r >= 1 and cfg.r <= 65536 and cfg.r == math.floor(cfg.r)) then
    error(("%s: r = %s: expected a whole number from 1 to 65536"):format(path, tostring(cfg.r)), 0)
  end
  if not (cfg.lora_alpha > 0 and cfg.lora_alpha < math.huge) then
    error(("%s: lora_alpha = %s: expected a finite number > 0"):format(path, tostring(cfg.lora_alpha)), 0)
  end
  local dropout = cfg.lora_dropout
  if dropout ~= nil and dropout ~= cjson.null and not (type(dropout) == "number" and dropout >= 0 and dropout < 1) then
    error(("%s: lora_dropout = %s: expected a number in [0, 1)"):format(path, tostring(dropout)), 0)
  end
  -- keys that change what the adapters are: remax would apply them to every layer, or drop the
  -- fully trained modules PEFT saved beside them
  for _, k in ipairs({ "layers_to_transform", "modules_to_save" }) do
    local v = cfg[k]
    if v ~= nil and v ~= cjson.null and not (type(v) == "table" and next(v) == nil) then
      error(("%s: %s is set, which remax does not apply (adapters on every layer, no saved modules); the adapters would be misread")
        :format(path, k), 0)
    end
  end
  cfg.path = path
  return cfg
end

-- Adapter weights from a PEFT folder (adapter_model.safetensors) into a model that has adapters
-- of the same shapes; every adapter must be there and nothing else.
function M.load_weights(model, dir)
  local path = dir .. "/" .. M.WEIGHTS_FILE
  if not fs.exists(path) then error(("%s: no such file"):format(path), 0) end
  local st = require("remax.bind.safetensors").open(path)
  local in_file = {}
  for _, name in ipairs(st:names()) do in_file[name] = true end
  for i, name in ipairs(model.lora.names) do
    local key = M.PREFIX .. name
    if not in_file[key] then
      -- PEFT names the adapter in memory ("lora_A.default.weight") but not on disk; accept both
      local alt = key:gsub("%.lora_([AB])%.weight$", ".lora_%1.default.weight")
      if in_file[alt] then key = alt else
        st:close()
        error(("%s: tensor '%s' is missing (adapter_config.json and this model want it)"):format(path, M.PREFIX .. name), 0)
      end
    end
    local p = C.rx_model_lora_param(model.handle, i - 1)
    local info = st:info(key)
    if table.concat(info.shape, ",") ~= table.concat(p:size(), ",") then
      st:close()
      error(("%s: tensor '%s' has shape [%s], this model wants [%s]"):format(path, key, table.concat(info.shape, ","),
        table.concat(p:size(), ",")), 0)
    end
    st:read_into(key, p)
    in_file[key] = nil
  end
  local extra = next(in_file)
  local meta = st:metadata()
  st:close()
  if extra then error(("%s: tensor '%s' is not an adapter of this model"):format(path, extra), 0) end
  local count = meta and tonumber(meta.remax_lora_forward_count)
  if count then C.rx_model_lora_set_forward_count(model.handle, count) end
end

-- adapter_config.json's target_modules as module names. PEFT matches a name against the end of
-- a module's path, and saves "all-linear" on a small model (under 20 modules) as the full paths
-- it expanded to ("model.layers.0.self_attn.q_proj", ...): those are read as their module names
-- when they name every one of the model's layers (remax puts adapters on every layer).
function M.config_targets(cfg, num_layers)
  local list = cfg.target_modules
  if type(list) ~= "table" then return list end
  local names, layers, order = {}, {}, {}
  for _, entry in ipairs(list) do
    local layer, module
    if type(entry) == "string" then layer, module = entry:match("^model%.layers%.(%d+)%.[%w_]+%.([%w_]+)$") end
    if layer and index_of[module] then
      if not layers[module] then layers[module] = {}; order[#order + 1] = module end
      layers[module][tonumber(layer)] = true
    else
      names[#names + 1] = entry
    end
  end
  for _, module in ipairs(order) do
    local missing = {}
    for l = 0, num_layers - 1 do if not layers[module][l] then missing[#missing + 1] = l end end
    if #missing > 0 then
      error(("%s: target_modules names %s in some layers only (not in layer %s); remax puts adapters on every layer")
        :format(cfg.path, module, table.concat(missing, ", ")), 0)
    end
    names[#names + 1] = module
  end
  return names
end

-- Adds the adapters a PEFT folder describes (adapter_config.json) and loads their weights.
-- expect (optional): {r=, alpha=, target_modules=} that must match (a resumed run's settings).
function M.load(model, dir, expect)
  local cfg = M.read_config(dir)
  local _, names = M.targets(M.config_targets(cfg, tonumber(model:cfg().num_hidden_layers)), cfg.path .. ": target_modules")
  if expect then
    local _, want = M.targets(expect.target_modules)
    if cfg.r ~= expect.r or cfg.lora_alpha ~= expect.alpha or table.concat(names, ",") ~= table.concat(want, ",") then
      error(("%s: r = %s, lora_alpha = %s, target_modules = %s, but the run asks for lora_r = %s, lora_alpha = %s, " ..
        "lora_target_modules = %s"):format(cfg.path, tostring(cfg.r), tostring(cfg.lora_alpha), table.concat(names, ","),
        tostring(expect.r), tostring(expect.alpha), table.concat(want, ",")), 0)
    end
  end
  M.apply(model, { r = cfg.r, alpha = cfg.lora_alpha, dropout = expect and expect.dropout or cfg.lora_dropout or 0,
    target_modules = names, seed = expect and expect.seed })
  M.load_weights(model, dir)
  return model
end

-- W + (alpha/r) B A for every adapted weight of a model with LoRA adapters: name -> a new
-- tensor (the model is unchanged).
function M.merged(model)
  local merged = {}
  for i, name in ipairs(model.names) do
    local p = C.rx_model_param(model.handle, i - 1)
    if model.lora.index[name:gsub("%.weight$", ".lora_A.weight")] then
      local out = tensor.new(p:size(), tonumber(p.dtype))
      check(C.rx_model_lora_merged(model.handle, i - 1, out), 2)
      merged[name] = out
    end
  end
  return merged
end

-- A full Hugging Face model with W + (alpha/r) B A in place of every adapted W: config.json,
-- model.safetensors and the tokenizer files, loadable as a plain model (remax or transformers).
function M.save_merged(model, dir, opts)
  opts = opts or {}
  model:save_full(dir, { dtype = opts.dtype, replace = M.merged(model) })
end

-- A model from a PEFT adapter folder: the base from its base_model_name_or_path (a local
-- folder), then the adapters. remax.model.load calls this for a folder without config.json.
function M.load_with_base(dir, opts)
  local cfg = M.read_config(dir)
  local base = cfg.base_model_name_or_path
  if type(base) ~= "string" or not fs.exists(base .. "/config.json") then
    error(("%s: base_model_name_or_path = %s is not a local model folder (no config.json there)"):format(cfg.path,
      type(base) == "string" and ("'" .. base .. "'") or "null"), 0)
  end
  local model = require("remax.bind.model").load(base, opts)
  M.load(model, dir)
  return model
end
-- remax.model.load reads LoRA adapter folders once this is called (setup and the package face
-- call it; requiring this module changes nothing by itself).
function M.register() require("remax.bind.model").adapter_loader = M.load_with_base end

-- The trainer's LoRA: adapters from the resolved config on a freshly loaded base, and, when
-- resuming, the checkpoint's adapters (which must have the run's shape).
function M.setup(model, cfg, resume_dir)
  local opts = { r = cfg.lora_r, alpha = cfg.lora_alpha, dropout = cfg.lora_dropout,
    target_modules = cfg.lora_target_modules, seed = cfg.seed }
  if model.lora and not resume_dir then return model end   -- --model was an adapter folder: train those
  if resume_dir and fs.exists(resume_dir .. "/" .. M.CONFIG_FILE) then
    return M.load(model, resume_dir, opts)
  elseif resume_dir then
    error(("--resume: %s has no %s (a checkpoint of a run without use_lora?)"):format(resume_dir, M.CONFIG_FILE), 0)
  end
  return M.apply(model, opts)
end

return M
