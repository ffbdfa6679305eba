/* signal.c: Ctrl-C for long runs. The first SIGINT/SIGTERM only raises a flag that the training
 * loop polls between steps (so it can save a checkpoint and stop cleanly); the second one
 * restores the default action and re-raises, ending the process at once. */
#include "internal.h"
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static volatile sig_atomic_t pending;

static void on_signal(int sig) {
  if (pending) {
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
