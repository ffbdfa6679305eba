/* fuzz_config.c: libFuzzer target over config.json resolution into a model (lua-cjson, then
 * remax.model.resolve_config in lua/remax/bind/model.lua, then rx_model_new in engine/model/model.c)
 * in an embedded LuaJIT state. Any config.json either resolves or fails with a message naming
 * the file; a resolved config whose parameters (counted here independently) fit in 64 MB
 * builds a model with exactly that many parameters, and one that implies more than 32 TB
 * (10^12 parameters and up) is refused by rx_model_new before it allocates -- libFuzzer's
 * malloc limit (2 GB) stops the run if it tries. Nothing allocates more than the config implies.
 * Built by tests/fuzz/run.sh from the sanitized engine core and model (the code under test) over
 * the rest of libremax from ./remax's build (kernels, generation: not reached here), which the
 * symbols of this program interpose:
 * fuzz-sources: engine/core/error.c engine/cuda/none.c engine/core/dtype.c engine/core/tensor.c engine/core/profile.c engine/core/philox.c engine/core/signal.c engine/model/model.c
 * fuzz-libs: build/libremax.so -Wl,-rpath,$ORIGIN/../build -I/usr/include/luajit-2.1 -lluajit-5.1 -rdynamic
 * fuzz-dict: config.dict */
#include <stdint.h>
#include "fuzz_lua.h"

static const char CHECK[] =
    "local cjson, ffi = require('cjson'), require('ffi')\n"
    "local model, rx = require('remax.bind.model'), require('remax.bind.ffi')\n"
    "local C = rx.C\n"
    "return function(path)\n"
    "  local f = assert(io.open(path, 'rb'))\n"
    "  local text = f:read('*a')\n"
    "  f:close()\n"
    "  local ok, t = pcall(cjson.decode, text)\n"
    "  if not ok or type(t) ~= 'table' then return end\n"
    "  local ok2, cfg = pcall(model.resolve_config, t, path)\n"
    "  if not ok2 then\n"
    "    if type(cfg) ~= 'string' or not cfg:find(path, 1, true) then return 'error without the file name: ' .. tostring(cfg) end\n"
    "    if fuzz_lua_error(cfg) then return 'internal error: ' .. cfg end\n"
    "    return\n"
    "  end\n"
    "  local V, H, I, L = tonumber(cfg.vocab_size), tonumber(cfg.hidden_size), tonumber(cfg.intermediate_size), tonumber(cfg.num_hidden_layers)\n"
    "  local q, kv = tonumber(cfg.num_attention_heads * cfg.head_dim), tonumber(cfg.num_key_value_heads * cfg.head_dim)\n"
    "  local bias = (cfg.attention_bias ~= 0 and (q + 2 * kv) or 0) + (cfg.qk_norm ~= 0 and 2 * tonumber(cfg.head_dim) or 0)\n"
    "  local params = V * H * (cfg.tie_word_embeddings ~= 0 and 1 or 2) + H + L * (2 * H + 2 * q * H + 2 * kv * H + 3 * I * H + bias)\n"
    "  local bytes = params * 4\n"
    "  if bytes > 64 * 2 ^ 20 and bytes <= 2 ^ 45 then return end\n"
    "  cfg.dtype, cfg.device = C.RX_F32, C.RX_CPU\n"
    "  local out = ffi.new('rx_model*[1]')\n"
    "  local rc = C.rx_model_new(out, cfg)\n"
    "  if bytes > 2 ^ 45 then\n"
    "    if rc == 0 then C.rx_model_free(out[0]) return ('a config of %g parameters was not refused'):format(params) end\n"
    "    return\n"
    "  end\n"
    "  if rc ~= 0 then\n"
    "    local msg = rx.last_error()\n"
    "    if not msg:find('model config', 1, true) then return 'rx_model_new: ' .. msg end\n"
    "    return\n"
    "  end\n"
    "  local n, got = tonumber(C.rx_model_param_count(out[0])), 0\n"
    "  for i = 0, n - 1 do got = got + tonumber(C.rx_model_param(out[0], i).numel) end\n"
    "  C.rx_model_free(out[0])\n"
    "  if got ~= params then return ('the model has %d parameters, the config implies %d'):format(got, params) end\n"
    "end\n";

FUZZ_LUA_TARGET(CHECK, "config.json")
