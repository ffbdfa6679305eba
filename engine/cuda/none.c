/* none.c: the CUDA backend of a build without a CUDA toolkit (or with -DRX_CUDA=OFF). Every entry
 * of cuda/cuda.h fails with one clear message, so the ops' `case RX_CUDA:` need no #ifdef. */
#include "internal.h"
#include "cuda/cuda.h"

static int none(void) {
  return rx_fail(RX_EDEVICE, "cuda: remax was built without CUDA (configure with a CUDA toolkit on the PATH and "
                             "-DRX_CUDA=ON to use device \"cuda\")");
}

int rx_cuda_device_count(void) { return 0; }
const char *rx_cuda_backend(void) { return "none"; }
int rx_cuda_memory(int64_t *allocated, int64_t *peak, int64_t *reserved, int64_t *free_bytes, int64_t *total_bytes) {
  return none();
}
int rx_cuda_synchronize(void) { return none(); }
int rx_cuda_malloc(void **ptr, void **handle, size_t bytes, const char *what) {
  *ptr = *handle = NULL;
  return none();
}
void rx_cuda_release(void *handle) {}
int rx_cuda_memset0(void *ptr, size_t bytes) { return none(); }
int rx_cuda_copy(rx_tensor *dst, const rx_tensor *src) { return none(); }
int rx_cuda_fill(rx_tensor *t, double value) { return none(); }
int rx_cuda_first_bad_index(int64_t *bad, int32_t *bad_value, const int32_t *idx, int64_t n, int64_t limit,
                            int allow_negative) { return none(); }
int rx_cuda_add(void *out, const void *a, const void *b, int64_t n, int32_t dtype) { return none(); }
int rx_cuda_dropout(void *xd, const void *x, const float *u, int64_t n, double p, void *dy, int32_t dtype) { return none(); }
int rx_cuda_swiglu_forward(void *out, const void *gate, const void *up, int64_t n, int32_t dtype) { return none(); }
int rx_cuda_swiglu_backward(void *dgate, void *dup, const void *dout, const void *gate, const void *up, int64_t n,
                            int32_t dtype) { return none(); }
int rx_cuda_rmsnorm_forward(void *out, float *rstd, const void *inp, const void *weight, int64_t N, int64_t C,
                            float eps, int32_t dtype) { return none(); }
int rx_cuda_rmsnorm_backward(void *dinp, float *dweight, const void *dout, const void *inp, const void *weight,
                             const float *rstd, int64_t N, int64_t C, int32_t dtype) { return none(); }
int rx_cuda_rope_forward(void *out, const void *inp, const int32_t *positions, int64_t P, int64_t H, int64_t D,
                         const double *inv_freq, int32_t dtype) { return none(); }
int rx_cuda_rope_backward(void *dinp, const void *dout, const int32_t *positions, int64_t P, int64_t H, int64_t D,
                          const double *inv_freq, int32_t dtype) { return none(); }
int rx_cuda_embedding_forward(void *out, const int32_t *tokens, const void *weight, int64_t N, int64_t C,
                              int32_t dtype) { return none(); }
int rx_cuda_embedding_backward(float *dweight, const void *dout, const int32_t *tokens, int64_t N, int64_t V,
                               int64_t C, int32_t dtype) { return none(); }
int rx_cuda_matmul_forward(void *out, const void *inp, const void *weight, const void *bias, int64_t N, int64_t C,
                           int64_t OC, int32_t dtype) { return none(); }
int rx_cuda_matmul_backward(void *dinp, float *dweight, float *dbias, const void *dout, const void *inp,
                            const void *weight, int64_t N, int64_t C, int64_t OC, int32_t dtype) { return none(); }
int rx_cuda_logprob_forward(float *logp, float *lse, float *entropy, const void *logits, const int32_t *targets,
                            int64_t N, int64_t V, int32_t dtype) { return none(); }
int rx_cuda_logprob_backward(void *dlogits, const float *dlogp, const void *logits, const int32_t *targets,
                             const float *lse, int64_t N, int64_t V, int32_t dtype) { return none(); }
int rx_cuda_logprob_slice_forward(float *rmax, double *rsum, double *rsz, float *xt, const void *logits,
                                  const int32_t *targets, int64_t N, int64_t Vs, int64_t v0, int first,
                                  int32_t dtype) { return none(); }
int rx_cuda_logprob_slice_finish(float *logp, float *lse, float *entropy, const float *rmax, const double *rsum,
                                 double *rsz, const int32_t *targets, int64_t N) { return none(); }
int rx_cuda_logprob_slice_backward(void *dlogits, const float *dlogp, const float *dentropy, const double *entropy,
                                   const void *logits, const int32_t *targets, const float *lse, int64_t N, int64_t Vs,
                                   int64_t v0, int32_t dtype) { return none(); }
int rx_cuda_attention_forward(void *out, float *lse, const void *q, const void *k, const void *v, const int32_t *mask,
                              const rx_cuda_attn_dims *dims, int32_t dtype) { return none(); }
int rx_cuda_attention_backward(void *dq, void *dk, void *dv, const void *dout, const void *q, const void *k,
                               const void *v, const void *out, const float *lse, const int32_t *mask,
                               const rx_cuda_attn_dims *dims, int32_t dtype) { return none(); }
int rx_cuda_adamw(float *param, const float *grad, float *m, float *v, void *work, int64_t n, double lr,
                  double beta1, double beta2, double eps, double shrink, double bc1, double sqrt_bc2) { return none(); }
int rx_cuda_sum_squares(double *acc, const float *x, int64_t n) { return none(); }
int rx_cuda_scale(void *x, int64_t n, double s, int32_t dtype) { return none(); }
int rx_cuda_scalar(double **acc) { *acc = NULL; return none(); }
int rx_cuda_read_double(double *out, const double *acc) { return none(); }
int rx_cuda_sample(int32_t *token, float *logprob, float *prob, float *penalized, int32_t *seen, int64_t seen_stride,
                   const void *logits, const rx_cuda_sample_row *rows, uint64_t seed, int64_t n, int64_t V,
                   int32_t dtype) { return none(); }
int rx_cuda_decode_attention(void *out, float *lse, const void *q, const void *k, const void *v, const int32_t *mask,
                             const rx_cuda_attn_dims *dims, int32_t dtype) { return none(); }
int64_t rx_cuda_decode_attention_scratch(const rx_cuda_attn_dims *dims) { return 0; }
int rx_cuda_decode_attention_lens(void *out, float *lse, const void *q, const void *k, const void *v,
                                  const int32_t *mask, const int32_t *lens, float *part, const rx_cuda_attn_dims *dims,
                                  int32_t dtype) { return none(); }
int rx_cuda_kv_append(void *kc, void *vc, const void *k, const void *v, const int32_t *lens, int64_t B, int64_t S,
                      int64_t KD, int32_t dtype) { return none(); }
int rx_cuda_graph_begin(void) { return none(); }
int rx_cuda_graph_end(void **exec) { *exec = NULL; return none(); }
int rx_cuda_graph_launch(void *exec) { return none(); }
void rx_cuda_graph_free(void *exec) {}
