/* main.c: the `remax` host program. Embeds LuaJIT, finds the Lua library and runs
 * lua/remax/cli/main.lua with the command-line arguments. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <limits.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>
#include "remax.h"

#ifndef RX_SOURCE_DIR
#define RX_SOURCE_DIR ""
#endif

static int exists(const char *path) { return access(path, R_OK) == 0; }

/* The folder holding lua/remax/cli/main.lua: $REMAX_HOME, the install tree next to the
 * executable (bin/../share/remax), or the source tree this binary was built from. */
static int find_home(char *home, size_t n) {
  char exe[PATH_MAX], probe[PATH_MAX + 64];
  const char *env = getenv("REMAX_HOME");
  if (env && *env) {
    snprintf(probe, sizeof probe, "%s/lua/remax/cli/main.lua", env);
    if (exists(probe)) { snprintf(home, n, "%s", env); return 0; }
    fprintf(stderr, "remax: REMAX_HOME=%s has no lua/remax/cli/main.lua\n", env);
    return -1;
  }
  ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (len > 0) {
    exe[len] = 0;
    char *slash = strrchr(exe, '/');
    if (slash) *slash = 0;
    snprintf(probe, sizeof probe, "%s/../share/remax/lua/remax/cli/main.lua", exe);
    if (exists(probe)) { snprintf(home, n, "%s/../share/remax", exe); return 0; }
  }
  snprintf(probe, sizeof probe, "%s/lua/remax/cli/main.lua", RX_SOURCE_DIR);
  if (RX_SOURCE_DIR[0] && exists(probe)) { snprintf(home, n, "%s", RX_SOURCE_DIR); return 0; }
  fprintf(stderr, "remax: cannot find lua/remax/cli/main.lua (set REMAX_HOME to the remax folder)\n");
  return -1;
}

/* OpenMP's defaults for a machine whose cores are shared (another process, or other ranks).
 * libgomp reads its environment when it loads, before main, so a change here takes effect by
 * starting the program again (main execs itself once). The user's own settings always stand.
 *  - Wait policy: libgomp's default spins 300,000 times (~3 ms) before a waiting thread sleeps;
 *    against one busy process on 2 cores that made decoding ~10x slower. The engine itself now
 *    drops to the cores other processes leave (engine/core/threads.c, setting threads_adapt), so
 *    the spin only has to cover what that misses: 10,000 (~0.1 ms) keeps the quiet speed, where
 *    1,000 lost ~30% of it in quiet decoding (bench/shared_cores.sh: docs/benchmarks.md).
 *    Unless OMP_WAIT_POLICY or GOMP_SPINCOUNT is set.
 *  - Threads under mpirun/srun: each local rank takes its share of the cores (as torchrun does),
 *    unless OMP_NUM_THREADS is set.
 * REMAX_THREADS_NOTE tells the Lua side (the start line, `remax version`) what was chosen. */
#define RX_GOMP_SPINCOUNT "10000"

static long local_ranks(const char **from) {
  static const char *const vars[] = {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS_PER_NODE",
                                     "PMI_LOCAL_SIZE"};
  for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
    const char *v = getenv(vars[i]);
    long n = v ? strtol(v, NULL, 10) : 0;   /* SLURM_NTASKS_PER_NODE may read "2(x3)": the leading count */
    if (n > 0) { *from = vars[i]; return n; }
  }
  return 1;
}

static int thread_defaults(void) {
  char note[512] = "";
  int changed = 0;
  if (getenv("REMAX_THREADS_NOTE")) return 0;   /* chosen already (this is the second start) */
  if (!getenv("OMP_WAIT_POLICY") && !getenv("GOMP_SPINCOUNT")) {
    setenv("GOMP_SPINCOUNT", RX_GOMP_SPINCOUNT, 1);
    changed = 1;
    snprintf(note, sizeof note, "OpenMP threads spin %s times before they sleep (GOMP_SPINCOUNT; set it or OMP_WAIT_POLICY to choose)",
             RX_GOMP_SPINCOUNT);
  } else {
    snprintf(note, sizeof note, "OpenMP wait policy as set (%s%s%s%s)", getenv("OMP_WAIT_POLICY") ? "OMP_WAIT_POLICY=" : "",
             getenv("OMP_WAIT_POLICY") ? getenv("OMP_WAIT_POLICY") : "", getenv("GOMP_SPINCOUNT") ? " GOMP_SPINCOUNT=" : "",
             getenv("GOMP_SPINCOUNT") ? getenv("GOMP_SPINCOUNT") : "");
  }
  const char *from = NULL;
  long ranks = local_ranks(&from);
  if (ranks > 1 && !getenv("OMP_NUM_THREADS")) {
    cpu_set_t set;
    long online = sysconf(_SC_NPROCESSORS_ONLN), mine = online;
    if (sched_getaffinity(0, sizeof set, &set) == 0) mine = CPU_COUNT(&set);
    long share = online / ranks;
    if (share > mine) share = mine;
    if (share < 1) share = 1;
    char n[32];
    snprintf(n, sizeof n, "%ld", share);
    setenv("OMP_NUM_THREADS", n, 1);
    changed = 1;
    size_t len = strlen(note);
    snprintf(note + len, sizeof note - len, "; %ld thread(s) per rank: %ld local ranks (%s) share %ld cores (OMP_NUM_THREADS sets it)",
             share, ranks, from, online);
  } else if (getenv("OMP_NUM_THREADS")) {
    size_t len = strlen(note);
    snprintf(note + len, sizeof note - len, "; OMP_NUM_THREADS=%s", getenv("OMP_NUM_THREADS"));
  }
  setenv("REMAX_THREADS_NOTE", note, 1);
  return changed;
}

static int traceback(lua_State *L) {
  const char *msg = lua_tostring(L, 1);
  if (getenv("REMAX_DEBUG") && !(msg && strstr(msg, "stack traceback:"))) {
    luaL_traceback(L, L, msg, 1);   /* full stack when debugging (once: the Lua side may have added it) */
    return 1;
  }
  lua_pushstring(L, msg ? msg : "(error object is not a string)");
  return 1;
}

int main(int argc, char **argv) {
  char home[PATH_MAX], path[PATH_MAX * 2 + 256];
  /* OpenBLAS chose its kernels when it loaded, before main: where it did not recognise the CPU,
   * start again with the set the CPU supports (engine/cpu/blas.c). */
  const char *core = rx_blas_better_core();
  int again = core && setenv("OPENBLAS_CORETYPE", core, 1) == 0;
  if (thread_defaults()) again = 1;
  if (again) execv("/proc/self/exe", argv);
  if (find_home(home, sizeof home)) return 2;
  setenv("REMAX_HOME", home, 1);
  Dl_info info;   /* tell the Lua side (and child luajit processes) where libremax lives */
  if (dladdr((void *)rx_version, &info) && info.dli_fname) setenv("REMAX_LIB", info.dli_fname, 0);

  lua_State *L = luaL_newstate();
  if (!L) { fprintf(stderr, "remax: cannot create the Lua state\n"); return 2; }
  luaL_openlibs(L);

  lua_getglobal(L, "package");
  lua_getfield(L, -1, "path");
  snprintf(path, sizeof path, "%s/lua/?.lua;%s/lua/?/init.lua;%s", home, home, lua_tostring(L, -1));
  lua_pop(L, 1);
  lua_pushstring(L, path);
  lua_setfield(L, -2, "path");
  lua_pop(L, 1);

  lua_createtable(L, argc, 1);            /* arg[0] = program, arg[1..] = arguments */
  for (int i = 0; i < argc; i++) {
    lua_pushstring(L, argv[i]);
    lua_rawseti(L, -2, i);
  }
  lua_setglobal(L, "arg");

  lua_pushcfunction(L, traceback);
  snprintf(path, sizeof path, "%s/lua/remax/cli/main.lua", home);
  if (luaL_loadfile(L, path)) {
    fprintf(stderr, "remax: %s\n", lua_tostring(L, -1));
    lua_close(L);
    return 2;
  }
  for (int i = 1; i < argc; i++) lua_pushstring(L, argv[i]);
  int status = lua_pcall(L, argc - 1, 1, 1);
  int code = 0;
  if (status) {
    if (rx_dist_size() > 1) fprintf(stderr, "remax (rank %d of %d): %s\n", (int)rx_dist_rank(), (int)rx_dist_size(), lua_tostring(L, -1));
    else fprintf(stderr, "remax: %s\n", lua_tostring(L, -1));
    code = 1;
  } else if (lua_isnumber(L, -1)) code = (int)lua_tointeger(L, -1);
  lua_close(L);
  /* A rank that fails exits without finalizing, so the MPI launcher stops the other ranks
   * (finalizing could wait for them); a run that ended on every rank finalizes. */
  if (!status && rx_dist_finalize()) {
    fprintf(stderr, "remax: %s\n", rx_last_error());
    if (!code) code = 1;
  }
  return code;
}
