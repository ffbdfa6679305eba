/* mpi_backend.c: libremax_mpi.so, the MPI (and, when built with it, NCCL) collectives behind
 * engine/dist/dist.c. Only a process started by an MPI launcher loads it, so only such a process
 * needs libmpi. Errors return (MPI_ERRORS_RETURN) with MPI's own message; nothing here exits. */
#include <mpi.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
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

/* Every collective starts with a header exchange on its own communicator (point to point, every
 * rank to every other): what the rank calls, with which sizes, at which step. A rank that calls
 * something else (another setting, another code path) is named with both calls before any data
 * moves, so nothing is truncated or misread; a rank that does not arrive within the timeout is
 * named too. The data then moves through non-blocking collectives polled against the same
 * deadline. After a failure every later collective fails at once (the world is broken). */
static MPI_Comm control = MPI_COMM_NULL;
static double timeout_seconds = 1800;   /* torch.distributed's default: 30 minutes */
static int64_t current_step = -1;       /* -1: before the first step */
static int broken;
static char broken_message[1024];

enum {
  K_ALLREDUCE = 1, K_BROADCAST, K_ALLGATHER_I64, K_GATHER, K_BARRIER, K_ALLREDUCE_CUDA, K_REDUCE_SCATTER,
  K_ALLGATHER, K_REDUCE_SCATTER_CUDA, K_ALLGATHER_CUDA, K_BROADCAST_CUDA, K_LEAVE, K_COUNT
};
static const char *kind_names[K_COUNT] = {
  "?", "all-reduce", "broadcast", "all-gather of one number", "gather", "barrier", "all-reduce (NCCL)",
  "reduce-scatter", "all-gather", "reduce-scatter (NCCL)", "all-gather (NCCL)", "broadcast (NCCL)", "the end of the run",
};
enum { HEADER_WORDS = 6, HEADER_TAG = 7001 };
typedef struct { int64_t kind, count, root, dtype, op, step; } header;

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

static double now_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void set_timeout(double seconds) { timeout_seconds = seconds; }
static void set_step(int64_t step) { current_step = step; }

static void where(char *out, size_t cap, int64_t step) {
  if (step < 0) snprintf(out, cap, "before the first step");
  else snprintf(out, cap, "at step %lld", (long long)step);
}

/* The world is broken: this message is every later collective's too. */
static int break_world(void) {
  broken = 1;
  snprintf(broken_message, sizeof broken_message, "%s", last_error);
  return 1;
}

/* Waits for n requests until the deadline, polling (MPI's non-blocking operations progress in
 * MPI_Test): spins briefly, then sleeps a little between polls, as a blocking MPI call would
 * busy-wait. Returns 0 when all completed, 1 on an MPI error (message set), 2 on timeout. */
static int wait_until(MPI_Request *reqs, int n, double deadline, const char *call) {
  long polls = 0;
  long pause_ns = 20000;
  for (;;) {
    int done = 0;
    int rc = MPI_Testall(n, reqs, &done, MPI_STATUSES_IGNORE);
    if (rc != MPI_SUCCESS) return mpi_fail(call, rc);
    if (done) return 0;
    if (now_seconds() > deadline) return 2;
    if (++polls > 2000) {
      struct timespec ts = { 0, pause_ns };
      nanosleep(&ts, NULL);
      if (pause_ns < 1000000) pause_ns += pause_ns / 8;
    }
  }
}

static const char *dtype_text(int64_t dtype) {
  switch (dtype) {
  case RX_F32: return "f32";
  case RX_F64: return "f64";
  case RX_BF16: return "bf16";
  case RX_I64: return "i64";
  }
  return "?";
}

static const char *op_text(int64_t op) { return op == RX_DIST_MAX ? "max" : op == RX_DIST_MIN ? "min" : "sum"; }

static void describe_call(char *out, size_t cap, const header *h) {
  int k = h->kind > 0 && h->kind < K_COUNT ? (int)h->kind : 0;
  char at[48];
  where(at, sizeof at, h->step);
  if (k == K_LEAVE) snprintf(out, cap, "has ended its run (%s)", at);
  else if (k == K_BARRIER) snprintf(out, cap, "calls %s %s", kind_names[k], at);
  else if (k == K_BROADCAST || k == K_BROADCAST_CUDA)
    snprintf(out, cap, "calls %s of %lld bytes from rank %lld %s", kind_names[k], (long long)h->count, (long long)h->root, at);
  else if (k == K_GATHER) snprintf(out, cap, "calls %s to rank %lld %s", kind_names[k], (long long)h->root, at);
  else if (k == K_REDUCE_SCATTER || k == K_ALLGATHER || k == K_REDUCE_SCATTER_CUDA || k == K_ALLGATHER_CUDA)
    snprintf(out, cap, "calls %s of %lld %s in shards of %lld %s", kind_names[k], (long long)h->count,
             dtype_text(h->dtype), (long long)h->root, at);
  else if (k == K_ALLGATHER_I64) snprintf(out, cap, "calls %s %s", kind_names[k], at);
  else
    snprintf(out, cap, "calls %s (%s) of %lld %s %s", kind_names[k], op_text(h->op), (long long)h->count,
             dtype_text(h->dtype), at);
}

static int same_call(const header *a, const header *b) {
  return a->kind == b->kind && a->count == b->count && a->root == b->root && a->dtype == b->dtype && a->op == b->op;
}

/* The header exchange before a collective: 0 when every rank calls the same collective with the
 * same sizes; otherwise 1 with a message naming the ranks (the same message on every rank when
 * they disagree; the ranks that did not arrive when the timeout passes). */
static int enter(int64_t kind, int64_t count, int64_t root, int64_t dtype, int64_t op) {
  if (broken) return fail("%s", broken_message);
  if (my_size == 1) return 0;
  header mine = { kind, count, root, dtype, op, current_step };
  header *all = calloc((size_t)my_size, sizeof *all);
  MPI_Request *reqs = malloc(sizeof *reqs * 2 * (size_t)my_size);
  if (!all || !reqs) {
    free(all), free(reqs);
    return fail("out of memory for %d collective headers", my_size);
  }
  all[my_rank] = mine;
  int n = 0, rc = MPI_SUCCESS;
  for (int r = 0; r < my_size && rc == MPI_SUCCESS; r++) {
    if (r == my_rank) continue;
    rc = MPI_Irecv(&all[r], HEADER_WORDS, MPI_INT64_T, r, HEADER_TAG, control, &reqs[n++]);
  }
  int nrecv = n;
  for (int r = 0; r < my_size && rc == MPI_SUCCESS; r++) {
    if (r == my_rank) continue;
    rc = MPI_Isend(&mine, HEADER_WORDS, MPI_INT64_T, r, HEADER_TAG, control, &reqs[n++]);
  }
  if (rc != MPI_SUCCESS) {
    free(all), free(reqs);
    mpi_fail("MPI_Isend/MPI_Irecv (collective header)", rc);
    return break_world();
  }
  char at[48], mine_text[200];
  where(at, sizeof at, current_step);
  describe_call(mine_text, sizeof mine_text, &mine);
  /* the receives first: once every rank's header is here, the sends are too, or soon */
  int w = wait_until(reqs, nrecv, now_seconds() + timeout_seconds, "collective header");
  if (w == 0) w = wait_until(reqs + nrecv, n - nrecv, now_seconds() + timeout_seconds, "collective header");
  if (w == 2) {
    /* a rank is missing when its header did not come or ours did not reach it (a stopped rank
     * whose header came before it stopped: the sends then wait; rank 0 among them) */
    char missing[256] = "";
    size_t at_len = 0;
    int k = 0;
    for (int r = 0; r < my_size; r++) {
      if (r == my_rank) continue;
      int got = 0, sent = 0;
      MPI_Test(&reqs[k], &got, MPI_STATUS_IGNORE);
      MPI_Test(&reqs[nrecv + k], &sent, MPI_STATUS_IGNORE);
      k++;
      if ((!got || !sent) && at_len + 16 < sizeof missing)
        at_len += (size_t)snprintf(missing + at_len, sizeof missing - at_len, "%s%d", at_len ? ", " : "", r);
    }
    if (missing[0])
      fail("rank %d %s and waited %g s (dist_timeout) for rank(s) %s, which did not come: stopped, hung or gone "
           "without the launcher noticing; stopping", my_rank, mine_text, timeout_seconds, missing);
    else
      fail("rank %d %s and waited %g s (dist_timeout) for the other ranks' headers, which MPI did not deliver "
           "(a rank stopped, hung or gone without the launcher noticing); stopping", my_rank, mine_text, timeout_seconds);
    free(all), free(reqs);
    return break_world();
  }
  free(reqs);
  if (w) {
    free(all);
    return break_world();
  }
  /* the same verdict on every rank: the lowest rank whose call differs from rank 0's */
  for (int r = 1; r < my_size; r++) {
    if (same_call(&all[r], &all[0])) continue;
    char a[200], b[200];
    describe_call(a, sizeof a, &all[0]);
    describe_call(b, sizeof b, &all[r]);
    if (all[r].kind == K_LEAVE || all[0].kind == K_LEAVE)
      fail("the ranks disagree on the run's length: rank 0 %s, rank %d %s; stopping", a, r, b);
    else
      fail("the ranks disagree: rank 0 %s, rank %d %s (different settings or code on the ranks?); stopping", a, r, b);
    free(all);
    return break_world();
  }
  free(all);
  return 0;
}

/* Waits for the data of a collective the header exchange let through. */
static int finish(MPI_Request *req, const char *call) {
  int w = wait_until(req, 1, now_seconds() + timeout_seconds, call);
  if (w == 2) {
    char at[48];
    where(at, sizeof at, current_step);
    fail("rank %d waited %g s (dist_timeout) in %s %s: every rank began it but one stopped, hung or went away "
         "during it; stopping", my_rank, timeout_seconds, call, at);
  }
  return w ? break_world() : 0;
}

#define START(call, req)                                                   \
  do {                                                                     \
    int rc_ = (call);                                                      \
    if (rc_ != MPI_SUCCESS) { mpi_fail(#call, rc_); return break_world(); } \
  } while (0)
static const char *describe(void) { return description; }

static int init(int32_t *rank, int32_t *size, int32_t *local_rank, int32_t *local_size) {
  int inited = 0;
  CHECK(MPI_Initialized(&inited));
  if (!inited) CHECK(MPI_Init(NULL, NULL));
  CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &world));
  CHECK(MPI_Comm_set_errhandler(world, MPI_ERRORS_RETURN));
  CHECK(MPI_Comm_dup(world, &control));
  CHECK(MPI_Comm_set_errhandler(control, MPI_ERRORS_RETURN));
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
  /* the last header: every rank says it has ended, so a rank that ends early (fewer steps, a
   * script that stops) is named by the others instead of leaving them waiting */
  if (!broken && my_size > 1 && enter(K_LEAVE, 0, 0, 0, 0)) return 1;
  if (broken) return fail("%s", broken_message);
  free(scratch);
  scratch = NULL, scratch_bytes = 0;
#ifdef RX_HAVE_NCCL
  finalize_nccl();
#endif
  if (control != MPI_COMM_NULL) MPI_Comm_free(&control);
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
  if (enter(K_ALLREDUCE, count, 0, dtype, op)) return 1;
  int64_t esize = dtype == RX_F32 ? 4 : 8;   /* f32, or f64 / i64 */
  for (int64_t at = 0; at < count; at += PIECE) {
    int64_t n = count - at < PIECE ? count - at : PIECE;
    MPI_Request req;
    START(MPI_Iallreduce(MPI_IN_PLACE, (char *)buf + at * esize, (int)n, t, o, world, &req), req);
    if (finish(&req, "MPI_Iallreduce")) return 1;
  }
  return 0;
}

static int broadcast(void *buf, int64_t bytes, int32_t root) {
  if (enter(K_BROADCAST, bytes, root, 0, 0)) return 1;
  for (int64_t at = 0; at < bytes; at += PIECE) {
    int64_t n = bytes - at < PIECE ? bytes - at : PIECE;
    MPI_Request req;
    START(MPI_Ibcast((char *)buf + at, (int)n, MPI_BYTE, root, world, &req), req);
    if (finish(&req, "MPI_Ibcast")) return 1;
  }
  return 0;
}

static int allgather_i64(int64_t value, int64_t *out) {
  if (enter(K_ALLGATHER_I64, 1, 0, 0, 0)) return 1;
  MPI_Request req;
  START(MPI_Iallgather(&value, 1, MPI_INT64_T, out, 1, MPI_INT64_T, world, &req), req);
  return finish(&req, "MPI_Iallgather");
}

static int gather_bytes(const void *send, int64_t bytes, void *recv, const int64_t *counts, int32_t root) {
  if (bytes > INT32_MAX) return fail("gather of %lld bytes from one rank (at most 2^31 - 1)", (long long)bytes);
  if (enter(K_GATHER, 0, root, 0, 0)) return 1;   /* counts differ by rank; the root's counts say them */
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
  MPI_Request req;
  int rc = MPI_Igatherv(send, (int)bytes, MPI_BYTE, recv, c, d, MPI_BYTE, root, world, &req);
  if (rc != MPI_SUCCESS) {
    free(c), free(d);
    mpi_fail("MPI_Igatherv", rc);
    return break_world();
  }
  int w = finish(&req, "MPI_Igatherv");
  free(c), free(d);
  return w;
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
  if (enter(K_REDUCE_SCATTER, count, shard, dtype, 0)) {
    free(counts), free(displs);
    return 1;
  }
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
      MPI_Request req;
      rc = MPI_Iscatterv(buf, c, d, t, root ? MPI_IN_PLACE : recv, (int)n, t, k, world, &req);
      if (rc == MPI_SUCCESS && finish(&req, "MPI_Iscatterv (reduce-scatter)")) {
        free(c), free(d), free(counts), free(displs);
        return 1;
      }
      const char *piece = root ? own : recv;
      if (rc == MPI_SUCCESS && n > 0) {
        if (k == 0) memcpy(acc, piece, (size_t)(n * esize));
        else add_into(acc, piece, n, dtype);
      }
    }
    if (rc == MPI_SUCCESS && n > 0) memcpy(own, acc, (size_t)(n * esize));
  }
  free(c), free(d), free(counts), free(displs);
  if (rc != MPI_SUCCESS) {
    mpi_fail("MPI_Iscatterv (reduce-scatter)", rc);
    return break_world();
  }
  return 0;
}

static int allgather(void *buf, int64_t count, int64_t shard, int32_t dtype) {
  MPI_Datatype t = MPI_DATATYPE_NULL;
  if (mpi_type(dtype, &t)) return 1;
  int *counts, *displs;
  if (shard_layout(count, shard, &counts, &displs)) return 1;
  if (enter(K_ALLGATHER, count, shard, dtype, 0)) {
    free(counts), free(displs);
    return 1;
  }
  MPI_Request req;
  int rc = MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, counts, displs, t, world, &req);
  int w = rc == MPI_SUCCESS ? finish(&req, "MPI_Iallgatherv") : (mpi_fail("MPI_Iallgatherv", rc), break_world());
  free(counts), free(displs);
  return w;
}

/* the header exchange is itself a barrier: every rank has reached it when it returns */
static int barrier(void) {
  return enter(K_BARRIER, 0, 0, 0, 0);
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
  MPI_Request req;
  START(MPI_Ibcast(&id, (int)sizeof id, MPI_BYTE, 0, world, &req), req);
  if (finish(&req, "MPI_Ibcast (NCCL's unique id)")) return 1;
  CUDA_CHECK(cudaSetDevice(device_index));
  NCCL_CHECK(ncclCommInitRank(&nccl_comm, my_size, id, my_rank));
  nccl_device = device_index;
  return 0;
}

/* NCCL's side of dist_timeout: the collective was queued on the default stream; poll it (and
 * the communicator's asynchronous error) until the deadline, then abort the communicator so that
 * nothing waits on it any more, naming the collective and the step. */
static int nccl_wait(const char *call) {
  double deadline = now_seconds() + timeout_seconds;
  long pause_ns = 20000;
  for (;;) {
    cudaError_t e = cudaStreamQuery(0);
    if (e == cudaSuccess) return 0;
    if (e != cudaErrorNotReady) {
      fail("%s: %s", call, cudaGetErrorString(e));
      return break_world();
    }
    ncclResult_t async = ncclSuccess;
    if (ncclCommGetAsyncError(nccl_comm, &async) == ncclSuccess && async != ncclSuccess && async != ncclInProgress) {
      fail("%s: %s", call, ncclGetErrorString(async));
      ncclCommAbort(nccl_comm);
      nccl_device = -1;
      return break_world();
    }
    if (now_seconds() > deadline) {
      char at[48];
      where(at, sizeof at, current_step);
      fail("rank %d waited %g s (dist_timeout) in %s %s: a rank stopped, hung or went away during it; the NCCL "
           "communicator is aborted; stopping", my_rank, timeout_seconds, call, at);
      ncclCommAbort(nccl_comm);
      nccl_device = -1;
      return break_world();
    }
    struct timespec ts = { 0, pause_ns };
    nanosleep(&ts, NULL);
    if (pause_ns < 1000000) pause_ns += pause_ns / 8;
  }
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
  if (enter(K_ALLREDUCE_CUDA, count, 0, dtype, 0) || nccl_begin(dtype, device_index, &t)) return 1;
  /* the default stream: the engine's kernels have finished writing buf when this starts */
  NCCL_CHECK(ncclAllReduce(buf, buf, (size_t)count, t, ncclSum, nccl_comm, 0));
  return nccl_wait("ncclAllReduce");
}

static int64_t dtype_bytes(int32_t dtype) { return dtype == RX_BF16 ? 2 : dtype == RX_F32 ? 4 : 8; }

/* Equal shards go to ncclReduceScatter / ncclAllGather in place (the shard at rank * shard);
 * a short last shard to one grouped ncclReduce / ncclBroadcast per rank, each rooted at the
 * shard's owner. */
static int reduce_scatter_cuda(void *buf, int64_t count, int64_t shard, int32_t dtype, int32_t device_index) {
  ncclDataType_t t = ncclFloat32;
  if (enter(K_REDUCE_SCATTER_CUDA, count, shard, dtype, 0) || nccl_begin(dtype, device_index, &t)) return 1;
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
  return nccl_wait("ncclReduceScatter");
}

static int allgather_cuda(void *buf, int64_t count, int64_t shard, int32_t dtype, int32_t device_index) {
  ncclDataType_t t = ncclFloat32;
  if (enter(K_ALLGATHER_CUDA, count, shard, dtype, 0) || nccl_begin(dtype, device_index, &t)) return 1;
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
  return nccl_wait("ncclAllGather");
}

static int broadcast_cuda(void *buf, int64_t bytes, int32_t root, int32_t device_index) {
  if (enter(K_BROADCAST_CUDA, bytes, root, 0, 0) || nccl_setup(device_index)) return 1;
  CUDA_CHECK(cudaSetDevice(device_index));
  NCCL_CHECK(ncclBroadcast(buf, buf, (size_t)bytes, ncclUint8, root, nccl_comm, 0));
  return nccl_wait("ncclBroadcast");
}
#endif

static const rx_dist_backend backend = {
  RX_DIST_BACKEND_ABI, get_last_error, describe, init, finalize, set_timeout, set_step, allreduce, broadcast, allgather_i64,
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
