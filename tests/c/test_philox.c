/* test_philox.c: the sampler's uniform, rx_sample_uniform(seed, key, position), is the draw
 * docs/generation.md describes: 53 bits of the Philox-4x32-10 block keyed by the seed at counter
 * (key low, key high, position, "SAMP"), built here from the public rx_philox4x32 (itself checked
 * against Random123's known answers in test_tensor.c). The device sampler takes the same function
 * from engine/core/philox.h; tests/gpu/test_generate.c compares its tokens with the CPU's. */
#include "check.h"

static double uniform_from_public_philox(uint64_t seed, uint64_t key, int64_t position) {
  uint32_t k[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
  uint32_t c[4] = {(uint32_t)key, (uint32_t)(key >> 32), (uint32_t)position, 0x53414d50u};
  uint32_t r[4];
  rx_philox4x32(k, c, r);
  uint64_t bits = (((uint64_t)r[0] << 21) ^ (r[1] >> 11)) & ((1ull << 53) - 1);
  return ldexp((double)bits, -53);
}

static void sample_uniform_is_the_documented_philox_draw(void) {
  const uint64_t seeds[] = {0, 1, 42, 0xffffffffull, 0x123456789abcdef0ull, ~0ull};
  const uint64_t keys[] = {0, 7, 0x9e3779b97f4a7c15ull, ~0ull};
  const int64_t positions[] = {0, 1, 31, 4095, 0x7fffffff};
  int drawn = 0, below_half = 0;
  for (size_t s = 0; s < sizeof seeds / sizeof *seeds; s++)
    for (size_t k = 0; k < sizeof keys / sizeof *keys; k++)
      for (size_t p = 0; p < sizeof positions / sizeof *positions; p++) {
        double got = rx_sample_uniform(seeds[s], keys[k], positions[p]);
        double want = uniform_from_public_philox(seeds[s], keys[k], positions[p]);
        CHECK(got == want, "seed %llu key %llu position %lld: %.17g, want %.17g", (unsigned long long)seeds[s],
              (unsigned long long)keys[k], (long long)positions[p], got, want);
        CHECK(got >= 0 && got < 1, "u = %.17g outside [0, 1)", got);
        drawn++;
        below_half += got < 0.5;
      }
  /* 120 draws: a stream stuck at one value or one half would show here */
  CHECK(below_half > drawn / 4 && below_half < 3 * drawn / 4, "%d of %d draws below 0.5", below_half, drawn);
}

int main(void) {
  RUN(sample_uniform_is_the_documented_philox_draw);
  return check_summary("test_philox");
}
