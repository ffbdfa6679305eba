/* matmul_bf16.c: linear layers and embeddings whose weights are stored in bf16, computed in f32.
 *
 * A frozen model (the KL reference, a model that only generates or evaluates) keeps its weight
 * matrices in bf16: half the bytes of f32, and decoding is bound by reading those bytes. The
 * forward is the bf16 matmul as the AVX-512 BF16 dot product computes it, on every CPU: the inputs
 * rounded to bf16 (nearest even), every product exact in f32 (a bf16 value is an f32 with the low
 * 16 bits zero: widening is a shift), sums in f32. So a model's numbers do not depend on whether
 * the CPU has the instruction, nor on the number of rows, beyond the order of the sums.
 *
 *  - Where the CPU has AVX-512 BF16, up to RX_BF16_DOT_ROWS rows: vdpbf16ps (matmul_bf16dot.c; a
 *    64-token prefill in blocks of 48 rows, each a pass over W); more rows widen blocks of W for
 *    sgemm, faster there (the measurements are in cpu.h).
 *  - Elsewhere a few rows (decoding, N <= RX_BF16_FEW_ROWS): register tiles of up to 4 input
 *    rows x a few weight rows, the weights widened in registers as they stream in (in blocks of
 *    4 rows when there are more; the tile is in L1 after the first block). Every output is one
 *    accumulator vector over k, reduced in a fixed order, plus a scalar tail: the same bits
 *    whatever the tile, block or thread count.
 *  - Elsewhere many rows (prefill, training forwards of a frozen model): blocks of weight rows are widened
 *    into an f32 buffer and multiplied by OpenBLAS's sgemm with the rounded inputs; the widening
 *    costs OC*C per call against 2*N*OC*C flops. dinp = dout W (backward through a frozen weight,
 *    e.g. LoRA on a bf16 base; dout is not rounded) walks the same blocks.
 * The buffers are the calling thread's, grown to the largest shape seen and kept (allocated once
 * per shape, not per call). */
#include "cpu.h"
#include <omp.h>
#include <stdlib.h>

#if defined(__AVX512F__)
#include <immintrin.h>
typedef __m512 vf;
/* 32 zmm: up to 4 rows x 6 outputs = 24 accumulators + 6 weight vectors + 1 input vector */
enum { VW = 16, RB_MAX = 4, NW_MAX = 6, NW1 = 6, NW2 = 6, NW3 = 6, NW4 = 6 };
static inline vf vzero(void) { return _mm512_setzero_ps(); }
static inline vf vload(const float *p) { return _mm512_loadu_ps(p); }
static inline vf vload_bf16(const uint16_t *p) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}
static inline vf vfma(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }
static inline float vsum(vf v) {   /* halves, then quarters, ...: a fixed order */
  __m256 h = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
  __m128 q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
  q = _mm_add_ps(q, _mm_movehl_ps(q, q));
  q = _mm_add_ss(q, _mm_movehdup_ps(q));
  return _mm_cvtss_f32(q);
}
#elif defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
typedef __m256 vf;
/* 16 ymm: rows x outputs accumulators + outputs weight vectors + 1 input vector: 1x6, 2x4, 3x3, 4x3 */
enum { VW = 8, RB_MAX = 4, NW_MAX = 6, NW1 = 6, NW2 = 4, NW3 = 3, NW4 = 3 };
static inline vf vzero(void) { return _mm256_setzero_ps(); }
static inline vf vload(const float *p) { return _mm256_loadu_ps(p); }
static inline vf vload_bf16(const uint16_t *p) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
}
static inline vf vfma(vf a, vf b, vf c) { return _mm256_fmadd_ps(a, b, c); }
static inline float vsum(vf v) {
  __m128 q = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  q = _mm_add_ps(q, _mm_movehl_ps(q, q));
  q = _mm_add_ss(q, _mm_movehdup_ps(q));
  return _mm_cvtss_f32(q);
}
#else
typedef float vf;   /* portable: one lane */
enum { VW = 1, RB_MAX = 4, NW_MAX = 4, NW1 = 4, NW2 = 4, NW3 = 4, NW4 = 4 };
static inline vf vzero(void) { return 0.0f; }
static inline vf vload(const float *p) { return *p; }
static inline vf vload_bf16(const uint16_t *p) { return rx_cpu_bf16_to_f32(*p); }
static inline vf vfma(vf a, vf b, vf c) { return a * b + c; }
static inline float vsum(vf v) { return v; }
#endif

/* ------------------------------------------------------------------ scratch (engine/cpu/scratch.c) */

static _Thread_local rx_cpu_scratch widened, rounded;   /* blocks of W for sgemm; the inputs rounded to bf16 */
static float *scratch_get(rx_cpu_scratch *s, size_t n) { return rx_cpu_scratch_get(s, n * sizeof(float)); }

/* The inputs as the bf16 dot product sees them: inp [N, C] rounded to bf16 (nearest even), in the
 * thread's buffer; NULL when out of memory. */
static const float *round_inputs(const float *inp, int64_t N, int64_t C) {
  float *x = scratch_get(&rounded, (size_t)(N * C));
  if (!x) return NULL;
  #pragma omp parallel for schedule(static) if (N * C > 65536)
  for (int64_t n = 0; n < N; n++) {
    #pragma omp simd
    for (int64_t k = 0; k < C; k++) x[n * C + k] = rx_cpu_bf16_to_f32(rx_cpu_f32_to_bf16(inp[n * C + k]));
  }
  return x;
}

/* dst[k] = the bf16 row src[k], widened. */
static inline void widen_row(float *restrict dst, const uint16_t *restrict src, int64_t C) {
  #pragma omp simd
  for (int64_t k = 0; k < C; k++) dst[k] = rx_cpu_bf16_to_f32(src[k]);
}

/* Rows [0, rows) of a block for sgemm, over threads (called outside any parallel region). */
static void widen_rows(float *dst, const uint16_t *src, int64_t rows, int64_t C) {
  #pragma omp parallel for schedule(static) if (rows * C > 65536)
  for (int64_t r = 0; r < rows; r++) widen_row(dst + r * C, src + r * C, C);
}

/* ------------------------------------------------------------------ a few rows */

/* Rows [0, rb) of x against weight rows [0, nw), each C apart: bf16 widened in registers (wb)
 * or f32 (wf). y[i*ldy + j] = dot + bias[j]. rb, nw and the source are constants at every call
 * site (the switches below), so each shape is its own unrolled loop. */
static inline __attribute__((always_inline)) void tile(float *restrict y, int64_t ldy, const float *restrict x,
                                                        const uint16_t *restrict wb, const float *restrict wf,
                                                        const float *bias, int64_t C, const int rb, const int nw,
                                                        const int from_bf16) {
  vf acc[RB_MAX][NW_MAX];
  _Pragma("GCC unroll 8") for (int i = 0; i < rb; i++)
    _Pragma("GCC unroll 8") for (int j = 0; j < nw; j++) acc[i][j] = vzero();
  const int64_t Cv = C - C % VW;
  for (int64_t k = 0; k < Cv; k += VW) {
    vf w[NW_MAX];
    _Pragma("GCC unroll 8") for (int j = 0; j < nw; j++) w[j] = from_bf16 ? vload_bf16(wb + j * C + k) : vload(wf + j * C + k);
    _Pragma("GCC unroll 8") for (int i = 0; i < rb; i++) {
      const vf xv = vload(x + i * C + k);
      _Pragma("GCC unroll 8") for (int j = 0; j < nw; j++) acc[i][j] = vfma(xv, w[j], acc[i][j]);
    }
  }
  _Pragma("GCC unroll 8") for (int i = 0; i < rb; i++)
    _Pragma("GCC unroll 8") for (int j = 0; j < nw; j++) {
      float s = vsum(acc[i][j]);
      for (int64_t k = Cv; k < C; k++) s += x[i * C + k] * (from_bf16 ? rx_cpu_bf16_to_f32(wb[j * C + k]) : wf[j * C + k]);
      y[i * ldy + j] = bias ? s + bias[j] : s;
    }
}

/* The tile widths: with few rows more weight rows per tile keep enough accumulators in flight
 * (FMA latency), always within the register file. An output's sum does not depend on the tile. */
static int tile_width(int64_t N) { return N >= 4 ? NW4 : N == 3 ? NW3 : N == 2 ? NW2 : NW1; }

#define T(R, W, B) tile(y, ldy, x, wb, wf, bias, C, R, W, B)
#define ROWS(W, B) switch (rb) { case 1: T(1, W, B); break; case 2: T(2, W, B); break; case 3: T(3, W, B); break; default: T(4, W, B); }
#define WIDTHS(B)                                             \
  if (nw == 1) { ROWS(1, B) }                                 \
  else if (nw == NW4) { ROWS(NW4, B) }                        \
  else if (rb == 1) T(1, NW1, B);                             \
  else if (rb == 2) T(2, NW2, B);                             \
  else T(3, NW3, B);
/* rb rows x nw outputs: nw is 1 (the remainder), NW4 (any rb), or tile_width(rb) */
static void tile_any(float *y, int64_t ldy, const float *x, const uint16_t *wb, const float *wf, const float *bias,
                     int64_t C, int rb, int nw, int from_bf16) {
  if (from_bf16) { WIDTHS(1) } else { WIDTHS(0) }
}
#undef WIDTHS
#undef ROWS
#undef T

/* Weight rows [o0, o0 + nw) against every input row, in blocks of RB_MAX rows: f32 weights in
 * place, bf16 ones widened in registers in every block (the tile is in L1 after the first; this
 * measured faster than widening it once into a buffer for the other blocks). */
static void column(float *out, const float *inp, const void *w, int from_bf16, const float *bias, int64_t N, int64_t C,
                   int64_t OC, int64_t o0, int nw) {
  const uint16_t *wb = from_bf16 ? (const uint16_t *)w + o0 * C : NULL;
  const float *wf = from_bf16 ? NULL : (const float *)w + o0 * C;
  const float *b = bias ? bias + o0 : NULL;
  if (N <= RB_MAX) { tile_any(out + o0, OC, inp, wb, wf, b, C, (int)N, nw, from_bf16); return; }
  for (int64_t n = 0; n < N; n += RB_MAX) {
    const int rb = N - n < RB_MAX ? (int)(N - n) : RB_MAX;
    /* a partial last block keeps the width of the full ones: tiles of one shape per pass */
    tile_any(out + n * OC + o0, OC, inp + n * C, wb, wf, b, C, rb, nw == 1 ? 1 : NW4, from_bf16);
  }
}

static void matmul_rows(float *out, const float *inp, const void *w, int from_bf16, const float *bias, int64_t N,
                        int64_t C, int64_t OC) {
  const int nw = N > RB_MAX ? NW4 : tile_width(N);
  const int64_t tiles = OC / nw;
  /* threads take contiguous runs of tiles: each streams its own part of W */
  #pragma omp parallel if (OC * C > 65536)
  {
    const int64_t T = omp_get_num_threads(), id = omp_get_thread_num();
    const int64_t t0 = tiles * id / T, t1 = tiles * (id + 1) / T;
    for (int64_t t = t0; t < t1; t++) column(out, inp, w, from_bf16, bias, N, C, OC, t * nw, nw);
  }
  for (int64_t o = tiles * nw; o < OC; o++) column(out, inp, w, from_bf16, bias, N, C, OC, o, 1);
}

int rx_cpu_matmul_rows_any_f32(float *out, const float *inp, const float *weight, const float *bias, int64_t N,
                               int64_t C, int64_t OC) {
  if (N > RX_BF16_FEW_ROWS || C == 0) return 0;
  matmul_rows(out, inp, weight, 0, bias, N, C, OC);
  return 1;
}

int rx_cpu_matmul_rows_forward_f32_bf16(float *out, const float *inp, const uint16_t *weight, const float *bias,
                                        int64_t N, int64_t C, int64_t OC) {
  if (N == 0 || OC == 0) return 1;
  if (C == 0) return rx_cpu_matmul_forward_f32_bf16(out, inp, weight, bias, N, C, OC);   /* the bias alone */
  const int dot = rx_cpu_matmul_rows_bf16dot(out, inp, weight, bias, N, C, OC);   /* any N, blocks of 48 */
  if (dot) return dot > 0;
  for (int64_t n0 = 0; n0 < N; n0 += RX_BF16_FEW_ROWS) {
    const int64_t n = N - n0 < RX_BF16_FEW_ROWS ? N - n0 : RX_BF16_FEW_ROWS;
    const float *x = round_inputs(inp + n0 * C, n, C);
    if (!x) return 0;
    matmul_rows(out + n0 * OC, x, weight, 1, bias, n, C, OC);
  }
  return 1;
}

/* ------------------------------------------------------------------ many rows */

/* Weight rows per widened block: about 4 MB of f32, at least 16 rows. */
static int64_t block_rows(int64_t C, int64_t OC) {
  int64_t rows = ((int64_t)1 << 20) / (C > 0 ? C : 1);
  rows = rows < 16 ? 16 : rows & ~(int64_t)15;
  return rows < OC ? rows : OC;
}

int rx_cpu_matmul_forward_f32_bf16(float *out, const float *inp, const uint16_t *weight, const float *bias, int64_t N,
                                   int64_t C, int64_t OC) {
  if (N == 0 || OC == 0) return 1;
  if (C == 0) {
    for (int64_t n = 0; n < N; n++)
      for (int64_t o = 0; o < OC; o++) out[n * OC + o] = bias ? bias[o] : 0.0f;
    return 1;
  }
  const int dot = N <= RX_BF16_DOT_ROWS ? rx_cpu_matmul_rows_bf16dot(out, inp, weight, bias, N, C, OC) : 0;
  if (dot) return dot > 0;
  inp = round_inputs(inp, N, C);
  if (!inp) return 0;
  if (N <= RX_BF16_FEW_ROWS) { matmul_rows(out, inp, weight, 1, bias, N, C, OC); return 1; }
  const int64_t OB = block_rows(C, OC);
  float *buf = scratch_get(&widened, (size_t)(OB * C));
  if (!buf) return 0;
  #pragma omp parallel for schedule(static) if (N * OC > 65536)
  for (int64_t n = 0; n < N; n++) {
    if (bias) memcpy(out + n * OC, bias, (size_t)OC * sizeof(float));
    else memset(out + n * OC, 0, (size_t)OC * sizeof(float));
  }
  for (int64_t o0 = 0; o0 < OC; o0 += OB) {
    const int64_t ob = OC - o0 < OB ? OC - o0 : OB;
    widen_rows(buf, weight + o0 * C, ob, C);
    rx_cpu_sgemm(0, 1, N, ob, C, inp, C, buf, C, 1.0f, out + o0, OC);
  }
  return 1;
}

int rx_cpu_matmul_dinp_f32_bf16(float *dinp, const float *dout, const uint16_t *weight, int64_t N, int64_t C,
                                int64_t OC) {
  if (N == 0 || C == 0) return 1;
  if (OC == 0) { memset(dinp, 0, (size_t)(N * C) * sizeof(float)); return 1; }
  const int64_t OB = block_rows(C, OC);
  float *buf = scratch_get(&widened, (size_t)(OB * C));
  if (!buf) return 0;
  for (int64_t o0 = 0; o0 < OC; o0 += OB) {
    const int64_t ob = OC - o0 < OB ? OC - o0 : OB;
    widen_rows(buf, weight + o0 * C, ob, C);
    rx_cpu_sgemm(0, 0, N, C, ob, dout + o0, OC, buf, C, o0 == 0 ? 0.0f : 1.0f, dinp, C);
  }
  return 1;
}

void rx_cpu_embedding_forward_f32_bf16(float *out, const int32_t *tokens, const uint16_t *weight, int64_t N, int64_t C) {
  #pragma omp parallel for schedule(static) if (N * C > 65536)
  for (int64_t n = 0; n < N; n++) widen_row(out + n * C, weight + (int64_t)tokens[n] * C, C);
}
