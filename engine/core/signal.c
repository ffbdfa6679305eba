/* signal.c: Ctrl-C for long runs. The first SIGINT/SIGTERM only raises a flag that the training
 * loop polls between steps (so it can save a checkpoint and stop cleanly); the second one
 * restores the default action and re-raises, ending the process at once. */
#include "internal.h"
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static volatile sig_atomic_t pending;

/* The process groups of the children this process started (0: a free slot). */
#define RX_CHILD_MAX 256
static volatile sig_atomic_t child_groups[RX_CHILD_MAX];
static volatile sig_atomic_t installed;

static void kill_children(void) {   /* async-signal-safe: kill() only */
  for (int i = 0; i < RX_CHILD_MAX; i++) {
    int g = child_groups[i];
    if (g > 0) kill(-g, SIGKILL);
  }
}

/* Before rx_signal_install: the children go, then the signal's default action. */
static void on_fatal_signal(int sig) {
  kill_children();
  signal(sig, SIG_DFL);
  raise(sig);
}

static void at_exit(void) { kill_children(); }

int rx_child_add(int pgid) {
  static int hooked;
  if (pgid <= 0) return rx_fail(RX_EINVAL, "rx_child_add: process group %d", pgid);
  if (!hooked) {
    hooked = 1;
    atexit(at_exit);
    if (!installed) {
      struct sigaction sa, old;
      memset(&sa, 0, sizeof sa);
      sa.sa_handler = on_fatal_signal;
      sigemptyset(&sa.sa_mask);
      int sigs[2] = { SIGINT, SIGTERM };
      for (int k = 0; k < 2; k++)   /* only where nobody else handles (or ignores) it */
        if (sigaction(sigs[k], NULL, &old) == 0 && old.sa_handler == SIG_DFL) sigaction(sigs[k], &sa, NULL);
    }
  }
  for (int i = 0; i < RX_CHILD_MAX; i++)
    if (child_groups[i] == 0) { child_groups[i] = pgid; return RX_OK; }
  return rx_fail(RX_EINVAL, "rx_child_add: more than %d child processes at once", RX_CHILD_MAX);
}

void rx_child_remove(int pgid) {
  for (int i = 0; i < RX_CHILD_MAX; i++)
    if (child_groups[i] == pgid) child_groups[i] = 0;
}

static void on_signal(int sig) {
  if (pending) {
    kill_children();
    signal(sig, SIG_DFL);
    raise(sig);
    return;
  }
  pending = sig;
}

int rx_signal_install(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  if (sigaction(SIGINT, &sa, NULL) || sigaction(SIGTERM, &sa, NULL))
    return rx_fail(RX_EINVAL, "cannot install the SIGINT/SIGTERM handler");
  installed = 1;
  return RX_OK;
}

int rx_signal_pending(void) { return pending; }
void rx_signal_clear(void) { pending = 0; }

void rx_crash_point(const char *event) {
  static long at = -1, count;
  static int list;
  if (at < 0) {
    const char *a = getenv("REMAX_CRASH_AT"), *l = getenv("REMAX_CRASH_LIST");
    at = a ? atol(a) : 0;
    list = l && *l && strcmp(l, "0") != 0;
  }
  if (!at && !list) return;
  count++;
  if (list) fprintf(stderr, "remax-crash-point %ld: %s\n", count, event);
  if (count == at) raise(SIGKILL);
}
