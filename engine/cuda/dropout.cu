// dropout.cu: LoRA's dropout on the device, the twin of cpu/dropout.c: f = u >= p ? 1/(1-p) : 0
// from f32 uniform draws u (the CPU's Philox numbers), xd = x * f and dy *= f when dy is given,
// in x's dtype (the factor in f32, the product rounded once).
#include "common.cuh"

template <typename T>
__global__ void dropout_kernel(T *xd, const T *x, const float *u, int64_t n, double p, float k, T *dy) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    const float f = (double)u[i] >= p ? k : 0.0f;
    if (dy) rx_st(dy, i, rx_ld(dy, i) * f);
    rx_st(xd, i, rx_ld(x, i) * f);
  }
}

extern "C" int rx_cuda_dropout(void *xd, const void *x, const float *u, int64_t n, double p, void *dy, int32_t dtype) {
  RX_STREAM(s);
  if (n == 0) return RX_OK;
  const float k = (float)(1.0 / (1.0 - p));
  RX_DISPATCH_FLOAT(dtype, "dropout",
    RX_LAUNCH((dropout_kernel<T>), rx_blocks(n, 256), 256, 0, s, (T *)xd, (const T *)x, u, n, p, k, (T *)dy));
  RX_LAUNCHED("dropout", "n=%lld", (long long)n);
  return RX_OK;
}
