/* rmsnorm.c: RMS normalisation over the last dim; argument checks, then one switch on the device. */
#include "ops.h"
#include "cpu/cpu.h"
#include <math.h>
#include <stdio.h>

/* inp [.., C] and weight [C]; sets N and C. */
static int check_inputs(const char *op, const rx_tensor *inp, const rx_tensor *weight, int64_t *N, int64_t *C,
                        char *inp_shape, size_t n) {
  char why[160];
  if (rx_op_float(inp, op, "inp")) return RX_EINVAL;
  *N = rx_rows(inp);
  *C = rx_last(inp);
  rx_shape_str(inp, inp_shape, n);
  snprintf(why, sizeof why, "C of inp %s", inp_shape);
  if (rx_op_like(weight, inp, op, "weight", "inp") || rx_op_vector(weight, *C, op, "weight", why)) return RX_EINVAL;
  return RX_OK;
}

int rx_rmsnorm_forward(rx_tensor *out, rx_tensor *rstd, const rx_tensor *inp, const rx_tensor *weight, double eps) {
  const char *op = "rmsnorm";
  char why[160], s[96];
  int64_t N, C;
  if (check_inputs(op, inp, weight, &N, &C, s, sizeof s)) return RX_EINVAL;
  snprintf(why, sizeof why, "shape of inp %s", s);
  if (rx_op_like(out, inp, op, "out", "inp") || rx_op_rows_cols(out, N, C, op, "out", why)) return RX_EINVAL;
  snprintf(why, sizeof why, "one per row of inp %s", s);
  if (rstd && (rx_op_acc_like(rstd, inp, op, "rstd", "inp") || rx_op_numel(rstd, N, op, "rstd", why))) return RX_EINVAL;
  if (!(eps >= 0) || !isfinite(eps)) return rx_fail(RX_EINVAL, "%s: eps %g must be finite and >= 0", op, eps);
  rx_note_write(out); rx_note_write(rstd);
  switch (inp->device) {
    case RX_CPU:
      if (inp->dtype == RX_F32) rx_cpu_rmsnorm_forward_f32(out->data, rx_data(rstd), inp->data, weight->data, N, C, (float)eps);
      else if (inp->dtype == RX_F64) rx_cpu_rmsnorm_forward_f64(out->data, rx_data(rstd), inp->data, weight->data, N, C, eps);
      else return rx_op_no_dtype(op, inp);
      return RX_OK;
    case RX_CUDA:
      return rx_cuda_rmsnorm_forward(out->data, rx_data(rstd), inp->data, weight->data, N, C, (float)eps, inp->dtype);
    default:
      return rx_op_no_kernel(op, inp);
  }
}

int rx_rmsnorm_backward(rx_tensor *dinp, rx_tensor *dweight, const rx_tensor *dout, const rx_tensor *inp,
                        const rx_tensor *weight, const rx_tensor *rstd) {
  const char *op = "rmsnorm_backward";
  char why[160], s[96];
  int64_t N, C;
  if (check_inputs(op, inp, weight, &N, &C, s, sizeof s)) return RX_EINVAL;
  snprintf(why, sizeof why, "shape of inp %s", s);
  if (rx_op_like(dout, inp, op, "dout", "inp") || rx_op_rows_cols(dout, N, C, op, "dout", why)) return RX_EINVAL;
  if (dinp && (rx_op_like(dinp, inp, op, "dinp", "inp") || rx_op_rows_cols(dinp, N, C, op, "dinp", why)))
    return RX_EINVAL;
  snprintf(why, sizeof why, "C of inp %s", s);
  if (dweight && (rx_op_acc_like(dweight, inp, op, "dweight", "inp") || rx_op_vector(dweight, C, op, "dweight", why)))
    return RX_EINVAL;
  snprintf(why, sizeof why, "one per row of inp %s, saved by rmsnorm forward", s);
  if (rx_op_acc_like(rstd, inp, op, "rstd", "inp") || rx_op_numel(rstd, N, op, "rstd", why)) return RX_EINVAL;
  rx_note_write(dinp); rx_note_write(dweight);
  switch (inp->device) {
    case RX_CPU:
      if (inp->dtype == RX_F32)
        rx_cpu_rmsnorm_backward_f32(rx_data(dinp), rx_data(dweight), dout->data, inp->data, weight->data, rstd->data, N, C);
      else if (inp->dtype == RX_F64)
        rx_cpu_rmsnorm_backward_f64(rx_data(dinp), rx_data(dweight), dout->data, inp->data, weight->data, rstd->data, N, C);
      else return rx_op_no_dtype(op, inp);
      return RX_OK;
    case RX_CUDA:
      return rx_cuda_rmsnorm_backward(rx_data(dinp), rx_data(dweight), dout->data, inp->data, weight->data, rstd->data,
                                      N, C, inp->dtype);
    default:
      return rx_op_no_kernel(op, inp);
  }
}
