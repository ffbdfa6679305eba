// rmsnorm.cu: RMS normalisation over the last dim, the twin of cpu/rmsnorm.inc:
// y = x * s * w with s = 1 / sqrt(mean(x^2) + eps) per row; rstd (f32) saved for the backward.
#include "common.cuh"

enum { THREADS = 256 };

// One block per row.
template <typename T>
__global__ void rmsnorm_forward_kernel(T *out, float *rstd, const T *inp, const T *weight, int64_t C, float eps) {
  __shared__ float red[32];
  const int64_t n = blockIdx.x;
  const T *x = inp + n * C;
  T *y = out + n * C;
  float ss = 0;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    float v = rx_ld(x, c);
    ss += v * v;
  }
  ss = rx_block_sum(ss, red);
  const float s = 1.0f / sqrtf(ss / (float)C + eps);
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) rx_st(y, c, rx_ld(x, c) * s * rx_ld(weight, c));
  if (rstd && threadIdx.x == 0) rstd[n] = s;
}

// dx_j = s w_j dy_j - x_j s^3 / C * sum_c(dy_c w_c x_c); one block per row.
template <typename T>
__global__ void rmsnorm_backward_kernel(T *dinp, const T *dout, const T *inp, const T *weight, const float *rstd,
                                        int64_t C) {
  __shared__ float red[32];
  const int64_t n = blockIdx.x;
  const T *x = inp + n * C, *dy = dout + n * C;
  T *dx = dinp + n * C;
  const float s = rstd[n];
  float dot = 0;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) dot += rx_ld(dy, c) * rx_ld(weight, c) * rx_ld(x, c);
  dot = rx_block_sum(dot, red);
  const float k = dot * s * s * s / (float)C;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x)
    rx_st(dx, c, s * rx_ld(weight, c) * rx_ld(dy, c) - k * rx_ld(x, c));
}

// dweight_c += sum_n dy[n,c] x[n,c] s[n]
template <typename T>
struct dweight_term {
  const T *dout, *inp;
  const float *rstd;
  int64_t C;
  __device__ float operator()(int64_t n, int64_t c) const {
    return rx_ld(dout, n * C + c) * rx_ld(inp, n * C + c) * rstd[n];
  }
};

extern "C" int rx_cuda_rmsnorm_forward(void *out, float *rstd, const void *inp, const void *weight, int64_t N,
                                       int64_t C, float eps, int32_t dtype) {
  RX_STREAM(s);
  if (N == 0) return RX_OK;
  RX_DISPATCH_FLOAT(dtype, "rmsnorm",
    RX_LAUNCH((rmsnorm_forward_kernel<T>), (unsigned)N, THREADS, 0, s,
              (T *)out, rstd, (const T *)inp, (const T *)weight, C, eps));
  RX_LAUNCHED("rmsnorm", "N=%lld C=%lld", (long long)N, (long long)C);
  return RX_OK;
}

extern "C" int rx_cuda_rmsnorm_backward(void *dinp, float *dweight, const void *dout, const void *inp,
                                        const void *weight, const float *rstd, int64_t N, int64_t C, int32_t dtype) {
  RX_STREAM(s);
  if (N == 0) return RX_OK;
  // dweight first: dinp may be dout's memory (the backward in place), and the column sums read dout
  RX_DISPATCH_FLOAT(dtype, "rmsnorm_backward", {
    if (dweight) {
      dweight_term<T> f = {(const T *)dout, (const T *)inp, rstd, C};
      int rc = rx_colsum(dweight, f, N, C, "rmsnorm_backward (dweight)");
      if (rc) return rc;
    }
    if (dinp) {
      RX_LAUNCH((rmsnorm_backward_kernel<T>), (unsigned)N, THREADS, 0, s, (T *)dinp, (const T *)dout, (const T *)inp,
                (const T *)weight, rstd, C);
      RX_LAUNCHED("rmsnorm_backward", "N=%lld C=%lld", (long long)N, (long long)C);
    }
  });
  return RX_OK;
}
