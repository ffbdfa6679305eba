/* profile.h: hooks of the per-phase timer (engine/core/profile.c), for engine sources and CPU
 * kernels. Around a phase:
 *   const int prof = rx_prof_begin(RX_PROF_ADAMW); ... rx_prof_end(prof);
 * Off (the default), rx_prof_begin is one untaken branch and rx_prof_end another. */
#ifndef RX_PROFILE_H
#define RX_PROFILE_H
#include <stdint.h>

enum {
  RX_PROF_EMBEDDING, RX_PROF_RMSNORM_FWD, RX_PROF_RMSNORM_BWD, RX_PROF_LINEAR_FWD, RX_PROF_LINEAR_BWD,
  RX_PROF_ROPE, RX_PROF_ATTN_FWD, RX_PROF_ATTN_BWD, RX_PROF_SWIGLU_FWD, RX_PROF_SWIGLU_BWD, RX_PROF_ADD,
  RX_PROF_HEAD_GEMM_FWD, RX_PROF_HEAD_GEMM_BWD, RX_PROF_HEAD_LOGPROB_FWD, RX_PROF_HEAD_LOGPROB_BWD,
  RX_PROF_ADAMW, RX_PROF_ZERO_GRAD, RX_PROF_WORK_COPY, RX_PROF_COUNT
};

extern int rx_profile_on;
void rx_profile_push(int32_t phase);
void rx_profile_pop(void);

static inline int rx_prof_begin(int32_t phase) {
  if (__builtin_expect(!rx_profile_on, 1)) return 0;
  rx_profile_push(phase);
  return 1;
}

static inline void rx_prof_end(int began) {
  if (__builtin_expect(began, 0)) rx_profile_pop();
}

#endif
