/* test_generate.c: KV-cache generation against full forwards (the logits of every generated
 * position, left and right padded references, greedy chains), the sampler against the
 * distributions it should draw from (chi-square), determinism across batch order and thread
 * count, stop tokens and per-row budgets, and the request checks. */
#include "check.h"
#include <omp.h>

enum { VOCAB = 50, MAXPOS = 64 };

static rx_model_config tiny_config(int32_t dtype) {
  rx_model_config c = {0};
  c.vocab_size = VOCAB;
  c.hidden_size = 24;
  c.intermediate_size = 40;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;     /* GQA: two query heads per kv head */
  c.head_dim = 6;
  c.max_position_embeddings = MAXPOS;
  c.rms_norm_eps = 1e-6;
  c.rope_theta = 10000.0;
  c.tie_word_embeddings = 0;
  c.attention_bias = 1;
  c.dtype = dtype;
  c.device = RX_CPU;
  return c;
}

/* variant 0: Qwen2 (q/k/v bias); 1: Qwen3 (q/k norm, no bias, head_dim 8 != hidden / heads);
 * 2: Llama 3.1 RoPE scaling (every band of frequencies used within MAXPOS). */
static rx_model *tiny_model_variant(int32_t dtype, int variant) {
  rx_model_config c = tiny_config(dtype);
  if (variant == 1) { c.qk_norm = 1; c.attention_bias = 0; c.head_dim = 8; c.rope_theta = 1000000.0; }
  if (variant == 2) {
    c.attention_bias = 0;
    c.rope_scaling = RX_ROPE_LLAMA3;
    c.rope_factor = 8;
    c.rope_low_freq_factor = 1;
    c.rope_high_freq_factor = 4;
    c.rope_original_max_position_embeddings = 16;
  }
  rx_model *m = NULL;
  if (rx_model_new(&m, &c)) { fprintf(stderr, "%s\n", rx_last_error()); return NULL; }
  for (int64_t i = 0; i < rx_model_param_count(m); i++) {
    const char *name = rx_model_param_name(m, i);
    rx_tensor *p = rx_model_param(m, i);
    if (strstr(name, "norm.weight")) rx_tensor_uniform(p, 7, (uint64_t)i << 32, 0.5, 1.5);
    else rx_tensor_normal(p, 7, (uint64_t)i << 32, 0.0, 0.3);
  }
  return m;
}

static rx_model *tiny_model(int32_t dtype) { return tiny_model_variant(dtype, 0); }

/* A request over prompts given as arrays; the test owns every array. */
typedef struct {
  int64_t P, R, max_new;
  int32_t tokens[256];
  int64_t offsets[17];
  int64_t row_prompt[32];
  rx_sampling rows[32];
  int32_t stop[4];
  int64_t nstop;
  uint64_t seed;
} req_buf;

typedef struct {
  int32_t tokens[32 * 64];
  float logprobs[32 * 64];
  int32_t lengths[32], finish[32];
  rx_generate_result res;
} res_buf;

static void add_prompt(req_buf *q, const int32_t *ids, int64_t n) {
  int64_t at = q->offsets[q->P];
  memcpy(q->tokens + at, ids, sizeof(int32_t) * (size_t)n);
  q->offsets[++q->P] = at + n;
}

static void add_row(req_buf *q, int64_t prompt, double temperature, int32_t top_k, double top_p, int32_t max_new, uint64_t key) {
  q->row_prompt[q->R] = prompt;
  q->rows[q->R] = (rx_sampling){temperature, top_p, top_k, max_new, key, 0, 0};
  q->R++;
}

static rx_generate_request request(req_buf *q) {
  rx_generate_request r = {q->P, q->tokens, q->offsets, q->R, q->row_prompt, q->rows, q->stop, q->nstop, q->seed, q->max_new, 0};
  return r;
}

static void bind(res_buf *b) {
  memset(b, 0, sizeof *b);
  b->res.tokens = b->tokens;
  b->res.logprobs = b->logprobs;
  b->res.lengths = b->lengths;
  b->res.finish = b->finish;
}

/* A generator over the request, writing into out (bound here); NULL (a failed check) when it
 * does not begin. */
static rx_generator *begin(rx_model *m, req_buf *q, res_buf *out) {
  bind(out);
  rx_generate_request req = request(q);
  rx_generator *g = NULL;
  CHECK_OK(rx_generate_begin(&g, m, &req, &out->res));
  return g;
}

/* The whole request in one call, into out (bound here). */
static void generate(rx_model *m, req_buf *q, res_buf *out) {
  bind(out);
  rx_generate_request req = request(q);
  CHECK_OK(rx_model_generate(m, &req, &out->res));
}

/* Sequences (prompt + generated so far) of every row as an i32 [R, T] batch, padded on the left
 * or the right. */
static void pack(const req_buf *q, const res_buf *b, int left, int32_t *tok, int32_t *mask, int64_t T) {
  memset(tok, 0, sizeof(int32_t) * (size_t)(q->R * T));
  memset(mask, 0, sizeof(int32_t) * (size_t)(q->R * T));
  for (int64_t r = 0; r < q->R; r++) {
    int64_t p = q->row_prompt[r], a = q->offsets[p], n = q->offsets[p + 1] - a, len = n + b->lengths[r];
    int64_t off = left ? T - len : 0;
    for (int64_t t = 0; t < len; t++) {
      tok[r * T + off + t] = t < n ? q->tokens[a + t] : b->tokens[r * q->max_new + t - n];
      mask[r * T + off + t] = 1;
    }
  }
}

static double read(const rx_tensor *t, int64_t i) {
  return t->dtype == RX_F64 ? ((const double *)t->data)[i] : ((const float *)t->data)[i];
}

static double log_softmax_at(const rx_tensor *t, int64_t row, int64_t V, int64_t tok) {
  double mx = -INFINITY, s = 0;
  for (int64_t i = 0; i < V; i++) mx = fmax(mx, read(t, row * V + i));
  for (int64_t i = 0; i < V; i++) s += exp(read(t, row * V + i) - mx);
  return read(t, row * V + tok) - mx - log(s);
}

static int64_t argmax_row(const rx_tensor *t, int64_t row, int64_t V) {
  int64_t best = 0;
  for (int64_t i = 1; i < V; i++)
    if (read(t, row * V + i) > read(t, row * V + best)) best = i;
  return best;
}

/* Reference of the repetition penalty (CTRL, as Hugging Face and vLLM): a token that occurs in
 * seen has its logit divided by the penalty when positive, multiplied by it otherwise. */
static void reference_penalty(float *out, const float *x, int V, float penalty, const int32_t *seen, int n) {
  for (int i = 0; i < V; i++) {
    int in_seen = 0;
    for (int j = 0; j < n; j++) in_seen |= seen[j] == i;
    out[i] = !in_seen ? x[i] : x[i] > 0 ? x[i] / penalty : x[i] * penalty;
  }
}

/* Whether greedy row r of b is the argmax chain of full forwards without cache, computed here
 * from its prompt alone; with a repetition penalty (0 = none), the argmax of the logits after
 * reference_penalty over the prompt and the chain so far. */
static int greedy_is_argmax_chain(rx_model *m, int32_t dtype, const req_buf *q, const res_buf *b, int64_t r, float penalty) {
  const int64_t p = q->row_prompt[r], a = q->offsets[p], n = q->offsets[p + 1] - a, T = n + q->max_new;
  int32_t seq[64];
  memcpy(seq, q->tokens + a, sizeof(int32_t) * (size_t)n);
  int64_t s1[2] = {1, T}, s1o[2] = {1, VOCAB};
  rx_tensor *t1 = NULL, *m1 = NULL, *o1 = NULL;
  rx_tensor_new(&t1, RX_I32, RX_CPU, 2, s1);
  rx_tensor_new(&m1, RX_I32, RX_CPU, 2, s1);
  rx_tensor_new(&o1, dtype, RX_CPU, 2, s1o);
  int same = b->lengths[r] == q->max_new;
  for (int64_t k = 0; k < q->max_new; k++) {
    int32_t *tp = t1->data, *mp = m1->data;
    for (int64_t i = 0; i < T; i++) { tp[i] = i < n + k ? seq[i] : 0; mp[i] = i < n + k; }
    CHECK_OK(rx_model_next_logits(m, t1, m1, o1));
    if (penalty == 0) {
      seq[n + k] = (int32_t)argmax_row(o1, 0, VOCAB);
    } else {
      float x[VOCAB], pen[VOCAB];
      for (int i = 0; i < VOCAB; i++) x[i] = (float)read(o1, i);
      reference_penalty(pen, x, VOCAB, penalty, seq, (int)(n + k));
      int32_t best = 0;
      for (int i = 1; i < VOCAB; i++) best = pen[i] > pen[best] ? i : best;
      seq[n + k] = best;
    }
    if (b->tokens[r * q->max_new + k] != seq[n + k]) same = 0;
  }
  rx_tensor_free(t1);
  rx_tensor_free(m1);
  rx_tensor_free(o1);
  return same;
}

/* ------------------------------------------------------------------ cached = full forward */

/* A request over three prompts (5, 2 and 7 tokens) and no rows yet. */
static req_buf three_prompts(int64_t max_new, uint64_t seed) {
  static const int32_t a[] = {3, 17, 42, 8, 1}, b[] = {29, 4}, c[] = {11, 0, 33, 47, 5, 26, 19};
  req_buf q = {0};
  q.max_new = max_new;
  q.seed = seed;
  add_prompt(&q, a, 5);
  add_prompt(&q, b, 2);
  add_prompt(&q, c, 7);
  return q;
}

static void check_cached_equals_full(int32_t dtype, int variant) {
  const double tol_logit = dtype == RX_F64 ? 1e-9 : 1e-4;
  rx_model *m = tiny_model_variant(dtype, variant);
  CHECK(m != NULL, "model");
  if (!m) return;
  req_buf q = three_prompts(10, 1234);
  for (int64_t p = 0; p < 3; p++) {
    add_row(&q, p, 1.0, 0, 1.0, 10, 10 * p + 1);          /* sampled */
    add_row(&q, p, 1.3, 0, 0.9, 8, 10 * p + 2);           /* sampled, top-p, shorter */
    add_row(&q, p, 0.0, 0, 1.0, 10, 10 * p + 3);          /* greedy */
  }
  res_buf b;
  rx_generator *g = begin(m, &q, &b);
  if (!g) { rx_model_free(m); return; }
  const rx_model_config *c = rx_model_get_config(m);
  const int64_t KD = c->num_key_value_heads * c->head_dim, S = 7 + q.max_new;
  CHECK(b.res.cache_bytes == 2 * c->num_hidden_layers * q.R * S * KD * rx_dtype_size(dtype),
        "cache_bytes %lld", (long long)b.res.cache_bytes);

  const int64_t T = 7 + q.max_new, R = q.R, V = VOCAB;
  int64_t s2[2] = {R, T}, so[2] = {R, V};
  rx_tensor *tok = NULL, *mask = NULL, *ref_l = NULL, *ref_r = NULL;
  rx_tensor_new(&tok, RX_I32, RX_CPU, 2, s2);
  rx_tensor_new(&mask, RX_I32, RX_CPU, 2, s2);
  rx_tensor_new(&ref_l, dtype, RX_CPU, 2, so);
  rx_tensor_new(&ref_r, dtype, RX_CPU, 2, so);
  int32_t prev_len[32] = {0}, done = 0;
  double worst_logit = 0, worst_lp = 0;
  int checked = 0;
  for (int step = 0; step <= q.max_new && !done; step++) {
    if (step > 0) CHECK_OK(rx_generate_step(g, &done));
    /* the reference sees each row's sequence up to, not including, its newest token */
    for (int64_t r = 0; r < R; r++) b.lengths[r]--;
    pack(&q, &b, 1, tok->data, mask->data, T);
    CHECK_OK(rx_model_next_logits(m, tok, mask, ref_l));
    pack(&q, &b, 0, tok->data, mask->data, T);
    CHECK_OK(rx_model_next_logits(m, tok, mask, ref_r));
    for (int64_t r = 0; r < R; r++) b.lengths[r]++;
    const rx_tensor *cached = rx_generate_logits(g);
    for (int64_t r = 0; r < R; r++) {
      if (b.lengths[r] == prev_len[r]) continue;   /* finished earlier: no new token */
      CHECK(b.lengths[r] == prev_len[r] + 1, "row %lld grew by %d", (long long)r, b.lengths[r] - prev_len[r]);
      prev_len[r] = b.lengths[r];
      int32_t t = b.tokens[r * q.max_new + b.lengths[r] - 1];
      const int64_t slot = rx_generate_batch_index(g, r);
      CHECK(slot >= 0 && slot < cached->shape[0], "row %lld is in slot %lld of %lld", (long long)r, (long long)slot,
            (long long)cached->shape[0]);
      for (int64_t i = 0; i < V; i++) {
        double x = read(cached, slot * V + i);
        worst_logit = fmax(worst_logit, fmax(fabs(x - read(ref_l, r * V + i)), fabs(x - read(ref_r, r * V + i))));
      }
      double lp_l = log_softmax_at(ref_l, r, V, t), lp_r = log_softmax_at(ref_r, r, V, t);
      double got = b.logprobs[r * q.max_new + b.lengths[r] - 1];
      /* logprobs are stored as f32: allow its rounding on top of the compute tolerance */
      double tol_lp = (dtype == RX_F64 ? 1e-9 : 1e-4) + fabs(lp_l) * 6e-8;
      CHECK(fabs(got - lp_l) <= tol_lp && fabs(got - lp_r) <= tol_lp,
            "row %lld token %d: logprob %.10g, full forward %.10g (left pad) %.10g (right pad)", (long long)r, t, got, lp_l, lp_r);
      worst_lp = fmax(worst_lp, fabs(got - lp_l));
      checked++;
    }
  }
  CHECK(worst_logit <= tol_logit, "%s: cached logits differ from full forwards by %.3g", rx_dtype_name(dtype), worst_logit);
  CHECK(checked == 3 * (10 + 8 + 10), "checked %d tokens", checked);
  rx_generate_end(g);

  /* greedy rows equal the argmax chain of full forwards, computed here from the prompt alone */
  for (int64_t p = 0; p < 3; p++)
    CHECK(greedy_is_argmax_chain(m, dtype, &q, &b, 3 * p + 2, 0), "%s: greedy row of prompt %lld is not the argmax chain of full forwards",
          rx_dtype_name(dtype), (long long)p);
  /* every row stopped on its own budget (no stop ids), and greedy rows are deterministic */
  for (int64_t r = 0; r < R; r++)
    CHECK(b.finish[r] == RX_FINISH_LENGTH && b.lengths[r] == q.rows[r].max_new_tokens, "row %lld: finish %d length %d",
          (long long)r, b.finish[r], b.lengths[r]);
  rx_tensor_free(tok);
  rx_tensor_free(mask);
  rx_tensor_free(ref_l);
  rx_tensor_free(ref_r);
  rx_model_free(m);
}

static void test_cached_f64(void) { check_cached_equals_full(RX_F64, 0); }
static void test_cached_f32(void) { check_cached_equals_full(RX_F32, 0); }
static void test_cached_qwen3_f64(void) { check_cached_equals_full(RX_F64, 1); }
static void test_cached_qwen3_f32(void) { check_cached_equals_full(RX_F32, 1); }
static void test_cached_llama31_f64(void) { check_cached_equals_full(RX_F64, 2); }

/* ------------------------------------------------------------------ sampler */

/* Upper 0.9999 quantile of chi-square with df degrees of freedom (Wilson-Hilferty). The test
 * is deterministic (fixed seeds): the bound only has to be one a correct sampler clears. */
static double chi2_bound(int df) {
  double a = 2.0 / (9.0 * df), z = 3.72;
  return df * pow(1 - a + z * sqrt(a), 3);
}

/* Reference distribution: softmax(logits / T) restricted to the top k, then to the smallest
 * most-likely prefix with mass >= top_p (full sort), then to the tokens at least min_p times as
 * likely as the most likely one, renormalised. Returns the kept count; *margin: how close the
 * case is to a top-p or min-p boundary. */
static int reference_probs(const float *logits, int V, double T, int top_k, double top_p, double min_p, double *p,
                           double *margin) {
  int order[256];
  for (int i = 0; i < V; i++) order[i] = i;
  for (int i = 0; i < V; i++)      /* selection sort by logit, descending: plain and obvious */
    for (int j = i + 1; j < V; j++)
      if (logits[order[j]] > logits[order[i]]) { int t = order[i]; order[i] = order[j]; order[j] = t; }
  int k = top_k > 0 && top_k < V ? top_k : V;
  double mx = logits[order[0]], z = 0;
  for (int i = 0; i < V; i++) p[i] = 0;
  for (int i = 0; i < k; i++) z += exp((logits[order[i]] - mx) / T);
  double cum = 0;
  int keep = 0;
  *margin = 1;
  while (keep < k) {
    double pi = exp((logits[order[keep]] - mx) / T) / z;
    cum += pi;
    keep++;
    if (cum >= top_p) break;
  }
  if (top_p < 1) *margin = fmin(fabs(cum - top_p), fabs(cum - exp((logits[order[keep - 1]] - mx) / T) / z - top_p));
  if (min_p > 0) {   /* a prefix again: the tokens whose ratio to the top one is >= min_p */
    int k2 = 0;
    while (k2 < keep && exp((logits[order[k2]] - mx) / T) >= min_p) k2++;
    for (int i = 0; i < keep; i++) *margin = fmin(*margin, fabs(exp((logits[order[i]] - mx) / T) - min_p));
    keep = k2;
  }
  double kept = 0;
  for (int i = 0; i < keep; i++) kept += exp((logits[order[i]] - mx) / T);
  for (int i = 0; i < keep; i++) p[order[i]] = exp((logits[order[i]] - mx) / T) / kept;
  return keep;
}

/* The sampler's draws over N uniforms against the reference distribution of the logits after
 * the repetition penalty (over seen) with the other settings. */
static void check_distribution_all(const float *raw, int V, double T, int top_k, double top_p, double min_p,
                                   double penalty, const int32_t *seen, int nseen, uint64_t key) {
  enum { N = 20000 };
  double p[256], margin;
  float logits[256];
  reference_penalty(logits, raw, V, penalty == 0 ? 1.0f : (float)penalty, seen, nseen);
  int kept = reference_probs(logits, V, T, top_k, top_p, min_p, p, &margin);
  CHECK(margin > 1e-4, "test case too close to a top-p or min-p boundary (%.3g)", margin);
  int64_t count[256] = {0};
  for (int64_t i = 0; i < N; i++) {
    int32_t tok = -1;
    const rx_sampling s = {T, top_p, top_k, 1, 0, min_p, penalty};
    CHECK_OK(rx_sample_token(raw, V, &s, seen, nseen, rx_sample_uniform(99, key, i), &tok));
    if (tok < 0 || tok >= V) { CHECK(0, "token %d outside [0, %d)", tok, V); return; }
    count[tok]++;
  }
  double chi2 = 0;
  int outside = 0, missing = 0;
  for (int i = 0; i < V; i++) {
    if (p[i] == 0) { outside += count[i] > 0; continue; }
    missing += count[i] == 0;
    double e = N * p[i];
    chi2 += (count[i] - e) * (count[i] - e) / e;
  }
  CHECK(outside == 0, "T=%g top_k=%d top_p=%g min_p=%g penalty=%g: %d tokens outside the kept set were drawn", T,
        top_k, top_p, min_p, penalty, outside);
  CHECK(missing == 0, "T=%g top_k=%d top_p=%g min_p=%g penalty=%g: %d kept tokens never drawn", T, top_k, top_p, min_p,
        penalty, missing);
  if (kept > 1)
    CHECK(chi2 <= chi2_bound(kept - 1), "T=%g top_k=%d top_p=%g min_p=%g penalty=%g: chi-square %.1f > %.1f (df %d)", T,
          top_k, top_p, min_p, penalty, chi2, chi2_bound(kept - 1), kept - 1);
  else
    CHECK(count[argmax_row(&(rx_tensor){.data = (void *)logits, .dtype = RX_F32}, 0, V)] == N, "single kept token");
}

static void check_distribution(const float *logits, int V, double T, int top_k, double top_p, uint64_t key) {
  check_distribution_all(logits, V, T, top_k, top_p, 0.0, 1.0, NULL, 0, key);
}

static void test_sampler_distributions(void) {
  /* a small vocabulary with a known spread of logits */
  const float small[8] = {1.5f, -0.3f, 0.9f, 2.2f, -1.7f, 0.1f, 1.1f, -0.8f};
  check_distribution(small, 8, 1.0, 0, 1.0, 1);
  check_distribution(small, 8, 0.7, 0, 1.0, 2);
  check_distribution(small, 8, 1.0, 3, 1.0, 3);
  check_distribution(small, 8, 1.0, 0, 0.8, 4);
  check_distribution(small, 8, 0.7, 4, 0.85, 5);
  check_distribution(small, 8, 2.5, 6, 0.97, 6);
  /* 50 random logits: top-k and top-p sets checked token by token against a full sort */
  float big[VOCAB];
  for (int i = 0; i < VOCAB; i++) big[i] = (float)(2.0 * sin(12.9898 * i + 1.0) + 0.5 * cos(3.7 * i));
  check_distribution(big, VOCAB, 1.0, 10, 1.0, 7);
  check_distribution(big, VOCAB, 1.0, 0, 0.5, 8);
  check_distribution(big, VOCAB, 0.7, 0, 0.9, 9);
  check_distribution(big, VOCAB, 1.0, 20, 0.75, 10);
}

/* min-p and the repetition penalty, alone and with the other settings, against the reference
 * (penalty on the raw logits, then temperature, top-k, top-p, min-p); seen holds a token with a
 * positive logit, one with a negative logit, a repeat and the top token. */
static void test_sampler_min_p_and_penalty(void) {
  const float small[8] = {1.5f, -0.3f, 0.9f, 2.2f, -1.7f, 0.1f, 1.1f, -0.8f};
  const int32_t seen[5] = {3, 4, 3, 6, 1};
  check_distribution_all(small, 8, 1.0, 0, 1.0, 0.1, 1.0, NULL, 0, 11);
  check_distribution_all(small, 8, 0.7, 0, 1.0, 0.3, 1.0, NULL, 0, 12);
  check_distribution_all(small, 8, 1.0, 0, 1.0, 0.0, 1.8, seen, 5, 13);
  check_distribution_all(small, 8, 1.0, 0, 1.0, 0.0, 0.6, seen, 5, 14);   /* < 1 favours repeats */
  check_distribution_all(small, 8, 1.0, 5, 0.9, 0.2, 1.5, seen, 5, 15);
  check_distribution_all(small, 8, 1.3, 0, 0.8, 0.25, 2.0, seen, 5, 16);
  float big[VOCAB];
  int32_t many[20];
  for (int i = 0; i < VOCAB; i++) big[i] = (float)(2.0 * sin(12.9898 * i + 1.0) + 0.5 * cos(3.7 * i));
  for (int j = 0; j < 20; j++) many[j] = (j * 7) % VOCAB;
  check_distribution_all(big, VOCAB, 1.0, 0, 1.0, 0.05, 1.3, many, 20, 17);
  check_distribution_all(big, VOCAB, 0.8, 25, 0.95, 0.02, 1.2, many, 20, 18);

  /* greedy rows see the penalty: the top token (3) once repeated gives way to the next (0) */
  int32_t tok = -1;
  CHECK_OK(rx_sample_token(small, 8, &(rx_sampling){0.0, 1.0, 0, 1, 0, 0.0, 2.0}, seen, 1, 0.5, &tok));
  CHECK(tok == 0, "greedy with the top token penalised picked %d", tok);
  CHECK_OK(rx_sample_token(small, 8, &(rx_sampling){0.0, 1.0, 0, 1, 0, 0.0, 1.0}, seen, 1, 0.5, &tok));
  CHECK(tok == 3, "greedy without a penalty picked %d", tok);
  /* min_p = 1 keeps only the most likely token */
  for (int i = 0; i < 50; i++) {
    CHECK_OK(rx_sample_token(small, 8, &(rx_sampling){1.0, 1.0, 0, 1, 0, 1.0, 0.0}, NULL, 0, rx_sample_uniform(3, 3, i), &tok));
    CHECK(tok == 3, "min_p 1 drew %d", tok);
  }
  CHECK_FAILS(rx_sample_token(small, 8, &(rx_sampling){1.0, 1.0, 0, 1, 0, 1.5, 1.0}, NULL, 0, 0.5, &tok), "min_p = 1.5");
  CHECK_FAILS(rx_sample_token(small, 8, &(rx_sampling){1.0, 1.0, 0, 1, 0, -0.1, 1.0}, NULL, 0, 0.5, &tok), "min_p = -0.1");
  CHECK_FAILS(rx_sample_token(small, 8, &(rx_sampling){1.0, 1.0, 0, 1, 0, 0.0, -1.0}, NULL, 0, 0.5, &tok),
              "repetition_penalty = -1");
  CHECK_FAILS(rx_sample_token(small, 8, &(rx_sampling){1.0, 1.0, 0, 1, 0, 0.0, INFINITY}, NULL, 0, 0.5, &tok),
              "repetition_penalty = inf");
}

/* Generation with min-p and repetition penalties: every token a row gets is what the sampler
 * (checked above against the reference) draws from the logits that chose it, with the row's
 * prompt and completion so far as its seen tokens; and a greedy row with a penalty is the
 * argmax chain of penalised full forwards. */
static void test_generate_min_p_and_penalty(void) {
  rx_model *m = tiny_model(RX_F32);
  CHECK(m != NULL, "model");
  if (!m) return;
  req_buf q = three_prompts(12, 4321);
  static const rx_sampling kinds[4] = {
    {1.0, 1.0, 0, 12, 0, 0.05, 1.3}, {0.8, 0.9, 10, 9, 0, 0.1, 1.6}, {0.0, 1.0, 0, 12, 0, 0.0, 1.5},
    {1.2, 1.0, 0, 12, 0, 0.0, 0.7}};
  for (int64_t p = 0; p < 3; p++)
    for (int k = 0; k < 4; k++) {
      q.row_prompt[q.R] = p;
      q.rows[q.R] = kinds[k];
      q.rows[q.R].key = 100 * p + k;
      q.R++;
    }
  res_buf b;
  rx_generator *g = begin(m, &q, &b);
  if (!g) { rx_model_free(m); return; }
  int32_t prev_len[32] = {0}, done = 0;
  int checked = 0, repeats_penalised = 0;
  for (int step = 0; step <= q.max_new && !done; step++) {
    if (step > 0) CHECK_OK(rx_generate_step(g, &done));
    const rx_tensor *cached = rx_generate_logits(g);
    for (int64_t r = 0; r < q.R; r++) {
      if (b.lengths[r] == prev_len[r]) continue;
      prev_len[r] = b.lengths[r];
      const int64_t p = q.row_prompt[r], a = q.offsets[p], n = q.offsets[p + 1] - a, k = b.lengths[r] - 1;
      int32_t seen[64];
      memcpy(seen, q.tokens + a, sizeof(int32_t) * (size_t)n);
      memcpy(seen + n, b.tokens + r * q.max_new, sizeof(int32_t) * (size_t)k);
      const float *x = (const float *)cached->data + rx_generate_batch_index(g, r) * VOCAB;
      int32_t want = -1;
      CHECK_OK(rx_sample_token(x, VOCAB, &q.rows[r], seen, n + k, rx_sample_uniform(q.seed, q.rows[r].key, n + k), &want));
      const int32_t got = b.tokens[r * q.max_new + k];
      CHECK(got == want, "row %lld token %lld: %d generated, the sampler on its logits and tokens so far says %d",
            (long long)r, (long long)k, got, want);
      /* the raw log-probability, not the penalised one */
      double mx = -INFINITY, z = 0;
      for (int i = 0; i < VOCAB; i++) mx = fmax(mx, x[i]);
      for (int i = 0; i < VOCAB; i++) z += exp(x[i] - mx);
      CHECK(fabs(b.logprobs[r * q.max_new + k] - (x[got] - mx - log(z))) < 1e-5, "row %lld: log p %g of the raw logits",
            (long long)r, b.logprobs[r * q.max_new + k]);
      for (int64_t j = 0; j < n + k; j++) repeats_penalised += seen[j] == got;
      checked++;
    }
  }
  rx_generate_end(g);
  CHECK(checked == 3 * (12 + 9 + 12 + 12), "checked %d tokens", checked);
  printf("  min-p and penalties: %d tokens, %d of them repeat a token seen before\n", checked, repeats_penalised);

  /* the greedy row of each prompt against the argmax chain of penalised full forwards */
  for (int64_t p = 0; p < 3; p++)
    CHECK(greedy_is_argmax_chain(m, RX_F32, &q, &b, 4 * p + 2, 1.5f),
          "greedy row of prompt %lld with repetition_penalty 1.5 is not the argmax chain of penalised full forwards", (long long)p);
  rx_model_free(m);
}

static void test_sampler_edges(void) {
  const float x[5] = {0.5f, 2.0f, 2.0f, -1.0f, 1.0f};
  int32_t tok = -1;
  /* greedy (temperature 0, or top_k 1): the lowest id among the maxima */
  CHECK_OK(rx_sample_token(x, 5, &(rx_sampling){0.0, 1.0, 0, 1, 0, 0, 0}, NULL, 0, 0.99, &tok));
  CHECK(tok == 1, "greedy picked %d", tok);
  CHECK_OK(rx_sample_token(x, 5, &(rx_sampling){1.0, 1.0, 1, 1, 0, 0, 0}, NULL, 0, 0.99, &tok));
  CHECK(tok == 1, "top_k 1 picked %d", tok);
  /* top_k 2 with a tie at the boundary keeps exactly two tokens (the tied maxima) */
  const float y[5] = {1.0f, 3.0f, 1.0f, 1.0f, 0.0f};
  int seen[5] = {0};
  for (int i = 0; i < 2000; i++) {
    CHECK_OK(rx_sample_token(y, 5, &(rx_sampling){1.0, 1.0, 2, 1, 0, 0, 0}, NULL, 0, rx_sample_uniform(5, 5, i), &tok));
    seen[tok]++;
  }
  CHECK(seen[1] > 0 && seen[0] > 0 && seen[2] == 0 && seen[3] == 0 && seen[4] == 0,
        "top_k 2 with ties drew %d %d %d %d %d", seen[0], seen[1], seen[2], seen[3], seen[4]);
  /* u spreads over [0, 1) and depends on every part of its key */
  double sum = 0;
  for (int i = 0; i < 10000; i++) {
    double u = rx_sample_uniform(1, 2, i);
    CHECK(u >= 0 && u < 1, "u = %g", u);
    sum += u;
  }
  CHECK(fabs(sum / 10000 - 0.5) < 0.01, "mean of u %g", sum / 10000);
  CHECK(rx_sample_uniform(1, 2, 3) != rx_sample_uniform(2, 2, 3) && rx_sample_uniform(1, 2, 3) != rx_sample_uniform(1, 3, 3) &&
        rx_sample_uniform(1, 2, 3) != rx_sample_uniform(1, 2, 4), "u ignores part of its key");
  CHECK_FAILS(rx_sample_token(x, 5, &(rx_sampling){1.0, 1.0, 0, 1, 0, 0, 0}, NULL, 0, 1.0, &tok), "u = 1");
  CHECK_FAILS(rx_sample_token(x, 5, &(rx_sampling){1.0, 0.0, 0, 1, 0, 0, 0}, NULL, 0, 0.5, &tok), "top_p = 0");
  CHECK_FAILS(rx_sample_token(x, 0, &(rx_sampling){1.0, 1.0, 0, 1, 0, 0, 0}, NULL, 0, 0.5, &tok), "vocab 0");
}

/* ------------------------------------------------------------------ determinism */

/* Three prompts, three rows each (two sampled, one greedy), keys fixed by (prompt, slot).
 * perm: prompt order; row_perm: row order. Results are stored by key. */
static void run_batch(rx_model *m, const int *perm, const int *row_perm, int32_t out_tokens[9][12], int32_t out_len[9]) {
  static const int32_t a[] = {3, 17, 42, 8, 1}, b[] = {29, 4}, c[] = {11, 0, 33, 47, 5, 26, 19};
  const int32_t *src[3] = {a, b, c};
  const int64_t len[3] = {5, 2, 7};
  req_buf q = {0};
  q.max_new = 12;
  q.seed = 77;
  for (int i = 0; i < 3; i++) add_prompt(&q, src[perm[i]], len[perm[i]]);
  int where[3];
  for (int i = 0; i < 3; i++) where[perm[i]] = i;
  for (int i = 0; i < 9; i++) {
    int key = row_perm[i], p = key / 3, slot = key % 3;
    add_row(&q, where[p], slot == 2 ? 0.0 : 1.2, slot == 1 ? 8 : 0, slot == 1 ? 0.9 : 1.0, 12, 1000 + (uint64_t)key);
  }
  res_buf r;
  generate(m, &q, &r);
  for (int i = 0; i < 9; i++) {
    int key = row_perm[i];
    out_len[key] = r.lengths[i];
    memcpy(out_tokens[key], r.tokens + i * 12, sizeof(int32_t) * 12);
  }
}

static void test_same_seed_same_tokens(void) {
  rx_model *m = tiny_model(RX_F32);
  if (!m) return;
  const int id3[3] = {0, 1, 2}, rev3[3] = {2, 0, 1};
  const int id9[9] = {0, 1, 2, 3, 4, 5, 6, 7, 8}, shuf9[9] = {7, 2, 5, 0, 8, 3, 1, 6, 4};
  int32_t base[9][12], other[9][12], bl[9], ol[9];
  int max_threads = omp_get_max_threads();
  omp_set_num_threads(2);
  run_batch(m, id3, id9, base, bl);
  run_batch(m, rev3, shuf9, other, ol);
  CHECK(memcmp(base, other, sizeof base) == 0 && memcmp(bl, ol, sizeof bl) == 0, "tokens depend on batch order");
  omp_set_num_threads(1);
  run_batch(m, id3, id9, other, ol);
  CHECK(memcmp(base, other, sizeof base) == 0 && memcmp(bl, ol, sizeof bl) == 0, "tokens depend on the thread count");
  omp_set_num_threads(max_threads);
  /* sampled rows of one prompt differ from each other (different keys) */
  CHECK(memcmp(base[0], base[1], sizeof base[0]) != 0, "two sampled rows with different keys drew the same tokens");
  rx_model_free(m);
}

/* Rows that finish leave the batch (their slots go to the rows still decoding): the rows that go
 * on produce the same tokens and log-probabilities, bit for bit, as in a batch without the short
 * rows, and the short rows the same as in a batch of their own. */
static void test_finished_rows_leave_the_batch(void) {
  rx_model *m = tiny_model(RX_F32);
  if (!m) return;
  req_buf mixed = three_prompts(12, 99), longs = three_prompts(12, 99), shorts = three_prompts(12, 99);
  /* budgets 1..5 for the short rows, interleaved with the long ones so slots must move */
  int is_long[8] = {0, 1, 0, 0, 1, 0, 1, 0}, budget[8] = {3, 12, 1, 5, 12, 2, 12, 4};
  for (int i = 0; i < 8; i++) {
    add_row(&mixed, i % 3, 1.0, 0, 1.0, budget[i], 100 + (uint64_t)i);
    add_row(is_long[i] ? &longs : &shorts, i % 3, 1.0, 0, 1.0, budget[i], 100 + (uint64_t)i);
  }
  res_buf a, b, c;
  /* the mixed batch step by step: each step computes exactly the rows that had not finished */
  rx_generator *g = begin(m, &mixed, &a);
  for (int32_t done = 0; g && !done;) {
    int64_t decoding = 0;
    for (int i = 0; i < 8; i++) decoding += a.lengths[i] < budget[i];
    CHECK_OK(rx_generate_step(g, &done));
    if (decoding > 0)
      CHECK(rx_generate_logits(g)->shape[0] == decoding, "a step computed %lld rows, %lld were still decoding",
            (long long)rx_generate_logits(g)->shape[0], (long long)decoding);
  }
  rx_generate_end(g);
  generate(m, &longs, &b);
  generate(m, &shorts, &c);
  int nl = 0, ns = 0;
  for (int i = 0; i < 8; i++) {
    res_buf *o = is_long[i] ? &b : &c;
    int j = is_long[i] ? nl++ : ns++;
    CHECK(a.lengths[i] == budget[i] && o->lengths[j] == budget[i], "row %d: %d and %d tokens, budget %d", i, a.lengths[i],
          o->lengths[j], budget[i]);
    CHECK(memcmp(a.tokens + i * 12, o->tokens + j * 12, sizeof(int32_t) * (size_t)budget[i]) == 0,
          "row %d: tokens differ with the other rows in the batch", i);
    CHECK(memcmp(a.logprobs + i * 12, o->logprobs + j * 12, sizeof(float) * (size_t)budget[i]) == 0,
          "row %d: log-probabilities differ with the other rows in the batch", i);
  }
  CHECK(a.res.decode_steps == 11, "decode steps %lld, expected 11", (long long)a.res.decode_steps);
  rx_model_free(m);
}

/* Batch invariance (docs/generation.md, "Randomness"): a prompt's rows (a greedy one and two
 * sampled ones) get the same first logits, tokens and log-probabilities, bit for bit, in a
 * request of their own and beside other prompts, shorter and longer (so it is left-padded in
 * the cache), with enough rows that a decode step computes more than 48 at once; at 2 threads
 * and at 1, and alone at 1 against beside at 2 where the GEMMs allow (rx_blas_same_bits). dtype: the model's compute dtype; bf16_weights: its matrices stored in bf16 (the
 * bf16 matmul kernels). */
enum { INV_NEW = 16, INV_ROWS = 63 };
static void invariance_run(rx_model *m, int beside, float *first, int32_t *tokens, float *logprobs) {
  static const int32_t x[9] = {3, 17, 42, 8, 1, 29, 4, 11, 0};
  int32_t ptok[9 + 3 + 30 + 17];
  int64_t off[5] = {0}, P = 0, R = 0, row_prompt[INV_ROWS];
  rx_sampling rows[INV_ROWS];
  const int64_t len[4] = {3, 9, 30, 17};   /* beside: the prompt is the second of four */
  for (int64_t p = 0; p < (beside ? 4 : 1); p++) {
    const int64_t n = beside ? len[p] : 9;
    for (int64_t t = 0; t < n; t++)
      ptok[off[P] + t] = (beside && p != 1) ? (int32_t)((t * 13 + p * 7 + 5) % VOCAB) : x[t];
    off[P + 1] = off[P] + n;
    P++;
  }
  const int64_t mine = beside ? 1 : 0;
  for (int k = 0; k < 3; k++) {   /* the prompt's rows: greedy, then two sampled (keys 1, 2) */
    row_prompt[R] = mine;
    rows[R++] = (rx_sampling){k == 0 ? 0.0 : 1.0, 1.0, 0, INV_NEW, (uint64_t)k, 0, 0};
  }
  for (int64_t r = 0; beside && r < INV_ROWS - 3; r++) {
    row_prompt[R] = r % 4 == 1 ? 0 : r % 4;
    rows[R++] = (rx_sampling){r % 3 == 0 ? 0.0 : 0.8, 0.95, 0, (int32_t)(4 + r % (INV_NEW - 3)), 100 + (uint64_t)r, 0, 0};
  }
  rx_generate_request req = {P, ptok, off, R, row_prompt, rows, NULL, 0, 5, INV_NEW, 0};
  int32_t toks[INV_ROWS * INV_NEW] = {0}, lens[INV_ROWS], fin[INV_ROWS];
  float lps[INV_ROWS * INV_NEW] = {0};
  rx_generate_result res = {toks, lps, lens, fin, 0, 0};
  rx_generator *g = NULL;
  CHECK_OK(rx_generate_begin(&g, m, &req, &res));
  if (!g) return;
  const rx_tensor *lg = rx_generate_logits(g);
  for (int k = 0; k < 3; k++)
    for (int64_t v = 0; v < VOCAB; v++) {
      double d = 0;
      rx_tensor_get(lg, rx_generate_batch_index(g, k) * VOCAB + v, &d);
      first[k * VOCAB + v] = (float)d;
    }
  for (int32_t done = 0; !done;) {
    const int rc = rx_generate_step(g, &done);
    CHECK_OK(rc);
    if (rc) break;
  }
  rx_generate_end(g);
  memcpy(tokens, toks, sizeof(int32_t) * 3 * INV_NEW);
  memcpy(logprobs, lps, sizeof(float) * 3 * INV_NEW);
}

static void check_batch_invariance(int32_t dtype, int bf16_weights) {
  rx_model_config c = tiny_config(dtype);
  c.hidden_size = 96;          /* wide enough for the GEMMs' kernels to depend on the batch's shape */
  c.intermediate_size = 160;
  c.head_dim = 24;
  if (bf16_weights) c.weight_dtype = RX_BF16;
  rx_model *m = NULL;
  CHECK_OK(rx_model_new(&m, &c));
  if (!m) return;
  for (int64_t i = 0; i < rx_model_param_count(m); i++) {
    rx_tensor *p = rx_model_param(m, i);
    if (strstr(rx_model_param_name(m, i), "norm.weight")) rx_tensor_uniform(p, 9, (uint64_t)i << 32, 0.5, 1.5);
    else rx_tensor_normal(p, 9, (uint64_t)i << 32, 0.0, 0.2);
  }
  const int max_threads = omp_get_max_threads();
  float first[2][3 * VOCAB];
  int32_t tok[2][3 * INV_NEW];
  float lp[2][3 * INV_NEW];
  const char *what = bf16_weights ? "bf16 weights" : rx_dtype_name(dtype);
  /* alone at 1 thread, beside others at 2 first, where the GEMMs give the same bits for any
   * thread count (rx_blas_same_bits); then both at 2 threads, and both at 1 */
  for (int threads = rx_blas_same_bits() ? 3 : 2; threads >= 1; threads--) {
    omp_set_num_threads(threads == 3 ? 1 : threads);
    invariance_run(m, 0, first[0], tok[0], lp[0]);
    if (threads == 3) omp_set_num_threads(2);
    invariance_run(m, 1, first[1], tok[1], lp[1]);
    int64_t nf = 0, nl = 0;
    for (int64_t i = 0; i < 3 * VOCAB; i++) nf += memcmp(&first[0][i], &first[1][i], sizeof(float)) != 0;
    for (int64_t i = 0; i < 3 * INV_NEW; i++) nl += memcmp(&lp[0][i], &lp[1][i], sizeof(float)) != 0;
    const char *how = threads == 3 ? "alone at 1 thread, beside at 2" : threads == 2 ? "2 threads" : "1 thread";
    CHECK(nf == 0, "%s, %s: %lld of the prompt's first logits differ beside other prompts", what, how, (long long)nf);
    for (int k = 0; k < 3; k++)
      CHECK(memcmp(tok[0] + k * INV_NEW, tok[1] + k * INV_NEW, sizeof(int32_t) * INV_NEW) == 0,
            "%s, %s: the prompt's %s row draws other tokens beside other prompts", what, how,
            k == 0 ? "greedy" : "sampled");
    CHECK(nl == 0, "%s, %s: %lld of the rows' log-probabilities differ beside other prompts", what, how, (long long)nl);
  }
  omp_set_num_threads(max_threads);
  rx_model_free(m);
}

static void test_batch_invariance_f32(void) { check_batch_invariance(RX_F32, 0); }
static void test_batch_invariance_f64(void) { check_batch_invariance(RX_F64, 0); }
static void test_batch_invariance_bf16_weights(void) { check_batch_invariance(RX_F32, 1); }
static void test_batch_invariance_bf16(void) { check_batch_invariance(RX_BF16, 0); }

/* Fewer rows than prompts (a prompt with no row is prefilled for nothing, but must not upset
 * the others): the rows equal those of a request holding only their prompt. */
static void test_prompts_without_rows(void) {
  rx_model *m = tiny_model(RX_F64);
  if (!m) return;
  req_buf all = three_prompts(6, 0), one = {0};
  one.max_new = 6;
  add_row(&all, 2, 0.0, 0, 1.0, 6, 1);
  add_row(&all, 2, 1.0, 0, 1.0, 6, 2);
  add_prompt(&one, all.tokens + all.offsets[2], all.offsets[3] - all.offsets[2]);
  add_row(&one, 0, 0.0, 0, 1.0, 6, 1);
  add_row(&one, 0, 1.0, 0, 1.0, 6, 2);
  res_buf a, b;
  generate(m, &all, &a);
  generate(m, &one, &b);
  CHECK(memcmp(a.tokens, b.tokens, sizeof(int32_t) * 12) == 0, "rows changed with unused prompts in the batch");
  for (int i = 0; i < 12; i++)
    CHECK(fabs(a.logprobs[i] - b.logprobs[i]) <= 1e-6 * fmax(1, fabs(b.logprobs[i])), "logprob %d: %g vs %g", i, a.logprobs[i], b.logprobs[i]);
  rx_model_free(m);
}

/* ------------------------------------------------------------------ stop tokens, budgets */

static void test_stop_tokens(void) {
  rx_model *m = tiny_model(RX_F32);
  if (!m) return;
  req_buf q = three_prompts(16, 5);
  const int32_t budget[6] = {16, 5, 16, 9, 16, 12};
  for (int i = 0; i < 6; i++) add_row(&q, i / 2, i == 4 ? 0.0 : 1.5, 0, 1.0, budget[i], 500 + (uint64_t)i);
  res_buf free_run, stopped;
  generate(m, &q, &free_run);
  for (int r = 0; r < 6; r++)
    CHECK(free_run.lengths[r] == budget[r] && free_run.finish[r] == RX_FINISH_LENGTH, "row %d: length %d (budget %d), finish %d", r,
          free_run.lengths[r], budget[r], free_run.finish[r]);
  /* stop on the token row 0 drew at its first new value from step 3 on */
  int32_t stop = -1;
  for (int k = 3; k < 16 && stop < 0; k++) {
    int seen = 0;
    for (int j = 0; j < k; j++) seen |= free_run.tokens[j] == free_run.tokens[k];
    if (!seen) stop = free_run.tokens[k];
  }
  CHECK(stop >= 0, "row 0 drew no fresh token");
  if (stop < 0) { rx_model_free(m); return; }
  q.stop[0] = stop;
  q.stop[1] = VOCAB - 1 == stop ? VOCAB - 2 : VOCAB - 1;   /* a second stop id */
  q.nstop = 2;
  generate(m, &q, &stopped);
  int some_ran_to_budget = 0;
  for (int r = 0; r < 6; r++) {
    int first = -1;   /* where the free run first drew a stop id */
    for (int k = 0; k < budget[r] && first < 0; k++)
      if (free_run.tokens[r * 16 + k] == q.stop[0] || free_run.tokens[r * 16 + k] == q.stop[1]) first = k;
    int want_len = first >= 0 ? first + 1 : budget[r];
    int want_finish = first >= 0 ? RX_FINISH_STOP : RX_FINISH_LENGTH;
    CHECK(stopped.lengths[r] == want_len && stopped.finish[r] == want_finish, "row %d: length %d finish %d, want %d %d", r,
          stopped.lengths[r], stopped.finish[r], want_len, want_finish);
    CHECK(memcmp(stopped.tokens + r * 16, free_run.tokens + r * 16, sizeof(int32_t) * (size_t)want_len) == 0,
          "row %d: stopping changed the tokens before the stop", r);
    if (want_finish == RX_FINISH_STOP)
      CHECK(stopped.tokens[r * 16 + want_len - 1] == q.stop[0] || stopped.tokens[r * 16 + want_len - 1] == q.stop[1],
            "row %d does not end with its stop token", r);
    some_ran_to_budget |= want_finish == RX_FINISH_LENGTH;
  }
  CHECK(stopped.lengths[0] < 16 && stopped.finish[0] == RX_FINISH_STOP, "row 0 did not stop");
  CHECK(some_ran_to_budget, "no row ran to its budget: the test does not check that others continue");
  rx_model_free(m);
}

/* rx_generate_stop_row ends a row between steps as a stop token would: its tokens so far kept,
 * finish RX_FINISH_STOP, the other rows' tokens unchanged (the batch shrinks under them); a
 * finished row stays as it was; a row outside the request is refused. */
static void test_stop_row(void) {
  rx_model *m = tiny_model(RX_F32);
  if (!m) return;
  req_buf q = three_prompts(12, 8);
  for (int i = 0; i < 6; i++) add_row(&q, i / 2, i == 3 ? 0.0 : 1.2, 0, 1.0, i == 5 ? 4 : 12, 700 + (uint64_t)i);
  res_buf free_run, cut;
  generate(m, &q, &free_run);
  rx_generator *g = begin(m, &q, &cut);
  if (!g) { rx_model_free(m); return; }
  int32_t done = 0;
  for (int step = 1; !done; step++) {
    CHECK_OK(rx_generate_step(g, &done));
    if (step == 3) CHECK_OK(rx_generate_stop_row(g, 1));   /* after its 4th token */
    if (step == 6) {
      CHECK_OK(rx_generate_stop_row(g, 4));
      CHECK_OK(rx_generate_stop_row(g, 5));                /* finished at its budget already */
      CHECK_OK(rx_generate_stop_row(g, 1));                /* stopped already */
    }
  }
  CHECK_FAILS(rx_generate_stop_row(g, 6), "row 6 outside [0, 6)");
  rx_generate_end(g);
  const int32_t want_len[6] = {12, 4, 12, 12, 7, 4}, want_finish[6] = {0, 1, 0, 0, 1, 0};
  for (int r = 0; r < 6; r++) {
    CHECK(cut.lengths[r] == want_len[r] && cut.finish[r] == want_finish[r], "row %d: length %d finish %d, want %d %d", r,
          cut.lengths[r], cut.finish[r], want_len[r], want_finish[r]);
    CHECK(memcmp(cut.tokens + r * 12, free_run.tokens + r * 12, sizeof(int32_t) * (size_t)cut.lengths[r]) == 0,
          "row %d: stopping rows changed its tokens", r);
  }
  rx_model_free(m);
}


/* ------------------------------------------------------------------ continued rows (multi-turn) */

/* Episodes of several turns: rows end turns at their own steps (rx_generate_stop_row), get
 * observations of different lengths appended (rows ending a turn together continue in one
 * batch), and decode on. Every model token's log-probability must equal a full forward over the
 * whole episode (prompt, turns, observations), and greedy rows must be the argmax of it. A small
 * append_capacity forces repacks (holes dropped) and may cut episodes at their length. */
static int64_t continued_episodes(rx_model *m, int64_t capacity, req_buf *q, res_buf *b, int32_t seq[32][64],
                                  int32_t is_model[32][64], int64_t seq_len[32]) {
  bind(b);
  rx_generate_request req = request(q);
  req.append_capacity = capacity;
  rx_generator *g = NULL;
  CHECK_OK(rx_generate_begin(&g, m, &req, &b->res));
  if (!g) return 0;
  int32_t seen[32] = {0}, turns[32] = {0};
  int64_t continued = 0;
  for (int64_t r = 0; r < q->R; r++) {   /* each episode starts with its prompt */
    const int64_t p = q->row_prompt[r], a = q->offsets[p], n = q->offsets[p + 1] - a;
    for (int64_t t = 0; t < n; t++) seq[r][t] = q->tokens[a + t], is_model[r][t] = 0;
    seq_len[r] = n;
  }
  int32_t done = 0;
  for (int step = 0; step < 200; step++) {
    int64_t rows[32], offs[33] = {0}, n = 0;
    int32_t obs[32 * 8];
    for (int64_t r = 0; r < q->R; r++) {
      for (; seen[r] < b->lengths[r]; seen[r]++) {   /* the model's new tokens */
        seq[r][seq_len[r]] = b->tokens[r * q->max_new + seen[r]];
        is_model[r][seq_len[r]++] = 1;
      }
      const int turn_len = 2 + (int)(r % 3);
      const int ends = turns[r] < 3 && b->lengths[r] < q->rows[r].max_new_tokens && b->finish[r] != RX_FINISH_STOP &&
                       b->lengths[r] >= turn_len * (turns[r] + 1);
      if (ends) CHECK_OK(rx_generate_stop_row(g, r));
      if (ends) {   /* an observation of 1 to 4 tokens */
        const int k = 1 + (int)((r + turns[r]) % 4);
        for (int i = 0; i < k; i++) {
          obs[offs[n] + i] = (int32_t)((5 + 7 * r + 3 * turns[r] + i) % VOCAB);
          seq[r][seq_len[r]++] = obs[offs[n] + i];
          is_model[r][seq_len[r] - 1] = 0;
        }
        offs[n + 1] = offs[n] + k;
        rows[n++] = r;
        turns[r]++;
      }
    }
    if (n) {
      CHECK_OK(rx_generate_continue(g, n, rows, obs, offs));
      continued += n;
      done = 0;
      continue;   /* record the token each continued row picked before stepping */
    }
    if (done) break;
    CHECK_OK(rx_generate_step(g, &done));
  }
  CHECK_FAILS(rx_generate_continue(g, 1, (int64_t[]){0}, (int32_t[]){1}, (int64_t[]){0, 1}), "row 0 is not paused");
  rx_generate_end(g);
  return continued;
}

static void check_continued_equals_full(int32_t dtype, int variant, int64_t capacity) {
  rx_model *m = tiny_model_variant(dtype, variant);
  CHECK(m != NULL, "model");
  if (!m) return;
  req_buf q = three_prompts(12, 4321);
  for (int64_t p = 0; p < 3; p++) {
    add_row(&q, p, 1.0, 0, 1.0, 12, 10 * p + 1);
    add_row(&q, p, 0.0, 0, 1.0, 12, 10 * p + 2);   /* greedy */
  }
  res_buf b;
  static int32_t seq[32][64], is_model[32][64];
  int64_t seq_len[32] = {0};
  const int64_t continued = continued_episodes(m, capacity, &q, &b, seq, is_model, seq_len);
  CHECK(continued >= 12, "only %lld continuations", (long long)continued);
  const int64_t R = q.R, T = 64, V = VOCAB;
  int64_t s2[2] = {R, T}, sl[2] = {1, V};
  rx_tensor *tok = NULL, *mask = NULL, *lp = NULL, *one = NULL, *one_mask = NULL, *logits = NULL;
  rx_tensor_new(&tok, RX_I32, RX_CPU, 2, s2);
  rx_tensor_new(&mask, RX_I32, RX_CPU, 2, s2);
  rx_tensor_new(&lp, dtype, RX_CPU, 2, s2);
  int32_t *tk = tok->data, *mk = mask->data;
  memset(tk, 0, sizeof(int32_t) * (size_t)(R * T));
  memset(mk, 0, sizeof(int32_t) * (size_t)(R * T));
  for (int64_t r = 0; r < R; r++)
    for (int64_t t = 0; t < seq_len[r]; t++) tk[r * T + t] = seq[r][t], mk[r * T + t] = 1;
  rx_forward_opts fo = {0, 0, 0, 0};
  CHECK_OK(rx_model_logprobs(m, tok, mask, lp, NULL, &fo));
  double worst = 0;
  int64_t checked = 0;
  for (int64_t r = 0; r < R; r++) {
    int64_t k = 0;
    for (int64_t t = 0; t < seq_len[r]; t++) {
      if (!is_model[r][t]) continue;
      const double want = read(lp, r * T + t), got = b.logprobs[r * q.max_new + k];
      CHECK(b.tokens[r * q.max_new + k] == seq[r][t], "row %lld token %lld", (long long)r, (long long)k);
      const double tol = (dtype == RX_F64 ? 1e-9 : 1e-4) + fabs(want) * 6e-8;
      CHECK(fabs(got - want) <= tol, "%s capacity %lld: row %lld model token %lld (episode position %lld): continued logprob "
            "%.10g, full forward %.10g", rx_dtype_name(dtype), (long long)capacity, (long long)r, (long long)k, (long long)t,
            got, want);
      worst = fmax(worst, fabs(got - want));
      k++;
      checked++;
    }
    CHECK(k == b.lengths[r], "row %lld: %lld model tokens in the episode, %d generated", (long long)r, (long long)k, b.lengths[r]);
  }
  CHECK(checked > 30, "checked %lld tokens", (long long)checked);
  /* greedy rows: every model token is the argmax after the episode so far */
  rx_tensor_new(&one, RX_I32, RX_CPU, 2, (int64_t[]){1, T});
  rx_tensor_new(&one_mask, RX_I32, RX_CPU, 2, (int64_t[]){1, T});
  rx_tensor_new(&logits, dtype, RX_CPU, 2, sl);
  for (int64_t r = 1; r < R; r += 2)
    for (int64_t t = 1; t < seq_len[r]; t++) {
      if (!is_model[r][t]) continue;
      memset(one->data, 0, sizeof(int32_t) * (size_t)T);
      memset(one_mask->data, 0, sizeof(int32_t) * (size_t)T);
      for (int64_t i = 0; i < t; i++) ((int32_t *)one->data)[i] = seq[r][i], ((int32_t *)one_mask->data)[i] = 1;
      CHECK_OK(rx_model_next_logits(m, one, one_mask, logits));
      CHECK(argmax_row(logits, 0, V) == seq[r][t], "greedy row %lld position %lld: token %d is not the argmax", (long long)r,
            (long long)t, seq[r][t]);
    }
  rx_tensor_free(tok);
  rx_tensor_free(mask);
  rx_tensor_free(lp);
  rx_tensor_free(one);
  rx_tensor_free(one_mask);
  rx_tensor_free(logits);
  rx_model_free(m);
}

static void test_continued_f64(void) { check_continued_equals_full(RX_F64, 0, 40); }
static void test_continued_f32(void) { check_continued_equals_full(RX_F32, 0, 40); }
static void test_continued_qwen3_f64(void) { check_continued_equals_full(RX_F64, 1, 40); }
static void test_continued_repacked_f64(void) { check_continued_equals_full(RX_F64, 0, 14); }

static void test_continue_refusals(void) {
  rx_model *m = tiny_model(RX_F32);
  if (!m) return;
  req_buf q = three_prompts(6, 3);
  add_row(&q, 0, 1.0, 0, 1.0, 6, 1);
  res_buf b;
  rx_generator *g = begin(m, &q, &b);   /* append_capacity 0 */
  if (g) {
    CHECK_OK(rx_generate_stop_row(g, 0));
    CHECK_FAILS(rx_generate_continue(g, 1, (int64_t[]){0}, (int32_t[]){1}, (int64_t[]){0, 1}), "append_capacity = 0");
    rx_generate_end(g);
  }
  bind(&b);
  rx_generate_request req = request(&q);
  req.append_capacity = 8;
  g = NULL;
  CHECK_OK(rx_generate_begin(&g, m, &req, &b.res));
  if (g) {
    CHECK_OK(rx_generate_stop_row(g, 0));
    CHECK_FAILS(rx_generate_continue(g, 1, (int64_t[]){1}, (int32_t[]){1}, (int64_t[]){0, 1}), "row 1 outside [0, 1)");
    CHECK_FAILS(rx_generate_continue(g, 1, (int64_t[]){0}, (int32_t[]){VOCAB}, (int64_t[]){0, 1}), "outside the vocabulary");
    CHECK_FAILS(rx_generate_continue(g, 2, (int64_t[]){0, 0}, (int32_t[]){1}, (int64_t[]){0, 1, 1}), "listed twice");
    CHECK_OK(rx_generate_continue(g, 1, (int64_t[]){0}, (int32_t[]){1, 2}, (int64_t[]){0, 2}));
    CHECK(b.lengths[0] == 2 && b.finish[0] == RX_FINISH_LENGTH, "continued row: length %d finish %d", b.lengths[0], b.finish[0]);
    rx_generate_end(g);
  }
  rx_model_free(m);
}

/* ------------------------------------------------------------------ request checks */

static void test_bad_requests(void) {
  rx_model *m = tiny_model(RX_F32);
  if (!m) return;
  res_buf b;
  bind(&b);
  rx_generator *g = NULL;
  rx_generate_request req;
#define FRESH(q)                                   \
  req_buf q = three_prompts(8, 0);                 \
  for (int i = 0; i < 3; i++) add_row(&q, i, 1.0, 0, 1.0, 8, (uint64_t)i)

  { FRESH(q); q.max_new = MAXPOS - 6; for (int i = 0; i < 3; i++) q.rows[i].max_new_tokens = 1;
    req = request(&q);
    CHECK_FAILS(rx_generate_begin(&g, m, &req, &b.res), "max_position_embeddings"); CHECK(g == NULL, "generator left"); }
  /* each request is the fresh one with one change; beginning it fails naming what is wrong */
#define REFUSED(change, needle)                                             \
  do {                                                                      \
    FRESH(q);                                                               \
    change;                                                                 \
    req = request(&q);                                                      \
    CHECK_FAILS(rx_generate_begin(&g, m, &req, &b.res), needle);            \
  } while (0)
  REFUSED(q.tokens[q.offsets[1] + 1] = VOCAB, "prompt 1, position 1: token 50 is outside");
  REFUSED(q.tokens[2] = -3, "prompt 0, position 2: token -3");
  REFUSED(q.offsets[2] = q.offsets[1], "prompt 1 is empty");     /* prompt 1 empty (prompt 2 grows) */
  REFUSED(q.rows[2].temperature = -1, "row 2: temperature = -1 must be >= 0");
  REFUSED(q.rows[1].top_p = 0, "row 1: top_p = 0 outside (0, 1]");
  REFUSED(q.rows[1].top_p = 1.5, "top_p = 1.5");
  REFUSED(q.rows[0].top_k = -2, "top_k = -2");
  REFUSED(q.rows[0].temperature = NAN, "row 0: temperature = nan");
  REFUSED(q.rows[1].min_p = 1.25, "row 1: min_p = 1.25 outside [0, 1]");
  REFUSED(q.rows[2].repetition_penalty = -0.5, "row 2: repetition_penalty = -0.5 must be a finite number > 0");
  REFUSED(q.rows[0].repetition_penalty = NAN, "row 0: repetition_penalty = nan");
  REFUSED(q.rows[2].max_new_tokens = 9, "row 2: max_new_tokens 9 outside [1, 8]");
  REFUSED(q.rows[2].max_new_tokens = 0, "row 2: max_new_tokens 0");
  REFUSED(q.row_prompt[1] = 3, "row 1 continues prompt 3 of 3");
  REFUSED(q.stop[0] = VOCAB + 4; q.nstop = 1, "stop token 54");
  REFUSED(q.max_new = 0, "max_new_tokens = 0");
  REFUSED(q.R = 0, "0 rows");
  rx_model_free(m);

  /* more than memory: refused before allocating, naming rows, positions and sizes */
  rx_model_config c = tiny_config(RX_F64);
  c.max_position_embeddings = (int64_t)1 << 40;
  rx_model *big = NULL;
  CHECK_OK(rx_model_new(&big, &c));
  if (!big) return;
  FRESH(q);
  q.max_new = (int64_t)1 << 33;   /* 3 rows x 2^33 positions: terabytes of cache */
  req = request(&q);
  CHECK_FAILS(rx_generate_begin(&g, big, &req, &b.res), "3 rows x 8589934599 positions need a");
  CHECK(strstr(rx_last_error(), "GiB KV cache") && strstr(rx_last_error(), "available"), "message: %s", rx_last_error());
  CHECK(strstr(rx_last_error(), ": 0 rows of these prompts would fit at 8589934599 positions"), "message: %s", rx_last_error());
  const int64_t want = 2 * c.num_hidden_layers * 3 * (7 + q.max_new) * c.num_key_value_heads * c.head_dim * 8;
  CHECK(b.res.cache_bytes == want, "reported cache %lld, want %lld", (long long)b.res.cache_bytes, (long long)want);
  CHECK(g == NULL, "generator left");
  rx_model_free(big);
#undef FRESH
}

int main(void) {
  RUN(test_cached_f64);
  RUN(test_cached_f32);
  RUN(test_cached_qwen3_f64);
  RUN(test_cached_qwen3_f32);
  RUN(test_cached_llama31_f64);
  RUN(test_sampler_distributions);
  RUN(test_sampler_edges);
  RUN(test_sampler_min_p_and_penalty);
  RUN(test_generate_min_p_and_penalty);
  RUN(test_same_seed_same_tokens);
  RUN(test_batch_invariance_f32);
  RUN(test_batch_invariance_f64);
  RUN(test_batch_invariance_bf16_weights);
  RUN(test_batch_invariance_bf16);
  RUN(test_prompts_without_rows);
  RUN(test_finished_rows_leave_the_batch);
  RUN(test_stop_tokens);
  RUN(test_stop_row);
  RUN(test_bad_requests);
  RUN(test_continued_f64);
  RUN(test_continued_f32);
  RUN(test_continued_qwen3_f64);
  RUN(test_continued_repacked_f64);
  RUN(test_continue_refusals);
  return check_summary("test_generate");
}
