/* adamw.c: AdamW update, global gradient norm and clipping. Dispatch on device here; the CPU
 * loops are short enough to live beside it, the CUDA ones are in cuda/adamw.cu (f32 only there:
 * master weights, gradients and moments are f32 on the GPU). */
#include "internal.h"
#include "cuda/cuda.h"
#include <math.h>

static int check_float(const rx_tensor *t, const char *op, const char *what) {
  if (rx_check_tensor(t, op, what, -1)) return RX_EINVAL;
  if (t->dtype != RX_F32 && t->dtype != RX_F64)
    return rx_fail(RX_EINVAL, "%s: %s has dtype %s, expected f32 or f64", op, what, rx_dtype_name(t->dtype));
  if (t->device != RX_CPU && t->device != RX_CUDA)
    return rx_fail(RX_EDEVICE, "%s: no kernel for device %d in this build", op, t->device);
  if (t->device == RX_CUDA && t->dtype != RX_F32)
    return rx_fail(RX_EINVAL, "%s: %s has dtype %s on cuda, expected f32", op, what, rx_dtype_name(t->dtype));
  return RX_OK;
}

static int check_like(const rx_tensor *p, const rx_tensor *t, const char *what) {
  char a[96], b[96];
  if (check_float(t, "adamw", what)) return RX_EINVAL;
  if (t->numel != p->numel)
    return rx_fail(RX_EINVAL, "adamw: %s has shape %s, param has %s", what, rx_shape_str(t, a, sizeof a),
                   rx_shape_str(p, b, sizeof b));
  if (t->device != p->device)
    return rx_fail(RX_EINVAL, "adamw: %s is on device %d, param on %d", what, t->device, p->device);
  return RX_OK;
}

#define ADAMW_LOOP(P, G, M, V)                                                   \
  _Pragma("omp parallel for simd schedule(static) if (n > 32768)")               \
  for (int64_t i = 0; i < n; i++) {                                              \
    double g = G[i];                                                             \
    double m = beta1 * M[i] + (1 - beta1) * g, v = beta2 * V[i] + (1 - beta2) * g * g; \
    M[i] = m;                                                                    \
    V[i] = v;                                                                    \
    double p = P[i] * shrink;                                                    \
    P[i] = p - step_size * m / (sqrt(v) / sqrt_bc2 + eps);                       \
  }

int rx_adamw_step(rx_tensor *param, const rx_tensor *grad, rx_tensor *m, rx_tensor *v,
                  const rx_adamw_config *cfg, int32_t decay) {
  if (check_float(param, "adamw", "param") || check_like(param, grad, "grad") || check_like(param, m, "m") ||
      check_like(param, v, "v"))
    return RX_EINVAL;
  if (grad->dtype != param->dtype) return rx_fail(RX_EINVAL, "adamw: grad dtype %s differs from param dtype %s",
                                                  rx_dtype_name(grad->dtype), rx_dtype_name(param->dtype));
  if (m->dtype != v->dtype) return rx_fail(RX_EINVAL, "adamw: m and v differ in dtype");
  if (cfg->step < 1) return rx_fail(RX_EINVAL, "adamw: step %lld must be >= 1", (long long)cfg->step);
  if (!(cfg->beta1 >= 0 && cfg->beta1 < 1 && cfg->beta2 >= 0 && cfg->beta2 < 1))
    return rx_fail(RX_EINVAL, "adamw: betas (%g, %g) must lie in [0, 1)", cfg->beta1, cfg->beta2);
  const double beta1 = cfg->beta1, beta2 = cfg->beta2, eps = cfg->eps;
  const double bc1 = 1 - pow(beta1, (double)cfg->step), sqrt_bc2 = sqrt(1 - pow(beta2, (double)cfg->step));
  const double step_size = cfg->lr / bc1, shrink = decay ? 1 - cfg->lr * cfg->weight_decay : 1;
  const int64_t n = param->numel;
  const int prof = rx_prof_begin(RX_PROF_ADAMW);
  int rc = RX_OK;
  if (param->device == RX_CUDA) {
    rc = rx_cuda_adamw(param->data, grad->data, m->data, v->data, n, cfg->lr, beta1, beta2, eps, shrink, bc1, sqrt_bc2);
  } else if (param->dtype == RX_F32 && m->dtype == RX_F32) {
    float *P = param->data, *M = m->data, *V = v->data;
    const float *G = grad->data;
    ADAMW_LOOP(P, G, M, V)
  } else if (param->dtype == RX_F64 && m->dtype == RX_F64) {
    double *P = param->data, *M = m->data, *V = v->data;
    const double *G = grad->data;
    ADAMW_LOOP(P, G, M, V)
  } else if (param->dtype == RX_F64 && m->dtype == RX_F32) {
    double *P = param->data;
    float *M = m->data, *V = v->data;
    const double *G = grad->data;
    ADAMW_LOOP(P, G, M, V)
  } else {
    rc = rx_fail(RX_EINVAL, "adamw: moments of dtype %s for a param of dtype %s are not supported",
                 rx_dtype_name(m->dtype), rx_dtype_name(param->dtype));
  }
  rx_prof_end(prof);
  return rc;
}

static double sum_squares(const rx_tensor *t) {
  double s = 0;
  const int64_t n = t->numel;
  if (t->dtype == RX_F32) {
    const float *x = t->data;
    #pragma omp parallel for reduction(+ : s) schedule(static) if (n > 32768)
    for (int64_t i = 0; i < n; i++) s += (double)x[i] * x[i];
  } else {
    const double *x = t->data;
    #pragma omp parallel for reduction(+ : s) schedule(static) if (n > 32768)
    for (int64_t i = 0; i < n; i++) s += x[i] * x[i];
  }
  return s;
}

int rx_grad_norm(const rx_tensor *const *grads, int64_t n, double *norm) {
  double total = 0, *dev = NULL;
  for (int64_t i = 0; i < n; i++) {
    if (check_float(grads[i], "grad_norm", "gradient")) return rx_fail_context(RX_EINVAL, "gradient %lld", (long long)i);
    if (grads[i]->device == RX_CUDA) {   /* summed on the device, in order, read back once */
      int rc = dev ? RX_OK : rx_cuda_scalar(&dev);
      if (!rc) rc = rx_cuda_sum_squares(dev, grads[i]->data, grads[i]->numel);
      if (rc) return rx_fail_context(rc, "grad_norm: gradient %lld", (long long)i);
    } else {
      total += sum_squares(grads[i]);
    }
  }
  if (dev) {
    double d;
    int rc = rx_cuda_read_double(&d, dev);
    if (rc) return rc;
    total += d;
  }
  *norm = sqrt(total);
  return RX_OK;
}

int rx_scale(rx_tensor *t, double s) {
  if (check_float(t, "scale", "tensor")) return RX_EINVAL;
  const int64_t n = t->numel;
  if (t->device == RX_CUDA) return rx_cuda_scale(t->data, n, s);
  if (t->dtype == RX_F32) {
    float *x = t->data, f = (float)s;
    #pragma omp parallel for schedule(static) if (n > 32768)
    for (int64_t i = 0; i < n; i++) x[i] *= f;
  } else {
    double *x = t->data;
    #pragma omp parallel for schedule(static) if (n > 32768)
    for (int64_t i = 0; i < n; i++) x[i] *= s;
  }
  return RX_OK;
}

int rx_clip_grad_norm(rx_tensor *const *grads, int64_t n, double max_norm, double *norm) {
  if (!(max_norm > 0)) return rx_fail(RX_EINVAL, "clip_grad_norm: max_norm %g must be > 0", max_norm);
  int rc = rx_grad_norm((const rx_tensor *const *)grads, n, norm);
  if (rc) return rc;
  if (!isfinite(*norm) || *norm <= max_norm) return RX_OK;
  double s = max_norm / (*norm + 1e-6);
  for (int64_t i = 0; i < n; i++) rx_scale(grads[i], s);
  return RX_OK;
}
