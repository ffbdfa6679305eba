/* zero.c: what ZeRO-2 adds to the optimizer (lua/remax/optim.lua's zero_adamw): the sum of
 * squares of this rank's gradient shard, which the ranks add (rx_dist_allreduce_f64) into the
 * global gradient norm that clipping and the metrics use. rx_grad_norm (adamw.c) is the same
 * sum over whole gradients, square-rooted. */
#include "internal.h"
#include "cuda/cuda.h"

int rx_grad_sum_squares(const rx_tensor *const *grads, int64_t n, double *out) {
  if (!out || n < 0 || (n > 0 && !grads)) return rx_fail(RX_EINVAL, "grad_sum_squares: bad arguments");
  double total = 0, *dev = NULL;
  for (int64_t i = 0; i < n; i++) {
    const rx_tensor *t = grads[i];
    if (rx_check_tensor(t, "grad_sum_squares", "gradient", -1)) return rx_fail_context(RX_EINVAL, "gradient %lld", (long long)i);
    if (t->device == RX_CUDA) {   /* summed on the device, in order, read back once */
      if (t->dtype != RX_F32) return rx_fail(RX_EINVAL, "grad_sum_squares: gradient %lld is %s on cuda (f32 only)", (long long)i, rx_dtype_name(t->dtype));
      int rc = dev ? RX_OK : rx_cuda_scalar(&dev);
      if (!rc) rc = rx_cuda_sum_squares(dev, t->data, t->numel);
      if (rc) return rx_fail_context(rc, "grad_sum_squares: gradient %lld", (long long)i);
      continue;
    }
    if (t->device != RX_CPU) return rx_fail(RX_EDEVICE, "grad_sum_squares: gradient %lld on unknown device %d", (long long)i, t->device);
    double s = 0;
    const int64_t len = t->numel;
    if (t->dtype == RX_F32) {
      const float *x = t->data;
      #pragma omp parallel for reduction(+ : s) schedule(static) if (len > 32768)
      for (int64_t k = 0; k < len; k++) s += (double)x[k] * x[k];
    } else if (t->dtype == RX_F64) {
      const double *x = t->data;
      #pragma omp parallel for reduction(+ : s) schedule(static) if (len > 32768)
      for (int64_t k = 0; k < len; k++) s += x[k] * x[k];
    } else {
      return rx_fail(RX_EINVAL, "grad_sum_squares: gradient %lld has dtype %s, expected f32 or f64", (long long)i, rx_dtype_name(t->dtype));
    }
    total += s;
  }
  if (dev) {
    double d;
    int rc = rx_cuda_read_double(&d, dev);
    if (rc) return rc;
    total += d;
  }
  *out = total;
  return RX_OK;
}
