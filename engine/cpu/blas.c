/* blas.c: which OpenBLAS kernels run here, and a better set where OpenBLAS fell back.
 *
 * OpenBLAS picks its kernels from the CPU model number at load time. A release older than the
 * CPU does not know its model and falls back to "Prescott" (SSE3): Debian 12's 0.3.21 does so on
 * Emerald Rapids (family 6, model 207), where its sgemm then runs at a quarter of the AVX-512
 * kernels' speed. The instruction sets are what matter, so ask for the kernels they allow. */
#include "cpu.h"
#include <stdlib.h>
#include <string.h>

char *openblas_get_corename(void);

const char *rx_blas_core(void) { return openblas_get_corename(); }

const char *rx_blas_better_core(void) {
  if (getenv("OPENBLAS_CORETYPE")) return NULL;   /* the user's choice stands */
#if defined(__x86_64__)
  /* the older x86-64 kernel sets OpenBLAS's dynamic build falls back to */
  static const char *const generic[] = {"Prescott", "Core2", "Penryn", "Dunnington", "Nehalem", "Atom", "Sandybridge"};
  const char *core = openblas_get_corename();
  int fallback = 0;
  for (size_t i = 0; i < sizeof generic / sizeof generic[0]; i++)
    if (core && strcmp(core, generic[i]) == 0) fallback = 1;
  if (!fallback) return NULL;
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512cd"))
    return "SkylakeX";
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "Haswell";
#endif
  return NULL;
}
