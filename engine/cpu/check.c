/* check.c: validation helpers that must read data, so they run on the data's device. */
#include "cpu.h"

int64_t rx_cpu_first_bad_index(const int32_t *idx, int64_t n, int64_t limit, int allow_negative) {
  for (int64_t r = 0; r < n; r++) {
    if (idx[r] < 0 && allow_negative) continue;
    if (idx[r] < 0 || idx[r] >= limit) return r;
  }
  return -1;
}
