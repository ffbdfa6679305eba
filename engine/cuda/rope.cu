// rope.cu: rotary position embedding, Hugging Face rotate-half form, the twin of cpu/rope.inc.
// With h = D/2 and angle a_i = pos * inv_freq[i] (the frequencies rx_rope_frequencies computed:
// theta^(-2i/D), or with a checkpoint's rope_scaling applied): y_i = x_i cos a_i - x_{i+h} sin a_i,
// y_{i+h} = x_{i+h} cos a_i + x_i sin a_i. Angles, cos and sin in double as on the CPU (then
// rounded to float); the backward is the same rotation with sin negated. out may alias inp: each
// thread reads and writes only its own pair (i, i+h).
#include "common.cuh"

enum { RX_CUDA_ROPE_MAX_HALF = 512 };   // RX_CPU_ROPE_MAX_D / 2

// The frequencies of the call in flight; copied on the stream before each launch, so calls in
// stream order each see their own.
__constant__ double rope_inv_freq[RX_CUDA_ROPE_MAX_HALF];

template <typename T>
__global__ void rope_kernel(T *out, const T *inp, const int32_t *positions, int64_t P, int64_t H, int64_t D,
                            double sign) {
  const int64_t half = D / 2, total = P * H * half;
  for (int64_t idx = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; idx < total; idx += (int64_t)gridDim.x * blockDim.x) {
    const int64_t i = idx % half, row = idx / half, p = row / H;   // row = p * H + h
    const double a = (double)positions[p] * rope_inv_freq[i];
    double sd, cd;
    sincos(a, &sd, &cd);
    const float cs = (float)cd, sn = (float)(sign * sd);
    const int64_t base = row * D;
    const float x1 = rx_ld(inp, base + i), x2 = rx_ld(inp, base + i + half);
    rx_st(out, base + i, x1 * cs - x2 * sn);
    rx_st(out, base + i + half, x2 * cs + x1 * sn);
  }
}

static int rope(const char *op, void *out, const void *inp, const int32_t *positions, int64_t P, int64_t H, int64_t D,
                const double *inv_freq, double sign, int32_t dtype) {
  RX_STREAM(s);
  const int64_t total = P * H * (D / 2);
  if (total == 0) return RX_OK;
  if (D / 2 > RX_CUDA_ROPE_MAX_HALF) return rx_fail(RX_EINVAL, "%s: head_dim %lld is above %d", op, (long long)D, 2 * RX_CUDA_ROPE_MAX_HALF);
  RX_CU(cudaMemcpyToSymbolAsync(rope_inv_freq, inv_freq, (size_t)(D / 2) * sizeof(double), 0, cudaMemcpyHostToDevice, s),
        op, "D=%lld", (long long)D);
  RX_DISPATCH_FLOAT(dtype, op,
    RX_LAUNCH((rope_kernel<T>), rx_blocks(total, 256), 256, 0, s, (T *)out, (const T *)inp, positions, P, H, D, sign));
  RX_LAUNCHED(op, "P=%lld H=%lld D=%lld", (long long)P, (long long)H, (long long)D);
  return RX_OK;
}

extern "C" int rx_cuda_rope_forward(void *out, const void *inp, const int32_t *positions, int64_t P, int64_t H,
                                    int64_t D, const double *inv_freq, int32_t dtype) {
  return rope("rope", out, inp, positions, P, H, D, inv_freq, 1.0, dtype);
}

extern "C" int rx_cuda_rope_backward(void *dinp, const void *dout, const int32_t *positions, int64_t P, int64_t H,
                                     int64_t D, const double *inv_freq, int32_t dtype) {
  return rope("rope_backward", dinp, dout, positions, P, H, D, inv_freq, -1.0, dtype);
}
