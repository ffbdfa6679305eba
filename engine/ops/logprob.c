/* logprob.c: the training head on a chunk of rows: log-probability of each row's target token,
 * log-sum-exp and entropy; argument checks, then one switch on the device. */
#include "ops.h"
#include "cpu/cpu.h"
#include <stdio.h>

/* logits [.., V] with V >= 1, targets i32 with one value per row; sets N, V and the shape text. */
static int check_inputs(const char *op, const rx_tensor *logits, const rx_tensor *targets, int64_t *N, int64_t *V,
                        char *s, size_t n) {
  char why[160];
  if (rx_op_float(logits, op, "logits")) return RX_EINVAL;
  rx_shape_str(logits, s, n);
  *N = rx_rows(logits);
  *V = rx_last(logits);
  if (*V < 1) return rx_fail(RX_EINVAL, "%s: logits %s has an empty vocabulary dim", op, s);
  snprintf(why, sizeof why, "one per row of logits %s", s);
  return rx_op_index(targets, logits, *N, op, "targets", why);
}

/* Per-row outputs and inputs: same dtype as logits, one element per row. */
static int check_per_row(const char *op, const rx_tensor *t, const char *what, const rx_tensor *logits, int64_t N,
                         const char *s) {
  char why[160];
  snprintf(why, sizeof why, "one per row of logits %s", s);
  return rx_op_acc_like(t, logits, op, what, "logits") || rx_op_numel(t, N, op, what, why) ? RX_EINVAL : RX_OK;
}

static int check_targets(const char *op, const rx_tensor *targets, int64_t N, int64_t V, const char *s) {
  char of[120];
  snprintf(of, sizeof of, "logits %s", s);
  return rx_op_check_index(op, targets, N, V, 1, "target", of);
}

int rx_logprob_forward(rx_tensor *logp, rx_tensor *lse, rx_tensor *entropy, const rx_tensor *logits,
                       const rx_tensor *targets) {
  const char *op = "logprob";
  char s[96];
  int64_t N, V;
  if (check_inputs(op, logits, targets, &N, &V, s, sizeof s) || check_per_row(op, logp, "logp", logits, N, s) ||
      (lse && check_per_row(op, lse, "lse", logits, N, s)) ||
      (entropy && check_per_row(op, entropy, "entropy", logits, N, s)))
    return RX_EINVAL;
  rx_note_write(logp); rx_note_write(lse); rx_note_write(entropy);
  switch (logits->device) {
    case RX_CPU:
      if (logits->dtype != RX_F32 && logits->dtype != RX_F64) return rx_op_no_dtype(op, logits);
      if (check_targets(op, targets, N, V, s)) return RX_EINVAL;
      if (logits->dtype == RX_F32)
        rx_cpu_logprob_forward_f32(logp->data, rx_data(lse), rx_data(entropy), logits->data, targets->data, N, V);
      else
        rx_cpu_logprob_forward_f64(logp->data, rx_data(lse), rx_data(entropy), logits->data, targets->data, N, V);
      return RX_OK;
    case RX_CUDA:
      if (check_targets(op, targets, N, V, s)) return RX_EINVAL;
      return rx_cuda_logprob_forward(logp->data, rx_data(lse), rx_data(entropy), logits->data, targets->data, N, V,
                                     logits->dtype);
    default:
      return rx_op_no_kernel(op, logits);
  }
}

int rx_logprob_backward(rx_tensor *dlogits, const rx_tensor *dlogp, const rx_tensor *logits, const rx_tensor *targets,
                        const rx_tensor *lse) {
  const char *op = "logprob_backward";
  char why[160], s[96];
  int64_t N, V;
  if (check_inputs(op, logits, targets, &N, &V, s, sizeof s) || check_per_row(op, dlogp, "dlogp", logits, N, s) ||
      check_per_row(op, lse, "lse", logits, N, s))
    return RX_EINVAL;
  if (!dlogits) return RX_OK;
  snprintf(why, sizeof why, "shape of logits %s", s);
  if (rx_op_like(dlogits, logits, op, "dlogits", "logits") || rx_op_rows_cols(dlogits, N, V, op, "dlogits", why))
    return RX_EINVAL;
  rx_note_write(dlogits);
  switch (logits->device) {
    case RX_CPU:
      if (logits->dtype != RX_F32 && logits->dtype != RX_F64) return rx_op_no_dtype(op, logits);
      if (check_targets(op, targets, N, V, s)) return RX_EINVAL;
      if (logits->dtype == RX_F32)
        rx_cpu_logprob_backward_f32(dlogits->data, dlogp->data, logits->data, targets->data, lse->data, N, V);
      else
        rx_cpu_logprob_backward_f64(dlogits->data, dlogp->data, logits->data, targets->data, lse->data, N, V);
      return RX_OK;
    case RX_CUDA:
      if (check_targets(op, targets, N, V, s)) return RX_EINVAL;
      return rx_cuda_logprob_backward(dlogits->data, dlogp->data, logits->data, targets->data, lse->data, N, V,
                                      logits->dtype);
    default:
      return rx_op_no_kernel(op, logits);
  }
}

int rx_logprob_entropy_backward(rx_tensor *dlogits, const rx_tensor *dlogp, const rx_tensor *dentropy,
                                const rx_tensor *logits, const rx_tensor *targets, const rx_tensor *lse) {
  const char *op = "logprob_entropy_backward";
  char why[160], s[96];
  int64_t N, V;
  if (check_inputs(op, logits, targets, &N, &V, s, sizeof s) || check_per_row(op, dlogp, "dlogp", logits, N, s) ||
      check_per_row(op, dentropy, "dentropy", logits, N, s) || check_per_row(op, lse, "lse", logits, N, s))
    return RX_EINVAL;
  if (!dlogits) return RX_OK;
  snprintf(why, sizeof why, "shape of logits %s", s);
  if (rx_op_like(dlogits, logits, op, "dlogits", "logits") || rx_op_rows_cols(dlogits, N, V, op, "dlogits", why))
    return RX_EINVAL;
  rx_note_write(dlogits);
  switch (logits->device) {
    case RX_CPU:
      if (logits->dtype != RX_F32 && logits->dtype != RX_F64) return rx_op_no_dtype(op, logits);
      if (check_targets(op, targets, N, V, s)) return RX_EINVAL;
      if (logits->dtype == RX_F32)
        rx_cpu_logprob_entropy_backward_f32(dlogits->data, dlogp->data, dentropy->data, logits->data, targets->data,
                                            lse->data, N, V);
      else
        rx_cpu_logprob_entropy_backward_f64(dlogits->data, dlogp->data, dentropy->data, logits->data, targets->data,
                                            lse->data, N, V);
      return RX_OK;
    default:
      return rx_op_no_kernel(op, logits);
  }
}
