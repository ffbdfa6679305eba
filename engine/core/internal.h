/* internal.h: helpers shared by engine sources; not part of the public API. */
#ifndef RX_INTERNAL_H
#define RX_INTERNAL_H
#include "remax.h"
#include <stdarg.h>

#if defined(__GNUC__)
#define RX_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define RX_PRINTF(a, b)
#endif

/* Record a message for rx_last_error() and return code. */
int rx_fail(int code, const char *fmt, ...) RX_PRINTF(2, 3);
/* Prefix the current error message with context ("file.safetensors: ..."). */
int rx_fail_context(int code, const char *fmt, ...) RX_PRINTF(2, 3);

/* Allocation with 64-byte alignment; returns NULL and sets the error on failure. */
void *rx_alloc(size_t bytes, const char *what);
void rx_free(void *p);

/* bf16 / f16 conversion (round to nearest even). */
float rx_bf16_to_f32(uint16_t h);
uint16_t rx_f32_to_bf16(float f);
float rx_f16_to_f32(uint16_t h);
uint16_t rx_f32_to_f16(float f);

int rx_is_float_dtype(int32_t dtype);
/* Shape text such as "[2,3,4]" into buf. */
const char *rx_shape_str(const rx_tensor *t, char *buf, size_t n);

/* Fill a caller-owned rx_tensor struct as a contiguous view of data (no allocation, no storage:
 * for engine-internal views into arenas; never pass one to rx_tensor_free). */
void rx_view_init(rx_tensor *t, void *data, int32_t dtype, int32_t device, int32_t ndim, const int64_t *shape);

/* Argument checks used by kernels: returns RX_OK or sets an error naming `what`. */
int rx_check_tensor(const rx_tensor *t, const char *op, const char *what, int32_t ndim);
int rx_check_same(const rx_tensor *a, const rx_tensor *b, const char *op, const char *what);

#include "profile.h"

#endif
