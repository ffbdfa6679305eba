// device.cu: the CUDA device: discovery, remax's stream, the error helpers, the caching allocator,
// copies between devices and dtypes, fill, and the index check that ops run before a gather.
#include "common.cuh"
#include "core/options.h"
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C" int rx_cuda_device_count(void) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();   // clear the error: no driver simply means no devices
    return 0;
  }
  return n;
}

extern "C" const char *rx_cuda_backend(void) {
#ifdef RX_CUDA_EMULATE
  return "emulated";
#else
  return "device";
#endif
}

int rx_cuda_error(cudaError_t e, const char *call, const char *op, const char *fmt, ...) {
  char sizes[256] = "";
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(sizes, sizeof sizes, fmt, ap);
  va_end(ap);
  int code = e == cudaErrorMemoryAllocation ? RX_ENOMEM : RX_EDEVICE;
  cudaGetLastError();   // clear a non-sticky error so that the next call starts clean
  return rx_fail(code, "%s: %s failed: %s (%s)%s%s", op, call, cudaGetErrorName(e), cudaGetErrorString(e),
                 sizes[0] ? " with " : "", sizes);
}

int64_t rx_cuda_block_cap(void) {
  static int64_t cap = -1;
  if (cap < 0) {
    const char *s = getenv("REMAX_CUDA_MAX_BLOCKS");
    long long v = s && *s ? atoll(s) : 0;
    cap = v >= 1 && v <= 65535 * 8 ? v : 65535 * 8;
  }
  return cap;
}

static int sync_each_launch(void) {
  return rx_option_on(RX_OPT_CUDA_SYNC);   /* engine option cuda_sync (REMAX_CUDA_SYNC=1) */
}

int rx_cuda_launched(const char *op, const char *fmt, ...) {
  char sizes[256] = "";
  cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess && sync_each_launch()) e = cudaStreamSynchronize(rx_cuda_stream());
  if (e == cudaSuccess) return RX_OK;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(sizes, sizeof sizes, fmt, ap);
  va_end(ap);
  return rx_cuda_error(e, "kernel launch", op, "%s", sizes);
}

// ---------------------------------------------------------------- the stream

static pthread_once_t init_once = PTHREAD_ONCE_INIT;
static cudaStream_t the_stream;
static char init_error[512];

static void init_device(void) {
  int n = rx_cuda_device_count();
  if (n < 1) { snprintf(init_error, sizeof init_error, "cuda: no CUDA device is present (or no driver)"); return; }
  cudaError_t e = cudaSetDevice(0);
  if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&the_stream, cudaStreamNonBlocking);
  if (e != cudaSuccess) {
    snprintf(init_error, sizeof init_error, "cuda: starting device 0 failed: %s (%s)", cudaGetErrorName(e),
             cudaGetErrorString(e));
    the_stream = NULL;
  }
}

cudaStream_t rx_cuda_stream(void) {
  pthread_once(&init_once, init_device);
  if (!the_stream) rx_fail(RX_EDEVICE, "%s", init_error);
  return the_stream;
}

extern "C" int rx_cuda_synchronize(void) {
  RX_STREAM(s);
  RX_CU(cudaStreamSynchronize(s), "synchronize", "stream");
  return RX_OK;
}

// ---------------------------------------------------------------- the caching allocator
// Large blocks come from cudaMalloc and stay cached; tensors are carved from them (best fit,
// split, neighbours merged on release). All work runs on one stream, so a piece released while
// kernels that use it are still queued may be handed out at once: the next user's work is queued
// after them. Blocks are returned to the driver only when an allocation would otherwise fail.
//
// REMAX_CUDA_ALLOC=plain gives every allocation its own cudaMalloc and frees it on release, so a
// memory checker (compute-sanitizer memcheck, the emulator under AddressSanitizer) sees an access
// past the end of a tensor instead of a neighbour in the same block.

enum { ALIGN = 512 };
static const size_t MIN_BLOCK = (size_t)64 << 20, BLOCK_ROUND = (size_t)2 << 20;

struct seg;
struct blk {
  char *base;
  size_t size;
  seg *first;
  blk *next;
};
struct seg {
  char *ptr;
  size_t size;
  int free;
  seg *prev, *next;   // address order inside the block
  blk *block;
};

static pthread_mutex_t alloc_lock = PTHREAD_MUTEX_INITIALIZER;
static blk *blocks;
static size_t bytes_reserved, bytes_allocated, bytes_peak;

static size_t round_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

static seg *best_fit(size_t size) {
  seg *best = NULL;
  for (blk *b = blocks; b; b = b->next)
    for (seg *s = b->first; s; s = s->next)
      if (s->free && s->size >= size && (!best || s->size < best->size)) best = s;
  return best;
}

// Returns every block with nothing allocated in it to the driver.
static void release_empty_blocks(void) {
  blk **link = &blocks;
  while (*link) {
    blk *b = *link;
    if (b->first && b->first->free && !b->first->next) {
      *link = b->next;
      cudaFree(b->base);
      bytes_reserved -= b->size;
      free(b->first);
      free(b);
    } else {
      link = &b->next;
    }
  }
}

static seg *new_block(size_t size) {
  char *base = NULL;
  size_t want = round_up(size, BLOCK_ROUND);
  size_t bsize = want < MIN_BLOCK ? MIN_BLOCK : want;
  cudaError_t e = cudaMalloc((void **)&base, bsize);
  if (e != cudaSuccess) {
    cudaGetLastError();
    // Queued kernels may still use pieces released to the cache (stream order made that safe for
    // reuse); wait for them before handing whole blocks back to the driver.
    cudaDeviceSynchronize();
    release_empty_blocks();
    e = cudaMalloc((void **)&base, bsize);
    if (e != cudaSuccess && bsize > want) {
      cudaGetLastError();
      bsize = want;
      e = cudaMalloc((void **)&base, bsize);
    }
    if (e != cudaSuccess) { cudaGetLastError(); return NULL; }
  }
  blk *b = (blk *)calloc(1, sizeof *b);
  seg *s = (seg *)calloc(1, sizeof *s);
  if (!b || !s) { free(b); free(s); cudaFree(base); return NULL; }
  b->base = base;
  b->size = bsize;
  b->first = s;
  b->next = blocks;
  blocks = b;
  s->ptr = base;
  s->size = bsize;
  s->free = 1;
  s->block = b;
  bytes_reserved += bsize;
  return s;
}

// 1 for REMAX_CUDA_ALLOC=plain, 0 for caching (unset or "caching"), -1 for anything else.
static int plain_allocator(void) {
  /* engine option cuda_alloc (REMAX_CUDA_ALLOC), fixed at the first allocation: pieces of the
   * two allocators cannot be freed by the other */
  static int v = -2;
  if (v == -2) {
    const char *s = rx_option_value(RX_OPT_CUDA_ALLOC);
    v = !strcmp(s, "caching") ? 0 : !strcmp(s, "plain") ? 1 : -1;
  }
  return v;
}

// REMAX_CUDA_ALLOC=plain: one cudaMalloc per piece (a seg without a block).
static int plain_malloc(void **ptr, void **handle, size_t bytes, const char *what) {
  void *p = NULL;
  cudaError_t e = cudaMalloc(&p, bytes ? bytes : 1);
  seg *s = e == cudaSuccess ? (seg *)calloc(1, sizeof *s) : NULL;
  if (!s) {
    size_t free_b = 0, total_b = 0;
    if (e == cudaSuccess) cudaFree(p);
    cudaGetLastError();
    cudaMemGetInfo(&free_b, &total_b);
    cudaGetLastError();
    return rx_fail(RX_ENOMEM, "cuda: out of device memory: %s needs %zu bytes; %zu bytes free on the device of %zu "
                   "(remax holds %zu in tensors; REMAX_CUDA_ALLOC=plain)", what ? what : "tensor", bytes, free_b,
                   total_b, bytes_allocated);
  }
  s->ptr = (char *)p;
  s->size = bytes;
  pthread_mutex_lock(&alloc_lock);
  bytes_allocated += bytes;
  bytes_reserved += bytes;
  if (bytes_allocated > bytes_peak) bytes_peak = bytes_allocated;
  pthread_mutex_unlock(&alloc_lock);
  *ptr = p;
  *handle = s;
  return RX_OK;
}

extern "C" int rx_cuda_malloc(void **ptr, void **handle, size_t bytes, const char *what) {
  *ptr = NULL;
  *handle = NULL;
  if (!rx_cuda_stream()) return RX_EDEVICE;
  if (plain_allocator() < 0)
    return rx_fail(RX_EINVAL, "cuda: cuda_alloc = %s (REMAX_CUDA_ALLOC): expected plain or caching", rx_option_value(RX_OPT_CUDA_ALLOC));
  if (plain_allocator()) return plain_malloc(ptr, handle, bytes, what);
  size_t size = round_up(bytes ? bytes : 1, ALIGN);
  pthread_mutex_lock(&alloc_lock);
  seg *s = best_fit(size);
  if (!s) s = new_block(size);
  if (!s) {
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    cudaGetLastError();
    size_t cached_unused = bytes_reserved - bytes_allocated;
    pthread_mutex_unlock(&alloc_lock);
    return rx_fail(RX_ENOMEM,
                   "cuda: out of device memory: %s needs %zu bytes; %zu bytes free on the device of %zu "
                   "(remax holds %zu in tensors and %zu cached but in pieces too small)",
                   what ? what : "tensor", bytes, free_b, total_b, bytes_allocated, cached_unused);
  }
  if (s->size - size >= ALIGN) {   // split: the rest stays free after this piece
    seg *rest = (seg *)calloc(1, sizeof *rest);
    if (rest) {
      rest->ptr = s->ptr + size;
      rest->size = s->size - size;
      rest->free = 1;
      rest->block = s->block;
      rest->prev = s;
      rest->next = s->next;
      if (s->next) s->next->prev = rest;
      s->next = rest;
      s->size = size;
    }
  }
  s->free = 0;
  bytes_allocated += s->size;
  if (bytes_allocated > bytes_peak) bytes_peak = bytes_allocated;
  pthread_mutex_unlock(&alloc_lock);
  *ptr = s->ptr;
  *handle = s;
  return RX_OK;
}

extern "C" void rx_cuda_release(void *handle) {
  seg *s = (seg *)handle;
  if (!s) return;
  if (!s->block) {   // REMAX_CUDA_ALLOC=plain
    cudaFree(s->ptr);
    pthread_mutex_lock(&alloc_lock);
    bytes_allocated -= s->size;
    bytes_reserved -= s->size;
    pthread_mutex_unlock(&alloc_lock);
    free(s);
    return;
  }
  pthread_mutex_lock(&alloc_lock);
  s->free = 1;
  bytes_allocated -= s->size;
  if (s->next && s->next->free) {   // merge with the next piece
    seg *n = s->next;
    s->size += n->size;
    s->next = n->next;
    if (n->next) n->next->prev = s;
    free(n);
  }
  if (s->prev && s->prev->free) {   // and with the previous one
    seg *p = s->prev;
    p->size += s->size;
    p->next = s->next;
    if (s->next) s->next->prev = p;
    free(s);
  }
  pthread_mutex_unlock(&alloc_lock);
}

extern "C" int rx_cuda_memory(int64_t *allocated, int64_t *peak, int64_t *reserved, int64_t *free_bytes,
                              int64_t *total_bytes) {
  size_t f = 0, t = 0;
  if (!rx_cuda_stream()) return RX_EDEVICE;
  RX_CU(cudaMemGetInfo(&f, &t), "memory", "%s", "");
  pthread_mutex_lock(&alloc_lock);
  if (allocated) *allocated = (int64_t)bytes_allocated;
  if (peak) *peak = (int64_t)bytes_peak;
  if (reserved) *reserved = (int64_t)bytes_reserved;
  pthread_mutex_unlock(&alloc_lock);
  if (free_bytes) *free_bytes = (int64_t)f;
  if (total_bytes) *total_bytes = (int64_t)t;
  return RX_OK;
}

extern "C" int rx_cuda_memset0(void *ptr, size_t bytes) {
  RX_STREAM(s);
  if (!bytes) return RX_OK;
  RX_CU(cudaMemsetAsync(ptr, 0, bytes, s), "memset", "bytes=%zu", bytes);
  return RX_OK;
}

// ---------------------------------------------------------------- copies and fill

// Element `i` of a logical shape, through the tensor's strides (elements).
struct strided {
  int64_t shape[4], stride[4];
  int32_t ndim;
};

static strided strided_of(const rx_tensor *t) {
  strided s;
  s.ndim = t->ndim;
  for (int d = 0; d < 4; d++) { s.shape[d] = t->shape[d]; s.stride[d] = t->stride[d]; }
  return s;
}

__device__ __forceinline__ int64_t element_offset(const strided &s, int64_t i) {
  int64_t off = 0;
  for (int d = s.ndim - 1; d >= 0; d--) {
    off += (i % s.shape[d]) * s.stride[d];
    i /= s.shape[d];
  }
  return off;
}

__device__ __forceinline__ double load_any(const void *p, int32_t dtype, int64_t k) {
  switch (dtype) {
    case RX_F32: return ((const float *)p)[k];
    case RX_F64: return ((const double *)p)[k];
    case RX_BF16: return __bfloat162float(((const bf16 *)p)[k]);
    case RX_F16: return __half2float(((const __half *)p)[k]);
    case RX_I32: return ((const int32_t *)p)[k];
    case RX_I64: return (double)((const int64_t *)p)[k];
  }
  return 0;
}

__device__ __forceinline__ void store_any(void *p, int32_t dtype, int64_t k, double v) {
  switch (dtype) {
    case RX_F32: ((float *)p)[k] = (float)v; break;
    case RX_F64: ((double *)p)[k] = v; break;
    case RX_BF16: ((bf16 *)p)[k] = __float2bfloat16_rn((float)v); break;
    case RX_F16: ((__half *)p)[k] = __float2half_rn((float)v); break;
    case RX_I32: ((int32_t *)p)[k] = (int32_t)v; break;
    case RX_I64: ((int64_t *)p)[k] = (int64_t)v; break;
  }
}

// dst[i] = src[i] through both tensors' strides, converting dtype (through double, as the CPU's
// copy does: f32 -> bf16 rounds to nearest even from the f32 value). i64 -> i64 stays exact.
__global__ void copy_kernel(void *dst, strided ds, int32_t dtd, const void *src, strided ss, int32_t dts, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    int64_t so = element_offset(ss, i), dof = element_offset(ds, i);
    if (dtd == RX_I64 && dts == RX_I64) ((int64_t *)dst)[dof] = ((const int64_t *)src)[so];
    else if (dtd == RX_BF16 && dts == RX_F32) ((bf16 *)dst)[dof] = __float2bfloat16_rn(((const float *)src)[so]);
    else store_any(dst, dtd, dof, load_any(src, dts, so));
  }
}

static int copy_on_device(rx_tensor *dst, const rx_tensor *src) {
  RX_STREAM(s);
  const int64_t n = src->numel;
  if (n == 0) return RX_OK;
  if (dst->dtype == src->dtype && rx_tensor_is_contiguous(dst) && rx_tensor_is_contiguous(src)) {
    RX_CU(cudaMemcpyAsync(dst->data, src->data, (size_t)(n * rx_dtype_size(src->dtype)), cudaMemcpyDeviceToDevice, s),
          "copy", "numel=%lld", (long long)n);
    return RX_OK;
  }
  RX_LAUNCH(copy_kernel, rx_blocks(n, 256), 256, 0, s,
            dst->data, strided_of(dst), dst->dtype, src->data, strided_of(src),
                                               src->dtype, n);
  RX_LAUNCHED("copy", "numel=%lld %s -> %s", (long long)n, rx_dtype_name(src->dtype), rx_dtype_name(dst->dtype));
  return RX_OK;
}

// A contiguous tensor shaped like t in `dtype` on `device` (freed by the caller).
static int temp_like(rx_tensor **out, const rx_tensor *t, int32_t dtype, int32_t device) {
  return rx_tensor_new(out, dtype, device, t->ndim, t->shape);
}

extern "C" int rx_cuda_copy(rx_tensor *dst, const rx_tensor *src) {
  int rc = RX_OK;
  rx_tensor *tmp = NULL, *tmp2 = NULL;
  const size_t bytes_src = (size_t)(src->numel * rx_dtype_size(src->dtype));
  if (src->device == RX_CUDA && dst->device == RX_CUDA) return copy_on_device(dst, src);
  RX_STREAM(s);
  if (src->device == RX_CPU) {   // host -> device: the host side in dst's dtype, contiguous, then one transfer
    const rx_tensor *h = src;
    if (src->dtype != dst->dtype || !rx_tensor_is_contiguous(src)) {
      if ((rc = temp_like(&tmp, src, dst->dtype, RX_CPU)) || (rc = rx_tensor_copy(tmp, src))) goto done;
      h = tmp;
    }
    rx_tensor *d = dst;
    if (!rx_tensor_is_contiguous(dst)) {
      if ((rc = temp_like(&tmp2, dst, dst->dtype, RX_CUDA))) goto done;
      d = tmp2;
    }
    const size_t bytes = (size_t)(h->numel * rx_dtype_size(h->dtype));
    cudaError_t e = cudaMemcpyAsync(d->data, h->data, bytes, cudaMemcpyHostToDevice, s);
    if (e == cudaSuccess) e = cudaStreamSynchronize(s);   // the host buffer may be freed next
    if (e != cudaSuccess) { rc = rx_cuda_error(e, "cudaMemcpyAsync(host to device)", "copy", "bytes=%zu", bytes); goto done; }
    if (d != dst) rc = copy_on_device(dst, d);
  } else {   // device -> host: the device side contiguous in src's dtype, one transfer, then convert on the host
    const rx_tensor *d = src;
    if (!rx_tensor_is_contiguous(src)) {
      if ((rc = temp_like(&tmp2, src, src->dtype, RX_CUDA)) || (rc = copy_on_device(tmp2, src))) goto done;
      d = tmp2;
    }
    rx_tensor *h = dst;
    if (dst->dtype != src->dtype || !rx_tensor_is_contiguous(dst)) {
      if ((rc = temp_like(&tmp, src, src->dtype, RX_CPU))) goto done;
      h = tmp;
    }
    cudaError_t e = cudaMemcpyAsync(h->data, d->data, bytes_src, cudaMemcpyDeviceToHost, s);
    if (e == cudaSuccess) e = cudaStreamSynchronize(s);
    if (e != cudaSuccess) { rc = rx_cuda_error(e, "cudaMemcpyAsync(device to host)", "copy", "bytes=%zu", bytes_src); goto done; }
    if (h != dst) rc = rx_tensor_copy(dst, h);
  }
done:
  rx_tensor_free(tmp);
  rx_tensor_free(tmp2);
  return rc;
}

__global__ void fill_kernel(void *p, int32_t dtype, int64_t n, double value) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    store_any(p, dtype, i, value);
}

extern "C" int rx_cuda_fill(rx_tensor *t, double value) {
  RX_STREAM(s);
  if (t->numel == 0) return RX_OK;
  if (value == 0 && !signbit(value)) return rx_cuda_memset0(t->data, (size_t)(t->numel * rx_dtype_size(t->dtype)));
  RX_LAUNCH(fill_kernel, rx_blocks(t->numel, 256), 256, 0, s, t->data, t->dtype, t->numel, value);
  RX_LAUNCHED("fill", "numel=%lld dtype=%s", (long long)t->numel, rx_dtype_name(t->dtype));
  return RX_OK;
}

// ---------------------------------------------------------------- index checks

// The smallest bad row wins: atomicMin on an integer is order-independent, so the answer is exact.
__global__ void first_bad_kernel(unsigned long long *bad, const int32_t *idx, int64_t n, int64_t limit, int allow_negative) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    int32_t v = idx[i];
    if ((v < 0 && !allow_negative) || (int64_t)v >= limit) atomicMin(bad, (unsigned long long)i);
  }
}

extern "C" int rx_cuda_first_bad_index(int64_t *bad, int32_t *bad_value, const int32_t *idx, int64_t n, int64_t limit,
                                       int allow_negative) {
  static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
  static unsigned long long *scratch;
  static void *handle;
  RX_STREAM(s);
  *bad = -1;
  *bad_value = 0;
  if (n == 0) return RX_OK;
  pthread_mutex_lock(&lock);
  int rc = RX_OK;
  if (!scratch) rc = rx_cuda_malloc((void **)&scratch, &handle, sizeof *scratch, "index check");
  if (rc) { pthread_mutex_unlock(&lock); return rc; }
  unsigned long long none = ~0ull, got = none;
  cudaError_t e = cudaMemcpyAsync(scratch, &none, sizeof none, cudaMemcpyHostToDevice, s);
  if (e == cudaSuccess) {
    RX_LAUNCH(first_bad_kernel, rx_blocks(n, 256), 256, 0, s, scratch, idx, n, limit, allow_negative);
    e = cudaGetLastError();
  }
  if (e == cudaSuccess) e = cudaMemcpyAsync(&got, scratch, sizeof got, cudaMemcpyDeviceToHost, s);
  if (e == cudaSuccess) e = cudaStreamSynchronize(s);
  if (e == cudaSuccess && got != none) {
    *bad = (int64_t)got;
    e = cudaMemcpy(bad_value, idx + got, sizeof *bad_value, cudaMemcpyDeviceToHost);
  }
  pthread_mutex_unlock(&lock);
  if (e != cudaSuccess) return rx_cuda_error(e, "index check", "first_bad_index", "n=%lld limit=%lld", (long long)n, (long long)limit);
  return RX_OK;
}

// ---------------------------------------------------------------- a device scalar for reductions

extern "C" int rx_cuda_scalar(double **acc) {
  static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
  static double *scalar;
  static void *handle;
  int rc = RX_OK;
  pthread_mutex_lock(&lock);
  if (!scalar) rc = rx_cuda_malloc((void **)&scalar, &handle, sizeof *scalar, "reduction scalar");
  pthread_mutex_unlock(&lock);
  if (rc) return rc;
  *acc = scalar;
  return rx_cuda_memset0(scalar, sizeof *scalar);
}

extern "C" int rx_cuda_read_double(double *out, const double *acc) {
  RX_STREAM(s);
  RX_CU(cudaMemcpyAsync(out, acc, sizeof *out, cudaMemcpyDeviceToHost, s), "read scalar", "%s", "8 bytes");
  RX_CU(cudaStreamSynchronize(s), "read scalar", "%s", "8 bytes");
  return RX_OK;
}

