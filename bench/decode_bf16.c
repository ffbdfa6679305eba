/* bench/decode_bf16.c: the matmuls of one decode step at the Qwen2.5-0.5B shape (24 layers of
 * q|k|v, o, gate|up and down, then the tied head), weights stored in bf16 (1 GB) beside the same
 * weights in f32 (2 GB), both through remax's own CPU paths (rx_cpu_matmul_forward_*: the decode
 * kernels, or sgemm where the f32 build has no few-rows kernel for that many rows), in the same
 * run, for a given number of rows. Not a test. Build and run with bench/decode_bf16.sh. Prints
 * the best of 6 steps each. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "cpu.h"

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + 1e-9 * t.tv_nsec;
}

enum { LAYERS = 24, KINDS = 4 };
static const int64_t shape[KINDS + 1][2] = {{896, 1152}, {896, 896}, {896, 9728}, {4864, 896}, {896, 151936}};

static float *w32[LAYERS * KINDS + 1];
static uint16_t *w16[LAYERS * KINDS + 1];

static double step(int64_t N, const float *x, float *y, int bf16) {
  double t0 = now();
  for (int l = 0; l <= LAYERS * KINDS; l++) {
    const int k = l == LAYERS * KINDS ? KINDS : l % KINDS;
    const int64_t C = shape[k][0], OC = shape[k][1];
    if (bf16) {
      if (!rx_cpu_matmul_forward_f32_bf16(y, x, w16[l], NULL, N, C, OC)) { fprintf(stderr, "out of memory\n"); exit(1); }
    } else rx_cpu_matmul_forward_f32(y, x, w32[l], NULL, N, C, OC);
  }
  return now() - t0;
}

int main(int argc, char **argv) {
  const int64_t N = argc > 1 ? atoll(argv[1]) : 8;
  int64_t params = 0;
  for (int l = 0; l <= LAYERS * KINDS; l++) {
    const int k = l == LAYERS * KINDS ? KINDS : l % KINDS;
    const int64_t n = shape[k][0] * shape[k][1];
    w32[l] = aligned_alloc(64, (size_t)((n * 4 + 63) / 64 * 64));
    w16[l] = aligned_alloc(64, (size_t)((n * 2 + 63) / 64 * 64));
    if (!w32[l] || !w16[l]) { fprintf(stderr, "decode_bf16: out of memory\n"); return 1; }
    for (int64_t i = 0; i < n; i++) {
      float v = (float)((i * 7919) % 1000) / 1000 - 0.5f;
      uint32_t u;
      memcpy(&u, &v, 4);
      w16[l][i] = (uint16_t)(u >> 16);                  /* truncated to bf16 */
      w32[l][i] = rx_cpu_bf16_to_f32(w16[l][i]);        /* the same values in both */
    }
    params += n;
  }
  float *x = aligned_alloc(64, (size_t)(N * 9728 * 4)), *y = aligned_alloc(64, (size_t)(N * 151936 * 4));
  for (int64_t i = 0; i < N * 9728; i++) x[i] = 0.01f * (float)(i % 13);
  double best[2] = {1e30, 1e30};
  for (int rep = 0; rep < 6; rep++)
    for (int bf16 = 0; bf16 < 2; bf16++) {
      double t = step(N, x, y, bf16);
      if (t < best[bf16]) best[bf16] = t;
    }
  printf("rows=%-3lld f32 %7.1f ms/step (%5.1f GB/s)   bf16 %7.1f ms/step (%5.1f GB/s, %4.0f GFLOP/s)   bf16/f32 speed %.2fx\n",
         (long long)N, best[0] * 1e3, params * 4.0 / best[0] / 1e9, best[1] * 1e3, params * 2.0 / best[1] / 1e9,
         2.0 * N * params / best[1] / 1e9, best[0] / best[1]);
  return 0;
}
