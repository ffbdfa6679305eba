// cublas.cc: the cuBLAS subset of the CUDA emulator (cublas_v2.h): cublasGemmEx with cuBLAS's
// column-major semantics and argument checks, computed by a plain loop that accumulates in double.
// Argument errors return CUBLAS_STATUS_INVALID_VALUE or NOT_SUPPORTED at the call, as cuBLAS does;
// an operand that does not lie inside one device allocation is a fault of the execution
// (cudaErrorIllegalAddress), reported by the next synchronising call, as a device would.
#include "cublas_v2.h"
#include "cuda_bf16.h"
#include <stdio.h>
#include <stdlib.h>
#include <vector>

struct rx_emu_cublas {
  cudaStream_t stream = nullptr;
};

extern "C" cublasStatus_t cublasCreate(cublasHandle_t *handle) {
  *handle = new rx_emu_cublas;
  return CUBLAS_STATUS_SUCCESS;
}
extern "C" cublasStatus_t cublasDestroy(cublasHandle_t handle) {
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}
extern "C" cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t s) {
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  handle->stream = s;
  return CUBLAS_STATUS_SUCCESS;
}
extern "C" cublasStatus_t cublasSetWorkspace(cublasHandle_t handle, void *workspace, size_t bytes) {
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (bytes && !rx_emu_is_device_range(workspace, bytes)) return CUBLAS_STATUS_INVALID_VALUE;
  return CUBLAS_STATUS_SUCCESS;
}
extern "C" cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode) {
  return handle ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_NOT_INITIALIZED;
}

static size_t type_size(cudaDataType_t t) { return t == CUDA_R_16BF || t == CUDA_R_16F ? 2 : t == CUDA_R_64F ? 8 : 4; }

static float load(const void *p, cudaDataType_t t, size_t i) {
  return t == CUDA_R_16BF ? __bfloat162float(((const __nv_bfloat16 *)p)[i]) : ((const float *)p)[i];
}

// Bytes spanned by a column-major rows x cols matrix with leading dimension ld.
static size_t extent(int rows, int cols, int ld, cudaDataType_t t) {
  if (rows == 0 || cols == 0) return 0;
  return ((size_t)(cols - 1) * (size_t)ld + (size_t)rows) * type_size(t);
}

static bool operand_ok(const char *what, const void *p, int rows, int cols, int ld, cudaDataType_t t, int m, int n,
                       int k) {
  const size_t bytes = extent(rows, cols, ld, t);
  if (!bytes || rx_emu_is_device_range(p, bytes)) return true;
  rx_emu_fault(cudaErrorIllegalAddress, "cublasGemmEx(m=%d n=%d k=%d): %s at %p, %d x %d with leading dimension %d "
               "(%zu bytes), is not inside one device allocation: an out-of-bounds access", m, n, k, what, p, rows,
               cols, ld, bytes);
  return false;
}

extern "C" cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m,
                                       int n, int k, const void *alpha, const void *A, cudaDataType_t Atype, int lda,
                                       const void *B, cudaDataType_t Btype, int ldb, const void *beta, void *C,
                                       cudaDataType_t Ctype, int ldc, cublasComputeType_t computeType,
                                       cublasGemmAlgo_t algo) {
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (transa > CUBLAS_OP_C || transb > CUBLAS_OP_C || m < 0 || n < 0 || k < 0 || !alpha || !beta)
    return CUBLAS_STATUS_INVALID_VALUE;
  const int arows = transa == CUBLAS_OP_N ? m : k, acols = transa == CUBLAS_OP_N ? k : m;
  const int brows = transb == CUBLAS_OP_N ? k : n, bcols = transb == CUBLAS_OP_N ? n : k;
  if (lda < (arows > 1 ? arows : 1) || ldb < (brows > 1 ? brows : 1) || ldc < (m > 1 ? m : 1))
    return CUBLAS_STATUS_INVALID_VALUE;
  if (computeType != CUBLAS_COMPUTE_32F && computeType != CUBLAS_COMPUTE_32F_PEDANTIC) return CUBLAS_STATUS_NOT_SUPPORTED;
  const bool in_ok = Atype == Btype && (Atype == CUDA_R_32F || Atype == CUDA_R_16BF);
  const bool out_ok = Ctype == CUDA_R_32F || Ctype == Atype;
  if (!in_ok || !out_ok) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (m == 0 || n == 0) return CUBLAS_STATUS_SUCCESS;

  const float al = *(const float *)alpha, be = *(const float *)beta;
  cudaStream_t s = handle->stream;
  (void)s;   // the emulator runs work at once; the stream only orders it
  if (!operand_ok("C", C, m, n, ldc, Ctype, m, n, k)) return CUBLAS_STATUS_SUCCESS;
  if (k > 0 && al != 0 &&
      (!operand_ok("A", A, arows, acols, lda, Atype, m, n, k) || !operand_ok("B", B, brows, bcols, ldb, Btype, m, n, k)))
    return CUBLAS_STATUS_SUCCESS;
  // op(A) as rows of k, then one column of op(B) at a time
  std::vector<float> a((size_t)m * (size_t)k), b((size_t)k);
  for (int i = 0; i < m; i++)
    for (int l = 0; l < k; l++)
      a[(size_t)i * k + l] = load(A, Atype, transa == CUBLAS_OP_N ? (size_t)l * lda + i : (size_t)i * lda + l);
  for (int j = 0; j < n; j++) {
    for (int l = 0; l < k; l++)
      b[l] = load(B, Btype, transb == CUBLAS_OP_N ? (size_t)j * ldb + l : (size_t)l * ldb + j);
    for (int i = 0; i < m; i++) {
      double acc = 0;
      const float *ar = a.data() + (size_t)i * k;
      for (int l = 0; l < k; l++) acc += (double)ar[l] * b[l];
      const size_t at = (size_t)j * ldc + i;
      float v = (float)(al * acc);
      if (be != 0) v += be * load(C, Ctype, at);   // beta == 0: C is not read (it may hold NaN)
      if (Ctype == CUDA_R_16BF) ((__nv_bfloat16 *)C)[at] = __float2bfloat16_rn(v);
      else ((float *)C)[at] = v;
    }
  }
  return CUBLAS_STATUS_SUCCESS;
}
