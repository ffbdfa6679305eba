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

/* One sequence of an attention call (cpu/attention.h): its first query row q0 (in rows of
 * [.., H, D]), nq queries against nk keys (query i at key nk - nq + i), its keys' element offset
 * in k and v, its first key row kv0 in dk / dv, its first mask entry, and lse[h, i] at
 * lse0 + h * lse_hs + i. */
typedef struct attn_seq { int64_t q0, nq, nk, kofs, vofs, kv0, mask0, lse0, lse_hs; } attn_seq;

static inline attn_seq attn_seq_at(const rx_attn_dims *d, int64_t r) {
  const int32_t *cu = d->cu_seqlens;
  if (cu) {
    const int64_t a = cu[r], n = cu[r + 1] - cu[r], ldk = d->KV * d->D;
    return (attn_seq){a, n, n, a * ldk, a * ldk, a, a, a, d->Tq};
  }
  return (attn_seq){r * d->Tq, d->Tq, d->Tk, r * d->k_batch_stride, r * d->v_batch_stride, r * d->Tk, r * d->Tk,
                    r * d->H * d->Tq, d->Tq};
}

static inline int64_t attn_nseq(const rx_attn_dims *d) { return d->cu_seqlens ? d->S : d->B; }
static inline int64_t attn_tiles(int64_t n) { return (n + RX_ATTN_TILE - 1) / RX_ATTN_TILE; }

/* The work items of a pass over tiles of `len` (queries or keys) of every sequence, times
 * `heads`: item it -> (sequence r, tile t, head h). Without cu_seqlens every sequence has the
 * same tiles and the last (longest, causal) tiles of all sequences come first; with it, `first`
 * (the prefix sums of the sequences' tiles, [S+1]) is searched and each sequence's last tile
 * comes first. */
typedef struct attn_items { const int64_t *first; int64_t tiles, heads, count; } attn_items;

static void attn_items_init(attn_items *w, const rx_attn_dims *d, int64_t len, int64_t heads, int64_t *first) {
  w->heads = heads;
  w->first = NULL;
  if (!d->cu_seqlens) {
    w->tiles = attn_tiles(len);
    w->count = w->tiles * d->B * heads;
    return;
  }
  first[0] = 0;
  for (int64_t r = 0; r < d->S; r++) first[r + 1] = first[r] + attn_tiles(d->cu_seqlens[r + 1] - d->cu_seqlens[r]);
  w->first = first;
  w->tiles = 0;
  w->count = first[d->S] * heads;
}

/* Where the items' prefix sums live: after the deltas and the threads' blocks of the scratch. */
static int64_t *attn_items_room(const rx_attn_dims *d, void *scratch, int threads, size_t es) {
  return (int64_t *)((char *)scratch + (size_t)(delta_elems(d) + (int64_t)threads * per_thread_elems(d)) * es);
}

static inline void attn_item(const attn_items *w, int64_t B, int64_t S, int64_t it, int64_t *r, int64_t *t, int64_t *h,
                             int last_first) {
  if (!w->first) {
    const int64_t bh = it % (B * w->heads), k = it / (B * w->heads);
    *r = bh / w->heads;
    *h = bh % w->heads;
    *t = last_first ? w->tiles - 1 - k : k;
    return;
  }
  const int64_t j = it / w->heads;
  *h = it % w->heads;
  int64_t lo = 0, hi = S - 1;          /* the sequence whose tiles hold j: first[r] <= j < first[r+1] */
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (w->first[mid] <= j) lo = mid; else hi = mid - 1;
  }
  *r = lo;
  const int64_t k = j - w->first[lo], n = w->first[lo + 1] - w->first[lo];
  *t = last_first ? n - 1 - k : k;
}

int64_t rx_cpu_attention_scratch_elems(const rx_attn_dims *d, int threads) {
  /* + two [S+1] int64 prefix sums of tiles (attn_items), 4 (S+1) elements of either type */
  return delta_elems(d) + (int64_t)threads * per_thread_elems(d) + (d->cu_seqlens ? 4 * (d->S + 1) : 0);
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
