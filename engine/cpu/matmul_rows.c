/* matmul_rows.c: y = x W^T (+ b) for a few rows of x (decoding), f32, without packing W.
 *
 * A decode step multiplies R rows (R = 1..48: one per sequence) by each weight matrix W [OC, C],
 * stored as Hugging Face stores it: each output's weights contiguous. GEMM libraries first copy
 * W into their packed layout, which costs as much as the multiplication when R is small, and a
 * plain dot product per output runs one accumulator chain at a time (bound by FMA latency).
 * Here a register tile of rb input rows x nw weight rows keeps rb*nw accumulators of 16 lanes
 * in flight: each step loads nw weight vectors and rb input vectors and issues rb*nw FMAs.
 *
 * Every output (r, o) has its own accumulator, summed over k in steps of 16 (the tail loaded
 * with a zero mask) and reduced by the same instruction sequence, whatever tile, block or
 * thread computes it: results do not depend on the thread count or the number of rows. */
#include "cpu.h"

#if defined(__AVX512F__)
#include <immintrin.h>
#include <omp.h>
#include "reduce4.h"

/* Two register tiles, each 24 accumulators + its weight vectors + 1 input vector <= 32 zmm:
 *  - up to 8 rows: every row in one pass over W (4 rows x 6 outputs up to 4 rows, else 8 x 3),
 *    so the FMAs run while W streams in from memory;
 *  - more rows: blocks of 4 rows x 6 outputs (of 6x4, 4x6, 3x8 and 2x12 this was fastest). The
 *    first block brings a tile of W into L1 and the others reuse it.
 * Either way the next tile's weights are prefetched into L2 while this one computes: in one
 * pass every row of it, with blocks one row per block, so memory works alongside the FMAs
 * instead of before them. K is walked in chunks of KC so that a tile's weights (6 x 4 KB) stay
 * in L1 across the row blocks; a block's accumulators wait in `part` between chunks, unreduced
 * (the same bits as without chunks). */
enum { MAX_RB = 8, MAX_NW = 6, MAX_ROWS = 48, KC = 1024, PF_TILES = 2 };   /* measured: see docs/kernels.md */

/* Rows [0, rb) x weight rows [0, nw) over k in [k0, k1): accumulators start at 0 (k0 == 0) or
 * from part, and end reduced into y plus the bias (k1 == C) or back in part. Prefetches npf
 * weight rows from pf on (C apart) over the same k range. */
static inline __attribute__((always_inline)) void tile(float *restrict y, int64_t ldy, float *restrict part,
                                                        const float *restrict x, const float *restrict w, int64_t C,
                                                        int64_t k0, int64_t k1, int rb, int nw, const char *pf,
                                                        int npf, const float *bias) {
  __m512 acc[MAX_RB][MAX_NW];
  if (k0 == 0) {
    _Pragma("GCC unroll 8") for (int i = 0; i < rb; i++)
      _Pragma("GCC unroll 8") for (int j = 0; j < nw; j++) acc[i][j] = _mm512_setzero_ps();
  } else {
    _Pragma("GCC unroll 8") for (int i = 0; i < rb; i++)
      _Pragma("GCC unroll 8") for (int j = 0; j < nw; j++) acc[i][j] = _mm512_load_ps(part + (i * MAX_NW + j) * 16);
  }
  int64_t k = k0;
  for (; k + 16 <= k1; k += 16) {
    __m512 wv[MAX_NW];
    _Pragma("GCC unroll 8") for (int j = 0; j < nw; j++) wv[j] = _mm512_loadu_ps(w + j * C + k);
    if (pf) _Pragma("GCC unroll 8") for (int j = 0; j < npf; j++) _mm_prefetch(pf + (j * C + k) * 4, _MM_HINT_T1);
    _Pragma("GCC unroll 8") for (int i = 0; i < rb; i++) {
      __m512 xv = _mm512_loadu_ps(x + i * C + k);
      _Pragma("GCC unroll 8") for (int j = 0; j < nw; j++) acc[i][j] = _mm512_fmadd_ps(xv, wv[j], acc[i][j]);
    }
  }
  if (k < k1) {   /* only in the last chunk: KC is a multiple of 16 */
    __mmask16 m = (__mmask16)((1u << (k1 - k)) - 1);
    __m512 wv[MAX_NW];
    _Pragma("GCC unroll 8") for (int j = 0; j < nw; j++) wv[j] = _mm512_maskz_loadu_ps(m, w + j * C + k);
    _Pragma("GCC unroll 8") for (int i = 0; i < rb; i++) {
      __m512 xv = _mm512_maskz_loadu_ps(m, x + i * C + k);
      _Pragma("GCC unroll 8") for (int j = 0; j < nw; j++) acc[i][j] = _mm512_fmadd_ps(xv, wv[j], acc[i][j]);
    }
  }
  if (k1 == C) {
    _Pragma("GCC unroll 8") for (int i = 0; i < rb; i++)
      _Pragma("GCC unroll 8") for (int j = 0; j < nw; j += 4) {
        const int n = nw - j < 4 ? nw - j : 4;
        const __mmask8 m = (__mmask8)((1u << n) - 1);
        const __m512 z = _mm512_setzero_ps();
        __m128 sum = rx_reduce4(acc[i][j], n > 1 ? acc[i][j + 1] : z, n > 2 ? acc[i][j + 2] : z, n > 3 ? acc[i][j + 3] : z);
        if (bias) sum = _mm_add_ps(_mm_maskz_loadu_ps(m, bias + j), sum);
        _mm_mask_storeu_ps(y + i * ldy + j, m, sum);
      }
  } else {
    _Pragma("GCC unroll 8") for (int i = 0; i < rb; i++)
      _Pragma("GCC unroll 8") for (int j = 0; j < nw; j++) _mm512_store_ps(part + (i * MAX_NW + j) * 16, acc[i][j]);
  }
}

/* Weight rows [0, nw) (a tile, or one row of the remainder) against rows [0, N); next is the
 * tile to prefetch, or NULL. The switches give every row count its own unrolled variant: rb and
 * nw are constants in each. (column6 never runs one pass of 5..8 rows, nor column3 anything but
 * that: tile_width decides; the compiler still emits those variants.) */
#define ONE_PASS(R) case R: tile(y, OC, part, x, w, C, k0, k1, R, nw, next, nw, bias); break;
#define BLOCK(R)                                                                                             \
  case R: tile(y + n * OC, OC, part + n * MAX_NW * 16, x + n * C, w, C, k0, k1, R, nw,                        \
               next && b < nw ? next + b * C * 4 : NULL, 1, bias); break;
static inline __attribute__((always_inline)) void column(float *y, const float *x, const float *w, const float *bias,
                                                          int64_t N, int64_t C, int64_t OC, int nw, const char *next) {
  _Alignas(64) float part[MAX_ROWS * MAX_NW * 16];
  for (int64_t k0 = 0; k0 < C; k0 += KC) {
    const int64_t k1 = C - k0 < KC ? C : k0 + KC;
    if (N <= 8) {
      switch (N) { ONE_PASS(1) ONE_PASS(2) ONE_PASS(3) ONE_PASS(4) ONE_PASS(5) ONE_PASS(6) ONE_PASS(7) ONE_PASS(8) }
      continue;
    }
    int64_t n = 0, b = 0;
    for (; n + 4 <= N; n += 4, b++) switch (4) { BLOCK(4) }
    switch (N - n) { BLOCK(3) BLOCK(2) BLOCK(1) default: break; }
  }
}
#undef ONE_PASS
#undef BLOCK

/* The tile width for N rows: 8 rows x 3 outputs in one pass for 5..8 rows, 4 x 6 otherwise. */
static int tile_width(int64_t N) { return N > 4 && N <= 8 ? 3 : 6; }

static void column6(float *y, const float *x, const float *w, const float *b, int64_t N, int64_t C, int64_t OC,
                    const char *next) {
  column(y, x, w, b, N, C, OC, 6, next);
}
static void column3(float *y, const float *x, const float *w, const float *b, int64_t N, int64_t C, int64_t OC,
                    const char *next) {
  column(y, x, w, b, N, C, OC, 3, next);
}
static void column1(float *y, const float *x, const float *w, const float *b, int64_t N, int64_t C, int64_t OC) {
  column(y, x, w, b, N, C, OC, 1, NULL);
}

int rx_cpu_matmul_rows_f32(float *out, const float *inp, const float *weight, const float *bias, int64_t N, int64_t C,
                           int64_t OC) {
  if (N > MAX_ROWS || C == 0) return 0;
  const int nw = tile_width(N);
  const int64_t tiles = OC / nw;
  /* threads take contiguous runs of tiles: each streams its own part of W, prefetching ahead */
  #pragma omp parallel if (OC * C > 65536)
  {
    const int64_t nt = omp_get_num_threads(), id = omp_get_thread_num();
    const int64_t t0 = tiles * id / nt, t1 = tiles * (id + 1) / nt;
    for (int64_t t = t0; t < t1; t++) {
      const char *next = t + PF_TILES < t1 ? (const char *)(weight + (t + PF_TILES) * nw * C) : NULL;
      const float *b = bias ? bias + t * nw : NULL;
      if (nw == 6) column6(out + t * nw, inp, weight + t * nw * C, b, N, C, OC, next);
      else column3(out + t * nw, inp, weight + t * nw * C, b, N, C, OC, next);
    }
  }
  for (int64_t o = tiles * nw; o < OC; o++) column1(out + o, inp, weight + o * C, bias ? bias + o : NULL, N, C, OC);
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
