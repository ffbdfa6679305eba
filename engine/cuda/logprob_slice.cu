// logprob_slice.cu: the head over a slice of the vocabulary (engine/model/head.c), the twin of
// cpu/logprob.inc's rx_cpu_logprob_slice_*. The forward folds each slice of logits [N, Vs] (columns
// [v0, v0 + Vs)) into every row's running max rmax and sums rsum = sum exp(x - rmax), rsz = sum
// exp(x - rmax) (x - rmax), rescaled when the max grows (the online softmax of flash attention);
// one block per row, sums per thread in double, then a fixed tree. The finish turns them into
// lse, logp and entropy; the backward recomputes p = exp(x - lse) per slice. Statistics f32, the
// running sums f64, logits f32 or bf16. Targets < 0 are padding: logp 0 and a zero gradient row.
#include "common.cuh"

enum { THREADS = 256 };

template <typename T>
__global__ void slice_forward_kernel(float *rmax, double *rsum, double *rsz, float *xt, const T *logits,
                                     const int32_t *targets, int64_t Vs, int64_t v0, int first) {
  __shared__ float redf[32];
  __shared__ double redd[32];
  const int64_t n = blockIdx.x;
  const T *x = logits + n * Vs;
  float m = -INFINITY;
  for (int64_t v = threadIdx.x; v < Vs; v += blockDim.x) m = fmaxf(m, rx_ld(x, v));
  m = rx_block_max(m, redf);
  double s = 0, sz = 0;
  for (int64_t v = threadIdx.x; v < Vs; v += blockDim.x) {
    const float z = rx_ld(x, v) - m, e = expf(z);
    const float zf = z > -INFINITY ? z : 0.0f;   // a -inf logit adds 0, not 0 * -inf
    s += e;
    sz += (double)(e * zf);
  }
  s = rx_block_sum(s, redd);
  sz = rx_block_sum(sz, redd);
  if (threadIdx.x != 0) return;
  if (first || rmax[n] == -INFINITY) {
    rmax[n] = m;
    rsum[n] = s;
    rsz[n] = sz;
  } else if (m > -INFINITY) {   // a slice of -inf logits adds nothing
    const double mo = rmax[n], mx = mo > m ? mo : (double)m, a = exp(mo - mx), b = exp((double)m - mx);
    rsz[n] = a * (rsz[n] + rsum[n] * (mo - mx)) + b * (sz + s * ((double)m - mx));
    rsum[n] = a * rsum[n] + b * s;
    rmax[n] = (float)mx;
  }
  const int32_t t = targets[n];
  if (t >= v0 && t < v0 + Vs) xt[n] = rx_ld(x, t - v0);
}

__global__ void slice_finish_kernel(float *logp, float *lse, float *entropy, const float *rmax, const double *rsum,
                                    double *rsz, const int32_t *targets, int64_t N) {
  for (int64_t n = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; n < N; n += (int64_t)gridDim.x * blockDim.x) {
    const double l = (double)rmax[n] + log(rsum[n]), h = log(rsum[n]) - rsz[n] / rsum[n];
    lse[n] = (float)l;
    entropy[n] = (float)h;
    rsz[n] = h;
    logp[n] = targets[n] < 0 ? 0.0f : (float)((double)logp[n] - l);
  }
}

// dlogits_v = dlogp (onehot_t - p_v), with an entropy gradient also - dentropy p_v (log p_v + H).
// In place allowed: each element is read, then written, by one thread.
template <typename T>
__global__ void slice_backward_kernel(T *dlogits, const float *dlogp, const float *dentropy, const double *entropy,
                                      const T *logits, const int32_t *targets, const float *lse, int64_t Vs,
                                      int64_t v0) {
  const int64_t n = blockIdx.x;
  const int32_t t = targets[n];
  const T *x = logits + n * Vs;
  T *g = dlogits + n * Vs;
  if (t < 0) {
    for (int64_t v = threadIdx.x; v < Vs; v += blockDim.x) rx_st(g, v, 0.0f);
    return;
  }
  if (dentropy) {
    const double l = lse[n], d = dlogp[n], e = dentropy[n], h = entropy[n];
    for (int64_t v = threadIdx.x; v < Vs; v += blockDim.x) {
      const double z = (double)rx_ld(x, v) - l, p = z > -INFINITY ? exp(z) : 0;
      float y = p > 0 ? (float)(-d * p - e * p * (z + h)) : 0.0f;
      if (v + v0 == t) y += (float)d;
      rx_st(g, v, y);
    }
  } else {
    const float d = dlogp[n], l = lse[n];
    for (int64_t v = threadIdx.x; v < Vs; v += blockDim.x) {
      float y = -d * expf(rx_ld(x, v) - l);
      if (v + v0 == t) y += d;
      rx_st(g, v, y);
    }
  }
}

extern "C" int rx_cuda_logprob_slice_forward(float *rmax, double *rsum, double *rsz, float *xt, const void *logits,
                                             const int32_t *targets, int64_t N, int64_t Vs, int64_t v0, int first,
                                             int32_t dtype) {
  RX_STREAM(s);
  if (N == 0) return RX_OK;
  RX_DISPATCH_FLOAT(dtype, "logprob_slice",
    RX_LAUNCH((slice_forward_kernel<T>), (unsigned)N, THREADS, 0, s, rmax, rsum, rsz, xt, (const T *)logits, targets,
              Vs, v0, first));
  RX_LAUNCHED("logprob_slice", "N=%lld Vs=%lld v0=%lld", (long long)N, (long long)Vs, (long long)v0);
  return RX_OK;
}

extern "C" int rx_cuda_logprob_slice_finish(float *logp, float *lse, float *entropy, const float *rmax,
                                            const double *rsum, double *rsz, const int32_t *targets, int64_t N) {
  RX_STREAM(s);
  if (N == 0) return RX_OK;
  RX_LAUNCH(slice_finish_kernel, rx_blocks(N, THREADS), THREADS, 0, s, logp, lse, entropy, rmax, rsum, rsz, targets, N);
  RX_LAUNCHED("logprob_slice_finish", "N=%lld", (long long)N);
  return RX_OK;
}

extern "C" int rx_cuda_logprob_slice_backward(void *dlogits, const float *dlogp, const float *dentropy,
                                              const double *entropy, const void *logits, const int32_t *targets,
                                              const float *lse, int64_t N, int64_t Vs, int64_t v0, int32_t dtype) {
  RX_STREAM(s);
  if (N == 0) return RX_OK;
  RX_DISPATCH_FLOAT(dtype, "logprob_slice_backward",
    RX_LAUNCH((slice_backward_kernel<T>), (unsigned)N, THREADS, 0, s, (T *)dlogits, dlogp, dentropy, entropy,
              (const T *)logits, targets, lse, Vs, v0));
  RX_LAUNCHED("logprob_slice_backward", "N=%lld Vs=%lld v0=%lld", (long long)N, (long long)Vs, (long long)v0);
  return RX_OK;
}
