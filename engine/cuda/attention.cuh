// attention.cuh: what the attention kernels (attention.cu, decode_attention.cu) share: the lane
// layout of a head's row (lane holds elements lane, lane + 32, ..., NJ = ceil(D / 32) of them),
// the dispatch on NJ, and one key's step of the online softmax.
#ifndef RX_CUDA_ATTENTION_CUH
#define RX_CUDA_ATTENTION_CUH
#include "common.cuh"

// Runs BODY with NJ = 1, 2, 4 or 8 for D <= 32, 64, 128, 256 (RX_CUDA_ATTN_MAX_D).
#define RX_DISPATCH_NJ(D, ...)                                  \
  do {                                                          \
    if ((D) <= 32) { constexpr int NJ = 1; __VA_ARGS__; }       \
    else if ((D) <= 64) { constexpr int NJ = 2; __VA_ARGS__; }  \
    else if ((D) <= 128) { constexpr int NJ = 4; __VA_ARGS__; } \
    else { constexpr int NJ = 8; __VA_ARGS__; }                 \
  } while (0)

// The lane's share of a D-element row of floats (shared memory): x[j] = row[lane + 32 j], zero past D.
template <int NJ>
__device__ __forceinline__ void lane_share(float x[NJ], const float *row, int lane, int64_t D) {
#pragma unroll
  for (int j = 0; j < NJ; j++) {
    const int64_t d = lane + 32 * j;
    x[j] = d < D ? row[d] : 0.0f;
  }
}

// One key of an online softmax: the running max m and sum l take the key's score sc; corr is the
// factor that rescales what was accumulated before it, p the key's weight.
__device__ __forceinline__ void online_softmax_add(float &m, float &l, float sc, float &corr, float &p) {
  const float mn = fmaxf(m, sc);
  corr = expf(m - mn);
  p = expf(sc - mn);
  l = l * corr + p;
  m = mn;
}
#endif
