// swiglu.cu: out = silu(gate) * up, the twin of cpu/swiglu.inc (same formulas, float arithmetic).
#include "common.cuh"

__device__ __forceinline__ float sigmoid(float g) { return 1.0f / (1.0f + expf(-g)); }

template <typename T>
__global__ void swiglu_forward_kernel(T *out, const T *gate, const T *up, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    float g = rx_ld(gate, i);
    rx_st(out, i, g * sigmoid(g) * rx_ld(up, i));
  }
}

// dgate = dout up s (1 + g (1 - s)), dup = dout g s; either may be NULL.
template <typename T>
__global__ void swiglu_backward_kernel(T *dgate, T *dup, const T *dout, const T *gate, const T *up, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    float g = rx_ld(gate, i), s = sigmoid(g), dy = rx_ld(dout, i);
    if (dgate) rx_st(dgate, i, dy * rx_ld(up, i) * s * (1.0f + g * (1.0f - s)));
    if (dup) rx_st(dup, i, dy * g * s);
  }
}

extern "C" int rx_cuda_swiglu_forward(void *out, const void *gate, const void *up, int64_t n, int32_t dtype) {
  RX_STREAM(s);
  if (n == 0) return RX_OK;
  RX_DISPATCH_FLOAT(dtype, "swiglu",
    RX_LAUNCH((swiglu_forward_kernel<T>), rx_blocks(n, 256), 256, 0, s, (T *)out, (const T *)gate, (const T *)up, n));
  RX_LAUNCHED("swiglu", "n=%lld", (long long)n);
  return RX_OK;
}

extern "C" int rx_cuda_swiglu_backward(void *dgate, void *dup, const void *dout, const void *gate, const void *up,
                                       int64_t n, int32_t dtype) {
  RX_STREAM(s);
  if (n == 0 || (!dgate && !dup)) return RX_OK;
  RX_DISPATCH_FLOAT(dtype, "swiglu_backward",
    RX_LAUNCH((swiglu_backward_kernel<T>), rx_blocks(n, 256), 256, 0, s, (T *)dgate, (T *)dup, (const T *)dout,
                                                                (const T *)gate, (const T *)up, n));
  RX_LAUNCHED("swiglu_backward", "n=%lld", (long long)n);
  return RX_OK;
}
