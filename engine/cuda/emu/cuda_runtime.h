// cuda_runtime.h of the CUDA emulator (engine/cuda/emu, docs/gpu.md "Emulation"): what
// engine/cuda/*.cu use of the CUDA runtime, for the host C++ compiler. The kernels run on the CPU:
// each thread of a block is a fiber that runs until it completes or reaches a barrier
// (__syncthreads) or a warp operation (__shfl_*_sync, __ballot_sync, __syncwarp), so barriers and
// warps behave as on a device, and their misuse is an error naming the kernel. Device memory is
// host memory (each allocation its own, so AddressSanitizer sees an overrun). A test harness, not
// a fast path: no speed claims.
//
// The runtime API part is plain C (the MPI plugin's C code includes it); the device side needs C++.
#ifndef RX_EMU_CUDA_RUNTIME_H
#define RX_EMU_CUDA_RUNTIME_H
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define RX_CUDA_EMULATE 1
#define CUDART_VERSION 13000

#ifdef __cplusplus
extern "C" {
#endif

typedef enum cudaError {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInitializationError = 3,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorInvalidDevicePointer = 17,
  cudaErrorInvalidMemcpyDirection = 21,
  cudaErrorNoDevice = 100,
  cudaErrorInvalidDevice = 101,
  cudaErrorInvalidResourceHandle = 400,
  cudaErrorNotReady = 600,
  cudaErrorIllegalAddress = 700,
  cudaErrorLaunchOutOfResources = 701,
  cudaErrorAssert = 710,
  cudaErrorLaunchFailure = 719,
  cudaErrorStreamCaptureUnsupported = 900,
  cudaErrorStreamCaptureInvalidated = 901,
  cudaErrorUnknown = 999
} cudaError_t;

typedef enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4
} cudaMemcpyKind;

typedef enum cudaFuncAttribute {
  cudaFuncAttributeMaxDynamicSharedMemorySize = 8,
  cudaFuncAttributePreferredSharedMemoryCarveout = 9
} cudaFuncAttribute;

typedef enum cudaStreamCaptureMode {
  cudaStreamCaptureModeGlobal = 0,
  cudaStreamCaptureModeThreadLocal = 1,
  cudaStreamCaptureModeRelaxed = 2
} cudaStreamCaptureMode;

typedef enum cudaDataType_t {
  CUDA_R_32F = 0,
  CUDA_R_64F = 1,
  CUDA_R_16F = 2,
  CUDA_R_32I = 10,
  CUDA_R_16BF = 14
} cudaDataType_t, cudaDataType;

enum { cudaStreamDefault = 0, cudaStreamNonBlocking = 1 };
enum { cudaEventDefault = 0, cudaEventBlockingSync = 1, cudaEventDisableTiming = 2 };

typedef struct rx_emu_stream *cudaStream_t;
typedef struct rx_emu_event *cudaEvent_t;
typedef struct rx_emu_graph *cudaGraph_t;
typedef struct rx_emu_graph_exec *cudaGraphExec_t;

typedef struct uint3 { unsigned int x, y, z; } uint3;
#ifdef __cplusplus
struct dim3 {
  unsigned int x, y, z;
  constexpr dim3(unsigned int vx = 1, unsigned int vy = 1, unsigned int vz = 1) : x(vx), y(vy), z(vz) {}
  constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
};
#else
typedef struct dim3 { unsigned int x, y, z; } dim3;
#endif

const char *cudaGetErrorName(cudaError_t e);
const char *cudaGetErrorString(cudaError_t e);
cudaError_t cudaGetLastError(void);
cudaError_t cudaPeekAtLastError(void);
cudaError_t cudaGetDeviceCount(int *n);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaGetDevice(int *device);
cudaError_t cudaDeviceSynchronize(void);
cudaError_t cudaDeviceReset(void);
cudaError_t cudaMalloc(void **ptr, size_t bytes);
cudaError_t cudaFree(void *ptr);
cudaError_t cudaMallocHost(void **ptr, size_t bytes);
cudaError_t cudaFreeHost(void *ptr);
cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes);
cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind, cudaStream_t s);
cudaError_t cudaMemset(void *dst, int value, size_t bytes);
cudaError_t cudaMemsetAsync(void *dst, int value, size_t bytes, cudaStream_t s);
cudaError_t cudaStreamCreate(cudaStream_t *s);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned int flags);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaStreamQuery(cudaStream_t s);   /* the emulator runs work at once: as synchronize */
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int flags);
cudaError_t cudaEventCreate(cudaEvent_t *e);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned int flags);
cudaError_t cudaEventDestroy(cudaEvent_t e);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s);
cudaError_t cudaEventSynchronize(cudaEvent_t e);
cudaError_t cudaEventQuery(cudaEvent_t e);
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end);
cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode mode);
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *graph);
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t graph, unsigned long long flags);
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s);
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec);
cudaError_t cudaGraphDestroy(cudaGraph_t graph);
cudaError_t rx_emu_func_set_attribute(const void *fn, cudaFuncAttribute attr, int value);
cudaError_t rx_emu_memcpy_to_symbol(void *symbol, size_t symbol_bytes, const void *src, size_t bytes, size_t offset,
                                    cudaMemcpyKind kind, cudaStream_t s);

// ---- the emulator's own interface (tests and the header below)
// Whether [p, p + bytes) lies inside one live device allocation (what cuBLAS's checks use).
int rx_emu_is_device_range(const void *p, size_t bytes);
// Records an error found while executing queued work (a kernel, a GEMM): returned by the next
// synchronising call or cudaGetLastError, with `message` as its cudaGetErrorString.
void rx_emu_fault(cudaError_t e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
// Launches so far (tests check that a graph replays its launches).
uint64_t rx_emu_launch_count(void);

#ifdef __cplusplus
}   // extern "C"

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
#define __constant__
#define __managed__

extern "C" {
extern uint3 rx_emu_thread_idx, rx_emu_block_idx;
extern dim3 rx_emu_block_dim, rx_emu_grid_dim;
void rx_emu_syncthreads(void);
// A warp operation: the calling lane waits until every lane of `mask` has reached one with the
// same mask; returns the lane's result (the value read, or the ballot).
uint64_t rx_emu_warp(int op, unsigned mask, uint64_t value, int arg, int width);
// The block's dynamic shared memory (RX_DYNAMIC_SHARED in engine/cuda/common.cuh).
void *rx_emu_dynamic_shared(void);
}
#define threadIdx (static_cast<const uint3 &>(rx_emu_thread_idx))
#define blockIdx (static_cast<const uint3 &>(rx_emu_block_idx))
#define blockDim (static_cast<const dim3 &>(rx_emu_block_dim))
#define gridDim (static_cast<const dim3 &>(rx_emu_grid_dim))
#define warpSize 32

enum { RX_EMU_SHFL_IDX, RX_EMU_SHFL_XOR, RX_EMU_SHFL_DOWN, RX_EMU_SHFL_UP, RX_EMU_BALLOT, RX_EMU_ANY, RX_EMU_ALL,
       RX_EMU_SYNCWARP };

static inline void __syncthreads(void) { rx_emu_syncthreads(); }
static inline void __syncwarp(unsigned mask = 0xffffffffu) { rx_emu_warp(RX_EMU_SYNCWARP, mask, 0, 0, 32); }
static inline void __threadfence(void) {}
static inline void __threadfence_block(void) {}

template <typename T>
static inline T rx_emu_shfl(int op, unsigned mask, T v, int arg, int width) {
  static_assert(sizeof(T) <= 8, "warp shuffles move at most 8 bytes");
  uint64_t bits = 0;
  memcpy(&bits, &v, sizeof v);
  bits = rx_emu_warp(op, mask, bits, arg, width);
  T r;
  memcpy(&r, &bits, sizeof r);
  return r;
}
template <typename T> static inline T __shfl_sync(unsigned mask, T v, int src, int width = 32) { return rx_emu_shfl(RX_EMU_SHFL_IDX, mask, v, src, width); }
template <typename T> static inline T __shfl_xor_sync(unsigned mask, T v, int m, int width = 32) { return rx_emu_shfl(RX_EMU_SHFL_XOR, mask, v, m, width); }
template <typename T> static inline T __shfl_down_sync(unsigned mask, T v, unsigned d, int width = 32) { return rx_emu_shfl(RX_EMU_SHFL_DOWN, mask, v, (int)d, width); }
template <typename T> static inline T __shfl_up_sync(unsigned mask, T v, unsigned d, int width = 32) { return rx_emu_shfl(RX_EMU_SHFL_UP, mask, v, (int)d, width); }
static inline unsigned __ballot_sync(unsigned mask, int pred) { return (unsigned)rx_emu_warp(RX_EMU_BALLOT, mask, pred != 0, 0, 32); }
static inline int __any_sync(unsigned mask, int pred) { return (int)rx_emu_warp(RX_EMU_ANY, mask, pred != 0, 0, 32); }
static inline int __all_sync(unsigned mask, int pred) { return (int)rx_emu_warp(RX_EMU_ALL, mask, pred != 0, 0, 32); }

template <typename T> static inline T __ldg(const T *p) { return *p; }

// Atomics: threads of a launch run one at a time and switch only at barriers and warp
// operations, so a read-modify-write is atomic as written.
template <typename T> static inline T atomicAdd(T *p, T v) { T old = *p; *p = old + v; return old; }
template <typename T> static inline T atomicSub(T *p, T v) { T old = *p; *p = old - v; return old; }
template <typename T> static inline T atomicMin(T *p, T v) { T old = *p; if (v < old) *p = v; return old; }
template <typename T> static inline T atomicMax(T *p, T v) { T old = *p; if (v > old) *p = v; return old; }
template <typename T> static inline T atomicExch(T *p, T v) { T old = *p; *p = v; return old; }
template <typename T> static inline T atomicCAS(T *p, T cmp, T v) { T old = *p; if (old == cmp) *p = v; return old; }
template <typename T> static inline T atomicOr(T *p, T v) { T old = *p; *p = old | v; return old; }
template <typename T> static inline T atomicAnd(T *p, T v) { T old = *p; *p = old & v; return old; }

// The device's min and max for mixed integer and floating arguments.
template <typename A, typename B> static inline auto min(A a, B b) -> decltype(a + b) { return a < b ? a : b; }
template <typename A, typename B> static inline auto max(A a, B b) -> decltype(a + b) { return a > b ? a : b; }
static inline float __fdividef(float a, float b) { return a / b; }
static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
static inline double rsqrt(double x) { return 1.0 / sqrt(x); }

template <typename T>
static inline cudaError_t cudaFuncSetAttribute(T *fn, cudaFuncAttribute attr, int value) {
  return rx_emu_func_set_attribute((const void *)fn, attr, value);
}
template <typename T>
static inline cudaError_t cudaMemcpyToSymbolAsync(T &symbol, const void *src, size_t bytes, size_t offset = 0,
                                                  cudaMemcpyKind kind = cudaMemcpyHostToDevice, cudaStream_t s = 0) {
  return rx_emu_memcpy_to_symbol((void *)&symbol, sizeof symbol, src, bytes, offset, kind, s);
}
template <typename T>
static inline cudaError_t cudaMemcpyToSymbol(T &symbol, const void *src, size_t bytes, size_t offset = 0,
                                             cudaMemcpyKind kind = cudaMemcpyHostToDevice) {
  cudaError_t e = rx_emu_memcpy_to_symbol((void *)&symbol, sizeof symbol, src, bytes, offset, kind, 0);
  return e == cudaSuccess ? cudaDeviceSynchronize() : e;
}

#include <tuple>
#include <type_traits>
#include <utility>
namespace rx_emu {
// One launch's kernel and its arguments, copied at launch as the driver copies them.
struct kernel_call {
  virtual ~kernel_call() {}
  virtual void run() const = 0;   // the kernel body for the current thread
  virtual kernel_call *clone() const = 0;
};
template <typename... P>
struct call_of final : kernel_call {
  void (*kernel)(P...);
  std::tuple<typename std::decay<P>::type...> args;
  template <typename... A>
  call_of(void (*k)(P...), A &&...a) : kernel(k), args(std::forward<A>(a)...) {}
  void run() const override { std::apply(kernel, args); }
  kernel_call *clone() const override { return new call_of(*this); }
};
cudaError_t launch(const char *name, const void *fn, dim3 grid, dim3 block, size_t smem, cudaStream_t s,
                   const kernel_call &call);
}   // namespace rx_emu

// The launch that RX_LAUNCH (engine/cuda/common.cuh) expands to.
template <typename... P, typename... A>
static inline void rx_launch(const char *name, void (*kernel)(P...), dim3 grid, dim3 block, size_t smem,
                             cudaStream_t s, A &&...args) {
  static_assert(sizeof...(P) == sizeof...(A), "kernel launched with the wrong number of arguments");
  rx_emu::call_of<P...> call(kernel, std::forward<A>(args)...);
  rx_emu::launch(name, (const void *)kernel, grid, block, smem, s, call);
}
#endif   // __cplusplus

#endif
