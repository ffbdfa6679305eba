/* bf16_gemm.c: the three GEMMs of a linear layer whose weight is a bf16 copy (a bf16 model's
 * working weights, or a frozen model's bf16 storage) and whose activations are f32, on the CPU:
 *
 *   forward  out  = round(inp) W^T (+ bias)        [N, OC]
 *   dinp     dinp = dout W                          [N, C]
 *   dweight  dW  += dout^T inp   (into the f32 gradient of the f32 master weight)
 *
 * Two kernels, chosen once per process (rx_cpu_bf16_gemm_kind):
 *  - RX_BF16_GEMM_ONEDNN: oneDNN's bf16 matmul (dnnl.c): the f32 operands rounded to bf16 into
 *    the calling thread's buffers, f32 accumulation. The kernel PyTorch's CPU autocast runs.
 *  - RX_BF16_GEMM_SGEMM: OpenBLAS's sgemm, the bf16 weight widened to f32 in blocks
 *    (matmul_bf16.c) and the forward's inputs rounded, so that both kernels compute the forward
 *    of the same bf16 numbers; dout is not rounded, and dweight is the f32 GEMM of the f32
 *    operands (PyTorch rounds both to bf16 there; f32 is the more accurate and here the faster).
 * A few rows (decoding) always take the decode kernels of matmul_bf16.c.
 *
 * Which is faster depends on the CPU's bf16 rate, measured with bench/train_step_gemm.sh: on an
 * Intel Xeon with AVX-512 BF16 and no AMX, vdpbf16ps issues on one port where f32 FMAs issue on
 * two, so the bf16 dot product does the same multiply-adds per cycle as f32 and oneDNN's bf16
 * GEMMs ran at 0.65-0.89x sgemm (forward, dinp, dweight; docs/benchmarks.md). AMX tiles (Intel
 * Sapphire Rapids and later, when the OS grants them) and AMD Zen 4/5's vdpbf16ps (two 256-bit
 * halves at the f32 FMA's rate: twice the multiply-adds) are where bf16 GEMMs pay. So oneDNN is
 * chosen where oneDNN is built in and the CPU has AMX-BF16, or is an AMD CPU with AVX-512 BF16;
 * sgemm elsewhere. REMAX_BF16_GEMM=onednn|sgemm overrides the choice (tests run both). */
#include "core/options.h"
#include "cpu.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__)
#include <cpuid.h>
#endif

/* The CPU has AMX-BF16 (CPUID.(7,0):EDX[22]). */
static int cpu_amx_bf16(void) {
#if defined(__x86_64__)
  unsigned a, b, c, d;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return 0;
  return (d >> 22) & 1;
#else
  return 0;
#endif
}

static int cpu_avx512_bf16(void) {
#if defined(__x86_64__)
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512bf16");
#else
  return 0;
#endif
}

static int cpu_amd(void) {
#if defined(__x86_64__)
  __builtin_cpu_init();
  return __builtin_cpu_is("amd");
#else
  return 0;
#endif
}

static int kind = -1;   /* -1: not chosen yet */
static uint32_t chosen_at;   /* the options' generation it was chosen at (rx_set_option re-decides) */
static char why[200];

static int choose(void) {
  const char *opt = rx_option_value(RX_OPT_BF16_GEMM);   /* engine option bf16_gemm (or REMAX_BF16_GEMM) */
  const int dnnl = rx_cpu_dnnl();
  if (strcmp(opt, "auto") != 0) {
    if (strcmp(opt, "onednn") == 0 && dnnl) {
      snprintf(why, sizeof why, "bf16_gemm = onednn");
      return RX_BF16_GEMM_ONEDNN;
    }
    snprintf(why, sizeof why, "bf16_gemm = %s%s", opt,
             strcmp(opt, "onednn") == 0 ? ", but oneDNN cannot run here" : strcmp(opt, "sgemm") ? " (not auto|onednn|sgemm)" : "");
    return RX_BF16_GEMM_SGEMM;
  }
  if (!dnnl) {
    snprintf(why, sizeof why, "no oneDNN bf16 here: %s", rx_cpu_dnnl_kernel());
    return RX_BF16_GEMM_SGEMM;
  }
  if (cpu_amx_bf16()) {
    snprintf(why, sizeof why, "AMX-BF16");
    return RX_BF16_GEMM_ONEDNN;
  }
  if (cpu_avx512_bf16() && cpu_amd()) {
    snprintf(why, sizeof why, "AMD with AVX-512 BF16 (not measured here: bench/isa_rate.sh tells whether its vdpbf16ps outruns f32 FMAs)");
    return RX_BF16_GEMM_ONEDNN;
  }
  snprintf(why, sizeof why, "%s", cpu_avx512_bf16() ? "AVX-512 BF16 without AMX: bf16 GEMMs measured slower than sgemm"
                                                     : "no AVX-512 BF16 or AMX: oneDNN would emulate bf16");
  return RX_BF16_GEMM_SGEMM;
}

int rx_cpu_bf16_gemm_kind(void) {
  int k = __atomic_load_n(&kind, __ATOMIC_RELAXED);
  const uint32_t gen = rx_options_generation();
  if (k < 0 || __atomic_load_n(&chosen_at, __ATOMIC_RELAXED) != gen) {
    k = choose();
    __atomic_store_n(&chosen_at, gen, __ATOMIC_RELAXED);
    __atomic_store_n(&kind, k, __ATOMIC_RELAXED);
  }
  return k;
}

void rx_cpu_bf16_gemm_reset(void) { __atomic_store_n(&kind, -1, __ATOMIC_RELAXED); }

int rx_cpu_bf16_gemm_pays(void) {
  return rx_cpu_bf16_gemm_kind() == RX_BF16_GEMM_ONEDNN && (cpu_amx_bf16() || (cpu_avx512_bf16() && cpu_amd()));
}

const char *rx_cpu_bf16_gemm_text(void) {
  static char text[320];
  const int k = rx_cpu_bf16_gemm_kind();
  snprintf(text, sizeof text, "%s (%s)",
           k == RX_BF16_GEMM_ONEDNN ? "oneDNN bf16 matmul for the forward, dinp and dweight"
                                    : "OpenBLAS sgemm on widened bf16 weights (inputs rounded to bf16), f32 dweight",
           why);
  return text;
}

const char *rx_bf16_train_kernels(void) { return rx_cpu_bf16_gemm_text(); }
int rx_bf16_train_pays(void) { return rx_cpu_bf16_gemm_pays(); }

/* ------------------------------------------------------------------ oneDNN path */

static _Thread_local rx_cpu_scratch round_a, round_b;   /* the calling thread's, grown to the largest shape and kept */

/* x [rows, cols] rounded to bf16 (nearest even) into the buffer; NULL when out of memory. */
static const uint16_t *rounded(rx_cpu_scratch *b, const float *x, int64_t rows, int64_t cols) {
  const int64_t n = rows * cols;
  uint16_t *d = rx_cpu_scratch_get(b, (size_t)n * sizeof(uint16_t));
  if (!d) return NULL;
  #pragma omp parallel for simd schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; i++) d[i] = rx_cpu_f32_to_bf16(x[i]);
  return d;
}

static int onednn(int64_t N) { return N > RX_BF16_FEW_ROWS && rx_cpu_bf16_gemm_kind() == RX_BF16_GEMM_ONEDNN; }

int rx_cpu_bf16_gemm_forward(float *out, const float *inp, const uint16_t *weight, const float *bias, int64_t N,
                             int64_t C, int64_t OC) {
  if (!onednn(N) || C == 0 || OC == 0) return rx_cpu_matmul_forward_f32_bf16(out, inp, weight, bias, N, C, OC);
  const uint16_t *x = rounded(&round_a, inp, N, C);
  if (!x) return 0;
  if (bias) {
    #pragma omp parallel for schedule(static) if (N * OC > 65536)
    for (int64_t n = 0; n < N; n++) memcpy(out + n * OC, bias, (size_t)OC * sizeof(float));
  }
  /* out[N, OC] = x[N, C] W^T: W [OC, C] read as [C, OC] with strides {1, C} */
  return rx_cpu_dnnl_gemm_bf16(out, OC, x, (const int64_t[2]){C, 1}, weight, (const int64_t[2]){1, C}, N, OC, C,
                               bias != NULL);
}

int rx_cpu_bf16_gemm_dinp(float *dinp, const float *dout, const uint16_t *weight, int64_t N, int64_t C, int64_t OC) {
  if (!onednn(N) || C == 0 || OC == 0) return rx_cpu_matmul_dinp_f32_bf16(dinp, dout, weight, N, C, OC);
  const uint16_t *dy = rounded(&round_a, dout, N, OC);
  if (!dy) return 0;
  return rx_cpu_dnnl_gemm_bf16(dinp, C, dy, (const int64_t[2]){OC, 1}, weight, (const int64_t[2]){C, 1}, N, C, OC, 0);
}

int rx_cpu_bf16_gemm_dweight(float *dweight, const float *dout, const float *inp, int64_t N, int64_t C, int64_t OC) {
  if (N == 0 || C == 0 || OC == 0) return 1;
  if (!onednn(N)) {
    rx_cpu_sgemm(1, 0, OC, C, N, dout, OC, inp, C, 1.0f, dweight, C);
    return 1;
  }
  const uint16_t *dy = rounded(&round_a, dout, N, OC), *x = rounded(&round_b, inp, N, C);
  if (!dy || !x) return 0;
  /* dW[OC, C] += dout^T [OC, N] x [N, C]: dout [N, OC] read transposed with strides {1, OC} */
  return rx_cpu_dnnl_gemm_bf16(dweight, C, dy, (const int64_t[2]){1, OC}, x, (const int64_t[2]){C, 1}, OC, C, N, 1);
}
