// common.cuh: what every engine/cuda/*.cu shares: the launch macro, the checking helpers, the
// stream, float <-> bf16 loads and stores, deterministic block reductions, and the dtype switch of
// the launchers.
//
// The same sources build with nvcc (-DRX_CUDA=ON) and with the host C++ compiler against the CUDA
// emulator in engine/cuda/emu (-DRX_CUDA=emulate, docs/gpu.md "Emulation"), so two things are
// written through macros instead of CUDA syntax:
//   RX_LAUNCH(kernel, grid, block, shared_bytes, stream, args...)
//       launches a kernel: kernel<<<grid, block, shared_bytes, stream>>>(args...) under nvcc, the
//       emulator's scheduler otherwise. A template kernel goes in parentheses so that its commas
//       stay together: RX_LAUNCH((attn_forward_kernel<T, NJ>), grid, 128, smem, s, ...).
//   RX_DYNAMIC_SHARED(type, name);
//       inside a kernel, the block's dynamic shared memory as `type *name` (extern __shared__
//       type name[] under nvcc).
// Static __shared__ arrays, __syncthreads, __shfl_*_sync, atomics and __ldg are written as usual.
#ifndef RX_CUDA_COMMON_CUH
#define RX_CUDA_COMMON_CUH
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>
#include <stdio.h>
#include <utility>
extern "C" {
#include "internal.h"
#include "cuda/cuda.h"
}

#define RX_LAUNCH(kernel, grid, block, smem, stream, ...) \
  rx_launch(#kernel, kernel, grid, block, smem, stream, __VA_ARGS__)
#ifdef RX_CUDA_EMULATE
#define RX_DYNAMIC_SHARED(type, name) type *name = (type *)rx_emu_dynamic_shared()
#else
#define RX_DYNAMIC_SHARED(type, name) extern __shared__ type name[]
template <typename... P, typename... A>
static inline void rx_launch(const char *name, void (*kernel)(P...), dim3 grid, dim3 block, size_t smem,
                             cudaStream_t s, A &&...args) {
  kernel<<<grid, block, smem, s>>>(std::forward<A>(args)...);
}
#endif

// remax's one stream (created on first use, with the cuBLAS handle); NULL when CUDA is unusable
// (the error is set).
cudaStream_t rx_cuda_stream(void);
// Set an rx_fail message "op: call failed: <CUDA error> (sizes)" and return RX_EDEVICE (RX_ENOMEM
// for an allocation failure).
int rx_cuda_error(cudaError_t e, const char *call, const char *op, const char *fmt, ...) RX_PRINTF(4, 5);
// After a launch: the launch's error if any; with REMAX_CUDA_SYNC=1 also the kernel's own.
int rx_cuda_launched(const char *op, const char *fmt, ...) RX_PRINTF(2, 3);

// Every CUDA call goes through this: `RX_CU(cudaMemcpyAsync(...), op, "bytes=%zu", n);`
#define RX_CU(call, op, ...)                                                          \
  do {                                                                                \
    cudaError_t rx_e_ = (call);                                                       \
    if (rx_e_ != cudaSuccess) return rx_cuda_error(rx_e_, #call, op, __VA_ARGS__);    \
  } while (0)
// After every kernel launch.
#define RX_LAUNCHED(op, ...)                                  \
  do {                                                        \
    int rx_rc_ = rx_cuda_launched(op, __VA_ARGS__);           \
    if (rx_rc_) return rx_rc_;                                \
  } while (0)
// The stream, or return the error.
#define RX_STREAM(s)                     \
  cudaStream_t s = rx_cuda_stream();     \
  if (!s) return RX_EDEVICE

typedef __nv_bfloat16 bf16;

__device__ __forceinline__ float rx_ld(const float *p, int64_t i) { return p[i]; }
__device__ __forceinline__ float rx_ld(const bf16 *p, int64_t i) { return __bfloat162float(p[i]); }
__device__ __forceinline__ void rx_st(float *p, int64_t i, float v) { p[i] = v; }
__device__ __forceinline__ void rx_st(bf16 *p, int64_t i, float v) { p[i] = __float2bfloat16_rn(v); }

__device__ __forceinline__ float rx_warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ double rx_warp_sum(double v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float rx_warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024), the same fixed tree every run;
// every thread gets the total. `shared` holds 32 values; the call begins with a barrier so that
// consecutive reductions may reuse it.
template <typename A>
__device__ __forceinline__ A rx_block_sum(A v, A *shared) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  v = rx_warp_sum(v);
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < nwarps ? shared[lane] : (A)0;
  return rx_warp_sum(v);
}
__device__ __forceinline__ float rx_block_max(float v, float *shared) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  v = rx_warp_max(v);
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < nwarps ? shared[lane] : -INFINITY;
  return rx_warp_max(v);
}

// The most blocks a grid-stride kernel gets: 65535 * 8, or REMAX_CUDA_MAX_BLOCKS (tests set a
// small one so that every grid-stride loop runs more than once).
int64_t rx_cuda_block_cap(void);

// Blocks for n items at `threads` per block, capped so that grid-stride loops cover the rest.
static inline unsigned rx_blocks(int64_t n, int threads) {
  const int64_t b = (n + threads - 1) / threads, cap = rx_cuda_block_cap();
  return (unsigned)(b < 1 ? 1 : b > cap ? cap : b);
}

// The dtype switch of a launcher: runs BODY with T = float or bf16.
#define RX_DISPATCH_FLOAT(dtype, op, ...)                                                           \
  do {                                                                                               \
    if ((dtype) == RX_F32) { typedef float T; __VA_ARGS__; }                                         \
    else if ((dtype) == RX_BF16) { typedef bf16 T; __VA_ARGS__; }                                    \
    else return rx_fail(RX_EINVAL, "%s: no cuda kernel for dtype %s (f32 and bf16 only)", op,        \
                        rx_dtype_name(dtype));                                                        \
  } while (0)

// Column sums without atomics: out[c] += sum over rows n < N of f(n, c), in a fixed order (rows in
// chunks, each chunk's partial sum per column, then the chunks in order), so the bits do not depend
// on scheduling. F is a functor with `__device__ float operator()(int64_t n, int64_t c) const`.
template <typename F>
__global__ void rx_colsum_partial_kernel(float *partial, F f, int64_t N, int64_t C, int64_t rows_per) {
  __shared__ float acc[8][33];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t c = blockIdx.x * 32 + tx, r = blockIdx.y;
  const int64_t n0 = r * rows_per, n1 = n0 + rows_per < N ? n0 + rows_per : N;
  float s = 0;
  if (c < C)
    for (int64_t n = n0 + ty; n < n1; n += 8) s += f(n, c);
  acc[ty][tx] = s;
  __syncthreads();
  if (ty == 0 && c < C) {
    float t = 0;
    for (int j = 0; j < 8; j++) t += acc[j][tx];
    partial[r * C + c] = t;
  }
}

template <typename A>
__global__ void rx_colsum_final_kernel(A *out, const A *partial, int64_t R, int64_t C) {
  const int64_t c = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (c >= C) return;
  A t = 0;
  for (int64_t r = 0; r < R; r++) t += partial[r * C + c];
  out[c] += t;
}

template <typename F>
static int rx_colsum(float *out, F f, int64_t N, int64_t C, const char *op) {
  RX_STREAM(s);
  if (N == 0 || C == 0) return RX_OK;
  int64_t R = (N + 127) / 128;
  if (R > 1024) R = 1024;
  if (R > rx_cuda_block_cap()) R = rx_cuda_block_cap();
  const int64_t rows_per = (N + R - 1) / R;
  float *partial;
  void *handle;
  int rc = rx_cuda_malloc((void **)&partial, &handle, (size_t)(R * C) * sizeof(float), "column-sum scratch");
  if (rc) return rx_fail_context(rc, "%s", op);
  RX_LAUNCH((rx_colsum_partial_kernel<F>), dim3((unsigned)((C + 31) / 32), (unsigned)R), dim3(32, 8), 0, s, partial, f,
            N, C, rows_per);
  RX_LAUNCH((rx_colsum_final_kernel<float>), (unsigned)((C + 255) / 256), 256, 0, s, out, partial, R, C);
  rx_cuda_release(handle);   // stream order: the next user of this memory runs after these kernels
  RX_LAUNCHED(op, "column sums of N=%lld C=%lld", (long long)N, (long long)C);
  return RX_OK;
}

#endif
