// cuda_fp16.h of the CUDA emulator: the half type and its conversions, rounding to nearest even
// (subnormals included), as the device does.
#ifndef RX_EMU_CUDA_FP16_H
#define RX_EMU_CUDA_FP16_H
#include <stdint.h>
#include <string.h>

struct __half {
  uint16_t bits;
  __half() = default;
};

static inline __half __float2half_rn(float f) {
  uint32_t x;
  memcpy(&x, &f, sizeof x);
  const uint32_t sign = (x >> 16) & 0x8000u;
  x &= 0x7fffffffu;
  __half r;
  if (x >= 0x7f800000u) {   // inf or NaN
    r.bits = (uint16_t)(sign | (x > 0x7f800000u ? 0x7e00u : 0x7c00u));
    return r;
  }
  const int e = (int)(x >> 23) - 127 + 15;   // the half's biased exponent
  uint32_t h;
  if (e >= 31) {
    h = 0x7c00u;
  } else if (e >= 1) {   // normal: drop 13 mantissa bits, rounding (a carry may reach infinity)
    const uint32_t mant = x & 0x7fffffu, rem = mant & 0x1fffu;
    h = ((uint32_t)e << 10) | (mant >> 13);
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++;
  } else if (e >= -10) {   // subnormal
    const uint32_t mant = (x & 0x7fffffu) | 0x800000u;
    const int shift = 14 - e;
    const uint32_t rem = mant & ((1u << shift) - 1u), half = 1u << (shift - 1);
    h = mant >> shift;
    if (rem > half || (rem == half && (h & 1u))) h++;
  } else {
    h = 0;
  }
  r.bits = (uint16_t)(sign | h);
  return r;
}
static inline __half __float2half(float f) { return __float2half_rn(f); }
static inline float __half2float(__half h) {
  const uint32_t sign = (uint32_t)(h.bits & 0x8000u) << 16;
  uint32_t e = (h.bits >> 10) & 0x1fu, m = h.bits & 0x3ffu, u;
  if (e == 0x1f) {
    u = sign | 0x7f800000u | (m << 13);
  } else if (e != 0) {
    u = sign | ((e - 15 + 127) << 23) | (m << 13);
  } else if (m == 0) {
    u = sign;
  } else {   // subnormal: normalise
    int k = 0;
    while (!(m & 0x400u)) { m <<= 1; k++; }
    u = sign | ((uint32_t)(127 - 15 + 1 - k) << 23) | ((m & 0x3ffu) << 13);
  }
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}
#endif
