/* bench/train_step_gemm.c: the GEMMs of one training step (forward, input gradient, weight
 * gradient of every linear layer, and the head) at a bench/common.lua shape, in the same run:
 * OpenBLAS sgemm on f32 (what remax's f32 training runs) and oneDNN's bf16 matmul with f32
 * accumulation (engine/cpu/dnnl.c; what bf16 mixed-precision training would run), the bf16
 * version paying for rounding its activations and gradients to bf16 on every call and the
 * weights once per step (the bf16 working copy). Not a test. Build and run with
 * bench/train_step_gemm.sh. Prints the best of REPS steps each (default 3). */
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

static void round_bf16(uint16_t *dst, const float *src, int64_t n) {
  #pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; i++) dst[i] = rx_cpu_f32_to_bf16(src[i]);
}

static float *fill(int64_t n, float scale) {
  float *p = aligned_alloc(64, (size_t)((n * 4 + 63) / 64 * 64));
  for (int64_t i = 0; i < n; i++) p[i] = scale * ((float)((i * 7919) % 1000) / 1000 - 0.5f);
  return p;
}

int main(int argc, char **argv) {
  const int small = argc > 1 && strcmp(argv[1], "small") == 0;
  const int64_t N = argc > 2 ? atoll(argv[2]) : small ? 8 * 256 : 4 * 256;   /* rows: B x T */
  const int64_t H = small ? 256 : 896, FF = small ? 688 : 4864, KV = small ? 64 : 128, V = small ? 1024 : 151936;
  const int L = small ? 4 : 24;
  /* {C, OC} of q|k|v, o, gate|up, down, head */
  const int64_t shape[5][2] = {{H, H + 2 * KV}, {H, H}, {H, 2 * FF}, {FF, H}, {H, V}};
  if (!rx_cpu_dnnl()) { fprintf(stderr, "train_step_gemm: no oneDNN bf16 here (%s)\n", rx_cpu_dnnl_kernel()); return 1; }
  int64_t maxw = 0, maxa = 0;
  for (int k = 0; k < 5; k++) {
    if (shape[k][0] * shape[k][1] > maxw) maxw = shape[k][0] * shape[k][1];
    if (N * shape[k][1] > maxa) maxa = N * shape[k][1];
  }
  float *w = fill(maxw, 0.1f), *dw = fill(maxw, 0), *x = fill(N * FF, 1), *y = fill(maxa, 1), *dy = fill(maxa, 1),
        *dx = fill(N * FF, 0);
  uint16_t *w16 = malloc((size_t)maxw * 2), *x16 = malloc((size_t)(N * FF) * 2), *dy16 = malloc((size_t)maxa * 2);
  double best[2] = {1e30, 1e30}, flops = 0, part[2][3], best_part[2][3] = {{1e30, 1e30, 1e30}, {1e30, 1e30, 1e30}};
  const int reps = getenv("REPS") ? atoi(getenv("REPS")) : 3;
  for (int rep = 0; rep < reps; rep++)
    for (int how = 0; how < 2; how++) {
      flops = 0;
      memset(part[how], 0, sizeof part[how]);
      const double t0 = now();
      for (int l = 0; l <= 4 * L; l++) {
        const int k = l == 4 * L ? 4 : l % 4;
        const int64_t C = shape[k][0], OC = shape[k][1];
        flops += 6.0 * N * C * OC;
        if (how == 0) {
          double t = now();
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)N, (int)OC, (int)C, 1, x, (int)C, w, (int)C, 0, y, (int)OC);
          part[0][0] += now() - t; t = now();
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)N, (int)C, (int)OC, 1, dy, (int)OC, w, (int)C, 0, dx, (int)C);
          part[0][1] += now() - t; t = now();
          cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)OC, (int)C, (int)N, 1, dy, (int)OC, x, (int)C, 1, dw, (int)C);
          part[0][2] += now() - t;
        } else {
          double t = now();
          round_bf16(w16, w, OC * C);   /* the step's bf16 working copy of the weight */
          round_bf16(x16, x, N * C);
          int ok = rx_cpu_dnnl_gemm_bf16(y, OC, x16, (int64_t[2]){C, 1}, w16, (int64_t[2]){1, C}, N, OC, C, 0);
          part[1][0] += now() - t; t = now();
          round_bf16(dy16, dy, N * OC);
          ok = ok && rx_cpu_dnnl_gemm_bf16(dx, C, dy16, (int64_t[2]){OC, 1}, w16, (int64_t[2]){C, 1}, N, C, OC, 0);
          part[1][1] += now() - t; t = now();
          ok = ok && rx_cpu_dnnl_gemm_bf16(dw, C, dy16, (int64_t[2]){1, OC}, x16, (int64_t[2]){C, 1}, OC, C, N, 1);
          part[1][2] += now() - t;
          if (!ok) { fprintf(stderr, "train_step_gemm: oneDNN failed\n"); return 1; }
        }
      }
      const double t = now() - t0;
      if (t < best[how]) best[how] = t;
      for (int k = 0; k < 3; k++) if (part[how][k] < best_part[how][k]) best_part[how][k] = part[how][k];
    }
  printf("%s rows=%lld  sgemm f32 %7.1f ms (%5.0f GFLOP/s)  oneDNN bf16 %7.1f ms (%5.0f GFLOP/s)  bf16/f32 %.2fx  [%s]\n",
         small ? "small   " : "qwen0.5b", (long long)N, best[0] * 1e3, flops / best[0] / 1e9, best[1] * 1e3,
         flops / best[1] / 1e9, best[0] / best[1], rx_cpu_dnnl_kernel());
  printf("  by GEMM (ms, sgemm / oneDNN bf16, the bf16 side with its rounding): forward %.1f / %.1f (%.2fx)  "
         "dinp %.1f / %.1f (%.2fx)  dweight %.1f / %.1f (%.2fx)\n", best_part[0][0] * 1e3, best_part[1][0] * 1e3,
         best_part[0][0] / best_part[1][0], best_part[0][1] * 1e3, best_part[1][1] * 1e3, best_part[0][1] / best_part[1][1],
         best_part[0][2] * 1e3, best_part[1][2] * 1e3, best_part[0][2] / best_part[1][2]);
  return 0;
}
