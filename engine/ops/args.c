/* args.c: the argument checks declared in ops.h. */
#include "ops.h"
#include "cpu/cpu.h"
#include <stdio.h>

const char *rx_device_label(int32_t device) {
  switch (device) {
    case RX_CPU: return "cpu";
    case RX_CUDA: return "cuda";
  }
  return "unknown";
}

int64_t rx_rows(const rx_tensor *t) {
  int64_t r = 1;
  for (int i = 0; i + 1 < t->ndim; i++) r *= t->shape[i];
  return r;
}

int rx_op_no_kernel(const char *op, const rx_tensor *t) {
  return rx_fail(RX_EDEVICE, "%s: no kernel for device %s in this build", op, rx_device_label(t->device));
}

int rx_op_no_dtype(const char *op, const rx_tensor *t) {
  return rx_fail(RX_EINVAL, "%s: no %s kernel for dtype %s (f32 and f64 only)", op, rx_device_label(t->device),
                 rx_dtype_name(t->dtype));
}

int rx_op_float(const rx_tensor *t, const char *op, const char *what) {
  char buf[96];
  if (!t) return rx_fail(RX_EINVAL, "%s: %s is missing", op, what);
  if (t->ndim < 1) return rx_fail(RX_EINVAL, "%s: %s is a scalar, expected at least 1 dim", op, what);
  if (!rx_tensor_is_contiguous(t))
    return rx_fail(RX_EINVAL, "%s: %s %s is not contiguous", op, what, rx_shape_str(t, buf, sizeof buf));
  if (!rx_is_float_dtype(t->dtype))
    return rx_fail(RX_EINVAL, "%s: %s has dtype %s, expected a float dtype", op, what, rx_dtype_name(t->dtype));
  return RX_OK;
}

int rx_op_like(const rx_tensor *t, const rx_tensor *ref, const char *op, const char *what, const char *ref_name) {
  if (rx_op_float(t, op, what)) return RX_EINVAL;
  if (t->dtype != ref->dtype)
    return rx_fail(RX_EINVAL, "%s: %s has dtype %s, expected %s (dtype of %s)", op, what, rx_dtype_name(t->dtype),
                   rx_dtype_name(ref->dtype), ref_name);
  if (t->device != ref->device || t->device_index != ref->device_index)
    return rx_fail(RX_EINVAL, "%s: %s is on %s:%d, expected %s:%d (device of %s)", op, what,
                   rx_device_label(t->device), t->device_index, rx_device_label(ref->device), ref->device_index,
                   ref_name);
  return RX_OK;
}

int rx_op_acc_like(const rx_tensor *t, const rx_tensor *ref, const char *op, const char *what, const char *ref_name) {
  if (rx_op_float(t, op, what)) return RX_EINVAL;
  const int32_t want = rx_acc_dtype(ref->dtype);
  if (t->dtype != want)
    return rx_fail(RX_EINVAL, "%s: %s has dtype %s, expected %s (for %s of dtype %s)", op, what, rx_dtype_name(t->dtype),
                   rx_dtype_name(want), ref_name, rx_dtype_name(ref->dtype));
  if (t->device != ref->device || t->device_index != ref->device_index)
    return rx_fail(RX_EINVAL, "%s: %s is on %s:%d, expected %s:%d (device of %s)", op, what,
                   rx_device_label(t->device), t->device_index, rx_device_label(ref->device), ref->device_index,
                   ref_name);
  return RX_OK;
}

int rx_op_check_index(const char *op, const rx_tensor *idx, int64_t n, int64_t limit, int allow_negative,
                      const char *what, const char *of) {
  int64_t bad = -1;
  int32_t value = 0;
  if (idx->device == RX_CUDA) {
    int rc = rx_cuda_first_bad_index(&bad, &value, idx->data, n, limit, allow_negative);
    if (rc) return rc;
  } else {
    bad = rx_cpu_first_bad_index(idx->data, n, limit, allow_negative);
    if (bad >= 0) value = ((const int32_t *)idx->data)[bad];
  }
  if (bad < 0) return RX_OK;
  return rx_fail(RX_EINVAL, "%s: %s %d at row %lld is outside the vocabulary [0, %lld) of %s%s", op, what, value,
                 (long long)bad, (long long)limit, of, allow_negative ? " (negative targets mark padding)" : "");
}

int rx_op_rows_cols(const rx_tensor *t, int64_t rows, int64_t cols, const char *op, const char *what,
                    const char *why) {
  char buf[96];
  if (t->ndim < 1 || rx_last(t) != cols || rx_rows(t) != rows)
    return rx_fail(RX_EINVAL, "%s: %s has shape %s, expected %lld rows of %lld (%s)", op, what,
                   rx_shape_str(t, buf, sizeof buf), (long long)rows, (long long)cols, why);
  return RX_OK;
}

int rx_op_vector(const rx_tensor *t, int64_t n, const char *op, const char *what, const char *why) {
  char buf[96];
  if (t->ndim != 1 || t->shape[0] != n)
    return rx_fail(RX_EINVAL, "%s: %s has shape %s, expected [%lld] (%s)", op, what, rx_shape_str(t, buf, sizeof buf),
                   (long long)n, why);
  return RX_OK;
}

int rx_op_matrix(const rx_tensor *t, int64_t rows, int64_t cols, const char *op, const char *what, const char *why) {
  char buf[96];
  if (t->ndim != 2 || t->shape[0] != rows || t->shape[1] != cols)
    return rx_fail(RX_EINVAL, "%s: %s has shape %s, expected [%lld,%lld] (%s)", op, what,
                   rx_shape_str(t, buf, sizeof buf), (long long)rows, (long long)cols, why);
  return RX_OK;
}

int rx_op_numel(const rx_tensor *t, int64_t n, const char *op, const char *what, const char *why) {
  char buf[96];
  if (t->numel != n)
    return rx_fail(RX_EINVAL, "%s: %s has shape %s (%lld elements), expected %lld elements (%s)", op, what,
                   rx_shape_str(t, buf, sizeof buf), (long long)t->numel, (long long)n, why);
  return RX_OK;
}

int rx_op_index(const rx_tensor *t, const rx_tensor *ref, int64_t n, const char *op, const char *what,
                const char *why) {
  char buf[96];
  if (!t) return rx_fail(RX_EINVAL, "%s: %s is missing", op, what);
  if (t->dtype != RX_I32) return rx_fail(RX_EINVAL, "%s: %s has dtype %s, expected i32", op, what, rx_dtype_name(t->dtype));
  if (!rx_tensor_is_contiguous(t))
    return rx_fail(RX_EINVAL, "%s: %s %s is not contiguous", op, what, rx_shape_str(t, buf, sizeof buf));
  if (t->device != ref->device || t->device_index != ref->device_index)
    return rx_fail(RX_EINVAL, "%s: %s is on %s:%d, expected %s:%d", op, what, rx_device_label(t->device),
                   t->device_index, rx_device_label(ref->device), ref->device_index);
  return rx_op_numel(t, n, op, what, why);
}

int rx_op_logits(const char *op, const rx_tensor *logits, const rx_tensor *targets, int64_t *rows, int64_t *V,
                 char *s, size_t n) {
  char why[160];
  if (rx_op_float(logits, op, "logits")) return RX_EINVAL;
  rx_shape_str(logits, s, n);
  *rows = rx_rows(logits);
  *V = rx_last(logits);
  if (*V < 1) return rx_fail(RX_EINVAL, "%s: logits %s have an empty vocabulary (last) dim", op, s);
  snprintf(why, sizeof why, "one per row of logits %s", s);
  return rx_op_index(targets, logits, *rows, op, "targets", why);
}

int rx_op_row_stat(const char *op, const rx_tensor *t, const char *what, const rx_tensor *logits, int64_t rows,
                   const char *s) {
  char why[160];
  snprintf(why, sizeof why, "one per row of logits %s", s);
  return rx_op_acc_like(t, logits, op, what, "logits") || rx_op_numel(t, rows, op, what, why) ? RX_EINVAL : RX_OK;
}

int rx_op_dlogits(const char *op, const rx_tensor *dlogits, const rx_tensor *logits, int64_t rows, int64_t V,
                  const char *s) {
  char why[160];
  snprintf(why, sizeof why, "shape of logits %s", s);
  return rx_op_like(dlogits, logits, op, "dlogits", "logits") || rx_op_rows_cols(dlogits, rows, V, op, "dlogits", why)
             ? RX_EINVAL : RX_OK;
}
