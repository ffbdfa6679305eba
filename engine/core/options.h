/* options.h: the engine's behaviour switches (engine/core/options.c), read by the code they
 * switch. Each is set through the API (rx_set_option, from the run's settings); its environment
 * variable, when set, overrides it as a developer's switch and is reported (rx_engine_overrides). */
#ifndef RX_OPTIONS_H
#define RX_OPTIONS_H
#include <stdint.h>
#ifdef __cplusplus
extern "C" {
#endif

enum {
  RX_OPT_BF16_GEMM,      /* auto | onednn | sgemm: the CPU's bf16 training GEMMs (REMAX_BF16_GEMM) */
  RX_OPT_BF16_DOT,       /* on | off: the AVX-512 BF16 decode kernel where the CPU has it (REMAX_NO_BF16_DOT=1: off) */
  RX_OPT_CUDA_GRAPHS,    /* on | off: decode steps replayed as CUDA graphs (REMAX_CUDA_GRAPHS=0: off) */
  RX_OPT_HOST_SAMPLER,   /* on | off: cuda rows sampled on the host (REMAX_HOST_SAMPLER=1: on) */
  RX_OPT_CUDA_ALLOC,     /* caching | plain: the device allocator (REMAX_CUDA_ALLOC); before the first allocation */
  RX_OPT_CUDA_SYNC,      /* on | off: synchronise after every kernel, so a fault names its op (REMAX_CUDA_SYNC=1) */
  RX_OPT_THREADS_ADAPT,  /* on | off: CPU threads follow the cores other processes leave (REMAX_THREADS_ADAPT=0: off) */
  RX_OPT_COUNT
};

/* The value in force of option id ("auto", "on", "plain", ...): the environment's override, else
 * what rx_set_option set, else the default. Cheap: callers may ask at every use. */
const char *rx_option_value(int id);
/* Whether the value in force of an on|off option is "on". */
int rx_option_on(int id);
/* Bumped by every rx_set_option: readers that cache a choice made from an option re-decide when
 * it moved. */
uint32_t rx_options_generation(void);
#ifdef __cplusplus
}
#endif
#endif
