/* host_device.h: RX_HOST_DEVICE marks a static inline function that both the C engine and the CUDA
 * kernels call (__host__ __device__ under nvcc, nothing elsewhere: the C compiler and the CUDA
 * emulator's host C++ build), so that one definition gives the same bits on either side. */
#ifndef RX_HOST_DEVICE_H
#define RX_HOST_DEVICE_H
#if defined(__CUDACC__)
#define RX_HOST_DEVICE __host__ __device__
#else
#define RX_HOST_DEVICE
#endif
#endif
