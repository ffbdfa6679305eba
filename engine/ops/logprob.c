/* logprob.c: the training head on a chunk of rows: log-probability of each row's target token,
 * log-sum-exp and entropy; argument checks (ops.h), then one switch on the device. */
#include "ops.h"
#include "cpu/cpu.h"
#include <stdio.h>

/* Before a kernel runs: a dtype the CPU kernels have (f32, f64), and every target in [0, V). */
static int check_for_kernel(const char *op, const rx_tensor *logits, const rx_tensor *targets, int64_t N, int64_t V,
                            const char *s) {
  char of[120];
  if (logits->device == RX_CPU && logits->dtype != RX_F32 && logits->dtype != RX_F64) return rx_op_no_dtype(op, logits);
  snprintf(of, sizeof of, "logits %s", s);
  return rx_op_check_index(op, targets, N, V, 1, "target", of) ? RX_EINVAL : RX_OK;
}

int rx_logprob_forward(rx_tensor *logp, rx_tensor *lse, rx_tensor *entropy, const rx_tensor *logits,
                       const rx_tensor *targets) {
  const char *op = "logprob";
  char s[96];
  int64_t N, V;
  if (rx_op_logits(op, logits, targets, &N, &V, s, sizeof s) || rx_op_row_stat(op, logp, "logp", logits, N, s) ||
      (lse && rx_op_row_stat(op, lse, "lse", logits, N, s)) ||
      (entropy && rx_op_row_stat(op, entropy, "entropy", logits, N, s)) ||
      check_for_kernel(op, logits, targets, N, V, s))
    return RX_EINVAL;
  rx_note_write(logp); rx_note_write(lse); rx_note_write(entropy);
  switch (logits->device) {
    case RX_CPU:
      if (logits->dtype == RX_F32)
        rx_cpu_logprob_forward_f32(logp->data, rx_data(lse), rx_data(entropy), logits->data, targets->data, N, V);
      else
        rx_cpu_logprob_forward_f64(logp->data, rx_data(lse), rx_data(entropy), logits->data, targets->data, N, V);
      return RX_OK;
    case RX_CUDA:
      return rx_cuda_logprob_forward(logp->data, rx_data(lse), rx_data(entropy), logits->data, targets->data, N, V,
                                     logits->dtype);
    default:
      return rx_op_no_kernel(op, logits);
  }
}

int rx_logprob_backward(rx_tensor *dlogits, const rx_tensor *dlogp, const rx_tensor *logits, const rx_tensor *targets,
                        const rx_tensor *lse) {
  const char *op = "logprob_backward";
  char s[96];
  int64_t N, V;
  if (rx_op_logits(op, logits, targets, &N, &V, s, sizeof s) || rx_op_row_stat(op, dlogp, "dlogp", logits, N, s) ||
      rx_op_row_stat(op, lse, "lse", logits, N, s))
    return RX_EINVAL;
  if (!dlogits) return RX_OK;
  if (rx_op_dlogits(op, dlogits, logits, N, V, s) || check_for_kernel(op, logits, targets, N, V, s)) return RX_EINVAL;
  rx_note_write(dlogits);
  switch (logits->device) {
    case RX_CPU:
      if (logits->dtype == RX_F32)
        rx_cpu_logprob_backward_f32(dlogits->data, dlogp->data, logits->data, targets->data, lse->data, N, V);
      else
        rx_cpu_logprob_backward_f64(dlogits->data, dlogp->data, logits->data, targets->data, lse->data, N, V);
      return RX_OK;
    case RX_CUDA:
      return rx_cuda_logprob_backward(dlogits->data, dlogp->data, logits->data, targets->data, lse->data, N, V,
                                      logits->dtype);
    default:
      return rx_op_no_kernel(op, logits);
  }
}

int rx_logprob_entropy_backward(rx_tensor *dlogits, const rx_tensor *dlogp, const rx_tensor *dentropy,
                                const rx_tensor *logits, const rx_tensor *targets, const rx_tensor *lse) {
  const char *op = "logprob_entropy_backward";
  char s[96];
  int64_t N, V;
  if (rx_op_logits(op, logits, targets, &N, &V, s, sizeof s) || rx_op_row_stat(op, dlogp, "dlogp", logits, N, s) ||
      rx_op_row_stat(op, dentropy, "dentropy", logits, N, s) || rx_op_row_stat(op, lse, "lse", logits, N, s))
    return RX_EINVAL;
  if (!dlogits) return RX_OK;
  if (rx_op_dlogits(op, dlogits, logits, N, V, s)) return RX_EINVAL;
  if (logits->device != RX_CPU) return rx_op_no_kernel(op, logits);   /* a CPU kernel only */
  if (check_for_kernel(op, logits, targets, N, V, s)) return RX_EINVAL;
  rx_note_write(dlogits);
  if (logits->dtype == RX_F32)
    rx_cpu_logprob_entropy_backward_f32(dlogits->data, dlogp->data, dentropy->data, logits->data, targets->data,
                                        lse->data, N, V);
  else
    rx_cpu_logprob_entropy_backward_f64(dlogits->data, dlogp->data, dentropy->data, logits->data, targets->data,
                                        lse->data, N, V);
  return RX_OK;
}
