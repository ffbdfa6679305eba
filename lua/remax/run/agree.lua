-- remax.run.agree: the ranks of a data-parallel run agree before the first step. Every rank
-- describes itself (its resolved settings, the library it runs, later the model it loaded) as a
-- list of named values; rank 0 gathers them, and a difference stops every rank with the same
-- message, naming each setting that differs and every rank's value. Without it a rank with
-- another num_generations or seed trains to the end without a word, and one with another
-- zero_stage calls other collectives (docs/distributed.md, "Ranks agree").
--
--   agree.settings(world, cfg)     -- first thing after the world is known (trainer start)
--   agree.model(world, model)      -- after the model is loaded, before rank 0's weights go out
--   agree.rewards(world, list)     -- the reward functions loaded, by what their code is
--   agree.identity(fn)             -- "function (file:line, code 1a2b3c4d)": a function as what it is
-- Functions (a reward, a data function, tools) are compared by their code, not by file:line: the
-- ranks of a job on several machines each read their own copy of a file at the same path.
local M = {}

-- A 32-bit FNV-1a hash of text, as 8 hex digits.
local function fnv1a(text)
  local h = 2166136261
  for i = 1, #text do
    h = bit.bxor(h, text:byte(i))
    h = (h * 16777619) % 4294967296   -- exact in a double: h < 2^32, the prime < 2^25
  end
  return ("%08x"):format(h)
end

-- What a function is, not only where: its bytecode without debug information
-- (string.dump(fn, true): the same for the same code wherever it sits in its file, comments and
-- blank lines apart), with that of the functions it closes over (a helper it calls), hashed.
-- Two copies of a reward at one path that differ in their code differ here, across ranks and
-- across a hot reload. A C function has no bytecode: its name stands in.
local function code_hash(fn, depth, seen)
  if seen[fn] then return "" end
  seen[fn] = true
  local ok, code = pcall(string.dump, fn, true)
  local parts = { ok and code or tostring(debug.getinfo(fn, "S").what) }
  if depth < 4 then
    for i = 1, 255 do
      local name, v = debug.getupvalue(fn, i)
      if name == nil then break end
      if type(v) == "function" then parts[#parts + 1] = code_hash(v, depth + 1, seen) end
    end
  end
  return table.concat(parts, "\0")
end

-- "function (file:line, code 1a2b3c4d)": where a function is defined and what its code is.
function M.identity(fn)
  local info = debug.getinfo(fn, "S")
  return ("function (%s:%d, code %s)"):format(info.short_src, info.linedefined, fnv1a(code_hash(fn, 0, {})))
end

-- A value as canonical text: tables with their keys sorted, functions by where they are defined
-- and what their code is (M.identity).
local function canonical(v, out, seen)
  local t = type(v)
  if t == "table" then
    seen = seen or {}
    if seen[v] then out[#out + 1] = "{...}"; return end   -- a table that holds itself
    seen[v] = true
    local keys = {}
    for k in pairs(v) do keys[#keys + 1] = k end
    table.sort(keys, function(a, b)
      if type(a) == type(b) and (type(a) == "number" or type(a) == "string") then return a < b end
      return type(a) < type(b)
    end)
    out[#out + 1] = "{"
    for i, k in ipairs(keys) do
      if i > 1 then out[#out + 1] = ", " end
      if type(k) ~= "number" or k ~= i then
        canonical(k, out, seen)
        out[#out + 1] = "="
      end
      canonical(v[k], out, seen)
    end
    seen[v] = nil
    out[#out + 1] = "}"
  elseif t == "string" then out[#out + 1] = ("%q"):format(v)
  elseif t == "number" then
    out[#out + 1] = (v == math.floor(v) and math.abs(v) < 2 ^ 53) and ("%d"):format(v) or ("%.17g"):format(v)
  elseif t == "function" then out[#out + 1] = M.identity(v)
  else out[#out + 1] = tostring(v) end
end

function M.show(v)
  local out = {}
  canonical(v, out)
  return table.concat(out)
end

-- items: { { name, text }, ... } in the same order on every rank. Returns nil, or the message.
local function differences(all, what)
  local lines = {}
  local names, seen = {}, {}
  for _, items in ipairs(all) do
    for _, it in ipairs(items) do
      if not seen[it[1]] then seen[it[1]] = true; names[#names + 1] = it[1] end
    end
  end
  local by_rank = {}
  for r, items in ipairs(all) do
    by_rank[r] = {}
    for _, it in ipairs(items) do by_rank[r][it[1]] = it[2] end
  end
  for _, name in ipairs(names) do
    local first, differ = by_rank[1][name], false
    for r = 2, #all do if by_rank[r][name] ~= first then differ = true end end
    if differ then
      local vals = {}
      for r = 1, #all do
        local v = by_rank[r][name]
        vals[#vals + 1] = ("rank %d has %s"):format(r - 1, v == nil and "(none)" or v)
      end
      lines[#lines + 1] = ("  %s: %s"):format(name, table.concat(vals, ", "))
    end
  end
  if #lines == 0 then return nil end
  return ("the ranks disagree on %s before the first step (every rank must run the same recipe, "
    .. "arguments, model and build):\n%s"):format(what, table.concat(lines, "\n"))
end

-- Gathers items to rank 0, which decides; every rank raises the same error when they differ.
function M.check(world, items, what)
  if world.size == 1 then return end
  local all = world:gather(items)
  local problem = world.is_root and differences(all, what) or nil
  problem = world:broadcast(problem or false)
  if problem then error(problem, 0) end
end

-- The library this process runs: its version, the kernels it picked and a hash of its file.
local function library_items()
  local build = require("remax.bind.build")
  return {
    { "remax version", build.version() }, { "libremax.so", build.library_file() },
    { "OpenBLAS kernels", build.blas_core() }, { "CUDA", build.cuda_backend() },
  }
end

-- The resolved settings (every declared key) and the library build.
function M.settings(world, cfg)
  if world.size == 1 then return end
  local config = require("remax.settings.config")
  local names = {}
  for name in pairs(config.keys) do names[#names + 1] = name end
  table.sort(names)
  local items = {}
  for _, name in ipairs(names) do items[#items + 1] = { name, M.show(cfg[name]) } end
  for _, it in ipairs(library_items()) do items[#items + 1] = it end
  M.check(world, items, "their settings")
end

-- The engine's view of the model (rx_model_config, after defaults): a resumed run's rank 0 reads
-- the checkpoint's config.json (derived keys such as head_dim added) while the others may build
-- the same model from model_config, so the JSON tables would differ where the models do not.
M.MODEL_FIELDS = { "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
  "num_key_value_heads", "head_dim", "max_position_embeddings", "rms_norm_eps", "rope_theta", "tie_word_embeddings",
  "attention_bias", "dtype", "device", "qk_norm", "rope_scaling", "rope_factor", "rope_low_freq_factor",
  "rope_high_freq_factor", "rope_original_max_position_embeddings", "weight_dtype" }

-- A short text for every tensor's name and shape: "N tensors, hash H".
local function shapes(model)
  local parts = {}
  for i, name in ipairs(model.names) do
    local t = model:param(name)
    local dims = {}
    for d = 0, t.ndim - 1 do dims[#dims + 1] = tostring(t.shape[d]):gsub("LL$", "") end
    parts[i] = name .. "[" .. table.concat(dims, ",") .. "]"
  end
  local text, h = table.concat(parts, ";"), 5381
  for i = 1, #text do h = (h * 33 + text:byte(i)) % 4294967296 end
  return ("%d tensors, hash %08x"):format(#parts, h)
end

-- The model each rank loaded: what its config says it computes, its tensors, its size.
function M.model(world, model)
  if world.size == 1 then return end
  local items = {}
  local c = model:cfg()
  for _, k in ipairs(M.MODEL_FIELDS) do items[#items + 1] = { "model " .. k, M.show(tonumber(c[k])) } end
  items[#items + 1] = { "model tensors", shapes(model) }
  items[#items + 1] = { "model parameters", tostring(model:num_parameters()) }
  items[#items + 1] = { "trained parameters", tostring(model:num_trainable()) }
  M.check(world, items, "their model")
end

-- The reward functions each rank loaded (a reward given by name is a file each rank reads on its
-- own machine): by what their code is, so that two copies of a reward at one path that differ
-- are refused instead of training each rank against its own reward.
function M.rewards(world, list)
  if world.size == 1 then return end
  local items = {}
  for i, r in ipairs(list or {}) do
    local what = r.external and r.where or (type(r.fn) == "function" and M.identity(r.fn)) or "?"
    items[#items + 1] = { ("reward %d '%s'"):format(i, tostring(r.name)), what }
  end
  M.check(world, items, "their reward functions")
end

return M
