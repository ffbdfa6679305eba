/* add.c: out = a + b elementwise (residual connections); out may alias a or b. Tensors must
 * agree in rows and last dim. */
#include "ops.h"
#include "cpu/cpu.h"
#include <stdio.h>

int rx_add(rx_tensor *out, const rx_tensor *a, const rx_tensor *b) {
  const char *op = "add";
  char why[160], s[96];
  if (rx_op_float(a, op, "a")) return RX_EINVAL;
  snprintf(why, sizeof why, "shape of a %s", rx_shape_str(a, s, sizeof s));
  if (rx_op_like(b, a, op, "b", "a") || rx_op_rows_cols(b, rx_rows(a), rx_last(a), op, "b", why) ||
      rx_op_like(out, a, op, "out", "a") || rx_op_rows_cols(out, rx_rows(a), rx_last(a), op, "out", why))
    return RX_EINVAL;
  rx_note_write(out);
  switch (a->device) {
    case RX_CPU:
      if (a->dtype == RX_F32) rx_cpu_add_f32(out->data, a->data, b->data, a->numel);
      else if (a->dtype == RX_F64) rx_cpu_add_f64(out->data, a->data, b->data, a->numel);
      else return rx_op_no_dtype(op, a);
      return RX_OK;
    case RX_CUDA:
      return rx_cuda_add(out->data, a->data, b->data, a->numel, a->dtype);
    default:
      return rx_op_no_kernel(op, a);
  }
}
