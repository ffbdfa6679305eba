/* embedding.c: token embedding lookup out[n,:] = weight[tokens[n],:] and its scatter-add
 * backward; argument checks, then one switch on the device. */
#include "ops.h"
#include "cpu/cpu.h"
#include <stdio.h>

/* Tokens are data: they are range-checked on the device that holds them, before any write. */
static int check_tokens(const char *op, const rx_tensor *tokens, const rx_tensor *weight, int64_t V) {
  char buf[96], of[120];
  snprintf(of, sizeof of, "weight %s", rx_shape_str(weight, buf, sizeof buf));
  return rx_op_check_index(op, tokens, tokens->numel, V, 0, "token", of);
}

int rx_embedding_forward(rx_tensor *out, const rx_tensor *tokens, const rx_tensor *weight) {
  const char *op = "embedding";
  char why[160], a[96];
  if (rx_op_float(weight, op, "weight")) return RX_EINVAL;
  if (weight->ndim != 2)
    return rx_fail(RX_EINVAL, "%s: weight has shape %s, expected [vocab,channels]", op, rx_shape_str(weight, a, sizeof a));
  int64_t V = weight->shape[0], C = weight->shape[1];
  if (!tokens) return rx_fail(RX_EINVAL, "%s: tokens is missing", op);
  int64_t N = tokens->numel;
  snprintf(why, sizeof why, "one row per token of tokens, channels of weight %s", rx_shape_str(weight, a, sizeof a));
  /* a table stored in bf16 on the CPU (a frozen model's) is gathered into f32 rows */
  const int widen = weight->dtype == RX_BF16 && weight->device == RX_CPU;
  if (rx_op_index(tokens, weight, N, op, "tokens", "")) return RX_EINVAL;
  if (widen) {
    if (rx_op_float(out, op, "out")) return RX_EINVAL;
    if (out->dtype != RX_F32 || out->device != RX_CPU)
      return rx_fail(RX_EINVAL, "%s: out has dtype %s on %s, expected f32 on cpu (the rows of a bf16 weight are widened)",
                     op, rx_dtype_name(out->dtype), rx_device_label(out->device));
  } else if (rx_op_like(out, weight, op, "out", "weight")) return RX_EINVAL;
  if (rx_op_rows_cols(out, N, C, op, "out", why)) return RX_EINVAL;
  rx_note_write(out);
  switch (weight->device) {
    case RX_CPU:
      if (weight->dtype != RX_F32 && weight->dtype != RX_F64 && !widen) return rx_op_no_dtype(op, weight);
      if (check_tokens(op, tokens, weight, V)) return RX_EINVAL;
      if (widen) rx_cpu_embedding_forward_f32_bf16(out->data, tokens->data, weight->data, N, C);
      else if (weight->dtype == RX_F32) rx_cpu_embedding_forward_f32(out->data, tokens->data, weight->data, N, C);
      else rx_cpu_embedding_forward_f64(out->data, tokens->data, weight->data, N, C);
      return RX_OK;
    case RX_CUDA:
      if (check_tokens(op, tokens, weight, V)) return RX_EINVAL;
      return rx_cuda_embedding_forward(out->data, tokens->data, weight->data, N, C, weight->dtype);
    default:
      return rx_op_no_kernel(op, weight);
  }
}

int rx_embedding_backward(rx_tensor *dweight, const rx_tensor *dout, const rx_tensor *tokens) {
  const char *op = "embedding_backward";
  char why[160], a[96];
  if (!dweight) return RX_OK;   /* nothing to accumulate */
  if (rx_op_float(dweight, op, "dweight")) return RX_EINVAL;
  if (dweight->ndim != 2)
    return rx_fail(RX_EINVAL, "%s: dweight has shape %s, expected [vocab,channels]", op,
                   rx_shape_str(dweight, a, sizeof a));
  int64_t V = dweight->shape[0], C = dweight->shape[1];
  if (!tokens) return rx_fail(RX_EINVAL, "%s: tokens is missing", op);
  int64_t N = tokens->numel;
  snprintf(why, sizeof why, "one row per token of tokens, channels of dweight %s", rx_shape_str(dweight, a, sizeof a));
  if (rx_op_index(tokens, dweight, N, op, "tokens", "") || rx_op_float(dout, op, "dout") ||
      rx_op_rows_cols(dout, N, C, op, "dout", why))
    return RX_EINVAL;
  /* dweight is the parameter gradient: dout's dtype, or f32 for a bf16 dout (rx_acc_dtype) */
  if (dout->dtype != dweight->dtype && rx_acc_dtype(dout->dtype) != dweight->dtype)
    return rx_fail(RX_EINVAL, "%s: dout has dtype %s, expected %s (dtype of dweight)", op, rx_dtype_name(dout->dtype),
                   rx_dtype_name(dweight->dtype));
  if (dout->device != dweight->device)
    return rx_fail(RX_EINVAL, "%s: dout is on %s, expected %s (device of dweight)", op, rx_device_label(dout->device),
                   rx_device_label(dweight->device));
  rx_note_write(dweight);
  switch (dweight->device) {
    case RX_CPU:
      if (dweight->dtype != RX_F32 && dweight->dtype != RX_F64) return rx_op_no_dtype(op, dweight);
      if (dout->dtype != dweight->dtype) return rx_op_no_dtype(op, dout);
      if (check_tokens(op, tokens, dweight, V)) return RX_EINVAL;
      if (dweight->dtype == RX_F32) rx_cpu_embedding_backward_f32(dweight->data, dout->data, tokens->data, N, C);
      else rx_cpu_embedding_backward_f64(dweight->data, dout->data, tokens->data, N, C);
      return RX_OK;
    case RX_CUDA:
      if (dweight->dtype != RX_F32)
        return rx_fail(RX_EINVAL, "%s: dweight has dtype %s; the cuda kernel accumulates into f32", op,
                       rx_dtype_name(dweight->dtype));
      if (check_tokens(op, tokens, dweight, V)) return RX_EINVAL;
      return rx_cuda_embedding_backward(dweight->data, dout->data, tokens->data, N, V, C, dout->dtype);
    default:
      return rx_op_no_kernel(op, dweight);
  }
}
