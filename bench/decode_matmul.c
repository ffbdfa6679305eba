/* bench/decode_matmul.c: the matmuls of one decode step at the Qwen2.5-0.5B shape (24 layers of
 * q|k|v, o, gate|up and down, then the tied head: 2 GB of f32 weights, more than any cache),
 * remax's decode kernel beside OpenBLAS sgemm in the same run, for a given number of rows.
 * Not a test. Build and run with bench/decode_matmul.sh. Prints the best of 6 steps each. */
#include <cblas.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "cpu.h"   /* rx_cpu_matmul_rows_f32 (AVX-512 builds), rx_cpu_matmul_rows_any_f32 (others) */

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + 1e-9 * t.tv_nsec;
}

enum { LAYERS = 24, KINDS = 4 };
static const int64_t shape[KINDS + 1][2] = {{896, 1152}, {896, 896}, {896, 9728}, {4864, 896}, {896, 151936}};

static float *weights[LAYERS * KINDS + 1];

static double step(int64_t N, const float *x, float *y, int blas) {
  double t0 = now();
  for (int l = 0; l <= LAYERS * KINDS; l++) {
    const int k = l == LAYERS * KINDS ? KINDS : l % KINDS;
    const int64_t C = shape[k][0], OC = shape[k][1];
    if (blas)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)N, (int)OC, (int)C, 1, x, (int)C, weights[l], (int)C, 0,
                  y, (int)OC);
    else if (!rx_cpu_matmul_rows_f32(y, x, weights[l], NULL, N, C, OC) &&
             !rx_cpu_matmul_rows_any_f32(y, x, weights[l], NULL, N, C, OC)) {
      fprintf(stderr, "decode_matmul: the kernels do not take %lld rows (more than 48)\n", (long long)N);
      exit(1);
    }
  }
  return now() - t0;
}

int main(int argc, char **argv) {
  const int64_t N = argc > 1 ? atoll(argv[1]) : 8;
  int64_t bytes = 0, params = 0;
  for (int l = 0; l <= LAYERS * KINDS; l++) {
    const int k = l == LAYERS * KINDS ? KINDS : l % KINDS;
    const int64_t n = shape[k][0] * shape[k][1];
    weights[l] = aligned_alloc(64, (size_t)((n * 4 + 63) / 64 * 64));
    if (!weights[l]) { fprintf(stderr, "decode_matmul: out of memory\n"); return 1; }
    for (int64_t i = 0; i < n; i++) weights[l][i] = (float)((i * 7919) % 1000) / 1000 - 0.5f;
    bytes += n * 4;
    params += n;
  }
  float *x = aligned_alloc(64, (size_t)(N * 9728 * 4)), *y = aligned_alloc(64, (size_t)(N * 151936 * 4));
  for (int64_t i = 0; i < N * 9728; i++) x[i] = 0.01f * (float)(i % 13);
  double best[2] = {1e30, 1e30};
  for (int rep = 0; rep < 6; rep++)
    for (int blas = 0; blas < 2; blas++) {
      double t = step(N, x, y, blas);
      if (t < best[blas]) best[blas] = t;
    }
  printf("rows=%lld  remax %.1f ms/step (%.1f GB/s, %.0f GFLOP/s)  sgemm %.1f ms/step  ratio %.2fx\n", (long long)N,
         best[0] * 1e3, bytes / best[0] / 1e9, 2.0 * N * params / best[0] / 1e9, best[1] * 1e3, best[1] / best[0]);
  return 0;
}
