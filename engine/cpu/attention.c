/* cpu/attention.c: causal grouped-query attention on CPU, for float and double, on OpenBLAS
 * GEMMs over tiles of queries (or keys). The kernel body lives once in attention.inc. */
#include <cblas.h>
#include <omp.h>
#include "cpu/cpu.h"
#include "cpu/attention.h"

/* Query rows (forward, dq) or keys (dk/dv) per work item: large enough for GEMMs to run near
 * their peak, small enough that the causal triangle wasted in the diagonal block stays modest
 * and B*H*Tq/64 items keep the cores busy. */
enum { RX_ATTN_TILE = 64 };

/* Scratch elements per thread: two blocks of rows x Tk (scores and dP), rows = the largest of a
 * tile and a group of query heads (the decode layout), plus one value per row; rounded to 64
 * bytes so every thread's block has the same alignment (and so the same vectorised summation
 * order: results must not depend on which thread ran an item). */
static int64_t per_thread_elems(const rx_attn_dims *d) {
  const int64_t group = d->H / d->KV, rows = group > RX_ATTN_TILE ? group : RX_ATTN_TILE;
  const int64_t len = d->Tk > d->Tq ? d->Tk : d->Tq;
  return (2 * rows * len + rows + 15) / 16 * 16;
}

static int64_t delta_elems(const rx_attn_dims *d) { return (d->B * d->H * d->Tq + 15) / 16 * 16; }

int64_t rx_cpu_attention_scratch_elems(const rx_attn_dims *d, int threads) {
  return delta_elems(d) + (int64_t)threads * per_thread_elems(d);
}

/* C[M,N] = alpha A op(B) + beta C, row-major. Called inside OpenMP regions, where the OpenMP
 * build of OpenBLAS runs single-threaded. Sizes fit int (tile x Tk, checked in engine/ops). */
static void attn_gemm_f32(int trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                          const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, (int)M, (int)N, (int)K, alpha, A,
              (int)lda, B, (int)ldb, beta, C, (int)ldc);
}
static void attn_gemm_f64(int trans_b, int64_t M, int64_t N, int64_t K, double alpha, const double *A, int64_t lda,
                          const double *B, int64_t ldb, double beta, double *C, int64_t ldc) {
  cblas_dgemm(CblasRowMajor, CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, (int)M, (int)N, (int)K, alpha, A,
              (int)lda, B, (int)ldb, beta, C, (int)ldc);
}

#define RX_KERNEL_BODY "attention.inc"
#include "instantiate.h"
