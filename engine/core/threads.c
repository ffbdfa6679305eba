/* threads.c: the CPU's thread count, adapted to the cores that other processes take.
 *
 * OpenMP's threads meet at a barrier after every kernel. When another busy process holds one of
 * the cores, one of remax's threads waits for a core at each barrier, and every other thread waits
 * for it: on 2 cores with one busy process, 2 threads decode at ~0.2x the quiet speed, 1 thread
 * at ~0.6x (bench/shared_cores.sh, docs/benchmarks.md). So before the work of a decode step or a
 * forward/backward, rx_threads_adapt counts the runnable threads of other processes (the kernel's
 * nr_running in /proc/loadavg, less this process's own running threads from /proc/self/task),
 * smooths the count, and gives OpenMP the cores left: between 1 and the thread count it had when
 * the library started (OMP_NUM_THREADS, or every core; under mpirun each local rank's share).
 *
 * Cheap: one sample every RX_THREADS_SAMPLE_MS at most, a few small /proc reads. The engine
 * option threads_adapt (on | off; REMAX_THREADS_ADAPT=0: off) turns it off, giving back the full
 * count. Called only from the thread that drives the engine (omp_set_num_threads sets that
 * thread's count), never inside a parallel region. */
#define _GNU_SOURCE
#include <dirent.h>
#include <fcntl.h>
#include <omp.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/options.h"
#include "core/threads.h"

#define RX_THREADS_SAMPLE_MS 25

static int cap, online, current;
static rx_threads_state state;
static int64_t last_ns = -1;

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void init(void) {
  if (cap) return;
  cap = omp_get_max_threads();
  if (cap < 1) cap = 1;
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  online = n > 0 ? (int)n : cap;
  current = cap;
  state.assumed = 0;
  state.smoothed = 0;
}

int rx_threads_cap(void) {
  init();
  return cap;
}

int rx_threads_current(void) {
  init();
  return current;
}

/* A small file's text into buf (NUL-terminated); its length, or -1. */
static int read_small(const char *path, char *buf, int n) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  ssize_t got = read(fd, buf, (size_t)n - 1);
  close(fd);
  if (got <= 0) return -1;
  buf[got] = 0;
  return (int)got;
}

/* This process's threads in state R (running or runnable). */
static int own_running(void) {
  DIR *d = opendir("/proc/self/task");
  if (!d) return -1;
  int running = 0;
  char path[96], buf[512];
  for (struct dirent *e; (e = readdir(d));) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    snprintf(path, sizeof path, "/proc/self/task/%.40s/stat", e->d_name);
    if (read_small(path, buf, sizeof buf) < 0) continue;
    const char *close_paren = strrchr(buf, ')');   /* the name may hold spaces and parentheses */
    if (close_paren && close_paren[1] == ' ' && close_paren[2] == 'R') running++;
  }
  closedir(d);
  return running;
}

int rx_threads_others(void) {
  char buf[128];
  int before = own_running();
  if (before < 0 || read_small("/proc/loadavg", buf, sizeof buf) < 0) return -1;
  int after = own_running();
  /* "0.50 0.40 0.30 R/T last": R counts every runnable thread on the machine, this one included */
  double a, b, c;
  int running = 0, total = 0;
  if (sscanf(buf, "%lf %lf %lf %d/%d", &a, &b, &c, &running, &total) != 5) return -1;
  int own = before > after ? before : after;   /* a thread that changed state between the reads counts as ours */
  int others = running - own;
  return others > 0 ? others : 0;
}

int rx_threads_decide(rx_threads_state *s, int others, int cores, int max_threads) {
  /* exponential smoothing over ~3 samples, then hysteresis: a transient process (a shell, a
   * short tool) moves the estimate less than the 0.6 of a thread that changes the decision */
  s->smoothed = 0.7 * s->smoothed + 0.3 * (double)others;
  if (s->smoothed > s->assumed + 0.6 || s->smoothed < s->assumed - 0.6) s->assumed = (int)(s->smoothed + 0.5);
  int want = cores - s->assumed;
  if (want > max_threads) want = max_threads;
  if (want < 1) want = 1;
  return want;
}

void rx_threads_adapt(void) {
  init();
  if (cap == 1 || omp_in_parallel()) return;
  if (!rx_option_on(RX_OPT_THREADS_ADAPT)) {
    if (current != cap) omp_set_num_threads(current = cap);
    return;
  }
  const int64_t t = now_ns();
  if (last_ns >= 0 && t - last_ns < (int64_t)RX_THREADS_SAMPLE_MS * 1000000) return;
  last_ns = t;
  const int others = rx_threads_others();
  if (others < 0) return;   /* no /proc: keep the count */
  const int want = rx_threads_decide(&state, others, online, cap);
  if (want != current) omp_set_num_threads(current = want);
}
