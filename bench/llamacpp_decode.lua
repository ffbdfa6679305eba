-- bench/llamacpp_decode.lua: greedy batched decoding, remax beside llama.cpp (node-llama-cpp
-- 3.21.1, bench/llamacpp_install.sh), in one run on the same random weights: remax's model of a
-- bench/common.lua shape, and the GGUF file remax exports of it at each weight dtype. Every row
-- decodes exactly `new` tokens after a `prompt`-token random prompt; each side times one run
-- after one warm-up run, prefill included; tokens/s = rows * new / seconds. Not a test.
--   bench/llamacpp_decode.sh                       # the wrapper: threads, OpenBLAS kernels
--   ./remax run bench/llamacpp_decode.lua --shape qwen0.5b --rows 1,8,16,32 --dtypes f32,bf16
-- remax's weights at a dtype are its weight_dtype (f32, bf16); a dtype remax cannot keep
-- weights in (f16, q8_0) is skipped, saying why: llama.cpp alone at it is no comparison.
local cjson = require("cjson")
local remax = require("remax")
local gguf = require("remax.bind.gguf")
local fs = require("remax.bind.fs")
local now = require("remax.bind.clock").now

local here = arg[0]:match("^(.-)[^/]*$")
local common = dofile(here .. "common.lua")
local opts = common.options({ shape = "qwen0.5b", rows = "1,8,16,32", prompt = 64, new = 128, dtypes = "f32,bf16",
  threads = tonumber(os.getenv("OMP_NUM_THREADS") or "") or 2, warmup = 1, keep = false }, arg)

local function list(v)
  local out = {}
  for item in (tostring(v) .. ","):gmatch("([^,]+),") do out[#out + 1] = tonumber(item) or item end
  return out
end

local llamacpp = os.getenv("REMAX_LLAMACPP_HOME") or ".cache/llamacpp"
if not fs.exists(llamacpp .. "/node_modules/node-llama-cpp/package.json") then
  error("node-llama-cpp is not installed in " .. llamacpp .. ": run bench/llamacpp_install.sh", 0)
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

print(("remax %s (OpenBLAS kernels: %s), %s, %d threads each; shape %s, prompt %d, new %d"):format(remax.version(),
  require("ffi").string(remax.ffi.C.rx_blas_core()), sh("lscpu | sed -n 's/^Model name: *//p'"), opts.threads,
  opts.shape, opts.prompt, opts.new))

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
  for _ = 1, opts.warmup do m:generate(prompts, gen) end
  local t0 = now()
  local out = m:generate(prompts, gen)
  local seconds = now() - t0
  assert(out.tokens_generated == #prompts * opts.new, "a row ended early")
  return out.tokens_generated / seconds, seconds
end

local function llamacpp_decode(path, prompts)
  local req = work .. "/request.json"
  local f = assert(io.open(req, "wb"))
  f:write(cjson.encode({ model = path, prompts = prompts, new = opts.new, threads = opts.threads, warmup = opts.warmup }))
  f:close()
  local out = sh(("REMAX_LLAMACPP_HOME=%s node %sllamacpp_peer.mjs decode %s"):format(llamacpp, here, req))
  local ok, r = pcall(cjson.decode, out)
  if not ok then error("llamacpp_peer decode failed: " .. out, 0) end
  return r
end

-- the widest vector extension llama.cpp's CPU build reports using
local function simd(info)
  for _, f in ipairs({ "AVX512_BF16", "AVX512", "AVX2", "AVX", "SSE3" }) do
    if info:find(f .. " = 1", 1, true) then return f end
  end
  return "?"
end

for _, dtype in ipairs(list(opts.dtypes)) do
  local m, why = remax_model(dtype)
  if not m then
    print(("%s: skipped: remax does not keep weights in %s (%s)"):format(dtype, dtype, (why:gsub("\n.*", ""))))
  else
    local path = ("%s/%s-%s.gguf"):format(work, opts.shape, dtype)
    local t0 = now()
    local ex = gguf.export(m, path, { type = dtype, tokenizer = tok, name = opts.shape .. " random" })
    print(("%s: exported %s (%.0f MiB) in %.1f s"):format(dtype, path, ex.bytes / 2 ^ 20, now() - t0))
    for _, rows in ipairs(list(opts.rows)) do
      local prompts = common.prompts(cfg, rows, opts.prompt)
      local r_tps = remax_decode(m, prompts)
      local l = llamacpp_decode(path, prompts)
      assert(l.tokens == rows * opts.new, "llama.cpp decoded " .. tostring(l.tokens) .. " tokens")
      print(("%-9s %-5s rows=%-3d remax %8.1f tok/s   llama.cpp %8.1f tok/s   ratio %.2fx   (llama.cpp: %d threads, flash attention %s, %s kernels)")
        :format(opts.shape, dtype, rows, r_tps, l.tokens_per_s, r_tps / l.tokens_per_s, l.threads,
          tostring(l.flash_attention), simd(l.cpu)))
      io.stdout:flush()
    end
    if not opts.keep then os.remove(path) end
  end
end
