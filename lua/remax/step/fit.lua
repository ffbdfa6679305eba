-- remax.step.fit: whether a training micro-batch fits in memory, asked before the engine allocates
-- its activations, so a batch that cannot fit stops the run with what would fit instead of
-- the machine swapping or the kernel killing the process. (Generation has the same check in
-- rx_generate_begin: the KV cache and activations against MemAvailable.)
--
--   fit.activation_bytes(model:cfg(), B, T, {train = true, checkpoint = false}) -> bytes
--   fit.check_train(model, B, T, {checkpoint =, what =, budget =})   -- error naming the sizes, or nothing
--   (budget: T is a pack of max_tokens_per_microbatch tokens; the refusal says which budget fits)
local model = require("remax.bind.model")

local M = {}

-- Bytes of the activation plan rx_model_plan (engine/model/model.c, carve_plan) carves for a
-- (B, T) forward, plus the head's logits tile, as the engine computes them
-- (rx_model_plan_bytes): the sizes live in one place, the engine. Packed rows of N tokens plan
-- as (1, N). c: the model's config (model:cfg()).
function M.activation_bytes(c, B, T, opts)
  return model.plan_bytes(c, B, T, opts)
end

-- Bytes of memory available to this process now (MemAvailable), or nil when unknown
-- (remax.bind.generate's; a field here, so that a test can stand in for it).
M.available_bytes = require("remax.bind.generate").available_bytes

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
  if opts.budget then   -- a pack of max_tokens_per_microbatch: what would fit is a smaller budget
    local lo, hi = 0, T   -- the most tokens of one pack that fit
    while lo < hi do
      local mid = math.floor((lo + hi + 1) / 2)
      local a, h = M.activation_bytes(c, 1, mid, { train = true, checkpoint = opts.checkpoint })
      if a + h <= usable then lo = mid else hi = mid - 1 end
    end
    local ck = ""
    if not opts.checkpoint then
      local a, h = M.activation_bytes(c, 1, T, { train = true, checkpoint = true })
      if a + h <= usable then ck = ", or gradient_checkpointing = true (activations recomputed in the backward)" end
    end
    error(("%s: a pack of %d tokens (max_tokens_per_microbatch = %d) needs %s of activations, but %s of memory is "
      .. "available; max_tokens_per_microbatch = %d would fit%s"):format(opts.what or "out of memory", T, opts.budget,
      size(acts + head), size(avail), lo, ck), 0)
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
