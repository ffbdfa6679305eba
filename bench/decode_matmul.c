/* bench/decode_matmul.c: the matmuls of one decode step at the Qwen2.5-0.5B shape (24 layers of
 * q|k|v, o, gate|up and down, then the tied head: 2 GB of f32 weights, more than any cache) for
 * a given number of rows, in the same run: remax's f32 decode kernel (matmul_rows.c with
 * AVX-512, else the register tiles of matmul_bf16.c), remax with the same weights stored in bf16
 * (1 GB): the AVX-512 BF16 dot product (matmul_bf16dot.c) where the CPU has it, and the weights
 * widened to f32 in registers (matmul_bf16.c), and OpenBLAS sgemm on the f32 weights. The weights
 * are bf16 values, so all of them multiply the same weights (the bf16 paths round the inputs).
 * Past 48 rows (a prefill's row counts) f32 is sgemm, the bf16 dot product runs in blocks of 48
 * rows and the widening path widens blocks of W for sgemm.
 * Not a test. Build and run with bench/decode_matmul.sh. Prints the best of 6 steps each. */
#include <cblas.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "cpu.h"   /* the kernels, exported by libremax */

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + 1e-9 * t.tv_nsec;
}

enum { LAYERS = 24, KINDS = 4, F32 = 0, BF16 = 1, WIDEN = 2, SGEMM = 3, HOWS = 4 };
static const int64_t shape[KINDS + 1][2] = {{896, 1152}, {896, 896}, {896, 9728}, {4864, 896}, {896, 151936}};

static float *w32[LAYERS * KINDS + 1];
static uint16_t *w16[LAYERS * KINDS + 1];

static double step(int64_t N, const float *x, float *y, int how) {
  if (how == WIDEN) rx_cpu_bf16_dot_set(0);
  double t0 = now();
  for (int l = 0; l <= LAYERS * KINDS; l++) {
    const int k = l == LAYERS * KINDS ? KINDS : l % KINDS;
    const int64_t C = shape[k][0], OC = shape[k][1];
    int ok = 1;
    if (how == SGEMM)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)N, (int)OC, (int)C, 1, x, (int)C, w32[l], (int)C, 0,
                  y, (int)OC);
    else if (how == BF16 || how == WIDEN) ok = rx_cpu_matmul_forward_f32_bf16(y, x, w16[l], NULL, N, C, OC);
    else rx_cpu_matmul_forward_f32(y, x, w32[l], NULL, N, C, OC);   /* the decode kernel up to 48 rows, then sgemm */
    if (!ok) {
      fprintf(stderr, "decode_matmul: %lld rows: out of memory\n", (long long)N);
      exit(1);
    }
  }
  const double t = now() - t0;
  rx_cpu_bf16_dot_set(1);
  return t;
}

int main(int argc, char **argv) {
  const int64_t N = argc > 1 ? atoll(argv[1]) : 8;
  int64_t params = 0;
  for (int l = 0; l <= LAYERS * KINDS; l++) {
    const int k = l == LAYERS * KINDS ? KINDS : l % KINDS;
    const int64_t n = shape[k][0] * shape[k][1];
    w32[l] = aligned_alloc(64, (size_t)((n * 4 + 63) / 64 * 64));
    w16[l] = aligned_alloc(64, (size_t)((n * 2 + 63) / 64 * 64));
    if (!w32[l] || !w16[l]) { fprintf(stderr, "decode_matmul: out of memory\n"); return 1; }
    for (int64_t i = 0; i < n; i++) {
      const float v = (float)((i * 7919) % 1000) / 1000 - 0.5f;
      uint32_t u;
      memcpy(&u, &v, 4);
      w16[l][i] = (uint16_t)(u >> 16);             /* truncated to bf16 */
      w32[l][i] = rx_cpu_bf16_to_f32(w16[l][i]);   /* the same values in f32 */
    }
    params += n;
  }
  float *x = aligned_alloc(64, (size_t)(N * 9728 * 4)), *y = aligned_alloc(64, (size_t)(N * 151936 * 4));
  for (int64_t i = 0; i < N * 9728; i++) x[i] = 0.01f * (float)(i % 13);
  const int dot = rx_cpu_bf16_dot();
  double best[HOWS] = {1e30, 1e30, 1e30, 1e30};
  for (int rep = 0; rep < 6; rep++)
    for (int how = 0; how < HOWS; how++) {
      if (how == WIDEN && !dot) continue;   /* BF16 is the widening kernel already */
      double t = step(N, x, y, how);
      if (t < best[how]) best[how] = t;
    }
  if (!dot) best[WIDEN] = best[BF16];
  printf("rows=%-3lld f32 %6.1f ms (%4.1f GB/s)  bf16 %s %6.1f ms (%4.1f GB/s, %3.0f GFLOP/s)  bf16 widened %6.1f ms  "
         "sgemm %6.1f ms  bf16/f32 %.2fx  f32/sgemm %.2fx\n", (long long)N, best[F32] * 1e3,
         params * 4.0 / best[F32] / 1e9, dot ? "vdpbf16ps" : "widened", best[BF16] * 1e3, params * 2.0 / best[BF16] / 1e9,
         2.0 * N * params / best[BF16] / 1e9, best[WIDEN] * 1e3, best[SGEMM] * 1e3, best[F32] / best[BF16],
         best[SGEMM] / best[F32]);
  return 0;
}
