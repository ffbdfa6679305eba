// cuda_bf16.h of the CUDA emulator: the bfloat16 type and the conversions the kernels use.
// float -> bf16 rounds to nearest, ties to even, as the device does (NaN stays a quiet NaN).
#ifndef RX_EMU_CUDA_BF16_H
#define RX_EMU_CUDA_BF16_H
#include <stdint.h>
#include <string.h>

struct __nv_bfloat16 {
  uint16_t bits;
  __nv_bfloat16() = default;
};
typedef __nv_bfloat16 nv_bfloat16;

static inline __nv_bfloat16 __float2bfloat16_rn(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  __nv_bfloat16 r;
  if ((u & 0x7fffffffu) > 0x7f800000u) {   // NaN: keep the sign and the top payload bits, quiet
    r.bits = (uint16_t)((u >> 16) | 0x40u);
    return r;
  }
  u += 0x7fffu + ((u >> 16) & 1u);
  r.bits = (uint16_t)(u >> 16);
  return r;
}
static inline __nv_bfloat16 __float2bfloat16(float f) { return __float2bfloat16_rn(f); }
static inline float __bfloat162float(__nv_bfloat16 h) {
  uint32_t u = (uint32_t)h.bits << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}
#endif
