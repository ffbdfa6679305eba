/* dtype.c: dtype names, sizes and half-precision conversions. */
#include "internal.h"
#include <string.h>
#include <strings.h>

static const struct { const char *name; int64_t size; } dtypes[RX_DTYPE_COUNT] = {
  [RX_F32] = {"f32", 4}, [RX_F64] = {"f64", 8}, [RX_BF16] = {"bf16", 2},
  [RX_F16] = {"f16", 2}, [RX_I32] = {"i32", 4}, [RX_I64] = {"i64", 8},
};

const char *rx_dtype_name(int32_t dtype) {
  return dtype >= 0 && dtype < RX_DTYPE_COUNT ? dtypes[dtype].name : "invalid";
}

int64_t rx_dtype_size(int32_t dtype) {
  return dtype >= 0 && dtype < RX_DTYPE_COUNT ? dtypes[dtype].size : 0;
}

int rx_is_float_dtype(int32_t dtype) {
  return dtype == RX_F32 || dtype == RX_F64 || dtype == RX_BF16 || dtype == RX_F16;
}

int rx_dtype_from_name(const char *name, int32_t *dtype) {
  static const struct { const char *alias; int32_t dtype; } aliases[] = {
    {"f32", RX_F32}, {"float32", RX_F32}, {"float", RX_F32}, {"f64", RX_F64}, {"float64", RX_F64},
    {"double", RX_F64}, {"bf16", RX_BF16}, {"bfloat16", RX_BF16}, {"f16", RX_F16},
    {"float16", RX_F16}, {"half", RX_F16}, {"i32", RX_I32}, {"int32", RX_I32}, {"i64", RX_I64},
    {"int64", RX_I64},
  };
  for (size_t i = 0; i < sizeof aliases / sizeof aliases[0]; i++)
    if (name && strcasecmp(name, aliases[i].alias) == 0) { *dtype = aliases[i].dtype; return RX_OK; }
  return rx_fail(RX_EINVAL, "unknown dtype '%s' (valid: f32, f64, bf16, f16, i32, i64)",
                 name ? name : "(null)");
}

float rx_bf16_to_f32(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

uint16_t rx_f32_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
  u += 0x7fffu + ((u >> 16) & 1u);                                          /* nearest even */
  return (uint16_t)(u >> 16);
}

float rx_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ffu, u;
  if (exp == 0) {
    if (man == 0) u = sign;
    else { /* subnormal: normalise */
      exp = 127 - 15 + 1;
      while (!(man & 0x400u)) { man <<= 1; exp--; }
      u = sign | (exp << 23) | ((man & 0x3ffu) << 13);
    }
  } else if (exp == 31) u = sign | 0x7f800000u | (man << 13);
  else u = sign | ((exp + 127 - 15) << 23) | (man << 13);
  float f;
  memcpy(&f, &u, 4);
  return f;
}

uint16_t rx_f32_to_f16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  uint32_t sign = (u >> 16) & 0x8000u, abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);           /* NaN */
  if (abs >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);          /* overflow -> inf */
  if (abs < 0x38800000u) {                                            /* subnormal or zero */
    if (abs < 0x33000000u) return (uint16_t)sign;
    uint32_t exp = abs >> 23, man = (abs & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126 - exp;           /* 14 + (112 - exp) */
    uint32_t half = man >> shift, rem = man & ((1u << shift) - 1), mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1u))) half++;
    return (uint16_t)(sign | half);
  }
  uint32_t r = abs - 0x38000000u;                                     /* rebias 127 -> 15 */
  uint32_t half = r >> 13, rem = r & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (half & 1u))) half++;
  return (uint16_t)(sign | half);
}
