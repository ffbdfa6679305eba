/* error.c: thread-local last-error message. */
#include "internal.h"
#include <stdio.h>
#include <string.h>

static _Thread_local char last_error[2048];

const char *rx_last_error(void) { return last_error; }
void rx_clear_error(void) { last_error[0] = 0; }

int rx_fail(int code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(last_error, sizeof last_error, fmt, ap);
  va_end(ap);
  return code;
}

int rx_fail_context(int code, const char *fmt, ...) {
  char prefix[1024], old[sizeof last_error];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(prefix, sizeof prefix, fmt, ap);
  va_end(ap);
  memcpy(old, last_error, sizeof old);
  snprintf(last_error, sizeof last_error, "%s: %s", prefix, old);
  return code;
}

const char *rx_version(void) { return "0.1.0"; }

/* 0 in a build without CUDA (cuda/none.c registers a table with no devices) */
int rx_has_cuda(void) {
  const rx_device_memory *d = rx_device_memory_of(RX_CUDA);
  return d && d->count() > 0;
}
