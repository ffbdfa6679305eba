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
 * The tiling, prefetching and threading are matmul_rows.inc's, shared with the f32 kernel
 * (matmul_rows.c): one accumulator of 16 lanes per (row, output) summed over k in steps of 32
 * (the tail loaded with a zero mask) and reduced in a fixed order, so a row's outputs do not
 * depend on the rows beside it or the thread count.
 *
 * Compiled for AVX-512 BF16 with a target pragma whatever the build's -march, and used only where
 * the CPU reports the instruction (rx_cpu_bf16_dot): one binary runs everywhere. */
#include "core/options.h"
#include "cpu.h"
#include <stdio.h>
#include <stdlib.h>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 10
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")
#include <immintrin.h>

#define ROWS_W uint16_t
#define ROWS_X uint16_t
#define ROWS_VW __m512bh
#define ROWS_VX __m512bh
#define ROWS_STEP 32
#define ROWS_KC 2048
#define ROWS_MASK_T __mmask32
#define ROWS_LOAD_W(p) ((__m512bh)_mm512_loadu_si512(p))
#define ROWS_LOAD_W_TAIL(m, p) ((__m512bh)_mm512_maskz_loadu_epi16(m, p))
#define ROWS_LOAD_X(p) ((__m512bh)_mm512_load_si512(p))
#define ROWS_LOAD_X_TAIL(m, p) ((__m512bh)_mm512_load_si512(p))   /* x's padding is zero */
#define ROWS_MAC(acc, x, w) _mm512_dpbf16_ps(acc, x, w)
#include "matmul_rows.inc"

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

#pragma GCC pop_options

static _Thread_local rx_cpu_scratch xbuf;   /* the inputs rounded to bf16, rows ldx apart */

int rx_cpu_matmul_rows_bf16dot(float *out, const float *inp, const uint16_t *weight, const float *bias, int64_t N,
                               int64_t C, int64_t OC) {
  if (N == 0 || C == 0 || !rx_cpu_bf16_dot()) return 0;
  const int64_t ldx = (C + 31) / 32 * 32;
  uint16_t *x = rx_cpu_scratch_get(&xbuf, (size_t)(N * ldx) * sizeof(uint16_t));
  if (!x) return -1;
  round_rows(x, ldx, inp, N, C);
  /* more rows (a prefill) in blocks of ROWS_MAX_ROWS, each a pass over W: 96 flops per weight
   * read keep the pass bound by the dot products, not by reading W from the caches or memory */
  for (int64_t n0 = 0; n0 < N; n0 += ROWS_MAX_ROWS) {
    const int64_t n = N - n0 < ROWS_MAX_ROWS ? N - n0 : ROWS_MAX_ROWS;
    rows_matmul(out + n0 * OC, x + n0 * ldx, ldx, weight, bias, n, C, OC);
  }
  return 1;
}

static int detect(void) {
  if (!rx_option_on(RX_OPT_BF16_DOT)) return 0;   /* engine option bf16_dot (REMAX_NO_BF16_DOT=1: off) */
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
static uint32_t detected_at;  /* the options' generation it was decided at */

int rx_cpu_bf16_dot(void) {
  int on = __atomic_load_n(&bf16_dot, __ATOMIC_RELAXED);
  const uint32_t gen = rx_options_generation();
  if (on < 0 || __atomic_load_n(&detected_at, __ATOMIC_RELAXED) != gen) {
    on = detect();
    __atomic_store_n(&detected_at, gen, __ATOMIC_RELAXED);
    __atomic_store_n(&bf16_dot, on, __ATOMIC_RELAXED);
  }
  return on;
}

void rx_cpu_bf16_dot_set(int on) { __atomic_store_n(&bf16_dot, on ? detect() : 0, __ATOMIC_RELAXED); }

/* Why the decode kernel does not run here. */
static const char *no_dot(void) {
  if (!rx_option_on(RX_OPT_BF16_DOT)) return "none: bf16_dot = off (bf16 weights are widened to f32)";
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 10
  return "none: this CPU has no AVX-512 BF16 (bf16 weights are widened to f32)";
#else
  return "none: built without the AVX-512 BF16 kernels (GCC 10+ on x86-64; bf16 weights are widened to f32)";
#endif
}

const char *rx_bf16_kernels(void) {
  static char text[320];
  snprintf(text, sizeof text, "%s; %s%s", rx_cpu_bf16_dot() ? "vdpbf16ps (AVX-512 BF16) for bf16 weights' matmuls" : no_dot(),
           rx_cpu_dnnl_kernel(), rx_cpu_dnnl() ? " (bf16 GEMMs built in)" : "");
  return text;
}
