// matmul.cu: the linear layer y = x W^T (+ b) through cuBLAS (cublasGemmEx), the twin of
// cpu/matmul.inc. bf16: bf16 inputs, f32 accumulation, bf16 activations out, f32 parameter
// gradients (dweight, dbias accumulated). f32: f32 throughout with TF32 off (CUBLAS_COMPUTE_32F
// under the default math mode), for checking against the CPU.
//
// Row-major [N, C] data is column-major [C, N] to cuBLAS, so with W row-major [OC, C]:
//   out^T [OC, N] = W  · inp^T   -> gemm(T, N, m=OC, n=N, k=C)
//   dinp^T [C, N] = W^T · dout^T  -> gemm(N, N, m=C, n=N, k=OC)
//   dW^T  [C, OC] += inp^T · dout -> gemm(N, T, m=C, n=OC, k=N), beta = 1
#include "common.cuh"
#include <cublas_v2.h>
#include <pthread.h>

static const char *cublas_status_name(cublasStatus_t st) {
  switch (st) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
  }
  return "unknown cuBLAS status";
}

// Every cuBLAS call goes through this, like RX_CU for the runtime. A GEMM is a launch like any
// other: its asynchronous failure is checked as a kernel's is (RX_LAUNCHED: with REMAX_CUDA_SYNC=1
// the stream is synchronised), so that it is blamed on this op and not on the next one.
#define RX_CUBLAS(call, op, ...)                                                                         \
  do {                                                                                                   \
    cublasStatus_t rx_st_ = (call);                                                                      \
    if (rx_st_ != CUBLAS_STATUS_SUCCESS) {                                                               \
      char rx_sz_[200];                                                                                  \
      snprintf(rx_sz_, sizeof rx_sz_, __VA_ARGS__);                                                      \
      return rx_fail(rx_st_ == CUBLAS_STATUS_ALLOC_FAILED ? RX_ENOMEM : RX_EDEVICE, "%s: %s failed: %s with %s", \
                     op, #call, cublas_status_name(rx_st_), rx_sz_);                                     \
    }                                                                                                    \
    RX_LAUNCHED(op, __VA_ARGS__);                                                                        \
  } while (0)

// One handle on remax's stream, with a fixed workspace from the caching allocator (so cuBLAS never
// allocates during a step, and picks the same algorithms every run).
static pthread_once_t handle_once = PTHREAD_ONCE_INIT;
static cublasHandle_t the_handle;
static char handle_error[512];
static const size_t WORKSPACE = (size_t)32 << 20;

static void init_handle(void) {
  cudaStream_t s = rx_cuda_stream();
  if (!s) { snprintf(handle_error, sizeof handle_error, "%s", rx_last_error()); return; }
  cublasHandle_t h;
  cublasStatus_t st = cublasCreate(&h);
  if (st != CUBLAS_STATUS_SUCCESS) {
    snprintf(handle_error, sizeof handle_error, "cublas: cublasCreate failed: %s", cublas_status_name(st));
    return;
  }
  void *ws, *ws_handle;
  if (rx_cuda_malloc(&ws, &ws_handle, WORKSPACE, "cuBLAS workspace")) {
    snprintf(handle_error, sizeof handle_error, "%s", rx_last_error());
    cublasDestroy(h);
    return;
  }
  st = cublasSetStream(h, s);
  if (st == CUBLAS_STATUS_SUCCESS) st = cublasSetWorkspace(h, ws, WORKSPACE);
  if (st == CUBLAS_STATUS_SUCCESS) st = cublasSetMathMode(h, CUBLAS_DEFAULT_MATH);   // no TF32 for f32
  if (st != CUBLAS_STATUS_SUCCESS) {
    snprintf(handle_error, sizeof handle_error, "cublas: setting up the handle failed: %s", cublas_status_name(st));
    cublasDestroy(h);
    rx_cuda_release(ws_handle);
    return;
  }
  the_handle = h;
}

static cublasHandle_t handle(void) {
  pthread_once(&handle_once, init_handle);
  if (!the_handle) rx_fail(RX_EDEVICE, "%s", handle_error);
  return the_handle;
}

template <typename T>
__global__ void add_bias_kernel(T *out, const T *bias, int64_t N, int64_t OC) {
  const int64_t total = N * OC;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x)
    rx_st(out, i, rx_ld(out, i) + rx_ld(bias, i % OC));
}

template <typename T>
struct dout_term {
  const T *dout;
  int64_t OC;
  __device__ float operator()(int64_t n, int64_t c) const { return rx_ld(dout, n * OC + c); }
};

static cudaDataType_t data_type(int32_t dtype) { return dtype == RX_BF16 ? CUDA_R_16BF : CUDA_R_32F; }

extern "C" int rx_cuda_matmul_forward(void *out, const void *inp, const void *weight, const void *bias, int64_t N,
                                      int64_t C, int64_t OC, int32_t dtype) {
  const char *op = "matmul";
  RX_STREAM(s);
  if (dtype != RX_F32 && dtype != RX_BF16)
    return rx_fail(RX_EINVAL, "%s: no cuda kernel for dtype %s (f32 and bf16 only)", op, rx_dtype_name(dtype));
  cublasHandle_t h = handle();
  if (!h) return RX_EDEVICE;
  if (N == 0 || OC == 0) return RX_OK;
  const float one = 1, zero = 0;
  const cudaDataType_t t = data_type(dtype);
  if (C == 0) {   // no inputs: out is the bias alone (zeros without one)
    int rc = rx_cuda_memset0(out, (size_t)(N * OC * rx_dtype_size(dtype)));
    if (rc) return rc;
  } else {
    RX_CUBLAS(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, (int)OC, (int)N, (int)C, &one, weight, t, (int)C, inp, t, (int)C,
                           &zero, out, t, (int)OC, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
              op, "N=%lld C=%lld OC=%lld dtype=%s", (long long)N, (long long)C, (long long)OC, rx_dtype_name(dtype));
  }
  if (bias) {
    RX_DISPATCH_FLOAT(dtype, op,
      RX_LAUNCH((add_bias_kernel<T>), rx_blocks(N * OC, 256), 256, 0, s, (T *)out, (const T *)bias, N, OC));
    RX_LAUNCHED(op, "bias N=%lld OC=%lld", (long long)N, (long long)OC);
  }
  return RX_OK;
}

extern "C" int rx_cuda_matmul_backward(void *dinp, float *dweight, float *dbias, const void *dout, const void *inp,
                                       const void *weight, int64_t N, int64_t C, int64_t OC, int32_t dtype) {
  const char *op = "matmul_backward";
  if (!rx_cuda_stream()) return RX_EDEVICE;
  if (dtype != RX_F32 && dtype != RX_BF16)
    return rx_fail(RX_EINVAL, "%s: no cuda kernel for dtype %s (f32 and bf16 only)", op, rx_dtype_name(dtype));
  cublasHandle_t h = handle();
  if (!h) return RX_EDEVICE;
  const float one = 1, zero = 0;
  const cudaDataType_t t = data_type(dtype);
  if (dinp && N > 0 && C > 0) {
    if (OC == 0) {
      int rc = rx_cuda_memset0(dinp, (size_t)(N * C * rx_dtype_size(dtype)));
      if (rc) return rc;
    } else {
      RX_CUBLAS(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, (int)C, (int)N, (int)OC, &one, weight, t, (int)C, dout, t,
                             (int)OC, &zero, dinp, t, (int)C, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                op, "dinp: N=%lld C=%lld OC=%lld dtype=%s", (long long)N, (long long)C, (long long)OC, rx_dtype_name(dtype));
    }
  }
  if (dweight && N > 0 && C > 0 && OC > 0) {   // f32 gradient: C type CUDA_R_32F whatever the inputs
    RX_CUBLAS(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_T, (int)C, (int)OC, (int)N, &one, inp, t, (int)C, dout, t, (int)OC,
                           &one, dweight, CUDA_R_32F, (int)C, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
              op, "dweight: N=%lld C=%lld OC=%lld dtype=%s", (long long)N, (long long)C, (long long)OC, rx_dtype_name(dtype));
  }
  if (dbias) {
    RX_DISPATCH_FLOAT(dtype, op, {
      dout_term<T> f = {(const T *)dout, OC};
      int rc = rx_colsum(dbias, f, N, OC, "matmul_backward (dbias)");
      if (rc) return rc;
    });
  }
  return RX_OK;
}
