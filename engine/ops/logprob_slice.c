/* logprob_slice.c: the head over vocabulary slices (engine/model/head.c): argument checks, then
 * one switch on the device (cpu/logprob.inc, cuda/logprob_slice.cu). */
#include "ops.h"
#include "ops/engine_ops.h"
#include "cpu/cpu.h"
#include <stdio.h>

/* logits [n, Vs] and targets (rx_op_logits), v0 >= 0. Sets n, Vs and the shape text. */
static int check_logits(const char *op, const rx_tensor *logits, const rx_tensor *targets, int64_t v0, int64_t *n,
                        int64_t *Vs, char *s, size_t len) {
  if (rx_op_logits(op, logits, targets, n, Vs, s, len)) return RX_EINVAL;
  if (v0 < 0) return rx_fail(RX_EINVAL, "%s: slice start v0 = %lld must be >= 0", op, (long long)v0);
  return RX_OK;
}

/* A per-row f64 sum (rsum, rsz) on the device of ref. */
static int check_sum(const char *op, const rx_tensor *t, const char *what, const rx_tensor *ref, int64_t n) {
  char buf[96];
  if (rx_op_float(t, op, what)) return RX_EINVAL;
  if (t->dtype != RX_F64) return rx_fail(RX_EINVAL, "%s: %s has dtype %s, expected f64", op, what, rx_dtype_name(t->dtype));
  if (t->device != ref->device || t->device_index != ref->device_index)
    return rx_fail(RX_EINVAL, "%s: %s is on %s:%d, expected %s:%d", op, what, rx_device_label(t->device),
                   t->device_index, rx_device_label(ref->device), ref->device_index);
  if (t->numel != n)
    return rx_fail(RX_EINVAL, "%s: %s has shape %s, expected %lld elements (one per row)", op, what,
                   rx_shape_str(t, buf, sizeof buf), (long long)n);
  return RX_OK;
}

int rx_logprob_slice_forward(rx_tensor *rmax, rx_tensor *rsum, rx_tensor *rsz, rx_tensor *xt, const rx_tensor *logits,
                             const rx_tensor *targets, int64_t v0, int first) {
  const char *op = "logprob_slice";
  char s[96];
  int64_t n, Vs;
  if (check_logits(op, logits, targets, v0, &n, &Vs, s, sizeof s) || rx_op_row_stat(op, rmax, "rmax", logits, n, s) ||
      rx_op_row_stat(op, xt, "xt", logits, n, s) || check_sum(op, rsum, "rsum", logits, n) ||
      check_sum(op, rsz, "rsz", logits, n))
    return RX_EINVAL;
  rx_note_write(rmax); rx_note_write(rsum); rx_note_write(rsz); rx_note_write(xt);
  switch (logits->device) {
    case RX_CPU:
      if (logits->dtype == RX_F32)
        rx_cpu_logprob_slice_forward_f32(rmax->data, rsum->data, rsz->data, xt->data, logits->data, targets->data, n,
                                         Vs, v0, first);
      else if (logits->dtype == RX_F64)
        rx_cpu_logprob_slice_forward_f64(rmax->data, rsum->data, rsz->data, xt->data, logits->data, targets->data, n,
                                         Vs, v0, first);
      else return rx_op_no_dtype(op, logits);
      return RX_OK;
    case RX_CUDA:
      return rx_cuda_logprob_slice_forward(rmax->data, rsum->data, rsz->data, xt->data, logits->data, targets->data, n,
                                           Vs, v0, first, logits->dtype);
    default:
      return rx_op_no_kernel(op, logits);
  }
}

int rx_logprob_slice_finish(rx_tensor *logp, rx_tensor *lse, rx_tensor *entropy, const rx_tensor *rmax,
                            const rx_tensor *rsum, rx_tensor *rsz, const rx_tensor *targets) {
  const char *op = "logprob_slice_finish";
  char why[160], s[96];
  if (rx_op_float(rmax, op, "rmax")) return RX_EINVAL;
  const int64_t n = rmax->numel;
  rx_shape_str(rmax, s, sizeof s);
  snprintf(why, sizeof why, "one per element of rmax %s", s);
  if (rx_op_like(logp, rmax, op, "logp", "rmax") || rx_op_numel(logp, n, op, "logp", why) ||
      rx_op_like(lse, rmax, op, "lse", "rmax") || rx_op_numel(lse, n, op, "lse", why) ||
      rx_op_like(entropy, rmax, op, "entropy", "rmax") || rx_op_numel(entropy, n, op, "entropy", why) ||
      check_sum(op, rsum, "rsum", rmax, n) || check_sum(op, rsz, "rsz", rmax, n) ||
      rx_op_index(targets, rmax, n, op, "targets", why))
    return RX_EINVAL;
  rx_note_write(logp); rx_note_write(lse); rx_note_write(entropy);
  switch (rmax->device) {
    case RX_CPU:
      if (rmax->dtype == RX_F32)
        rx_cpu_logprob_slice_finish_f32(logp->data, lse->data, entropy->data, rmax->data, rsum->data, rsz->data,
                                        targets->data, n);
      else if (rmax->dtype == RX_F64)
        rx_cpu_logprob_slice_finish_f64(logp->data, lse->data, entropy->data, rmax->data, rsum->data, rsz->data,
                                        targets->data, n);
      else return rx_op_no_dtype(op, rmax);
      return RX_OK;
    case RX_CUDA:
      if (rmax->dtype != RX_F32) return rx_fail(RX_EINVAL, "%s: statistics on cuda are f32, rmax is %s", op,
                                                rx_dtype_name(rmax->dtype));
      return rx_cuda_logprob_slice_finish(logp->data, lse->data, entropy->data, rmax->data, rsum->data, rsz->data,
                                          targets->data, n);
    default:
      return rx_op_no_kernel(op, rmax);
  }
}

int rx_logprob_slice_backward(rx_tensor *dlogits, const rx_tensor *dlogp, const rx_tensor *dentropy,
                              const rx_tensor *entropy, const rx_tensor *logits, const rx_tensor *targets,
                              const rx_tensor *lse, int64_t v0) {
  const char *op = "logprob_slice_backward";
  char s[96];
  int64_t n, Vs;
  if (check_logits(op, logits, targets, v0, &n, &Vs, s, sizeof s) || rx_op_row_stat(op, dlogp, "dlogp", logits, n, s) ||
      rx_op_row_stat(op, lse, "lse", logits, n, s) ||
      (dentropy && rx_op_row_stat(op, dentropy, "dentropy", logits, n, s)) ||
      (dentropy && check_sum(op, entropy, "entropy", logits, n)))
    return RX_EINVAL;
  if (rx_op_dlogits(op, dlogits, logits, n, Vs, s)) return RX_EINVAL;
  const double *H = dentropy ? entropy->data : NULL;
  rx_note_write(dlogits);
  switch (logits->device) {
    case RX_CPU:
      if (logits->dtype == RX_F32)
        rx_cpu_logprob_slice_backward_f32(dlogits->data, dlogp->data, rx_data(dentropy), H, logits->data,
                                          targets->data, lse->data, n, Vs, v0);
      else if (logits->dtype == RX_F64)
        rx_cpu_logprob_slice_backward_f64(dlogits->data, dlogp->data, rx_data(dentropy), H, logits->data,
                                          targets->data, lse->data, n, Vs, v0);
      else return rx_op_no_dtype(op, logits);
      return RX_OK;
    case RX_CUDA:
      return rx_cuda_logprob_slice_backward(dlogits->data, dlogp->data, rx_data(dentropy), H, logits->data,
                                            targets->data, lse->data, n, Vs, v0, logits->dtype);
    default:
      return rx_op_no_kernel(op, logits);
  }
}
