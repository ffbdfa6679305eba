/* scratch.c: the CPU kernels' grow-and-keep scratch buffers (cpu.h, rx_cpu_scratch): one
 * allocation per thread and buffer, grown to the largest size asked and kept, never one
 * allocation per call. Shared by the bf16 GEMM kernels (matmul_bf16.c, bf16_gemm.c,
 * matmul_bf16dot.c), so none of them owns it. */
#include <stdlib.h>

#include "cpu/cpu.h"

void *rx_cpu_scratch_get(rx_cpu_scratch *s, size_t bytes) {
  if (bytes <= s->bytes) return s->p;
  void *p = NULL;
  if (posix_memalign(&p, 64, bytes)) return NULL;
  free(s->p);
  s->p = p;
  s->bytes = bytes;
  return p;
}
