/* fuzz_cpu.h: the per-input time limit of the fuzz targets, in CPU seconds of this process
 * (clock()), so that a loaded machine -- the fuzzers run under nice on shared hosts -- cannot
 * turn a fast input into a false timeout, while an input that really costs over 1 s of CPU stops
 * the run as libFuzzer's own timeout would (that one stays on, in wall time, for hangs).
 *   FUZZ_CPU_BEGIN; ... FUZZ_CPU_END(size);      limit: FUZZ_CPU_LIMIT seconds (default 1)
 *   FUZZ_CPU_TARGET(one_input)   defines LLVMFuzzerTestOneInput as one_input(data, size) within it */
#ifndef FUZZ_CPU_H
#define FUZZ_CPU_H
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double fuzz_cpu_limit(void) {
  static double limit = -1;
  if (limit < 0) {
    const char *s = getenv("FUZZ_CPU_LIMIT");
    limit = s ? atof(s) : 1.0;
  }
  return limit;
}

#define FUZZ_CPU_BEGIN clock_t fuzz_cpu_start_ = clock()
#define FUZZ_CPU_END(size)                                                                       \
  do {                                                                                           \
    double s_ = (double)(clock() - fuzz_cpu_start_) / CLOCKS_PER_SEC;                            \
    if (s_ > fuzz_cpu_limit()) {                                                                 \
      fprintf(stderr, "fuzz: an input of %zu bytes took %.2f s of CPU (limit %.2f s)\n", (size_t)(size), s_, fuzz_cpu_limit()); \
      __builtin_trap();                                                                          \
    }                                                                                            \
  } while (0)

#define FUZZ_CPU_TARGET(one_input)                                  \
  int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {    \
    FUZZ_CPU_BEGIN;                                                 \
    one_input(data, size);                                          \
    FUZZ_CPU_END(size);                                             \
    return 0;                                                       \
  }
#endif
