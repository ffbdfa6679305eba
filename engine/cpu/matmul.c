/* matmul.c: linear layers on OpenBLAS; the kernel body is matmul.inc. */
#include "cpu.h"

/* C[M,N] = op(A) op(B) + beta C, row-major (blas.c: the same bits for any thread count). Sizes fit
 * int (checked in engine/ops). */
#define rx_gemm_f32 rx_cpu_sgemm
#define rx_gemm_f64 rx_cpu_dgemm

/* A few rows read W in place: the register-tiled f32 kernel where the build has AVX-512 (it
 * takes up to 48 rows, see matmul_rows.c), else the AVX2 / portable register tiles of
 * matmul_bf16.c (also up to 48 rows); the plain dot product per output below is left for f64. */
enum { RX_MATMUL_FEW_ROWS = 8, RX_MATMUL_ROWS_BLOCK = 48 };
static int matmul_rows_f32(float *out, const float *inp, const float *w, const float *b, int64_t N, int64_t C,
                           int64_t OC) {
  return rx_cpu_matmul_rows_f32(out, inp, w, b, N, C, OC) || rx_cpu_matmul_rows_any_f32(out, inp, w, b, N, C, OC);
}
static int matmul_rows_f64(double *out, const double *inp, const double *w, const double *b, int64_t N, int64_t C,
                           int64_t OC) {
  (void)out; (void)inp; (void)w; (void)b; (void)N; (void)C; (void)OC;
  return 0;
}

#define RX_KERNEL_BODY "matmul.inc"
#include "instantiate.h"
