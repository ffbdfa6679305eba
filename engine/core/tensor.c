/* tensor.c: storage, tensor views, copy/convert, fill, Philox random fill. Storage on a device
 * other than the CPU comes from that device's registered memory table (rx_device_register, e.g.
 * the CUDA backend's caching allocator); element access to it goes through a host copy. */
#include "internal.h"
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct rx_storage {
  void *data;
  int64_t bytes;
  int32_t device;
  int32_t owned;     /* 0 for rx_tensor_wrap */
  int64_t refs;
  void *handle;      /* the device allocator's piece, for device storage */
};

static const rx_device_memory *device_tables[8];

void rx_device_register(int32_t device, const rx_device_memory *table) {
  if (device > RX_CPU && device < (int32_t)(sizeof device_tables / sizeof device_tables[0])) device_tables[device] = table;
}

const rx_device_memory *rx_device_memory_of(int32_t device) {
  return device > RX_CPU && device < (int32_t)(sizeof device_tables / sizeof device_tables[0]) ? device_tables[device]
                                                                                                : NULL;
}

void *rx_alloc(size_t bytes, const char *what) {
  void *p = NULL;
  size_t rounded = (bytes + 63) & ~(size_t)63;
  if (posix_memalign(&p, 64, rounded ? rounded : 64) != 0) {
    rx_fail(RX_ENOMEM, "out of memory allocating %zu bytes for %s", bytes, what);
    return NULL;
  }
  return p;
}

void rx_free(void *p) { free(p); }

void *rx_arena_alloc(int32_t device, size_t bytes, const char *what, int zero, void **handle) {
  *handle = NULL;
  if (device == RX_CPU) {
    void *p = rx_alloc(bytes, what);
    if (p && zero) memset(p, 0, bytes);
    return p;
  }
  const rx_device_memory *d = rx_device_memory_of(device);
  void *p = NULL;
  if (!d) { rx_fail(RX_EDEVICE, "%s: device %d is not a device remax knows (cpu = 0, cuda = 1)", what, device); return NULL; }
  if (d->alloc(&p, handle, bytes ? bytes : 64, what)) return NULL;
  if (zero && d->memset0(p, bytes)) { d->release(*handle); *handle = NULL; return NULL; }
  return p;
}

void rx_arena_free(int32_t device, void *ptr, void *handle) {
  if (device == RX_CPU) rx_free(ptr);
  else if (ptr && rx_device_memory_of(device)) rx_device_memory_of(device)->release(handle);
}

int rx_memzero(int32_t device, void *ptr, size_t bytes) {
  if (device == RX_CPU) { memset(ptr, 0, bytes); return RX_OK; }
  const rx_device_memory *d = rx_device_memory_of(device);
  if (!d) return rx_fail(RX_EDEVICE, "memzero: device %d is not a device remax knows", device);
  return d->memset0(ptr, bytes);
}

/* ------------------------------------------------------------------ mirrors (internal.h) */

/* A fixed table: watch and unwatch (a model's creation and end) take the lock; readers, at every
 * op, take none. A slot is published by storing its master last and retired by clearing it. */
enum { MIRRORS = 64 };
typedef struct mirror { const char *master; size_t bytes; char *copy; int32_t device, stale; } mirror;
static mirror mirrors[MIRRORS];
static int mirrors_used;   /* slots [0, mirrors_used) have been used */
static pthread_mutex_t mirrors_lock = PTHREAD_MUTEX_INITIALIZER;

static const char *slot_master(const mirror *w) { return __atomic_load_n(&w->master, __ATOMIC_ACQUIRE); }
static int slots(void) { return __atomic_load_n(&mirrors_used, __ATOMIC_ACQUIRE); }

int rx_mirror_watch(const void *master, size_t bytes, int32_t device, void *copy) {
  int rc = RX_OK, i = 0;
  pthread_mutex_lock(&mirrors_lock);
  while (i < MIRRORS && mirrors[i].master) i++;
  if (i == MIRRORS) {
    rc = rx_fail(RX_ENOMEM, "more than %d bf16 working copies at once (bf16 models and LoRA adapters alive): free some",
                 MIRRORS);
  } else {
    mirrors[i].bytes = bytes;
    mirrors[i].copy = copy;
    mirrors[i].device = device;
    mirrors[i].stale = 1;
    __atomic_store_n(&mirrors[i].master, (const char *)master, __ATOMIC_RELEASE);
    if (i >= mirrors_used) __atomic_store_n(&mirrors_used, i + 1, __ATOMIC_RELEASE);
  }
  pthread_mutex_unlock(&mirrors_lock);
  return rc;
}

void rx_mirror_unwatch(const void *master) {
  pthread_mutex_lock(&mirrors_lock);
  for (int i = 0; i < mirrors_used; i++)
    if (mirrors[i].master == master) __atomic_store_n(&mirrors[i].master, NULL, __ATOMIC_RELEASE);
  pthread_mutex_unlock(&mirrors_lock);
}

/* The bytes [*lo, *hi) that t's elements span (strides are never negative). */
static int byte_span(const rx_tensor *t, const char **lo, const char **hi) {
  if (!t || !t->data || t->numel <= 0) return 0;
  int64_t last = 0;
  for (int i = 0; i < t->ndim; i++) last += (t->shape[i] - 1) * t->stride[i];
  *lo = t->data;
  *hi = (const char *)t->data + (last + 1) * rx_dtype_size(t->dtype);
  return 1;
}

void rx_note_write(const rx_tensor *t) {
  const char *lo, *hi;
  const int n = slots();
  if (!n || !byte_span(t, &lo, &hi)) return;
  for (int i = 0; i < n; i++) {
    mirror *w = &mirrors[i];
    const char *m = slot_master(w);
    if (m && w->device == t->device && lo < m + w->bytes && m < hi) __atomic_store_n(&w->stale, 1, __ATOMIC_RELAXED);
  }
}

void *rx_mirror_of(const rx_tensor *t) {
  const char *lo, *hi;
  const int n = slots();
  if (!n || t->dtype != RX_F32 || !rx_tensor_is_contiguous(t) || !byte_span(t, &lo, &hi)) return NULL;
  for (int i = 0; i < n; i++) {
    const mirror *w = &mirrors[i];
    const char *m = slot_master(w);
    if (m && w->device == t->device && lo >= m && hi <= m + w->bytes) return w->copy + (lo - m) / 2;
  }
  return NULL;
}

int rx_mirror_sync(const void *master) {
  const int n = slots();
  for (int i = 0; i < n; i++) {
    mirror *w = &mirrors[i];
    if (slot_master(w) != master) continue;
    if (!__atomic_load_n(&w->stale, __ATOMIC_RELAXED)) return RX_OK;
    const int64_t count[1] = {(int64_t)(w->bytes / 4)};
    rx_tensor from, to;
    rx_view_init(&from, (void *)master, RX_F32, w->device, 1, count);
    rx_view_init(&to, w->copy, RX_BF16, w->device, 1, count);
    const int prof = rx_prof_begin(RX_PROF_WORK_COPY);
    const int rc = rx_tensor_copy(&to, &from);
    rx_prof_end(prof);
    if (!rc) __atomic_store_n(&w->stale, 0, __ATOMIC_RELAXED);
    return rc;
  }
  return rx_fail(RX_EINVAL, "mirror_sync: no bf16 working copy is registered for these master weights");
}

const char *rx_shape_str(const rx_tensor *t, char *buf, size_t n) {
  size_t k = (size_t)snprintf(buf, n, "[");
  for (int i = 0; i < t->ndim && k < n; i++)
    k += (size_t)snprintf(buf + k, n - k, i ? ",%lld" : "%lld", (long long)t->shape[i]);
  if (k < n) snprintf(buf + k, n - k, "]");
  return buf;
}

static int check_shape(int32_t ndim, const int64_t *shape, int64_t *numel) {
  if (ndim < 0 || ndim > RX_MAX_DIMS) return rx_fail(RX_EINVAL, "tensor ndim %d out of range 0..4", ndim);
  int64_t n = 1;
  for (int i = 0; i < ndim; i++) {
    if (shape[i] < 0) return rx_fail(RX_EINVAL, "tensor dim %d has negative size %lld", i, (long long)shape[i]);
    if (shape[i] && n > INT64_MAX / 8 / shape[i]) return rx_fail(RX_EINVAL, "tensor size overflows");
    n *= shape[i];
  }
  *numel = n;
  return RX_OK;
}

static void set_contiguous(rx_tensor *t, int32_t ndim, const int64_t *shape, int64_t numel) {
  t->ndim = ndim;
  t->numel = numel;
  int64_t s = 1;
  for (int i = RX_MAX_DIMS - 1; i >= 0; i--) {
    t->shape[i] = i < ndim ? shape[i] : 1;
    t->stride[i] = i < ndim ? s : 0;
    if (i < ndim) s *= shape[i];
  }
}

static int storage_new(rx_storage **out, int32_t device, int64_t bytes, void *wrap) {
  rx_storage *s = calloc(1, sizeof *s);
  if (!s) return rx_fail(RX_ENOMEM, "out of memory for tensor storage");
  s->bytes = bytes;
  s->device = device;
  s->refs = 1;
  if (wrap) { s->data = wrap; *out = s; return RX_OK; }
  s->owned = 1;
  if (device == RX_CPU) {
    s->data = rx_alloc((size_t)bytes, "tensor");
    if (!s->data) { free(s); return RX_ENOMEM; }
    memset(s->data, 0, (size_t)bytes);
  } else if (rx_device_memory_of(device)) {
    const rx_device_memory *d = rx_device_memory_of(device);
    int rc = d->alloc(&s->data, &s->handle, (size_t)bytes, "tensor");
    if (!rc) rc = d->memset0(s->data, (size_t)bytes);
    if (rc) { d->release(s->handle); free(s); return rc; }
  } else {
    free(s);
    return rx_fail(RX_EDEVICE, "device %d is not a device remax knows (cpu = 0, cuda = 1)", device);
  }
  *out = s;
  return RX_OK;
}

static void storage_release(rx_storage *s) {
  if (!s || --s->refs > 0) return;
  if (s->owned && s->device == RX_CPU) rx_free(s->data);
  if (s->owned && s->device != RX_CPU) rx_device_memory_of(s->device)->release(s->handle);
  free(s);
}

int rx_tensor_new(rx_tensor **out, int32_t dtype, int32_t device, int32_t ndim, const int64_t *shape) {
  int64_t numel;
  *out = NULL;
  if (dtype < 0 || dtype >= RX_DTYPE_COUNT) return rx_fail(RX_EINVAL, "invalid dtype %d", dtype);
  if (check_shape(ndim, shape, &numel)) return RX_EINVAL;
  rx_tensor *t = calloc(1, sizeof *t);
  if (!t) return rx_fail(RX_ENOMEM, "out of memory for tensor header");
  int rc = storage_new(&t->storage, device, numel * rx_dtype_size(dtype), NULL);
  if (rc) { free(t); return rc; }
  t->data = t->storage->data;
  t->dtype = dtype;
  t->device = device;
  set_contiguous(t, ndim, shape, numel);
  *out = t;
  return RX_OK;
}

int rx_tensor_wrap(rx_tensor **out, void *data, int32_t dtype, int32_t ndim, const int64_t *shape) {
  int64_t numel;
  *out = NULL;
  if (dtype < 0 || dtype >= RX_DTYPE_COUNT) return rx_fail(RX_EINVAL, "invalid dtype %d", dtype);
  if (check_shape(ndim, shape, &numel)) return RX_EINVAL;
  rx_tensor *t = calloc(1, sizeof *t);
  if (!t) return rx_fail(RX_ENOMEM, "out of memory for tensor header");
  int rc = storage_new(&t->storage, RX_CPU, numel * rx_dtype_size(dtype), data);
  if (rc) { free(t); return rc; }
  t->data = data;
  t->dtype = dtype;
  set_contiguous(t, ndim, shape, numel);
  *out = t;
  return RX_OK;
}

void rx_view_init(rx_tensor *t, void *data, int32_t dtype, int32_t device, int32_t ndim, const int64_t *shape) {
  int64_t numel = 1;
  for (int i = 0; i < ndim; i++) numel *= shape[i];
  memset(t, 0, sizeof *t);
  t->data = data;
  t->dtype = dtype;
  t->device = device;
  set_contiguous(t, ndim, shape, numel);
}

void rx_tensor_free(rx_tensor *t) {
  if (!t) return;
  storage_release(t->storage);
  free(t);
}

static rx_tensor *view_of(const rx_tensor *t) {
  rx_tensor *v = malloc(sizeof *v);
  if (!v) { rx_fail(RX_ENOMEM, "out of memory for tensor view"); return NULL; }
  *v = *t;
  if (v->storage) v->storage->refs++;   /* an engine view (rx_view_init) has no storage: the owner keeps it */
  return v;
}

int rx_tensor_is_contiguous(const rx_tensor *t) {
  int64_t s = 1;
  for (int i = t->ndim - 1; i >= 0; i--) {
    if (t->shape[i] != 1 && t->stride[i] != s) return 0;
    s *= t->shape[i];
  }
  return 1;
}

int rx_tensor_reshape(rx_tensor **out, const rx_tensor *t, int32_t ndim, const int64_t *shape) {
  int64_t dims[RX_MAX_DIMS], known = 1, numel;
  int infer = -1;
  char buf[96];
  *out = NULL;
  if (ndim < 0 || ndim > RX_MAX_DIMS) return rx_fail(RX_EINVAL, "reshape: ndim %d out of range 0..4", ndim);
  if (!rx_tensor_is_contiguous(t)) return rx_fail(RX_EINVAL, "reshape: tensor %s is not contiguous", rx_shape_str(t, buf, sizeof buf));
  for (int i = 0; i < ndim; i++) {
    dims[i] = shape[i];
    if (shape[i] == -1) {
      if (infer >= 0) return rx_fail(RX_EINVAL, "reshape: more than one -1 in the new shape");
      infer = i;
    } else known *= shape[i];
  }
  if (infer >= 0) dims[infer] = known ? t->numel / known : 0;
  if (check_shape(ndim, dims, &numel)) return RX_EINVAL;
  if (numel != t->numel)
    return rx_fail(RX_EINVAL, "reshape: %s has %lld elements, new shape has %lld",
                   rx_shape_str(t, buf, sizeof buf), (long long)t->numel, (long long)numel);
  rx_tensor *v = view_of(t);
  if (!v) return RX_ENOMEM;
  set_contiguous(v, ndim, dims, numel);
  *out = v;
  return RX_OK;
}

int rx_tensor_narrow(rx_tensor **out, const rx_tensor *t, int32_t dim, int64_t start, int64_t len) {
  char buf[96];
  *out = NULL;
  if (dim < 0 || dim >= t->ndim) return rx_fail(RX_EINVAL, "narrow: dim %d out of range for %s", dim, rx_shape_str(t, buf, sizeof buf));
  if (start < 0 || len < 0 || start + len > t->shape[dim])
    return rx_fail(RX_EINVAL, "narrow: [%lld, %lld) outside dim %d of %s", (long long)start,
                   (long long)(start + len), dim, rx_shape_str(t, buf, sizeof buf));
  rx_tensor *v = view_of(t);
  if (!v) return RX_ENOMEM;
  v->data = (char *)t->data + start * t->stride[dim] * rx_dtype_size(t->dtype);
  v->shape[dim] = len;
  v->numel = 1;
  for (int i = 0; i < v->ndim; i++) v->numel *= v->shape[i];
  *out = v;
  return RX_OK;
}

/* Offset in elements of logical flat index i. */
static int64_t element_offset(const rx_tensor *t, int64_t i) {
  int64_t off = 0;
  for (int d = t->ndim - 1; d >= 0; d--) {
    off += (i % t->shape[d]) * t->stride[d];
    i /= t->shape[d];
  }
  return off;
}

static double load(const void *p, int32_t dtype, int64_t k) {
  switch (dtype) {
    case RX_F32: return ((const float *)p)[k];
    case RX_F64: return ((const double *)p)[k];
    case RX_BF16: return rx_bf16_to_f32(((const uint16_t *)p)[k]);
    case RX_F16: return rx_f16_to_f32(((const uint16_t *)p)[k]);
    case RX_I32: return ((const int32_t *)p)[k];
    case RX_I64: return (double)((const int64_t *)p)[k];
  }
  return 0;
}

static void store(void *p, int32_t dtype, int64_t k, double v) {
  switch (dtype) {
    case RX_F32: ((float *)p)[k] = (float)v; break;
    case RX_F64: ((double *)p)[k] = v; break;
    case RX_BF16: ((uint16_t *)p)[k] = rx_f32_to_bf16((float)v); break;
    case RX_F16: ((uint16_t *)p)[k] = rx_f32_to_f16((float)v); break;
    case RX_I32: ((int32_t *)p)[k] = (int32_t)v; break;
    case RX_I64: ((int64_t *)p)[k] = (int64_t)v; break;
  }
}

static int need_known(const rx_tensor *t, const char *op) {
  if (t->device != RX_CPU && !rx_device_memory_of(t->device)) return rx_fail(RX_EDEVICE, "%s: unknown device %d", op, t->device);
  return RX_OK;
}

/* Element access to a device tensor goes through a contiguous host tensor of the same dtype and
 * shape: filled from the device when `load`, written back by to_device. */
static int host_copy(rx_tensor **h, const rx_tensor *t, int load) {
  int rc = rx_tensor_new(h, t->dtype, RX_CPU, t->ndim, t->shape);
  if (!rc && load) rc = rx_tensor_copy(*h, t);
  if (rc) { rx_tensor_free(*h); *h = NULL; }
  return rc;
}

static int to_device(rx_tensor *t, rx_tensor *h, int rc) {
  if (!rc) rc = rx_tensor_copy(t, h);
  rx_tensor_free(h);
  return rc;
}

int rx_tensor_copy(rx_tensor *dst, const rx_tensor *src) {
  char a[96], b[96];
  if (need_known(dst, "copy") || need_known(src, "copy")) return RX_EDEVICE;
  if (dst->numel != src->numel)
    return rx_fail(RX_EINVAL, "copy: destination %s and source %s differ in element count",
                   rx_shape_str(dst, a, sizeof a), rx_shape_str(src, b, sizeof b));
  rx_note_write(dst);
  if (dst->device != RX_CPU) return rx_device_memory_of(dst->device)->copy(dst, src);
  if (src->device != RX_CPU) return rx_device_memory_of(src->device)->copy(dst, src);
  int64_t n = src->numel;
  int dc = rx_tensor_is_contiguous(dst), sc = rx_tensor_is_contiguous(src);
  if (dc && sc && dst->dtype == src->dtype) {
    memmove(dst->data, src->data, (size_t)(n * rx_dtype_size(src->dtype)));
    return RX_OK;
  }
  if (dc && sc && dst->dtype == RX_F32 && src->dtype == RX_BF16) {
    const uint16_t *s = src->data;
    float *d = dst->data;
    #pragma omp parallel for schedule(static) if (n > 65536)
    for (int64_t i = 0; i < n; i++) d[i] = rx_bf16_to_f32(s[i]);
    return RX_OK;
  }
  if (dc && sc && dst->dtype == RX_BF16 && src->dtype == RX_F32) {   /* a bf16 model's working copy, every step */
    const uint32_t *s = src->data;
    uint16_t *d = dst->data;
    /* rx_f32_to_bf16 (dtype.c) written out, so that the loop vectorises: nearest even, NaN quiet */
    #pragma omp parallel for simd schedule(static) if (n > 65536)
    for (int64_t i = 0; i < n; i++) {
      const uint32_t u = s[i];
      d[i] = (u & 0x7fffffffu) > 0x7f800000u ? (uint16_t)((u >> 16) | 0x40) : (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    }
    return RX_OK;
  }
  #pragma omp parallel for schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; i++) {
    int64_t so = sc ? i : element_offset(src, i), doff = dc ? i : element_offset(dst, i);
    if (src->dtype == RX_I64 && dst->dtype == RX_I64) ((int64_t *)dst->data)[doff] = ((const int64_t *)src->data)[so];
    else store(dst->data, dst->dtype, doff, load(src->data, src->dtype, so));
  }
  return RX_OK;
}

int rx_tensor_fill(rx_tensor *t, double value) {
  if (need_known(t, "fill")) return RX_EDEVICE;
  rx_note_write(t);
  if (t->device != RX_CPU) {
    if (rx_tensor_is_contiguous(t)) return rx_device_memory_of(t->device)->fill(t, value);
    rx_tensor *h;
    if (host_copy(&h, t, 0)) return rx_fail_context(RX_EDEVICE, "fill");
    return to_device(t, h, rx_tensor_fill(h, value));
  }
  int c = rx_tensor_is_contiguous(t);
  for (int64_t i = 0; i < t->numel; i++) store(t->data, t->dtype, c ? i : element_offset(t, i), value);
  return RX_OK;
}

/* Uniform double in (0, 1] from 32 random bits pairs: 53-bit resolution. */
static double u01(uint32_t hi, uint32_t lo) {
  uint64_t bits = ((uint64_t)hi << 21) ^ (lo >> 11);
  return ((double)(bits & ((1ull << 53) - 1)) + 1.0) / 9007199254740992.0;
}

/* Element i takes the Philox block at counter (offset + i) so it never depends on threads. */
static void philox_at(uint64_t seed, uint64_t index, uint32_t r[4]) {
  uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
  uint32_t ctr[4] = {(uint32_t)index, (uint32_t)(index >> 32), 0x52454d41u /* "REMA" */, 0};
  rx_philox4x32(key, ctr, r);
}

int rx_tensor_uniform(rx_tensor *t, uint64_t seed, uint64_t offset, double lo, double hi) {
  if (need_known(t, "uniform")) return RX_EDEVICE;
  rx_note_write(t);
  if (t->device != RX_CPU) {   /* the same numbers as on the CPU: drawn there, then copied */
    rx_tensor *h;
    if (host_copy(&h, t, 0)) return rx_fail_context(RX_EDEVICE, "uniform");
    return to_device(t, h, rx_tensor_uniform(h, seed, offset, lo, hi));
  }
  if (!rx_is_float_dtype(t->dtype)) return rx_fail(RX_EINVAL, "uniform: dtype %s is not a float type", rx_dtype_name(t->dtype));
  int c = rx_tensor_is_contiguous(t);
  #pragma omp parallel for schedule(static) if (t->numel > 65536)
  for (int64_t i = 0; i < t->numel; i++) {
    uint32_t r[4];
    philox_at(seed, offset + (uint64_t)i, r);
    store(t->data, t->dtype, c ? i : element_offset(t, i), lo + (hi - lo) * (1.0 - u01(r[0], r[1])));
  }
  return RX_OK;
}

int rx_tensor_normal(rx_tensor *t, uint64_t seed, uint64_t offset, double mean, double std) {
  if (need_known(t, "normal")) return RX_EDEVICE;
  rx_note_write(t);
  if (t->device != RX_CPU) {   /* the same numbers as on the CPU: drawn there, then copied */
    rx_tensor *h;
    if (host_copy(&h, t, 0)) return rx_fail_context(RX_EDEVICE, "normal");
    return to_device(t, h, rx_tensor_normal(h, seed, offset, mean, std));
  }
  if (!rx_is_float_dtype(t->dtype)) return rx_fail(RX_EINVAL, "normal: dtype %s is not a float type", rx_dtype_name(t->dtype));
  int c = rx_tensor_is_contiguous(t);
  #pragma omp parallel for schedule(static) if (t->numel > 65536)
  for (int64_t i = 0; i < t->numel; i++) {
    uint32_t r[4];
    philox_at(seed, offset + (uint64_t)i, r);
    double z = sqrt(-2.0 * log(u01(r[0], r[1]))) * cos(6.283185307179586 * u01(r[2], r[3]));
    store(t->data, t->dtype, c ? i : element_offset(t, i), mean + std * z);
  }
  return RX_OK;
}

int rx_tensor_get(const rx_tensor *t, int64_t index, double *value) {
  if (need_known(t, "get")) return RX_EDEVICE;
  if (t->device != RX_CPU) {
    rx_tensor *h;
    if (index < 0 || index >= t->numel)
      return rx_fail(RX_EINVAL, "get: index %lld out of range [0, %lld)", (long long)index, (long long)t->numel);
    rx_tensor flat = *t;   /* one element: a 1-element view at its offset, copied alone */
    int64_t one = 1;
    flat.data = (char *)t->data + element_offset(t, index) * rx_dtype_size(t->dtype);
    flat.ndim = 1; flat.shape[0] = 1; flat.stride[0] = 1; flat.numel = 1;
    if (rx_tensor_new(&h, t->dtype, RX_CPU, 1, &one)) return RX_ENOMEM;
    int rc = rx_tensor_copy(h, &flat);
    if (!rc) *value = load(h->data, h->dtype, 0);
    rx_tensor_free(h);
    return rc;
  }
  if (index < 0 || index >= t->numel)
    return rx_fail(RX_EINVAL, "get: index %lld out of range [0, %lld)", (long long)index, (long long)t->numel);
  *value = load(t->data, t->dtype, element_offset(t, index));
  return RX_OK;
}

int rx_tensor_set(rx_tensor *t, int64_t index, double value) {
  if (need_known(t, "set")) return RX_EDEVICE;
  rx_note_write(t);
  if (t->device != RX_CPU) {
    rx_tensor *h;
    if (index < 0 || index >= t->numel)
      return rx_fail(RX_EINVAL, "set: index %lld out of range [0, %lld)", (long long)index, (long long)t->numel);
    if (host_copy(&h, t, 1)) return rx_fail_context(RX_EDEVICE, "set");
    return to_device(t, h, rx_tensor_set(h, index, value));
  }
  if (index < 0 || index >= t->numel)
    return rx_fail(RX_EINVAL, "set: index %lld out of range [0, %lld)", (long long)index, (long long)t->numel);
  store(t->data, t->dtype, element_offset(t, index), value);
  return RX_OK;
}

int rx_tensor_read_f64(const rx_tensor *t, double *out) {
  if (need_known(t, "read")) return RX_EDEVICE;
  if (t->device != RX_CPU) {
    rx_tensor *h;
    if (host_copy(&h, t, 1)) return rx_fail_context(RX_EDEVICE, "read");
    int rc = rx_tensor_read_f64(h, out);
    rx_tensor_free(h);
    return rc;
  }
  int c = rx_tensor_is_contiguous(t);
  for (int64_t i = 0; i < t->numel; i++) out[i] = load(t->data, t->dtype, c ? i : element_offset(t, i));
  return RX_OK;
}

int rx_tensor_write_f64(rx_tensor *t, const double *in) {
  if (need_known(t, "write")) return RX_EDEVICE;
  rx_note_write(t);
  if (t->device != RX_CPU) {
    rx_tensor *h;
    if (host_copy(&h, t, 0)) return rx_fail_context(RX_EDEVICE, "write");
    return to_device(t, h, rx_tensor_write_f64(h, in));
  }
  int c = rx_tensor_is_contiguous(t);
  for (int64_t i = 0; i < t->numel; i++) store(t->data, t->dtype, c ? i : element_offset(t, i), in[i]);
  return RX_OK;
}

int rx_check_tensor(const rx_tensor *t, const char *op, const char *what, int32_t ndim) {
  char buf[96];
  if (!t) return rx_fail(RX_EINVAL, "%s: %s is missing", op, what);
  if (ndim >= 0 && t->ndim != ndim)
    return rx_fail(RX_EINVAL, "%s: %s has shape %s, expected %d dims", op, what, rx_shape_str(t, buf, sizeof buf), ndim);
  if (!rx_tensor_is_contiguous(t)) return rx_fail(RX_EINVAL, "%s: %s %s is not contiguous", op, what, rx_shape_str(t, buf, sizeof buf));
  return RX_OK;
}

int rx_check_same(const rx_tensor *a, const rx_tensor *b, const char *op, const char *what) {
  if (a->dtype != b->dtype)
    return rx_fail(RX_EINVAL, "%s: %s has dtype %s, expected %s", op, what, rx_dtype_name(b->dtype), rx_dtype_name(a->dtype));
  if (a->device != b->device) return rx_fail(RX_EINVAL, "%s: %s is on device %d, expected %d", op, what, b->device, a->device);
  return RX_OK;
}
