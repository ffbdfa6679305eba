/* engine_ops.h: op entries the engine uses that remax.h does not publish (their buffers are the
 * model's and the optimizer's internals): the head's vocabulary slices and the optimizer's
 * element-wise kernels. Like every op, each checks its arguments and switches once on the
 * device; model/, generate/ and optim/ reach kernels only through these and remax.h's ops. */
#ifndef RX_ENGINE_OPS_H
#define RX_ENGINE_OPS_H
#include "internal.h"

/* ---- the head over a slice of the vocabulary (engine/model/head.c; cpu/logprob.inc,
 * cuda/logprob_slice.cu). logits [n, Vs] hold columns [v0, v0 + Vs) of n rows; rmax, xt, logp,
 * lse, entropy, dlogp and dentropy have one value per row in the statistics dtype (rx_acc_dtype
 * of the logits'), rsum and rsz one f64 per row on every device; targets i32, one per row (< 0:
 * padding). Targets are not range-checked here (the model checked its tokens). */
/* Folds the slice into each row's running max rmax, rsum = sum exp(x - rmax) and rsz = sum
 * exp(x - rmax) (x - rmax) (first: the rows' first slice), and stores the target's logit in xt
 * when the target lies in the slice. */
int rx_logprob_slice_forward(rx_tensor *rmax, rx_tensor *rsum, rx_tensor *rsz, rx_tensor *xt, const rx_tensor *logits,
                             const rx_tensor *targets, int64_t v0, int first);
/* After the last slice: lse, logp = xt - lse (in place over xt: logp may be xt; 0 for padding)
 * and entropy; rsz then holds the entropy in f64 for the backward. */
int rx_logprob_slice_finish(rx_tensor *logp, rx_tensor *lse, rx_tensor *entropy, const rx_tensor *rmax,
                            const rx_tensor *rsum, rx_tensor *rsz, const rx_tensor *targets);
/* dlogits = dlogp (onehot - p) (- dentropy p (log p + H) when dentropy is given, H = the f64
 * entropy that finish left in rsz); dlogits may be logits (in place). */
int rx_logprob_slice_backward(rx_tensor *dlogits, const rx_tensor *dlogp, const rx_tensor *dentropy,
                              const rx_tensor *entropy, const rx_tensor *logits, const rx_tensor *targets,
                              const rx_tensor *lse, int64_t v0);

/* ---- the optimizer (engine/optim/adamw.c; cpu/adamw.c, cuda/adamw.cu). The caller checked the
 * tensors (contiguous, same numel and device). */
/* AdamW on one tensor or flat buffer: m = beta1 m + (1 - beta1) g, v = beta2 v + (1 - beta2) g^2,
 * p = p shrink - lr / bc1 * m / (sqrt(v) / sqrt_bc2 + eps). CPU: f32 or f64 params with moments
 * of their dtype, or f64 params with f32 moments; CUDA: f32 throughout. work, when not NULL, is the
 * bf16 working copy of an f32 param (element i at element i), rounded from the new param in the
 * same pass. */
int rx_adamw_update(rx_tensor *param, const rx_tensor *grad, rx_tensor *m, rx_tensor *v, void *work, double lr,
                    double beta1, double beta2, double eps, double shrink, double bc1, double sqrt_bc2);
/* total = the sum of squares of every element of the n tensors, in double (each device's share
 * summed there in a fixed order and read back once). */
int rx_sum_squares(const rx_tensor *const *xs, int64_t n, double *total);

/* ---- decoding's matmul (engine/model/linear.c, generate/generate.c): rx_matmul_forward with every
 * row computed as it would be alone, whatever the number of rows (cpu.h: the decode kernels in
 * blocks of 48 rows, never a GEMM whose kernel depends on the row count), so that a row's tokens
 * do not depend on the rows decoding beside it. On cuda it is rx_matmul_forward. */
int rx_matmul_forward_rows(rx_tensor *out, const rx_tensor *inp, const rx_tensor *weight, const rx_tensor *bias);

/* ---- LoRA's dropout (engine/model/lora.c; cpu/dropout.c, cuda/dropout.cu). u holds uniform
 * draws in [0, 1), one per element of x: f32 (on the CPU also x's dtype; u may be xd, the draws
 * made in place). f = u >= p ? 1 / (1 - p) : 0; xd = x * f, and dy *= f when dy is given. */
int rx_dropout_apply(rx_tensor *xd, const rx_tensor *x, const rx_tensor *u, double p, rx_tensor *dy);

#endif
