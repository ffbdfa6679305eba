// logprob.cu: the training head on a chunk of rows, the twin of cpu/logprob.inc. One block per
// row: the max, then sum e_v = exp(x_v - m) and sum e_v (x_v - m) (per thread in double, then a
// fixed tree), lse = m + log S, logp = x_t - lse, entropy = log S - sum e_v (x_v - m) / S. The
// backward writes dlogits_v = dlogp (onehot_t - exp(x_v - lse)), in place when dlogits == logits.
// Targets < 0 are padding: logp 0 and a zero gradient row. Statistics are f32.
#include "common.cuh"

enum { THREADS = 512 };

template <typename T>
__global__ void logprob_forward_kernel(float *logp, float *lse, float *entropy, const T *logits,
                                       const int32_t *targets, int64_t V) {
  __shared__ float redf[32];
  __shared__ double redd[32];
  const int64_t n = blockIdx.x;
  const T *x = logits + n * V;
  float m = -INFINITY;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) m = fmaxf(m, rx_ld(x, v));
  m = rx_block_max(m, redf);
  double s = 0, sz = 0;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
    const float z = rx_ld(x, v) - m, e = expf(z);
    s += e;
    if (entropy && z > -INFINITY) sz += (double)e * z;   // a -inf logit adds 0, not 0 * -inf
  }
  s = rx_block_sum(s, redd);
  if (entropy) sz = rx_block_sum(sz, redd);
  if (threadIdx.x == 0) {
    const double l = (double)m + log(s);
    if (lse) lse[n] = (float)l;
    if (entropy) entropy[n] = (float)(log(s) - sz / s);
    const int32_t t = targets[n];
    logp[n] = t < 0 ? 0.0f : (float)((double)rx_ld(x, t) - l);
  }
}

template <typename T>
__global__ void logprob_backward_kernel(T *dlogits, const float *dlogp, const T *logits, const int32_t *targets,
                                        const float *lse, int64_t V) {
  const int64_t n = blockIdx.x;
  const int32_t t = targets[n];
  const T *x = logits + n * V;   // may be the same memory as g: each element is read, then written, by one thread
  T *g = dlogits + n * V;
  const float d = t < 0 ? 0.0f : dlogp[n], l = lse[n];
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
    float y = t < 0 ? 0.0f : -d * expf(rx_ld(x, v) - l);
    if (v == t) y += d;
    rx_st(g, v, y);
  }
}

extern "C" int rx_cuda_logprob_forward(float *logp, float *lse, float *entropy, const void *logits,
                                       const int32_t *targets, int64_t N, int64_t V, int32_t dtype) {
  RX_STREAM(s);
  if (N == 0) return RX_OK;
  RX_DISPATCH_FLOAT(dtype, "logprob",
    RX_LAUNCH((logprob_forward_kernel<T>), (unsigned)N, THREADS, 0, s,
              logp, lse, entropy, (const T *)logits, targets, V));
  RX_LAUNCHED("logprob", "N=%lld V=%lld", (long long)N, (long long)V);
  return RX_OK;
}

extern "C" int rx_cuda_logprob_backward(void *dlogits, const float *dlogp, const void *logits, const int32_t *targets,
                                        const float *lse, int64_t N, int64_t V, int32_t dtype) {
  RX_STREAM(s);
  if (N == 0) return RX_OK;
  RX_DISPATCH_FLOAT(dtype, "logprob_backward",
    RX_LAUNCH((logprob_backward_kernel<T>), (unsigned)N, THREADS, 0, s,
              (T *)dlogits, dlogp, (const T *)logits, targets, lse, V));
  RX_LAUNCHED("logprob_backward", "N=%lld V=%lld", (long long)N, (long long)V);
  return RX_OK;
}
