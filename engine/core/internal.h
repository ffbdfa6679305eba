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

/* Memory of a device other than the CPU, as core reaches it (tensors, copies, fills): a table of
 * functions that the device's backend registers when the library loads (engine/cuda/register.c),
 * so that core never names a backend. Every function returns RX_OK or sets an error. */
typedef struct rx_device_memory {
  const char *name;                                                  /* "cuda" */
  int (*count)(void);                                                /* devices present (0: none) */
  int (*alloc)(void **ptr, void **handle, size_t bytes, const char *what);   /* *handle for release */
  void (*release)(void *handle);
  int (*memset0)(void *ptr, size_t bytes);
  int (*copy)(rx_tensor *dst, const rx_tensor *src);                 /* either side on the device */
  int (*fill)(rx_tensor *t, double value);                           /* t contiguous, on the device */
} rx_device_memory;
void rx_device_register(int32_t device, const rx_device_memory *table);
/* The table of a registered device, or NULL (the CPU, or a device no backend registered). */
const rx_device_memory *rx_device_memory_of(int32_t device);

/* An engine arena (parameters, gradients, activations) on a device: 64-byte aligned, zeroed
 * when `zero`; NULL with the error set (naming `what`) on failure. *handle (NULL on the CPU) is
 * what rx_arena_free needs besides the pointer. */
void *rx_arena_alloc(int32_t device, size_t bytes, const char *what, int zero, void **handle);
void rx_arena_free(int32_t device, void *ptr, void *handle);
/* Zero `bytes` at ptr on device. */
int rx_memzero(int32_t device, void *ptr, size_t bytes);

/* Mirrors: a bf16 working copy the engine keeps equal to f32 master weights (a bf16 model's, its
 * LoRA adapters'), so that it is converted again only when the masters changed. The owner
 * registers the masters' bytes and the copy (element i of the masters at element i of the copy);
 * the mirror starts stale. Every engine entry that writes a tensor (copy, fill, random fills,
 * set, write_f64, file reads, the collectives, every op's outputs, and AdamW where it cannot
 * write the copy too) calls rx_note_write, which marks stale every mirror whose masters the
 * tensor's bytes overlap; rx_mirror_sync converts a stale mirror's masters before the owner reads
 * the copy. AdamW over masters that lie wholly inside a mirror writes their copy in the same pass
 * (rx_mirror_of) and leaves the mark alone: the copy stays equal element by element. Readers
 * take no lock (rx_note_write runs at every op); a model is used by one thread at a time. */
int rx_mirror_watch(const void *master, size_t bytes, int32_t device, void *copy);
void rx_mirror_unwatch(const void *master);
void rx_note_write(const rx_tensor *t);
/* The bf16 copy of t's first element when t is f32, contiguous and wholly inside one mirror's
 * masters; NULL otherwise. */
void *rx_mirror_of(const rx_tensor *t);
/* The copy of the mirror registered at master converted from the masters when stale (one pass,
 * padding included; profiled as "bf16 working copy from the masters"); RX_OK when current. */
int rx_mirror_sync(const void *master);

#include "profile.h"

#endif
