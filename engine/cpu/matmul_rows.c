/* matmul_rows.c: y = x W^T (+ b) for a few rows of x (decoding), f32, without packing W: the
 * register-tiled kernel of matmul_rows.inc (shared with the bf16 dot-product kernel of
 * matmul_bf16dot.c) on f32 FMAs, 16 lanes per step. */
#include "cpu.h"

#if defined(__AVX512F__)
#include <immintrin.h>

#define ROWS_W float
#define ROWS_X float
#define ROWS_VW __m512
#define ROWS_VX __m512
#define ROWS_STEP 16
#define ROWS_KC 1024
#define ROWS_MASK_T __mmask16
#define ROWS_LOAD_W(p) _mm512_loadu_ps(p)
#define ROWS_LOAD_W_TAIL(m, p) _mm512_maskz_loadu_ps(m, p)
#define ROWS_LOAD_X(p) _mm512_loadu_ps(p)
#define ROWS_LOAD_X_TAIL(m, p) _mm512_maskz_loadu_ps(m, p)
#define ROWS_MAC(acc, x, w) _mm512_fmadd_ps(x, w, acc)
#include "matmul_rows.inc"

int rx_cpu_matmul_rows_f32(float *out, const float *inp, const float *weight, const float *bias, int64_t N, int64_t C,
                           int64_t OC) {
  if (N > ROWS_MAX_ROWS || C == 0) return 0;
  rows_matmul(out, inp, C, weight, bias, N, C, OC);
  return 1;
}

#else
/* Without AVX-512 the caller keeps its portable path. */
int rx_cpu_matmul_rows_f32(float *out, const float *inp, const float *weight, const float *bias, int64_t N, int64_t C,
                           int64_t OC) {
  (void)out; (void)inp; (void)weight; (void)bias; (void)N; (void)C; (void)OC;
  return 0;
}
#endif
