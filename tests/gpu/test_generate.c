/* test_generate.c: generation on device "cuda" against the same model on the CPU (the same
 * weights), for the test configurations (Qwen2 untied GQA with biases, Qwen2 tied MQA, Qwen3's
 * q/k norm, Llama 3.1 RoPE scaling): f32 greedy and sampled rows (temperature, top-k, top-p,
 * min-p, repetition penalty; the same seed and row keys) give the CPU's tokens, lengths and
 * finish reasons, with log-probabilities within 1e-4; prompts of different lengths (left-padded in the prefill), rows of different
 * budgets and a stop token (ragged batches that shrink as rows end); and the cached logits of
 * every decode step equal a full forward without cache (rx_model_next_logits) on the CPU and on
 * the device. bf16 compute: the cached logits against the device's own full forward. The CPU
 * generator is itself checked against full forwards and the sampler's distributions in
 * tests/c/test_generate.c. Without a CUDA device the test exits 77 (skipped). */
#include "gpu.h"
#include "ops/sample.h"

enum { VOCAB = 41, MAX_NEW = 9, MAXR = 16 };

static rx_model_config config(int variant, int32_t dtype, int32_t device) {
  rx_model_config c = gpu_tiny_config(variant, VOCAB, 16);
  c.dtype = dtype;
  c.device = device;
  return c;
}

static const char *variant_name[] = {"qwen2 untied gqa", "qwen2 tied mqa", "qwen3 qk_norm", "llama3.1 rope scaling"};

/* The CPU model with random weights and a device copy of it in dtype. */
static void models(int variant, int32_t dtype, rx_model **cpu, rx_model **dev) {
  rx_model_config cc = config(variant, RX_F32, RX_CPU), cg = config(variant, dtype, RX_CUDA);
  gpu_must(rx_model_new(cpu, &cc), NULL);
  gpu_must(rx_model_new(dev, &cg), NULL);
  for (int64_t i = 0; i < rx_model_param_count(*cpu); i++) {
    const char *name = rx_model_param_name(*cpu, i);
    rx_tensor *p = rx_model_param(*cpu, i);
    if (strstr(name, "norm.weight")) gpu_must(rx_tensor_uniform(p, 7, (uint64_t)i << 32, 0.5, 1.5), p);
    else gpu_must(rx_tensor_normal(p, 7, (uint64_t)i << 32, 0.0, 0.4), p);
    gpu_must(rx_tensor_copy(rx_model_param(*dev, i), p), p);
  }
}

/* Three prompts of lengths 5, 2 and 7 (left-padded to 7 in the prefill); rows: per prompt one
 * greedy (the ReMax baseline), one sampled at temperature 1, one with top-k 5 and top-p 0.9 at
 * temperature 1.3 and a shorter budget, one with min-p and a repetition penalty, one greedy with
 * a repetition penalty; a stop token ends some rows early. */
typedef struct {
  int32_t tokens[32];
  int64_t offsets[4], row_prompt[MAXR];
  rx_sampling rows[MAXR];
  int32_t stop[1];
  rx_generate_request req;
} request_buf;

static void request(request_buf *q, uint64_t seed) {
  static const int32_t a[] = {3, 17, 40, 8, 1}, b[] = {29, 4}, c[] = {11, 0, 33, 37, 5, 26, 19};
  memset(q, 0, sizeof *q);
  memcpy(q->tokens, a, sizeof a);
  memcpy(q->tokens + 5, b, sizeof b);
  memcpy(q->tokens + 7, c, sizeof c);
  q->offsets[1] = 5;
  q->offsets[2] = 7;
  q->offsets[3] = 14;
  int64_t R = 0;
  for (int64_t p = 0; p < 3; p++) {
    q->row_prompt[R] = p; q->rows[R++] = (rx_sampling){0.0, 1.0, 0, MAX_NEW, 10 * p + 1, 0, 0};
    q->row_prompt[R] = p; q->rows[R++] = (rx_sampling){1.0, 1.0, 0, MAX_NEW, 10 * p + 2, 0, 0};
    q->row_prompt[R] = p; q->rows[R++] = (rx_sampling){1.3, 0.9, 5, MAX_NEW - 3, 10 * p + 3, 0, 0};
    /* min-p with a repetition penalty, and a greedy row with one (over the prompt and completion) */
    q->row_prompt[R] = p; q->rows[R++] = (rx_sampling){1.0, 0.95, 0, MAX_NEW, 10 * p + 4, 0.05, 1.3};
    q->row_prompt[R] = p; q->rows[R++] = (rx_sampling){0.0, 1.0, 0, MAX_NEW, 10 * p + 5, 0, 1.5};
  }
  q->stop[0] = 13;
  q->req = (rx_generate_request){3, q->tokens, q->offsets, R, q->row_prompt, q->rows, q->stop, 1, seed, MAX_NEW, 0};
}

typedef struct {
  int32_t tokens[MAXR * MAX_NEW], lengths[MAXR], finish[MAXR];
  float logprobs[MAXR * MAX_NEW];
  rx_generate_result res;
} result_buf;

static void bind(result_buf *b) {
  memset(b, 0, sizeof *b);
  b->res = (rx_generate_result){b->tokens, b->logprobs, b->lengths, b->finish, 0, 0};
}

/* Greedy and sampled rows on the device equal the CPU's, token for token: with the device's
 * sampler (the default) and with the host's (REMAX_HOST_SAMPLER=1: the logits read back). */
static void same_tokens(int variant) {
  rx_model *mc, *mg;
  models(variant, RX_F32, &mc, &mg);
  for (uint64_t seed = 1; seed <= 4; seed++) {
    if (seed == 4) CHECK_OK(rx_set_option("host_sampler", "on"));
    request_buf q;
    request(&q, seed);
    result_buf c, g;
    bind(&c);
    bind(&g);
    CHECK_OK(rx_model_generate(mc, &q.req, &c.res));
    CHECK_OK(rx_model_generate(mg, &q.req, &g.res));
    CHECK(g.res.cache_bytes == c.res.cache_bytes, "%s: cache of %lld bytes on the device, %lld on the cpu",
          variant_name[variant], (long long)g.res.cache_bytes, (long long)c.res.cache_bytes);
    double worst_lp = 0;
    int stopped = 0;
    for (int64_t r = 0; r < q.req.num_rows; r++) {
      CHECK(g.lengths[r] == c.lengths[r] && g.finish[r] == c.finish[r],
            "%s seed %llu row %lld: length %d finish %d on the device, %d %d on the cpu", variant_name[variant],
            (unsigned long long)seed, (long long)r, g.lengths[r], g.finish[r], c.lengths[r], c.finish[r]);
      stopped += c.finish[r] == RX_FINISH_STOP;
      for (int32_t t = 0; t < c.lengths[r] && t < g.lengths[r]; t++) {
        const int64_t i = r * MAX_NEW + t;
        CHECK(g.tokens[i] == c.tokens[i], "%s seed %llu row %lld token %d: %d on the device, %d on the cpu",
              variant_name[variant], (unsigned long long)seed, (long long)r, t, g.tokens[i], c.tokens[i]);
        worst_lp = fmax(worst_lp, fabs((double)g.logprobs[i] - c.logprobs[i]));
      }
    }
    CHECK(worst_lp <= 1e-4, "%s seed %llu: log-probabilities differ from the cpu by %g", variant_name[variant],
          (unsigned long long)seed, worst_lp);
    CHECK(g.res.decode_steps == c.res.decode_steps, "%s: %lld decode steps on the device, %lld on the cpu",
          variant_name[variant], (long long)g.res.decode_steps, (long long)c.res.decode_steps);
    if (seed == 1) printf("  %s: %lld decode steps, %d rows stopped, log p within %.2g\n", variant_name[variant],
                          (long long)c.res.decode_steps, stopped, worst_lp);
  }
  CHECK_OK(rx_set_option("host_sampler", "off"));
  rx_model_free(mc);
  rx_model_free(mg);
}

/* The decode step as a CUDA graph (the default on cuda: captured once per batch size, replayed
 * per token) and as plain launches (REMAX_CUDA_GRAPHS=0) give the same tokens, lengths and
 * finish reasons, and log-probabilities within 1e-5 (the two attentions chunk the cache
 * differently); each equals the CPU's (same_tokens). */
static void graphs_equal_plain(int variant) {
  rx_model *mc, *mg;
  models(variant, RX_F32, &mc, &mg);
  request_buf q;
  request(&q, 9);
  result_buf a, b;
  bind(&a);
  bind(&b);
  CHECK_OK(rx_model_generate(mg, &q.req, &a.res));
  CHECK_OK(rx_set_option("cuda_graphs", "off"));
  CHECK_OK(rx_model_generate(mg, &q.req, &b.res));
  CHECK_OK(rx_set_option("cuda_graphs", "on"));
  double worst = 0;
  int same = 1;
  for (int64_t r = 0; r < q.req.num_rows; r++) {
    same &= a.lengths[r] == b.lengths[r] && a.finish[r] == b.finish[r];
    for (int32_t t = 0; t < a.lengths[r] && t < b.lengths[r]; t++) {
      same &= a.tokens[r * MAX_NEW + t] == b.tokens[r * MAX_NEW + t];
      worst = fmax(worst, fabs((double)a.logprobs[r * MAX_NEW + t] - b.logprobs[r * MAX_NEW + t]));
    }
  }
  CHECK(same, "%s: the graph path and the plain path give different tokens", variant_name[variant]);
  CHECK(worst <= 1e-5, "%s: log-probabilities of the graph and plain paths differ by %g", variant_name[variant], worst);
  CHECK(a.res.decode_steps == b.res.decode_steps && a.res.decode_steps > 0, "decode steps %lld and %lld",
        (long long)a.res.decode_steps, (long long)b.res.decode_steps);
  rx_model_free(mc);
  rx_model_free(mg);
}

/* The sequences so far (prompt + generated, the newest token left out), left-padded to T. */
static void pack(const request_buf *q, const result_buf *b, int32_t *tok, int32_t *mask, int64_t T) {
  const int64_t R = q->req.num_rows;
  memset(tok, 0, sizeof(int32_t) * (size_t)(R * T));
  memset(mask, 0, sizeof(int32_t) * (size_t)(R * T));
  for (int64_t r = 0; r < R; r++) {
    int64_t p = q->row_prompt[r], a = q->offsets[p], n = q->offsets[p + 1] - a, len = n + b->lengths[r] - 1;
    for (int64_t t = 0; t < len; t++) {
      tok[r * T + T - len + t] = t < n ? q->tokens[a + t] : b->tokens[r * MAX_NEW + t - n];
      mask[r * T + T - len + t] = 1;
    }
  }
}

/* Every decode step's cached logits on the device equal a full forward of each row's sequence:
 * the CPU's (f32) and the device's own (f32 and bf16). */
static void cached_equals_full(int variant, int32_t dtype) {
  const double tol = dtype == RX_F32 ? 1e-4 : 3e-2;
  rx_model *mc, *mg;
  models(variant, dtype, &mc, &mg);
  request_buf q;
  request(&q, 5);
  result_buf b;
  bind(&b);
  rx_generator *g = NULL;
  CHECK_OK(rx_generate_begin(&g, mg, &q.req, &b.res));
  if (!g) { rx_model_free(mc); rx_model_free(mg); return; }
  const int64_t R = q.req.num_rows, T = 7 + MAX_NEW, V = VOCAB;
  int64_t s2[2] = {R, T}, so[2] = {R, V};
  rx_tensor *tok, *mask, *ref_c, *ref_g, *ref_gh, *cached;
  gpu_must(rx_tensor_new(&tok, RX_I32, RX_CPU, 2, s2), NULL);
  gpu_must(rx_tensor_new(&mask, RX_I32, RX_CPU, 2, s2), NULL);
  gpu_must(rx_tensor_new(&ref_c, RX_F32, RX_CPU, 2, so), NULL);
  gpu_must(rx_tensor_new(&ref_g, dtype, RX_CUDA, 2, so), NULL);
  gpu_must(rx_tensor_new(&ref_gh, RX_F32, RX_CPU, 2, so), NULL);
  gpu_must(rx_tensor_new(&cached, RX_F32, RX_CPU, 2, so), NULL);
  int32_t prev[MAXR] = {0}, done = 0;
  double worst_c = 0, worst_g = 0, scale = 0;
  int checked = 0;
  for (int step = 0; step <= MAX_NEW && !done; step++) {
    if (step > 0) CHECK_OK(rx_generate_step(g, &done));
    pack(&q, &b, tok->data, mask->data, T);
    CHECK_OK(rx_model_next_logits(mc, tok, mask, ref_c));
    CHECK_OK(rx_model_next_logits(mg, tok, mask, ref_g));
    CHECK_OK(rx_tensor_copy(ref_gh, ref_g));
    const rx_tensor *dl = rx_generate_logits(g);
    CHECK(dl->device == RX_CUDA, "the cached logits are on device %d", dl->device);
    rx_tensor *view;
    gpu_must(rx_tensor_narrow(&view, cached, 0, 0, dl->shape[0]), NULL);
    CHECK_OK(rx_tensor_copy(view, dl));
    rx_tensor_free(view);
    const float *x = cached->data, *xc = ref_c->data, *xg = ref_gh->data;
    for (int64_t r = 0; r < R; r++) {
      if (b.lengths[r] == prev[r]) continue;   /* finished earlier: not in this step */
      prev[r] = b.lengths[r];
      const int64_t slot = rx_generate_batch_index(g, r);
      for (int64_t i = 0; i < V; i++) {
        scale = fmax(scale, fabs(xc[r * V + i]));
        worst_c = fmax(worst_c, fabs(x[slot * V + i] - xc[r * V + i]));
        worst_g = fmax(worst_g, fabs(x[slot * V + i] - xg[r * V + i]));
      }
      checked++;
    }
  }
  rx_generate_end(g);
  int expected = 0;
  for (int64_t r = 0; r < R; r++) expected += b.lengths[r];
  CHECK(checked == expected && checked > 0, "checked %d tokens of %d", checked, expected);
  CHECK(worst_g <= tol * fmax(1, scale), "%s %s: cached logits differ from the device's full forward by %g",
        variant_name[variant], rx_dtype_name(dtype), worst_g);
  if (dtype == RX_F32)
    CHECK(worst_c <= tol * fmax(1, scale), "%s: cached logits on the device differ from the cpu's full forward by %g",
          variant_name[variant], worst_c);
  printf("  %s %s: %d tokens, cached vs full forward: device %.2g, cpu %.2g (logits up to %.2g)\n",
         variant_name[variant], rx_dtype_name(dtype), checked, worst_g, worst_c, scale);
  rx_tensor_free(tok);
  rx_tensor_free(mask);
  rx_tensor_free(ref_c);
  rx_tensor_free(ref_g);
  rx_tensor_free(ref_gh);
  rx_tensor_free(cached);
  rx_model_free(mc);
  rx_model_free(mg);
}

/* The device sampler alone against the CPU's (rx_sample_token with rx_sample_uniform's u), on
 * rows of 1000 logits rounded to multiples of 1/8 (so that top-k cuts through ties) and rows with
 * -inf entries: greedy, temperature, top-k, top-p, min-p and the repetition penalty, alone and
 * together, over many keys and positions; a penalised row's token is appended to its seen list. */
static void sampler_equals_cpu(void) {
  enum { N = 48, V = 1000, S = 80 };
  int64_t s2[2] = {N, V}, s1[1] = {N}, ss[2] = {N, S};
  rx_tensor *x = cpu_uniform(2, s2, 11, -4.0, 4.0);
  float *h = x->data;
  for (int64_t i = 0; i < N * V; i++) h[i] = roundf(h[i] * 8) / 8;
  for (int64_t i = 0; i < V; i += 3) h[5 * V + i] = -INFINITY;   /* a row with masked tokens */
  static const struct { double t, p; int32_t k; double min_p; float pen; } set[] = {
    {0, 1, 0, 0, 1}, {1, 1, 0, 0, 1}, {0.7, 1, 0, 0, 1}, {1.5, 1, 0, 0, 1}, {1, 1, 5, 0, 1}, {1, 1, 40, 0, 1},
    {0.8, 0.9, 0, 0, 1}, {1.2, 0.5, 0, 0, 1}, {1, 0.95, 50, 0, 1}, {1, 1, 1, 0, 1}, {2, 0.3, 7, 0, 1},
    {1, 0.999, 0, 0, 1}, {1, 1, 0, 0.05, 1}, {1.5, 1, 0, 0.3, 1}, {1, 0.9, 30, 0.1, 1}, {0, 1, 0, 0, 1.5},
    {1, 1, 0, 0, 1.3}, {1, 1, 0, 0, 0.8}, {0.9, 0.95, 20, 0.05, 2}, {2, 0.7, 0, 0.2, 1.2},
  };
  rx_cuda_sample_row rows[N];
  rx_sampling cpu_rows[N];
  rx_tensor *seen_h;
  gpu_must(rx_tensor_new(&seen_h, RX_I32, RX_CPU, 2, ss), NULL);
  int32_t *seen = seen_h->data;
  for (int64_t r = 0; r < N; r++) {
    const int j = (int)(r % (int64_t)(sizeof set / sizeof set[0]));
    /* tokens so far: some of the row's most likely tokens (the penalty changes the draw), repeats */
    const int64_t num_seen = 5 + (r * 13) % 60;
    for (int64_t i = 0; i < S; i++) seen[r * S + i] = i < num_seen ? (int32_t)((r * 31 + i * i * 17) % V) : -7;
    for (int64_t i = 0; i < num_seen; i += 4) {
      int64_t best = 0;
      for (int64_t v = 1; v < V; v++) best = h[r * V + v] > h[r * V + best] && (v + i) % 3 ? v : best;
      seen[r * S + i] = (int32_t)best;
    }
    rows[r] = (rx_cuda_sample_row){set[j].t, set[j].p, set[j].min_p, set[j].k, set[j].pen, 1000 + (uint64_t)r * 7,
                                   3 + r, (N - 1 - r), num_seen};
    cpu_rows[r] = (rx_sampling){set[j].t, set[j].p, set[j].k, 1, 0, set[j].min_p, set[j].pen};
  }
  /* the device reads row r's tokens from seen row N - 1 - r: rows and their lists need not align */
  rx_tensor *seen_rev;
  gpu_must(rx_tensor_new(&seen_rev, RX_I32, RX_CPU, 2, ss), NULL);
  for (int64_t r = 0; r < N; r++) memcpy((int32_t *)seen_rev->data + (N - 1 - r) * S, seen + r * S, sizeof(int32_t) * S);
  rx_tensor *xg = to_gpu(x, RX_F32), *tok, *lp, *prob, *rows_g, *rows_h, *pen_g, *seen_g;
  gpu_must(rx_tensor_new(&pen_g, RX_F32, RX_CUDA, 2, s2), NULL);
  int64_t words[1] = {N * (int64_t)(sizeof(rx_cuda_sample_row) / 8)};
  gpu_must(rx_tensor_new(&tok, RX_I32, RX_CUDA, 1, s1), NULL);
  gpu_must(rx_tensor_new(&lp, RX_F32, RX_CUDA, 1, s1), NULL);
  gpu_must(rx_tensor_new(&prob, RX_F32, RX_CUDA, 2, s2), NULL);
  gpu_must(rx_tensor_new(&rows_h, RX_I64, RX_CPU, 1, words), NULL);
  memcpy(rows_h->data, rows, sizeof rows);
  rows_g = to_gpu(rows_h, RX_I64);
  for (uint64_t seed = 0; seed < 3; seed++) {
    seen_g = to_gpu(seen_rev, RX_I32);
    CHECK_OK(rx_sample_rows(tok, lp, prob, xg, rows_g->data, seed, seen_g, pen_g));
    rx_tensor *seen_back;
    gpu_must(rx_tensor_new(&seen_back, RX_I32, RX_CPU, 2, ss), NULL);
    gpu_must(rx_tensor_copy(seen_back, seen_g), seen_back);
    double got_lp[N], got_tok[N];
    gpu_must(rx_tensor_read_f64(tok, got_tok), NULL);
    gpu_must(rx_tensor_read_f64(lp, got_lp), NULL);
    int differ = 0;
    for (int64_t r = 0; r < N; r++) {
      const float *row = h + r * V;
      int32_t want;
      double u = rx_sample_uniform(seed, rows[r].key, rows[r].position);
      CHECK_OK(rx_sample_token(row, V, &cpu_rows[r], seen + r * S, rows[r].num_seen, u, &want));
      differ += (int32_t)got_tok[r] != want;
      CHECK((int32_t)got_tok[r] == want,
            "seed %llu row %lld (t %g k %d p %g min_p %g penalty %g): token %d on the device, %d on the cpu",
            (unsigned long long)seed, (long long)r, rows[r].temperature, rows[r].top_k, rows[r].top_p, rows[r].min_p,
            rows[r].repetition_penalty, (int32_t)got_tok[r], want);
      /* a penalised row's token is appended to its list, the rest of the lists untouched */
      const int32_t *back = (const int32_t *)seen_back->data + (N - 1 - r) * S;
      const int64_t ns = rows[r].num_seen;
      int untouched = memcmp(back, seen + r * S, sizeof(int32_t) * (size_t)ns) == 0;
      for (int64_t i = ns + 1; i < S; i++) untouched &= back[i] == -7;
      CHECK(untouched && back[ns] == (rows[r].repetition_penalty != 1.0f ? want : -7),
            "seed %llu row %lld: seen list after sampling holds %d at %lld", (unsigned long long)seed, (long long)r,
            back[ns], (long long)ns);
      double mx = -INFINITY, z = 0;
      for (int64_t i = 0; i < V; i++) mx = fmax(mx, row[i]);
      for (int64_t i = 0; i < V; i++) z += exp((double)row[i] - mx);
      const double ref = row[want] - mx - log(z);
      CHECK(fabs(got_lp[r] - ref) <= 1e-5 * fmax(1, fabs(ref)), "row %lld: log p %.8g on the device, %.8g exact",
            (long long)r, got_lp[r], ref);
    }
    if (seed == 0) printf("  sampler: %d rows x %d logits, %d tokens differ from the cpu\n", N, V, differ);
    rx_tensor_free(seen_back);
    rx_tensor_free(seen_g);
  }
  /* a sampled row whose logits are all -inf has no finite maximum: token -1, which generation reports */
  for (int64_t i = 0; i < V; i++) h[i] = -INFINITY;
  rx_tensor *one, *xg1, *tok1, *lp1, *prob1;
  gpu_must(rx_tensor_narrow(&one, x, 0, 0, 1), NULL);
  xg1 = to_gpu(one, RX_F32);
  int64_t o1[1] = {1}, o2[2] = {1, V};
  gpu_must(rx_tensor_new(&tok1, RX_I32, RX_CUDA, 1, o1), NULL);
  gpu_must(rx_tensor_new(&lp1, RX_F32, RX_CUDA, 1, o1), NULL);
  gpu_must(rx_tensor_new(&prob1, RX_F32, RX_CUDA, 2, o2), NULL);
  CHECK_OK(rx_sample_rows(tok1, lp1, prob1, xg1, (const rx_cuda_sample_row *)rows_g->data + 1, 0, NULL, NULL));
  double t1;
  gpu_must(rx_tensor_read_f64(tok1, &t1), NULL);
  CHECK(t1 == -1, "a row without a finite logit gave token %g", t1);
  CHECK_FAILS(rx_sample_rows(tok1, lp1, prob1, one, rows_g->data, 0, NULL, NULL), "sample");
  CHECK_FAILS(rx_sample_rows(tok, lp, prob, xg, rows_g->data, 0, NULL, pen_g), "give both seen and penalized");
  rx_tensor *list[] = {x, xg, tok, lp, prob, rows_g, rows_h, one, xg1, tok1, lp1, prob1, seen_h, seen_rev, pen_g};
  for (size_t i = 0; i < sizeof list / sizeof list[0]; i++) rx_tensor_free(list[i]);
}

/* The decode attention (one query per row over a cache view with a batch stride, split along the
 * cache: cuda/decode_attention.cu, reached through rx_attention_forward when Tq = 1) against the
 * CPU attention: GQA groups of 4, 6 and 1, head dims 64, 128 and 256, caches long enough for
 * several chunks, a row with left padding, one with holes, and a padded query (zeros). */
static void decode_attention_equals_cpu(int64_t B, int64_t Tk, int64_t H, int64_t KV, int64_t D, int32_t dtype) {
  const int64_t S = Tk + 5;   /* the cache is longer than what the step reads */
  int64_t sq[4] = {B, 1, H, D}, sk[4] = {B, S, KV, D}, sm[2] = {B, Tk}, sl[3] = {B, H, 1};
  rx_tensor *q = cpu_uniform(4, sq, 21, -1, 1), *kf = cpu_uniform(4, sk, 22, -1, 1), *vf = cpu_uniform(4, sk, 23, -1, 1);
  cpu_round_through(q, dtype);
  cpu_round_through(kf, dtype);
  cpu_round_through(vf, dtype);
  rx_tensor *mask, *k, *v, *out, *lse;
  gpu_must(rx_tensor_new(&mask, RX_I32, RX_CPU, 2, sm), NULL);
  int32_t *mk = mask->data;
  for (int64_t b = 0; b < B; b++)
    for (int64_t s = 0; s < Tk; s++)
      mk[b * Tk + s] = b == 1 ? s >= 13 : b == 2 ? s % 5 != 2 : b == 3 ? s != Tk - 1 : 1;
  gpu_must(rx_tensor_narrow(&k, kf, 1, 0, Tk), NULL);
  gpu_must(rx_tensor_narrow(&v, vf, 1, 0, Tk), NULL);
  gpu_must(rx_tensor_new(&out, RX_F32, RX_CPU, 4, sq), NULL);
  gpu_must(rx_tensor_new(&lse, RX_F32, RX_CPU, 3, sl), NULL);
  CHECK_OK(rx_attention_forward(out, lse, q, k, v, mask, 0.0));
  rx_tensor *qg = to_gpu(q, dtype), *kfg = to_gpu(kf, dtype), *vfg = to_gpu(vf, dtype), *mg = to_gpu(mask, RX_I32), *kg, *vg;
  gpu_must(rx_tensor_narrow(&kg, kfg, 1, 0, Tk), NULL);
  gpu_must(rx_tensor_narrow(&vg, vfg, 1, 0, Tk), NULL);
  gpu_guarded og = gpu_guarded_new(dtype, 4, sq, NULL), lg = gpu_guarded_new(RX_F32, 3, sl, NULL);
  CHECK_OK(rx_attention_forward(og.t, lg.t, qg, kg, vg, mg, 0.0));
  const double eo = gpu_nrmse(og.t, out), el = gpu_nrmse(lg.t, lse), tol = gpu_tol(dtype);
  CHECK(eo <= tol && el <= tol, "decode attention B=%lld Tk=%lld H=%lld KV=%lld D=%lld %s: out %g, lse %g from the cpu",
        (long long)B, (long long)Tk, (long long)H, (long long)KV, (long long)D, rx_dtype_name(dtype), eo, el);
  printf("  decode attention B=%lld Tk=%lld H=%lld KV=%lld D=%lld %s: out %.2g, lse %.2g\n", (long long)B, (long long)Tk,
         (long long)H, (long long)KV, (long long)D, rx_dtype_name(dtype), eo, el);
  CHECK(gpu_guarded_free(og) && gpu_guarded_free(lg), "decode attention wrote outside its outputs");
  rx_tensor *list[] = {q, kf, vf, mask, k, v, out, lse, qg, kfg, vfg, mg, kg, vg};
  for (size_t i = 0; i < sizeof list / sizeof list[0]; i++) rx_tensor_free(list[i]);
}

static void decode_attention(void) {
  decode_attention_equals_cpu(4, 300, 8, 2, 64, RX_F32);
  decode_attention_equals_cpu(2, 150, 12, 2, 128, RX_F32);
  decode_attention_equals_cpu(3, 70, 2, 2, 256, RX_F32);
  decode_attention_equals_cpu(4, 200, 16, 1, 32, RX_F32);
  decode_attention_equals_cpu(4, 300, 8, 2, 64, RX_BF16);
}

static void qwen2_untied_gqa(void) { same_tokens(0); cached_equals_full(0, RX_F32); }
static void qwen2_tied_mqa(void) { same_tokens(1); cached_equals_full(1, RX_F32); }
static void qwen3_qk_norm(void) { same_tokens(2); cached_equals_full(2, RX_F32); }
static void llama31_rope_scaling(void) { same_tokens(3); cached_equals_full(3, RX_F32); }
/* A request whose KV cache cannot fit in the device's memory is refused before anything is
 * allocated, with the number of rows that would fit. */
static void too_large_is_refused(void) {
  rx_model_config c = config(0, RX_F32, RX_CUDA);
  c.max_position_embeddings = 1 << 20;
  rx_model *m = NULL;
  gpu_must(rx_model_new(&m, &c), NULL);
  enum { ROWS = 1 << 16 };
  int32_t prompt[2] = {1, 2};
  int64_t offsets[2] = {0, 2}, *row_prompt = calloc(ROWS, sizeof(int64_t));
  rx_sampling *rows = calloc(ROWS, sizeof(rx_sampling));
  for (int64_t r = 0; r < ROWS; r++) rows[r] = (rx_sampling){0.0, 1.0, 0, 1 << 19, (uint64_t)r, 0, 0};
  rx_generate_request q = {1, prompt, offsets, ROWS, row_prompt, rows, NULL, 0, 1, 1 << 19, 0};
  rx_generate_result res = {0};   /* never written: the request fails first */
  CHECK_FAILS(rx_model_generate(m, &q, &res), "GiB of device memory (cuda) is available");
  CHECK(strstr(rx_last_error(), "rows of these prompts would fit") != NULL, "%s", rx_last_error());
  printf("  %s\n", rx_last_error());
  CHECK(res.cache_bytes == 2ll * c.num_hidden_layers * ROWS * (2 + (1 << 19)) * c.num_key_value_heads * c.head_dim * 4,
        "cache_bytes %lld", (long long)res.cache_bytes);
  free(row_prompt);
  free(rows);
  rx_model_free(m);
}

static void cuda_graphs(void) {
  graphs_equal_plain(0);
  graphs_equal_plain(2);
}
static void bf16_cached_equals_full(void) {
  for (int v = 0; v < 4; v++) cached_equals_full(v, RX_BF16);
}


/* Multi-turn episodes (rx_generate_continue) on the device give the CPU's tokens: rows pause on
 * the stop token or at a turn length (rx_generate_stop_row), get observations of 1 to 4 tokens
 * appended (rows pausing together continue in one batch), and decode on; a small capacity forces
 * repacks. Log-probabilities within 1e-4. */
static void episodes(rx_model *m, const request_buf *q0, int64_t capacity, result_buf *b, int *continued) {
  request_buf q = *q0;
  q.req.append_capacity = capacity;
  bind(b);
  rx_generator *g = NULL;
  CHECK_OK(rx_generate_begin(&g, m, &q.req, &b->res));
  if (!g) return;
  int turns[MAXR] = {0};
  int32_t done = 0;
  *continued = 0;
  for (int step = 0; step < 200; step++) {
    int64_t rows[MAXR], offs[MAXR + 1] = {0}, n = 0;
    int32_t obs[MAXR * 4];
    for (int64_t r = 0; r < q.req.num_rows; r++) {
      if (turns[r] >= 3 || b->lengths[r] >= q.rows[r].max_new_tokens) continue;
      int ends = b->finish[r] == RX_FINISH_STOP;   /* paused on the stop token */
      if (!ends && b->lengths[r] >= 3 * (turns[r] + 1)) {
        CHECK_OK(rx_generate_stop_row(g, r));
        ends = 1;
      }
      if (!ends) continue;
      const int k = 1 + (int)((r + turns[r]) % 4);
      for (int i = 0; i < k; i++) obs[offs[n] + i] = (int32_t)((5 + 7 * r + 3 * turns[r] + i) % VOCAB);
      offs[n + 1] = offs[n] + k;
      rows[n++] = r;
      turns[r]++;
    }
    if (n) {
      CHECK_OK(rx_generate_continue(g, n, rows, obs, offs));
      *continued += (int)n;
      done = 0;
      continue;
    }
    if (done) break;
    CHECK_OK(rx_generate_step(g, &done));
  }
  rx_generate_end(g);
}

static void continued_same_tokens(int variant) {
  rx_model *mc, *mg;
  models(variant, RX_F32, &mc, &mg);
  for (int64_t capacity = 12; capacity <= 40; capacity += 28) {
    request_buf q;
    request(&q, 5);
    for (int64_t r = 0; r < q.req.num_rows; r++) q.rows[r].max_new_tokens = MAX_NEW;
    result_buf c, g;
    int nc = 0, ng = 0;
    episodes(mc, &q, capacity, &c, &nc);
    episodes(mg, &q, capacity, &g, &ng);
    CHECK(nc == ng && nc >= 10, "%s: %d continuations on the device, %d on the cpu", variant_name[variant], ng, nc);
    double worst_lp = 0;
    for (int64_t r = 0; r < q.req.num_rows; r++) {
      CHECK(g.lengths[r] == c.lengths[r] && g.finish[r] == c.finish[r],
            "%s capacity %lld row %lld: length %d finish %d on the device, %d %d on the cpu", variant_name[variant],
            (long long)capacity, (long long)r, g.lengths[r], g.finish[r], c.lengths[r], c.finish[r]);
      for (int32_t t = 0; t < c.lengths[r] && t < g.lengths[r]; t++) {
        const int64_t i = r * MAX_NEW + t;
        CHECK(g.tokens[i] == c.tokens[i], "%s capacity %lld row %lld token %d: %d on the device, %d on the cpu",
              variant_name[variant], (long long)capacity, (long long)r, t, g.tokens[i], c.tokens[i]);
        worst_lp = fmax(worst_lp, fabs((double)g.logprobs[i] - c.logprobs[i]));
      }
    }
    CHECK(worst_lp <= 1e-4, "%s: continued log-probabilities differ from the cpu by %g", variant_name[variant], worst_lp);
    printf("  %s: continued episodes (capacity %lld): %d continuations, log p within %.2g\n", variant_name[variant],
           (long long)capacity, nc, worst_lp);
  }
  rx_model_free(mc);
  rx_model_free(mg);
}

static void continued_episodes(void) {
  continued_same_tokens(0);
  continued_same_tokens(2);
}

int main(void) {
  if (gpu_skip_unless_present("gpu_test_generate")) return GPU_SKIP;
  RUN(sampler_equals_cpu);
  RUN(decode_attention);
  RUN(qwen2_untied_gqa);
  RUN(qwen2_tied_mqa);
  RUN(qwen3_qk_norm);
  RUN(llama31_rope_scaling);
  RUN(cuda_graphs);
  RUN(too_large_is_refused);
  RUN(bf16_cached_equals_full);
  RUN(continued_episodes);
  return check_summary("gpu_test_generate");
}
