/* philox.h: Philox-4x32-10 (Salmon et al., SC'11) and the sampler's uniform drawn from it, one
 * definition for the C engine (rx_philox4x32 in philox.c, rx_sample_uniform in generate.c) and the
 * device sampler (cuda/sample.cu), which must draw the same bits as the CPU. */
#ifndef RX_PHILOX_H
#define RX_PHILOX_H
#include <stdint.h>
#include "host_device.h"

/* Ten rounds of Philox-4x32 on counter c under key k; the result replaces c. */
static inline RX_HOST_DEVICE void rx_philox4x32_10(uint32_t k0, uint32_t k1, uint32_t c[4]) {
  uint32_t c0 = c[0], c1 = c[1], c2 = c[2], c3 = c[3];
  for (int round = 0; round < 10; round++) {
    uint64_t p0 = (uint64_t)0xD2511F53u * c0, p1 = (uint64_t)0xCD9E8D57u * c2;
    uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0, n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
    c1 = (uint32_t)p1;
    c3 = (uint32_t)p0;
    c0 = n0;
    c2 = n2;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  c[0] = c0; c[1] = c1; c[2] = c2; c[3] = c3;
}

/* The sampler's uniform in [0, 1) for (seed, row key, position): 53 bits of the Philox block keyed
 * by seed at counter (key, position, "SAMP"). */
static inline RX_HOST_DEVICE double rx_philox_sample_uniform(uint64_t seed, uint64_t key, int64_t position) {
  uint32_t c[4] = {(uint32_t)key, (uint32_t)(key >> 32), (uint32_t)position, 0x53414d50u /* "SAMP" */};
  rx_philox4x32_10((uint32_t)seed, (uint32_t)(seed >> 32), c);
  uint64_t bits = ((uint64_t)c[0] << 21) ^ (c[1] >> 11);
  return (double)(bits & ((1ull << 53) - 1)) / 9007199254740992.0;
}
#endif
