/* matmul_bf16dot.c: y = x W^T (+ b) for a few rows of x (decoding) with W stored in bf16, on the
 * AVX-512 BF16 dot product.
 *
 * `vdpbf16ps` multiplies 32 pairs of bf16 numbers and adds each pair's two products into one of 16
 * f32 lanes: twice the products of an f32 FMA per instruction, and the weights go in as they are
 * stored (no widening). The inputs are rounded to bf16 once per call (nearest even, as
 * rx_cpu_f32_to_bf16); a product of two bf16 numbers is exact in f32 and every sum is f32, so the
 * result is the f32 layer on the bf16-rounded inputs and weights up to the order of the sums (and
 * denormal inputs, which the instruction reads as zero). matmul_bf16.c's other paths round the
 * inputs the same way, so a bf16-stored weight computes the same numbers on every CPU.
 *
 * The layout follows matmul_rows.c (the f32 kernel): register tiles of up to 8 rows x 3 weight
 * rows or 4 x 6, one accumulator of 16 lanes per (row, output) summed over k in steps of 32 (the
 * tail loaded with a zero mask) and reduced by rx_reduce4, the next tiles prefetched into L2, k
 * in chunks of KC; so a row's outputs do not depend on the rows beside it or the thread count.
 *
 * Compiled for AVX-512 BF16 with a target pragma whatever the build's -march, and used only where
 * the CPU reports the instruction (rx_cpu_bf16_dot): one binary runs everywhere. */
#include "cpu.h"
#include <stdio.h>
#include <stdlib.h>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 10
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")
#include <immintrin.h>
#include <omp.h>
#include "reduce4.h"

enum { MAX_RB = 8, MAX_NW = 6, KC = 2048, PF_TILES = 2 };   /* KC: 4 KB of a weight row, as matmul_rows.c */

/* Rows [0, rb) of x (bf16, ldx apart, zero-padded to a multiple of 32) x weight rows [0, nw) over
 * k in [k0, k1): accumulators start at 0 (k0 == 0) or from part, and end reduced into y plus the
 * bias (k1 == C) or back in part. Prefetches npf weight rows from pf on over the same k range. */
static inline __attribute__((always_inline)) void tile(float *restrict y, int64_t ldy, float *restrict part,
                                                        const uint16_t *restrict x, int64_t ldx,
                                                        const uint16_t *restrict w, int64_t C, int64_t k0, int64_t k1,
                                                        int rb, int nw, const char *pf, int npf, const float *bias) {
  __m512 acc[MAX_RB][MAX_NW];
  if (k0 == 0) {
    _Pragma("GCC unroll 8") for (int i = 0; i < rb; i++)
      _Pragma("GCC unroll 8") for (int j = 0; j < nw; j++) acc[i][j] = _mm512_setzero_ps();
  } else {
    _Pragma("GCC unroll 8") for (int i = 0; i < rb; i++)
      _Pragma("GCC unroll 8") for (int j = 0; j < nw; j++) acc[i][j] = _mm512_load_ps(part + (i * MAX_NW + j) * 16);
  }
  int64_t k = k0;
  for (; k + 32 <= k1; k += 32) {
    __m512bh wv[MAX_NW];
    _Pragma("GCC unroll 8") for (int j = 0; j < nw; j++) wv[j] = (__m512bh)_mm512_loadu_si512(w + j * C + k);
    if (pf) _Pragma("GCC unroll 8") for (int j = 0; j < npf; j++) _mm_prefetch(pf + (j * C + k) * 2, _MM_HINT_T1);
    _Pragma("GCC unroll 8") for (int i = 0; i < rb; i++) {
      const __m512bh xv = (__m512bh)_mm512_load_si512(x + i * ldx + k);
      _Pragma("GCC unroll 8") for (int j = 0; j < nw; j++) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], xv, wv[j]);
    }
  }
  if (k < k1) {   /* only in the last chunk: KC is a multiple of 32; x's padding is zero */
    const __mmask32 m = (__mmask32)((1ull << (k1 - k)) - 1);
    __m512bh wv[MAX_NW];
    _Pragma("GCC unroll 8") for (int j = 0; j < nw; j++) wv[j] = (__m512bh)_mm512_maskz_loadu_epi16(m, w + j * C + k);
    _Pragma("GCC unroll 8") for (int i = 0; i < rb; i++) {
      const __m512bh xv = (__m512bh)_mm512_load_si512(x + i * ldx + k);
      _Pragma("GCC unroll 8") for (int j = 0; j < nw; j++) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], xv, wv[j]);
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

/* Weight rows [0, nw) against rows [0, N): one pass up to 8 rows, else blocks of 4 (the first
 * brings the tile into L1). next is the tile to prefetch, or NULL. */
#define ONE_PASS(R) case R: tile(y, OC, part, x, ldx, w, C, k0, k1, R, nw, next, nw, bias); break;
#define BLOCK(R)                                                                                             \
  case R: tile(y + n * OC, OC, part + n * MAX_NW * 16, x + n * ldx, ldx, w, C, k0, k1, R, nw,                 \
               next && b < nw ? next + b * C * 2 : NULL, 1, bias); break;
static inline __attribute__((always_inline)) void column(float *y, const uint16_t *x, int64_t ldx, const uint16_t *w,
                                                          const float *bias, int64_t N, int64_t C, int64_t OC, int nw,
                                                          const char *next) {
  _Alignas(64) float part[RX_BF16_FEW_ROWS * MAX_NW * 16];
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

/* 8 rows x 3 outputs in one pass for 5..8 rows, 4 x 6 otherwise (as matmul_rows.c). */
static int tile_width(int64_t N) { return N > 4 && N <= 8 ? 3 : 6; }

static void column6(float *y, const uint16_t *x, int64_t ldx, const uint16_t *w, const float *b, int64_t N, int64_t C,
                    int64_t OC, const char *next) {
  column(y, x, ldx, w, b, N, C, OC, 6, next);
}
static void column3(float *y, const uint16_t *x, int64_t ldx, const uint16_t *w, const float *b, int64_t N, int64_t C,
                    int64_t OC, const char *next) {
  column(y, x, ldx, w, b, N, C, OC, 3, next);
}
static void column1(float *y, const uint16_t *x, int64_t ldx, const uint16_t *w, const float *b, int64_t N, int64_t C,
                    int64_t OC) {
  column(y, x, ldx, w, b, N, C, OC, 1, NULL);
}

/* dst[n, 0..ldx) = the row inp[n, 0..C) rounded to bf16, then zeros. */
static void round_rows(uint16_t *dst, int64_t ldx, const float *inp, int64_t N, int64_t C) {
  for (int64_t n = 0; n < N; n++) {
    const float *s = inp + n * C;
    uint16_t *d = dst + n * ldx;
    for (int64_t k = 0; k < ldx; k += 32) {
      const int64_t left = C - k;
      const __mmask16 lo = left >= 16 ? 0xffff : left > 0 ? (__mmask16)((1u << left) - 1) : 0;
      const __mmask16 hi = left >= 32 ? 0xffff : left > 16 ? (__mmask16)((1u << (left - 16)) - 1) : 0;
      const __m512 a = _mm512_maskz_loadu_ps(lo, s + k), b = _mm512_maskz_loadu_ps(hi, s + k + 16);
      _mm512_store_si512(d + k, (__m512i)_mm512_cvtne2ps_pbh(b, a));   /* a in the low half */
    }
  }
}

static void matmul_rows_dot(float *out, const uint16_t *x, int64_t ldx, const uint16_t *weight, const float *bias,
                            int64_t N, int64_t C, int64_t OC) {
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
      if (nw == 6) column6(out + t * nw, x, ldx, weight + t * nw * C, b, N, C, OC, next);
      else column3(out + t * nw, x, ldx, weight + t * nw * C, b, N, C, OC, next);
    }
  }
  for (int64_t o = tiles * nw; o < OC; o++) column1(out + o, x, ldx, weight + o * C, bias ? bias + o : NULL, N, C, OC);
}
#pragma GCC pop_options

static _Thread_local uint16_t *xbuf;
static _Thread_local size_t xbuf_len;

int rx_cpu_matmul_rows_bf16dot(float *out, const float *inp, const uint16_t *weight, const float *bias, int64_t N,
                               int64_t C, int64_t OC) {
  if (N > RX_BF16_FEW_ROWS || C == 0 || !rx_cpu_bf16_dot()) return 0;
  const int64_t ldx = (C + 31) / 32 * 32;
  const size_t need = (size_t)(N * ldx);
  if (need > xbuf_len) {   /* the calling thread's, grown to the largest shape seen and kept */
    uint16_t *p = NULL;
    if (posix_memalign((void **)&p, 64, need * sizeof(uint16_t))) return -1;
    free(xbuf);
    xbuf = p;
    xbuf_len = need;
  }
  round_rows(xbuf, ldx, inp, N, C);
  matmul_rows_dot(out, xbuf, ldx, weight, bias, N, C, OC);
  return 1;
}

static int detect(void) {
  const char *off = getenv("REMAX_NO_BF16_DOT");
  if (off && *off && *off != '0') return 0;
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
}
#else
int rx_cpu_matmul_rows_bf16dot(float *out, const float *inp, const uint16_t *weight, const float *bias, int64_t N,
                               int64_t C, int64_t OC) {
  (void)out; (void)inp; (void)weight; (void)bias; (void)N; (void)C; (void)OC;
  return 0;
}
static int detect(void) { return 0; }
#endif

static int bf16_dot = -1;   /* -1: not yet asked */

int rx_cpu_bf16_dot(void) {
  int on = __atomic_load_n(&bf16_dot, __ATOMIC_RELAXED);
  if (on < 0) {
    on = detect();
    __atomic_store_n(&bf16_dot, on, __ATOMIC_RELAXED);
  }
  return on;
}

void rx_cpu_bf16_dot_set(int on) { __atomic_store_n(&bf16_dot, on ? detect() : 0, __ATOMIC_RELAXED); }

/* Why the decode kernel does not run here. */
static const char *no_dot(void) {
  const char *off = getenv("REMAX_NO_BF16_DOT");
  if (off && *off && *off != '0') return "none: REMAX_NO_BF16_DOT is set (bf16 weights are widened to f32)";
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 10
  return "none: this CPU has no AVX-512 BF16 (bf16 weights are widened to f32)";
#else
  return "none: built without the AVX-512 BF16 kernels (GCC 10+ on x86-64; bf16 weights are widened to f32)";
#endif
}

const char *rx_bf16_kernels(void) {
  static char text[320];
  snprintf(text, sizeof text, "%s; %s%s", rx_cpu_bf16_dot() ? "vdpbf16ps (AVX-512 BF16) for bf16 weights' decode matmuls" : no_dot(),
           rx_cpu_dnnl_kernel(), rx_cpu_dnnl() ? " (bf16 GEMMs built in)" : "");
  return text;
}
