// tests/gpu/smoke.cu: the GPU window's first check (tests/gpu/run.sh), before remax is built: can
// this machine compile a kernel for the target architecture, launch it and read back what it
// wrote? One kernel writes a known function of every index of a poisoned buffer; every element is
// checked on the host. Prints the device and "smoke: ok", or the failing call and its CUDA error.
//   nvcc -arch=sm_90 -o smoke tests/gpu/smoke.cu && ./smoke
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>

#define SMOKE_CHECK(call)                                                                   \
  do {                                                                                      \
    cudaError_t e_ = (call);                                                                \
    if (e_ != cudaSuccess) {                                                                \
      std::printf("smoke: FAIL: %s: %s (%s)\n", #call, cudaGetErrorString(e_), cudaGetErrorName(e_)); \
      return 1;                                                                             \
    }                                                                                       \
  } while (0)

__global__ void smoke_fill(unsigned *out, long long n) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
    out[i] = (unsigned)(i * 2654435761ull) ^ 0x5bd1e995u;
}

int main() {
  int count = 0;
  SMOKE_CHECK(cudaGetDeviceCount(&count));
  cudaDeviceProp p;
  SMOKE_CHECK(cudaGetDeviceProperties(&p, 0));
  int driver = 0, runtime = 0;
  SMOKE_CHECK(cudaDriverGetVersion(&driver));
  SMOKE_CHECK(cudaRuntimeGetVersion(&runtime));
  std::printf("smoke: %d device(s); 0: %s, compute capability %d.%d, %d SMs, %.1f GiB, L2 %d MiB, "
              "%zu KiB shared memory per block (opt-in), driver API %d, runtime %d\n",
              count, p.name, p.major, p.minor, p.multiProcessorCount, p.totalGlobalMem / 1073741824.0,
              p.l2CacheSize >> 20, p.sharedMemPerBlockOptin >> 10, driver, runtime);
  const long long n = 3 << 20;   // a grid-stride loop that runs more than once per thread
  unsigned *d = nullptr, *h = (unsigned *)std::malloc(n * sizeof(unsigned));
  SMOKE_CHECK(cudaMalloc(&d, n * sizeof(unsigned)));
  SMOKE_CHECK(cudaMemset(d, 0xff, n * sizeof(unsigned)));
  smoke_fill<<<2 * p.multiProcessorCount, 256>>>(d, n);
  SMOKE_CHECK(cudaGetLastError());
  SMOKE_CHECK(cudaDeviceSynchronize());
  SMOKE_CHECK(cudaMemcpy(h, d, n * sizeof(unsigned), cudaMemcpyDeviceToHost));
  long long bad = 0, first = -1;
  for (long long i = 0; i < n; i++)
    if (h[i] != ((unsigned)(i * 2654435761ull) ^ 0x5bd1e995u) && bad++ == 0) first = i;
  SMOKE_CHECK(cudaFree(d));
  std::free(h);
  if (bad) {
    std::printf("smoke: FAIL: %lld of %lld elements wrong, the first at %lld\n", bad, n, first);
    return 1;
  }
  std::printf("smoke: ok (%lld elements written by one kernel and checked)\n", n);
  return 0;
}
