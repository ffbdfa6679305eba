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
#include <strings.h>

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
 * OpenBLAS splits K (the summed dimension) into blocks of GEMM_Q and adds each block's products
 * into C, so an output's rounding depends on where the blocks start. Both its drivers take whole
 * blocks of Q while 2Q or more remain, but split a remainder between Q and 2Q in two differently:
 * the single-threaded driver (level3.c) at half rounded up to the kernel's unroll, the threaded
 * one (level3_thread.c) at half. A GEMM that runs threaded under 2 threads and single-threaded
 * under 1 then sums in another order: measured here (Cooper Lake kernels, Q = 320), dinp = dout W
 * with K = 2000 and dW += dout^T x with K = 3000 tokens differed in 64% and 59% of their values.
 * So K goes to OpenBLAS in parts that it never splits that way: a multiple of Q, then the rest
 * (below Q), where Q is known (its AVX-512 kernel sets, the table below); elsewhere in slices of
 * RX_GEMM_KC, at most Q for every x86-64 kernel set from Core2 and Sandy Bridge on (not AMD's
 * Bulldozer family, 168-192). With the AVX-512 sets every output then sums the same parts in the
 * same order whatever the thread count (rx_blas_same_bits; tests/c/test_threads.c). The AVX2 sets
 * (Haswell, Zen) are not made so: their threaded sgemm computes the rows and columns at the edges
 * of each thread's share with other kernels, so about 4% of a GEMM's outputs differ between 1 and
 * 2 threads even when K is fed in slices of 64 (docs/reliability.md, "The same bits").
 * Two calls instead of one measured the same within the noise of the 2-core VM here, shared with
 * other processes (the Qwen2.5-0.5B MLP's forward, dinp and dweight with 2048 tokens: -6%, -3%,
 * +1%, +7% and +21% against one call over 5 runs at 1 and 2 threads); slices of 256
 * cost 1% at 1 thread but 1.2-1.5x at 2 threads there, each call a round of OpenBLAS's thread
 * handshakes.
 * A zero beta becomes a zeroed C and beta = 1: with beta = 0 a NoTrans x NoTrans sgemm may take
 * OpenBLAS's "direct" kernel, whose use depends on the thread count too (sgemm_direct_performant). */
enum { RX_GEMM_KC = 256, RX_GEMM_KC_F64 = 128 };

/* GEMM_Q of sgemm and dgemm in OpenBLAS's param.h (0.3.21 to 0.3.28, Linux) for its AVX-512
 * kernel sets, by the name openblas_get_corename() gives; 0 for the others (slices then). */
static const struct { const char *core; int s, d; } gemm_q_table[] = {
  {"SkylakeX", 448, 384}, {"Cooperlake", 320, 384}, {"SapphireRapids", 320, 384},
};
static int q_known = -1, q_s, q_d;   /* q_known: -1 until looked up (the kernel set is chosen at load) */

static void gemm_q(int *s, int *d) {
  if (__atomic_load_n(&q_known, __ATOMIC_ACQUIRE) < 0) {
    const char *core = openblas_get_corename();
    int fs = 0, fd = 0;
    for (size_t i = 0; core && i < sizeof gemm_q_table / sizeof gemm_q_table[0]; i++)
      if (strcasecmp(core, gemm_q_table[i].core) == 0) fs = gemm_q_table[i].s, fd = gemm_q_table[i].d;
    q_s = fs;
    q_d = fd;
    __atomic_store_n(&q_known, 1, __ATOMIC_RELEASE);
  }
  *s = q_s;
  *d = q_d;
}

int32_t rx_blas_same_bits(void) {
  int s, d;
  gemm_q(&s, &d);
  return s > 0;
}

/* The length of the part of K that starts at k0: with Q known, the multiples of Q first, then the
 * rest; else a slice of at most kc. */
static int64_t k_part(int64_t k0, int64_t K, int64_t Q, int64_t kc) {
  if (!Q) return K - k0 < kc ? K - k0 : kc;
  return k0 == 0 && K > Q ? K / Q * Q : K - k0;
}

static void zero_rows(void *c, int64_t M, int64_t N, int64_t ldc, size_t es) {
  #pragma omp parallel for schedule(static) if (M * N > 65536)
  for (int64_t i = 0; i < M; i++) memset((char *)c + (size_t)(i * ldc) * es, 0, (size_t)N * es);
}

void rx_cpu_sgemm(int trans_a, int trans_b, int64_t M, int64_t N, int64_t K, const float *A, int64_t lda,
                  const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
  if (M <= 0 || N <= 0) return;
  if (beta == 0.0f) { zero_rows(C, M, N, ldc, sizeof(float)); beta = 1.0f; }
  int qs, qd;
  gemm_q(&qs, &qd);
  for (int64_t k0 = 0, k; k0 < K; k0 += k) {
    k = k_part(k0, K, qs, RX_GEMM_KC);
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
  int qs, qd;
  gemm_q(&qs, &qd);
  for (int64_t k0 = 0, k; k0 < K; k0 += k) {
    k = k_part(k0, K, qd, RX_GEMM_KC_F64);
    cblas_dgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, (int)M, (int)N,
                (int)k, 1.0, A + (trans_a ? k0 * lda : k0), (int)lda, B + (trans_b ? k0 : k0 * ldb), (int)ldb, beta, C,
                (int)ldc);
    beta = 1.0;
  }
  if (K <= 0 && beta != 1.0)
    for (int64_t i = 0; i < M; i++)
      for (int64_t j = 0; j < N; j++) C[i * ldc + j] *= beta;
}
