/* logsoftmax.c: log-softmax over the last dim; argument checks, then one switch on the device. */
#include "ops.h"
#include "cpu/cpu.h"
#include <stdio.h>

int rx_logsoftmax_forward(rx_tensor *out, const rx_tensor *inp) {
  const char *op = "logsoftmax";
  char why[160], s[96];
  if (rx_op_float(inp, op, "inp")) return RX_EINVAL;
  snprintf(why, sizeof why, "shape of inp %s", rx_shape_str(inp, s, sizeof s));
  int64_t N = rx_rows(inp), V = rx_last(inp);
  if (rx_op_like(out, inp, op, "out", "inp") || rx_op_rows_cols(out, N, V, op, "out", why)) return RX_EINVAL;
  rx_note_write(out);
  switch (inp->device) {
    case RX_CPU:
      if (inp->dtype == RX_F32) rx_cpu_logsoftmax_forward_f32(out->data, inp->data, N, V);
      else if (inp->dtype == RX_F64) rx_cpu_logsoftmax_forward_f64(out->data, inp->data, N, V);
      else return rx_op_no_dtype(op, inp);
      return RX_OK;
    default:
      return rx_op_no_kernel(op, inp);
  }
}

int rx_logsoftmax_backward(rx_tensor *dinp, const rx_tensor *dout, const rx_tensor *out) {
  const char *op = "logsoftmax_backward";
  char why[160], s[96];
  if (rx_op_float(out, op, "out")) return RX_EINVAL;
  snprintf(why, sizeof why, "shape of out %s", rx_shape_str(out, s, sizeof s));
  int64_t N = rx_rows(out), V = rx_last(out);
  if (rx_op_like(dout, out, op, "dout", "out") || rx_op_rows_cols(dout, N, V, op, "dout", why)) return RX_EINVAL;
  if (!dinp) return RX_OK;
  if (rx_op_like(dinp, out, op, "dinp", "out") || rx_op_rows_cols(dinp, N, V, op, "dinp", why)) return RX_EINVAL;
  rx_note_write(dinp);
  switch (out->device) {
    case RX_CPU:
      if (out->dtype == RX_F32) rx_cpu_logsoftmax_backward_f32(dinp->data, dout->data, out->data, N, V);
      else if (out->dtype == RX_F64) rx_cpu_logsoftmax_backward_f64(dinp->data, dout->data, out->data, N, V);
      else return rx_op_no_dtype(op, out);
      return RX_OK;
    default:
      return rx_op_no_kernel(op, out);
  }
}
