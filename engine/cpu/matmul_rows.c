/* matmul_rows.c: y += x W^T for a few rows of x (decoding), f32, without packing W.
 *
 * A decode step multiplies R rows (R = 1..48: one per sequence) by each weight matrix W [OC, C],
 * stored as Hugging Face stores it: each output's weights contiguous. GEMM libraries first copy
 * W into their packed layout, which costs as much as the multiplication when R is small, and a
 * plain dot product per output runs one accumulator chain at a time (bound by FMA latency).
 * Here a register tile of RB input rows x NW weight rows keeps RB*NW accumulators of 16 lanes
 * in flight: each step loads NW weight vectors and RB input vectors and issues RB*NW FMAs.
 *
 * Every output (r, o) has its own accumulator, summed over k in steps of 16 (the tail loaded
 * with a zero mask) and reduced by the same instruction sequence, whatever tile, block or
 * thread computes it: results do not depend on the thread count or the number of rows. */
#include "cpu.h"

#if defined(__AVX512F__)
#include <immintrin.h>

/* 24 accumulators + 6 weight vectors + 1 input vector <= 32 zmm. Of the shapes measured (6x4,
 * 4x6, 3x8, 2x12 at C = 896 and 4864, 8-48 rows), 4x6 was fastest. K is walked in chunks of KC
 * so that a tile's weights (6 x 4 KB) stay in L1 while every row block passes over them; the
 * accumulators of a row block wait in `part` between chunks, unreduced (so the sums are the same
 * bits as without chunks). Weights are prefetched into L2 PF_DIST tiles ahead. */
#ifndef KC
#define KC 1024
#endif
enum { RB = 4, NW = 6, MAX_ROWS = 48 };
#ifndef PF_DIST
#define PF_DIST 8
#endif
#ifndef PF_HINT
#define PF_HINT _MM_HINT_T1
#endif

/* Rows [0, rb) x weight rows [0, nw) over k in [k0, k1): accumulators start at 0 (first) or from
 * part, and end reduced into y (last) or back in part. */
static inline __attribute__((always_inline)) void tile(float *restrict y, int64_t ldy, float *restrict part,
                                                        const float *restrict x, const float *restrict w, int64_t C,
                                                        int64_t k0, int64_t k1, int rb, int nw, const char *pf) {
  __m512 acc[RB][NW];
  if (k0 == 0) {
    _Pragma("GCC unroll 8") for (int i = 0; i < rb; i++)
      _Pragma("GCC unroll 8") for (int j = 0; j < nw; j++) acc[i][j] = _mm512_setzero_ps();
  } else {
    _Pragma("GCC unroll 8") for (int i = 0; i < rb; i++)
      _Pragma("GCC unroll 8") for (int j = 0; j < nw; j++) acc[i][j] = _mm512_load_ps(part + (i * NW + j) * 16);
  }
  int64_t k = k0;
  for (; k + 16 <= k1; k += 16) {
    __m512 wv[NW];
    _Pragma("GCC unroll 8") for (int j = 0; j < nw; j++) wv[j] = _mm512_loadu_ps(w + j * C + k);
    if (pf) _Pragma("GCC unroll 8") for (int j = 0; j < nw; j++) _mm_prefetch(pf + (j * C + k) * 4, PF_HINT);
    _Pragma("GCC unroll 8") for (int i = 0; i < rb; i++) {
      __m512 xv = _mm512_loadu_ps(x + i * C + k);
      _Pragma("GCC unroll 8") for (int j = 0; j < nw; j++) acc[i][j] = _mm512_fmadd_ps(xv, wv[j], acc[i][j]);
    }
  }
  if (k < k1) {   /* only in the last chunk: KC is a multiple of 16 */
    __mmask16 m = (__mmask16)((1u << (k1 - k)) - 1);
    __m512 wv[NW];
    _Pragma("GCC unroll 8") for (int j = 0; j < nw; j++) wv[j] = _mm512_maskz_loadu_ps(m, w + j * C + k);
    _Pragma("GCC unroll 8") for (int i = 0; i < rb; i++) {
      __m512 xv = _mm512_maskz_loadu_ps(m, x + i * C + k);
      _Pragma("GCC unroll 8") for (int j = 0; j < nw; j++) acc[i][j] = _mm512_fmadd_ps(xv, wv[j], acc[i][j]);
    }
  }
  if (k1 == C) {
    _Pragma("GCC unroll 8") for (int i = 0; i < rb; i++)
      _Pragma("GCC unroll 8") for (int j = 0; j < nw; j++) y[i * ldy + j] += _mm512_reduce_add_ps(acc[i][j]);
  } else {
    _Pragma("GCC unroll 8") for (int i = 0; i < rb; i++)
      _Pragma("GCC unroll 8") for (int j = 0; j < nw; j++) _mm512_store_ps(part + (i * NW + j) * 16, acc[i][j]);
  }
}

/* Rows [0, N) against weight rows [0, nw), chunk by chunk: full row blocks of RB, then the
 * rest. The constant arguments let the compiler unroll each variant into registers. */
static inline __attribute__((always_inline)) void column(float *y, const float *x, const float *w, int64_t N,
                                                          int64_t C, int64_t OC, int nw, const char *pf) {
  _Alignas(64) float part[MAX_ROWS * NW * 16];
  for (int64_t k0 = 0; k0 < C; k0 += KC) {
    const int64_t k1 = C - k0 < KC ? C : k0 + KC;
    const char *p = pf;   /* the matching chunk of a tile PF_DIST ahead, in the first row block */
    int64_t n = 0;
    for (; n + RB <= N; n += RB, p = NULL)
      tile(y + n * OC, OC, part + n * NW * 16, x + n * C, w, C, k0, k1, RB, nw, p);
    switch (N - n) {
      case 3: tile(y + n * OC, OC, part + n * NW * 16, x + n * C, w, C, k0, k1, 3, nw, p); break;
      case 2: tile(y + n * OC, OC, part + n * NW * 16, x + n * C, w, C, k0, k1, 2, nw, p); break;
      case 1: tile(y + n * OC, OC, part + n * NW * 16, x + n * C, w, C, k0, k1, 1, nw, p); break;
      default: break;
    }
  }
}

static void column_tile(float *y, const float *x, const float *w, int64_t N, int64_t C, int64_t OC, const char *pf) {
  column(y, x, w, N, C, OC, NW, pf);
}
static void column1(float *y, const float *x, const float *w, int64_t N, int64_t C, int64_t OC) {
  column(y, x, w, N, C, OC, 1, NULL);
}

int rx_cpu_matmul_rows_f32(float *out, const float *inp, const float *weight, int64_t N, int64_t C, int64_t OC) {
  if (N > MAX_ROWS) return 0;
  const int64_t tiles = OC / NW;
  /* threads take contiguous runs of weight tiles: each thread streams its own part of W */
  #pragma omp parallel for schedule(static) if (OC * C > 65536)
  for (int64_t t = 0; t < tiles; t++)
    column_tile(out + t * NW, inp, weight + t * NW * C, N, C, OC,
                t + PF_DIST < tiles ? (const char *)(weight + (t + PF_DIST) * NW * C) : NULL);
  for (int64_t o = tiles * NW; o < OC; o++) column1(out + o, inp, weight + o * C, N, C, OC);
  return 1;
}

#else
/* Without AVX-512 the caller keeps its portable path. */
int rx_cpu_matmul_rows_f32(float *out, const float *inp, const float *weight, int64_t N, int64_t C, int64_t OC) {
  (void)out; (void)inp; (void)weight; (void)N; (void)C; (void)OC;
  return 0;
}
#endif
