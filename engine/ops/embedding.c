/* embedding.c: token embedding lookup out[n,:] = weight[tokens[n],:] and its scatter-add
 * backward; argument checks, then one switch on the device. */
#include "ops.h"
#include "cpu/cpu.h"
#include <stdio.h>

/* Tokens are data: they are range-checked on the device that holds them, before any write. */
static int check_tokens_cpu(const char *op, const rx_tensor *tokens, const rx_tensor *weight, int64_t V) {
  char buf[96];
  int64_t bad = rx_cpu_first_bad_index(tokens->data, tokens->numel, V, 0);
  if (bad >= 0)
    return rx_fail(RX_EINVAL, "%s: token %d at row %lld is outside the vocabulary [0, %lld) of weight %s", op,
                   ((const int32_t *)tokens->data)[bad], (long long)bad, (long long)V,
                   rx_shape_str(weight, buf, sizeof buf));
  return RX_OK;
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
  if (rx_op_index(tokens, weight, N, op, "tokens", "") || rx_op_like(out, weight, op, "out", "weight") ||
      rx_op_rows_cols(out, N, C, op, "out", why))
    return RX_EINVAL;
  switch (weight->device) {
    case RX_CPU:
      if (weight->dtype != RX_F32 && weight->dtype != RX_F64) return rx_op_no_dtype(op, weight);
      if (check_tokens_cpu(op, tokens, weight, V)) return RX_EINVAL;
      if (weight->dtype == RX_F32) rx_cpu_embedding_forward_f32(out->data, tokens->data, weight->data, N, C);
      else rx_cpu_embedding_forward_f64(out->data, tokens->data, weight->data, N, C);
      return RX_OK;
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
  if (rx_op_index(tokens, dweight, N, op, "tokens", "") || rx_op_like(dout, dweight, op, "dout", "dweight") ||
      rx_op_rows_cols(dout, N, C, op, "dout", why))
    return RX_EINVAL;
  switch (dweight->device) {
    case RX_CPU:
      if (dweight->dtype != RX_F32 && dweight->dtype != RX_F64) return rx_op_no_dtype(op, dweight);
      if (check_tokens_cpu(op, tokens, dweight, V)) return RX_EINVAL;
      if (dweight->dtype == RX_F32) rx_cpu_embedding_backward_f32(dweight->data, dout->data, tokens->data, N, C);
      else rx_cpu_embedding_backward_f64(dweight->data, dout->data, tokens->data, N, C);
      return RX_OK;
    default:
      return rx_op_no_kernel(op, dweight);
  }
}
