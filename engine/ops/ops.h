/* ops.h: argument checks shared by the device-neutral op entry points (engine/ops/<op>.c).
 * Each op checks shapes, dtypes, devices and contiguity here, then switches once on the device.
 * All checks return RX_OK or set an error naming the op, the tensor and what was expected. */
#ifndef RX_OPS_H
#define RX_OPS_H
#include "internal.h"
#include "cuda/cuda.h"

const char *rx_device_label(int32_t device);   /* "cpu", "cuda" */
static inline void *rx_data(const rx_tensor *t) { return t ? t->data : NULL; }
/* Product of all dims but the last: the rows of a [.., C] tensor. */
int64_t rx_rows(const rx_tensor *t);
static inline int64_t rx_last(const rx_tensor *t) { return t->shape[t->ndim - 1]; }

/* RX_EDEVICE "op: no kernel for device cuda in this build". */
int rx_op_no_kernel(const char *op, const rx_tensor *t);
/* RX_EINVAL "op: no cpu kernel for dtype bf16 (f32 and f64 only)". */
int rx_op_no_dtype(const char *op, const rx_tensor *t);
/* The dtype of statistics (rstd, lse, logp, entropy, dlogp) and of parameter gradients for
 * compute dtype `dtype`: f32 for bf16 and f16 (the GPU's mixed precision), else the dtype itself. */
static inline int32_t rx_acc_dtype(int32_t dtype) { return dtype == RX_BF16 || dtype == RX_F16 ? RX_F32 : dtype; }
/* Present, contiguous, at least one dim, a float dtype. */
int rx_op_float(const rx_tensor *t, const char *op, const char *what);
/* rx_op_float, plus the dtype and device of ref (named ref_name in the message). */
int rx_op_like(const rx_tensor *t, const rx_tensor *ref, const char *op, const char *what, const char *ref_name);
/* rx_op_float, the device of ref and the dtype rx_acc_dtype(ref's dtype): for statistics and
 * parameter gradients. */
int rx_op_acc_like(const rx_tensor *t, const rx_tensor *ref, const char *op, const char *what, const char *ref_name);
/* RX_EINVAL naming the bad index (found on the device that holds idx): idx[r] outside [0, limit),
 * negatives allowed when allow_negative. `what` is "token" or "target"; `of` names the tensor
 * that sets the limit. */
int rx_op_check_index(const char *op, const rx_tensor *idx, int64_t n, int64_t limit, int allow_negative,
                      const char *what, const char *of);
/* Shape [.., cols] with `rows` rows (the product of the leading dims); why says where they come from. */
int rx_op_rows_cols(const rx_tensor *t, int64_t rows, int64_t cols, const char *op, const char *what,
                    const char *why);
/* Exactly the 1-D shape [n]. */
int rx_op_vector(const rx_tensor *t, int64_t n, const char *op, const char *what, const char *why);
/* Exactly the 2-D shape [rows, cols]. */
int rx_op_matrix(const rx_tensor *t, int64_t rows, int64_t cols, const char *op, const char *what, const char *why);
/* Exactly n elements, any shape. */
int rx_op_numel(const rx_tensor *t, int64_t n, const char *op, const char *what, const char *why);
/* An i32 index tensor on ref's device, contiguous, with n elements. */
int rx_op_index(const rx_tensor *t, const rx_tensor *ref, int64_t n, const char *op, const char *what,
                const char *why);

/* The head ops (logprob, logprob_slice). Logits: a float tensor [.., V] with V >= 1; targets: i32,
 * one per row, on the logits' device. Sets rows, V and s, the logits' shape text for messages. */
int rx_op_logits(const char *op, const rx_tensor *logits, const rx_tensor *targets, int64_t *rows, int64_t *V,
                 char *s, size_t n);
/* A per-row statistic of the head (logp, lse, entropy, dlogp, ...): one element per row of the
 * logits (shape text s), in rx_acc_dtype of their dtype, on their device. */
int rx_op_row_stat(const char *op, const rx_tensor *t, const char *what, const rx_tensor *logits, int64_t rows,
                   const char *s);
/* The logits' gradient: their dtype and device, shape [rows, V] (s: the logits' shape text). */
int rx_op_dlogits(const char *op, const rx_tensor *dlogits, const rx_tensor *logits, int64_t rows, int64_t V,
                  const char *s);

#endif
