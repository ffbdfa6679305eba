/* gpu.h: helpers of the GPU tests (tests/gpu/test_*.c): the CPU op is the reference (it is itself
 * checked against float64 and finite differences in tests/c), the CUDA op runs on the same inputs,
 * and the two are compared by normalised error; device outputs sit between sentinel guards.
 * Without a CUDA device (or a build without CUDA) a test exits 77, which ctest reports as skipped. */
#ifndef RX_GPU_H
#define RX_GPU_H
#include <unistd.h>
#include "check.h"

enum { GPU_SKIP = 77, GPU_GUARD = 256 };
#define GPU_SENTINEL 1024.0   /* exact in f32, bf16, f16 and the integer types */

/* An environment switch of tests/gpu/run.sh: set, and neither empty nor "0". */
static inline int gpu_env_on(const char *name) {
  const char *v = getenv(name);
  return v && *v && strcmp(v, "0") != 0;
}

static inline int gpu_skip_unless_present(const char *name) {
  if (rx_has_cuda() || gpu_env_on("RX_GPU_LIST")) return 0;   /* listing the cases needs no device */
  int64_t a;
  const char *why = rx_cuda_memory(&a, NULL, NULL, NULL, NULL) ? rx_last_error() : "no CUDA device";
  fprintf(stderr, "%s: skipped: %s\n", name, why);
  return 1;
}

static inline rx_tensor *gpu_must(int rc, rx_tensor *t) {
  if (rc) { fprintf(stderr, "setup failed: %s\n", rx_last_error()); exit(1); }
  return t;
}

/* CPU f32 tensor, uniform in [lo, hi), from Philox (seed). */
static inline rx_tensor *cpu_uniform(int32_t ndim, const int64_t *shape, uint64_t seed, double lo, double hi) {
  rx_tensor *t;
  gpu_must(rx_tensor_new(&t, RX_F32, RX_CPU, ndim, shape), NULL);
  gpu_must(rx_tensor_uniform(t, seed, 0, lo, hi), t);
  return t;
}

/* The CPU tensor's values rounded through dtype (bf16: the GPU's inputs, as the CPU sees them). */
static inline void cpu_round_through(rx_tensor *t, int32_t dtype) {
  if (dtype == t->dtype) return;
  rx_tensor *r;
  gpu_must(rx_tensor_new(&r, dtype, RX_CPU, t->ndim, t->shape), NULL);
  gpu_must(rx_tensor_copy(r, t), r);
  gpu_must(rx_tensor_copy(t, r), t);
  rx_tensor_free(r);
}

/* A device copy of a CPU tensor in dtype. */
static inline rx_tensor *to_gpu(const rx_tensor *c, int32_t dtype) {
  rx_tensor *t;
  gpu_must(rx_tensor_new(&t, dtype, RX_CUDA, c->ndim, c->shape), NULL);
  gpu_must(rx_tensor_copy(t, c), t);
  return t;
}

/* A device tensor shaped `shape` in the middle of a larger allocation whose GPU_GUARD elements on
 * either side hold GPU_SENTINEL; `init` (a CPU tensor of the same numel, or NULL for zeros) fills it. */
typedef struct { rx_tensor *t, *whole; } gpu_guarded;

static inline gpu_guarded gpu_guarded_new(int32_t dtype, int32_t ndim, const int64_t *shape, const rx_tensor *init) {
  gpu_guarded g;
  int64_t n = 1;
  for (int i = 0; i < ndim; i++) n *= shape[i];
  int64_t total = n + 2 * GPU_GUARD;
  rx_tensor *mid;
  gpu_must(rx_tensor_new(&g.whole, dtype, RX_CUDA, 1, &total), NULL);
  gpu_must(rx_tensor_fill(g.whole, GPU_SENTINEL), g.whole);
  gpu_must(rx_tensor_narrow(&mid, g.whole, 0, GPU_GUARD, n), NULL);
  gpu_must(rx_tensor_reshape(&g.t, mid, ndim, shape), NULL);
  rx_tensor_free(mid);
  if (init) gpu_must(rx_tensor_copy(g.t, init), g.t);
  else gpu_must(rx_tensor_fill(g.t, 0), g.t);
  return g;
}

/* 1 when both guards still hold the sentinel. Frees the tensors. */
static inline int gpu_guarded_free(gpu_guarded g) {
  int64_t total = g.whole->numel, ok = 1;
  double *h = malloc((size_t)total * sizeof(double));
  gpu_must(rx_tensor_read_f64(g.whole, h), NULL);
  for (int64_t i = 0; i < GPU_GUARD; i++)
    if (h[i] != GPU_SENTINEL || h[total - 1 - i] != GPU_SENTINEL) ok = 0;
  free(h);
  rx_tensor_free(g.t);
  rx_tensor_free(g.whole);
  return (int)ok;
}

/* RX_GPU_REPORT=1 (tests/gpu/run.sh sets it): every comparison prints its error and its worst
 * element, passing or not, so a GPU log shows how close each op came, not only whether it passed. */
static inline void gpu_report(const rx_tensor *got, const rx_tensor *want, double e, int64_t worst, double got_v,
                              double want_v) {
  if (!gpu_env_on("RX_GPU_REPORT")) return;
  int64_t idx[8] = {0}, rest = worst;
  int nd = want->ndim < 8 ? want->ndim : 8;
  for (int d = nd - 1; d >= 0; d--) {   /* the flat index as [i, j, ...] */
    int64_t extent = want->shape[d] > 0 ? want->shape[d] : 1;
    idx[d] = d ? rest % extent : rest;
    rest /= extent;
  }
  char at[200] = "";
  for (int d = 0; d < nd; d++)
    snprintf(at + strlen(at), sizeof at - strlen(at), d ? ", %lld" : "%lld", (long long)idx[d]);
  fprintf(stderr, "  compare %s n=%lld: nrmse %.3g, worst |got-want| %.3g at [%s] (got %.9g, want %.9g)\n",
          rx_dtype_name(got->dtype), (long long)want->numel, e, fabs(got_v - want_v), at, got_v, want_v);
}

/* Normalised error of a device (or any) tensor against a CPU reference. */
static inline double gpu_nrmse(const rx_tensor *got, const rx_tensor *want) {
  int64_t n = want->numel, worst = 0;
  double *a = malloc((size_t)(n + 1) * sizeof(double)), *b = malloc((size_t)(n + 1) * sizeof(double));
  gpu_must(rx_tensor_read_f64(got, a), NULL);
  gpu_must(rx_tensor_read_f64(want, b), NULL);
  double e = check_nrmse(a, b, n), worst_d = -1;
  for (int64_t i = 0; i < n; i++) {
    double d = a[i] != a[i] ? INFINITY : fabs(a[i] - b[i]);
    if (a[i] != a[i]) e = INFINITY;   /* a NaN from the device is never close */
    if (d > worst_d) worst_d = d, worst = i;
  }
  if (n > 0) gpu_report(got, want, e, worst, a[worst], b[worst]);
  free(a);
  free(b);
  return e;
}

/* The tolerance of the issue: f32 mode 1e-5 relative, bf16 2e-2. */
static inline double gpu_tol(int32_t dtype) { return dtype == RX_BF16 ? 2e-2 : 1e-5; }

/* Bit-identical contents (determinism checks). */
static inline int gpu_same_bits(const rx_tensor *a, const rx_tensor *b) {
  rx_tensor *ha, *hb;
  gpu_must(rx_tensor_new(&ha, a->dtype, RX_CPU, a->ndim, a->shape), NULL);
  gpu_must(rx_tensor_new(&hb, b->dtype, RX_CPU, b->ndim, b->shape), NULL);
  gpu_must(rx_tensor_copy(ha, a), ha);
  gpu_must(rx_tensor_copy(hb, b), hb);
  int same = memcmp(ha->data, hb->data, (size_t)(a->numel * rx_dtype_size(a->dtype))) == 0;
  rx_tensor_free(ha);
  rx_tensor_free(hb);
  return same;
}

/* One case per process (tests/gpu/run.sh runs each case alone, so that a sticky device fault
 * in one cannot hide the others): RX_GPU_LIST=1 prints "case NAME" for every RUN(NAME) on stdout
 * and runs none (no device needed); RX_GPU_CASE=NAME runs only the cases named NAME, and exits 2
 * when no case has that name. Without either variable every case runs, as before. */
static int gpu_case_matched;
static inline void gpu_case_check_matched(void) {
  if (gpu_env_on("RX_GPU_CASE") && !gpu_env_on("RX_GPU_LIST") && !gpu_case_matched) {
    fprintf(stderr, "RX_GPU_CASE=%s: no case of that name (RX_GPU_LIST=1 lists them)\n", getenv("RX_GPU_CASE"));
    fflush(NULL);
    _exit(2);
  }
}

static inline int gpu_case_wanted(const char *name) {
  static int registered;
  if (!registered) registered = !atexit(gpu_case_check_matched);
  if (gpu_env_on("RX_GPU_LIST")) {
    printf("case %s\n", name);
    return 0;
  }
  if (gpu_env_on("RX_GPU_CASE") && strcmp(getenv("RX_GPU_CASE"), name) != 0) return 0;
  gpu_case_matched = 1;
  return 1;
}

/* check.h's RUN, behind the case selection above. */
#undef RUN
#define RUN(fn)                                                                   \
  do {                                                                            \
    if (!gpu_case_wanted(#fn)) break;                                             \
    check_case_failed = 0;                                                        \
    check_cases++;                                                                \
    fn();                                                                         \
    fprintf(stderr, "%s %s\n", check_case_failed ? "FAIL" : "ok  ", #fn);          \
  } while (0)


/* The tiny decoder configurations the GPU model tests share, on the CPU in f32 (callers set dtype
 * and device): 0 Qwen2 untied with GQA and q/k/v bias, 1 Qwen2 tied with MQA, 2 Qwen3 (q/k norm,
 * head_dim 6), 3 Llama 3.1 RoPE scaling (original context rope_original). */
static inline rx_model_config gpu_tiny_config(int variant, int64_t vocab, int64_t rope_original) {
  rx_model_config c = {0};
  c.vocab_size = vocab;
  c.hidden_size = 16;
  c.intermediate_size = 24;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 4;
  c.max_position_embeddings = 64;
  c.rms_norm_eps = 1e-6;
  c.rope_theta = 10000.0;
  c.dtype = RX_F32;
  c.device = RX_CPU;
  switch (variant) {
    case 0: c.attention_bias = 1; c.rope_theta = 1000000.0; break;
    case 1: c.attention_bias = 1; c.tie_word_embeddings = 1; c.num_key_value_heads = 1; break;
    case 2: c.qk_norm = 1; c.head_dim = 6; break;
    case 3:
      c.tie_word_embeddings = 1;
      c.head_dim = 8;
      c.rope_scaling = RX_ROPE_LLAMA3;
      c.rope_factor = 8;
      c.rope_low_freq_factor = 1;
      c.rope_high_freq_factor = 4;
      c.rope_original_max_position_embeddings = rope_original;
      break;
  }
  return c;
}

#endif
