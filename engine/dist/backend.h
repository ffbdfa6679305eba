/* backend.h: what a collective backend plugin gives libremax (engine/dist/dist.c).
 *
 * libremax itself never links MPI: a process that an MPI launcher started (dist.c reads the
 * launcher's environment) loads libremax_mpi.so, built from engine/dist/mpi/ against the MPI
 * that CMake's FindMPI found, and calls its one export, rx_dist_backend_mpi(). A process started
 * alone is a world of one and loads nothing. Internal to the engine; not part of remax.h. */
#ifndef RX_DIST_BACKEND_H
#define RX_DIST_BACKEND_H
#include <stddef.h>
#include <stdint.h>

enum { RX_DIST_BACKEND_ABI = 3 };

/* Every function returns 0, or non-zero with a message that last_error() returns. dtype is an
 * rx_dtype (RX_F32, RX_F64, RX_I64); op is RX_DIST_SUM / RX_DIST_MAX / RX_DIST_MIN. */
typedef struct rx_dist_backend {
  int32_t abi;
  const char *(*last_error)(void);
  const char *(*describe)(void);   /* "Open MPI v4.1.4, ..." */
  int (*init)(int32_t *rank, int32_t *size, int32_t *local_rank, int32_t *local_size);
  /* every rank says it has ended (a rank still training is named), then MPI_Finalize */
  int (*finalize)(void);
  /* Every collective first exchanges a header (the call, its sizes, the step) with every rank:
   * a rank that calls another collective or other sizes is named before data moves, and one
   * that does not come within `seconds` is named; after a failure every collective fails. */
  void (*set_timeout)(double seconds);
  void (*set_step)(int64_t step);   /* for the messages; -1: before the first step */  int (*allreduce)(void *buf, int64_t count, int32_t dtype, int32_t op);
  int (*broadcast)(void *buf, int64_t bytes, int32_t root);
  int (*allgather_i64)(int64_t value, int64_t *out);
  int (*gather_bytes)(const void *send, int64_t bytes, void *recv, const int64_t *counts, int32_t root);
  int (*barrier)(void);
  /* Sum of count elements of device memory on CUDA device `device_index` over NCCL; NULL when
   * the plugin was built without NCCL. */
  int (*allreduce_cuda)(void *buf, int64_t count, int32_t dtype, int32_t device_index);
  /* ZeRO. buf holds count elements split into shards of `shard` elements, rank r owning
   * [r * shard, min((r + 1) * shard, count)) (the last ones may be short or empty). In place:
   * reduce_scatter leaves the sum over ranks of rank r's shard in rank r's shard (the rest of buf
   * is then undefined); allgather copies every rank's shard into every rank's buf. */
  int (*reduce_scatter)(void *buf, int64_t count, int64_t shard, int32_t dtype);
  int (*allgather)(void *buf, int64_t count, int64_t shard, int32_t dtype);
  /* The same on CUDA device memory over NCCL, and a broadcast of bytes; NULL without NCCL. */
  int (*reduce_scatter_cuda)(void *buf, int64_t count, int64_t shard, int32_t dtype, int32_t device_index);
  int (*allgather_cuda)(void *buf, int64_t count, int64_t shard, int32_t dtype, int32_t device_index);
  int (*broadcast_cuda)(void *buf, int64_t bytes, int32_t root, int32_t device_index);
} rx_dist_backend;

typedef const rx_dist_backend *(*rx_dist_backend_fn)(void);

#endif
