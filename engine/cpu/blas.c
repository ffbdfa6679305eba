/* blas.c: which OpenBLAS kernels run here, and a better set where OpenBLAS fell back.
 *
 * OpenBLAS picks its kernels from the CPU model number at load time. A release older than the
 * CPU does not know its model and falls back to "Prescott" (SSE3): Debian 12's 0.3.21 does so on
 * Emerald Rapids (family 6, model 207), where its sgemm then runs at a quarter of the AVX-512
 * kernels' speed. The instruction sets are what matter, so ask for the kernels they allow. */
#include "cpu.h"
#include <cblas.h>
#include <stdlib.h>
#include <string.h>

char *openblas_get_corename(void);

const char *rx_blas_core(void) { return openblas_get_corename(); }

const char *rx_blas_better_core(void) {
  if (getenv("OPENBLAS_CORETYPE")) return NULL;   /* the user's choice stands */
#if defined(__x86_64__)
  /* the older x86-64 kernel sets OpenBLAS's dynamic build falls back to */
  static const char *const generic[] = {"Prescott", "Core2", "Penryn", "Dunnington", "Nehalem", "Atom", "Sandybridge"};
  const char *core = openblas_get_corename();
  int fallback = 0;
  for (size_t i = 0; i < sizeof generic / sizeof generic[0]; i++)
    if (core && strcmp(core, generic[i]) == 0) fallback = 1;
  if (!fallback) return NULL;
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512cd"))
    return "SkylakeX";
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "Haswell";
#endif
  return NULL;
}

/* ------------------------------------------------------------------ GEMM, the same bits for any thread count
 *
 * OpenBLAS splits K (the summed dimension) into blocks of GEMM_Q (320 for the Cooper Lake, Haswell
 * and Zen sgemm kernels, 448 for SkylakeX) and adds each block's products into C, so an output's
 * rounding depends on where the blocks start. Both its drivers take whole blocks while 2 or more
 * remain, but split a remainder between Q and 2Q in two differently: the single-threaded driver
 * (level3.c) at half rounded up to the kernel's unroll, the threaded one (level3_thread.c) at half.
 * A GEMM that runs threaded under 2 threads and single-threaded under 1 then sums in another order
 * (measured: dinp = dout W with K = 2000, dW += dout^T x with K = 3000 tokens, 1e-6 relative).
 * So K goes to OpenBLAS in slices of RX_GEMM_KC, at most Q for every kernel set of x86-64
 * OpenBLAS from Haswell on, which it never splits: every output is the sum of the same slices in
 * the same order, whatever the thread count. A zero beta becomes a zeroed C and beta = 1: with
 * beta = 0, a NoTrans x NoTrans sgemm may take OpenBLAS's "direct" kernel, whose use depends on
 * the thread count too (sgemm_direct_performant). Measured single-threaded at the Qwen2.5-0.5B
 * MLP shape with 2048 tokens: the slices cost 1% (forward, dinp, dweight, bench in
 * docs/kernels.md). */
enum { RX_GEMM_KC = 256 };

static void zero_rows(void *c, int64_t M, int64_t N, int64_t ldc, size_t es) {
  #pragma omp parallel for schedule(static) if (M * N > 65536)
  for (int64_t i = 0; i < M; i++) memset((char *)c + (size_t)(i * ldc) * es, 0, (size_t)N * es);
}

void rx_cpu_sgemm(int trans_a, int trans_b, int64_t M, int64_t N, int64_t K, const float *A, int64_t lda,
                  const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
  if (M <= 0 || N <= 0) return;
  if (beta == 0.0f) { zero_rows(C, M, N, ldc, sizeof(float)); beta = 1.0f; }
  for (int64_t k0 = 0; k0 < K; k0 += RX_GEMM_KC) {
    const int64_t k = K - k0 < RX_GEMM_KC ? K - k0 : RX_GEMM_KC;
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, (int)M, (int)N,
                (int)k, 1.0f, A + (trans_a ? k0 * lda : k0), (int)lda, B + (trans_b ? k0 : k0 * ldb), (int)ldb, beta, C,
                (int)ldc);
    beta = 1.0f;
  }
  if (K <= 0 && beta != 1.0f)
    for (int64_t i = 0; i < M; i++)
      for (int64_t j = 0; j < N; j++) C[i * ldc + j] *= beta;
}

void rx_cpu_dgemm(int trans_a, int trans_b, int64_t M, int64_t N, int64_t K, const double *A, int64_t lda,
                  const double *B, int64_t ldb, double beta, double *C, int64_t ldc) {
  if (M <= 0 || N <= 0) return;
  if (beta == 0.0) { zero_rows(C, M, N, ldc, sizeof(double)); beta = 1.0; }
  for (int64_t k0 = 0; k0 < K; k0 += RX_GEMM_KC) {
    const int64_t k = K - k0 < RX_GEMM_KC ? K - k0 : RX_GEMM_KC;
    cblas_dgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, (int)M, (int)N,
                (int)k, 1.0, A + (trans_a ? k0 * lda : k0), (int)lda, B + (trans_b ? k0 : k0 * ldb), (int)ldb, beta, C,
                (int)ldc);
    beta = 1.0;
  }
  if (K <= 0 && beta != 1.0)
    for (int64_t i = 0; i < M; i++)
      for (int64_t j = 0; j < N; j++) C[i * ldc + j] *= beta;
}
