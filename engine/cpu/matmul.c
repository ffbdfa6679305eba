/* matmul.c: linear layers on OpenBLAS; the kernel body is matmul.inc. */
#include "cpu.h"
#include <cblas.h>

/* C[M,N] = op(A) op(B) + beta C, row-major, alpha 1. Sizes fit int (checked in engine/ops). */
static void rx_gemm_f32(enum CBLAS_TRANSPOSE ta, enum CBLAS_TRANSPOSE tb, int64_t M, int64_t N, int64_t K,
                        const float *A, int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, ta, tb, (int)M, (int)N, (int)K, 1.0f, A, (int)lda, B, (int)ldb, beta, C, (int)ldc);
}
static void rx_gemm_f64(enum CBLAS_TRANSPOSE ta, enum CBLAS_TRANSPOSE tb, int64_t M, int64_t N, int64_t K,
                        const double *A, int64_t lda, const double *B, int64_t ldb, double beta, double *C,
                        int64_t ldc) {
  cblas_dgemm(CblasRowMajor, ta, tb, (int)M, (int)N, (int)K, 1.0, A, (int)lda, B, (int)ldb, beta, C, (int)ldc);
}

/* A few rows read W in place: the register-tiled f32 kernel where the build has AVX-512 (it
 * takes up to 48 rows, see matmul_rows.c), else the AVX2 / portable register tiles of
 * matmul_bf16.c (also up to 48 rows); the plain dot product per output below is left for f64. */
enum { RX_MATMUL_FEW_ROWS = 8 };
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
