-- remax.step.fit: whether a training micro-batch fits in memory, asked before the engine allocates
-- its activations, so a batch that cannot fit stops the run with what would fit instead of
-- the machine swapping or the kernel killing the process. (Generation has the same check in
-- rx_generate_begin: the KV cache and activations against MemAvailable.)
--
--   fit.activation_bytes(model:cfg(), B, T, {train = true, checkpoint = false}) -> bytes
--   fit.check_train(model, B, T, {checkpoint =, what =})   -- error naming the sizes, or nothing
local M = {}

-- Bytes of the activation plan rx_model_plan (engine/model/model.c, carve_plan) carves for a
-- (B, T) forward, plus the head's logits tile. Every buffer is linear in N = B * T; each is
-- rounded up to 64 bytes as the engine does. tests/lua/fit_spec.lua checks this against the
-- engine's own count after real forwards, so a change to the plan shows up there.
function M.activation_bytes(c, B, T, opts)
  opts = opts or {}
  local train, checkpoint = opts.train and true or false, opts.train and opts.checkpoint and true or false
  local L, C, I, V = tonumber(c.num_hidden_layers), tonumber(c.hidden_size), tonumber(c.intermediate_size), tonumber(c.vocab_size)
  local H, KV, D = tonumber(c.num_attention_heads), tonumber(c.num_key_value_heads), tonumber(c.head_dim)
  local dt = tonumber(c.dtype)
  local es = dt == 1 and 8 or (dt == 2 or dt == 3) and 2 or 4   -- RX_F64 = 1, RX_BF16 = 2, RX_F16 = 3, RX_F32
  local N = B * T
  local HD, KD = H * D, KV * D
  local function buf(numel, size) return math.ceil(numel * (size or es) / 64) * 64 end
  local bytes = (L + 1) * buf(N * C)
  local sets = train and not checkpoint and L or 1
  local per_set = buf(N) + buf(N * C) + buf(N * HD) + 2 * buf(N * KD) + buf(N * HD) + buf(B * H * T) + buf(N * C)
    + buf(N) + buf(N * C) + 3 * buf(N * I)
  if tonumber(c.qk_norm) ~= 0 then per_set = per_set + buf(N * HD) + buf(N * KD) + buf(N * H) + buf(N * KV) end
  bytes = bytes + sets * per_set
  -- xf, rstdf; tokens, mask, positions, targets (i32); the head's rows: logp, lse, entropy, dlogp,
  -- dentropy, running max (compute dtype) and its two running sums (f64, engine/model/head.c)
  bytes = bytes + buf(N * C) + buf(N) + 4 * buf(N, 4) + 6 * buf(N) + 2 * buf(N, 8)
  if train then bytes = bytes + 4 * buf(N * C) + 3 * buf(N * I) + 2 * buf(N * HD) + 2 * buf(N * KD) end
  -- the head's logits: tiles of rows by vocabulary slices of ~32 MB (rx_model_plan)
  local budget = 32 * 2 ^ 20
  local rows = math.max(1024, math.floor(budget / (V * es)))
  if rows > N then rows = N end
  local cols = math.min(V, math.max(16, math.floor(math.floor(budget / (rows * es)) / 16) * 16))
  return bytes, rows * cols * es
end

-- Bytes of memory available to this process now (MemAvailable), or nil when unknown.
function M.available_bytes()
  local f = io.open("/proc/meminfo", "r")
  if not f then return nil end
  local text = f:read("*a")
  f:close()
  local kb = text:match("MemAvailable:%s*(%d+) kB")
  return kb and tonumber(kb) * 1024 or nil
end

local function size(b)
  if b >= 2 ^ 30 then return ("%.2f GiB"):format(b / 2 ^ 30) end
  return ("%.1f MiB"):format(b / 2 ^ 20)
end

-- Refuses a training forward of B rows x T tokens whose activations cannot fit in the memory
-- available (plus what the model's current plan holds, which the engine frees first), saying
-- how many rows of T tokens would fit. opts.available overrides MemAvailable (tests). CPU only.
function M.check_train(model, B, T, opts)
  opts = opts or {}
  local c = model:cfg()
  if tonumber(c.device) ~= 0 then return end   -- RX_CPU = 0; a GPU's memory is the CUDA backend's to check
  local acts, head = M.activation_bytes(c, B, T, { train = true, checkpoint = opts.checkpoint })
  local avail = opts.available or M.available_bytes()
  if not avail then return end
  local held = model:memory()
  local usable = avail + (held.activations or 0) + (held.head or 0)
  -- only the activations are counted: gradients and AdamW's moments (allocated at the first
  -- backward and update; LoRA's are the adapters' alone) come on top, so a refusal is certain
  if acts + head <= usable then return end
  local rows = 0
  while rows < B do
    local a, h = M.activation_bytes(c, rows + 1, T, { train = true, checkpoint = opts.checkpoint })
    if a + h > usable then break end
    rows = rows + 1
  end
  local hint = ""
  if not opts.checkpoint then
    local a, h = M.activation_bytes(c, B, T, { train = true, checkpoint = true })
    if a + h <= usable then hint = "; gradient_checkpointing = true fits it (activations recomputed in the backward)" end
  end
  error(("%s: a training micro-batch of %d rows x %d tokens needs %s of activations, but %s of memory " ..
    "is available; %d rows of %d tokens would fit (per_device_train_batch_size sets the prompts per micro-batch, " ..
    "each with num_generations rows and the greedy one; max_prompt_length + max_completion_length bounds the tokens)%s")
    :format(opts.what or "out of memory", B, T, size(acts + head), size(avail), rows, T, hint), 0)
end

return M
