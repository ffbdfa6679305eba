/* test_threads.c: the CPU thread count follows the cores other processes leave
 * (engine/core/threads.c): the decision against counts fed to it, the sampler against a real
 * busy child process, and the engine option that turns it off. And what makes that harmless:
 * a training forward and backward, and the gradient norm, give the same bits at 1 and 2
 * threads (README: "the kernels give the same bits for any thread count"). */
#define _GNU_SOURCE
#include <omp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "core/threads.h"

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000};
  nanosleep(&ts, NULL);
}

/* Quiet: every core. One other busy process on 2 cores: 1 thread. Never below 1, never above
 * the cap, whatever the count. */
static void decide_follows_others(void) {
  rx_threads_state s = {0, 0};
  for (int i = 0; i < 10; i++) CHECK(rx_threads_decide(&s, 0, 2, 2) == 2, "quiet: 2 threads");
  int want = 0;
  for (int i = 0; i < 10; i++) want = rx_threads_decide(&s, 1, 2, 2);
  CHECK(want == 1, "one busy process on 2 cores: 1 thread, got %d", want);
  for (int i = 0; i < 10; i++) want = rx_threads_decide(&s, 5, 2, 2);
  CHECK(want == 1, "never below 1, got %d", want);
  for (int i = 0; i < 20; i++) want = rx_threads_decide(&s, 0, 2, 2);
  CHECK(want == 2, "back to 2 when the others stop, got %d", want);
  rx_threads_state b = {0, 0};
  for (int i = 0; i < 10; i++) want = rx_threads_decide(&b, 3, 16, 8);
  CHECK(want == 8, "16 cores, 3 others, cap 8: 8 threads, got %d", want);
  for (int i = 0; i < 10; i++) want = rx_threads_decide(&b, 12, 16, 8);
  CHECK(want == 4, "16 cores, 12 others: 4 threads, got %d", want);
}

/* A transient process (one sample in ten) does not move the decision. */
static void decide_ignores_blips(void) {
  rx_threads_state s = {0, 0};
  int changed = 0;
  for (int i = 0; i < 50; i++) changed |= rx_threads_decide(&s, i % 10 == 0 ? 1 : 0, 2, 2) != 2;
  CHECK(!changed, "a one-sample blip changed the thread count");
}

/* A real busy child process: the sampler sees it, and the engine's count drops below the cap.
 * (Only the drop is asserted: on a loaded machine the count may stay low after the child ends.) */
static void adapt_sees_busy_process(void) {
  if (rx_threads_cap() < 2) { printf("  (1 thread: nothing to adapt)\n"); return; }
  if (rx_threads_others() < 0) { printf("  (no /proc/loadavg: the count stays)\n"); return; }
  pid_t child = fork();
  if (child == 0) {
    for (volatile unsigned long i = 0;; i++) {}
  }
  CHECK(child > 0, "fork");
  if (child <= 0) return;
  int lowest = rx_threads_cap();
  for (int i = 0; i < 80 && lowest == rx_threads_cap(); i++) {   /* up to 2.4 s */
    rx_threads_adapt();
    if (rx_threads_current() < lowest) lowest = rx_threads_current();
    sleep_ms(30);
  }
  kill(child, SIGKILL);
  waitpid(child, NULL, 0);
  CHECK(lowest < rx_threads_cap(), "a busy process beside it: still %d of %d threads", lowest, rx_threads_cap());
  CHECK(omp_get_max_threads() == rx_threads_current(), "OpenMP's count is the one chosen");
}

/* threads_adapt = off gives back the full count at the next call. */
static void option_off_restores(void) {
  CHECK_OK(rx_set_option("threads_adapt", "off"));
  rx_threads_adapt();
  CHECK(rx_threads_current() == rx_threads_cap(), "off: %d of %d threads", rx_threads_current(), rx_threads_cap());
  CHECK(omp_get_max_threads() == rx_threads_cap(), "off: OpenMP has the full count");
  CHECK_OK(rx_set_option("threads_adapt", "on"));
  CHECK_FAILS(rx_set_option("threads_adapt", "maybe"), "threads_adapt");
}

/* A model whose GEMMs sum over a K that OpenBLAS splits differently when threaded: the hidden
 * size 456 (the forward) and 500 tokens (the weight gradients) lie between GEMM_Q and 2 GEMM_Q of
 * its kernels (320: Haswell, Zen, Cooper Lake; 448: SkylakeX), where its single-threaded and
 * threaded drivers cut K at different places (engine/cpu/blas.c). Weights as check_randomise,
 * scaled down for 456 inputs. */
static rx_model *wide_model(int32_t dtype) {
  rx_model_config c;
  memset(&c, 0, sizeof c);
  c.vocab_size = 600;
  c.hidden_size = 456;
  c.intermediate_size = 960;
  c.num_hidden_layers = 1;
  c.num_attention_heads = 6;
  c.num_key_value_heads = 2;
  c.head_dim = 76;
  c.max_position_embeddings = 512;
  c.rms_norm_eps = 1e-6;
  c.rope_theta = 1000000.0;
  c.attention_bias = 1;
  c.dtype = dtype;
  c.device = RX_CPU;
  rx_model *m = NULL;
  if (rx_model_new(&m, &c)) { fprintf(stderr, "%s\n", rx_last_error()); return NULL; }
  for (int64_t i = 0; i < rx_model_param_count(m); i++) {
    rx_tensor *p = rx_model_param(m, i);
    if (strstr(rx_model_param_name(m, i), "norm.weight")) rx_tensor_uniform(p, 5, (uint64_t)i << 32, 0.5, 1.5);
    else rx_tensor_normal(p, 5, (uint64_t)i << 32, 0.0, 0.05);
  }
  return m;
}

/* One train forward (log-probabilities and entropies) and backward of 2 rows of 250 tokens at
 * `threads` threads; out gets the log-probabilities, the entropies, then every gradient. */
static int64_t forward_backward(rx_model *m, int threads, float *out) {
  enum { B = 2, T = 250 };
  omp_set_num_threads(threads);
  int64_t shape[2] = {B, T};
  rx_tensor *tok = NULL, *lp = NULL, *ent = NULL, *dlp = NULL;
  CHECK_OK(rx_tensor_new(&tok, RX_I32, RX_CPU, 2, shape));
  CHECK_OK(rx_tensor_new(&lp, RX_F32, RX_CPU, 2, shape));
  CHECK_OK(rx_tensor_new(&ent, RX_F32, RX_CPU, 2, shape));
  CHECK_OK(rx_tensor_new(&dlp, RX_F32, RX_CPU, 2, shape));
  if (!tok || !lp || !ent || !dlp) return 0;
  for (int64_t i = 0; i < B * T; i++) {
    ((int32_t *)tok->data)[i] = (int32_t)((i * 7919 + 13) % 600);
    ((float *)dlp->data)[i] = 1.0f / (float)(1 + i % 7);
  }
  rx_forward_opts o = {1, 0, 0, 0};
  rx_model_zero_grad(m);
  CHECK_OK(rx_model_logprobs(m, tok, NULL, lp, ent, &o));
  CHECK_OK(rx_model_backward(m, dlp));
  int64_t n = 0;
  memcpy(out + n, lp->data, sizeof(float) * B * T);
  n += B * T;
  memcpy(out + n, ent->data, sizeof(float) * B * T);
  n += B * T;
  for (int64_t i = 0; i < rx_model_param_count(m); i++) {
    const rx_tensor *g = rx_model_grad(m, i);
    memcpy(out + n, g->data, sizeof(float) * (size_t)g->numel);
    n += g->numel;
  }
  rx_tensor_free(tok);
  rx_tensor_free(lp);
  rx_tensor_free(ent);
  rx_tensor_free(dlp);
  return n;
}

/* The same bits at 1 and 2 threads: log-probabilities, entropies, every gradient, in f32 and in
 * bf16 (oneDNN's GEMMs where it runs, else sgemm on widened weights). (Where OpenBLAS runs one
 * thread whatever it is asked, a machine of one core, this cannot fail.) */
static void check_training_same_bits(int32_t dtype) {
  CHECK_OK(rx_set_option("threads_adapt", "off"));
  const int max_threads = omp_get_max_threads();
  rx_model *m = wide_model(dtype);
  if (!m) return;
  int64_t n = 2 * 2 * 250;
  for (int64_t i = 0; i < rx_model_param_count(m); i++) n += rx_model_param(m, i)->numel;
  float *one = calloc((size_t)n, sizeof(float)), *two = calloc((size_t)n, sizeof(float));
  if (one && two && forward_backward(m, 1, one) == n && forward_backward(m, 2, two) == n) {
    int64_t differ = 0, first = -1;
    for (int64_t i = 0; i < n; i++)
      if (memcmp(one + i, two + i, sizeof(float)) != 0) differ++, first = first < 0 ? i : first;
    CHECK(differ == 0, "%s: %lld of %lld values differ between 1 and 2 threads (the first at %lld: log-probabilities "
          "and entropies are the first 1000, then the gradients)", rx_dtype_name(dtype), (long long)differ, (long long)n,
          (long long)first);
  }
  free(one);
  free(two);
  rx_model_free(m);
  omp_set_num_threads(max_threads);
  CHECK_OK(rx_set_option("threads_adapt", "on"));
}

static void training_same_bits_any_thread_count(void) {
  if (!rx_blas_same_bits()) {   /* the AVX2 kernel sets: measured to differ, and said so (docs/reliability.md) */
    printf("  (OpenBLAS's %s kernels: f32 GEMMs follow the thread count there; not checked)\n", rx_blas_core());
    return;
  }
  check_training_same_bits(RX_F32);
  check_training_same_bits(RX_BF16);
}

/* The gradient norm's sum of squares (clipping and the grad_norm metric): the same bits at 1, 2
 * and 3 threads over a vector longer than one chunk of the sum. */
static void grad_norm_same_bits_any_thread_count(void) {
  const int max_threads = omp_get_max_threads();
  int64_t shape[1] = {3000001};
  rx_tensor *g = NULL;
  CHECK_OK(rx_tensor_new(&g, RX_F32, RX_CPU, 1, shape));
  if (!g) return;
  CHECK_OK(rx_tensor_normal(g, 11, 0, 0.0, 1.0));
  double sums[3];
  for (int t = 1; t <= 3; t++) {
    omp_set_num_threads(t);
    const rx_tensor *gs[1] = {g};
    CHECK_OK(rx_grad_sum_squares(gs, 1, &sums[t - 1]));
  }
  CHECK(memcmp(&sums[0], &sums[1], sizeof(double)) == 0 && memcmp(&sums[0], &sums[2], sizeof(double)) == 0,
        "sum of squares at 1, 2, 3 threads: %.17g %.17g %.17g", sums[0], sums[1], sums[2]);
  rx_tensor_free(g);
  omp_set_num_threads(max_threads);
}

int main(void) {
  if (getenv("REMAX_THREADS_ADAPT")) unsetenv("REMAX_THREADS_ADAPT");
  RUN(decide_follows_others);
  RUN(decide_ignores_blips);
  RUN(adapt_sees_busy_process);
  RUN(option_off_restores);
  RUN(training_same_bits_any_thread_count);
  RUN(grad_norm_same_bits_any_thread_count);
  return check_summary("test_threads");
}
