/* fastmath.h: math helpers for vectorised host loops, shared by the CPU kernels (engine/cpu) and
 * host-side code that is no kernel (the sampler in engine/generate). */
#ifndef RX_FASTMATH_H
#define RX_FASTMATH_H
#include <math.h>
#include <stdint.h>
#include "host_device.h"   /* the device sampler (cuda/sample.cu) uses the same exp */

/* exp(x) for float that GCC vectorises inside `omp simd` loops (glibc's expf does not without
 * -ffast-math). Cephes-style: n = round(x / ln2), r = x - n ln2 split in two constants, a degree-6
 * polynomial for exp(r) on |r| <= ln2/2, then the scale 2^n built in the exponent bits (as
 * 2^(n-1) * 2 so that n = 128 near the overflow threshold stays representable). Relative error
 * ~1 ulp; results below 2^-125 (x < -86.6) flush to 0, x > 88.72 gives inf, NaN stays NaN. */
static inline RX_HOST_DEVICE float rx_exp_f32(float x) {
  float xc = x > -86.6f ? x : -86.6f;   /* written so that NaN lands inside the range too: */
  xc = xc < 88.72283f ? xc : 88.72283f;  /* the float -> int conversion below must not see it */
  float t = xc * 1.44269504088896341f;
  float n = (t + 12582912.0f) - 12582912.0f;             /* round to nearest via 1.5 * 2^23 */
  float r = xc - n * 0.693359375f - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  union { int32_t i; float f; } scale;
  scale.i = ((int32_t)n + 126) << 23;                     /* 2^(n-1) */
  float y = p * scale.f * 2.0f;
  y = x < -86.6f ? 0.0f : y;
  y = x > 88.72283f ? INFINITY : y;
  return x != x ? x : y;
}

#endif
