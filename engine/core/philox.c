/* philox.c: the public entry to Philox-4x32-10 (the rounds are in philox.h, shared with CUDA). */
#include "internal.h"
#include "philox.h"

void rx_philox4x32(const uint32_t key[2], const uint32_t counter[4], uint32_t out[4]) {
  uint32_t c[4] = {counter[0], counter[1], counter[2], counter[3]};
  rx_philox4x32_10(key[0], key[1], c);
  out[0] = c[0]; out[1] = c[1]; out[2] = c[2]; out[3] = c[3];
}
