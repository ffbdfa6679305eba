-- bench/multiturn.lua: multi-turn rollout throughput, episodes/s and tokens/s, at 1, 8 and 32 rows
-- and 4 turns: remax's continued rows (one KV cache per episode: after each turn only the
-- observation's tokens are prefilled, batched over the rows, rx_generate_continue) against the
-- loop every single-turn generator needs, which re-prefills the whole conversation each turn
-- (a new generation per turn whose prompt is everything so far). Both greedy, the same turns and
-- observations; the bench checks that they produce the same tokens. Best of N runs. Not a test.
--   REMAX_LIB=$PWD/build/libremax.so LUA_PATH='lua/?.lua;lua/?/init.lua' luajit bench/multiturn.lua [reps] [rows,...]
--   (PROMPT=, TURN=, OBS=, TURNS= change the shape: prompt tokens, tokens per turn, per observation, turns)
local remax = require("remax")
local rx = require("remax.bind.ffi")
local ffi = require("ffi")
local C = rx.C
local now = require("remax.bind.clock").now

local reps = tonumber(arg[1]) or 2
local row_counts = {}
for n in (arg[2] or "1,8,32"):gmatch("%d+") do row_counts[#row_counts + 1] = tonumber(n) end
-- an agent's shape by default: a long system prompt (tool descriptions), short turns, tool results
local function env(name, default) return tonumber(os.getenv(name) or "") or default end
local PROMPT, TURN, OBS, TURNS = env("PROMPT", 256), env("TURN", 16), env("OBS", 48), env("TURNS", 4)
local cfg = { architectures = { "Qwen2ForCausalLM" }, vocab_size = 260, hidden_size = 256, intermediate_size = 688,
  num_hidden_layers = 4, num_attention_heads = 8, num_key_value_heads = 2, max_position_embeddings = 1024,
  rope_theta = 10000, rms_norm_eps = 1e-6, tie_word_embeddings = true }
local model = remax.model.new(cfg, { seed = 1, init_std = 0.05 })
local V = cfg.vocab_size

local function check(rc) if rc ~= 0 then error(rx.last_error(), 2) end end

local function prompt_of(r) local p = {} for t = 1, PROMPT do p[t] = (r * 31 + t * 7) % V end return p end
local function obs_of(r, turn) local o = {} for t = 1, OBS do o[t] = (r * 13 + turn * 17 + t * 5) % V end return o end

-- One generation over prompts (lists), every row greedy with budget max_new; `turn_hook(g, res,
-- R, max_new)` drives it. Returns the result arrays.
local function generation(prompts, max_new, append, drive)
  local R = #prompts
  local total = 0
  for _, p in ipairs(prompts) do total = total + #p end
  local toks, offs = ffi.new("int32_t[?]", total), ffi.new("int64_t[?]", R + 1)
  local k = 0
  for i, p in ipairs(prompts) do
    offs[i - 1] = k
    for _, id in ipairs(p) do toks[k] = id; k = k + 1 end
  end
  offs[R] = k
  local row_prompt, rows = ffi.new("int64_t[?]", R), ffi.new("rx_sampling[?]", R)
  for r = 0, R - 1 do
    row_prompt[r] = r
    rows[r].temperature, rows[r].top_p, rows[r].max_new_tokens, rows[r].key = 0, 1, max_new, r
  end
  local req = ffi.new("rx_generate_request")
  req.num_prompts, req.prompt_tokens, req.prompt_offsets = R, toks, offs
  req.num_rows, req.row_prompt, req.rows, req.max_new_tokens, req.append_capacity = R, row_prompt, rows, max_new, append
  local res = ffi.new("rx_generate_result")
  local out = { tok = ffi.new("int32_t[?]", R * max_new), lp = ffi.new("float[?]", R * max_new),
    len = ffi.new("int32_t[?]", R), fin = ffi.new("int32_t[?]", R) }
  res.tokens, res.logprobs, res.lengths, res.finish = out.tok, out.lp, out.len, out.fin
  local g = ffi.new("rx_generator*[1]")
  check(C.rx_generate_begin(g, model.handle, req, res))
  local ok, err = pcall(drive, g[0], out, R, max_new)
  C.rx_generate_end(g[0])
  if not ok then error(err, 0) end
  return out
end

-- remax: one generation per batch; each turn TURN tokens, then every row pauses and continues
-- with its observation in one batched prefill.
local function continued(R)
  local prompts = {}
  for r = 1, R do prompts[r] = prompt_of(r) end
  local done = ffi.new("int32_t[1]")
  local out = generation(prompts, TURN * TURNS, OBS * TURNS + 8, function(g, o)
    for turn = 1, TURNS do
      while o.len[0] < TURN * turn do check(C.rx_generate_step(g, done)) end
      if turn == TURNS then break end
      for r = 0, R - 1 do check(C.rx_generate_stop_row(g, r)) end
      local crow, ctok, coff = ffi.new("int64_t[?]", R), ffi.new("int32_t[?]", R * OBS), ffi.new("int64_t[?]", R + 1)
      for r = 0, R - 1 do
        crow[r], coff[r] = r, r * OBS
        for t, id in ipairs(obs_of(r + 1, turn)) do ctok[r * OBS + t - 1] = id end
      end
      coff[R] = R * OBS
      check(C.rx_generate_continue(g, R, crow, ctok, coff))
    end
  end)
  local seqs = {}
  for r = 0, R - 1 do
    local s = {}
    for t = 0, TURN * TURNS - 1 do s[#s + 1] = out.tok[r * TURN * TURNS + t] end
    seqs[r + 1] = s
  end
  return seqs
end

-- the peer loop: each turn a new generation whose prompt is the conversation so far
local function reprefill(R)
  local convo, seqs = {}, {}
  for r = 1, R do convo[r], seqs[r] = prompt_of(r), {} end
  local done = ffi.new("int32_t[1]")
  for turn = 1, TURNS do
    local out = generation(convo, TURN, 0, function(g)
      repeat check(C.rx_generate_step(g, done)) until done[0] ~= 0
    end)
    for r = 1, R do
      for t = 0, TURN - 1 do
        local id = out.tok[(r - 1) * TURN + t]
        seqs[r][#seqs[r] + 1] = id
        convo[r][#convo[r] + 1] = id
      end
      if turn < TURNS then for _, id in ipairs(obs_of(r, turn)) do convo[r][#convo[r] + 1] = id end end
    end
  end
  return seqs
end

local function best(fn, R)
  local result = fn(R)   -- warm-up
  local b = math.huge
  for _ = 1, reps do
    local t0 = now()
    fn(R)
    b = math.min(b, now() - t0)
  end
  return b, result
end

local same_all = true
print(("multi-turn rollouts: %d-token prompt, %d turns of %d tokens, %d-token observations; model %d layers x %d, vocab %d, OMP_NUM_THREADS=%d (0: unset)")
  :format(PROMPT, TURNS, TURN, OBS, cfg.num_hidden_layers, cfg.hidden_size, V, tonumber(os.getenv("OMP_NUM_THREADS") or 0)))
print(("%5s  %12s  %12s  %14s  %14s  %7s  %s"):format("rows", "remax ep/s", "peer ep/s", "remax tok/s", "peer tok/s", "ratio",
  "same tokens"))
for _, R in ipairs(row_counts) do
  local tc, a = best(continued, R)
  local tr, b = best(reprefill, R)
  local same = true
  for r = 1, R do for t = 1, TURN * TURNS do same = same and a[r][t] == b[r][t] end end
  same_all = same_all and same
  local tokens = R * TURN * TURNS
  print(("%5d  %12.2f  %12.2f  %14.0f  %14.0f  %6.2fx  %s"):format(R, R / tc, R / tr, tokens / tc, tokens / tr, tr / tc,
    same and "yes" or "NO"))
end
if not same_all then os.exit(1) end
