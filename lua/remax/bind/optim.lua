-- remax.bind.optim: AdamW over named tensors, gradient norm and clipping, learning-rate schedules.
local ffi = require("ffi")
local rx = require("remax.bind.ffi")
local tensor = require("remax.bind.tensor")
local C, check = rx.C, rx.check

local M = {}

-- Parameters matching any of these Lua patterns get no weight decay (biases and norm scales,
-- picked by name, never by position).
M.default_no_decay = { "%.bias$", "norm%.weight$" }

local function sorted_names(params)
  local names = {}
  for name in pairs(params) do names[#names + 1] = name end
  table.sort(names)
  return names
end

local function matches_any(name, patterns)
  for _, p in ipairs(patterns) do
    if name:match(p) then return true end
  end
  return false
end

local AdamW = {}
AdamW.__index = AdamW

-- params, grads: tables name -> tensor (same keys). opts: lr, betas = {b1, b2}, eps,
-- weight_decay, no_decay = {patterns}.
function M.adamw(params, grads, opts)
  opts = opts or {}
  local self = setmetatable({
    lr = opts.lr or 1e-3,
    beta1 = (opts.betas or {})[1] or 0.9,
    beta2 = (opts.betas or {})[2] or 0.999,
    eps = opts.eps or 1e-8,
    weight_decay = opts.weight_decay or 0.0,
    step_count = 0,
    names = sorted_names(params),
    params = params, grads = grads, m = {}, v = {}, decay = {},
  }, AdamW)
  local no_decay = opts.no_decay or M.default_no_decay
  for _, name in ipairs(self.names) do
    local p, g = params[name], grads[name]
    if not g then error(("adamw: parameter '%s' has no gradient tensor"):format(name), 2) end
    local moment_dtype = p:dtype_name() == "f64" and "f64" or "f32"
    self.m[name] = tensor.new(p:size(), moment_dtype)
    self.v[name] = tensor.new(p:size(), moment_dtype)
    self.decay[name] = not matches_any(name, no_decay)
  end
  self.cfg = ffi.new("rx_adamw_config")
  return self
end

-- One update of every parameter. lr overrides the configured rate for this step (schedules).
function AdamW:step(lr)
  self.step_count = self.step_count + 1
  local cfg = self.cfg
  cfg.lr, cfg.beta1, cfg.beta2, cfg.eps = lr or self.lr, self.beta1, self.beta2, self.eps
  cfg.weight_decay, cfg.step = self.weight_decay, self.step_count
  for _, name in ipairs(self.names) do
    local rc = C.rx_adamw_step(self.params[name], self.grads[name], self.m[name], self.v[name], cfg,
      self.decay[name] and 1 or 0)
    if rc ~= 0 then error(name .. ": " .. rx.last_error(), 2) end
  end
end

-- Moments and step count, as tensors keyed "m.<name>", "v.<name>" (for checkpoints).
function AdamW:state()
  local s = { step = self.step_count, tensors = {} }
  for _, name in ipairs(self.names) do
    s.tensors["m." .. name] = self.m[name]
    s.tensors["v." .. name] = self.v[name]
  end
  return s
end

function AdamW:load_state(s)
  for _, name in ipairs(self.names) do
    for _, which in ipairs({ "m", "v" }) do
      local t = s.tensors[which .. "." .. name]
      if not t then error(("adamw state lacks '%s.%s'"):format(which, name), 2) end
      self[which][name]:copy_(t)
    end
  end
  self.step_count = s.step
end

local function tensor_array(list)
  local arr = ffi.new("rx_tensor*[?]", math.max(#list, 1))
  for i, t in ipairs(list) do arr[i - 1] = t end
  return arr
end

local function as_list(grads)
  if grads[1] then return grads end
  local list = {}
  for _, name in ipairs(sorted_names(grads)) do list[#list + 1] = grads[name] end
  return list
end

-- Global L2 norm of a list (or name -> tensor table) of gradients.
function M.grad_norm(grads)
  local list = as_list(grads)
  local out = ffi.new("double[1]")
  check(C.rx_grad_norm(ffi.cast("const rx_tensor *const *", tensor_array(list)), #list, out), 2)
  return out[0]
end

-- Scales gradients so their global norm is at most max_norm; returns the norm before clipping
-- (inf or nan when a gradient is not finite: skip that update).
function M.clip_grad_norm(grads, max_norm)
  local list = as_list(grads)
  local out = ffi.new("double[1]")
  check(C.rx_clip_grad_norm(tensor_array(list), #list, max_norm, out), 2)
  return out[0]
end

-- Learning rate of the step-th optimizer update (1-based) of total: a linear warmup over the
-- first warmup_steps updates (base_lr * step / warmup_steps, so none runs at lr 0), then
-- constant, linear or cosine decay counted as Hugging Face's schedulers count (0-based
-- s = step - 1): linear base_lr * (total - s) / (total - warmup_steps), cosine
-- base_lr * 0.5 * (1 + cos(pi * (s - warmup_steps) / (total - warmup_steps))). The first decay
-- update runs at base_lr and the last one above 0, so no update is wasted at lr 0.
function M.schedule(kind, base_lr, step, total, warmup_steps)
  warmup_steps = warmup_steps or 0
  if step <= warmup_steps and warmup_steps > 0 then return base_lr * step / warmup_steps end
  local s = step - 1
  local progress = total > warmup_steps and (s - warmup_steps) / (total - warmup_steps) or 1
  progress = math.min(math.max(progress, 0), 1)
  if kind == "constant" or kind == "constant_with_warmup" then return base_lr
  elseif kind == "linear" then return base_lr * (1 - progress)
  elseif kind == "cosine" then return base_lr * 0.5 * (1 + math.cos(math.pi * progress))
  end
  error(("unknown lr_scheduler_type '%s' (valid: constant, linear, cosine)"):format(tostring(kind)), 2)
end

return M
