/* bench/isa_rate.c: how fast one core issues the two multiply-accumulate instructions the CPU
 * kernels are built on: vdpbf16ps (AVX-512 BF16: 32 bf16 products summed pairwise into 16 f32
 * lanes) against vfmadd231ps (AVX-512F: 16 f32 products), each in a loop of 12 independent
 * accumulator chains (enough to hide either's latency; 24 chains give the same rate), one core.
 * Prints ns per instruction, multiply-accumulates per second, and the ratio of the two MAC rates.
 * The premise that bf16 doubles the f32 MAC rate holds only where the ratio is 2; where it is 1
 * or below, a kernel that is bound by arithmetic (many rows) gains nothing from bf16, and only
 * memory-bound work (one-row decoding: half the weight bytes) runs faster. Not a test.
 * Build and run with bench/isa_rate.sh. x86-64 with AVX-512 BF16 only. */
#include <stdio.h>
#include <time.h>

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + 1e-9 * t.tv_nsec;
}

#define CHAINS(I)                                                                                             \
  I " %%zmm12, %%zmm13, %%zmm0\n" I " %%zmm12, %%zmm13, %%zmm1\n" I " %%zmm12, %%zmm13, %%zmm2\n"           \
  I " %%zmm12, %%zmm13, %%zmm3\n" I " %%zmm12, %%zmm13, %%zmm4\n" I " %%zmm12, %%zmm13, %%zmm5\n"           \
  I " %%zmm12, %%zmm13, %%zmm6\n" I " %%zmm12, %%zmm13, %%zmm7\n" I " %%zmm12, %%zmm13, %%zmm8\n"           \
  I " %%zmm12, %%zmm13, %%zmm9\n" I " %%zmm12, %%zmm13, %%zmm10\n" I " %%zmm12, %%zmm13, %%zmm11\n"
#define LOOP(I)                                                                                               \
  __asm__ volatile("vpxord %%zmm12, %%zmm12, %%zmm12\n vpxord %%zmm13, %%zmm13, %%zmm13\n"                    \
                   "1:\n" CHAINS(I) "dec %0\n jnz 1b\n"                                                       \
                   : "+r"(n)                                                                                  \
                   :                                                                                          \
                   : "zmm0", "zmm1", "zmm2", "zmm3", "zmm4", "zmm5", "zmm6", "zmm7", "zmm8", "zmm9", "zmm10", \
                     "zmm11", "zmm12", "zmm13", "cc")

static double dot_bf16(long n) { double t = now(); LOOP("vdpbf16ps"); return now() - t; }
static double fma_f32(long n) { double t = now(); LOOP("vfmadd231ps"); return now() - t; }

int main(void) {
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx512bf16")) {
    printf("isa_rate: this CPU has no AVX-512 BF16\n");
    return 0;
  }
  const long n = 40000000;
  const double instr = 12.0 * n;
  double best_dot = 1e30, best_fma = 1e30;
  for (int r = 0; r < 5; r++) {   /* alternating, best of 5 each */
    const double a = dot_bf16(n), b = fma_f32(n);
    if (a < best_dot) best_dot = a;
    if (b < best_fma) best_fma = b;
  }
  const double mac_dot = instr * 32 / best_dot, mac_fma = instr * 16 / best_fma;
  printf("vdpbf16ps   %.3f ns per instruction, %.1f G multiply-accumulates/s\n", best_dot / instr * 1e9, mac_dot * 1e-9);
  printf("vfmadd231ps %.3f ns per instruction, %.1f G multiply-accumulates/s\n", best_fma / instr * 1e9, mac_fma * 1e-9);
  printf("bf16 dot / f32 FMA multiply-accumulate rate: %.2f\n", mac_dot / mac_fma);
  return 0;
}
