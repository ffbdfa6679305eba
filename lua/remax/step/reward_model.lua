-- remax.step.reward_model: the Step of algo = "reward": one Bradley-Terry update of a reward
-- model (a decoder plus a bias-free score head [1, hidden], transformers'
-- Qwen2ForSequenceClassification / LlamaForSequenceClassification) on preference pairs, as
-- TRL's RewardTrainer trains it:
--
--   loss = mean over pairs of -log sigmoid(r_chosen - r_rejected - margin)
--          + center_rewards_coefficient * mean((r_chosen + r_rejected)^2)
--
-- Each side is rendered and scored exactly as a "model:" reward scores a completion
-- (remax.step.model_reward: the same render, encode and last-non-pad pooling), so the saved
-- folder scores in a ReMax run what it scored here. The forward keeps activations
-- (rx_model_hidden_train); the gradient of the score reaches the model through the hidden state
-- of each row's pooled position only (rx_model_hidden_backward): no [B, T, vocab] logits exist.
--
--   local rm = require("remax.step.reward_model")
--   local parts = rm.load(cfg, dir, {model_opts =, resume_dir =})   -- model, head, tok, ... (remax.run.setup)
--   local step = rm.new(pieces, cfg, hooks)    -- the Step interface of remax.step.step, as its algo's:
--   local m = step:run(pairs, {step = n})      -- rows of remax.step.preferences -> metrics
--   step:evaluate(rows) -> { accuracy =, margin =, reward = margin, n = }
--   step:state() / step:restore(state); step:save(dir) (a Hugging Face sequence classifier)
--
-- The score head is an f32 tensor on the cpu (as remax.step.model_reward keeps it), trained by
-- its own AdamW beside the model's; clipping is over both (one global norm).
local cjson = require("cjson")
local tensor = require("remax.bind.tensor")
local optim = require("remax.bind.optim")
local model_mod = require("remax.bind.model")
local classifier = require("remax.bind.classifier")
local lora = require("remax.bind.lora")
local reward_model = require("remax.step.model_reward")
local chat = require("remax.text.chat")
local now = require("remax.bind.clock").now

local M = {}
local Step = {}
Step.__index = Step
M.Step = Step

local HEAD = "score.weight"

---------------------------------------------------------------------------- the loss

local function softplus(x)   -- log(1 + e^x) without overflow
  if x > 0 then return x + math.log(1 + math.exp(-x)) end
  return math.log(1 + math.exp(x))
end

local function sigmoid(x)
  if x >= 0 then return 1 / (1 + math.exp(-x)) end
  local e = math.exp(x)
  return e / (1 + e)
end

-- The Bradley-Terry loss of pairs and its gradient. chosen, rejected: scores (lists);
-- margins: a list or nil; opts.coef: center_rewards_coefficient (nil or 0: none); opts.n: the
-- number of pairs the mean is over (the whole step's, for micro-batches; default #chosen).
-- Returns loss (this slice's share of the mean), dchosen, drejected (lists), and the number of
-- pairs ranked right (r_chosen > r_rejected) and the sum of r_chosen - r_rejected.
function M.bradley_terry(chosen, rejected, margins, opts)
  opts = opts or {}
  local n = opts.n or #chosen
  local coef = opts.coef or 0
  local loss, dc, dr, right, diff_sum = 0, {}, {}, 0, 0
  for i = 1, #chosen do
    local d = chosen[i] - rejected[i]
    local z = d - (margins and margins[i] or 0)
    loss = loss + softplus(-z) / n
    local g = -sigmoid(-z) / n          -- d loss / d z
    dc[i], dr[i] = g, -g
    if coef ~= 0 then
      local s = chosen[i] + rejected[i]
      loss = loss + coef * s * s / n
      dc[i], dr[i] = dc[i] + 2 * coef * s / n, dr[i] + 2 * coef * s / n
    end
    if d > 0 then right = right + 1 end
    diff_sum = diff_sum + d
  end
  return loss, dc, dr, right, diff_sum
end

---------------------------------------------------------------------------- loading

local function json_value(v) if v == cjson.null then return nil end return v end

local function copy(t)
  local c = {}
  for k, v in pairs(t) do c[k] = v end
  return c
end

-- The decoder architecture of a folder's config and whether the folder is a classifier already.
local function decoder_of(cfg, dir)
  local arch = cfg.architectures and json_value(cfg.architectures[1])
  if reward_model.architectures[arch] then return reward_model.architectures[arch], true, arch end
  for cls, dec in pairs(reward_model.architectures) do
    if dec == arch then return dec, false, cls end
  end
  local known = {}
  for k, v in pairs(reward_model.architectures) do known[#known + 1] = k; known[#known + 1] = v end
  table.sort(known)
  error(("algo = reward: %s: config.json architecture '%s' is neither a causal LM nor a sequence classifier remax can "
    .. "train (%s)"):format(dir, tostring(arch), table.concat(known, ", ")), 0)
end

-- algo = reward trains on one process: data-parallel reward-model training (the pairs split over
-- ranks, the score head's gradient reduced with the model's) is not built. world: a
-- remax.bind.dist world (or anything with .size); nil or a world of one passes.
function M.check_world(world)
  local n = world and world.size or 1
  if n > 1 then
    error(("algo = \"reward\" runs on one process: this run has %d ranks (mpirun -np %d); data-parallel "
      .. "reward-model training is not supported yet: start it without mpirun/srun"):format(n, n), 0)
  end
end

-- The reward model to train: dir (the model folder: a causal LM, whose head is replaced by a
-- new score head, or a sequence classifier, whose head is kept); opts.resume_dir (a checkpoint
-- of this run: the classifier folder, or with LoRA the adapters), opts.model_opts
-- (remax.bind.model load options: dtype, device, weight_dtype, seed), opts.world. Returns
-- { model, head, dhead, tok, rm (the "model:" scorer over the same model and head), pad_id,
-- file_config, classifier_arch, from_classifier }.
function M.load(cfg, dir, opts)
  opts = opts or {}
  M.check_world(opts.world)
  if type(dir) ~= "string" then
    error("algo = reward needs a model folder (model = DIR: a causal LM or a sequence classifier); a model_config "
      .. "random init has no tokenizer to save with it", 0)
  end
  local pieces = opts
  local file_cfg = model_mod.read_config(dir)
  local decoder, classifier, cls_arch = decoder_of(file_cfg, dir)
  local load_dir = (not cfg.use_lora and pieces.resume_dir) or dir
  if load_dir ~= dir then
    file_cfg = model_mod.read_config(load_dir)
    decoder, classifier, cls_arch = decoder_of(file_cfg, load_dir)
  end
  if classifier then
    local labels = json_value(file_cfg.num_labels)
    if labels ~= nil and labels ~= 1 then
      error(("algo = reward: %s: num_labels = %s; a reward model has one score (num_labels = 1)"):format(load_dir,
        tostring(labels)), 0)
    end
  end
  -- the decoder without a language-model head (tied: no [vocab, hidden] matrix, no gradient)
  local dcfg = copy(file_cfg)
  dcfg.architectures = { decoder }
  dcfg.tie_word_embeddings = true
  for _, k in ipairs({ "num_labels", "id2label", "label2id", "problem_type" }) do dcfg[k] = nil end
  local mopts = copy(pieces.model_opts or { dtype = cfg.dtype, device = cfg.device, seed = cfg.seed })
  mopts.config = dcfg
  mopts.skip = { [HEAD] = true, ["lm_head.weight"] = true, ["score.bias"] = true }
  local model = model_mod.load(load_dir, mopts)
  model.source_dir = dir
  local hidden = tonumber(model:cfg().hidden_size)
  -- f32 (f64 for an f64 model: the gradient checks)
  local head_dtype = tonumber(model:cfg().dtype) == tensor.dtype("f64") and "f64" or "f32"
  local head = tensor.new({ 1, hidden }, head_dtype)
  if classifier then
    local st = require("remax.bind.safetensors").open(load_dir)
    local ok, err = pcall(function()
      if st:has("score.bias") then error(("%s: score.bias is present; the head has no bias"):format(load_dir), 0) end
      if not st:has(HEAD) then error(("%s: tensor 'score.weight' is missing"):format(load_dir), 0) end
      local info = st:info(HEAD)
      if #info.shape ~= 2 or info.shape[1] ~= 1 or info.shape[2] ~= hidden then
        error(("%s: score.weight has shape [%s], expected [1,%d]"):format(load_dir, table.concat(info.shape, ","), hidden), 0)
      end
      st:read_into(HEAD, head)
    end)
    st:close()
    if not ok then error("algo = reward: " .. tostring(err), 0) end
  else
    -- transformers' init of a new Linear head: normal(0, initializer_range)
    local std = json_value(file_cfg.initializer_range) or 0.02
    head:normal_(cfg.seed or 0, 0, 0, std)
  end
  if cfg.use_lora then lora.setup(model, cfg, pieces.resume_dir) end
  local tok = require("remax.bind.tokenizer").load(dir)
  local pad_id = json_value(file_cfg.pad_token_id)
  if pad_id == nil then pad_id = tok.pad_id end
  local rm = setmetatable({ dir = dir, model = model, tok = tok, head = head, pad_id = pad_id,
    max_length = json_value(file_cfg.max_position_embeddings) }, reward_model.RewardModel)
  rm.template = tok.chat_template and chat.detect(tok.chat_template) and { tokenizer = tok } or { template = "plain" }
  return { model = model, tok = tok, head = head, rm = rm, pad_id = pad_id, file_config = file_cfg,
    classifier_arch = cls_arch, from_classifier = classifier, dhead = tensor.new({ 1, hidden }, head_dtype) }
end

-- pieces: remax.run.setup's table for algo = reward (M.load's fields, opt, world,
-- model_source); hooks: say (optional). The Step interface of remax.step.step.
function M.new(pieces, cfg, hooks)
  local self = setmetatable({ cfg = cfg, model = pieces.model, tok = pieces.tok, head = pieces.head,
    dhead = pieces.dhead, rm = pieces.rm, pad_id = pieces.pad_id, source = pieces.model_source,
    file_config = pieces.file_config, classifier_arch = pieces.classifier_arch, opt = pieces.opt,
    dist = pieces.world, hooks = hooks or {}, rewards = {} }, Step)   -- no reward functions: it is the reward
  self.total_updates = cfg.max_steps
  self.warmup_steps = math.ceil(cfg.warmup_ratio * self.total_updates)
  return self
end

-- AdamW over the model's trained tensors and, beside it, the head's (same settings). opts as
-- remax.bind.optim.adamw's. Returns an optimizer with step, clip, state, load_state,
-- state_bytes and step_count (kept equal in both halves); the head's weight is in its state.
function M.optimizer(model, head_w, dhead, opts)
  local body = optim.adamw(model, opts)
  local head = optim.adamw({ [HEAD] = head_w }, { [HEAD] = dhead }, opts)
  local step = { head = head_w }
  local o = { body = body, head = head, step_count = 0, zero = nil }
  function o.step(me, lr)
    body:step(lr)
    head:step(lr)
    me.step_count = body.step_count
  end
  -- one global norm over both; with max_norm > 0 both are scaled by max_norm / norm when the
  -- norm is larger (each half clipped to its share of max_norm)
  function o.clip(_, max_norm)
    local nb, nh = body:clip(0), head:clip(0)
    local norm = math.sqrt(nb * nb + nh * nh)
    if max_norm and max_norm > 0 and norm > max_norm and norm == norm and norm ~= math.huge then
      if nb > 0 then optim.clip_grad_norm(body.norm_list, max_norm * nb / norm) end
      if nh > 0 then optim.clip_grad_norm(head.norm_list, max_norm * nh / norm) end
    end
    return norm
  end
  -- the head's weight rides in the state too: with LoRA the checkpoint folder holds adapters only
  function o.state()
    local s = body:state()
    for k, v in pairs(head:state().tensors) do s.tensors[k] = v end
    s.tensors["param." .. HEAD] = step.head
    return s
  end
  function o.load_state(me, s)
    body:load_state(s)
    head:load_state(s)
    if not s.tensors then me.step_count = body.step_count return end   -- the step count alone
    local w = s.tensors["param." .. HEAD]
    if not w then error("reward model: the trainer state lacks 'param.score.weight'", 0) end
    step.head:copy_(w)
    me.step_count = body.step_count
  end
  function o.state_bytes() return body:state_bytes() + head:state_bytes() end
  return o
end

---------------------------------------------------------------------------- encoding

-- The token ids of one side of a pair (a row of remax.step.preferences: prompt (nil, a string
-- or messages), chosen and rejected (strings or messages)) for the reward model rm, and whether
-- they are longer than its positions.
local function encode_side(rm, row, side)
  local value = row[side]
  local text
  if type(value) == "string" then
    if row.prompt == nil then text = value                        -- the whole text, as written
    else text = rm:render(row.prompt, value) end                  -- as a "model:" reward renders it
  else
    local messages = {}
    if row.prompt ~= nil then for _, m in ipairs(chat.messages(row.prompt)) do messages[#messages + 1] = m end end
    for _, m in ipairs(value) do messages[#messages + 1] = m end
    local o = { add_generation_prompt = false }
    for k, v in pairs(rm.template) do o[k] = v end
    text = chat.render(messages, o)
  end
  local ids = rm:encode(text)
  if #ids == 0 then error(("%s: column '%s' renders to no tokens"):format(row.where or "pair", side), 0) end
  return ids, rm.max_length ~= nil and #ids > rm.max_length
end

local function too_long(row, side, n, max)
  return ("%s: column '%s' is %d tokens, more than the model's max_position_embeddings = %d"):format(
    row.where or "pair", side, n, max)
end

function Step:encode_side(row, side)
  local ids, long = encode_side(self.rm, row, side)
  if long then error(too_long(row, side, #ids, self.rm.max_length), 0) end
  return ids
end

-- Both sides' ids, made once per row.
function Step:pair_ids(row)
  if not row.ids then row.ids = { chosen = self:encode_side(row, "chosen"), rejected = self:encode_side(row, "rejected") } end
  return row.ids.chosen, row.ids.rejected
end

-- Every pair of a dataset of remax.step.preferences, encoded once before the first step (their
-- ids kept on the rows): a pair with a side longer than the reward model's positions is left out
-- of ds and counted, as TRL's RewardTrainer leaves out pairs past max_length, instead of stopping
-- the run at the step that draws it (and at that step again on every resume). Returns a note to
-- say, or nil; a dataset left with no pair is refused.
function M.leave_out_long(rm, ds)
  local kept, dropped, first = {}, 0, nil
  for _, row in ipairs(ds.rows) do
    local c, long_c = encode_side(rm, row, "chosen")
    local r, long_r = encode_side(rm, row, "rejected")
    if long_c or long_r then
      dropped = dropped + 1
      first = first or (long_c and too_long(row, "chosen", #c, rm.max_length) or too_long(row, "rejected", #r, rm.max_length))
    else
      row.ids = { chosen = c, rejected = r }
      kept[#kept + 1] = row
    end
  end
  if dropped == 0 then return nil end
  if #kept == 0 then
    error(("every preference pair of %s is longer than the model's max_position_embeddings = %d tokens (the first: %s)")
      :format(ds.source, rm.max_length, first), 0)
  end
  ds.rows = kept
  return ("note: %d of %d preference pairs of %s are longer than the model's max_position_embeddings = %d tokens and are "
    .. "left out, as TRL's RewardTrainer leaves out pairs past max_length (the first: %s)"):format(dropped, dropped + #kept,
    ds.source, rm.max_length, first)
end

-- Scores of token rows. train: a train forward whose backward (Step:backward) follows.
-- Returns the scores (a list) and the pooled hidden states (f32 [B, hidden], on the cpu) and
-- the pooled positions (0-based, one per row).
function Step:forward(rows, train)
  local m = self.model
  local dtype = tonumber(m:cfg().dtype)
  local tok, mask = model_mod.pad_rows(rows)
  local positions = {}
  for b, ids in ipairs(rows) do positions[b] = reward_model.score_index(ids, self.pad_id) - 1 end
  local h, err
  if train then
    h, err = classifier.hidden_train(m, tok, mask, positions, self.cfg.gradient_checkpointing)
  else
    h, err = classifier.hidden_at(m, tok, mask, positions)
  end
  if not h then error("reward model: " .. err, 0) end
  if dtype ~= tonumber(self.head.dtype) then h = h:to(tonumber(self.head.dtype)) end
  local s = classifier.head(h, self.head, 2)
  local scores = {}
  for b = 1, #rows do scores[b] = s:get(b, 1) end
  return scores, h, positions
end

-- After Step:forward(rows, true): accumulates the gradients of sum_b dscore[b] * score[b] into
-- the head's (self.dhead) and the model's.
function Step:backward(h, positions, dscore)
  local B = #dscore
  local hdt = tonumber(self.head.dtype)
  local rows = {}
  for b = 1, B do rows[b] = { dscore[b] } end
  local ds = tensor.from(rows, hdt)
  local dh = tensor.new({ B, tonumber(h:size(2)) }, hdt)
  classifier.head_backward(dh, self.dhead, ds, h, self.head, 2)
  local dtype = tonumber(self.model:cfg().dtype)
  if dtype ~= hdt then dh = dh:to(dtype) end
  local ok, err = classifier.hidden_backward(self.model, positions, dh)
  if not ok then error("reward model: " .. err, 0) end
end

---------------------------------------------------------------------------- the step

-- Scores, loss and gradients of one micro-batch of pairs (chosen and rejected in one forward);
-- n: the pairs of the whole step.
function Step:micro_step(pairs_, n)
  local rows, margins = {}, {}
  local any_margin = false
  for i, p in ipairs(pairs_) do
    local c, r = self:pair_ids(p)
    rows[i], rows[#pairs_ + i] = c, r
    margins[i] = p.margin or 0
    if p.margin then any_margin = true end
  end
  local T = 0
  for _, ids in ipairs(rows) do if #ids > T then T = #ids end end
  require("remax.step.fit").check_train(self.model, #rows, T, { checkpoint = self.cfg.gradient_checkpointing,
    what = "reward model pairs" })
  local scores, h, positions = self:forward(rows, true)
  local chosen, rejected = {}, {}
  for i = 1, #pairs_ do chosen[i], rejected[i] = scores[i], scores[#pairs_ + i] end
  local loss, dc, dr, right, diff_sum = M.bradley_terry(chosen, rejected, any_margin and margins or nil,
    { n = n, coef = self.cfg.center_rewards_coefficient })
  local d = {}
  for i = 1, #pairs_ do d[i], d[#pairs_ + i] = dc[i], dr[i] end
  self:backward(h, positions, d)
  local sum_c, sum_r = 0, 0
  for i = 1, #pairs_ do sum_c, sum_r = sum_c + chosen[i], sum_r + rejected[i] end
  return { loss = loss, right = right, diff_sum = diff_sum, sum_c = sum_c, sum_r = sum_r, tokens = #rows * T }
end

-- One optimizer update on a batch of pairs (per_device_train_batch_size pairs per forward).
-- Returns the step's metrics. opts.step: the update's number (the schedule's position).
function Step:run(batch, opts)
  opts = opts or {}
  opts.total, opts.warmup = opts.total or self.total_updates, opts.warmup or self.warmup_steps
  local cfg = self.cfg
  local t0 = now()
  local n = #batch
  self.model:zero_grad()
  self.dhead:fill_(0)
  local per = cfg.per_device_train_batch_size
  local loss, right, diff_sum, sum_c, sum_r, tokens = 0, 0, 0, 0, 0, 0
  local earlier = false
  for first = 1, n, per do
    local chunk = {}
    for i = first, math.min(n, first + per - 1) do chunk[#chunk + 1] = batch[i] end
    if earlier then self.model:hold_grads() end
    local st = self:micro_step(chunk, n)
    if earlier then self.model:add_held_grads() end
    earlier = true
    loss, right, diff_sum = loss + st.loss, right + st.right, diff_sum + st.diff_sum
    sum_c, sum_r, tokens = sum_c + st.sum_c, sum_r + st.sum_r, tokens + st.tokens
  end
  local norm = self.opt:clip(cfg.max_grad_norm)
  local step = opts.step or (self.opt.step_count + 1)
  local lr = optim.schedule(cfg.lr_scheduler_type, cfg.learning_rate, step, opts.total or cfg.max_steps,
    opts.warmup or 0)
  local m = { loss = loss, grad_norm = norm, lr = lr, accuracy = right / n, margin = diff_sum / n,
    rewards_chosen = sum_c / n, rewards_rejected = sum_r / n, pairs = n }
  local finite = loss == loss and math.abs(loss) ~= math.huge and norm == norm and norm ~= math.huge
  if finite then self.opt:step(lr)
  else m.skipped, m.bad_loss, m.bad_norm = true, loss, norm; self.model:zero_grad() end
  m.time_train = now() - t0
  m.tokens_per_s = tokens / math.max(m.time_train, 1e-9)
  m.time_generate, m.time_score = 0, 0
  return m
end

-- Held-out pairs: the share ranked right (r_chosen > r_rejected) and the mean of
-- r_chosen - r_rejected, scored by the inference forward that a "model:" reward runs.
function Step:evaluate(all, opts)
  opts = opts or {}
  local t0 = now()
  local rows = {}
  for i = 1, math.min(#all, self.cfg.eval_size or #all) do rows[i] = all[i] end
  local bs = opts.batch_size or self.cfg.per_device_eval_batch_size or reward_model.DEFAULT_BATCH_SIZE
  local right, diff, n = 0, 0, 0
  for first = 1, #rows, bs do
    local ids = {}
    local last = math.min(#rows, first + bs - 1)
    for i = first, last do
      local c, r = self:pair_ids(rows[i])
      ids[#ids + 1], ids[#ids + 2] = c, r
    end
    local s = self.rm:score_ids(ids, #ids)
    for k = 1, #ids, 2 do
      local d = s[k] - s[k + 1]
      if d > 0 then right = right + 1 end
      diff, n = diff + d, n + 1
    end
  end
  local margin = n > 0 and diff / n or 0
  return { accuracy = n > 0 and right / n or 0, margin = margin, reward = margin, n = n, seconds = now() - t0,
    what = "pair accuracy" }
end

-- The rest of the Step interface (remax.step.step's): resume state (without tensors: the step
-- count alone), ranks (one), memory; no completions, and no reward functions or reference for
-- hot reload to replace or load (it is the reward).
function Step:state(without_moments)
  local os_ = without_moments and { step = self.opt.step_count } or self.opt:state()
  return { optimizer_step = os_.step, tensors = os_.tensors }
end
function Step:restore(state) self.opt:load_state({ step = state.optimizer_step, tensors = state.tensors }) end
function Step:share_from_root() self.dist:broadcast_model(self.model, self.opt:state().tensors) end
function Step:completion_records() return {} end
function Step:reward_functions() return self.rewards end
function Step:set_rewards() end
function Step:set_reward() end
function Step:trial() end
function Step:has_reference() return false end
function Step:load_reference() error("algo = reward has no reference model (no KL term: beta does nothing here)", 0) end
function Step:memory_mib()
  local m = self.model:memory()
  return (m.params + m.grads + m.activations + m.head + self.opt:state_bytes()) / 1048576
end

---------------------------------------------------------------------------- saving

-- The classifier's config.json fields on top of the decoder's.
function Step:classifier_config()
  return { architectures = { self.classifier_arch }, num_labels = 1, id2label = { ["0"] = "LABEL_0" },
    label2id = { LABEL_0 = 0 }, pad_token_id = self.pad_id, tie_word_embeddings = json_value(self.file_config.tie_word_embeddings) or false }
end

-- A Hugging Face sequence-classification folder (config.json with the classifier architecture
-- and num_labels = 1, model.safetensors with the decoder and score.weight [1, hidden], the
-- tokenizer files): what a "model:" reward and transformers load. With LoRA the adapters are
-- merged into it. opts.dtype: the saved dtype (default the compute dtype; the head is saved in it too).
function Step:save(dir, opts)
  opts = opts or {}
  local extra = { [HEAD] = self.head }
  local merged = self.model.lora and lora.merged(self.model) or nil
  local source = self.model.source_dir
  self.model:save_full(dir, { dtype = opts.dtype, replace = merged, extra = extra, config = self:classifier_config() })
  self.model.source_dir = source
end

-- save_merged's folder: the same classifier folder (save merges LoRA's adapters already).
function Step:save_merged(dir) self:save(dir) end

-- What a checkpoint saves: the classifier folder, or with LoRA the adapters (the head is in the
-- trainer state).
function Step:checkpoint_model()
  local step = self
  if self.model.lora then return self.model end
  return { source_dir = self.model.source_dir, save = function(me, dir) step:save(dir); me.source_dir = step.model.source_dir end }
end

return M
