/* adamw.c: AdamW update, global gradient norm and clipping: the argument checks and the
 * arithmetic of the step (bias corrections, decay, clip factor); the element-wise work goes
 * through ops (ops/adamw.c: cpu/adamw.c, cuda/adamw.cu, f32 only there: master weights, gradients
 * and moments are f32 on the GPU). */
#include "internal.h"
#include "ops/engine_ops.h"
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
  const double shrink = decay ? 1 - cfg->lr * cfg->weight_decay : 1;
  /* A bf16 model's masters: their working copy is rounded in the same pass and stays current;
   * any other param the optimizer writes may be masters in part, which makes their copy stale. */
  void *work = rx_mirror_of(param);
  if (!work) rx_note_write(param);
  const int prof = rx_prof_begin(RX_PROF_ADAMW);
  const int rc = rx_adamw_update(param, grad, m, v, work, cfg->lr, beta1, beta2, eps, shrink, bc1, sqrt_bc2);
  rx_prof_end(prof);
  return rc;
}

int rx_grad_norm(const rx_tensor *const *grads, int64_t n, double *norm) {
  double total = 0;
  for (int64_t i = 0; i < n; i++)
    if (check_float(grads[i], "grad_norm", "gradient")) return rx_fail_context(RX_EINVAL, "gradient %lld", (long long)i);
  int rc = rx_sum_squares(grads, n, &total);
  if (rc) return rx_fail_context(rc, "grad_norm");
  *norm = sqrt(total);
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
