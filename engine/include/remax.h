/* remax.h: the whole public C API of libremax.
 *
 * Rules (so that LuaJIT's ffi.cdef reads this file once the '#' lines are stripped):
 *   - no macros inside declarations; constants are enums;
 *   - fixed-width integer types; opaque handles or plain-data structs;
 *   - every fallible function returns int status (0 = ok); rx_last_error() names what failed.
 * Library code never calls exit() or abort() on bad input.
 */
#ifndef REMAX_H
#define REMAX_H
#include <stddef.h>
#include <stdint.h>
/* C++ includers wrap this header in extern "C" { } themselves: the file stays pure C for the FFI. */

/* ---------------------------------------------------------------- core: errors, version */

enum { RX_OK = 0, RX_EINVAL = 1, RX_ENOMEM = 2, RX_EIO = 3, RX_EFORMAT = 4, RX_EDEVICE = 5 };

const char *rx_last_error(void);     /* message of the last failure on this thread */
void rx_clear_error(void);
const char *rx_version(void);
int rx_has_cuda(void);               /* 1 when built with CUDA and a device is present */
const char *rx_abi_layout(void);     /* "name size\nname.field offset\n..." for every struct here */

/* ---------------------------------------------------------------- core: tensors */

typedef enum rx_dtype {
  RX_F32 = 0, RX_F64 = 1, RX_BF16 = 2, RX_F16 = 3, RX_I32 = 4, RX_I64 = 5, RX_DTYPE_COUNT = 6
} rx_dtype;

typedef enum rx_device { RX_CPU = 0, RX_CUDA = 1 } rx_device;

enum { RX_MAX_DIMS = 4 };

typedef struct rx_storage rx_storage;   /* reference-counted allocation, opaque */

/* A tensor is a typed view of a storage: data points at element [0,0,...].
 * Strides are in elements. Kernels require contiguous tensors unless they say otherwise. */
typedef struct rx_tensor {
  void *data;
  rx_storage *storage;
  int64_t shape[4];
  int64_t stride[4];
  int64_t numel;
  int32_t ndim;
  int32_t dtype;        /* rx_dtype */
  int32_t device;       /* rx_device */
  int32_t device_index;
} rx_tensor;

const char *rx_dtype_name(int32_t dtype);
int64_t rx_dtype_size(int32_t dtype);
int rx_dtype_from_name(const char *name, int32_t *dtype);   /* "f32", "float32", "BF16", ... */

/* New zero-filled contiguous tensor. ndim in 0..4. */
int rx_tensor_new(rx_tensor **out, int32_t dtype, int32_t device, int32_t ndim, const int64_t *shape);
/* Wrap memory the caller owns (not freed by rx_tensor_free). */
int rx_tensor_wrap(rx_tensor **out, void *data, int32_t dtype, int32_t ndim, const int64_t *shape);
void rx_tensor_free(rx_tensor *t);
/* A view sharing storage: new shape (contiguous source only; -1 infers one dim). */
int rx_tensor_reshape(rx_tensor **out, const rx_tensor *t, int32_t ndim, const int64_t *shape);
/* A view of [start, start+len) along dim. */
int rx_tensor_narrow(rx_tensor **out, const rx_tensor *t, int32_t dim, int64_t start, int64_t len);
int rx_tensor_is_contiguous(const rx_tensor *t);
/* dst = src, converting dtype; shapes must have equal numel; src may be strided. */
int rx_tensor_copy(rx_tensor *dst, const rx_tensor *src);
int rx_tensor_fill(rx_tensor *t, double value);
/* Philox-4x32 random fill; element i depends only on (seed, offset + i), never on threads. */
int rx_tensor_uniform(rx_tensor *t, uint64_t seed, uint64_t offset, double lo, double hi);
int rx_tensor_normal(rx_tensor *t, uint64_t seed, uint64_t offset, double mean, double std);
/* Element access for bindings and tests (any dtype, flat index into the logical shape). */
int rx_tensor_get(const rx_tensor *t, int64_t index, double *value);
int rx_tensor_set(rx_tensor *t, int64_t index, double value);
/* Bulk exchange with a caller's double buffer of numel values. */
int rx_tensor_read_f64(const rx_tensor *t, double *out);
int rx_tensor_write_f64(rx_tensor *t, const double *in);

/* Philox-4x32-10: four 32-bit words from key (2 words) and counter (4 words). */
void rx_philox4x32(const uint32_t key[2], const uint32_t counter[4], uint32_t out[4]);

/* ---------------------------------------------------------------- kernels
 * Layer ops over tensors, dispatched on device. Float kernels accept f32 and f64 (f64 for
 * finite-difference checks); all tensors of one call share dtype and device.
 * Shapes: N = rows (B*T), C = channels. Backward functions ACCUMULATE (+=) into parameter
 * gradients (dweight, dbias) and OVERWRITE input gradients (dinp), unless said otherwise. */

/* ---------------------------------------------------------------- optimizer */

/* AdamW with decoupled weight decay (Loshchilov & Hutter) and bias correction.
 * step is the 1-based number of this update (bias correction uses beta^step). */
typedef struct rx_adamw_config {
  double lr;
  double beta1;
  double beta2;
  double eps;
  double weight_decay;
  int64_t step;
} rx_adamw_config;

/* One update of one tensor. grad has param's shape and dtype; m and v (f32, or f64 for an f64
 * param) hold the moments. decay 0 skips weight decay for this tensor (biases, norms: the
 * caller decides by name). */
int rx_adamw_step(rx_tensor *param, const rx_tensor *grad, rx_tensor *m, rx_tensor *v,
                  const rx_adamw_config *cfg, int32_t decay);
/* Global L2 norm of n gradient tensors, accumulated in double. Inf/NaN propagate. */
int rx_grad_norm(const rx_tensor *const *grads, int64_t n, double *norm);
/* Scales all n gradients by max_norm / (norm + 1e-6) when norm > max_norm; *norm gets the
 * norm before clipping. Non-finite norms leave gradients untouched (the caller skips the step). */
int rx_clip_grad_norm(rx_tensor *const *grads, int64_t n, double max_norm, double *norm);
/* t *= s elementwise (gradient accumulation averaging). */
int rx_scale(rx_tensor *t, double s);

/* ---------------------------------------------------------------- safetensors */

/* ---------------------------------------------------------------- tokenizer */

#endif
