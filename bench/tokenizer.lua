-- bench/tokenizer.lua: encode throughput (MB/s, one core) of remax's tokenizer and, in the same
-- run, of Hugging Face tokenizers (Rust, through its Python binding, one thread) on the same
-- tokenizer.json.
--   REMAX_LIB=build/libremax.so luajit bench/tokenizer.lua [qwen2|qwen35|llama3] [seconds]
-- Text: the English prose of /usr/share/common-licenses (GPL, GFDL, Apache...), encoded line by
-- line by both sides. The tokenizer.json is the one tests/lua/tokenizer_ref.py makes in
-- .cache/tokenizers from llama.cpp's vocabularies (tokenizers and transformers in .cache/venv:
-- tests/references.sh).
package.path = "lua/?.lua;lua/?/init.lua;" .. package.path
local T = require("remax").tokenizer

local model = arg[1] or "qwen2"
local seconds = tonumber(arg[2] or "3")
local PY, REF = ".cache/venv/bin/python", "tests/lua/tokenizer_ref.py"

local function run(cmd)
  local p = assert(io.popen(cmd .. " 2>&1"))
  local out = p:read("*a")
  local ok = p:close()
  return out, ok == true or ok == 0
end
local folders, ok = run(PY .. " " .. REF .. " prepare")
assert(ok, "cannot make the reference tokenizers (tests/references.sh installs them into .cache/venv): " .. folders)
local dir = require("cjson").decode(folders)[model]
assert(dir, "no tokenizer named " .. model .. " (qwen2, qwen35, llama3)")

local parts = {}
for _, name in ipairs({ "GPL-3", "GPL-2", "LGPL-3", "LGPL-2.1", "GFDL-1.3", "GFDL-1.2", "Apache-2.0", "Artistic", "MPL-2.0", "CC0-1.0" }) do
  local f = io.open("/usr/share/common-licenses/" .. name, "rb")
  if f then parts[#parts + 1] = f:read("*a"); f:close() end
end
local text = table.concat(parts, "\n")
assert(#text > 10000, "no English text found under /usr/share/common-licenses")
local lines = {}
for line in text:gmatch("[^\n]*\n?") do if #line > 0 then lines[#lines + 1] = line end end
local path = os.tmpname()
local f = assert(io.open(path, "wb")); f:write(text); f:close()

local clock = os.clock
local t0 = clock()
local tok = T.load(dir)
local load_s = clock() - t0

-- first pass (cold piece cache), then as many passes as fit in `seconds`
local n_ids = 0
t0 = clock()
for i = 1, #lines do n_ids = n_ids + #tok:encode(lines[i], { add_special_tokens = false }) end
local cold = #text / (clock() - t0) / 1e6
local bytes, passes = 0, 0
t0 = clock()
repeat
  for i = 1, #lines do tok:encode(lines[i], { add_special_tokens = false }) end
  bytes, passes = bytes + #text, passes + 1
until clock() - t0 >= seconds
local warm = bytes / (clock() - t0) / 1e6

local out = run(string.format("TOKENIZERS_PARALLELISM=false RAYON_NUM_THREADS=1 %s %s bench %s %s %s", PY, REF, model, path, seconds))
os.remove(path)
local peer, peer_batch = out:match("^(%S+) (%S+)")
peer, peer_batch = tonumber(peer), tonumber(peer_batch)

print(string.format("text: %d bytes, %d lines, %d %s tokens (%.2f bytes/token); load %.2f s", #text, #lines, n_ids,
  model, #text / n_ids, load_s))
print(string.format("remax encode: %.2f MB/s (first pass, cold cache %.2f MB/s)", warm, cold))
if peer then
  print(string.format("Hugging Face tokenizers (Rust via Python, one thread): %.2f MB/s a call per line, %.2f MB/s in one encode_batch",
    peer, peer_batch))
  print(string.format("ratio remax / tokenizers: %.2fx (a call per line), %.2fx (encode_batch)", warm / peer, warm / peer_batch))
else
  print("reference did not run: " .. out)
end
