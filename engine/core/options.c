/* options.c: the engine's behaviour switches as data: a name, its values, its default and the
 * environment variable that overrides it (a developer's switch, reported by rx_engine_overrides
 * so `remax version` and a run's config.json show it). remax.h: rx_set_option, rx_get_option. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "core/options.h"

typedef struct {
  const char *name, *values, *deflt, *env;
  /* the environment's text -> the option's value (NULL: not a value of the option) */
  const char *(*from_env)(const char *text);
} option;

static const char *raw(const char *text) { return text; }
static const char *set_means_off(const char *t) { return strcmp(t, "0") ? "off" : "on"; }   /* REMAX_NO_X=1 */
static const char *zero_means_off(const char *t) { return strcmp(t, "0") ? "on" : "off"; }  /* REMAX_X=0 */
static const char *one_means_on(const char *t) { return strcmp(t, "1") ? "off" : "on"; }

static const option table[RX_OPT_COUNT] = {
  [RX_OPT_BF16_GEMM] = {"bf16_gemm", "auto onednn sgemm", "auto", "REMAX_BF16_GEMM", raw},
  [RX_OPT_BF16_DOT] = {"bf16_dot", "on off", "on", "REMAX_NO_BF16_DOT", set_means_off},
  [RX_OPT_CUDA_GRAPHS] = {"cuda_graphs", "on off", "on", "REMAX_CUDA_GRAPHS", zero_means_off},
  [RX_OPT_HOST_SAMPLER] = {"host_sampler", "on off", "off", "REMAX_HOST_SAMPLER", one_means_on},
  [RX_OPT_CUDA_ALLOC] = {"cuda_alloc", "caching plain", "caching", "REMAX_CUDA_ALLOC", raw},
  [RX_OPT_CUDA_SYNC] = {"cuda_sync", "on off", "off", "REMAX_CUDA_SYNC", zero_means_off},
  [RX_OPT_THREADS_ADAPT] = {"threads_adapt", "on off", "on", "REMAX_THREADS_ADAPT", zero_means_off},
};

/* The values set through the API (NULL: not set); the environment's, read once. */
static const char *set_value[RX_OPT_COUNT];
static const char *env_value[RX_OPT_COUNT];
static int env_read;
static uint32_t generation;

static int one_of(const char *v, const char *values) {
  const size_t n = strlen(v);
  for (const char *p = values; *p;) {
    const char *end = strchr(p, ' ');
    const size_t len = end ? (size_t)(end - p) : strlen(p);
    if (len == n && !strncmp(p, v, n)) return 1;
    p += len + (end ? 1 : 0);
  }
  return 0;
}

static void read_env(void) {
  if (__atomic_load_n(&env_read, __ATOMIC_ACQUIRE)) return;
  for (int i = 0; i < RX_OPT_COUNT; i++) {
    const char *e = getenv(table[i].env);
    const char *v = e && *e ? table[i].from_env(e) : NULL;
    /* a value the option does not have: kept raw, so the reader's check names it */
    env_value[i] = v;
  }
  __atomic_store_n(&env_read, 1, __ATOMIC_RELEASE);
}

static int find(const char *name) {
  for (int i = 0; i < RX_OPT_COUNT; i++)
    if (name && !strcmp(name, table[i].name)) return i;
  return -1;
}

static int unknown(const char *name) {
  char list[200] = "";
  for (int i = 0; i < RX_OPT_COUNT; i++) {
    strncat(list, table[i].name, sizeof list - strlen(list) - 1);
    if (i + 1 < RX_OPT_COUNT) strncat(list, ", ", sizeof list - strlen(list) - 1);
  }
  return rx_fail(RX_EINVAL, "engine option '%s' does not exist (options: %s)", name ? name : "(null)", list);
}

const char *rx_option_value(int id) {
  if (id < 0 || id >= RX_OPT_COUNT) return "";
  read_env();
  if (env_value[id]) return env_value[id];
  const char *v = __atomic_load_n(&set_value[id], __ATOMIC_ACQUIRE);
  return v ? v : table[id].deflt;
}

int rx_option_on(int id) { return !strcmp(rx_option_value(id), "on"); }

uint32_t rx_options_generation(void) { return __atomic_load_n(&generation, __ATOMIC_ACQUIRE); }

int rx_set_option(const char *name, const char *value) {
  const int i = find(name);
  if (i < 0) return unknown(name);
  if (!value || !one_of(value, table[i].values))
    return rx_fail(RX_EINVAL, "engine option %s = '%s': expected one of: %s", name, value ? value : "(null)",
                   table[i].values);
  /* an interned string: readers on other threads see a pointer that never changes under them */
  static const char *const interned[] = {"auto", "onednn", "sgemm", "on", "off", "caching", "plain"};
  const char *stable = NULL;
  for (size_t k = 0; k < sizeof interned / sizeof interned[0]; k++)
    if (!strcmp(value, interned[k])) stable = interned[k];
  if (!stable) return rx_fail(RX_EINVAL, "engine option %s = '%s': not interned (a bug in remax)", name, value);
  __atomic_store_n(&set_value[i], stable, __ATOMIC_RELEASE);
  __atomic_add_fetch(&generation, 1, __ATOMIC_ACQ_REL);
  return RX_OK;
}

const char *rx_get_option(const char *name) {
  const int i = find(name);
  return i < 0 ? NULL : rx_option_value(i);
}

int32_t rx_option_count(void) { return RX_OPT_COUNT; }
const char *rx_option_name(int32_t i) { return i >= 0 && i < RX_OPT_COUNT ? table[i].name : NULL; }
const char *rx_option_values(int32_t i) { return i >= 0 && i < RX_OPT_COUNT ? table[i].values : NULL; }
const char *rx_option_env(int32_t i) { return i >= 0 && i < RX_OPT_COUNT ? table[i].env : NULL; }

/* Every option's environment override in force, "REMAX_X=v (option = value); ..."; "" when none. */
const char *rx_engine_overrides(void) {
  static char out[512];
  out[0] = 0;
  read_env();
  for (int i = 0; i < RX_OPT_COUNT; i++) {
    const char *e = getenv(table[i].env);
    if (!e || !*e) continue;
    const size_t used = strlen(out);
    snprintf(out + used, sizeof out - used, "%s%s=%s (%s = %s)", used ? "; " : "", table[i].env, e, table[i].name,
             env_value[i] ? env_value[i] : "?");
  }
  return out;
}
