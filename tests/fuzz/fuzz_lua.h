/* fuzz_lua.h: the embedded LuaJIT state the Lua-side fuzz targets share. The engine sources the
 * target links are in this program, exported (-rdynamic), so remax.ffi finds them in the
 * process as it does inside the remax host. Run from the repository root (lua/ on the path).
 *
 * fuzz_lua_init(chunk) runs chunk, which must return a function check(path, ...); then
 * fuzz_lua_check(path) calls it on a file holding the input. check returns nothing when the
 * input was handled (a result, or an error of the kind a user may see); a string when it found
 * a bug, which the target prints before stopping. A Lua error escaping check is a bug too. */
#ifndef FUZZ_LUA_H
#define FUZZ_LUA_H
#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static lua_State *fuzz_L;
static int fuzz_check_ref;
static char fuzz_dir[64];

/* Closing the state at exit runs the ffi.gc finalizers (a tokenizer handle, cjson's buffers),
 * so LeakSanitizer's check at exit sees only what remax itself lost. */
static void fuzz_lua_close(void) {
  if (fuzz_L) lua_close(fuzz_L);
  fuzz_L = NULL;
}

static void fuzz_lua_init(const char *chunk) {
  snprintf(fuzz_dir, sizeof fuzz_dir, "/tmp/%s.%d", "fuzz_lua", (int)getpid());
  char cmd[128];
  snprintf(cmd, sizeof cmd, "mkdir -p %s", fuzz_dir);
  if (system(cmd) != 0) exit(1);
  fuzz_L = luaL_newstate();
  luaL_openlibs(fuzz_L);
  if (luaL_dostring(fuzz_L, "package.path = 'lua/?.lua;lua/?/init.lua;' .. package.path") ||
      luaL_loadstring(fuzz_L, chunk) || lua_pcall(fuzz_L, 0, 1, 0) || !lua_isfunction(fuzz_L, -1)) {
    fprintf(stderr, "fuzz: the Lua harness does not start (run from the repository root): %s\n", lua_tostring(fuzz_L, -1));
    exit(1);
  }
  fuzz_check_ref = luaL_ref(fuzz_L, LUA_REGISTRYINDEX);
  atexit(fuzz_lua_close);
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
#endif
