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

double rx_cpu_sum_squares_f32(const float *x, int64_t n) {
  double s = 0;
  #pragma omp parallel for reduction(+ : s) schedule(static) if (n > 32768)
  for (int64_t i = 0; i < n; i++) s += (double)x[i] * x[i];
  return s;
}

double rx_cpu_sum_squares_f64(const double *x, int64_t n) {
  double s = 0;
  #pragma omp parallel for reduction(+ : s) schedule(static) if (n > 32768)
  for (int64_t i = 0; i < n; i++) s += x[i] * x[i];
  return s;
}

void rx_cpu_scale_f32(float *x, int64_t n, float s) {
  #pragma omp parallel for schedule(static) if (n > 32768)
  for (int64_t i = 0; i < n; i++) x[i] *= s;
}

void rx_cpu_scale_f64(double *x, int64_t n, double s) {
  #pragma omp parallel for schedule(static) if (n > 32768)
  for (int64_t i = 0; i < n; i++) x[i] *= s;
}
