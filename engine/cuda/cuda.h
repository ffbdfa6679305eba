/* cuda/cuda.h: the CUDA backend as the rest of the engine sees it (internal, not public API).
 *
 * No CUDA types cross this header: engine C files include it whether or not remax was built with
 * CUDA. With a toolkit the functions come from engine/cuda/<op>.cu; without one from
 * engine/cuda/none.c, where each fails with RX_EDEVICE ("built without CUDA"). So ops switch on
 * the device (`case RX_CUDA: return rx_cuda_<op>(...)`) with no #ifdef anywhere else.
 *
 * Kernel launchers mirror their CPU twins in engine/cpu/cpu.h: outputs first, gradients named
 * d<name>, sizes last, then the tensors' dtype (RX_F32 or RX_BF16; all float tensors of a call
 * share it, except statistics and parameter gradients, see rx_acc_dtype in ops/ops.h, which are
 * f32 on the GPU). Pointers are device pointers. Launchers queue work on remax's one stream and
 * return at once; an error (bad launch, a failed CUDA or cuBLAS call) comes back as an rx_fail
 * message naming the call, the op and the sizes. REMAX_CUDA_SYNC=1 synchronises after every
 * launch so that a kernel's fault is reported by the op that caused it. */
#ifndef RX_CUDA_H
#define RX_CUDA_H
#include <stddef.h>
#include <stdint.h>
#include "remax.h"

/* ---- device, memory, copies (device.cu) */
int rx_cuda_device_count(void);
/* Device memory from the caching allocator: *handle identifies the piece for rx_cuda_release.
 * Fails with RX_ENOMEM naming `what`, the bytes asked for and the bytes free. Never managed memory. */
int rx_cuda_malloc(void **ptr, void **handle, size_t bytes, const char *what);
void rx_cuda_release(void *handle);
/* Zero `bytes` at ptr (queued on the stream). */
int rx_cuda_memset0(void *ptr, size_t bytes);
/* dst = src for any pair of devices and dtypes (same numel; either may be strided). */
int rx_cuda_copy(rx_tensor *dst, const rx_tensor *src);
/* t = value for a contiguous device tensor of any dtype. */
int rx_cuda_fill(rx_tensor *t, double value);
/* First row r in [0, n) whose idx[r] lies outside [0, limit) (negatives skipped when
 * allow_negative), or -1; written to *bad. Synchronises (the answer decides an error message). */
int rx_cuda_first_bad_index(int64_t *bad, int32_t *bad_value, const int32_t *idx, int64_t n, int64_t limit,
                            int allow_negative);

/* ---- kernels (engine/cuda/<op>.cu), the twins of engine/cpu/<op> */
int rx_cuda_add(void *out, const void *a, const void *b, int64_t n, int32_t dtype);
int rx_cuda_dropout(void *xd, const void *x, const float *u, int64_t n, double p, void *dy, int32_t dtype);
int rx_cuda_swiglu_forward(void *out, const void *gate, const void *up, int64_t n, int32_t dtype);
int rx_cuda_swiglu_backward(void *dgate, void *dup, const void *dout, const void *gate, const void *up, int64_t n,
                            int32_t dtype);
/* rstd and dweight are f32. */
int rx_cuda_rmsnorm_forward(void *out, float *rstd, const void *inp, const void *weight, int64_t N, int64_t C,
                            float eps, int32_t dtype);
int rx_cuda_rmsnorm_backward(void *dinp, float *dweight, const void *dout, const void *inp, const void *weight,
                             const float *rstd, int64_t N, int64_t C, int32_t dtype);
int rx_cuda_rope_forward(void *out, const void *inp, const int32_t *positions, int64_t P, int64_t H, int64_t D,
                         const double *inv_freq, int32_t dtype);
int rx_cuda_rope_backward(void *dinp, const void *dout, const int32_t *positions, int64_t P, int64_t H, int64_t D,
                          const double *inv_freq, int32_t dtype);
/* dweight is f32 [V, C], accumulated (+=) without atomics. */
int rx_cuda_embedding_forward(void *out, const int32_t *tokens, const void *weight, int64_t N, int64_t C,
                              int32_t dtype);
int rx_cuda_embedding_backward(float *dweight, const void *dout, const int32_t *tokens, int64_t N, int64_t V,
                               int64_t C, int32_t dtype);
/* out[N,OC] = inp[N,C] W[OC,C]^T (+ bias): cuBLAS, bf16 in / f32 accumulate, or f32 with TF32 off.
 * dweight and dbias are f32 and accumulated; dinp overwritten. */
int rx_cuda_matmul_forward(void *out, const void *inp, const void *weight, const void *bias, int64_t N, int64_t C,
                           int64_t OC, int32_t dtype);
int rx_cuda_matmul_backward(void *dinp, float *dweight, float *dbias, const void *dout, const void *inp,
                            const void *weight, int64_t N, int64_t C, int64_t OC, int32_t dtype);
/* logits in dtype; logp, lse, entropy, dlogp f32. dlogits may equal logits. */
int rx_cuda_logprob_forward(float *logp, float *lse, float *entropy, const void *logits, const int32_t *targets,
                            int64_t N, int64_t V, int32_t dtype);
int rx_cuda_logprob_backward(void *dlogits, const float *dlogp, const void *logits, const int32_t *targets,
                             const float *lse, int64_t N, int64_t V, int32_t dtype);
/* The head over a vocabulary slice [v0, v0 + Vs) of N rows (logprob_slice.cu), the twins of
 * cpu/logprob.inc's rx_cpu_logprob_slice_*: logits and dlogits in dtype, the per-row statistics
 * (rmax, xt, logp, lse, entropy, dlogp, dentropy) f32, the running sums rsum and rsz f64. */
int rx_cuda_logprob_slice_forward(float *rmax, double *rsum, double *rsz, float *xt, const void *logits,
                                  const int32_t *targets, int64_t N, int64_t Vs, int64_t v0, int first, int32_t dtype);
int rx_cuda_logprob_slice_finish(float *logp, float *lse, float *entropy, const float *rmax, const double *rsum,
                                 double *rsz, const int32_t *targets, int64_t N);
int rx_cuda_logprob_slice_backward(void *dlogits, const float *dlogp, const float *dentropy, const double *entropy,
                                   const void *logits, const int32_t *targets, const float *lse, int64_t N, int64_t Vs,
                                   int64_t v0, int32_t dtype);
/* Sizes of one attention call, as engine/cpu/attention.h's rx_attn_dims (repeated here so that this
 * header stands alone). lse is f32 [B,H,Tq]. */
typedef struct rx_cuda_attn_dims {
  int64_t B, Tq, Tk, H, KV, D;
  int64_t k_batch_stride, v_batch_stride;
  double scale;
  const int32_t *cu_seqlens;   /* NULL, or packed rows' boundaries [S+1] on the device (B = 1, Tq = Tk) */
  int64_t S;
} rx_cuda_attn_dims;
enum { RX_CUDA_ATTN_MAX_D = 256 };
int rx_cuda_attention_forward(void *out, float *lse, const void *q, const void *k, const void *v, const int32_t *mask,
                              const rx_cuda_attn_dims *dims, int32_t dtype);
int rx_cuda_attention_backward(void *dq, void *dk, void *dv, const void *dout, const void *q, const void *k,
                               const void *v, const void *out, const float *lse, const int32_t *mask,
                               const rx_cuda_attn_dims *dims, int32_t dtype);
/* The sampler on the device (sample.cu), the twin of engine/generate's: one row of logits [n, V]
 * per place and its settings; token i32 [n] (-1: sampled row without a finite logit), logprob
 * f32 [n] (log p of the token at temperature 1), prob f32 [n, V] scratch. u comes from Philox
 * (seed, key, position) as rx_sample_uniform. A row with repetition_penalty != 1 reads its tokens
 * so far from seen[seen_row * seen_stride + (0 .. num_seen)], samples from a penalised copy of its
 * logits in penalized f32 [n, V], and appends the token it picks at num_seen (when < seen_stride);
 * seen and penalized may be NULL when no row has a penalty. */
typedef struct rx_cuda_sample_row {
  double temperature, top_p, min_p;
  int32_t top_k;
  float repetition_penalty;   /* 1 = off */
  uint64_t key;
  int64_t position;
  int64_t seen_row, num_seen;
} rx_cuda_sample_row;
int rx_cuda_sample(int32_t *token, float *logprob, float *prob, float *penalized, int32_t *seen, int64_t seen_stride,
                   const void *logits, const rx_cuda_sample_row *rows, uint64_t seed, int64_t n, int64_t V,
                   int32_t dtype);
/* Attention of one query per row (dims->Tq == 1) over a KV cache, split along the cache (flash
 * decoding, decode_attention.cu); the same contract as rx_cuda_attention_forward for groups of
 * at most RX_CUDA_DECODE_MAX_GROUP query heads per kv head. */
enum { RX_CUDA_DECODE_MAX_GROUP = 16 };
int rx_cuda_decode_attention(void *out, float *lse, const void *q, const void *k, const void *v, const int32_t *mask,
                             const rx_cuda_attn_dims *dims, int32_t dtype);
/* The graph-stable decode attention: row b attends to keys s < lens[b] (i32 [B] on the device)
 * with mask 1 (mask rows of dims->Tk, the cache's length), its query at lens[b] - 1; part is
 * scratch of rx_cuda_decode_attention_scratch(dims) floats. */
int64_t rx_cuda_decode_attention_scratch(const rx_cuda_attn_dims *dims);
int rx_cuda_decode_attention_lens(void *out, float *lse, const void *q, const void *k, const void *v,
                                  const int32_t *mask, const int32_t *lens, float *part, const rx_cuda_attn_dims *dims,
                                  int32_t dtype);
/* One layer's cache kc, vc [B, S, KD]: row b's new k, v [B, KD] go to slot lens[b] - 1. */
int rx_cuda_kv_append(void *kc, void *vc, const void *k, const void *v, const int32_t *lens, int64_t B, int64_t S,
                      int64_t KD, int32_t dtype);
/* CUDA graphs on remax's stream (graph.cu): begin capturing, end and instantiate (*exec), replay, free. */
int rx_cuda_graph_begin(void);
int rx_cuda_graph_end(void **exec);
int rx_cuda_graph_launch(void *exec);
void rx_cuda_graph_free(void *exec);
/* AdamW on f32 master weights, f32 grads and moments; bc1 = 1 - beta1^step, sqrt_bc2 = sqrt(1 - beta2^step);
 * work, when not NULL, is param's bf16 working copy, written in the same pass. */
int rx_cuda_adamw(float *param, const float *grad, float *m, float *v, void *work, int64_t n, double lr,
                  double beta1, double beta2, double eps, double shrink, double bc1, double sqrt_bc2);
/* sum of squares of n f32 values, in double, in a fixed order; added to *acc (device double). */
int rx_cuda_sum_squares(double *acc, const float *x, int64_t n);
int rx_cuda_scale(void *x, int64_t n, double s, int32_t dtype);   /* f32 or bf16 */
/* Scratch for the reductions: a device double, read back by rx_cuda_read_double (synchronises). */
int rx_cuda_scalar(double **acc);
int rx_cuda_read_double(double *out, const double *acc);

#endif
