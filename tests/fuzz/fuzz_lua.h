/* fuzz_lua.h: the embedded LuaJIT state the Lua-side fuzz targets share. The engine sources the
 * target links are in this program, exported (-rdynamic), so remax.ffi finds them in the
 * process as it does inside the remax host. Run from the repository root (lua/ on the path).
 *
 * fuzz_lua_init(chunk) runs chunk, which must return a function check(path, ...); then
 * fuzz_lua_check(path) calls it on a file holding the input. check returns nothing when the
 * input was handled (a result, or an error of the kind a user may see); a string when it found
 * a bug, which the target prints before stopping. A Lua error escaping check is a bug too.
 *
 * libFuzzer's coverage comes from instrumented C code only, so the Lua code under test gives it
 * no feedback by itself. fuzz_lua_cover(pattern), called after fuzz_lua_init, adds a line hook
 * over the Lua chunks whose name contains pattern ("remax/jinja"): each (previous line, line)
 * pair within such a chunk bumps a counter in libFuzzer's extra-counters section, so an input
 * reaching a new branch of the Lua code is kept as it is for C. The JIT is turned off while it
 * is on (a compiled trace would not call the hook).
 *
 * fuzz_lua_input(name, data, size) is the body of a target's LLVMFuzzerTestOneInput: the check on
 * the input saved as `name`, within the CPU limit of fuzz_cpu.h. FUZZ_LUA_TARGET(chunk, name)
 * defines both entry points of a target that needs nothing else. */
#ifndef FUZZ_LUA_H
#define FUZZ_LUA_H
#include "fuzz_cpu.h"
#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static lua_State *fuzz_L;
static int fuzz_check_ref;
static char fuzz_dir[64];

static uint8_t fuzz_lua_counters[1 << 16] __attribute__((section("__libfuzzer_extra_counters"), used));
static const char *fuzz_cover_pattern;
static const void *fuzz_cover_last_source;   /* the chunk name's address of the last line seen */
static int fuzz_cover_last_match;
static uint32_t fuzz_cover_prev;

static void fuzz_lua_line_hook(lua_State *L, lua_Debug *ar) {
  if (!lua_getinfo(L, "S", ar)) return;
  if ((const void *)ar->source != fuzz_cover_last_source) {
    fuzz_cover_last_source = ar->source;
    fuzz_cover_last_match = ar->source && strstr(ar->source, fuzz_cover_pattern) != NULL;
  }
  if (!fuzz_cover_last_match) return;
  uint32_t line = (uint32_t)ar->currentline;
  uint32_t edge = (fuzz_cover_prev * 31u + line) * 2654435761u;
  fuzz_cover_prev = line;
  uint8_t *c = &fuzz_lua_counters[edge >> 16];
  if (*c < 255) (*c)++;
}

static void fuzz_lua_cover(const char *pattern) {
  fuzz_cover_pattern = pattern;
  if (luaL_dostring(fuzz_L, "require('jit').off()")) exit(1);
  lua_sethook(fuzz_L, fuzz_lua_line_hook, LUA_MASKLINE, 0);
}

/* Closing the state at exit runs the ffi.gc finalizers (a tokenizer handle, cjson's buffers),
 * so LeakSanitizer's check at exit sees only what remax itself lost. */
static void fuzz_lua_close(void) {
  if (fuzz_L) lua_close(fuzz_L);
  fuzz_L = NULL;
}

/* LeakSanitizer does not scan LuaJIT's heap (its own mmap'd arena), so a block that C code
 * malloc'd and that only a Lua object points to -- lua-cjson's encode buffer (1023 bytes from
 * strbuf_init, held by the module's config userdata from require('cjson') until the state
 * closes), a tokenizer handle kept by the harness -- looks unreachable to the leak check that
 * libFuzzer runs mid-campaign whenever an input mallocs more than it frees (a first os.date,
 * say), and is reported as a leak although lua_close frees it. The harness's own setup runs
 * with LeakSanitizer off: what it allocates lives as long as the state. Everything an input
 * allocates stays checked, mid-run and at exit after the state is closed. */
void __lsan_disable(void) __attribute__((weak));
void __lsan_enable(void) __attribute__((weak));

static void fuzz_lua_init(const char *chunk) {
  if (__lsan_disable) __lsan_disable();
  snprintf(fuzz_dir, sizeof fuzz_dir, "/tmp/%s.%d", "fuzz_lua", (int)getpid());
  char cmd[128];
  snprintf(cmd, sizeof cmd, "mkdir -p %s", fuzz_dir);
  if (system(cmd) != 0) exit(1);
  fuzz_L = luaL_newstate();
  luaL_openlibs(fuzz_L);
  /* fuzz_lua_error(msg): whether an error message is a Lua fault inside remax rather than a
   * message for the user: a position in remax's Lua sources starts it, as in
   * "lua/remax/x.lua:12: attempt to index a nil value" (a user error carries no position, or the
   * caller's: the harness's). Text of the input that a message quotes ("architecture
   * 'Llamattempt toLM'", "lua/remax/") does not count. */
  if (luaL_dostring(fuzz_L, "package.path = 'lua/?.lua;lua/?/init.lua;' .. package.path\n"
                            "function fuzz_lua_error(msg) return msg:match('^[^%s:]*remax/[^%s:]+%.lua:%d+: ') ~= nil end") ||
      luaL_loadstring(fuzz_L, chunk) || lua_pcall(fuzz_L, 0, 1, 0) || !lua_isfunction(fuzz_L, -1)) {
    fprintf(stderr, "fuzz: the Lua harness does not start (run from the repository root): %s\n", lua_tostring(fuzz_L, -1));
    exit(1);
  }
  fuzz_check_ref = luaL_ref(fuzz_L, LUA_REGISTRYINDEX);
  atexit(fuzz_lua_close);
  if (__lsan_enable) __lsan_enable();
}

/* Writes the input to fuzz_dir/name and runs check(path) on it. */
static void fuzz_lua_check(const char *name, const uint8_t *data, size_t size) {
  char path[128];
  snprintf(path, sizeof path, "%s/%s", fuzz_dir, name);
  FILE *f = fopen(path, "wb");
  if (!f) { perror(path); __builtin_trap(); }
  if (size) fwrite(data, 1, size, f);
  fclose(f);
  lua_rawgeti(fuzz_L, LUA_REGISTRYINDEX, fuzz_check_ref);
  lua_pushstring(fuzz_L, path);
  if (lua_pcall(fuzz_L, 1, 1, 0) != 0) {
    fprintf(stderr, "fuzz: a Lua error escaped the check: %s\n", lua_tostring(fuzz_L, -1));
    __builtin_trap();
  }
  if (lua_isstring(fuzz_L, -1)) {
    fprintf(stderr, "fuzz: %s\n", lua_tostring(fuzz_L, -1));
    __builtin_trap();
  }
  lua_settop(fuzz_L, 0);
  lua_gc(fuzz_L, LUA_GCCOLLECT, 0);   /* memory Lua objects own is freed before the leak check */
}

static int fuzz_lua_input(const char *name, const uint8_t *data, size_t size) {
  FUZZ_CPU_BEGIN;
  fuzz_lua_check(name, data, size);
  FUZZ_CPU_END(size);
  return 0;
}

#define FUZZ_LUA_TARGET(chunk, name)                                                               \
  int LLVMFuzzerInitialize(int *argc, char ***argv) {                                              \
    (void)argc;                                                                                    \
    (void)argv;                                                                                    \
    fuzz_lua_init(chunk);                                                                          \
    return 0;                                                                                      \
  }                                                                                                \
  int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) { return fuzz_lua_input(name, data, size); }
#endif
