/* matmul.c: linear layer y = x W^T (+ b) over the last dim; argument checks, then one switch on
 * the device. */
#include "ops.h"
#include "ops/engine_ops.h"
#include "cpu/cpu.h"
#include <limits.h>
#include <stdio.h>

/* A weight stored in bf16 under f32 inputs, on the CPU: a bf16 model's working weights (its
 * gradient goes to the f32 master) or a frozen model's storage (cpu/bf16_gemm.c). */
static int stored_bf16(const rx_tensor *inp, const rx_tensor *weight) {
  return inp && weight && inp->dtype == RX_F32 && weight->dtype == RX_BF16 && inp->device == RX_CPU &&
         weight->device == RX_CPU;
}

static int no_buffer(const char *op, int64_t C, int64_t OC) {
  return rx_fail(RX_ENOMEM, "%s: bf16 GEMM with weight [%lld,%lld] failed: out of memory for its buffers, or oneDNN "
                 "refused it (%s)", op, (long long)OC, (long long)C, rx_cpu_bf16_gemm_text());
}

/* inp [.., C] and weight [OC, C]; sets N (rows), C and OC. */
static int check_inputs(const char *op, const rx_tensor *inp, const rx_tensor *weight, int64_t *N, int64_t *C,
                        int64_t *OC) {
  char a[96], b[96];
  if (rx_op_float(inp, op, "inp") || (stored_bf16(inp, weight) ? rx_op_float(weight, op, "weight")
                                                               : rx_op_like(weight, inp, op, "weight", "inp")))
    return RX_EINVAL;
  *N = rx_rows(inp);
  *C = rx_last(inp);
  if (weight->ndim != 2 || weight->shape[1] != *C)
    return rx_fail(RX_EINVAL, "%s: weight has shape %s, expected [out,%lld] (in features of inp %s)", op,
                   rx_shape_str(weight, a, sizeof a), (long long)*C, rx_shape_str(inp, b, sizeof b));
  *OC = weight->shape[0];
  if (*N > INT_MAX || *C > INT_MAX || *OC > INT_MAX)
    return rx_fail(RX_EINVAL, "%s: sizes rows=%lld in=%lld out=%lld exceed the BLAS int range", op, (long long)*N,
                   (long long)*C, (long long)*OC);
  return RX_OK;
}

/* The checks of a forward: inp, weight, out and bias agree; sets N, C and OC. */
static int check_forward(const char *op, const rx_tensor *out, const rx_tensor *inp, const rx_tensor *weight,
                         const rx_tensor *bias, int64_t *N, int64_t *C, int64_t *OC) {
  char why[160], a[96], b[96];
  if (check_inputs(op, inp, weight, N, C, OC)) return RX_EINVAL;
  snprintf(why, sizeof why, "rows of inp %s, out features of weight %s", rx_shape_str(inp, a, sizeof a),
           rx_shape_str(weight, b, sizeof b));
  if (rx_op_like(out, inp, op, "out", "inp") || rx_op_rows_cols(out, *N, *OC, op, "out", why)) return RX_EINVAL;
  snprintf(why, sizeof why, "out features of weight %s", b);
  if (bias && (rx_op_like(bias, inp, op, "bias", "inp") || rx_op_vector(bias, *OC, op, "bias", why))) return RX_EINVAL;
  return RX_OK;
}

int rx_matmul_forward(rx_tensor *out, const rx_tensor *inp, const rx_tensor *weight, const rx_tensor *bias) {
  const char *op = "matmul";
  int64_t N, C, OC;
  if (check_forward(op, out, inp, weight, bias, &N, &C, &OC)) return RX_EINVAL;
  rx_note_write(out);
  switch (inp->device) {
    case RX_CPU:
      if (weight->dtype == RX_BF16) {
        if (!rx_cpu_bf16_gemm_forward(out->data, inp->data, weight->data, rx_data(bias), N, C, OC))
          return no_buffer(op, C, OC);
      } else if (inp->dtype == RX_F32) rx_cpu_matmul_forward_f32(out->data, inp->data, weight->data, rx_data(bias), N, C, OC);
      else if (inp->dtype == RX_F64) rx_cpu_matmul_forward_f64(out->data, inp->data, weight->data, rx_data(bias), N, C, OC);
      else return rx_op_no_dtype(op, inp);
      return RX_OK;
    case RX_CUDA:
      return rx_cuda_matmul_forward(out->data, inp->data, weight->data, rx_data(bias), N, C, OC, inp->dtype);
    default:
      return rx_op_no_kernel(op, inp);
  }
}

int rx_matmul_forward_rows(rx_tensor *out, const rx_tensor *inp, const rx_tensor *weight, const rx_tensor *bias) {
  const char *op = "matmul";
  int64_t N, C, OC;
  if (check_forward(op, out, inp, weight, bias, &N, &C, &OC)) return RX_EINVAL;
  rx_note_write(out);
  switch (inp->device) {
    case RX_CPU:
      if (weight->dtype == RX_BF16) {
        if (!rx_cpu_matmul_rows_forward_f32_bf16(out->data, inp->data, weight->data, rx_data(bias), N, C, OC))
          return no_buffer(op, C, OC);
      } else if (inp->dtype == RX_F32) {
        rx_cpu_matmul_rows_forward_f32(out->data, inp->data, weight->data, rx_data(bias), N, C, OC);
      } else if (inp->dtype == RX_F64) {
        rx_cpu_matmul_rows_forward_f64(out->data, inp->data, weight->data, rx_data(bias), N, C, OC);
      } else {
        return rx_op_no_dtype(op, inp);
      }
      return RX_OK;
    case RX_CUDA:   /* cuBLAS: its algorithm follows the row count (no promise of row independence there) */
      return rx_cuda_matmul_forward(out->data, inp->data, weight->data, rx_data(bias), N, C, OC, inp->dtype);
    default:
      return rx_op_no_kernel(op, inp);
  }
}

int rx_matmul_backward(rx_tensor *dinp, rx_tensor *dweight, rx_tensor *dbias, const rx_tensor *dout,
                       const rx_tensor *inp, const rx_tensor *weight) {
  const char *op = "matmul_backward";
  char why[160], a[96], b[96];
  int64_t N, C, OC;
  if (check_inputs(op, inp, weight, &N, &C, &OC)) return RX_EINVAL;
  rx_shape_str(inp, a, sizeof a);
  rx_shape_str(weight, b, sizeof b);
  snprintf(why, sizeof why, "rows of inp %s, out features of weight %s", a, b);
  if (rx_op_like(dout, inp, op, "dout", "inp") || rx_op_rows_cols(dout, N, OC, op, "dout", why)) return RX_EINVAL;
  snprintf(why, sizeof why, "shape of inp %s", a);
  if (dinp && (rx_op_like(dinp, inp, op, "dinp", "inp") || rx_op_rows_cols(dinp, N, C, op, "dinp", why)))
    return RX_EINVAL;
  snprintf(why, sizeof why, "shape of weight %s", b);
  if (dweight && (rx_op_acc_like(dweight, inp, op, "dweight", "inp") || rx_op_matrix(dweight, OC, C, op, "dweight", why)))
    return RX_EINVAL;
  snprintf(why, sizeof why, "out features of weight %s", b);
  if (dbias && (rx_op_acc_like(dbias, inp, op, "dbias", "inp") || rx_op_vector(dbias, OC, op, "dbias", why)))
    return RX_EINVAL;
  if (dweight && stored_bf16(inp, weight) && dweight->dtype != RX_F32)
    return rx_fail(RX_EINVAL, "%s: dweight of the bf16 weight %s has dtype %s, expected f32 (the master's gradient)",
                   op, b, rx_dtype_name(dweight->dtype));
  rx_note_write(dinp); rx_note_write(dweight); rx_note_write(dbias);
  switch (inp->device) {
    case RX_CPU:
      if (weight->dtype == RX_BF16) {
        if (dinp && !rx_cpu_bf16_gemm_dinp(dinp->data, dout->data, weight->data, N, C, OC)) return no_buffer(op, C, OC);
        if (dweight && !rx_cpu_bf16_gemm_dweight(dweight->data, dout->data, inp->data, N, C, OC))
          return no_buffer(op, C, OC);
        if (dbias) rx_cpu_matmul_backward_f32(NULL, NULL, dbias->data, dout->data, inp->data, NULL, N, C, OC);
      } else if (inp->dtype == RX_F32)
        rx_cpu_matmul_backward_f32(rx_data(dinp), rx_data(dweight), rx_data(dbias), dout->data, inp->data,
                                   weight->data, N, C, OC);
      else if (inp->dtype == RX_F64)
        rx_cpu_matmul_backward_f64(rx_data(dinp), rx_data(dweight), rx_data(dbias), dout->data, inp->data,
                                   weight->data, N, C, OC);
      else return rx_op_no_dtype(op, inp);
      return RX_OK;
    case RX_CUDA:
      return rx_cuda_matmul_backward(rx_data(dinp), rx_data(dweight), rx_data(dbias), dout->data, inp->data,
                                     weight->data, N, C, OC, inp->dtype);
    default:
      return rx_op_no_kernel(op, inp);
  }
}
