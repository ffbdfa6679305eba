/* fuzz_data.c: libFuzzer target over the dataset loader (lua/remax/formats/data.lua, lua-cjson) in an
 * embedded LuaJIT state: JSONL and JSON-array files with bad lines, huge lines, invalid UTF-8,
 * deep nesting and NUL bytes. Any file either loads, and then every row has a prompt that the
 * chat templates render and the byte-level tokenizer encodes, and the sampler hands out
 * batches; or fails with one message that names the file (and line, where there is one) --
 * never a Lua error from inside remax, never a crash.
 * Built by tests/fuzz/run.sh from these engine sources:
 * fuzz-sources: engine/core/error.c engine/cuda/none.c engine/core/tensor.c engine/core/profile.c engine/core/dtype.c engine/core/philox.c engine/core/json.c engine/text/tokenizer.c engine/text/nfc.c engine/text/unicode_tables.c
 * fuzz-libs: -DRX_HAVE_PCRE2 -lpcre2-8 -I/usr/include/luajit-2.1 -lluajit-5.1 -rdynamic
 * fuzz-dict: json.dict
 * fuzz-options: -max_len=262144 -len_control=200 */
#include <stdint.h>
#include "fuzz_lua.h"

static const char CHECK[] =
    "local data, chat = require('remax.formats.data'), require('remax.text.chat')\n"
    "local tok = require('remax.bind.tokenizer').load('tests/fixtures/byte_tokenizer')\n"
    "return function(path)\n"
    "  local ok, ds = pcall(data.load, path)\n"
    "  if not ok then\n"
    "    if type(ds) ~= 'string' then return 'error value is a ' .. type(ds) end\n"
    "    if not ds:find(path, 1, true) then return 'error without the file name: ' .. ds end\n"
    "    if fuzz_lua_error(ds) then return 'internal error: ' .. ds end\n"
    "    return\n"
    "  end\n"
    "  if ds:size() < 1 then return 'a dataset without rows' end\n"
    "  for i = 1, ds:size() do\n"
    "    local row = ds:row(i)\n"
    "    if type(row.prompt) ~= 'string' and not chat.check_messages(row.prompt) then return 'row ' .. i .. ': bad prompt kept' end\n"
    "    for _, t in ipairs({ 'chatml', 'llama3', 'plain' }) do\n"
    "      local text = chat.render(row.prompt, { template = t })\n"
    "      local ids = tok:encode(text)\n"
    "      if tok:decode(ids) ~= text then return 'row ' .. i .. ': the byte tokenizer does not round-trip it' end\n"
    "    end\n"
    "  end\n"
    "  local s = ds:sampler({ batch_size = 3, seed = 5 })\n"
    "  for _ = 1, 2 do if #s:next_batch() ~= 3 then return 'short batch' end end\n"
    "  data.collate(s:next_batch())\n"
    "end\n";

FUZZ_LUA_TARGET(CHECK, "data.jsonl")
