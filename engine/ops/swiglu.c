/* swiglu.c: out = silu(gate) * up elementwise; argument checks, then one switch on the device.
 * Tensors must agree in rows and last dim (their leading dims may be shaped differently). */
#include "ops.h"
#include "cpu/cpu.h"
#include <stdio.h>

static int check_like_gate(const char *op, const rx_tensor *t, const char *what, const rx_tensor *gate) {
  char why[160], s[96];
  snprintf(why, sizeof why, "shape of gate %s", rx_shape_str(gate, s, sizeof s));
  return rx_op_like(t, gate, op, what, "gate") || rx_op_rows_cols(t, rx_rows(gate), rx_last(gate), op, what, why)
             ? RX_EINVAL : RX_OK;
}

int rx_swiglu_forward(rx_tensor *out, const rx_tensor *gate, const rx_tensor *up) {
  const char *op = "swiglu";
  if (rx_op_float(gate, op, "gate") || check_like_gate(op, up, "up", gate) || check_like_gate(op, out, "out", gate))
    return RX_EINVAL;
  rx_note_write(out);
  switch (gate->device) {
    case RX_CPU:
      if (gate->dtype == RX_F32) rx_cpu_swiglu_forward_f32(out->data, gate->data, up->data, gate->numel);
      else if (gate->dtype == RX_F64) rx_cpu_swiglu_forward_f64(out->data, gate->data, up->data, gate->numel);
      else return rx_op_no_dtype(op, gate);
      return RX_OK;
    case RX_CUDA:
      return rx_cuda_swiglu_forward(out->data, gate->data, up->data, gate->numel, gate->dtype);
    default:
      return rx_op_no_kernel(op, gate);
  }
}

int rx_swiglu_backward(rx_tensor *dgate, rx_tensor *dup, const rx_tensor *dout, const rx_tensor *gate,
                       const rx_tensor *up) {
  const char *op = "swiglu_backward";
  if (rx_op_float(gate, op, "gate") || check_like_gate(op, up, "up", gate) || check_like_gate(op, dout, "dout", gate) ||
      (dgate && check_like_gate(op, dgate, "dgate", gate)) || (dup && check_like_gate(op, dup, "dup", gate)))
    return RX_EINVAL;
  rx_note_write(dgate); rx_note_write(dup);
  switch (gate->device) {
    case RX_CPU:
      if (gate->dtype == RX_F32)
        rx_cpu_swiglu_backward_f32(rx_data(dgate), rx_data(dup), dout->data, gate->data, up->data, gate->numel);
      else if (gate->dtype == RX_F64)
        rx_cpu_swiglu_backward_f64(rx_data(dgate), rx_data(dup), dout->data, gate->data, up->data, gate->numel);
      else return rx_op_no_dtype(op, gate);
      return RX_OK;
    case RX_CUDA:
      return rx_cuda_swiglu_backward(rx_data(dgate), rx_data(dup), dout->data, gate->data, up->data, gate->numel,
                                     gate->dtype);
    default:
      return rx_op_no_kernel(op, gate);
  }
}
