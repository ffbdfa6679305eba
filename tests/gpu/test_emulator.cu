// test_emulator.cu: the CUDA emulator (engine/cuda/emu) catches the bugs it is there to catch.
// Each case feeds it a deliberately broken kernel or call next to the correct one and expects the
// broken one to be rejected, by the emulator itself (a fault naming the kernel, a launch error, a
// cuBLAS status) or by the check a GPU test makes (a result against a plain reference, two runs
// compared bit for bit), while the correct one passes. Cases that may end the process
// (AddressSanitizer) run in a child. Built and run only with -DRX_CUDA=emulate.
#include "common.cuh"
#include <cublas_v2.h>
#include <nccl.h>
#include <sys/wait.h>
#include <cmath>
#include <unistd.h>
#include <string>
#include <vector>

#include "check.h"

static float *dev_upload(const std::vector<float> &h) {
  float *d = nullptr;
  if (cudaMalloc((void **)&d, h.size() * sizeof(float)) != cudaSuccess) { fprintf(stderr, "cudaMalloc failed\n"); exit(1); }
  cudaMemcpy(d, h.data(), h.size() * sizeof(float), cudaMemcpyHostToDevice);
  return d;
}
static std::vector<float> dev_download(const float *d, size_t n) {
  std::vector<float> h(n);
  cudaMemcpy(h.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost);
  return h;
}
static std::vector<float> random_values(size_t n, uint64_t seed) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; i++) {
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    v[i] = (float)((double)(seed >> 11) / 9007199254740992.0 * 2 - 1) * (i % 7 == 0 ? 1000.0f : 1.0f);
  }
  return v;
}

// The error the emulator reports at the next synchronisation ("" when none).
static std::string sync_error(void) {
  cudaError_t e = cudaDeviceSynchronize();
  return e == cudaSuccess ? std::string() : std::string(cudaGetErrorString(e));
}

// Runs fn in a child process with its stderr captured: returns the exit status and the text.
static int isolated(int (*fn)(void), std::string *err) {
  int fd[2];
  if (pipe(fd) != 0) return -1;
  fflush(stderr);
  pid_t pid = fork();
  if (pid == 0) {
    close(fd[0]);
    dup2(fd[1], 2);
    _exit(fn());
  }
  close(fd[1]);
  char buf[4096];
  ssize_t k;
  while ((k = read(fd[0], buf, sizeof buf)) > 0) err->append(buf, (size_t)k);
  close(fd[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  return status;
}

// ---------------------------------------------------------------- a missing __syncthreads
// The block sum of rx_block_sum: warp sums, lane 0 of each warp writes its partial to shared
// memory, a barrier, then every warp reads the partials. Without that barrier a warp reads
// partials that other warps have not written yet (they run later in the emulator's shuffled
// order), so the sums are wrong.
template <bool BARRIER>
__global__ void block_sum_kernel(float *out, const float *x, int n) {
  __shared__ float part[32];
  float v = 0;
  for (int i = threadIdx.x; i < n; i += blockDim.x) v += x[blockIdx.x * n + i];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0) part[warp] = v;
  if (BARRIER) __syncthreads();
  v = lane < (int)(blockDim.x >> 5) ? part[lane] : 0.0f;
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if (threadIdx.x == 0) out[blockIdx.x] = v;
}

// The worst relative error of the per-block sums of x [blocks, n] against a double reference.
template <bool BARRIER>
static double block_sum_error(int blocks, int n) {
  std::vector<float> h = random_values((size_t)blocks * n, 7);
  float *x = dev_upload(h), *out = dev_upload(std::vector<float>((size_t)blocks, 0.0f));
  RX_LAUNCH((block_sum_kernel<BARRIER>), blocks, 256, 0, 0, out, x, n);
  std::vector<float> got = dev_download(out, (size_t)blocks);
  double worst = 0;
  for (int b = 0; b < blocks; b++) {
    double want = 0, scale = 0;
    for (int i = 0; i < n; i++) { want += h[(size_t)b * n + i]; scale += fabs(h[(size_t)b * n + i]); }
    double e = fabs(got[b] - want) / scale;
    if (!(e <= worst)) worst = e;   // NaN counts as worst
  }
  cudaFree(x);
  cudaFree(out);
  return worst;
}

static void test_missing_syncthreads(void) {
  CHECK(block_sum_error<true>(16, 1000) < 1e-6, "the correct block sum is wrong in the emulator");
  double e = block_sum_error<false>(16, 1000);
  CHECK(!(e < 1e-3), "a block sum without the barrier before reading shared memory gave the right answer (error %g)", e);
}

// ---------------------------------------------------------------- a barrier not every thread reaches

__global__ void early_exit_kernel(float *out, int live) {
  if ((int)threadIdx.x >= live) return;   // these threads never reach the barrier below
  __shared__ float s[64];
  s[threadIdx.x] = (float)threadIdx.x;
  __syncthreads();
  out[threadIdx.x] = s[(threadIdx.x + 1) % live];
}

static void test_barrier_not_reached(void) {
  float *out = dev_upload(std::vector<float>(64, 0.0f));
  RX_LAUNCH(early_exit_kernel, 1, 64, 0, 0, out, 64);
  CHECK(sync_error().empty(), "a barrier every thread reaches was reported");
  RX_LAUNCH(early_exit_kernel, 2, 64, 0, 0, out, 40);
  std::string e = sync_error();
  CHECK(e.find("early_exit_kernel") != std::string::npos && e.find("__syncthreads reached by 40 of 64 threads") != std::string::npos,
        "barrier reached by 40 of 64 threads: '%s'", e.c_str());
  cudaFree(out);
}

// ---------------------------------------------------------------- a shuffle with the wrong mask

__global__ void half_mask_kernel(float *out, unsigned mask, int exit_upper_half) {
  float v = (float)threadIdx.x;
  if (exit_upper_half && (threadIdx.x & 31) >= 16) return;
  for (int o = 8; o > 0; o >>= 1) v += __shfl_xor_sync(mask, v, o);
  out[threadIdx.x] = v;
}

static void test_wrong_shuffle_mask(void) {
  float *out = dev_upload(std::vector<float>(64, 0.0f));
  // the lower 16 lanes exchange among themselves with the matching mask: fine
  RX_LAUNCH(half_mask_kernel, 1, 64, 0, 0, out, 0x0000ffffu, 1);
  CHECK(sync_error().empty(), "a shuffle whose mask names exactly the lanes taking part was reported");
  std::vector<float> h = dev_download(out, 16);
  CHECK(h[0] == 120 && h[15] == 120, "16-lane xor sum: %g %g, want 120", h[0], h[15]);
  // all 32 lanes shuffle, but with a mask of 16: the upper lanes leave themselves out
  RX_LAUNCH(half_mask_kernel, 1, 64, 0, 0, out, 0x0000ffffu, 0);
  std::string e = sync_error();
  CHECK(e.find("half_mask_kernel") != std::string::npos && e.find("leaves out the calling lane") != std::string::npos,
        "mask 0xffff with 32 lanes: '%s'", e.c_str());
  // the full mask while half the lanes have exited
  RX_LAUNCH(half_mask_kernel, 1, 64, 0, 0, out, 0xffffffffu, 1);
  e = sync_error();
  CHECK(e.find("__shfl_xor_sync(mask 0xffffffff)") != std::string::npos && e.find("has exited") != std::string::npos,
        "full mask with 16 lanes gone: '%s'", e.c_str());
  // the full mask in a block of 48 threads: its second warp has 16 lanes
  RX_LAUNCH(half_mask_kernel, 1, 48, 0, 0, out, 0xffffffffu, 0);
  e = sync_error();
  CHECK(e.find("but the warp has only lanes 0..15") != std::string::npos, "full mask in a 16-lane warp: '%s'", e.c_str());
  cudaFree(out);
}

// ---------------------------------------------------------------- an index one past the end

__global__ void write_kernel(float *out, int n, int extra) {
  for (int i = threadIdx.x; i < n + extra; i += blockDim.x) out[i] = 1.0f;
}
__global__ void read_kernel(float *out, const float *x, int n, int extra) {
  float s = 0;
  for (int i = threadIdx.x; i < n + extra; i += blockDim.x) s += x[i];
  out[threadIdx.x] = s;
}

static int write_one_past_end(void) {
  float *out;
  cudaMalloc((void **)&out, 100 * sizeof(float));
  RX_LAUNCH(write_kernel, 1, 128, 0, 0, out, 100, 1);
  std::string e = sync_error();
  fprintf(stderr, "after the launch: %s\n", e.c_str());
  return e.empty() ? 0 : 3;
}
static int read_one_past_end(void) {
  float *x, *out;
  cudaMalloc((void **)&x, 100 * sizeof(float));
  cudaMalloc((void **)&out, 128 * sizeof(float));
  cudaMemset(x, 0, 100 * sizeof(float));
  RX_LAUNCH(read_kernel, 1, 128, 0, 0, out, x, 100, 1);
  return sync_error().empty() ? 0 : 3;
}
static int write_in_bounds(void) {
  float *out;
  cudaMalloc((void **)&out, 100 * sizeof(float));
  RX_LAUNCH(write_kernel, 1, 128, 0, 0, out, 100, 0);
  return sync_error().empty() ? 0 : 3;
}

static void test_one_past_the_end(void) {
  std::string err;
  int st = isolated(write_in_bounds, &err);
  CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "an in-bounds write was reported: %s", err.c_str());
  err.clear();
  st = isolated(write_one_past_end, &err);
  CHECK(!(WIFEXITED(st) && WEXITSTATUS(st) == 0), "a write one past the end went unnoticed");
  CHECK(err.find("heap-buffer-overflow") != std::string::npos || err.find("out-of-bounds write") != std::string::npos,
        "a write one past the end: %s", err.c_str());
#if defined(__SANITIZE_ADDRESS__)
  err.clear();
  st = isolated(read_one_past_end, &err);
  CHECK(!(WIFEXITED(st) && WEXITSTATUS(st) == 0) && err.find("heap-buffer-overflow") != std::string::npos,
        "a read one past the end went unnoticed: %s", err.c_str());
#else
  (void)read_one_past_end;
  fprintf(stderr, "  (a read one past the end is caught only under AddressSanitizer: not checked in this build)\n");
#endif
}

// ---------------------------------------------------------------- launch limits

__global__ void shared_kernel(float *out) {
  RX_DYNAMIC_SHARED(float, buf);
  buf[threadIdx.x] = (float)threadIdx.x;
  __syncthreads();
  out[threadIdx.x] = buf[blockDim.x - 1 - threadIdx.x];
}

static void test_launch_limits(void) {
  float *out = dev_upload(std::vector<float>(1024, 0.0f));
  cudaGetLastError();
  RX_LAUNCH(shared_kernel, 1, 256, 48 << 10, 0, out);
  CHECK(cudaGetLastError() == cudaSuccess, "48 KiB of dynamic shared memory refused");
  RX_LAUNCH(shared_kernel, 1, 256, (48 << 10) + 4, 0, out);
  cudaError_t e = cudaGetLastError();
  CHECK(e == cudaErrorInvalidValue && strstr(cudaGetErrorString(e), "shared_kernel") &&
            strstr(cudaGetErrorString(e), "cudaFuncSetAttribute"),
        "a launch over 48 KiB of shared memory: %s", cudaGetErrorString(e));
  CHECK(cudaFuncSetAttribute(shared_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 100 << 10) == cudaSuccess,
        "raising the shared memory limit to 100 KiB");
  RX_LAUNCH(shared_kernel, 1, 256, 100 << 10, 0, out);
  CHECK(cudaGetLastError() == cudaSuccess, "100 KiB after raising the limit refused");
  RX_LAUNCH(shared_kernel, 1, 256, (100 << 10) + 4, 0, out);
  CHECK(cudaGetLastError() == cudaErrorInvalidValue, "a launch over the raised limit accepted");
  CHECK(cudaFuncSetAttribute(shared_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 228 << 10) ==
            cudaErrorInvalidValue, "a limit above 227 KiB accepted");
  cudaGetLastError();
  RX_LAUNCH(shared_kernel, 1, 1025, 8192, 0, out);
  e = cudaGetLastError();
  CHECK(e == cudaErrorInvalidConfiguration && strstr(cudaGetErrorString(e), "1025 threads"), "1025 threads: %s",
        cudaGetErrorString(e));
  RX_LAUNCH(shared_kernel, dim3(1, 65536), 32, 256, 0, out);
  CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration, "grid y = 65536 accepted");
  RX_LAUNCH(shared_kernel, 1, 1024, 4096, 0, out);
  CHECK(cudaGetLastError() == cudaSuccess, "1024 threads refused");
  std::vector<float> h = dev_download(out, 1024);
  CHECK(h[0] == 1023 && h[1023] == 0, "dynamic shared memory shared by the block: %g %g", h[0], h[1023]);
  cudaFree(out);
}

// ---------------------------------------------------------------- a reduction that depends on block order

__global__ void partial_sums_kernel(float *part, float *total, const float *x, int n, int atomic) {
  __shared__ float red[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  float v = 0;
  for (int i = threadIdx.x; i < n; i += blockDim.x) v += x[(size_t)blockIdx.x * n + i];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if (lane == 0) red[warp] = v;
  __syncthreads();
  if (threadIdx.x == 0) {
    float s = 0;
    for (int w = 0; w < (int)(blockDim.x >> 5); w++) s += red[w];
    if (atomic) atomicAdd(total, s);   // the order of the blocks decides the rounding
    else part[blockIdx.x] = s;
  }
}
__global__ void ordered_total_kernel(float *total, const float *part, int blocks) {
  float s = 0;
  for (int b = 0; b < blocks; b++) s += part[b];
  *total = s;
}

static float total_of(const float *x, float *part, float *total, int blocks, int n, int atomic) {
  cudaMemset(total, 0, sizeof(float));
  RX_LAUNCH(partial_sums_kernel, blocks, 128, 0, 0, part, total, x, n, atomic);
  if (!atomic) RX_LAUNCH(ordered_total_kernel, 1, 1, 0, 0, total, part, blocks);
  return dev_download(total, 1)[0];
}

static void test_block_order_dependence(void) {
  const int blocks = 64, n = 300;
  float *x = dev_upload(random_values((size_t)blocks * n, 11));
  float *part = dev_upload(std::vector<float>(blocks, 0.0f)), *total = dev_upload(std::vector<float>(1, 0.0f));
  const float a = total_of(x, part, total, blocks, n, 0);
  bool same = true;
  for (int k = 0; k < 4; k++) same = same && total_of(x, part, total, blocks, n, 0) == a;
  CHECK(same, "partials summed in a fixed order differ between runs");
  const float b = total_of(x, part, total, blocks, n, 1);
  bool differs = false;
  for (int k = 0; k < 4 && !differs; k++) differs = total_of(x, part, total, blocks, n, 1) != b;
  CHECK(differs, "float atomicAdd of block partials gave the same bits in 5 runs: the block order does not vary");
  cudaFree(x);
  cudaFree(part);
  cudaFree(total);
}

// ---------------------------------------------------------------- GEMM arguments
// y [N, OC] = x [N, C] W^T, W [OC, C], as engine/cuda/matmul.cu calls cuBLAS: column-major,
// out^T = W x^T -> gemm(T, N, m = OC, n = N, k = C, lda = C, ldb = C, ldc = OC).

// The normalised error of the result; *status the call's, *fault what the emulator reported after it.
static double gemm_error(cublasHandle_t h, cublasOperation_t ta, int N, int C, int OC, int lda, int ldb, int *status,
                         std::string *fault) {
  std::vector<float> x = random_values((size_t)N * C, 21), w = random_values((size_t)OC * C, 22);
  float *dx = dev_upload(x), *dw = dev_upload(w), *dy = dev_upload(std::vector<float>((size_t)N * OC, 0.0f));
  const float one = 1, zero = 0;
  *status = cublasGemmEx(h, ta, CUBLAS_OP_N, OC, N, C, &one, dw, CUDA_R_32F, lda, dx, CUDA_R_32F, ldb, &zero, dy,
                         CUDA_R_32F, OC, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  *fault = sync_error();
  std::vector<float> y = dev_download(dy, (size_t)N * OC);
  double num = 0, den = 0;
  for (int n = 0; n < N; n++)
    for (int o = 0; o < OC; o++) {
      double want = 0;
      for (int c = 0; c < C; c++) want += (double)x[(size_t)n * C + c] * w[(size_t)o * C + c];
      num += (y[(size_t)n * OC + o] - want) * (y[(size_t)n * OC + o] - want);
      den += want * want;
    }
  cudaFree(dx);
  cudaFree(dw);
  cudaFree(dy);
  return sqrt(num / den);
}

static void test_gemm_arguments(void) {
  cublasHandle_t h;
  cublasCreate(&h);
  int st;
  std::string err;
  double e = gemm_error(h, CUBLAS_OP_T, 7, 12, 5, 12, 12, &st, &err);
  CHECK(st == CUBLAS_STATUS_SUCCESS && e < 1e-6 && err.empty(), "the correct GEMM: status %d error %g", st, e);
  // swapped transpose with OC != C: W read as a 5 x 12 column-major matrix overruns its memory
  gemm_error(h, CUBLAS_OP_N, 7, 12, 5, 12, 12, &st, &err);
  CHECK(err.find("A at") != std::string::npos && err.find("not inside one device allocation") != std::string::npos,
        "a swapped transpose (5 x 12): status %d, '%s'", st, err.c_str());
  // with OC == C the call is legal but computes x W instead of x W^T
  e = gemm_error(h, CUBLAS_OP_N, 7, 9, 9, 9, 9, &st, &err);
  CHECK(st == CUBLAS_STATUS_SUCCESS && err.empty() && e > 0.1, "a swapped transpose (9 x 9) matched the reference (error %g)", e);
  // a leading dimension below the rows stored
  gemm_error(h, CUBLAS_OP_T, 7, 12, 5, 11, 12, &st, &err);
  CHECK(st == CUBLAS_STATUS_INVALID_VALUE, "lda 11 < k 12 accepted: status %d", st);
  // a leading dimension past the allocation: the operand overruns its device memory
  gemm_error(h, CUBLAS_OP_T, 7, 12, 5, 12, 13, &st, &err);
  CHECK(err.find("cublasGemmEx") != std::string::npos && err.find("not inside one device allocation") != std::string::npos,
        "ldb 13 over a 7 x 12 matrix: '%s'", err.c_str());
  cublasDestroy(h);
}

// ---------------------------------------------------------------- warp operations and conversions

__global__ void warp_ops_kernel(unsigned *out) {
  const unsigned lane = threadIdx.x & 31;
  out[threadIdx.x * 4 + 0] = __ballot_sync(0xffffffffu, lane % 3 == 0);
  out[threadIdx.x * 4 + 1] = __shfl_sync(0xffffffffu, lane * 10, 5);
  out[threadIdx.x * 4 + 2] = __shfl_down_sync(0xffffffffu, lane, 4);
  out[threadIdx.x * 4 + 3] = __shfl_up_sync(0xffffffffu, lane, 1, 8);
}

static void test_warp_operations(void) {
  unsigned *out;
  cudaMalloc((void **)&out, 64 * 4 * sizeof(unsigned));
  RX_LAUNCH(warp_ops_kernel, 1, 64, 0, 0, out);
  std::vector<unsigned> h(64 * 4);
  cudaMemcpy(h.data(), out, h.size() * sizeof(unsigned), cudaMemcpyDeviceToHost);
  unsigned ballot = 0;
  for (int l = 0; l < 32; l++) ballot |= (l % 3 == 0) << l;
  int ok = 1;
  for (int t = 0; t < 64; t++) {
    const unsigned l = t & 31;
    ok &= h[t * 4] == ballot && h[t * 4 + 1] == 50 && h[t * 4 + 2] == (l + 4 < 32 ? l + 4 : l) &&
          h[t * 4 + 3] == (l % 8 >= 1 ? l - 1 : l);
  }
  CHECK(ok, "ballot, shfl, shfl_down, shfl_up (width 8) differ from the device's definitions");
  cudaFree(out);
}

static void test_bf16_rounds_to_nearest_even(void) {
  // 1 + 2^-8 lies halfway between 1 and 1 + 2^-7: ties go to the even mantissa (1.0); just above goes up
  CHECK(__bfloat162float(__float2bfloat16_rn(1.0f + 0x1p-8f)) == 1.0f, "tie below rounds down to even");
  CHECK(__bfloat162float(__float2bfloat16_rn(1.0f + 3 * 0x1p-8f)) == 1.0f + 0x1p-6f, "tie above rounds up to even");
  CHECK(__bfloat162float(__float2bfloat16_rn(1.0f + 0x1p-8f + 0x1p-20f)) == 1.0f + 0x1p-7f, "above the tie rounds up");
  CHECK(std::isnan(__bfloat162float(__float2bfloat16_rn(NAN))), "NaN stays NaN");
  CHECK(__half2float(__float2half_rn(1.0f + 0x1p-11f)) == 1.0f && __half2float(__float2half_rn(0x1p-25f)) == 0.0f &&
            __half2float(__float2half_rn(0x1.8p-25f)) == 0x1p-24f && std::isinf(__half2float(__float2half_rn(65520.0f))),
        "half: ties to even, the smallest subnormal, overflow to infinity");
}

// ---------------------------------------------------------------- graphs

__global__ void axpy_kernel(float *y, const float *x, float a, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) y[i] += a * x[i];
}

static void test_graph_replays_launches(void) {
  const int n = 1000;
  float *x = dev_upload(std::vector<float>(n, 1.0f)), *y = dev_upload(std::vector<float>(n, 0.0f));
  cudaStream_t s;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  cudaGraph_t g;
  cudaGraphExec_t ge;
  CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) == cudaSuccess, "begin capture");
  RX_LAUNCH(axpy_kernel, 3, 128, 0, s, y, x, 2.0f, n);
  RX_LAUNCH(axpy_kernel, 2, 64, 0, s, y, x, 0.5f, n);
  CHECK(cudaStreamEndCapture(s, &g) == cudaSuccess, "end capture");
  CHECK(dev_download(y, 1)[0] == 0, "a captured launch ran at capture time");
  CHECK(cudaGraphInstantiate(&ge, g, 0) == cudaSuccess, "instantiate");
  const uint64_t before = rx_emu_launch_count();
  for (int k = 0; k < 3; k++) cudaGraphLaunch(ge, s);
  cudaStreamSynchronize(s);
  std::vector<float> h = dev_download(y, n);
  CHECK(h[0] == 7.5f && h[n - 1] == 7.5f && rx_emu_launch_count() - before == 6, "graph replay: y = %g after %llu launches",
        h[0], (unsigned long long)(rx_emu_launch_count() - before));
  // a GEMM on a capturing stream is recorded too: z = 2 y (1 x n times 1 x 1), run at each replay
  float *z = dev_upload(std::vector<float>(n, 0.0f)), *two = dev_upload(std::vector<float>(1, 2.0f));
  cublasHandle_t hb;
  cublasCreate(&hb);
  cublasSetStream(hb, s);
  const float one = 1, zero = 0;
  cudaGraph_t g2;
  cudaGraphExec_t ge2;
  cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
  CHECK(cublasGemmEx(hb, CUBLAS_OP_N, CUBLAS_OP_N, 1, n, 1, &one, two, CUDA_R_32F, 1, y, CUDA_R_32F, 1, &zero, z,
                     CUDA_R_32F, 1, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS, "captured GEMM");
  cudaStreamEndCapture(s, &g2);
  CHECK(dev_download(z, 1)[0] == 0, "a captured GEMM ran at capture time");
  cudaGraphInstantiate(&ge2, g2, 0);
  cudaGraphLaunch(ge2, s);
  cudaStreamSynchronize(s);
  CHECK(dev_download(z, n)[n - 1] == 15.0f, "the GEMM replayed from the graph: %g", dev_download(z, n)[n - 1]);
  cudaGraphExecDestroy(ge2);
  cudaGraphDestroy(g2);
  cublasDestroy(hb);
  cudaFree(z);
  cudaFree(two);
  cudaGraphExecDestroy(ge);
  cudaGraphDestroy(g);
  cudaStreamDestroy(s);
  cudaFree(x);
  cudaFree(y);
}

// ---------------------------------------------------------------- a failed GEMM names its op
// A GEMM whose weight is shorter than OC x C: cuBLAS's execution fails (an operand outside its
// allocation). With REMAX_CUDA_SYNC=1 (set in main) matmul itself must report it, not the next op.

static void test_gemm_failure_is_blamed_on_matmul(void) {
  enum { N = 4, C = 8, OC = 6 };
  void *x, *w, *y, *a, *hx, *hw, *hy, *ha;
  if (rx_cuda_malloc(&x, &hx, N * C * sizeof(float), "x") || rx_cuda_malloc(&w, &hw, (OC * C - 1) * sizeof(float), "w") ||
      rx_cuda_malloc(&y, &hy, N * OC * sizeof(float), "y") || rx_cuda_malloc(&a, &ha, 64 * sizeof(float), "a")) {
    CHECK(0, "allocations: %s", rx_last_error());
    return;
  }
  rx_cuda_memset0(x, N * C * sizeof(float));
  rx_cuda_memset0(w, (OC * C - 1) * sizeof(float));
  rx_cuda_memset0(a, 64 * sizeof(float));
  int rc = rx_cuda_matmul_forward(y, x, w, NULL, N, C, OC, RX_F32);
  CHECK(rc != 0 && strstr(rx_last_error(), "matmul") && strstr(rx_last_error(), "cudaErrorIllegalAddress"),
        "a GEMM over a short weight: rc %d, '%s'", rc, rx_last_error());
  rc = rx_cuda_add(a, a, a, 64, RX_F32);
  CHECK(rc == 0, "the op after the failed GEMM was blamed for it: %s", rx_last_error());
  rx_cuda_release(hx);
  rx_cuda_release(hw);
  rx_cuda_release(hy);
  rx_cuda_release(ha);
}

// ---------------------------------------------------------------- NCCL with one rank

static void test_nccl_one_rank(void) {
  ncclUniqueId id;
  ncclComm_t comm = nullptr, two = nullptr;
  CHECK(ncclGetUniqueId(&id) == ncclSuccess && ncclCommInitRank(&comm, 1, id, 0) == ncclSuccess, "a one-rank communicator");
  ncclResult_t r = ncclCommInitRank(&two, 2, id, 0);
  CHECK(r == ncclInvalidUsage && strstr(ncclGetErrorString(r), "one rank"), "two ranks: %s", ncclGetErrorString(r));
  std::vector<float> h = random_values(100, 31);
  float *a = dev_upload(h), *b = dev_upload(std::vector<float>(100, 0.0f));
  CHECK(ncclAllReduce(a, a, 100, ncclFloat32, ncclSum, comm, 0) == ncclSuccess && dev_download(a, 100) == h,
        "all-reduce in place over one rank changed the values");
  CHECK(ncclAllReduce(a, b, 100, ncclFloat32, ncclSum, comm, 0) == ncclSuccess && dev_download(b, 100) == h,
        "all-reduce over one rank: the output is not the input");
  r = ncclAllReduce(h.data(), b, 100, ncclFloat32, ncclSum, comm, 0);
  CHECK(r == ncclInvalidArgument, "all-reduce from host memory accepted");
  r = ncclAllReduce(a, b, 101, ncclFloat32, ncclSum, comm, 0);
  CHECK(r == ncclInvalidArgument, "all-reduce past the end of the buffers accepted");
  ncclCommDestroy(comm);
  cudaFree(a);
  cudaFree(b);
}

int main(void) {
  // read once, on first use: every allocation its own (so the short weight is its own
  // allocation), and a synchronisation after every launch
  setenv("REMAX_CUDA_ALLOC", "plain", 1);
  setenv("REMAX_CUDA_SYNC", "1", 1);
  RUN(test_missing_syncthreads);
  RUN(test_barrier_not_reached);
  RUN(test_wrong_shuffle_mask);
  RUN(test_one_past_the_end);
  RUN(test_launch_limits);
  RUN(test_block_order_dependence);
  RUN(test_gemm_arguments);
  RUN(test_warp_operations);
  RUN(test_bf16_rounds_to_nearest_even);
  RUN(test_graph_replays_launches);
  RUN(test_gemm_failure_is_blamed_on_matmul);
  RUN(test_nccl_one_rank);
  return check_summary("gpu_test_emulator");
}
