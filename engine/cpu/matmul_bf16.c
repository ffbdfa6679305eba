/* matmul_bf16.c: linear layers and embeddings whose weights are stored in bf16, computed in f32.
 *
 * A frozen model (the KL reference, a model that only generates or evaluates) keeps its weight
 * matrices in bf16: half the bytes of f32, and decoding is bound by reading those bytes. Every
 * product is exact in f32 (a bf16 value is an f32 with the low 16 bits zero: widening is a
 * shift), and sums are f32, so the result is the f32 layer applied to the bf16-rounded weights;
 * for a checkpoint stored in bf16 (as the hub ships them) nothing is lost at all.
 *
 *  - A few rows (decoding, N <= RX_BF16_FEW_ROWS): a register tile of RB input rows x NW weight
 *    rows. With at most RB rows the weights are widened in registers as they stream in; with
 *    more, each tile of NW weight rows is widened once into a per-thread buffer (it stays in L2)
 *    and every block of RB rows reads it from there. Every output is one accumulator vector over
 *    k, reduced in a fixed order, plus a scalar tail: the same bits whatever the tile, block or
 *    thread count.
 *  - Many rows (prefill, training forwards of a frozen model): blocks of weight rows are widened
 *    into an f32 buffer and multiplied by OpenBLAS's sgemm; the widening costs OC*C per call
 *    against 2*N*OC*C flops. dinp = dout W (backward through a frozen weight, e.g. LoRA on a bf16
 *    base) walks the same blocks.
 * The buffers are the calling thread's, grown to the largest shape seen and kept (allocated
 * once per shape, not per call). */
#include "cpu.h"
#include <cblas.h>
#include <omp.h>
#include <stdlib.h>

#if defined(__AVX512F__)
#include <immintrin.h>
typedef __m512 vf;
enum { VW = 16, RB = 4, NW = 6 };
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
enum { VW = 8, RB = 4, NW = 3 };   /* 12 accumulators + 3 weight vectors + 1 input vector = 16 ymm */
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
enum { VW = 1, RB = 2, NW = 4 };
static inline vf vzero(void) { return 0.0f; }
static inline vf vload(const float *p) { return *p; }
static inline vf vload_bf16(const uint16_t *p) { return rx_cpu_bf16_to_f32(*p); }
static inline vf vfma(vf a, vf b, vf c) { return a * b + c; }
static inline float vsum(vf v) { return v; }
#endif

/* ------------------------------------------------------------------ scratch */

static _Thread_local float *scratch;
static _Thread_local size_t scratch_floats;

/* The calling thread's buffer of at least n floats (NULL when out of memory). */
static float *scratch_get(size_t n) {
  if (n <= scratch_floats) return scratch;
  float *p = NULL;
  if (posix_memalign((void **)&p, 64, n * sizeof(float))) return NULL;
  free(scratch);
  scratch = p;
  scratch_floats = n;
  return p;
}

/* dst[r*C + k] = widened src rows [0, rows), in parallel when large. */
static void widen_rows(float *dst, const uint16_t *src, int64_t rows, int64_t C, int parallel) {
  #pragma omp parallel for schedule(static) if (parallel && rows * C > 65536)
  for (int64_t r = 0; r < rows; r++) {
    const uint16_t *s = src + r * C;
    float *d = dst + r * C;
    #pragma omp simd
    for (int64_t k = 0; k < C; k++) d[k] = rx_cpu_bf16_to_f32(s[k]);
  }
}

/* ------------------------------------------------------------------ a few rows */

/* Rows [0, rb) of x against weight rows [0, nw): from bf16 (wb, widened in registers) or from
 * widened f32 rows (wf). y[i*ldy + j] = dot + bias[j]. */
static inline __attribute__((always_inline)) void tile(float *restrict y, int64_t ldy, const float *restrict x,
                                                        const uint16_t *restrict wb, const float *restrict wf,
                                                        const float *bias, int64_t C, int rb, int nw) {
  vf acc[RB][NW];
  for (int i = 0; i < rb; i++)
    for (int j = 0; j < nw; j++) acc[i][j] = vzero();
  const int64_t Cv = C - C % VW;
  for (int64_t k = 0; k < Cv; k += VW) {
    vf w[NW];
    for (int j = 0; j < nw; j++) w[j] = wb ? vload_bf16(wb + j * C + k) : vload(wf + j * C + k);
    for (int i = 0; i < rb; i++) {
      const vf xv = vload(x + i * C + k);
      for (int j = 0; j < nw; j++) acc[i][j] = vfma(xv, w[j], acc[i][j]);
    }
  }
  for (int i = 0; i < rb; i++)
    for (int j = 0; j < nw; j++) {
      float s = vsum(acc[i][j]);
      for (int64_t k = Cv; k < C; k++) {
        const float wk = wb ? rx_cpu_bf16_to_f32(wb[j * C + k]) : wf[j * C + k];
        s += x[i * C + k] * wk;
      }
      y[i * ldy + j] = bias ? s + bias[j] : s;
    }
}

/* The switch gives each (rows, width) its own unrolled copy of tile: rb and nw are constants. */
#define TILE_ROWS(R, W) case R: tile(y, ldy, x, wb, wf, bias, C, R, W); break;
static inline __attribute__((always_inline)) void tile_w(float *y, int64_t ldy, const float *x, const uint16_t *wb,
                                                          const float *wf, const float *bias, int64_t C, int rb,
                                                          int nw) {
  if (nw == NW) {
    switch (rb) { TILE_ROWS(1, NW) TILE_ROWS(2, NW) TILE_ROWS(3, NW) TILE_ROWS(4, NW) default: break; }
  } else {
    switch (rb) { TILE_ROWS(1, 1) TILE_ROWS(2, 1) TILE_ROWS(3, 1) TILE_ROWS(4, 1) default: break; }
  }
}
#undef TILE_ROWS

/* Weight rows [o0, o0 + nw) against every input row. */
static void column(float *out, const float *inp, const uint16_t *w, const float *bias, float *buf, int64_t N, int64_t C,
                   int64_t OC, int64_t o0, int nw) {
  const uint16_t *wb = w + o0 * C;
  const float *b = bias ? bias + o0 : NULL;
  if (N <= RB) { tile_w(out + o0, OC, inp, wb, NULL, b, C, (int)N, nw); return; }
  widen_rows(buf, wb, nw, C, 0);
  for (int64_t n = 0; n < N; n += RB) {
    const int rb = N - n < RB ? (int)(N - n) : RB;
    tile_w(out + n * OC + o0, OC, inp + n * C, NULL, buf, b, C, rb, nw);
  }
}

static int matmul_rows(float *out, const float *inp, const uint16_t *w, const float *bias, int64_t N, int64_t C,
                       int64_t OC) {
  const int64_t tiles = OC / NW;
  const int nt = OC * C > 65536 ? omp_get_max_threads() : 1;
  float *buf = N > RB ? scratch_get((size_t)nt * NW * (size_t)C) : NULL;
  if (N > RB && !buf) return 0;
  /* threads take contiguous runs of tiles: each streams its own part of W */
  #pragma omp parallel num_threads(nt) if (nt > 1)
  {
    const int64_t T = omp_get_num_threads(), id = omp_get_thread_num();
    float *mine = buf ? buf + id * NW * C : NULL;
    const int64_t t0 = tiles * id / T, t1 = tiles * (id + 1) / T;
    for (int64_t t = t0; t < t1; t++) column(out, inp, w, bias, mine, N, C, OC, t * NW, NW);
  }
  for (int64_t o = tiles * NW; o < OC; o++) column(out, inp, w, bias, buf, N, C, OC, o, 1);
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
  if (N <= RX_BF16_FEW_ROWS) return matmul_rows(out, inp, weight, bias, N, C, OC);
  const int64_t OB = block_rows(C, OC);
  float *buf = scratch_get((size_t)(OB * C));
  if (!buf) return 0;
  #pragma omp parallel for schedule(static) if (N * OC > 65536)
  for (int64_t n = 0; n < N; n++) {
    if (bias) memcpy(out + n * OC, bias, (size_t)OC * sizeof(float));
    else memset(out + n * OC, 0, (size_t)OC * sizeof(float));
  }
  for (int64_t o0 = 0; o0 < OC; o0 += OB) {
    const int64_t ob = OC - o0 < OB ? OC - o0 : OB;
    widen_rows(buf, weight + o0 * C, ob, C, 1);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)N, (int)ob, (int)C, 1.0f, inp, (int)C, buf, (int)C, 1.0f,
                out + o0, (int)OC);
  }
  return 1;
}

int rx_cpu_matmul_dinp_f32_bf16(float *dinp, const float *dout, const uint16_t *weight, int64_t N, int64_t C,
                                int64_t OC) {
  if (N == 0 || C == 0) return 1;
  if (OC == 0) { memset(dinp, 0, (size_t)(N * C) * sizeof(float)); return 1; }
  const int64_t OB = block_rows(C, OC);
  float *buf = scratch_get((size_t)(OB * C));
  if (!buf) return 0;
  for (int64_t o0 = 0; o0 < OC; o0 += OB) {
    const int64_t ob = OC - o0 < OB ? OC - o0 : OB;
    widen_rows(buf, weight + o0 * C, ob, C, 1);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)N, (int)C, (int)ob, 1.0f, dout + o0, (int)OC, buf,
                (int)C, o0 == 0 ? 0.0f : 1.0f, dinp, (int)C);
  }
  return 1;
}

void rx_cpu_embedding_forward_f32_bf16(float *out, const int32_t *tokens, const uint16_t *weight, int64_t N, int64_t C) {
  #pragma omp parallel for schedule(static) if (N * C > 65536)
  for (int64_t n = 0; n < N; n++) {
    const uint16_t *s = weight + (int64_t)tokens[n] * C;
    float *d = out + n * C;
    #pragma omp simd
    for (int64_t k = 0; k < C; k++) d[k] = rx_cpu_bf16_to_f32(s[k]);
  }
}
