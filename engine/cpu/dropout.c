/* dropout.c: LoRA's dropout on the CPU (engine/ops/dropout.c dispatches here): f = u >= p ?
 * 1/(1-p) : 0 per element, xd = x * f, dy *= f when dy is given. u may be xd (the draws made in
 * place). f32 keeps the factor in f32, f64 in f64. */
#include "cpu.h"

void rx_cpu_dropout_f32(float *xd, const float *x, const float *u, int64_t n, double p, float *dy) {
  const float k = (float)(1.0 / (1.0 - p));
  for (int64_t i = 0; i < n; i++) {
    const float f = u[i] >= p ? k : 0.0f;
    if (dy) dy[i] *= f;
    xd[i] = x[i] * f;
  }
}

void rx_cpu_dropout_f64(double *xd, const double *x, const double *u, int64_t n, double p, double *dy) {
  const double k = 1.0 / (1.0 - p);
  for (int64_t i = 0; i < n; i++) {
    const double f = u[i] >= p ? k : 0.0;
    if (dy) dy[i] *= f;
    xd[i] = x[i] * f;
  }
}
