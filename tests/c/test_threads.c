/* test_threads.c: the CPU thread count follows the cores other processes leave
 * (engine/core/threads.c): the decision against counts fed to it, the sampler against a real
 * busy child process, and the engine option that turns it off. */
#define _GNU_SOURCE
#include <omp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "core/threads.h"

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000};
  nanosleep(&ts, NULL);
}

/* Quiet: every core. One other busy process on 2 cores: 1 thread. Never below 1, never above
 * the cap, whatever the count. */
static void decide_follows_others(void) {
  rx_threads_state s = {0, 0};
  for (int i = 0; i < 10; i++) CHECK(rx_threads_decide(&s, 0, 2, 2) == 2, "quiet: 2 threads");
  int want = 0;
  for (int i = 0; i < 10; i++) want = rx_threads_decide(&s, 1, 2, 2);
  CHECK(want == 1, "one busy process on 2 cores: 1 thread, got %d", want);
  for (int i = 0; i < 10; i++) want = rx_threads_decide(&s, 5, 2, 2);
  CHECK(want == 1, "never below 1, got %d", want);
  for (int i = 0; i < 20; i++) want = rx_threads_decide(&s, 0, 2, 2);
  CHECK(want == 2, "back to 2 when the others stop, got %d", want);
  rx_threads_state b = {0, 0};
  for (int i = 0; i < 10; i++) want = rx_threads_decide(&b, 3, 16, 8);
  CHECK(want == 8, "16 cores, 3 others, cap 8: 8 threads, got %d", want);
  for (int i = 0; i < 10; i++) want = rx_threads_decide(&b, 12, 16, 8);
  CHECK(want == 4, "16 cores, 12 others: 4 threads, got %d", want);
}

/* A transient process (one sample in ten) does not move the decision. */
static void decide_ignores_blips(void) {
  rx_threads_state s = {0, 0};
  int changed = 0;
  for (int i = 0; i < 50; i++) changed |= rx_threads_decide(&s, i % 10 == 0 ? 1 : 0, 2, 2) != 2;
  CHECK(!changed, "a one-sample blip changed the thread count");
}

/* A real busy child process: the sampler sees it, and the engine's count drops below the cap.
 * (Only the drop is asserted: on a loaded machine the count may stay low after the child ends.) */
static void adapt_sees_busy_process(void) {
  if (rx_threads_cap() < 2) { printf("  (1 thread: nothing to adapt)\n"); return; }
  if (rx_threads_others() < 0) { printf("  (no /proc/loadavg: the count stays)\n"); return; }
  pid_t child = fork();
  if (child == 0) {
    for (volatile unsigned long i = 0;; i++) {}
  }
  CHECK(child > 0, "fork");
  if (child <= 0) return;
  int lowest = rx_threads_cap();
  for (int i = 0; i < 80 && lowest == rx_threads_cap(); i++) {   /* up to 2.4 s */
    rx_threads_adapt();
    if (rx_threads_current() < lowest) lowest = rx_threads_current();
    sleep_ms(30);
  }
  kill(child, SIGKILL);
  waitpid(child, NULL, 0);
  CHECK(lowest < rx_threads_cap(), "a busy process beside it: still %d of %d threads", lowest, rx_threads_cap());
  CHECK(omp_get_max_threads() == rx_threads_current(), "OpenMP's count is the one chosen");
}

/* threads_adapt = off gives back the full count at the next call. */
static void option_off_restores(void) {
  CHECK_OK(rx_set_option("threads_adapt", "off"));
  rx_threads_adapt();
  CHECK(rx_threads_current() == rx_threads_cap(), "off: %d of %d threads", rx_threads_current(), rx_threads_cap());
  CHECK(omp_get_max_threads() == rx_threads_cap(), "off: OpenMP has the full count");
  CHECK_OK(rx_set_option("threads_adapt", "on"));
  CHECK_FAILS(rx_set_option("threads_adapt", "maybe"), "threads_adapt");
}

int main(void) {
  if (getenv("REMAX_THREADS_ADAPT")) unsetenv("REMAX_THREADS_ADAPT");
  RUN(decide_follows_others);
  RUN(decide_ignores_blips);
  RUN(adapt_sees_busy_process);
  RUN(option_off_restores);
  return check_summary("test_threads");
}
