/* dnnl.c: bf16 GEMMs with f32 accumulation through oneDNN (Debian's libdnnl-dev; optional: found by
 * CMake, RX_HAVE_DNNL), the library PyTorch's CPU bf16 autocast runs its matmuls on. oneDNN picks
 * its kernel for the CPU at run time: AMX where the CPU has it, AVX-512 BF16 (vdpbf16ps), else
 * an emulation on plain AVX-512; rx_cpu_dnnl_kernel() says which.
 *
 * The building block of bf16 mixed-precision training (f32 master weights, bf16 copies for the
 * GEMMs): C[M,N] = A[M,K] B[K,N] (+ C when accumulate), A and B bf16 in any strides (so a
 * transpose is a stride), C f32 row-major. The products of bf16 numbers are exact in f32 and the
 * sums f32: the f32 GEMM of the rounded inputs up to the order of the sums.
 *
 * Primitives are made once per shape and kept in a small table (oneDNN's own cache also keeps
 * them); a step's GEMMs reuse them. Called from one thread at a time (the ops' caller); oneDNN
 * runs each GEMM on the OpenMP threads. */
#include "cpu.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(RX_HAVE_DNNL)
#include <oneapi/dnnl/dnnl.h>

typedef struct {
  int64_t M, N, K, sa[2], sb[2], ldc;
  int accumulate;
  dnnl_primitive_t prim;
} gemm_entry;

enum { CACHE = 64 };
static gemm_entry cache[CACHE];
static int cache_used, cache_next;
static dnnl_engine_t engine;
static dnnl_stream_t stream;
static int ready = -1;   /* -1: not tried; 0: failed; 1: engine and stream made */

static int setup(void) {
  if (ready >= 0) return ready;
  ready = dnnl_engine_create(&engine, dnnl_cpu, 0) == dnnl_success &&
          dnnl_stream_create(&stream, engine, dnnl_stream_default_flags) == dnnl_success;
  return ready;
}

static dnnl_primitive_t make(int64_t M, int64_t N, int64_t K, const int64_t sa[2], const int64_t sb[2], int64_t ldc,
                             int accumulate) {
  dnnl_memory_desc_t a, b, c;
  const dnnl_dims_t da = {M, K}, db = {K, N}, dc = {M, N}, stc = {ldc, 1};
  dnnl_dims_t sta = {sa[0], sa[1]}, stb = {sb[0], sb[1]};
  if (dnnl_memory_desc_init_by_strides(&a, 2, da, dnnl_bf16, sta) || dnnl_memory_desc_init_by_strides(&b, 2, db, dnnl_bf16, stb) ||
      dnnl_memory_desc_init_by_strides(&c, 2, dc, dnnl_f32, stc))
    return NULL;
  dnnl_matmul_desc_t d;
  if (dnnl_matmul_desc_init(&d, &a, &b, NULL, &c)) return NULL;
  dnnl_primitive_attr_t attr = NULL;
  dnnl_post_ops_t ops = NULL;
  if (dnnl_primitive_attr_create(&attr)) return NULL;
  if (accumulate) {
    if (dnnl_post_ops_create(&ops) || dnnl_post_ops_append_sum(ops, 1.0f) || dnnl_primitive_attr_set_post_ops(attr, ops)) {
      if (ops) dnnl_post_ops_destroy(ops);
      dnnl_primitive_attr_destroy(attr);
      return NULL;
    }
  }
  dnnl_primitive_desc_t pd = NULL;
  dnnl_primitive_t prim = NULL;
  if (dnnl_primitive_desc_create(&pd, &d, attr, engine, NULL) == dnnl_success) {
    if (dnnl_primitive_create(&prim, pd) != dnnl_success) prim = NULL;
    dnnl_primitive_desc_destroy(pd);
  }
  if (ops) dnnl_post_ops_destroy(ops);
  dnnl_primitive_attr_destroy(attr);
  return prim;
}

static dnnl_primitive_t lookup(int64_t M, int64_t N, int64_t K, const int64_t sa[2], const int64_t sb[2], int64_t ldc,
                               int accumulate) {
  for (int i = 0; i < cache_used; i++) {
    const gemm_entry *e = &cache[i];
    if (e->M == M && e->N == N && e->K == K && e->sa[0] == sa[0] && e->sa[1] == sa[1] && e->sb[0] == sb[0] &&
        e->sb[1] == sb[1] && e->ldc == ldc && e->accumulate == accumulate)
      return e->prim;
  }
  dnnl_primitive_t prim = make(M, N, K, sa, sb, ldc, accumulate);
  if (!prim) return NULL;
  gemm_entry *e;
  if (cache_used < CACHE) e = &cache[cache_used++];
  else {   /* full: replace the entries in turn */
    e = &cache[cache_next];
    cache_next = (cache_next + 1) % CACHE;
    dnnl_primitive_destroy(e->prim);
  }
  *e = (gemm_entry){M, N, K, {sa[0], sa[1]}, {sb[0], sb[1]}, ldc, accumulate, prim};
  return prim;
}

int rx_cpu_dnnl_gemm_bf16(float *c, int64_t ldc, const uint16_t *a, const int64_t sa[2], const uint16_t *b,
                          const int64_t sb[2], int64_t M, int64_t N, int64_t K, int accumulate) {
  if (M == 0 || N == 0) return 1;
  if (K == 0) {
    if (!accumulate)
      for (int64_t m = 0; m < M; m++) memset(c + m * ldc, 0, (size_t)N * sizeof(float));
    return 1;
  }
  if (!setup()) return 0;
  dnnl_primitive_t prim = lookup(M, N, K, sa, sb, ldc, accumulate);
  if (!prim) return 0;
  const_dnnl_primitive_desc_t pd;
  if (dnnl_primitive_get_primitive_desc(prim, &pd)) return 0;
  const dnnl_memory_desc_t *ma = dnnl_primitive_desc_query_md(pd, dnnl_query_src_md, 0);
  const dnnl_memory_desc_t *mb = dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
  const dnnl_memory_desc_t *mc = dnnl_primitive_desc_query_md(pd, dnnl_query_dst_md, 0);
  dnnl_memory_t xa = NULL, xb = NULL, xc = NULL;
  int ok = dnnl_memory_create(&xa, ma, engine, (void *)a) == dnnl_success &&
           dnnl_memory_create(&xb, mb, engine, (void *)b) == dnnl_success &&
           dnnl_memory_create(&xc, mc, engine, c) == dnnl_success;
  if (ok) {
    dnnl_exec_arg_t args[3] = {{DNNL_ARG_SRC, xa}, {DNNL_ARG_WEIGHTS, xb}, {DNNL_ARG_DST, xc}};
    ok = dnnl_primitive_execute(prim, stream, 3, args) == dnnl_success && dnnl_stream_wait(stream) == dnnl_success;
  }
  if (xa) dnnl_memory_destroy(xa);
  if (xb) dnnl_memory_destroy(xb);
  if (xc) dnnl_memory_destroy(xc);
  return ok;
}

const char *rx_cpu_dnnl_kernel(void) {
  static char text[96];
  if (text[0]) return text;
  const dnnl_version_t *v = dnnl_version();
  /* oneDNN chooses AMX, then AVX-512 BF16, then its plain AVX-512 emulation of bf16 */
  __builtin_cpu_init();
  const char *isa = __builtin_cpu_supports("avx512bf16") ? "AVX-512 BF16" :
                    __builtin_cpu_supports("avx512bw") ? "AVX-512 (bf16 emulated)" : "none (no AVX-512)";
  snprintf(text, sizeof text, "oneDNN %d.%d.%d on %s", v->major, v->minor, v->patch, isa);
  return text;
}

int rx_cpu_dnnl(void) {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512bw") && setup();   /* oneDNN's bf16 matmul needs AVX-512 */
}
#else
int rx_cpu_dnnl_gemm_bf16(float *c, int64_t ldc, const uint16_t *a, const int64_t sa[2], const uint16_t *b,
                          const int64_t sb[2], int64_t M, int64_t N, int64_t K, int accumulate) {
  (void)c; (void)ldc; (void)a; (void)sa; (void)b; (void)sb; (void)M; (void)N; (void)K; (void)accumulate;
  return 0;
}
const char *rx_cpu_dnnl_kernel(void) { return "none: built without oneDNN (apt-get install libdnnl-dev)"; }
int rx_cpu_dnnl(void) { return 0; }
#endif
