/* zero.c: what ZeRO-2 adds to the optimizer (lua/remax/bind/optim.lua's zero_adamw): the sum of
 * squares of this rank's gradient shard, which the ranks add (rx_dist_allreduce_f64) into the
 * global gradient norm that clipping and the metrics use. rx_grad_norm (adamw.c) is the same
 * sum over whole gradients, square-rooted; both reach the kernels through the sum_squares op. */
#include "internal.h"
#include "ops/engine_ops.h"

int rx_grad_sum_squares(const rx_tensor *const *grads, int64_t n, double *out) {
  if (!out || n < 0 || (n > 0 && !grads)) return rx_fail(RX_EINVAL, "grad_sum_squares: bad arguments");
  for (int64_t i = 0; i < n; i++) {
    const rx_tensor *t = grads[i];
    if (rx_check_tensor(t, "grad_sum_squares", "gradient", -1)) return rx_fail_context(RX_EINVAL, "gradient %lld", (long long)i);
    if (t->dtype != RX_F32 && t->dtype != RX_F64)
      return rx_fail(RX_EINVAL, "grad_sum_squares: gradient %lld has dtype %s, expected f32 or f64", (long long)i,
                     rx_dtype_name(t->dtype));
  }
  int rc = rx_sum_squares(grads, n, out);
  return rc ? rx_fail_context(rc, "grad_sum_squares") : RX_OK;
}
