-- remax.bind.classifier: what a sequence classifier (a reward model: a decoder and a bias-free
-- score head [1, hidden]) asks of the engine: the decoder's hidden state at one position per row,
-- of padded rows (rx_model_hidden_at) or of rows end to end (rx_model_hidden_at_packed), the same
-- kept for a backward whose gradient enters at those positions only (rx_model_hidden_train,
-- rx_model_hidden_backward), and the head's matmul (rx_matmul_forward / _backward). Positions
-- are 0-based, one per row, as the engine counts them. The model's calls return nil and the
-- engine's message on failure (the callers name the reward model); the head's raise.
--
--   local h = classifier.hidden_at(model, tok, mask, { 4, 6 })   -- [2, hidden], the model's dtype
--   local s = classifier.head(h, head)                           -- [2, 1]: the scores
local ffi = require("ffi")
local rx = require("remax.bind.ffi")
local tensor = require("remax.bind.tensor")
local C, check = rx.C, rx.check

local M = {}

local function index_of(positions)
  local index = ffi.new("int64_t[?]", #positions)
  for b, p in ipairs(positions) do index[b - 1] = p end
  return index
end

local function hidden_for(model, rows)
  return tensor.new({ rows, tonumber(model:cfg().hidden_size) }, tonumber(model:cfg().dtype))
end

-- Hidden states [#positions, hidden] of padded rows (tok, mask [B, T], i32) at positions[b] of row b.
function M.hidden_at(model, tok, mask, positions)
  local h = hidden_for(model, #positions)
  if C.rx_model_hidden_at(model.handle, tok, mask, index_of(positions), h) ~= 0 then return nil, rx.last_error() end
  return h
end

-- The same for rows (Lua lists of ids) laid end to end, each computed as if alone (padding-free);
-- positions[b] counts within row b.
function M.hidden_at_packed(model, rows, positions)
  local S, N = #rows, 0
  for _, ids in ipairs(rows) do N = N + #ids end
  local tok, cu = tensor.new({ 1, N }, "i32"), tensor.new({ S + 1 }, "i32")
  local tp, cp = ffi.cast("int32_t*", tok.data), ffi.cast("int32_t*", cu.data)
  local at = 0
  for b, ids in ipairs(rows) do
    cp[b - 1] = at
    for t, id in ipairs(ids) do tp[at + t - 1] = id end
    at = at + #ids
  end
  cp[S] = N
  local h = hidden_for(model, S)
  if C.rx_model_hidden_at_packed(model.handle, tok, cu, index_of(positions), h) ~= 0 then return nil, rx.last_error() end
  return h
end

-- hidden_at as a train forward (activations kept, checkpoint: recomputed in the backward) whose
-- backward is M.hidden_backward with the same positions.
function M.hidden_train(model, tok, mask, positions, checkpoint)
  local h = hidden_for(model, #positions)
  local fo = ffi.new("rx_forward_opts")
  fo.train, fo.checkpoint = 1, checkpoint and 1 or 0
  if C.rx_model_hidden_train(model.handle, tok, mask, index_of(positions), h, fo) ~= 0 then return nil, rx.last_error() end
  return h
end

-- Accumulates the model's gradients of sum(dh * h) for the last M.hidden_train (dh: its shape
-- and the model's dtype). true, or nil and the message.
function M.hidden_backward(model, positions, dh)
  if C.rx_model_hidden_backward(model.handle, index_of(positions), dh) ~= 0 then return nil, rx.last_error() end
  return true
end

-- The scores [B, 1] = h [B, hidden] x head^T ([1, hidden]), in h's dtype. level: the caller's
-- error level, as rx.check takes it.
function M.head(h, head, level)
  local s = tensor.new({ tonumber(h:size(1)), 1 }, tonumber(h.dtype))
  check(C.rx_matmul_forward(s, h, head, nil), (level or 1) + 1)
  return s
end

-- The head's backward: dh = ds x head, dhead += ds^T x h.
function M.head_backward(dh, dhead, ds, h, head, level)
  check(C.rx_matmul_backward(dh, dhead, nil, ds, h, head), (level or 1) + 1)
end

return M
