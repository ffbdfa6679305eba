/* mpi_backend.c: libremax_mpi.so, the MPI (and, when built with it, NCCL) collectives behind
 * engine/dist/dist.c. Only a process started by an MPI launcher loads it, so only such a process
 * needs libmpi. Errors return (MPI_ERRORS_RETURN) with MPI's own message; nothing here exits. */
#include <mpi.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "remax.h"
#include "dist/backend.h"
#ifdef RX_HAVE_NCCL
#include <cuda_runtime.h>
#include <nccl.h>
#endif

static char last_error[1024];
static char description[192];
static MPI_Comm world = MPI_COMM_NULL;
static int my_rank, my_size;
/* Scratch for reduce_scatter, grown when a bigger shard comes, kept for the next step. */
static void *scratch;
static size_t scratch_bytes;

static int fail(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(last_error, sizeof last_error, fmt, ap);
  va_end(ap);
  return 1;
}

static int mpi_fail(const char *call, int rc) {
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS) snprintf(msg, sizeof msg, "MPI error %d", rc);
  return fail("%s: %s", call, msg);
}

#define CHECK(call)                                    \
  do {                                                 \
    int rc_ = (call);                                  \
    if (rc_ != MPI_SUCCESS) return mpi_fail(#call, rc_); \
  } while (0)

static const char *get_last_error(void) { return last_error; }
static const char *describe(void) { return description; }

static int init(int32_t *rank, int32_t *size, int32_t *local_rank, int32_t *local_size) {
  int inited = 0;
  CHECK(MPI_Initialized(&inited));
  if (!inited) CHECK(MPI_Init(NULL, NULL));
  CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &world));
  CHECK(MPI_Comm_set_errhandler(world, MPI_ERRORS_RETURN));
  CHECK(MPI_Comm_rank(world, &my_rank));
  CHECK(MPI_Comm_size(world, &my_size));
  MPI_Comm node;
  int lr = 0, ls = 1;
  CHECK(MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, my_rank, MPI_INFO_NULL, &node));
  CHECK(MPI_Comm_rank(node, &lr));
  CHECK(MPI_Comm_size(node, &ls));
  MPI_Comm_free(&node);
  *rank = my_rank, *size = my_size, *local_rank = lr, *local_size = ls;
  char lib[MPI_MAX_LIBRARY_VERSION_STRING];
  int len = 0;
  MPI_Get_library_version(lib, &len);
  char *nl = strchr(lib, '\n');
  if (nl) *nl = 0;
  char *comma = strchr(lib, ',');   /* "Open MPI v4.1.4, package: ..." -> "Open MPI v4.1.4" */
  if (comma) *comma = 0;
#ifdef RX_HAVE_NCCL
  snprintf(description, sizeof description, "%s, NCCL %d", lib, NCCL_VERSION_CODE);
#else
  snprintf(description, sizeof description, "%s", lib);
#endif
  return 0;
}

#ifdef RX_HAVE_NCCL
static ncclComm_t nccl_comm;
static int nccl_device = -1;
static void finalize_nccl(void);
#endif

static int finalize(void) {
  free(scratch);
  scratch = NULL, scratch_bytes = 0;
#ifdef RX_HAVE_NCCL
  finalize_nccl();
#endif
  if (world != MPI_COMM_NULL) MPI_Comm_free(&world);
  int done = 0;
  MPI_Finalized(&done);
  if (!done) CHECK(MPI_Finalize());
  return 0;
}

static int mpi_type(int32_t dtype, MPI_Datatype *t) {
  switch (dtype) {
  case RX_F32: *t = MPI_FLOAT; return 0;
  case RX_F64: *t = MPI_DOUBLE; return 0;
  case RX_I64: *t = MPI_INT64_T; return 0;
  }
  return fail("no MPI type for dtype %d", (int)dtype);
}

static int mpi_op(int32_t op, MPI_Op *o) {
  switch (op) {
  case RX_DIST_SUM: *o = MPI_SUM; return 0;
  case RX_DIST_MAX: *o = MPI_MAX; return 0;
  case RX_DIST_MIN: *o = MPI_MIN; return 0;
  }
  return fail("unknown reduction %d", (int)op);
}

/* MPI counts are int: large buffers go in pieces of 2^30 elements. */
enum { PIECE = 1 << 30 };

static int allreduce(void *buf, int64_t count, int32_t dtype, int32_t op) {
  MPI_Datatype t = MPI_DATATYPE_NULL;
  MPI_Op o = MPI_OP_NULL;
  if (mpi_type(dtype, &t) || mpi_op(op, &o)) return 1;
  int64_t esize = dtype == RX_F32 ? 4 : 8;   /* f32, or f64 / i64 */
  for (int64_t at = 0; at < count; at += PIECE) {
    int64_t n = count - at < PIECE ? count - at : PIECE;
    CHECK(MPI_Allreduce(MPI_IN_PLACE, (char *)buf + at * esize, (int)n, t, o, world));
  }
  return 0;
}

static int broadcast(void *buf, int64_t bytes, int32_t root) {
  for (int64_t at = 0; at < bytes; at += PIECE) {
    int64_t n = bytes - at < PIECE ? bytes - at : PIECE;
    CHECK(MPI_Bcast((char *)buf + at, (int)n, MPI_BYTE, root, world));
  }
  return 0;
}

static int allgather_i64(int64_t value, int64_t *out) {
  CHECK(MPI_Allgather(&value, 1, MPI_INT64_T, out, 1, MPI_INT64_T, world));
  return 0;
}

static int gather_bytes(const void *send, int64_t bytes, void *recv, const int64_t *counts, int32_t root) {
  if (bytes > INT32_MAX) return fail("gather of %lld bytes from one rank (at most 2^31 - 1)", (long long)bytes);
  int *c = NULL, *d = NULL;
  if (my_rank == root) {
    c = malloc(sizeof(int) * (size_t)my_size);
    d = malloc(sizeof(int) * (size_t)my_size);
    if (!c || !d) { free(c); free(d); return fail("out of memory for %d gather counts", my_size); }
    int64_t at = 0;
    for (int r = 0; r < my_size; r++) {
      if (counts[r] < 0 || at + counts[r] > INT32_MAX) {
        free(c), free(d);
        return fail("gather of %lld bytes in all (at most 2^31 - 1)", (long long)(at + counts[r]));
      }
      c[r] = (int)counts[r], d[r] = (int)at;
      at += counts[r];
    }
  }
  int rc = MPI_Gatherv(send, (int)bytes, MPI_BYTE, recv, c, d, MPI_BYTE, root, world);
  free(c), free(d);
  if (rc != MPI_SUCCESS) return mpi_fail("MPI_Gatherv", rc);
  return 0;
}

/* rank r's part of a flat buffer of count elements cut into shards of `shard` elements */
static int64_t shard_count(int64_t count, int64_t shard, int r) {
  int64_t lo = (int64_t)r * shard, n = count - lo;
  return n < 0 ? 0 : n < shard ? n : shard;
}

/* Counts and displacements of the shards, as MPI takes them (int: a buffer of up to 2^31 - 1
 * elements, a CPU model of 2 billion trained parameters). */
static int shard_layout(int64_t count, int64_t shard, int **counts, int **displs) {
  if (count > INT32_MAX || shard > INT32_MAX)
    return fail("%lld elements in one buffer: MPI on the CPU takes at most 2^31 - 1 (MPI counts are int)", (long long)count);
  *counts = malloc(sizeof(int) * (size_t)my_size);
  *displs = malloc(sizeof(int) * (size_t)my_size);
  if (!*counts || !*displs) {
    free(*counts), free(*displs);
    return fail("out of memory for %d shard counts", my_size);
  }
  for (int r = 0; r < my_size; r++) {
    (*counts)[r] = (int)shard_count(count, shard, r);
    int64_t lo = (int64_t)r * shard;
    (*displs)[r] = (int)(lo < count ? lo : count);
  }
  return 0;
}

static void add_into(void *acc, const void *x, int64_t n, int32_t dtype) {
  if (dtype == RX_F32) {
    float *a = acc;
    const float *b = x;
    for (int64_t i = 0; i < n; i++) a[i] += b[i];
  } else if (dtype == RX_F64) {
    double *a = acc;
    const double *b = x;
    for (int64_t i = 0; i < n; i++) a[i] += b[i];
  } else {
    int64_t *a = acc;
    const int64_t *b = x;
    for (int64_t i = 0; i < n; i++) a[i] += b[i];
  }
}

/* The sum of a shard is formed in rank order, ((g0 + g1) + g2) + ..., on its owner: round k
 * scatters rank k's buffer (MPI_Scatterv rooted at k), and each rank adds the piece it receives.
 * Every element is thus summed in the same order whatever the shard layout and whatever MPI's
 * own algorithms would pick, so ZeRO-2's reduce-scatter, the all-reduce of stages 0 and 1
 * (reduce_scatter + allgather, engine/dist/dist.c) and one process adding its micro-batches in
 * turn give the same bits. The traffic is a ring reduce-scatter's: each rank sends and receives
 * (size - 1) shards. The shards go in chunks of CHUNK elements, so the scratch (the running sum
 * and the piece received) stays 2 chunks whatever the model's size. */
enum { CHUNK = 1 << 22 };

static int reduce_scatter(void *buf, int64_t count, int64_t shard, int32_t dtype) {
  MPI_Datatype t = MPI_DATATYPE_NULL;
  if (mpi_type(dtype, &t)) return 1;
  int *counts, *displs;
  if (shard_layout(count, shard, &counts, &displs)) return 1;
  const int64_t esize = dtype == RX_F32 ? 4 : 8;
  int *c = malloc(sizeof(int) * (size_t)my_size), *d = malloc(sizeof(int) * (size_t)my_size);
  size_t need = (size_t)(2 * CHUNK * esize);
  void *grown = need > scratch_bytes ? realloc(scratch, need) : scratch;
  if (!c || !d || !grown) {
    free(c), free(d), free(counts), free(displs);
    return fail("out of memory for the reduce-scatter scratch (%zu bytes)", need);
  }
  if (need > scratch_bytes) scratch = grown, scratch_bytes = need;
  char *acc = scratch, *recv = acc + CHUNK * esize;
  int rc = MPI_SUCCESS;
  for (int64_t at = 0; at < shard && rc == MPI_SUCCESS; at += CHUNK) {
    for (int r = 0; r < my_size; r++) {
      int64_t n = counts[r] - at;
      c[r] = (int)(n < 0 ? 0 : n < CHUNK ? n : CHUNK);
      d[r] = displs[r] + (int)(at < counts[r] ? at : counts[r]);
    }
    const int64_t n = c[my_rank];
    char *own = (char *)buf + (int64_t)d[my_rank] * esize;
    for (int k = 0; k < my_size && rc == MPI_SUCCESS; k++) {
      int root = k == my_rank;
      rc = MPI_Scatterv(buf, c, d, t, root ? MPI_IN_PLACE : recv, (int)n, t, k, world);
      const char *piece = root ? own : recv;
      if (rc == MPI_SUCCESS && n > 0) {
        if (k == 0) memcpy(acc, piece, (size_t)(n * esize));
        else add_into(acc, piece, n, dtype);
      }
    }
    if (rc == MPI_SUCCESS && n > 0) memcpy(own, acc, (size_t)(n * esize));
  }
  free(c), free(d), free(counts), free(displs);
  return rc == MPI_SUCCESS ? 0 : mpi_fail("MPI_Scatterv (reduce-scatter)", rc);
}

static int allgather(void *buf, int64_t count, int64_t shard, int32_t dtype) {
  MPI_Datatype t = MPI_DATATYPE_NULL;
  if (mpi_type(dtype, &t)) return 1;
  int *counts, *displs;
  if (shard_layout(count, shard, &counts, &displs)) return 1;
  int rc = MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, counts, displs, t, world);
  free(counts), free(displs);
  return rc == MPI_SUCCESS ? 0 : mpi_fail("MPI_Allgatherv", rc);
}

static int barrier(void) {
  CHECK(MPI_Barrier(world));
  return 0;
}

#ifdef RX_HAVE_NCCL
/* NCCL for CUDA tensors. Run so far only through the CUDA emulator's one-rank NCCL
 * (tests/lua/nccl_probe.lua); never on a GPU, never over several ranks. One communicator over all
 * ranks, made on first use: rank 0's unique id is broadcast over MPI, each rank uses the device
 * its tensors live on (one GPU per rank, chosen by local rank). */
#define CUDA_CHECK(call)                                                          \
  do {                                                                            \
    cudaError_t e_ = (call);                                                      \
    if (e_ != cudaSuccess) return fail("%s: %s", #call, cudaGetErrorString(e_)); \
  } while (0)
#define NCCL_CHECK(call)                                                          \
  do {                                                                            \
    ncclResult_t r_ = (call);                                                     \
    if (r_ != ncclSuccess) return fail("%s: %s", #call, ncclGetErrorString(r_)); \
  } while (0)

static int nccl_setup(int32_t device_index) {
  if (nccl_device == device_index) return 0;
  if (nccl_device >= 0) return fail("NCCL: tensors on CUDA device %d and %d in one process (one GPU per rank)", nccl_device, (int)device_index);
  ncclUniqueId id;
  if (my_rank == 0) NCCL_CHECK(ncclGetUniqueId(&id));
  CHECK(MPI_Bcast(&id, (int)sizeof id, MPI_BYTE, 0, world));
  CUDA_CHECK(cudaSetDevice(device_index));
  NCCL_CHECK(ncclCommInitRank(&nccl_comm, my_size, id, my_rank));
  nccl_device = device_index;
  return 0;
}

static void finalize_nccl(void) {
  if (nccl_device >= 0) ncclCommDestroy(nccl_comm);
  nccl_device = -1;
}

static int nccl_type(int32_t dtype, ncclDataType_t *t) {
  switch (dtype) {
  case RX_F32: *t = ncclFloat32; return 0;
  case RX_F64: *t = ncclFloat64; return 0;
  case RX_BF16: *t = ncclBfloat16; return 0;
  }
  return fail("NCCL: no type for dtype %d", (int)dtype);
}

/* Before a collective on device_index: dtype's NCCL type in *t, the communicator, the device current. */
static int nccl_begin(int32_t dtype, int32_t device_index, ncclDataType_t *t) {
  if (nccl_type(dtype, t) || nccl_setup(device_index)) return 1;
  CUDA_CHECK(cudaSetDevice(device_index));
  return 0;
}

static int allreduce_cuda(void *buf, int64_t count, int32_t dtype, int32_t device_index) {
  ncclDataType_t t = ncclFloat32;
  if (nccl_begin(dtype, device_index, &t)) return 1;
  /* the default stream: the engine's kernels have finished writing buf when this starts */
  NCCL_CHECK(ncclAllReduce(buf, buf, (size_t)count, t, ncclSum, nccl_comm, 0));
  CUDA_CHECK(cudaStreamSynchronize(0));
  return 0;
}

static int64_t dtype_bytes(int32_t dtype) { return dtype == RX_BF16 ? 2 : dtype == RX_F32 ? 4 : 8; }

/* Equal shards go to ncclReduceScatter / ncclAllGather in place (the shard at rank * shard);
 * a short last shard to one grouped ncclReduce / ncclBroadcast per rank, each rooted at the
 * shard's owner. */
static int reduce_scatter_cuda(void *buf, int64_t count, int64_t shard, int32_t dtype, int32_t device_index) {
  ncclDataType_t t = ncclFloat32;
  if (nccl_begin(dtype, device_index, &t)) return 1;
  const int64_t es = dtype_bytes(dtype);
  char *b = buf;
  if (shard * my_size == count) {
    NCCL_CHECK(ncclReduceScatter(b, b + (int64_t)my_rank * shard * es, (size_t)shard, t, ncclSum, nccl_comm, 0));
  } else {
    NCCL_CHECK(ncclGroupStart());
    for (int r = 0; r < my_size; r++) {
      int64_t n = shard_count(count, shard, r);
      if (n > 0) NCCL_CHECK(ncclReduce(b + r * shard * es, b + r * shard * es, (size_t)n, t, ncclSum, r, nccl_comm, 0));
    }
    NCCL_CHECK(ncclGroupEnd());
  }
  CUDA_CHECK(cudaStreamSynchronize(0));
  return 0;
}

static int allgather_cuda(void *buf, int64_t count, int64_t shard, int32_t dtype, int32_t device_index) {
  ncclDataType_t t = ncclFloat32;
  if (nccl_begin(dtype, device_index, &t)) return 1;
  const int64_t es = dtype_bytes(dtype);
  char *b = buf;
  if (shard * my_size == count) {
    NCCL_CHECK(ncclAllGather(b + (int64_t)my_rank * shard * es, b, (size_t)shard, t, nccl_comm, 0));
  } else {
    NCCL_CHECK(ncclGroupStart());
    for (int r = 0; r < my_size; r++) {
      int64_t n = shard_count(count, shard, r);
      if (n > 0) NCCL_CHECK(ncclBroadcast(b + r * shard * es, b + r * shard * es, (size_t)n, t, r, nccl_comm, 0));
    }
    NCCL_CHECK(ncclGroupEnd());
  }
  CUDA_CHECK(cudaStreamSynchronize(0));
  return 0;
}

static int broadcast_cuda(void *buf, int64_t bytes, int32_t root, int32_t device_index) {
  if (nccl_setup(device_index)) return 1;
  CUDA_CHECK(cudaSetDevice(device_index));
  NCCL_CHECK(ncclBroadcast(buf, buf, (size_t)bytes, ncclUint8, root, nccl_comm, 0));
  CUDA_CHECK(cudaStreamSynchronize(0));
  return 0;
}
#endif

static const rx_dist_backend backend = {
  RX_DIST_BACKEND_ABI, get_last_error, describe, init, finalize, allreduce, broadcast, allgather_i64,
  gather_bytes, barrier,
#ifdef RX_HAVE_NCCL
  allreduce_cuda,
#else
  NULL,
#endif
  reduce_scatter, allgather,
#ifdef RX_HAVE_NCCL
  reduce_scatter_cuda, allgather_cuda, broadcast_cuda,
#else
  NULL, NULL, NULL,
#endif
};

__attribute__((visibility("default"))) const rx_dist_backend *rx_dist_backend_mpi(void) { return &backend; }
