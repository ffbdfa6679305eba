/* rope.c: rotary position embedding, Hugging Face rotate-half form; argument checks, then one
 * switch on the device. */
#include "ops.h"
#include "cpu/cpu.h"
#include <math.h>
#include <stdio.h>

/* x [.., H, D] with positions i32 of numel P = numel / (H D); out (or dinp) shaped like x. */
static int check_args(const char *op, const rx_tensor *y, const char *yname, const rx_tensor *x, const char *xname,
                      const rx_tensor *positions, double theta, int64_t *P, int64_t *H, int64_t *D) {
  char why[160], s[96];
  if (rx_op_float(x, op, xname)) return RX_EINVAL;
  rx_shape_str(x, s, sizeof s);
  if (x->ndim < 2) return rx_fail(RX_EINVAL, "%s: %s has shape %s, expected [..,heads,head_dim]", op, xname, s);
  *D = x->shape[x->ndim - 1];
  *H = x->shape[x->ndim - 2];
  *P = 1;
  for (int i = 0; i + 2 < x->ndim; i++) *P *= x->shape[i];
  if (*D % 2 != 0 || *D > RX_CPU_ROPE_MAX_D)
    return rx_fail(RX_EINVAL, "%s: head_dim %lld of %s %s must be even and at most %d", op, (long long)*D, xname, s,
                   RX_CPU_ROPE_MAX_D);
  snprintf(why, sizeof why, "one per row of heads of %s %s", xname, s);
  if (rx_op_index(positions, x, *P, op, "positions", why)) return RX_EINVAL;
  snprintf(why, sizeof why, "shape of %s %s", xname, s);
  if (y && (rx_op_like(y, x, op, yname, xname) || rx_op_rows_cols(y, rx_rows(x), *D, op, yname, why))) return RX_EINVAL;
  if (!(theta > 0) || !isfinite(theta)) return rx_fail(RX_EINVAL, "%s: theta %g must be finite and > 0", op, theta);
  return RX_OK;
}

int rx_rope_forward(rx_tensor *out, const rx_tensor *inp, const rx_tensor *positions, double theta) {
  const char *op = "rope";
  int64_t P, H, D;
  if (!out) return rx_fail(RX_EINVAL, "%s: out is missing", op);
  if (check_args(op, out, "out", inp, "inp", positions, theta, &P, &H, &D)) return RX_EINVAL;
  switch (inp->device) {
    case RX_CPU:
      if (inp->dtype == RX_F32) rx_cpu_rope_forward_f32(out->data, inp->data, positions->data, P, H, D, theta);
      else if (inp->dtype == RX_F64) rx_cpu_rope_forward_f64(out->data, inp->data, positions->data, P, H, D, theta);
      else return rx_op_no_dtype(op, inp);
      return RX_OK;
    case RX_CUDA:
      return rx_cuda_rope_forward(out->data, inp->data, positions->data, P, H, D, theta, inp->dtype);
    default:
      return rx_op_no_kernel(op, inp);
  }
}

int rx_rope_backward(rx_tensor *dinp, const rx_tensor *dout, const rx_tensor *positions, double theta) {
  const char *op = "rope_backward";
  int64_t P, H, D;
  if (check_args(op, dinp, "dinp", dout, "dout", positions, theta, &P, &H, &D)) return RX_EINVAL;
  if (!dinp) return RX_OK;
  switch (dout->device) {
    case RX_CPU:
      if (dout->dtype == RX_F32) rx_cpu_rope_backward_f32(dinp->data, dout->data, positions->data, P, H, D, theta);
      else if (dout->dtype == RX_F64) rx_cpu_rope_backward_f64(dinp->data, dout->data, positions->data, P, H, D, theta);
      else return rx_op_no_dtype(op, dout);
      return RX_OK;
    case RX_CUDA:
      return rx_cuda_rope_backward(dinp->data, dout->data, positions->data, P, H, D, theta, dout->dtype);
    default:
      return rx_op_no_kernel(op, dout);
  }
}
