/* dropout.c: LoRA's dropout on a chunk of rows, given the uniform draws: f = u >= p ? 1/(1-p) : 0,
 * xd = x * f and, in the backward, dy *= f. One switch on the device. */
#include "ops.h"
#include "ops/engine_ops.h"
#include "cpu/cpu.h"

int rx_dropout_apply(rx_tensor *xd, const rx_tensor *x, const rx_tensor *u, double p, rx_tensor *dy) {
  const char *op = "dropout";
  if (rx_op_float(x, op, "x") || rx_op_like(xd, x, op, "xd", "x") || (dy && rx_op_like(dy, x, op, "dy", "x")) ||
      rx_op_float(u, op, "u"))
    return RX_EINVAL;
  if (xd->numel != x->numel || u->numel != x->numel || (dy && dy->numel != x->numel))
    return rx_fail(RX_EINVAL, "dropout: x, xd, u%s differ in element count (%lld, %lld, %lld)", dy ? " and dy" : "",
                   (long long)x->numel, (long long)xd->numel, (long long)u->numel);
  if (u->device != x->device || (u->dtype != RX_F32 && u->dtype != x->dtype))
    return rx_fail(RX_EINVAL, "dropout: the draws u are %s on device %d, expected f32 (or %s) on device %d",
                   rx_dtype_name(u->dtype), u->device, rx_dtype_name(x->dtype), x->device);
  if (!(p >= 0 && p < 1)) return rx_fail(RX_EINVAL, "dropout: p = %g must be in [0, 1)", p);
  rx_note_write(xd); rx_note_write(dy);
  switch (x->device) {
    case RX_CPU:
      if (x->dtype == RX_F32 && u->dtype == RX_F32)
        rx_cpu_dropout_f32(xd->data, x->data, u->data, x->numel, p, rx_data(dy));
      else if (x->dtype == RX_F64 && u->dtype == RX_F64)
        rx_cpu_dropout_f64(xd->data, x->data, u->data, x->numel, p, rx_data(dy));
      else
        return rx_fail(RX_EINVAL, "dropout: no cpu kernel for x %s with draws %s (f32 or f64, draws alike)",
                       rx_dtype_name(x->dtype), rx_dtype_name(u->dtype));
      return RX_OK;
    case RX_CUDA:
      if (u->dtype != RX_F32) return rx_fail(RX_EINVAL, "dropout: cuda draws are f32, got %s", rx_dtype_name(u->dtype));
      return rx_cuda_dropout(xd->data, x->data, u->data, x->numel, p, rx_data(dy), x->dtype);
    default:
      return rx_op_no_kernel(op, x);
  }
}
