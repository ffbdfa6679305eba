-- bench/llamacpp_decode.lua: greedy batched decoding, remax beside llama.cpp, in one run on the
-- same random weights: remax's model of a bench/common.lua shape, and the GGUF file remax exports
-- of it at each weight dtype. Every row decodes exactly `new` tokens after a `prompt`-token
-- prompt; each side times one run after a short warm-up, prefill included; tokens/s = rows * new
-- / seconds. With --repeat K the whole set runs K times, remax and the peer alternating pair by
-- pair, and the summary gives each figure's median and spread, the ratios taken round by round.
-- The peer (--peer) is llama.cpp's own batched decoder, llama-batched-bench (every row in one
-- batch, as remax decodes), built natively by bench/llamacpp_install.sh from the llama.cpp source
-- of llama-cpp-python's sdist: "batched", the default (REMAX_LLAMACPP_BATCHED names the program;
-- bench/llamacpp_decode.sh sets it); or "none" (remax alone: its bf16 weights against its f32
-- ones). Not a test.
--   bench/llamacpp_decode.sh                       # the wrapper: threads, OpenBLAS kernels, the builds
--   ./remax run bench/llamacpp_decode.lua --shape qwen0.5b --rows 1,8,16,32 --dtypes f32,bf16 --peer batched --repeat 3
-- remax's weights at a dtype are its weight_dtype (f32, bf16); a dtype remax cannot keep
-- weights in (f16, q8_0) is skipped, saying why: llama.cpp alone at it is no comparison.
local cjson = require("cjson")
local remax = require("remax")
local gguf = require("remax.formats.gguf")
local fs = require("remax.bind.fs")
local now = require("remax.bind.clock").now

local here = arg[0]:match("^(.-)[^/]*$")
local common = dofile(here .. "common.lua")
local opts = common.options({ shape = "qwen0.5b", rows = "1,8,16,32", prompt = 64, new = 128, dtypes = "f32,bf16",
  threads = tonumber(os.getenv("OMP_NUM_THREADS") or "") or 2, warmup = 1, keep = false, peer = "batched",
  ["repeat"] = 1 }, arg)

local function list(v)
  local out = {}
  for item in (tostring(v) .. ","):gmatch("([^,]+),") do out[#out + 1] = tonumber(item) or item end
  return out
end

local batched = os.getenv("REMAX_LLAMACPP_BATCHED") or ".cache/llamacpp-build/bin/llama-batched-bench"
if opts.peer == "batched" and not fs.exists(batched) then
  error(("llama-batched-bench is not built in %s: run bench/llamacpp_install.sh"):format(batched), 0)
elseif opts.peer ~= "batched" and opts.peer ~= "none" then
  error("--peer " .. tostring(opts.peer) .. ": expected batched or none", 0)
end

local function sh(cmd)
  local p = assert(io.popen(cmd))
  local out = p:read("*a")
  p:close()
  return (out:gsub("%s+$", ""))
end

local work = ".cache/bench-llamacpp"
fs.mkdir_p(work)
local model, cfg = common.model(opts.shape)
local tok_dir = work .. "/tokenizer"
fs.mkdir_p(tok_dir)
remax.tokenizer.write_byte_level(tok_dir)   -- 260 tokens; the GGUF pads the vocabulary to the model's
local tok = remax.tokenizer.load(tok_dir)

print(("remax %s (OpenBLAS kernels: %s; bf16 kernels: %s), %s, %d threads each; shape %s, prompt %d, new %d; peer %s"):format(
  remax.version(), require("ffi").string(remax.ffi.C.rx_blas_core()), require("ffi").string(remax.ffi.C.rx_bf16_kernels()),
  sh("lscpu | sed -n 's/^Model name: *//p'"), opts.threads, opts.shape, opts.prompt, opts.new,
  opts.peer == "batched" and "llama-batched-bench (native build, " .. batched .. ")" or "none"))

-- The remax model that decodes with weights stored in a dtype (its weight_dtype: f32, or bf16
-- since remax keeps frozen weights in bf16), holding the f32 model's weights rounded, or nil and
-- why not. The GGUF of that dtype is exported from it: both sides hold the same bits.
local function remax_model(dtype)
  if dtype == "f32" then return model end
  local ok, m = pcall(common.model, opts.shape, dtype)
  if not ok then return nil, tostring(m) end
  for _, name in ipairs(model.names) do m:param(name):copy_(model:param(name)) end
  return m
end

local function remax_decode(m, prompts)
  local gen = { temperature = 0, max_new_tokens = opts.new }
  -- the warm-up as llama-batched-bench's (one small batch): the prompts and 2 new tokens
  for _ = 1, opts.warmup do m:generate(prompts, { temperature = 0, max_new_tokens = math.min(2, opts.new) }) end
  local t0 = now()
  local out = m:generate(prompts, gen)
  local seconds = now() - t0
  assert(out.tokens_generated == #prompts * opts.new, "a row ended early")
  return out.tokens_generated / seconds, seconds
end

-- llama-batched-bench: rows sequences of `prompt` tokens each (not shared), then `new` tokens
-- each, all in one batch per step, after its own warm-up; llama.cpp's default CPU settings.
local function batched_decode(path, rows)
  local cmd = ("%s -m %s -c %d -b 2048 -ub 512 -npp %d -ntg %d -npl %d -t %d -tb %d --output-format jsonl 2>&1")
    :format(batched, path, rows * (opts.prompt + opts.new), opts.prompt, opts.new, rows, opts.threads, opts.threads)
  local out = sh(cmd)
  local line = out:match('({"n_kv_max"[^\n]*})')
  local ok, r = pcall(cjson.decode, line or "")
  if not ok or not r.t then error("llama-batched-bench failed: " .. out:sub(-2000), 0) end
  return { tokens = rows * opts.new, tokens_per_s = rows * opts.new / r.t, seconds = r.t, threads = r.n_threads,
    flash_attention = r.flash_attn, kernels = "GGML_NATIVE" }
end

-- Every dtype's remax model and GGUF file first; then `repeat` rounds, each running every
-- (rows, dtype) pair with remax and the peer alternating, so that a shared machine's load falls
-- on both sides alike; then each pair's median and spread, remax over the peer, and remax bf16
-- over remax f32 (the weights' bytes halved) at each row count.
local models, paths, dtypes = {}, {}, {}
for _, dtype in ipairs(list(opts.dtypes)) do
  local m, why = remax_model(dtype)
  if not m then
    print(("%s: skipped: remax does not keep weights in %s (%s)"):format(dtype, dtype, (why:gsub("\n.*", ""))))
  else
    local path = ("%s/%s-%s.gguf"):format(work, opts.shape, dtype)
    if opts.peer ~= "none" then
      local t0 = now()
      local ex = gguf.export(m, path, { type = dtype, tokenizer = tok, name = opts.shape .. " random" })
      print(("%s: exported %s (%.0f MiB) in %.1f s"):format(dtype, path, ex.bytes / 2 ^ 20, now() - t0))
    end
    models[dtype], paths[dtype] = m, path
    dtypes[#dtypes + 1] = dtype
  end
end

local rows_list = list(opts.rows)
local got = {}   -- got[dtype][rows] = { remax = {tok/s ...}, peer = {tok/s ...} }
for _, dtype in ipairs(dtypes) do
  got[dtype] = {}
  for _, rows in ipairs(rows_list) do got[dtype][rows] = { remax = {}, peer = {} } end
end
for round = 1, opts["repeat"] do
  for _, rows in ipairs(rows_list) do
    local prompts = common.prompts(cfg, rows, opts.prompt)
    for _, dtype in ipairs(dtypes) do
      local r_tps = remax_decode(models[dtype], prompts)
      local l = opts.peer == "batched" and batched_decode(paths[dtype], rows)
        or { tokens = rows * opts.new, tokens_per_s = 0 / 0, threads = 0, kernels = "no peer" }
      assert(l.tokens == rows * opts.new, "llama.cpp decoded " .. tostring(l.tokens) .. " tokens")
      local g = got[dtype][rows]
      g.remax[#g.remax + 1], g.peer[#g.peer + 1] = r_tps, l.tokens_per_s
      print(("round %d  %-9s %-5s rows=%-3d remax %8.1f tok/s   llama.cpp %8.1f tok/s   ratio %.2fx   (llama.cpp: %d threads, flash attention %s, %s kernels)")
        :format(round, opts.shape, dtype, rows, r_tps, l.tokens_per_s, r_tps / l.tokens_per_s, l.threads,
          tostring(l.flash_attention), l.kernels))
      io.stdout:flush()
    end
  end
end

local function median(v)
  local t = {}
  for i, x in ipairs(v) do t[i] = x end
  table.sort(t)
  local n = #t
  return n % 2 == 1 and t[(n + 1) / 2] or (t[n / 2] + t[n / 2 + 1]) / 2, t[1], t[n]
end
local function ratios(a, b)   -- round by round: the two sides of one round ran back to back
  local r = {}
  for i = 1, #a do r[i] = a[i] / b[i] end
  return r
end

print(("summary over %d round(s): median (min-max); ratios taken round by round"):format(opts["repeat"]))
for _, dtype in ipairs(dtypes) do
  for _, rows in ipairs(rows_list) do
    local g = got[dtype][rows]
    local rm, rlo, rhi = median(g.remax)
    local pm, plo, phi = median(g.peer)
    local qm, qlo, qhi = median(ratios(g.remax, g.peer))
    print(("%-5s rows=%-3d remax %7.1f (%.1f-%.1f) tok/s   llama.cpp %7.1f (%.1f-%.1f) tok/s   remax/llama.cpp %.2fx (%.2f-%.2f)")
      :format(dtype, rows, rm, rlo, rhi, pm, plo, phi, qm, qlo, qhi))
  end
end
if got.bf16 and got.f32 then
  for _, rows in ipairs(rows_list) do
    local qm, qlo, qhi = median(ratios(got.bf16[rows].remax, got.f32[rows].remax))
    local lm, llo, lhi = median(ratios(got.bf16[rows].peer, got.f32[rows].peer))
    print(("bf16/f32 rows=%-3d remax %.2fx (%.2f-%.2f)   llama.cpp %.2fx (%.2f-%.2f)"):format(rows, qm, qlo, qhi, lm, llo, lhi))
  end
end
if not opts.keep then for _, dtype in ipairs(dtypes) do os.remove(paths[dtype]) end end
