/* adamw.c: the optimizer's element-wise ops (AdamW, sums of squares, scaling): one switch on the
 * device each. The argument checks of the public entries live in engine/optim/adamw.c. */
#include "ops.h"
#include "ops/engine_ops.h"
#include "cpu/cpu.h"

int rx_adamw_update(rx_tensor *param, const rx_tensor *grad, rx_tensor *m, rx_tensor *v, void *work, double lr,
                    double beta1, double beta2, double eps, double shrink, double bc1, double sqrt_bc2) {
  const int64_t n = param->numel;
  if (work && (param->dtype != RX_F32 || m->dtype != RX_F32))
    return rx_fail(RX_EINVAL, "adamw: a bf16 working copy needs f32 params and moments, got %s and %s",
                   rx_dtype_name(param->dtype), rx_dtype_name(m->dtype));
  switch (param->device) {
    case RX_CPU:
      if (param->dtype == RX_F32 && m->dtype == RX_F32)
        rx_cpu_adamw_f32(param->data, grad->data, m->data, v->data, work, n, lr / bc1, beta1, beta2, eps, shrink,
                         sqrt_bc2);
      else if (param->dtype == RX_F64 && m->dtype == RX_F64)
        rx_cpu_adamw_f64(param->data, grad->data, m->data, v->data, n, lr / bc1, beta1, beta2, eps, shrink, sqrt_bc2);
      else if (param->dtype == RX_F64 && m->dtype == RX_F32)
        rx_cpu_adamw_f64_m32(param->data, grad->data, m->data, v->data, n, lr / bc1, beta1, beta2, eps, shrink,
                             sqrt_bc2);
      else
        return rx_fail(RX_EINVAL, "adamw: moments of dtype %s for a param of dtype %s are not supported",
                       rx_dtype_name(m->dtype), rx_dtype_name(param->dtype));
      return RX_OK;
    case RX_CUDA:
      if (param->dtype != RX_F32 || m->dtype != RX_F32)
        return rx_fail(RX_EINVAL, "adamw: cuda keeps params and moments in f32, got param %s, moments %s",
                       rx_dtype_name(param->dtype), rx_dtype_name(m->dtype));
      return rx_cuda_adamw(param->data, grad->data, m->data, v->data, work, n, lr, beta1, beta2, eps, shrink, bc1,
                           sqrt_bc2);
    default:
      return rx_op_no_kernel("adamw", param);
  }
}

int rx_sum_squares(const rx_tensor *const *xs, int64_t n, double *total) {
  double host = 0, *dev = NULL;
  for (int64_t i = 0; i < n; i++) {
    const rx_tensor *t = xs[i];
    switch (t->device) {
      case RX_CPU:
        if (t->dtype == RX_F32) host += rx_cpu_sum_squares_f32(t->data, t->numel);
        else if (t->dtype == RX_F64) host += rx_cpu_sum_squares_f64(t->data, t->numel);
        else return rx_op_no_dtype("sum_squares", t);
        break;
      case RX_CUDA: {   /* summed on the device, in order, read back once */
        if (t->dtype != RX_F32) return rx_fail(RX_EINVAL, "sum_squares: no cuda kernel for dtype %s (f32 only)",
                                               rx_dtype_name(t->dtype));
        int rc = dev ? RX_OK : rx_cuda_scalar(&dev);
        if (!rc) rc = rx_cuda_sum_squares(dev, t->data, t->numel);
        if (rc) return rx_fail_context(rc, "sum_squares: tensor %lld", (long long)i);
        break;
      }
      default:
        return rx_op_no_kernel("sum_squares", t);
    }
  }
  if (dev) {
    double d;
    int rc = rx_cuda_read_double(&d, dev);
    if (rc) return rc;
    host += d;
  }
  *total = host;
  return RX_OK;
}

int rx_scale(rx_tensor *t, double s) {
  if (rx_op_float(t, "scale", "tensor")) return RX_EINVAL;
  rx_note_write(t);
  switch (t->device) {
    case RX_CPU:
      if (t->dtype == RX_F32) rx_cpu_scale_f32(t->data, t->numel, (float)s);
      else if (t->dtype == RX_F64) rx_cpu_scale_f64(t->data, t->numel, s);
      else return rx_op_no_dtype("scale", t);
      return RX_OK;
    case RX_CUDA:
      if (t->dtype != RX_F32 && t->dtype != RX_BF16)
        return rx_fail(RX_EINVAL, "scale: no cuda kernel for dtype %s (f32, bf16)", rx_dtype_name(t->dtype));
      return rx_cuda_scale(t->data, t->numel, s, t->dtype);
    default:
      return rx_op_no_kernel("scale", t);
  }
}
