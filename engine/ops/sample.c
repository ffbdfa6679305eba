/* sample.c: the device sampler's argument checks and dispatch (sample.h). */
#include "ops.h"
#include "ops/sample.h"

int rx_sample_rows(rx_tensor *token, rx_tensor *logprob, rx_tensor *prob, const rx_tensor *logits,
                   const rx_cuda_sample_row *rows, uint64_t seed, rx_tensor *seen, rx_tensor *penalized) {
  const char *op = "sample";
  char a[96];
  if (rx_op_float(logits, op, "logits") || rx_check_tensor(logits, op, "logits", 2)) return RX_EINVAL;
  const int64_t n = logits->shape[0], V = logits->shape[1];
  if (rx_check_tensor(token, op, "token", 1) || token->dtype != RX_I32 || token->numel != n ||
      token->device != logits->device)
    return rx_fail(RX_EINVAL, "%s: token must be i32 [%lld] on the device of the logits %s", op, (long long)n,
                   rx_shape_str(logits, a, sizeof a));
  if (rx_check_tensor(logprob, op, "logprob", 1) || logprob->dtype != RX_F32 || logprob->numel != n ||
      logprob->device != logits->device)
    return rx_fail(RX_EINVAL, "%s: logprob must be f32 [%lld] on the device of the logits", op, (long long)n);
  if (rx_check_tensor(prob, op, "prob", 2) || prob->dtype != RX_F32 || prob->numel != n * V ||
      prob->device != logits->device)
    return rx_fail(RX_EINVAL, "%s: prob must be f32 [%lld,%lld] on the device of the logits", op, (long long)n,
                   (long long)V);
  if (!rows && n > 0) return rx_fail(RX_EINVAL, "%s: rows are missing", op);
  if (!seen != !penalized) return rx_fail(RX_EINVAL, "%s: give both seen and penalized, or neither", op);
  if (seen && (rx_check_tensor(seen, op, "seen", 2) || seen->dtype != RX_I32 || seen->device != logits->device))
    return rx_fail(RX_EINVAL, "%s: seen must be a contiguous i32 [rows, S] on the device of the logits", op);
  if (penalized && (rx_check_tensor(penalized, op, "penalized", 2) || penalized->dtype != RX_F32 ||
                    penalized->numel != n * V || penalized->device != logits->device))
    return rx_fail(RX_EINVAL, "%s: penalized must be f32 [%lld,%lld] on the device of the logits", op, (long long)n,
                   (long long)V);
  rx_note_write(token); rx_note_write(logprob); rx_note_write(prob);
  switch (logits->device) {
    case RX_CUDA:
      return rx_cuda_sample(token->data, logprob->data, prob->data, penalized ? penalized->data : NULL,
                            seen ? seen->data : NULL, seen ? seen->shape[1] : 0, logits->data, rows, seed, n, V,
                            logits->dtype);
    default:   /* the CPU samples on the host, in engine/generate/generate.c */
      return rx_op_no_kernel(op, logits);
  }
}
