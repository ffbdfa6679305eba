/* reduce4.h: the horizontal sums of the AVX-512 decode kernels (matmul_rows.c, matmul_bf16dot.c).
 * Included only where AVX-512 code is compiled (a -march with it, or a target pragma). */
#ifndef RX_CPU_REDUCE4_H
#define RX_CPU_REDUCE4_H
#include <immintrin.h>

/* The sums of four vectors, [sum a, sum b, sum c, sum d], in 13 instructions instead of 4 x 9.
 * Each result adds its own vector's lanes in a fixed order (128-bit quarters 0+2 and 1+3, those
 * two, then within the quarter elements 0+2 and 1+3, those two), whatever the other three are:
 * an output's bits do not depend on which outputs share its reduction. */
static inline __attribute__((always_inline)) __m128 rx_reduce4(__m512 a, __m512 b, __m512 c, __m512 d) {
  const __m512 ab = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xEE));
  const __m512 cd = _mm512_add_ps(_mm512_shuffle_f32x4(c, d, 0x44), _mm512_shuffle_f32x4(c, d, 0xEE));
  /* quarter q of t holds four partial sums of vector q (a, b, c, d) */
  __m512 t = _mm512_add_ps(_mm512_shuffle_f32x4(ab, cd, 0x88), _mm512_shuffle_f32x4(ab, cd, 0xDD));
  t = _mm512_add_ps(t, _mm512_permute_ps(t, 0x4E));   /* elements 0+2, 1+3 */
  t = _mm512_add_ps(t, _mm512_permute_ps(t, 0xB1));   /* (0+2)+(1+3) in element 0 */
  const __m512i first = _mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 12, 8, 4, 0);
  return _mm512_castps512_ps128(_mm512_permutexvar_ps(first, t));
}

#endif
