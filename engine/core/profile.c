/* profile.c: a per-phase wall-clock timer for the CPU engine, off by default.
 *
 * REMAX_PROFILE=1 in the environment (read when the library loads) or rx_profile_enable(1)
 * turns it on. Hooks (rx_prof_begin / rx_prof_end in internal.h) sit at the entry of the CPU
 * kernels, the model's linear layers and head, AdamW and zero_grad; off, each is one branch on
 * a global that is not taken. Phases nest: an inner phase's time is its own and is taken out of
 * the phase around it, so the phases add up to the time spent inside any of them. Hooks run on
 * the thread that calls the kernel (never inside an OpenMP region), each thread with its own
 * stack; the totals are summed atomically. */
#include "internal.h"
#include <stdlib.h>
#include <time.h>

int rx_profile_on;

static const char *const phase_names[RX_PROF_COUNT] = {
  [RX_PROF_EMBEDDING] = "embedding",
  [RX_PROF_RMSNORM_FWD] = "rmsnorm forward",
  [RX_PROF_RMSNORM_BWD] = "rmsnorm backward",
  [RX_PROF_LINEAR_FWD] = "linear forward (GEMM)",
  [RX_PROF_LINEAR_BWD] = "linear backward (GEMM)",
  [RX_PROF_ROPE] = "rope",
  [RX_PROF_ATTN_FWD] = "attention forward",
  [RX_PROF_ATTN_BWD] = "attention backward",
  [RX_PROF_SWIGLU_FWD] = "swiglu forward",
  [RX_PROF_SWIGLU_BWD] = "swiglu backward",
  [RX_PROF_ADD] = "add",
  [RX_PROF_HEAD_GEMM_FWD] = "head logits (GEMM)",
  [RX_PROF_HEAD_GEMM_BWD] = "head backward (GEMM)",
  [RX_PROF_HEAD_LOGPROB_FWD] = "head log-softmax forward",
  [RX_PROF_HEAD_LOGPROB_BWD] = "head log-softmax backward",
  [RX_PROF_ADAMW] = "adamw",
  [RX_PROF_ZERO_GRAD] = "zero_grad",
  [RX_PROF_WORK_COPY] = "bf16 working copy from the masters",
};

static uint64_t total_ns[RX_PROF_COUNT];
static int64_t total_calls[RX_PROF_COUNT];

enum { STACK = 16 };
typedef struct frame { int32_t phase; uint64_t t; } frame;
static _Thread_local frame stack[STACK];
static _Thread_local int depth;

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void charge(int32_t phase, uint64_t ns) { __atomic_fetch_add(&total_ns[phase], ns, __ATOMIC_RELAXED); }

void rx_profile_push(int32_t phase) {
  const uint64_t t = now_ns();
  if (depth > 0 && depth <= STACK) charge(stack[depth - 1].phase, t - stack[depth - 1].t);
  if (depth < STACK) stack[depth] = (frame){phase, t};
  depth++;
}

void rx_profile_pop(void) {
  const uint64_t t = now_ns();
  if (depth <= 0) return;
  depth--;
  if (depth < STACK) {
    charge(stack[depth].phase, t - stack[depth].t);
    __atomic_fetch_add(&total_calls[stack[depth].phase], 1, __ATOMIC_RELAXED);
  }
  if (depth > 0 && depth <= STACK) stack[depth - 1].t = t;   /* the outer phase resumes now */
}

__attribute__((constructor)) static void profile_from_env(void) {
  const char *e = getenv("REMAX_PROFILE");
  rx_profile_on = e && *e && !(e[0] == '0' && e[1] == 0);
}

void rx_profile_enable(int32_t on) { rx_profile_on = on != 0; }
int32_t rx_profile_enabled(void) { return rx_profile_on; }

void rx_profile_reset(void) {
  for (int i = 0; i < RX_PROF_COUNT; i++) {
    __atomic_store_n(&total_ns[i], 0, __ATOMIC_RELAXED);
    __atomic_store_n(&total_calls[i], 0, __ATOMIC_RELAXED);
  }
}

int32_t rx_profile_phases(void) { return RX_PROF_COUNT; }

const char *rx_profile_read(int32_t i, double *seconds, int64_t *calls) {
  if (i < 0 || i >= RX_PROF_COUNT) return NULL;
  if (seconds) *seconds = (double)__atomic_load_n(&total_ns[i], __ATOMIC_RELAXED) * 1e-9;
  if (calls) *calls = __atomic_load_n(&total_calls[i], __ATOMIC_RELAXED);
  return phase_names[i];
}
