/* register.c: the CUDA backend's memory table for core (rx_device_register in core/internal.h),
 * registered when libremax loads. Built with every configuration: without a toolkit the functions
 * come from none.c (no devices; every call fails with "built without CUDA"). */
#include "internal.h"
#include "cuda/cuda.h"

static const rx_device_memory cuda_memory = {
  "cuda", rx_cuda_device_count, rx_cuda_malloc, rx_cuda_release, rx_cuda_memset0, rx_cuda_copy, rx_cuda_fill,
};

__attribute__((constructor)) static void register_cuda(void) { rx_device_register(RX_CUDA, &cuda_memory); }
