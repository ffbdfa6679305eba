/* threads.h: the CPU's OpenMP thread count, adapted to the cores other processes take
 * (engine/core/threads.c). */
#ifndef RX_THREADS_H
#define RX_THREADS_H
#ifdef __cplusplus
extern "C" {
#endif

/* Before a decode step or a forward/backward on the CPU: sample the other processes' runnable
 * threads (at most every 25 ms) and set OpenMP's count to the cores left, in [1, cap]. */
void rx_threads_adapt(void);
/* The most threads the engine uses: OpenMP's count when the library started. Per-thread
 * scratch is sized for it, so it holds whatever rx_threads_adapt chooses later. */
int rx_threads_cap(void);
/* The count rx_threads_adapt chose last (the cap until it has run). */
int rx_threads_current(void);
/* The runnable threads of other processes now (-1 without /proc). */
int rx_threads_others(void);

/* The decision, apart from the sampling (tests feed it counts). */
typedef struct {
  double smoothed;   /* the smoothed count of other runnable threads */
  int assumed;       /* the count the decision uses (moves when smoothed is 0.6 away) */
} rx_threads_state;
int rx_threads_decide(rx_threads_state *s, int others, int cores, int max_threads);

#ifdef __cplusplus
}
#endif
#endif
