// device.cu: CUDA device discovery. Kernels for each op follow the CPU file names (rmsnorm.cu ...).
#include <cuda_runtime.h>

extern "C" int rx_cuda_device_count(void) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();   // clear the sticky error: no driver simply means no devices
    return 0;
  }
  return n;
}
