// add.cu: out = a + b elementwise (residual connections), the twin of cpu/add.inc. out may alias a or b.
#include "common.cuh"

template <typename T>
__global__ void add_kernel(T *out, const T *a, const T *b, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    rx_st(out, i, rx_ld(a, i) + rx_ld(b, i));
}

extern "C" int rx_cuda_add(void *out, const void *a, const void *b, int64_t n, int32_t dtype) {
  RX_STREAM(s);
  if (n == 0) return RX_OK;
  RX_DISPATCH_FLOAT(dtype, "add",
    RX_LAUNCH((add_kernel<T>), rx_blocks(n, 256), 256, 0, s, (T *)out, (const T *)a, (const T *)b, n));
  RX_LAUNCHED("add", "n=%lld", (long long)n);
  return RX_OK;
}
