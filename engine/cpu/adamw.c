/* adamw.c: the optimizer's element-wise CPU kernels (engine/ops/adamw.c dispatches to them):
 * AdamW over a tensor, the sum of squares of a gradient (in double), and scaling. Built with
 * -fno-math-errno (CMakeLists.txt): sqrt of the second moment, never negative, then vectorises. */
#include "cpu.h"

/* p = p * shrink - step_size * m_hat / (sqrt(v_hat) + eps), the moments updated first; the bias
 * corrections folded into step_size = lr / bc1 and sqrt_bc2. */
#define ADAMW_LOOP(P, G, M, V, MIRROR)                                           \
  _Pragma("omp parallel for simd schedule(static) if (n > 32768)")               \
  for (int64_t i = 0; i < n; i++) {                                              \
    double g = G[i];                                                             \
    double m = beta1 * M[i] + (1 - beta1) * g, v = beta2 * V[i] + (1 - beta2) * g * g; \
    M[i] = m;                                                                    \
    V[i] = v;                                                                    \
    double p = P[i] * shrink;                                                    \
    P[i] = p - step_size * m / (sqrt(v) / sqrt_bc2 + eps);                       \
    MIRROR;                                                                      \
  }

/* W, when not NULL, is the bf16 working copy of P: written in the same pass, rounded as
 * rx_tensor_copy rounds (nearest even). */
void rx_cpu_adamw_f32(float *P, const float *G, float *M, float *V, uint16_t *W, int64_t n, double step_size,
                      double beta1, double beta2, double eps, double shrink, double sqrt_bc2) {
  if (W) {
    ADAMW_LOOP(P, G, M, V, W[i] = rx_cpu_f32_to_bf16(P[i]))
  } else {
    ADAMW_LOOP(P, G, M, V, (void)0)
  }
}

void rx_cpu_adamw_f64(double *P, const double *G, double *M, double *V, int64_t n, double step_size, double beta1,
                      double beta2, double eps, double shrink, double sqrt_bc2) {
  ADAMW_LOOP(P, G, M, V, (void)0)
}

void rx_cpu_adamw_f64_m32(double *P, const double *G, float *M, float *V, int64_t n, double step_size, double beta1,
                          double beta2, double eps, double shrink, double sqrt_bc2) {
  ADAMW_LOOP(P, G, M, V, (void)0)
}

/* Sums of squares in double, the same bits for any thread count: fixed chunks of 65536 elements,
 * each summed by one thread, the chunks' sums added in order afterwards (an OpenMP reduction would
 * add one partial sum per thread, so the order would follow the thread count). Up to
 * SUMSQ_PARTS chunks at once (16 M elements); longer vectors in rounds of those. */
enum { SUMSQ_CHUNK = 1 << 16, SUMSQ_PARTS = 256 };
#define SUM_SQUARES(x, n)                                                                  \
  double total = 0, part[SUMSQ_PARTS];                                                     \
  for (int64_t r0 = 0; r0 < n; r0 += (int64_t)SUMSQ_CHUNK * SUMSQ_PARTS) {                 \
    const int64_t left = n - r0, chunks = (left + SUMSQ_CHUNK - 1) / SUMSQ_CHUNK;          \
    const int64_t k = chunks < SUMSQ_PARTS ? chunks : SUMSQ_PARTS;                         \
    _Pragma("omp parallel for schedule(static) if (left > 32768)")                        \
    for (int64_t c = 0; c < k; c++) {                                                      \
      const int64_t a = r0 + c * SUMSQ_CHUNK, b = a + SUMSQ_CHUNK < n ? a + SUMSQ_CHUNK : n; \
      double s = 0;                                                                        \
      _Pragma("omp simd reduction(+ : s)")                                                \
      for (int64_t i = a; i < b; i++) s += (double)x[i] * x[i];                            \
      part[c] = s;                                                                         \
    }                                                                                      \
    for (int64_t c = 0; c < k; c++) total += part[c];                                      \
  }                                                                                        \
  return total;

double rx_cpu_sum_squares_f32(const float *x, int64_t n) { SUM_SQUARES(x, n) }

double rx_cpu_sum_squares_f64(const double *x, int64_t n) { SUM_SQUARES(x, n) }

void rx_cpu_scale_f32(float *x, int64_t n, float s) {
  #pragma omp parallel for schedule(static) if (n > 32768)
  for (int64_t i = 0; i < n; i++) x[i] *= s;
}

void rx_cpu_scale_f64(double *x, int64_t n, double s) {
  #pragma omp parallel for schedule(static) if (n > 32768)
  for (int64_t i = 0; i < n; i++) x[i] *= s;
}
