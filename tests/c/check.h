/* check.h: the tiny harness of the C tests. Each test_*.c is one ctest executable:
 *   CHECK(cond, "fmt", ...) records a failure and goes on; RUN(fn) runs one case;
 *   return check_summary("name") from main. Valid C++ too, for the emulator's tests in tests/gpu. */
#ifndef RX_CHECK_H
#define RX_CHECK_H
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef __cplusplus
extern "C" {
#endif
#include "remax.h"
#ifdef __cplusplus
}
#endif

static int check_failures, check_cases, check_case_failed;

#define CHECK(cond, ...)                                                    \
  do {                                                                      \
    if (!(cond)) {                                                          \
      check_failures++;                                                     \
      check_case_failed = 1;                                                \
      fprintf(stderr, "%s:%d: check failed: %s: ", __FILE__, __LINE__, #cond); \
      fprintf(stderr, __VA_ARGS__);                                         \
      fprintf(stderr, "\n");                                                \
    }                                                                       \
  } while (0)

/* A call that must succeed; prints rx_last_error() otherwise. */
#define CHECK_OK(call) CHECK((call) == RX_OK, "%s", rx_last_error())

/* A call that must fail with an error message containing `needle`. */
#define CHECK_FAILS(call, needle)                                                         \
  do {                                                                                    \
    int rc_ = (call);                                                                     \
    CHECK(rc_ != RX_OK, "expected failure containing '%s'", needle);                      \
    if (rc_ != RX_OK)                                                                     \
      CHECK(strstr(rx_last_error(), needle) != NULL, "error '%s' lacks '%s'", rx_last_error(), needle); \
  } while (0)

#define RUN(fn)                                                                   \
  do {                                                                            \
    check_case_failed = 0;                                                        \
    check_cases++;                                                                \
    fn();                                                                         \
    fprintf(stderr, "%s %s\n", check_case_failed ? "FAIL" : "ok  ", #fn);          \
  } while (0)

static inline int check_summary(const char *name) {
  fprintf(stderr, "%s: %d cases, %d failed checks\n", name, check_cases, check_failures);
  return check_failures ? 1 : 0;
}

/* Normalised error ||a - b|| / max(||b||, tiny), as ggml's test-backend-ops uses. */
static inline double check_nrmse(const double *a, const double *b, int64_t n) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; i++) { num += (a[i] - b[i]) * (a[i] - b[i]); den += b[i] * b[i]; }
  return sqrt(num / (den > 1e-300 ? den : 1e-300));
}

/* A tensor with sentinel memory on both sides, to catch out-of-bounds writes. */
enum { CHECK_GUARD = 64 };
typedef struct { rx_tensor *t; unsigned char *block; size_t bytes; } guarded;

static inline guarded guarded_new(int32_t dtype, int32_t ndim, const int64_t *shape) {
  guarded g;
  memset(&g, 0, sizeof g);
  int64_t n = 1;
  for (int i = 0; i < ndim; i++) n *= shape[i];
  g.bytes = (size_t)(n * rx_dtype_size(dtype));
  g.block = (unsigned char *)malloc(g.bytes + 2 * CHECK_GUARD);
  memset(g.block, 0xA5, g.bytes + 2 * CHECK_GUARD);
  memset(g.block + CHECK_GUARD, 0, g.bytes);
  if (rx_tensor_wrap(&g.t, g.block + CHECK_GUARD, dtype, ndim, shape)) fprintf(stderr, "%s\n", rx_last_error());
  return g;
}

/* 1 when both guards are intact. Frees the tensor. */
static inline int guarded_free(guarded g) {
  int ok = 1;
  for (size_t i = 0; i < CHECK_GUARD; i++)
    if (g.block[i] != 0xA5 || g.block[CHECK_GUARD + g.bytes + i] != 0xA5) ok = 0;
  rx_tensor_free(g.t);
  free(g.block);
  return ok;
}

/* The tiny float64 decoder of the model and LoRA tests: vocabulary 23, hidden 16, two layers of
 * four heads of 4 (kv_heads of them for keys and values), MLP 24. qwen: q/k/v biases (Qwen2),
 * else none (Llama); tied: the head shares the embedding. */
static inline rx_model_config check_tiny_config(int qwen, int tied, int kv_heads, double rope_theta) {
  rx_model_config c;
  memset(&c, 0, sizeof c);
  c.vocab_size = 23;
  c.hidden_size = 16;
  c.intermediate_size = 24;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = kv_heads;
  c.head_dim = 4;
  c.max_position_embeddings = 64;
  c.rms_norm_eps = 1e-6;
  c.rope_theta = rope_theta;
  c.tie_word_embeddings = tied;
  c.attention_bias = qwen;
  c.dtype = RX_F64;
  c.device = RX_CPU;
  return c;
}

/* Every weight of m drawn from (seed, its index): norms uniform in [0.5, 1.5] (away from zero),
 * the rest normal with std 0.3 (large enough for every path to carry signal). */
static inline void check_randomise(rx_model *m, uint64_t seed) {
  for (int64_t i = 0; i < rx_model_param_count(m); i++) {
    rx_tensor *p = rx_model_param(m, i);
    if (strstr(rx_model_param_name(m, i), "norm.weight")) rx_tensor_uniform(p, seed, (uint64_t)i << 32, 0.5, 1.5);
    else rx_tensor_normal(p, seed, (uint64_t)i << 32, 0.0, 0.3);
  }
}

#endif
