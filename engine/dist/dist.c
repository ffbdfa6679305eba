/* dist.c: the data-parallel world this process belongs to, and its collectives.
 *
 * A process started alone is a world of one: every collective returns at once and no MPI library
 * is loaded. A process an MPI launcher started (its environment says so) loads the MPI backend
 * plugin, libremax_mpi.so, from libremax's own folder; that plugin links libmpi, so libremax and
 * a single-process run never need MPI installed. See docs/distributed.md. */
#define _GNU_SOURCE
#include "internal.h"
#include "dist/backend.h"
#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static struct {
  int initialised;
  int finalised;
  int32_t rank, size, local_rank, local_size;
  const rx_dist_backend *backend;   /* NULL: a world of one */
  char name[256];
} world = { 0, 0, 0, 1, 0, 1, NULL, "single" };

/* Given to the backend when it loads, and whenever they change after. */
static double timeout_seconds = 1800;   /* torch.distributed's default */
static int64_t current_step = -1;

/* The launcher variable that says this process is one rank of an MPI job, or NULL. */
static const char *launcher_variable(void) {
  static const char *names[] = { "OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE", "PMI_RANK" };
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    const char *v = getenv(names[i]);
    if (v && *v) return names[i];
  }
  return NULL;
}

static int backend_fail(const char *call) {
  const char *msg = world.backend && world.backend->last_error ? world.backend->last_error() : "";
  return rx_fail(RX_EDEVICE, "dist: %s on rank %d of %d: %s", call, (int)world.rank, (int)world.size, msg);
}

static int load_backend(const char *why) {
  Dl_info info;
  char path[PATH_MAX];
  if (!dladdr((void *)rx_dist_init, &info) || !info.dli_fname)
    return rx_fail(RX_EIO, "dist: cannot find libremax's folder to load libremax_mpi.so");
  snprintf(path, sizeof path, "%s", info.dli_fname);
  char *slash = strrchr(path, '/');
  if (slash) slash[1] = 0; else path[0] = 0;
  size_t k = strlen(path);
  snprintf(path + k, sizeof path - k, "libremax_mpi.so");
  /* RTLD_GLOBAL: Open MPI's own components (dlopened by libmpi) resolve symbols of libmpi. */
  void *h = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
  if (!h)
    return rx_fail(RX_EIO,
                   "dist: this process was started by an MPI launcher (%s is set) but the MPI backend "
                   "cannot be loaded: %s (build remax with MPI: apt-get install libopenmpi-dev "
                   "openmpi-bin, then rebuild; or set REMAX_DIST=off to run alone)",
                   why, dlerror());
  rx_dist_backend_fn fn = (rx_dist_backend_fn)dlsym(h, "rx_dist_backend_mpi");
  const rx_dist_backend *b = fn ? fn() : NULL;
  if (!b || b->abi != RX_DIST_BACKEND_ABI)
    return rx_fail(RX_EIO, "dist: %s is not a remax MPI backend of this version (rebuild remax)", path);
  world.backend = b;
  return RX_OK;
}

int rx_dist_init(void) {
  if (world.initialised) return RX_OK;
  const char *mode = getenv("REMAX_DIST");
  const char *why = launcher_variable();
  if (mode && *mode) {
    if (!strcmp(mode, "off")) why = NULL;
    else if (!strcmp(mode, "mpi")) why = "REMAX_DIST=mpi";
    else if (strcmp(mode, "auto"))
      return rx_fail(RX_EINVAL, "REMAX_DIST=%s: expected auto (the default), mpi or off", mode);
  }
  if (why) {
    int rc = load_backend(why);
    if (rc) return rc;
    if (world.backend->init(&world.rank, &world.size, &world.local_rank, &world.local_size)) {
      int rc2 = backend_fail("MPI_Init");
      world.backend = NULL;
      world.rank = 0, world.size = 1, world.local_rank = 0, world.local_size = 1;
      return rc2;
    }
    snprintf(world.name, sizeof world.name, "mpi (%s)", world.backend->describe());
    world.backend->set_timeout(timeout_seconds);
    world.backend->set_step(current_step);
  }
  world.initialised = 1;
  return RX_OK;
}

int rx_dist_finalize(void) {
  if (!world.initialised || world.finalised || !world.backend) return RX_OK;
  world.finalised = 1;
  return world.backend->finalize() ? backend_fail("MPI_Finalize") : RX_OK;
}

int rx_dist_set_timeout(double seconds) {
  if (!(seconds > 0) || seconds > 1e9)
    return rx_fail(RX_EINVAL, "dist_timeout = %g: expected seconds > 0 (default 1800)", seconds);
  timeout_seconds = seconds;
  if (world.backend) world.backend->set_timeout(seconds);
  return RX_OK;
}

void rx_dist_set_step(int64_t step) {
  current_step = step;
  if (world.backend) world.backend->set_step(step);
}

int32_t rx_dist_rank(void) { return world.rank; }
int32_t rx_dist_size(void) { return world.size; }
int32_t rx_dist_local_rank(void) { return world.local_rank; }
int32_t rx_dist_local_size(void) { return world.local_size; }
const char *rx_dist_backend_name(void) { return world.name; }

/* A collective on a world of more than one: the backend, still usable. */
static int active(const char *call) {
  if (!world.backend) return 0;
  if (world.finalised) {
    rx_fail(RX_EINVAL, "dist: %s after rx_dist_finalize", call);
    return -1;
  }
  return 1;
}

int rx_dist_allreduce_f64(double *values, int64_t n, int32_t op) {
  if (n < 0 || (n > 0 && !values)) return rx_fail(RX_EINVAL, "rx_dist_allreduce_f64: %lld values at %p", (long long)n, (void *)values);
  if (op < RX_DIST_SUM || op > RX_DIST_MIN) return rx_fail(RX_EINVAL, "rx_dist_allreduce_f64: unknown op %d", (int)op);
  int a = active("rx_dist_allreduce_f64");
  if (a <= 0) return a ? RX_EINVAL : RX_OK;
  return world.backend->allreduce(values, n, RX_F64, op) ? backend_fail("MPI_Allreduce") : RX_OK;
}

int rx_dist_allreduce_tensors(rx_tensor *const *tensors, int64_t n) {
  if (n < 0 || (n > 0 && !tensors)) return rx_fail(RX_EINVAL, "rx_dist_allreduce_tensors: %lld tensors", (long long)n);
  for (int64_t i = 0; i < n; i++) {
    const rx_tensor *t = tensors[i];
    if (!t) return rx_fail(RX_EINVAL, "rx_dist_allreduce_tensors: tensor %lld is NULL", (long long)i);
    if (t->dtype != RX_F32 && t->dtype != RX_F64)
      return rx_fail(RX_EINVAL, "rx_dist_allreduce_tensors: tensor %lld is %s (f32 or f64 only)", (long long)i,
                     rx_dtype_name(t->dtype));
    if (!rx_tensor_is_contiguous(t))
      return rx_fail(RX_EINVAL, "rx_dist_allreduce_tensors: tensor %lld is not contiguous", (long long)i);
  }
  int a = active("rx_dist_allreduce_tensors");
  if (a <= 0) return a ? RX_EINVAL : RX_OK;
  for (int64_t i = 0; i < n; i++) rx_note_write(tensors[i]);
  /* Runs of tensors that follow each other in memory (a gradient arena) go in one call. */
  for (int64_t i = 0; i < n;) {
    const rx_tensor *t = tensors[i];
    int64_t esize = rx_dtype_size(t->dtype), count = t->numel, j = i + 1;
    while (j < n && tensors[j]->dtype == t->dtype && tensors[j]->device == t->device &&
           tensors[j]->device_index == t->device_index &&
           (char *)tensors[j]->data == (char *)t->data + count * esize) {
      count += tensors[j]->numel;
      j++;
    }
    if (t->device == RX_CPU) {
      /* a reduce-scatter that sums in rank order, then an all-gather: the same bits as ZeRO-2's
       * reduce-scatter and as one process adding the ranks' micro-batches in turn */
      int64_t shard = (count + world.size - 1) / world.size;
      if (world.backend->reduce_scatter(t->data, count, shard, t->dtype)) return backend_fail("reduce-scatter of the gradients (MPI_Scatterv)");
      if (world.backend->allgather(t->data, count, shard, t->dtype)) return backend_fail("MPI_Allgatherv (gradients)");
    } else if (t->device == RX_CUDA) {
      if (!world.backend->allreduce_cuda)
        return rx_fail(RX_EDEVICE, "rx_dist_allreduce_tensors: tensor %lld is on CUDA but remax's MPI backend was "
                       "built without NCCL (install NCCL with the CUDA toolkit and rebuild)", (long long)i);
      if (world.backend->allreduce_cuda(t->data, count, t->dtype, t->device_index)) return backend_fail("ncclAllReduce (gradients)");
    } else {
      return rx_fail(RX_EINVAL, "rx_dist_allreduce_tensors: tensor %lld has unknown device %d", (long long)i, (int)t->device);
    }
    i = j;
  }
  return RX_OK;
}

int rx_dist_broadcast(void *buf, int64_t bytes, int32_t root) {
  if (bytes < 0 || (bytes > 0 && !buf)) return rx_fail(RX_EINVAL, "rx_dist_broadcast: %lld bytes", (long long)bytes);
  if (root < 0 || root >= world.size) return rx_fail(RX_EINVAL, "rx_dist_broadcast: root %d outside 0..%d", (int)root, (int)world.size - 1);
  int a = active("rx_dist_broadcast");
  if (a <= 0) return a ? RX_EINVAL : RX_OK;
  return world.backend->broadcast(buf, bytes, root) ? backend_fail("MPI_Bcast") : RX_OK;
}

int rx_dist_allgather_i64(int64_t value, int64_t *out) {
  if (!out) return rx_fail(RX_EINVAL, "rx_dist_allgather_i64: out is NULL");
  int a = active("rx_dist_allgather_i64");
  if (a < 0) return RX_EINVAL;
  if (a == 0) { out[0] = value; return RX_OK; }
  return world.backend->allgather_i64(value, out) ? backend_fail("MPI_Allgather") : RX_OK;
}

int rx_dist_gather(const void *send, int64_t bytes, void *recv, const int64_t *counts, int32_t root) {
  if (bytes < 0 || (bytes > 0 && !send)) return rx_fail(RX_EINVAL, "rx_dist_gather: %lld bytes to send", (long long)bytes);
  if (root < 0 || root >= world.size) return rx_fail(RX_EINVAL, "rx_dist_gather: root %d outside 0..%d", (int)root, (int)world.size - 1);
  if (world.rank == root) {
    if (!counts) return rx_fail(RX_EINVAL, "rx_dist_gather: the root needs every rank's byte count");
    if (counts[world.rank] != bytes)
      return rx_fail(RX_EINVAL, "rx_dist_gather: the root sends %lld bytes but counts[%d] = %lld", (long long)bytes,
                     (int)root, (long long)counts[world.rank]);
  }
  int a = active("rx_dist_gather");
  if (a < 0) return RX_EINVAL;
  if (a == 0) {
    if (bytes > 0 && recv != send) memmove(recv, send, (size_t)bytes);
    return RX_OK;
  }
  return world.backend->gather_bytes(send, bytes, recv, counts, root) ? backend_fail("MPI_Gatherv") : RX_OK;
}

/* ZeRO: a flat buffer (one arena viewed as a 1-D tensor) cut into shards of `shard` elements. */
static int check_flat(const rx_tensor *flat, int64_t shard, const char *op) {
  if (!flat) return rx_fail(RX_EINVAL, "%s: the flat buffer is NULL", op);
  if (flat->dtype != RX_F32 && flat->dtype != RX_F64 && !(flat->device == RX_CUDA && flat->dtype == RX_BF16))
    return rx_fail(RX_EINVAL, "%s: the flat buffer is %s (f32 or f64; bf16 on cuda)", op, rx_dtype_name(flat->dtype));
  if (!rx_tensor_is_contiguous(flat)) return rx_fail(RX_EINVAL, "%s: the flat buffer is not contiguous", op);
  if (shard < 1 || shard * (int64_t)world.size < flat->numel)
    return rx_fail(RX_EINVAL, "%s: %d shards of %lld elements do not cover %lld elements", op, (int)world.size,
                   (long long)shard, (long long)flat->numel);
  if (flat->device != RX_CPU && flat->device != RX_CUDA)
    return rx_fail(RX_EINVAL, "%s: the flat buffer has unknown device %d", op, (int)flat->device);
  return RX_OK;
}

static int no_nccl(const char *op) {
  return rx_fail(RX_EDEVICE, "%s: the flat buffer is on CUDA but remax's MPI backend was built without NCCL "
                 "(install NCCL with the CUDA toolkit and rebuild)", op);
}

int rx_dist_reduce_scatter(rx_tensor *flat, int64_t shard) {
  if (check_flat(flat, shard, "rx_dist_reduce_scatter")) return RX_EINVAL;
  int a = active("rx_dist_reduce_scatter");
  if (a <= 0) return a ? RX_EINVAL : RX_OK;
  rx_note_write(flat);
  if (flat->device == RX_CUDA) {
    if (!world.backend->reduce_scatter_cuda) return no_nccl("rx_dist_reduce_scatter");
    return world.backend->reduce_scatter_cuda(flat->data, flat->numel, shard, flat->dtype, flat->device_index)
               ? backend_fail("ncclReduceScatter") : RX_OK;
  }
  return world.backend->reduce_scatter(flat->data, flat->numel, shard, flat->dtype) ? backend_fail("reduce-scatter (MPI_Scatterv)") : RX_OK;
}

int rx_dist_allgather(rx_tensor *flat, int64_t shard) {
  if (check_flat(flat, shard, "rx_dist_allgather")) return RX_EINVAL;
  int a = active("rx_dist_allgather");
  if (a <= 0) return a ? RX_EINVAL : RX_OK;
  rx_note_write(flat);
  if (flat->device == RX_CUDA) {
    if (!world.backend->allgather_cuda) return no_nccl("rx_dist_allgather");
    return world.backend->allgather_cuda(flat->data, flat->numel, shard, flat->dtype, flat->device_index)
               ? backend_fail("ncclAllGather") : RX_OK;
  }
  return world.backend->allgather(flat->data, flat->numel, shard, flat->dtype) ? backend_fail("MPI_Allgatherv") : RX_OK;
}

int rx_dist_broadcast_tensor(rx_tensor *t, int32_t root) {
  if (!t || !rx_tensor_is_contiguous(t)) return rx_fail(RX_EINVAL, "rx_dist_broadcast_tensor: a contiguous tensor is needed");
  if (root < 0 || root >= world.size) return rx_fail(RX_EINVAL, "rx_dist_broadcast_tensor: root %d outside 0..%d", (int)root, (int)world.size - 1);
  int a = active("rx_dist_broadcast_tensor");
  if (a <= 0) return a ? RX_EINVAL : RX_OK;
  rx_note_write(t);
  int64_t bytes = t->numel * rx_dtype_size(t->dtype);
  if (t->device == RX_CUDA) {
    if (!world.backend->broadcast_cuda) return no_nccl("rx_dist_broadcast_tensor");
    return world.backend->broadcast_cuda(t->data, bytes, root, t->device_index) ? backend_fail("ncclBroadcast") : RX_OK;
  }
  if (t->device != RX_CPU) return rx_fail(RX_EINVAL, "rx_dist_broadcast_tensor: unknown device %d", (int)t->device);
  return world.backend->broadcast(t->data, bytes, root) ? backend_fail("MPI_Bcast") : RX_OK;
}

int rx_dist_barrier(void) {
  int a = active("rx_dist_barrier");
  if (a <= 0) return a ? RX_EINVAL : RX_OK;
  return world.backend->barrier() ? backend_fail("MPI_Barrier") : RX_OK;
}

/* FNV-style multiply-xor over 64-bit words, tensor after tensor: one pass over the weights,
 * cheap next to a training step. */
int rx_dist_checksum(const rx_tensor *const *tensors, int64_t n, uint64_t *out) {
  if (!out || n < 0 || (n > 0 && !tensors)) return rx_fail(RX_EINVAL, "rx_dist_checksum: bad arguments");
  uint64_t h = 0xcbf29ce484222325ULL;
  const uint64_t prime = 0x100000001b3ULL;
  for (int64_t i = 0; i < n; i++) {
    const rx_tensor *t = tensors[i];
    if (!t || t->device != RX_CPU || !rx_tensor_is_contiguous(t))
      return rx_fail(RX_EINVAL, "rx_dist_checksum: tensor %lld is not a contiguous CPU tensor", (long long)i);
    const unsigned char *p = t->data;
    int64_t bytes = t->numel * rx_dtype_size(t->dtype), words = bytes / 8;
    for (int64_t w = 0; w < words; w++) {
      uint64_t v;
      memcpy(&v, p + 8 * w, 8);
      h = (h ^ v) * prime;
    }
    for (int64_t b = words * 8; b < bytes; b++) h = (h ^ p[b]) * prime;
    h = (h ^ (uint64_t)bytes) * prime;
  }
  *out = h;
  return RX_OK;
}
