/* cpu.h: the CPU kernels behind engine/ops (internal, not part of the public API).
 *
 * llm.c-style layer functions over raw contiguous pointers: outputs first, gradients named
 * d<name>, sizes last (int64_t). Each kernel body is written once in engine/cpu/<op>.inc and
 * instantiated for float (_f32) and double (_f64) by engine/cpu/<op>.c through instantiate.h.
 * Argument checks (shapes, dtypes, token ranges) happen in engine/ops before these are called.
 * Conventions: input gradients (dinp, dgate, ...) are overwritten, parameter gradients
 * (dweight, dbias) accumulated; a NULL gradient or optional output pointer is skipped. */
#ifndef RX_CPU_H
#define RX_CPU_H
#include <math.h>
#include <stdint.h>
#include <string.h>
#include "profile.h"
#include "fastmath.h"   /* rx_exp_f32 */

static inline double rx_exp_f64(double x) { return exp(x); }
static inline float rx_log_f32(float x) { return logf(x); }
static inline double rx_log_f64(double x) { return log(x); }

/* First row r in [0, n) whose index idx[r] lies outside [0, limit), skipping negative values when
 * allow_negative (padding targets); -1 when all are valid. */
int64_t rx_cpu_first_bad_index(const int32_t *idx, int64_t n, int64_t limit, int allow_negative);

/* bf16 -> f32: the bf16 bits are the high half of the f32 (exact). */
static inline float rx_cpu_bf16_to_f32(uint16_t h) {
  union { uint32_t u; float f; } v;
  v.u = (uint32_t)h << 16;
  return v.f;
}

/* A kernel's scratch buffer (declare it _Thread_local: the calling thread's), grown to the largest
 * size asked and kept, never one allocation per call: rx_cpu_scratch_get gives at least `bytes`,
 * 64-byte aligned (the old contents not kept), or NULL when out of memory (matmul_bf16.c). */
typedef struct { void *p; size_t bytes; } rx_cpu_scratch;
void *rx_cpu_scratch_get(rx_cpu_scratch *s, size_t bytes);

/* f32 -> bf16, nearest even, NaN kept (quiet): rx_f32_to_bf16 of core/dtype.c, inline here so
 * that the kernels' loops vectorise. */
static inline uint16_t rx_cpu_f32_to_bf16(float f) {
  union { uint32_t u; float f; } v;
  v.f = f;
  if ((v.u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((v.u >> 16) | 0x40);
  return (uint16_t)((v.u + 0x7fffu + ((v.u >> 16) & 1u)) >> 16);
}

/* Weights stored in bf16, inputs and outputs f32 (matmul_bf16.c): out = inp W^T (+ bias) with the
 * inputs rounded to bf16 (the bf16 dot product: exact products, f32 sums), on every path and CPU;
 * dinp = dout W (backward through a frozen weight, dout not rounded); an embedding gather. Where
 * the CPU has AVX-512 BF16 up to RX_BF16_DOT_ROWS rows take vdpbf16ps (matmul_bf16dot.c);
 * elsewhere up to RX_BF16_FEW_ROWS rows take a kernel that widens the weights in registers; more
 * rows widen blocks of W for sgemm.
 * RX_BF16_DOT_ROWS, measured with the SkylakeX OpenBLAS kernels, 2 threads, an AVX-512 BF16
 * Xeon: the dot kernel ran 130-150 GFLOP/s at every row count, sgemm on widened blocks 110-150
 * at 49-64 rows and 145-250 from 96 rows up (C = 896, OC = 896 and 4864); at C = 256 sgemm led
 * from 49 rows. So a 64-token prefill keeps the dot kernel and a training-sized forward
 * (thousands of rows: a bf16 model's GEMMs, a frozen reference) goes to sgemm.
 * The matmuls return 0 when out of memory for their buffer (writing nothing), else 1. */
enum { RX_BF16_FEW_ROWS = 48, RX_BF16_DOT_ROWS = 64 };
int rx_cpu_matmul_forward_f32_bf16(float *out, const float *inp, const uint16_t *weight, const float *bias, int64_t N,
                                   int64_t C, int64_t OC);
/* The bf16 matmul with every row computed as it would be alone, for any number of rows (a decode
 * step): the dot-product kernel where the CPU has it, else the widening register tiles, in blocks
 * of 48 rows, never sgemm. Returns 0 when out of memory. */
int rx_cpu_matmul_rows_forward_f32_bf16(float *out, const float *inp, const uint16_t *weight, const float *bias,
                                        int64_t N, int64_t C, int64_t OC);
int rx_cpu_matmul_dinp_f32_bf16(float *dinp, const float *dout, const uint16_t *weight, int64_t N, int64_t C,
                                int64_t OC);
/* The same few-rows kernel on f32 weights (the decode path of builds without AVX-512): returns 0,
 * writing nothing, for more than RX_BF16_FEW_ROWS rows or C = 0. */
int rx_cpu_matmul_rows_any_f32(float *out, const float *inp, const float *weight, const float *bias, int64_t N,
                               int64_t C, int64_t OC);
/* The AVX-512 BF16 kernel (matmul_bf16dot.c), compiled whatever the build's -march: a decode
 * step's rows in one pass over W, more rows (a prefill) in blocks of RX_BF16_FEW_ROWS. 1 when it
 * computed out, 0 where it does not apply (writing nothing: N = 0, C = 0, or rx_cpu_bf16_dot() is
 * 0), -1 when out of memory for the rounded inputs. */
int rx_cpu_matmul_rows_bf16dot(float *out, const float *inp, const uint16_t *weight, const float *bias, int64_t N,
                               int64_t C, int64_t OC);
/* 1 when the CPU has the AVX-512 BF16 dot product and the build can use it (asked once; the
 * environment variable REMAX_NO_BF16_DOT=1 turns it off); rx_cpu_bf16_dot_set(0) turns it off,
 * (1) back to what the CPU allows (tests and benchmarks compare both paths). */
int rx_cpu_bf16_dot(void);
void rx_cpu_bf16_dot_set(int on);
void rx_cpu_embedding_forward_f32_bf16(float *out, const int32_t *tokens, const uint16_t *weight, int64_t N, int64_t C);

/* bf16 GEMM through oneDNN (dnnl.c; built when CMake finds libdnnl): c[M,N] = a[M,K] b[K,N]
 * (+ c when accumulate), a and b bf16 with strides {row, column} (a transpose is a stride), c f32
 * with rows ldc apart, f32 sums. Returns 1 when done, 0 when oneDNN is absent or failed (nothing
 * written). rx_cpu_dnnl: 1 when it can run here (oneDNN built in, a CPU with AVX-512);
 * rx_cpu_dnnl_kernel: its version and the instruction set it runs bf16 on, or why none. */
int rx_cpu_dnnl_gemm_bf16(float *c, int64_t ldc, const uint16_t *a, const int64_t sa[2], const uint16_t *b,
                          const int64_t sb[2], int64_t M, int64_t N, int64_t K, int accumulate);
int rx_cpu_dnnl(void);
const char *rx_cpu_dnnl_kernel(void);

/* The GEMMs of a linear layer with a bf16 weight and f32 activations (bf16_gemm.c): a bf16
 * model's working weights in training, a frozen model's bf16 storage. forward: out = round(inp)
 * W^T (+ bias); dinp = dout W; dweight += dout^T inp (f32). Each returns 1, or 0 when out of
 * memory or oneDNN failed. The kernel is chosen once per process (REMAX_BF16_GEMM=onednn|sgemm
 * overrides; rx_cpu_bf16_gemm_reset makes the next call choose again); _text names it and why,
 * _pays is 1 where bf16 GEMMs are expected to outrun f32 ones (AMX, AMD's AVX-512 BF16). */
enum { RX_BF16_GEMM_SGEMM = 0, RX_BF16_GEMM_ONEDNN = 1 };
int rx_cpu_bf16_gemm_kind(void);
void rx_cpu_bf16_gemm_reset(void);
int rx_cpu_bf16_gemm_pays(void);
const char *rx_cpu_bf16_gemm_text(void);
int rx_cpu_bf16_gemm_forward(float *out, const float *inp, const uint16_t *weight, const float *bias, int64_t N,
                             int64_t C, int64_t OC);
int rx_cpu_bf16_gemm_dinp(float *dinp, const float *dout, const uint16_t *weight, int64_t N, int64_t C, int64_t OC);
int rx_cpu_bf16_gemm_dweight(float *dweight, const float *dout, const float *inp, int64_t N, int64_t C, int64_t OC);

/* C[M,N] = op(A) op(B) + beta C, row-major (op: transposed when trans_*), on OpenBLAS with K fed in
 * slices of a fixed size, so that every output sums the same slices in the same order whatever
 * the thread count (blas.c says why). Every GEMM of the engine outside an OpenMP region goes
 * through these. */
void rx_cpu_sgemm(int trans_a, int trans_b, int64_t M, int64_t N, int64_t K, const float *A, int64_t lda,
                  const float *B, int64_t ldb, float beta, float *C, int64_t ldc);
void rx_cpu_dgemm(int trans_a, int trans_b, int64_t M, int64_t N, int64_t K, const double *A, int64_t lda,
                  const double *B, int64_t ldb, double beta, double *C, int64_t ldc);

/* matmul: out[N,OC] = inp[N,C] W[OC,C]^T (+ bias[OC]); OpenBLAS GEMM, or for a few rows a
 * kernel that reads W in place (matmul_rows.c: out = inp W^T + bias; returns 0, writing nothing,
 * where it does not apply: no AVX-512, more than 48 rows, C = 0). */
int rx_cpu_matmul_rows_f32(float *out, const float *inp, const float *weight, const float *bias, int64_t N, int64_t C,
                           int64_t OC);
void rx_cpu_matmul_forward_f32(float *out, const float *inp, const float *weight, const float *bias,
                               int64_t N, int64_t C, int64_t OC);
void rx_cpu_matmul_forward_f64(double *out, const double *inp, const double *weight, const double *bias,
                               int64_t N, int64_t C, int64_t OC);
/* The same with every row computed as it would be alone, for any number of rows (a decode step: a
 * row's bits must not depend on the rows decoding beside it, nor on how many): the decode kernels
 * in blocks of up to 48 rows for f32 (matmul_rows.c, or the register tiles of matmul_bf16.c
 * without AVX-512), a dot product per output for f64. */
void rx_cpu_matmul_rows_forward_f32(float *out, const float *inp, const float *weight, const float *bias, int64_t N,
                                    int64_t C, int64_t OC);
void rx_cpu_matmul_rows_forward_f64(double *out, const double *inp, const double *weight, const double *bias,
                                    int64_t N, int64_t C, int64_t OC);
void rx_cpu_matmul_backward_f32(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                                const float *weight, int64_t N, int64_t C, int64_t OC);
void rx_cpu_matmul_backward_f64(double *dinp, double *dweight, double *dbias, const double *dout,
                                const double *inp, const double *weight, int64_t N, int64_t C, int64_t OC);

/* embedding: out[N,C] = weight[tokens[n], :]; backward scatter-adds into dweight[V,C]. */
void rx_cpu_embedding_forward_f32(float *out, const int32_t *tokens, const float *weight, int64_t N, int64_t C);
void rx_cpu_embedding_forward_f64(double *out, const int32_t *tokens, const double *weight, int64_t N, int64_t C);
void rx_cpu_embedding_backward_f32(float *dweight, const float *dout, const int32_t *tokens, int64_t N, int64_t C);
void rx_cpu_embedding_backward_f64(double *dweight, const double *dout, const int32_t *tokens, int64_t N, int64_t C);

/* rmsnorm over C: out = inp * rstd * weight, rstd[N] = 1 / sqrt(mean(inp^2) + eps). */
void rx_cpu_rmsnorm_forward_f32(float *out, float *rstd, const float *inp, const float *weight, int64_t N,
                                int64_t C, float eps);
void rx_cpu_rmsnorm_forward_f64(double *out, double *rstd, const double *inp, const double *weight, int64_t N,
                                int64_t C, double eps);
void rx_cpu_rmsnorm_backward_f32(float *dinp, float *dweight, const float *dout, const float *inp,
                                 const float *weight, const float *rstd, int64_t N, int64_t C);
void rx_cpu_rmsnorm_backward_f64(double *dinp, double *dweight, const double *dout, const double *inp,
                                 const double *weight, const double *rstd, int64_t N, int64_t C);

/* rope (rotate-half) on P rows of H heads of size D, one position per row. out may alias inp.
 * The backward is the inverse rotation. D is even and at most RX_CPU_ROPE_MAX_D. */
enum { RX_CPU_ROPE_MAX_D = 1024 };
void rx_cpu_rope_forward_f32(float *out, const float *inp, const int32_t *positions, int64_t P, int64_t H,
                             int64_t D, const double *inv_freq);
void rx_cpu_rope_forward_f64(double *out, const double *inp, const int32_t *positions, int64_t P, int64_t H,
                             int64_t D, const double *inv_freq);
void rx_cpu_rope_backward_f32(float *dinp, const float *dout, const int32_t *positions, int64_t P, int64_t H,
                              int64_t D, const double *inv_freq);
void rx_cpu_rope_backward_f64(double *dinp, const double *dout, const int32_t *positions, int64_t P, int64_t H,
                              int64_t D, const double *inv_freq);

/* swiglu: out = silu(gate) * up over n elements. */
void rx_cpu_swiglu_forward_f32(float *out, const float *gate, const float *up, int64_t n);
void rx_cpu_swiglu_forward_f64(double *out, const double *gate, const double *up, int64_t n);
void rx_cpu_swiglu_backward_f32(float *dgate, float *dup, const float *dout, const float *gate, const float *up,
                                int64_t n);
void rx_cpu_swiglu_backward_f64(double *dgate, double *dup, const double *dout, const double *gate,
                                const double *up, int64_t n);

/* add: out = a + b over n elements; out may alias a or b. */
void rx_cpu_dropout_f32(float *xd, const float *x, const float *u, int64_t n, double p, float *dy);
void rx_cpu_dropout_f64(double *xd, const double *x, const double *u, int64_t n, double p, double *dy);
void rx_cpu_add_f32(float *out, const float *a, const float *b, int64_t n);
void rx_cpu_add_f64(double *out, const double *a, const double *b, int64_t n);

/* logsoftmax over V for N rows; backward dinp = dout - exp(out) * sum(dout). */
void rx_cpu_logsoftmax_forward_f32(float *out, const float *inp, int64_t N, int64_t V);
void rx_cpu_logsoftmax_forward_f64(double *out, const double *inp, int64_t N, int64_t V);
void rx_cpu_logsoftmax_backward_f32(float *dinp, const float *dout, const float *out, int64_t N, int64_t V);
void rx_cpu_logsoftmax_backward_f64(double *dinp, const double *dout, const double *out, int64_t N, int64_t V);

/* logprob head on N rows of V logits; targets < 0 are padding (logp 0, zero gradient).
 * lse and entropy may be NULL. dlogits may equal logits (in place). */
void rx_cpu_logprob_forward_f32(float *logp, float *lse, float *entropy, const float *logits,
                                const int32_t *targets, int64_t N, int64_t V);
void rx_cpu_logprob_forward_f64(double *logp, double *lse, double *entropy, const double *logits,
                                const int32_t *targets, int64_t N, int64_t V);
void rx_cpu_logprob_backward_f32(float *dlogits, const float *dlogp, const float *logits, const int32_t *targets,
                                 const float *lse, int64_t N, int64_t V);
void rx_cpu_logprob_backward_f64(double *dlogits, const double *dlogp, const double *logits,
                                 const int32_t *targets, const double *lse, int64_t N, int64_t V);
/* The same with an entropy gradient: adds dentropy[n] * d H_n / d logits[n,:]. */
void rx_cpu_logprob_entropy_backward_f32(float *dlogits, const float *dlogp, const float *dentropy, const float *logits,
                                         const int32_t *targets, const float *lse, int64_t N, int64_t V);
void rx_cpu_logprob_entropy_backward_f64(double *dlogits, const double *dlogp, const double *dentropy,
                                         const double *logits, const int32_t *targets, const double *lse, int64_t N,
                                         int64_t V);

/* The optimizer (adamw.c): AdamW with step_size = lr / (1 - beta1^step), sqrt_bc2 = sqrt(1 -
 * beta2^step) and shrink = 1 - lr * weight_decay (decoupled decay); f32 or f64 params with moments
 * of their dtype, or f64 params with f32 moments (_f64_m32); _f32 also writes P's bf16 working copy W
 * in the same pass when W is not NULL. Sums of squares in double. */
void rx_cpu_adamw_f32(float *P, const float *G, float *M, float *V, uint16_t *W, int64_t n, double step_size,
                      double beta1, double beta2, double eps, double shrink, double sqrt_bc2);
void rx_cpu_adamw_f64(double *P, const double *G, double *M, double *V, int64_t n, double step_size, double beta1,
                      double beta2, double eps, double shrink, double sqrt_bc2);
void rx_cpu_adamw_f64_m32(double *P, const double *G, float *M, float *V, int64_t n, double step_size, double beta1,
                          double beta2, double eps, double shrink, double sqrt_bc2);
double rx_cpu_sum_squares_f32(const float *x, int64_t n);
double rx_cpu_sum_squares_f64(const double *x, int64_t n);
void rx_cpu_scale_f32(float *x, int64_t n, float s);
void rx_cpu_scale_f64(double *x, int64_t n, double s);

/* The head over vocabulary slices [v0, v0 + Vs) of N rows (engine/model/head.c); logprob.inc. */
void rx_cpu_logprob_slice_forward_f32(float *rmax, double *rsum, double *rsz, float *xt, const float *logits,
                                      const int32_t *targets, int64_t N, int64_t Vs, int64_t v0, int first);
void rx_cpu_logprob_slice_forward_f64(double *rmax, double *rsum, double *rsz, double *xt, const double *logits,
                                      const int32_t *targets, int64_t N, int64_t Vs, int64_t v0, int first);
void rx_cpu_logprob_slice_finish_f32(float *logp, float *lse, float *entropy, const float *rmax, const double *rsum,
                                     double *rsz, const int32_t *targets, int64_t N);
void rx_cpu_logprob_slice_finish_f64(double *logp, double *lse, double *entropy, const double *rmax,
                                     const double *rsum, double *rsz, const int32_t *targets, int64_t N);
void rx_cpu_logprob_slice_backward_f32(float *dlogits, const float *dlogp, const float *dentropy, const double *entropy,
                                       const float *logits, const int32_t *targets, const float *lse, int64_t N,
                                       int64_t Vs, int64_t v0);
void rx_cpu_logprob_slice_backward_f64(double *dlogits, const double *dlogp, const double *dentropy,
                                       const double *entropy, const double *logits, const int32_t *targets,
                                       const double *lse, int64_t N, int64_t Vs, int64_t v0);

#endif
