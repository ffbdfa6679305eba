/* generate.c: batched KV-cache decoding with per-row sampling.
 *
 * Prompts are prefilled once each (on the CPU each alone; their caches left-padded to the
 * longest, so every prompt's last token sits at the same cache index), their keys and values are
 * copied to every row that continues them, and then all rows decode in lockstep: one token per
 * row per step, attention of one query against the row's cache from its first real slot, every
 * matmul computing each row as alone (rx_matmul_forward_rows). Randomness comes from Philox keyed
 * by (seed, row key, position). So on the CPU a row's tokens and log-probabilities, bit for bit,
 * do not depend on which other rows share its batch (docs/generation.md).
 *
 * On a device (model on "cuda") the KV cache, the decode activations and the step's ids
 * (tokens, positions, mask) live in device memory; the host keeps the rows' bookkeeping and
 * stages the ids before each step. The device samples (ops/sample.h: the same rules and Philox
 * streams as the host's sampler), so only each row's token and its log-probability come back;
 * REMAX_HOST_SAMPLER=1 reads the logits back as f32 and samples on the host instead. */
#include "core/options.h"
#include "core/threads.h"
#include "model/model_internal.h"
#include "fastmath.h"
#include "philox.h"
#include "ops/sample.h"
#include "ops/decode.h"
#include "ops/engine_ops.h"
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define TRY(call) do { int rc_ = (call); if (rc_) return rc_; } while (0)

typedef struct { float p; int32_t i; } cand;   /* a top-p candidate: probability, token */

struct rx_generator {
  rx_model *m;
  rx_generate_request req;
  rx_generate_result *res;
  int64_t R, P, Pmax, S, generated;      /* generated: tokens each row still decoding has so far */
  /* Rows live in places in the batch: places [0, active) hold the rows still decoding, and a
   * step computes only those. When a row finishes, the next step moves the row in the last
   * active place into its place, so the batch shrinks as rows end. "Per place" data follows its
   * row when it moves. */
  int64_t active;
  int32_t *place_row, *row_place;        /* [R]: the row in each place, the place of each row */
  void *kcache, *vcache;                 /* [L][R][S][KV*D] in the compute dtype, per place */
  void *kcache_handle, *vcache_handle, *scratch_handle, *ids_handle;   /* device pieces (rx_arena_free) */
  int32_t *ids;                          /* device: [R] tokens, [R] positions, [R*S] mask; NULL on the CPU */
  int32_t *d_tok, *d_pos, *d_mask;       /* where the step's ops read them: ids, or the host arrays on the CPU */
  int device_sampler;                    /* the device picks the tokens (sample_on_device) */
  void *dsamp, *dsamp_handle;            /* device: [R] settings, [R] tokens, [R] log p, [R, V] probabilities */
  rx_cuda_sample_row *h_rows;            /* host: [R] settings of the places */
  int32_t *h_tok;                        /* host: [R] tokens, then [R] log p (f32) */
  /* CUDA graphs (device, unless REMAX_CUDA_GRAPHS=0): the decode step after the embedding has
   * fixed shapes for a batch size (attention over the whole cache, each place's length read on
   * the device), so it is captured once per batch size and replayed for every token. */
  int graphs, graph_refused;             /* graph_refused: a capture failed (the step then runs plainly) */
  void **graph_of;                       /* [R + 1]: the graph of each batch size, NULL until captured */
  int32_t *d_lens, *h_lens;              /* [R]: each place's cache length this step */
  float *d_part;                         /* the decode attention's chunk scratch */
  void *part_handle;
  rx_tensor lens_t, gmask;               /* views of d_lens [active] and d_mask [active, S] */
  int32_t *cache_mask;                   /* [R][S], per place */
  int32_t *step_mask;                    /* [active][Tk] contiguous copy for the attention call */
  int32_t *prompt_len, *positions, *current, *done;   /* per place */
  void *scratch;                         /* decode activations */
  rx_tensor x, xn, rstd, q, k, v, att, tmp, gate, up, h, lse, logits, tok;
  int64_t step_slot;                     /* cache slot of the token the current step decodes */
  float *logits_f32;                     /* [R][V] on the host for the sampler (the logits themselves on a CPU f32 model) */
  float *sample_buf;                     /* per thread [V] */
  int32_t *index_buf;                    /* per thread [V] */
  cand *cand_buf;                        /* per thread [V]: top-p candidates */
  float *pen_buf;                        /* per thread [V]: logits after the repetition penalty */
  /* device sampler with a repetition penalty: the rows' tokens so far (i32 [R, S] by row, the
   * prompt uploaded at begin, each sampled token appended by the device) and the penalised
   * logits (f32 [R, V] scratch); NULL when no row has a penalty */
  int32_t *d_seen;
  float *d_pen;
  void *d_seen_handle, *d_pen_handle;
  int nthreads;
  int64_t prefill_prompt;                /* the prompt a CPU prefill is computing alone, or -1: all, batched */
  /* continuing rows (request append_capacity > 0): slot is the next cache slot a step writes (the
   * cache grows in lockstep); npos[place] counts the row's tokens in the cache (the RoPE position
   * of its next one); a row that stops stays paused (finish RX_FINISH_STOP, cache kept) until
   * rx_generate_continue; move_k / move_v: one row of one layer's cache, for swaps and repacking */
  int continuable;
  int64_t slot;
  int32_t *npos;
  void *move_buf, *move_handle;
};

/* ------------------------------------------------------------------ sampling */

double rx_sample_uniform(uint64_t seed, uint64_t key, int64_t position) {
  return rx_philox_sample_uniform(seed, key, position);
}

/* The largest value, in a pass the compiler vectorises. NaNs after x[0] never win; a NaN x[0]
 * may (the sampler then reports logits without a finite maximum). */
static float row_max(const float *x, int64_t n) {
  float mx = x[0];
  #pragma omp simd reduction(max : mx)
  for (int64_t i = 1; i < n; i++) mx = x[i] > mx ? x[i] : mx;
  return mx;
}

/* The first index holding mx = row_max(x) (0 when none does: x[0] is NaN). */
static int first_of(const float *x, int64_t n, float mx) {
  for (int64_t i = 0; i < n; i++)
    if (x[i] == mx) return (int)i;
  return 0;
}

/* k-th largest value of x[0..n) (1-based k), by quickselect on a copy in buf. */
static float kth_largest(const float *x, int64_t n, int64_t k, float *buf) {
  memcpy(buf, x, sizeof(float) * (size_t)n);
  int64_t lo = 0, hi = n - 1, want = k - 1;
  while (lo < hi) {
    float pivot = buf[lo + (hi - lo) / 2];
    int64_t i = lo, j = hi;
    while (i <= j) {
      while (buf[i] > pivot) i++;
      while (buf[j] < pivot) j--;
      if (i <= j) { float t = buf[i]; buf[i] = buf[j]; buf[j] = t; i++; j--; }
    }
    if (want <= j) hi = j;
    else if (want >= i) lo = i;
    else break;
  }
  return buf[want];
}

/* CTRL's repetition penalty as Hugging Face's RepetitionPenaltyLogitsProcessor and vLLM apply it,
 * in f32 as they do: out holds a copy of x; each token of ids gets its logit divided by the
 * penalty when positive, multiplied by it otherwise. Written from x, so a token seen twice is
 * penalised once. */
static void penalize(float *out, const float *x, int64_t V, float penalty, const int32_t *ids, int64_t n) {
  for (int64_t j = 0; j < n; j++) {
    const int32_t t = ids[j];
    if (t < 0 || t >= V) continue;
    const float v = x[t];
    out[t] = v > 0 ? v / penalty : v * penalty;
  }
}

/* 1 (and 0, a zeroed rx_sampling field) means no penalty. */
static int penalty_on(double p) { return p != 0 && p != 1; }

/* What is wrong with a row's settings (written to msg), or NULL. */
static const char *sampling_problem(const rx_sampling *s, char *msg, size_t cap) {
  if (!(s->temperature >= 0)) snprintf(msg, cap, "temperature = %g must be >= 0", s->temperature);
  else if (!(s->top_p > 0 && s->top_p <= 1)) snprintf(msg, cap, "top_p = %g outside (0, 1]", s->top_p);
  else if (s->top_k < 0) snprintf(msg, cap, "top_k = %d must be >= 0", s->top_k);
  else if (!(s->min_p >= 0 && s->min_p <= 1)) snprintf(msg, cap, "min_p = %g outside [0, 1]", s->min_p);
  else if (!(s->repetition_penalty >= 0 && isfinite(s->repetition_penalty)))
    snprintf(msg, cap, "repetition_penalty = %g must be a finite number > 0 (1 = off)", s->repetition_penalty);
  else return NULL;
  return msg;
}

static int by_prob_desc(const void *a, const void *b) {
  const cand *x = a, *y = b;
  if (x->p != y->p) return x->p > y->p ? -1 : 1;
  return x->i - y->i;
}

/* The sampler, given mx = row_max(logits) (logits after the repetition penalty): temperature,
 * top-k, top-p, min-p, then the draw. Scratch: prob, index and c, [vocab] each. */
static int sample_with(const float *logits, int64_t V, float mx, double temperature, int32_t top_k, double top_p,
                       double min_p, double u, float *prob, int32_t *index, cand *c, int32_t *token) {
  if (temperature <= 0 || top_k == 1) { *token = first_of(logits, V, mx); return RX_OK; }
  if (!isfinite(mx)) return rx_fail(RX_EINVAL, "sample: logits have no finite maximum (%g)", (double)mx);
  const int64_t arg = first_of(logits, V, mx);
  /* top-k keeps exactly k tokens: those above the k-th largest logit, then as many tokens
   * equal to it (lowest ids first) as make up k. */
  float floor_logit = -INFINITY;
  int64_t ties_left = V;
  if (top_k > 0 && top_k < V) {
    floor_logit = kth_largest(logits, V, top_k, prob);
    ties_left = top_k;
    for (int64_t i = 0; i < V; i++) ties_left -= logits[i] > floor_logit;
  }
  const double inv_t = 1.0 / temperature;
  double z = 0;
  if (floor_logit == -INFINITY) {
    /* no top-k: every token, in one vectorised pass (f32 exponentials, relative error <= 3e-7) */
    const float it = (float)inv_t;
    #pragma omp simd reduction(+ : z)
    for (int64_t i = 0; i < V; i++) {
      const float p = rx_exp_f32((logits[i] - mx) * it);
      prob[i] = p;
      z += p;
    }
  } else {
    for (int64_t i = 0; i < V; i++) {
      int keep = logits[i] > floor_logit || (logits[i] == floor_logit && ties_left-- > 0);
      double p = keep ? exp((logits[i] - mx) * inv_t) : 0.0;
      prob[i] = (float)p;
      z += p;
    }
  }
  const float ptop = prob[arg];   /* the most likely token's weight, before top-p may reorder ties */
  if (top_p < 1.0) {
    /* The kept set is a prefix of the tokens sorted by probability. Only tokens at least as
     * likely as some tau can be in it once their mass reaches top_p: gather those, lowering
     * tau until they carry enough mass, and sort just them. */
    double need = top_p * z, tau = row_max(prob, V) * 1e-3, mass;
    int64_t n;
    for (;;) {
      n = 0;
      mass = 0;
      for (int64_t i = 0; i < V; i++)
        if (prob[i] >= tau && prob[i] > 0) { index[n++] = (int32_t)i; mass += prob[i]; }
      if (mass >= need || tau == 0) break;
      tau = tau > 1e-30 ? tau * 1e-3 : 0;
    }
    for (int64_t j = 0; j < n; j++) c[j] = (cand){prob[index[j]], index[j]};
    qsort(c, (size_t)n, sizeof *c, by_prob_desc);
    double cum = 0, kept = 0;
    int64_t keep = 0;
    while (keep < n && cum < need) { cum += c[keep].p; keep++; }
    if (keep == 0) keep = 1;
    /* zero everything, then restore the kept prefix */
    for (int64_t j = 0; j < n; j++) index[j] = c[j].i;
    for (int64_t j = keep; j < n; j++) prob[index[j]] = 0;
    for (int64_t i = 0; i < V; i++)
      if (prob[i] > 0 && prob[i] < tau) prob[i] = 0;
    for (int64_t j = 0; j < keep; j++) kept += c[j].p;
    z = kept;
  }
  if (min_p > 0) {
    /* min-p last (Hugging Face's MinPLogitsWarper after top-k and top-p): tokens whose weight is
     * below min_p x the top token's go; the ratio does not depend on the normalisation */
    const double floor_p = min_p * (double)ptop;
    double kept = 0;
    for (int64_t i = 0; i < V; i++) {
      if (prob[i] > 0 && (double)prob[i] < floor_p) prob[i] = 0;
      kept += prob[i];
    }
    z = kept;
  }
  double target = u * z, cum = 0;
  int64_t last = -1;
  for (int64_t i = 0; i < V; i++) {
    if (prob[i] <= 0) continue;
    cum += prob[i];
    last = i;
    if (cum > target) break;
  }
  *token = (int32_t)(last >= 0 ? last : first_of(logits, V, mx));
  return RX_OK;
}

int rx_sample_token(const float *logits, int64_t vocab, const rx_sampling *s, const int32_t *seen, int64_t num_seen,
                    double u, int32_t *token) {
  char msg[128];
  if (vocab <= 0) return rx_fail(RX_EINVAL, "sample: vocab %lld must be > 0", (long long)vocab);
  if (!(u >= 0 && u < 1)) return rx_fail(RX_EINVAL, "sample: u = %g outside [0, 1)", u);
  if (sampling_problem(s, msg, sizeof msg)) return rx_fail(RX_EINVAL, "sample: %s", msg);
  if (num_seen < 0 || (num_seen > 0 && !seen))
    return rx_fail(RX_EINVAL, "sample: %lld seen tokens %s", (long long)num_seen, seen ? "" : "without a list");
  const int pen = penalty_on(s->repetition_penalty);
  float *prob = malloc(sizeof(float) * (size_t)vocab);
  int32_t *index = malloc(sizeof(int32_t) * (size_t)vocab);
  cand *c = malloc(sizeof(cand) * (size_t)vocab);
  float *x = pen ? malloc(sizeof(float) * (size_t)vocab) : (float *)logits;
  int rc = RX_OK;
  if (prob && index && c && x) {
    if (pen) {
      memcpy(x, logits, sizeof(float) * (size_t)vocab);
      penalize(x, logits, vocab, (float)s->repetition_penalty, seen, num_seen);
    }
    rc = sample_with(x, vocab, row_max(x, vocab), s->temperature, s->top_k, s->top_p, s->min_p, u, prob, index, c, token);
  } else {
    rc = rx_fail(RX_ENOMEM, "sample: out of memory");
  }
  free(prob);
  free(index);
  free(c);
  if (pen) free(x);
  return rc;
}

/* ------------------------------------------------------------------ helpers */

static int64_t available_memory(void) {
  FILE *f = fopen("/proc/meminfo", "r");
  char line[256];
  long long kb = -1;
  while (f && fgets(line, sizeof line, f))
    if (sscanf(line, "MemAvailable: %lld kB", &kb) == 1) break;
  if (f) fclose(f);
  if (kb < 0) return (int64_t)sysconf(_SC_AVPHYS_PAGES) * sysconf(_SC_PAGESIZE);
  return (int64_t)kb * 1024;
}

/* A [a, b] view on the device of the model's tensors. */
static void view2(rx_tensor *t, void *data, int32_t dtype, int32_t device, int64_t a, int64_t b) {
  int64_t shape[2] = {a, b};
  rx_view_init(t, data, dtype, device, 2, shape);
}

static double gib(int64_t bytes) { return bytes / 1073741824.0; }

/* n elements of the compute dtype from src to dst, both on the model's device. */
static int dev_copy(const rx_generator *g, void *dst, const void *src, int64_t n) {
  const rx_model_config *c = &g->m->cfg;
  if (c->device == RX_CPU) {
    memcpy(dst, src, (size_t)(n * rx_dtype_size(c->dtype)));
    return RX_OK;
  }
  rx_tensor d, s;
  int64_t shape[1] = {n};
  rx_view_init(&d, dst, c->dtype, c->device, 1, shape);
  rx_view_init(&s, (void *)src, c->dtype, c->device, 1, shape);
  return rx_tensor_copy(&d, &s);
}

/* n host ids to where the step's ops read them (nothing to do on the CPU: the same memory). */
static int stage_ids(const rx_generator *g, int32_t *dst, const int32_t *src, int64_t n) {
  if (dst == src) return RX_OK;
  rx_tensor d, s;
  int64_t shape[1] = {n};
  rx_view_init(&d, dst, RX_I32, g->m->cfg.device, 1, shape);
  rx_view_init(&s, (void *)src, RX_I32, RX_CPU, 1, shape);
  return rx_tensor_copy(&d, &s);
}

/* ------------------------------------------------------------------ prefill */

/* The prefill's KV-cache hook: each prompt's (roped) keys and values of layer l go to the cache
 * rows of the rows that continue it, its last token at slot Pmax - 1; the prompts attend to their
 * own keys and values. A prefill of one prompt alone (g->prefill_prompt) holds its n tokens
 * unpadded; a batched one holds every prompt left-padded to Pmax. */
static int copy_prompt_kv(void *ctx, int64_t l, const layer_acts *a, rx_tensor *keys, rx_tensor *values,
                          const rx_tensor **mask) {
  rx_generator *g = ctx;
  const rx_model_config *c = &g->m->cfg;
  const int64_t KD = c->num_key_value_heads * c->head_dim, es = rx_dtype_size(c->dtype);
  const int64_t row_bytes = g->S * KD * es, block = g->Pmax * KD * es;
  char *K = (char *)g->kcache + l * g->R * row_bytes, *Vc = (char *)g->vcache + l * g->R * row_bytes;
  const int64_t alone = g->prefill_prompt;
  for (int64_t r = 0; r < g->R; r++) {
    int64_t p = g->req.row_prompt[r];
    if (alone >= 0 && p != alone) continue;
    if (alone >= 0) {
      const int64_t n = g->req.prompt_offsets[p + 1] - g->req.prompt_offsets[p], at = (g->Pmax - n) * KD * es;
      TRY(dev_copy(g, K + r * row_bytes + at, a->k.data, n * KD));
      TRY(dev_copy(g, Vc + r * row_bytes + at, a->v.data, n * KD));
      continue;
    }
    TRY(dev_copy(g, K + r * row_bytes, (char *)a->k.data + p * block, g->Pmax * KD));
    TRY(dev_copy(g, Vc + r * row_bytes, (char *)a->v.data + p * block, g->Pmax * KD));
  }
  return RX_OK;
}

/* log p(token) under the unscaled distribution of a place's logits, in the compute dtype (so an
 * f64 model's log-probabilities are exact to f64 before the final rounding); mf = the row's
 * maximum, which the sampler found already (f32 only). */
static float token_logprob(const rx_generator *g, int64_t place, int32_t token, float mf) {
  const int64_t V = g->m->cfg.vocab_size;
  double mx = -INFINITY, s = 0;
  if (g->logits.dtype == RX_F64) {
    const double *x = (const double *)g->logits.data + place * V;
    for (int64_t i = 0; i < V; i++) mx = x[i] > mx ? x[i] : mx;
    for (int64_t i = 0; i < V; i++) s += exp(x[i] - mx);
    return (float)(x[token] - mx - log(s));
  }
  /* f32: vectorised passes, the exponentials in f32 (relative error <= 3e-7), summed in double */
  const float *x = g->logits_f32 + place * V;
  #pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < V; i++) s += (double)rx_exp_f32(x[i] - mf);
  return (float)((double)x[token] - mf - log(s));
}

/* The sampler reads f32 logits on the host: a CPU f32 model's in place, an f64 model's rounded
 * once here, a device model's (f32 or bf16) copied from the device as f32. */
static int logits_to_f32(rx_generator *g) {
  const int64_t V = g->m->cfg.vocab_size, n = g->active * V;
  if (g->logits.device != RX_CPU) {
    rx_tensor h;
    view2(&h, g->logits_f32, RX_F32, RX_CPU, g->active, V);
    return rx_tensor_copy(&h, &g->logits);
  }
  if (g->logits.dtype == RX_F32) return RX_OK;   /* logits_f32 points at them */
  for (int64_t i = 0; i < n; i++) g->logits_f32[i] = (float)((const double *)g->logits.data)[i];
  return RX_OK;
}

static int is_stop(const rx_generator *g, int32_t t) {
  for (int64_t i = 0; i < g->req.num_stop_ids; i++)
    if (g->req.stop_ids[i] == t) return 1;
  return 0;
}

/* A place's next token and its log-probability go to its row's result; the row ends on a stop
 * token or at its budget. */
static void record_token(rx_generator *g, int64_t place, int32_t tok, float logprob) {
  const int64_t r = g->place_row[place], n = g->res->lengths[r], cap = g->req.max_new_tokens;
  g->res->tokens[r * cap + n] = tok;
  g->res->logprobs[r * cap + n] = logprob;
  g->res->lengths[r] = (int32_t)(n + 1);
  g->current[place] = tok;
  if (is_stop(g, tok)) { g->done[place] = 1; g->res->finish[r] = RX_FINISH_STOP; }
  else if (n + 1 >= g->req.rows[r].max_new_tokens) { g->done[place] = 1; g->res->finish[r] = RX_FINISH_LENGTH; }
}

/* Samples the next token of every unfinished row from its place's logits and records it. */
static int choose_tokens(rx_generator *g) {
  const int64_t V = g->m->cfg.vocab_size;
  int status = RX_OK;
  #pragma omp parallel for schedule(dynamic, 1) num_threads(g->nthreads)
  for (int64_t place = 0; place < g->active; place++) {
    if (g->done[place]) continue;
    const int64_t r = g->place_row[place];
    const rx_sampling *s = &g->req.rows[r];
    const float *x = g->logits_f32 + place * V;
    int th = omp_get_thread_num();
    int32_t tok;
    int64_t n = g->res->lengths[r];
    double u = rx_sample_uniform(g->req.seed, s->key, g->prompt_len[place] + n);
    const float mx = row_max(x, V);   /* one pass, shared by the sampler and the log-probability */
    const float *xs = x;              /* what the sampler reads: the logits, or a penalised copy */
    float mxs = mx;
    if (penalty_on(s->repetition_penalty)) {
      float *pen = g->pen_buf + (int64_t)th * V;
      const int64_t p = g->req.row_prompt[r], a = g->req.prompt_offsets[p];
      const float penalty = (float)s->repetition_penalty;
      memcpy(pen, x, sizeof(float) * (size_t)V);
      penalize(pen, x, V, penalty, g->req.prompt_tokens + a, g->req.prompt_offsets[p + 1] - a);
      penalize(pen, x, V, penalty, g->res->tokens + r * g->req.max_new_tokens, n);
      xs = pen;
      mxs = row_max(pen, V);
    }
    int rc = sample_with(xs, V, mxs, s->temperature, s->top_k, s->top_p, s->min_p, u, g->sample_buf + (int64_t)th * V,
                         g->index_buf + (int64_t)th * V, g->cand_buf + (int64_t)th * V, &tok);
    if (rc) {
      #pragma omp critical
      status = rc;
      continue;
    }
    record_token(g, place, tok, token_logprob(g, place, tok, mx));
  }
  return status;
}

/* The device's sampler: every active place's settings go up, its token and log p come back. */
static int sample_on_device(rx_generator *g) {
  const rx_model_config *c = &g->m->cfg;
  const int64_t n = g->active, V = c->vocab_size;
  for (int64_t place = 0; place < n; place++) {
    const int64_t r = g->place_row[place];
    const rx_sampling *s = &g->req.rows[r];
    const int64_t position = g->prompt_len[place] + g->res->lengths[r];
    const int pen = !g->done[place] && penalty_on(s->repetition_penalty);
    g->h_rows[place] = (rx_cuda_sample_row){g->done[place] ? 0.0 : s->temperature, s->top_p, s->min_p, s->top_k,
                                            pen ? (float)s->repetition_penalty : 1.0f, s->key, position,
                                            r, pen ? position : 0};
  }
  rx_cuda_sample_row *d_rows = g->dsamp;
  int32_t *d_tok = (int32_t *)(d_rows + g->R);
  float *d_lp = (float *)(d_tok + g->R), *d_prob = d_lp + g->R;
  rx_tensor hr, dr, tok, lp, prob, htok, hlp;
  int64_t words = n * (int64_t)(sizeof(rx_cuda_sample_row) / 8);
  view2(&hr, g->h_rows, RX_I64, RX_CPU, words, 1);
  view2(&dr, d_rows, RX_I64, c->device, words, 1);
  TRY(rx_tensor_copy(&dr, &hr));
  int64_t s1[1] = {n};
  rx_view_init(&tok, d_tok, RX_I32, c->device, 1, s1);
  rx_view_init(&lp, d_lp, RX_F32, c->device, 1, s1);
  rx_view_init(&htok, g->h_tok, RX_I32, RX_CPU, 1, s1);
  rx_view_init(&hlp, g->h_tok + g->R, RX_F32, RX_CPU, 1, s1);
  view2(&prob, d_prob, RX_F32, c->device, n, V);
  rx_tensor seen, pen;
  if (g->d_seen) {
    view2(&seen, g->d_seen, RX_I32, c->device, g->R, g->S);
    view2(&pen, g->d_pen, RX_F32, c->device, n, V);
  }
  TRY(rx_sample_rows(&tok, &lp, &prob, &g->logits, d_rows, g->req.seed, g->d_seen ? &seen : NULL,
                     g->d_seen ? &pen : NULL));
  TRY(rx_tensor_copy(&htok, &tok));
  TRY(rx_tensor_copy(&hlp, &lp));
  const float *lps = (const float *)(g->h_tok + g->R);
  for (int64_t place = 0; place < n; place++) {
    if (g->done[place]) continue;
    if (g->h_tok[place] < 0)
      return rx_fail(RX_EINVAL, "sample: row %lld: logits have no finite maximum", (long long)g->place_row[place]);
    record_token(g, place, g->h_tok[place], lps[place]);
  }
  return RX_OK;
}

/* The logits of the active places (after a prefill or a step) to tokens, on the device or here. */
static int pick_tokens(rx_generator *g) {
  if (g->device_sampler) return sample_on_device(g);
  TRY(logits_to_f32(g));
  return choose_tokens(g);
}

static int check_request(rx_model *m, const rx_generate_request *q) {
  const int64_t V = m->cfg.vocab_size;
  if (q->num_prompts < 1 || q->num_rows < 1)
    return rx_fail(RX_EINVAL, "generate: need at least one prompt and one row (got %lld prompts, %lld rows)",
                   (long long)q->num_prompts, (long long)q->num_rows);
  if (q->max_new_tokens < 1) return rx_fail(RX_EINVAL, "generate: max_new_tokens = %lld must be >= 1", (long long)q->max_new_tokens);
  for (int64_t p = 0; p < q->num_prompts; p++) {
    int64_t a = q->prompt_offsets[p], b = q->prompt_offsets[p + 1];
    if (b <= a) return rx_fail(RX_EINVAL, "generate: prompt %lld is empty", (long long)p);
    for (int64_t i = a; i < b; i++)
      if (q->prompt_tokens[i] < 0 || q->prompt_tokens[i] >= V)
        return rx_fail(RX_EINVAL, "generate: prompt %lld, position %lld: token %d is outside the vocabulary [0, %lld)",
                       (long long)p, (long long)(i - a), q->prompt_tokens[i], (long long)V);
  }
  for (int64_t r = 0; r < q->num_rows; r++) {
    const rx_sampling *s = &q->rows[r];
    if (q->row_prompt[r] < 0 || q->row_prompt[r] >= q->num_prompts)
      return rx_fail(RX_EINVAL, "generate: row %lld continues prompt %lld of %lld", (long long)r,
                     (long long)q->row_prompt[r], (long long)q->num_prompts);
    char msg[128];
    if (sampling_problem(s, msg, sizeof msg)) return rx_fail(RX_EINVAL, "generate: row %lld: %s", (long long)r, msg);
    if (s->max_new_tokens < 1 || s->max_new_tokens > q->max_new_tokens)
      return rx_fail(RX_EINVAL, "generate: row %lld: max_new_tokens %d outside [1, %lld]", (long long)r,
                     s->max_new_tokens, (long long)q->max_new_tokens);
  }
  for (int64_t i = 0; i < q->num_stop_ids; i++)
    if (q->stop_ids[i] < 0 || q->stop_ids[i] >= V)
      return rx_fail(RX_EINVAL, "generate: stop token %d is outside the vocabulary [0, %lld)", q->stop_ids[i], (long long)V);
  return RX_OK;
}

void rx_generate_end(rx_generator *g) {
  if (!g) return;
  const int32_t dev = g->m->cfg.device;
  rx_arena_free(dev, g->kcache, g->kcache_handle);
  rx_arena_free(dev, g->vcache, g->vcache_handle);
  if (g->logits_f32 != g->logits.data) rx_free(g->logits_f32);   /* CPU f32: a view of the scratch */
  rx_arena_free(dev, g->scratch, g->scratch_handle);
  if (g->ids) rx_arena_free(dev, g->ids, g->ids_handle);
  if (g->dsamp) rx_arena_free(dev, g->dsamp, g->dsamp_handle);
  if (g->graph_of)
    for (int64_t i = 0; i <= g->R; i++) rx_graph_free(dev, g->graph_of[i]);
  free(g->graph_of);
  free(g->h_lens);
  if (g->d_part) rx_arena_free(dev, g->d_part, g->part_handle);
  free(g->h_rows);
  free(g->h_tok);
  free(g->cache_mask);
  free(g->step_mask);
  free(g->prompt_len);
  free(g->npos);
  if (g->move_buf) rx_arena_free(dev, g->move_buf, g->move_handle);
  free(g->positions);
  free(g->current);
  free(g->done);
  free(g->place_row);
  free(g->row_place);
  rx_free(g->sample_buf);
  rx_free(g->index_buf);
  rx_free(g->cand_buf);
  rx_free(g->pen_buf);
  if (g->d_seen) rx_arena_free(dev, g->d_seen, g->d_seen_handle);
  if (g->d_pen) rx_arena_free(dev, g->d_pen, g->d_pen_handle);
  free(g);
}

/* The buffers one generation call holds, in bytes: the KV cache, the decode step's activations
 * and logits with the sampler's per-thread buffers, and the prefill's activations. */
typedef struct { int64_t cache, decode, prefill, sampler; } generate_sizes;

static int device_sampler_on(const rx_model_config *c) {
  return c->device != RX_CPU && !rx_option_on(RX_OPT_HOST_SAMPLER);   /* engine option host_sampler */
}

static void generate_memory(const rx_model_config *c, int64_t R, int64_t P, int64_t Pmax, int64_t max_new,
                            int any_penalty, generate_sizes *z) {
  const int on_device = c->device != RX_CPU;
  const int64_t L = c->num_hidden_layers, C = c->hidden_size, I = c->intermediate_size, V = c->vocab_size;
  const int64_t H = c->num_attention_heads, KD = c->num_key_value_heads * c->head_dim, HD = H * c->head_dim;
  const int64_t es = rx_dtype_size(c->dtype), S = Pmax + max_new;
  const int64_t nthreads = rx_threads_cap();   /* per-thread scratch holds any count rx_threads_adapt picks */
  z->cache = 2 * L * R * S * KD * es;
  z->sampler = nthreads * V * (int64_t)(2 * sizeof(float) + sizeof(int32_t) + sizeof(cand));
  const int64_t penalty_bytes = device_sampler_on(c) && any_penalty ? R * S * 4 + R * V * 4 : 0;
  z->decode = R * (4 * C + 2 * HD + 2 * KD + 3 * I + H + 1) * es + R * V * es +
              (c->dtype == RX_F32 && !on_device ? 0 : R * V * 4) + z->sampler +   /* CPU f32 logits are sampled in place */
              penalty_bytes;
  z->prefill = P * Pmax * ((L + 4) * C + 2 * HD + 2 * KD + 3 * I + H + 8) * es + (32ll << 20);
}

int64_t rx_generate_memory_bytes(const rx_model_config *c, int64_t rows, int64_t prompts, int64_t max_prompt_tokens,
                                 int64_t max_new_tokens, int32_t penalties, int64_t *cache_bytes) {
  if (!c || rows < 0 || prompts < 0 || max_prompt_tokens < 0 || max_new_tokens < 0) return -1;
  generate_sizes z;
  generate_memory(c, rows, prompts, max_prompt_tokens, max_new_tokens, penalties != 0, &z);
  if (cache_bytes) *cache_bytes = z.cache;
  return z.cache + z.decode + z.prefill;
}

int rx_generate_begin(rx_generator **out, rx_model *m, const rx_generate_request *req, rx_generate_result *res) {
  *out = NULL;
  TRY(check_request(m, req));
  const rx_model_config *c = &m->cfg;
  const int on_device = c->device != RX_CPU;
  const int32_t st = rx_model_master_dtype(c);   /* rstd and lse: f32 for bf16 compute */
  const int64_t C = c->hidden_size, I = c->intermediate_size, V = c->vocab_size;
  const int64_t H = c->num_attention_heads, KD = c->num_key_value_heads * c->head_dim, HD = H * c->head_dim;
  const int64_t es = rx_dtype_size(c->dtype), R = req->num_rows, P = req->num_prompts;
  int64_t Pmax = 0;
  for (int64_t p = 0; p < P; p++) {
    int64_t n = req->prompt_offsets[p + 1] - req->prompt_offsets[p];
    if (n > Pmax) Pmax = n;
  }
  if (req->append_capacity < 0)
    return rx_fail(RX_EINVAL, "generate: append_capacity = %lld must be >= 0", (long long)req->append_capacity);
  const int64_t S = Pmax + req->max_new_tokens + req->append_capacity;
  if (S > c->max_position_embeddings && req->append_capacity == 0)
    return rx_fail(RX_EINVAL, "generate: prompt of %lld tokens + %lld new tokens exceeds max_position_embeddings = %lld",
                   (long long)Pmax, (long long)req->max_new_tokens, (long long)c->max_position_embeddings);
  if (S > c->max_position_embeddings)
    return rx_fail(RX_EINVAL, "generate: prompt of %lld tokens + %lld new tokens + append_capacity %lld exceeds "
                   "max_position_embeddings = %lld", (long long)Pmax, (long long)req->max_new_tokens,
                   (long long)req->append_capacity, (long long)c->max_position_embeddings);
  if (c->device == RX_CPU) rx_threads_adapt();   /* before the prefill: the cores other processes leave */
  /* size everything first, refuse before allocating */
  const int64_t nthreads = rx_threads_cap();   /* per-thread scratch holds any count rx_threads_adapt picks */
  int any_penalty = 0;   /* the device sampler then keeps each row's tokens and a penalised copy of its logits */
  for (int64_t r = 0; r < R; r++) any_penalty |= penalty_on(req->rows[r].repetition_penalty);
  generate_sizes z;
  generate_memory(c, R, P, Pmax, S - Pmax, any_penalty, &z);   /* S: new tokens and append_capacity */
  const int64_t cache = z.cache, decode = z.decode, prefill = z.prefill, sampler = z.sampler;
  const int64_t need = cache + decode + prefill;
  int64_t avail = available_memory();
  if (on_device && rx_device_available(c->device, &avail))   /* the cache and activations live on the device */
    return rx_fail_context(RX_EDEVICE, "generate");
  res->cache_bytes = cache;
  if (need > avail) {
    /* what would fit: the KV cache and decode buffers grow with the rows, the rest does not */
    const int64_t per_row = (cache + decode - sampler) / (R > 0 ? R : 1), room = avail - sampler - prefill;
    const int64_t fit = per_row > 0 && room > 0 ? room / per_row : 0;
    return rx_fail(RX_ENOMEM, "generate: %lld rows x %lld positions need a %.2f GiB KV cache plus %.2f GiB of activations, "
                   "but only %.2f GiB of %s is available: %lld rows of these prompts would fit at %lld positions "
                   "(fewer rows or generations per prompt, or a smaller max_new_tokens)", (long long)R, (long long)S,
                   gib(cache), gib(decode + prefill), gib(avail), on_device ? "device memory (cuda)" : "memory",
                   (long long)fit, (long long)S);
  }

  rx_generator *g = calloc(1, sizeof *g);
  if (!g) return rx_fail(RX_ENOMEM, "generate: out of memory");
  g->m = m;
  g->req = *req;
  g->res = res;
  g->R = R; g->P = P; g->Pmax = Pmax; g->S = S;
  g->nthreads = (int)nthreads;
  g->kcache = rx_arena_alloc(c->device, (size_t)(cache / 2), "KV cache", 1, &g->kcache_handle);
  g->vcache = g->kcache ? rx_arena_alloc(c->device, (size_t)(cache / 2), "KV cache", 1, &g->vcache_handle) : NULL;
  g->cache_mask = calloc((size_t)(R * S), sizeof(int32_t));
  g->step_mask = calloc((size_t)(R * S), sizeof(int32_t));
  g->prompt_len = calloc((size_t)R, sizeof(int32_t));
  g->npos = calloc((size_t)R, sizeof(int32_t));
  g->continuable = req->append_capacity > 0;
  if (g->continuable) {
    g->move_buf = rx_arena_alloc(c->device, (size_t)(S * KD * es), "KV cache (moving rows)", 0, &g->move_handle);
  }
  g->positions = calloc((size_t)R, sizeof(int32_t));
  g->current = calloc((size_t)R, sizeof(int32_t));
  g->done = calloc((size_t)R, sizeof(int32_t));
  g->place_row = calloc((size_t)R, sizeof(int32_t));
  g->row_place = calloc((size_t)R, sizeof(int32_t));
  g->logits_f32 = c->dtype == RX_F32 && !on_device ? NULL : rx_alloc((size_t)(R * V * 4), "logits");
  g->sample_buf = rx_alloc((size_t)(g->nthreads * V * 4), "sampler");
  g->index_buf = rx_alloc((size_t)(g->nthreads * V * 4), "sampler");
  g->cand_buf = rx_alloc((size_t)g->nthreads * (size_t)V * sizeof(cand), "sampler");
  g->pen_buf = rx_alloc((size_t)(g->nthreads * V * 4), "sampler");
  rx_tensor *views[] = {&g->x, &g->xn, &g->rstd, &g->q, &g->k, &g->v, &g->att, &g->tmp, &g->gate, &g->up, &g->h, &g->lse, &g->logits};
  int64_t cols[] = {C, C, 1, HD, KD, KD, HD, C, I, I, I, H, V};
  int32_t dts[] = {c->dtype, c->dtype, st, c->dtype, c->dtype, c->dtype, c->dtype, c->dtype, c->dtype, c->dtype, c->dtype, st, c->dtype};
  int64_t total = 0;
  for (size_t i = 0; i < sizeof cols / sizeof cols[0]; i++) total += (R * cols[i] * rx_dtype_size(dts[i]) + 63) & ~(int64_t)63;
  int alloc_ok = g->kcache && g->vcache;
  if (alloc_ok) g->scratch = rx_arena_alloc(c->device, (size_t)total + 64, "decode activations", 0, &g->scratch_handle);
  if (alloc_ok && on_device)
    g->ids = rx_arena_alloc(c->device, sizeof(int32_t) * (size_t)(3 * R + R * S), "decode ids", 1, &g->ids_handle);
  g->device_sampler = device_sampler_on(c);
  if (alloc_ok && g->device_sampler) {
    g->dsamp = rx_arena_alloc(c->device, sizeof(rx_cuda_sample_row) * (size_t)R + 8 * (size_t)R + 4 * (size_t)(R * V),
                              "sampler", 0, &g->dsamp_handle);
    g->h_rows = calloc((size_t)R, sizeof *g->h_rows);
    g->h_tok = calloc((size_t)(2 * R), sizeof(int32_t));
    alloc_ok = g->dsamp && g->h_rows && g->h_tok;
    if (alloc_ok && any_penalty) {
      g->d_seen = rx_arena_alloc(c->device, sizeof(int32_t) * (size_t)(R * S), "sampler (tokens so far)", 1,
                                 &g->d_seen_handle);
      g->d_pen = g->d_seen ? rx_arena_alloc(c->device, sizeof(float) * (size_t)(R * V), "sampler (penalised logits)", 0,
                                            &g->d_pen_handle) : NULL;
      alloc_ok = g->d_seen && g->d_pen;
    }
  }
  g->graphs = c->device == RX_CUDA && rx_option_on(RX_OPT_CUDA_GRAPHS);   /* engine option cuda_graphs */
  if (alloc_ok && g->graphs) {
    int64_t part = 0;   /* the chunks' scratch for the largest of the batch sizes the request passes through */
    for (int64_t b = 1; b <= R; b++) {
      int64_t sq[4] = {b, 1, H, c->head_dim}, sk[4] = {b, S, c->num_key_value_heads, c->head_dim};
      rx_tensor tq, tk;
      rx_view_init(&tq, NULL, c->dtype, c->device, 4, sq);
      rx_view_init(&tk, NULL, c->dtype, c->device, 4, sk);
      const int64_t n = rx_decode_attention_scratch(&tq, &tk);
      if (n > part) part = n;
    }
    g->d_part = rx_arena_alloc(c->device, sizeof(float) * (size_t)part, "decode attention chunks", 0, &g->part_handle);
    g->graph_of = calloc((size_t)(R + 1), sizeof(void *));
    g->h_lens = calloc((size_t)R, sizeof(int32_t));
    alloc_ok = g->d_part && g->graph_of && g->h_lens;
  }
  alloc_ok = alloc_ok && g->scratch && (!on_device || g->ids);
  if (g->continuable && !g->move_buf) alloc_ok = 0;
  if (!alloc_ok || !g->cache_mask || !g->step_mask || !g->prompt_len || !g->npos || !g->positions || !g->current ||
      !g->done || !g->place_row || !g->row_place || (!g->logits_f32 && (c->dtype != RX_F32 || on_device)) || !g->sample_buf ||
      !g->index_buf || !g->cand_buf || !g->pen_buf) {
    rx_generate_end(g);
    if (!alloc_ok) return rx_fail_context(RX_ENOMEM, "generate: a %.2f GiB KV cache and its decode buffers", gib(cache));
    return rx_fail(RX_ENOMEM, "generate: out of memory for the KV cache (%.2f GiB)", gib(cache));
  }
  if (g->d_seen) {   /* each row's prompt begins its tokens so far */
    int32_t *h = calloc((size_t)(R * S), sizeof(int32_t));
    int rc = h ? RX_OK : rx_fail(RX_ENOMEM, "generate: out of memory for the rows' tokens");
    for (int64_t r = 0; h && r < R; r++) {
      const int64_t p = req->row_prompt[r], a = req->prompt_offsets[p], n = req->prompt_offsets[p + 1] - a;
      memcpy(h + r * S, req->prompt_tokens + a, sizeof(int32_t) * (size_t)n);
    }
    if (!rc) rc = stage_ids(g, g->d_seen, h, R * S);
    free(h);
    if (rc) { rx_generate_end(g); return rc; }
  }
  char *at = g->scratch;
  for (size_t i = 0; i < sizeof cols / sizeof cols[0]; i++) {
    view2(views[i], at, dts[i], c->device, R, cols[i]);
    at += (R * cols[i] * rx_dtype_size(dts[i]) + 63) & ~(int64_t)63;
  }
  if (c->dtype == RX_F32 && !on_device) g->logits_f32 = g->logits.data;
  g->d_tok = on_device ? g->ids : g->current;
  g->d_pos = on_device ? g->ids + R : g->positions;
  g->d_mask = on_device ? g->ids + 2 * R : g->step_mask;
  g->d_lens = on_device ? g->ids + 2 * R + R * S : NULL;
  view2(&g->tok, g->d_tok, RX_I32, c->device, R, 1);
  g->tok.ndim = 1;
  g->active = R;
  for (int64_t r = 0; r < R; r++) {
    g->place_row[r] = g->row_place[r] = (int32_t)r;
    res->lengths[r] = 0;
    res->finish[r] = RX_FINISH_LENGTH;
    int64_t p = req->row_prompt[r], n = req->prompt_offsets[p + 1] - req->prompt_offsets[p];
    g->prompt_len[r] = g->npos[r] = (int32_t)n;
    for (int64_t t = Pmax - n; t < Pmax; t++) g->cache_mask[r * S + t] = 1;
  }

  /* prefill: each prompt once. On the CPU each prompt alone, so that its keys, values and first
   * logits are computed exactly as in a request of its own (the same GEMM shapes, no padding in
   * its attention): the prompts beside it change none of its bits (docs/generation.md). On a
   * device all prompts in one forward, left-padded to Pmax (its kernels depend on the batch's
   * shape anyway, and one forward launches fewer kernels). */
  rx_forward_opts fo = {0, 0, 0, 0};
  int rc = rx_model_refresh_work(m);   /* a bf16 model's working weights from its master */
  g->prefill_prompt = -1;
  if (!rc && !on_device) {
    const layer_kv kv = {copy_prompt_kv, g, NULL};
    rc = rx_model_plan(m, 1, Pmax, &fo);   /* the largest first: the arena is allocated once */
    for (int64_t p = 0; p < P && !rc; p++) {
      int64_t rows = 0;
      for (int64_t r = 0; r < R; r++) rows += req->row_prompt[r] == p;
      if (!rows) continue;   /* a prompt no row continues */
      const int64_t a = req->prompt_offsets[p], n = req->prompt_offsets[p + 1] - a;
      g->prefill_prompt = p;
      rc = rx_model_plan(m, 1, n, &fo);
      if (!rc) rc = rx_model_set_inputs(m, req->prompt_tokens + a, NULL);
      if (!rc) rc = rx_model_forward_hidden(m, &kv);
      /* the logits after the prompt: its last hidden state into the rows that continue it */
      const char *last = (const char *)m->plan.xf.data + (n - 1) * C * es;
      for (int64_t r = 0; r < R && !rc; r++)
        if (req->row_prompt[r] == p) memcpy((char *)g->xn.data + r * C * es, last, (size_t)(C * es));
    }
    g->prefill_prompt = -1;
  } else if (!rc) {
    rc = rx_model_plan(m, P, Pmax, &fo);
    int32_t *ptok = calloc((size_t)(P * Pmax), sizeof(int32_t)), *pmask = calloc((size_t)(P * Pmax), sizeof(int32_t));
    if (!rc && (!ptok || !pmask)) rc = rx_fail(RX_ENOMEM, "generate: out of memory for prompts");
    if (!rc) {
      for (int64_t p = 0; p < P; p++) {
        int64_t a = req->prompt_offsets[p], n = req->prompt_offsets[p + 1] - a;
        for (int64_t t = 0; t < n; t++) {
          ptok[p * Pmax + Pmax - n + t] = req->prompt_tokens[a + t];
          pmask[p * Pmax + Pmax - n + t] = 1;
        }
      }
      const layer_kv kv = {copy_prompt_kv, g, NULL};
      rc = rx_model_set_inputs(m, ptok, pmask);
      if (!rc) rc = rx_model_forward_hidden(m, &kv);
    }
    free(ptok);
    free(pmask);
    /* logits after each row's prompt: gather its prompt's last hidden state (so every row's
     * logits sit in its own row, as after a decode step) */
    for (int64_t r = 0; r < R && !rc; r++)
      rc = dev_copy(g, (char *)g->xn.data + r * C * es,
                    (char *)m->plan.xf.data + (req->row_prompt[r] * Pmax + Pmax - 1) * C * es, C);
  }
  /* one matmul over the rows, each row computed as alone (the rows beside it change no bits) */
  if (!rc) rc = rx_matmul_forward_rows(&g->logits, &g->xn, rx_model_w(m, m->lm_head), NULL);
  if (!rc) rc = pick_tokens(g);
  if (rc) { rx_generate_end(g); return rc; }
  g->generated = 1;
  g->slot = Pmax;
  *out = g;
  return RX_OK;
}

/* ------------------------------------------------------------------ decode */

/* A [active, Tk, KV, D] view of layer l's cache (batch stride S*KV*D). */
static void cache_view(rx_generator *g, rx_tensor *t, void *base, int64_t l, int64_t Tk) {
  const rx_model_config *c = &g->m->cfg;
  const int64_t KV = c->num_key_value_heads, D = c->head_dim, es = rx_dtype_size(c->dtype);
  int64_t shape[4] = {g->active, Tk, KV, D};
  rx_view_init(t, (char *)base + l * g->R * g->S * KV * D * es, c->dtype, c->device, 4, shape);
  t->stride[0] = g->S * KV * D;
}

/* A place whose row stopped and may continue (rx_generate_continue). */
static int paused(const rx_generator *g, int64_t place) {
  return g->continuable && g->done[place] && g->res->finish[g->place_row[place]] == RX_FINISH_STOP;
}

/* Two places trade their rows: caches (the filled slots), masks and state. */
static int swap_places(rx_generator *g, int64_t a, int64_t b) {
  if (a == b) return RX_OK;
  const rx_model_config *c = &g->m->cfg;
  const int64_t L = c->num_hidden_layers, KD = c->num_key_value_heads * c->head_dim, es = rx_dtype_size(c->dtype);
  const int64_t S = g->S, n = g->slot * KD, row = S * KD * es;
  for (int64_t l = 0; l < L; l++)
    for (int kv = 0; kv < 2; kv++) {
      char *base = (char *)(kv ? g->vcache : g->kcache) + l * g->R * row;
      TRY(dev_copy(g, g->move_buf, base + a * row, n));
      TRY(dev_copy(g, base + a * row, base + b * row, n));
      TRY(dev_copy(g, base + b * row, g->move_buf, n));
    }
  for (int64_t t = 0; t < S; t++) {
    int32_t x = g->cache_mask[a * S + t];
    g->cache_mask[a * S + t] = g->cache_mask[b * S + t];
    g->cache_mask[b * S + t] = x;
  }
  int32_t *per_place[] = {g->place_row, g->prompt_len, g->npos, g->current, g->done};
  for (size_t i = 0; i < sizeof per_place / sizeof per_place[0]; i++) {
    int32_t x = per_place[i][a];
    per_place[i][a] = per_place[i][b];
    per_place[i][b] = x;
  }
  g->row_place[g->place_row[a]] = (int32_t)a;
  g->row_place[g->place_row[b]] = (int32_t)b;
  return RX_OK;
}

/* The cache without its holes: every live place (active or paused) has its tokens moved, in order,
 * to the slots [F - npos, F) with F the most tokens any of them holds, and the next step writes slot
 * F. Keys and values are roped already and positions are kept per place, so nothing is recomputed;
 * attention sees the same keys in the same order. */
static int repack(rx_generator *g) {
  const rx_model_config *c = &g->m->cfg;
  const int64_t L = c->num_hidden_layers, KD = c->num_key_value_heads * c->head_dim, es = rx_dtype_size(c->dtype);
  const int64_t S = g->S, row = S * KD * es;
  int64_t F = 0;
  for (int64_t p = 0; p < g->R; p++)
    if (p < g->active || paused(g, p)) F = g->npos[p] > F ? g->npos[p] : F;
  for (int64_t p = 0; p < g->R; p++) {
    int32_t *mk = g->cache_mask + p * S;
    if (!(p < g->active || paused(g, p))) { memset(mk, 0, sizeof(int32_t) * (size_t)S); continue; }
    const int64_t n = g->npos[p], at = F - n;
    for (int64_t l = 0; l < L; l++)
      for (int kv = 0; kv < 2; kv++) {
        char *base = (char *)(kv ? g->vcache : g->kcache) + l * g->R * row + p * row;
        int64_t got = 0;
        for (int64_t t = 0; t < g->slot;) {   /* gather each run of real slots */
          if (!mk[t]) { t++; continue; }
          int64_t e = t;
          while (e < g->slot && mk[e]) e++;
          TRY(dev_copy(g, (char *)g->move_buf + got * KD * es, base + t * KD * es, (e - t) * KD));
          got += e - t;
          t = e;
        }
        if (got != n) return rx_fail(RX_EINVAL, "generate: repack: place %lld holds %lld tokens, expected %lld",
                                     (long long)p, (long long)got, (long long)n);
        if (n) TRY(dev_copy(g, base + at * KD * es, g->move_buf, n * KD));
      }
    memset(mk, 0, sizeof(int32_t) * (size_t)S);
    for (int64_t t = at; t < F; t++) mk[t] = 1;
  }
  g->slot = F;
  return RX_OK;
}

/* Places of rows that finished go past the active ones: the last active place moves into each
 * (its cache rows [0, filled), mask and state), so a step computes only the rows still decoding.
 * A row's numbers do not depend on its place, or on the rows beside it (rx_matmul_forward_rows),
 * so moving it changes none of its tokens. */
static int compact(rx_generator *g) {
  const rx_model_config *c = &g->m->cfg;
  const int64_t L = c->num_hidden_layers, KD = c->num_key_value_heads * c->head_dim, es = rx_dtype_size(c->dtype);
  const int64_t S = g->S, filled = g->slot;
  const int64_t row = S * KD * es;
  int64_t s = 0;
  while (s < g->active) {
    if (!g->done[s]) { s++; continue; }
    const int64_t last = --g->active;
    if (s == last || g->done[last]) continue;   /* the last place's row has finished too: it stays */
    if (paused(g, s)) {   /* a paused row keeps its cache: it trades places with the last active row */
      TRY(swap_places(g, s, last));
      continue;
    }
    for (int64_t l = 0; l < L; l++) {
      char *K = (char *)g->kcache + l * g->R * row, *Vc = (char *)g->vcache + l * g->R * row;
      TRY(dev_copy(g, K + s * row, K + last * row, filled * KD));
      TRY(dev_copy(g, Vc + s * row, Vc + last * row, filled * KD));
    }
    memcpy(g->cache_mask + s * S, g->cache_mask + last * S, sizeof(int32_t) * (size_t)S);
    const int32_t finished = g->place_row[s], moved = g->place_row[last];
    g->place_row[s] = moved;
    g->row_place[moved] = (int32_t)s;
    g->place_row[last] = finished;
    g->row_place[finished] = (int32_t)last;
    g->prompt_len[s] = g->prompt_len[last];
    g->npos[s] = g->npos[last];
    g->current[s] = g->current[last];
    g->done[s] = 0;               /* the row moved in is decoding (finished ones stay at the end) */
    g->done[last] = 1;
  }
  return RX_OK;
}

/* The decode activations as views of their first n rows. */
static void set_rows(rx_generator *g, int64_t n) {
  rx_tensor *views[] = {&g->x, &g->xn, &g->rstd, &g->q, &g->k, &g->v, &g->att, &g->tmp, &g->gate, &g->up, &g->h,
                        &g->lse, &g->logits, &g->tok};
  for (size_t i = 0; i < sizeof views / sizeof views[0]; i++) {
    views[i]->shape[0] = n;
    views[i]->numel = views[i]->ndim == 1 ? n : n * views[i]->shape[1];
  }
}

/* The decode step's KV-cache hook: the new token's keys and values of layer l go to each row's
 * cache slot, and the attention reads the cache up to that slot (the step's mask says which of
 * its slots each row may see). */
static int append_kv(void *ctx, int64_t l, const layer_acts *a, rx_tensor *keys, rx_tensor *values,
                     const rx_tensor **mask) {
  rx_generator *g = ctx;
  const rx_model_config *c = &g->m->cfg;
  const int64_t KD = c->num_key_value_heads * c->head_dim, es = rx_dtype_size(c->dtype), S = g->S;
  const int64_t idx = g->step_slot;
  char *K = (char *)g->kcache + l * g->R * S * KD * es, *Vc = (char *)g->vcache + l * g->R * S * KD * es;
  if (c->device == RX_CPU) {
    for (int64_t r = 0; r < g->active; r++) {
      memcpy(K + (r * S + idx) * KD * es, (char *)a->k.data + r * KD * es, (size_t)(KD * es));
      memcpy(Vc + (r * S + idx) * KD * es, (char *)a->v.data + r * KD * es, (size_t)(KD * es));
    }
  } else {   /* one strided copy per tensor: row r's slot idx is S*KD elements after row r-1's */
    rx_tensor dk, dv, sk, sv;
    view2(&dk, K + idx * KD * es, c->dtype, c->device, g->active, KD);
    view2(&dv, Vc + idx * KD * es, c->dtype, c->device, g->active, KD);
    dk.stride[0] = dv.stride[0] = S * KD;
    view2(&sk, a->k.data, c->dtype, c->device, g->active, KD);
    view2(&sv, a->v.data, c->dtype, c->device, g->active, KD);
    TRY(rx_tensor_copy(&dk, &sk));
    TRY(rx_tensor_copy(&dv, &sv));
  }
  cache_view(g, keys, g->kcache, l, idx + 1);
  cache_view(g, values, g->vcache, l, idx + 1);
  return RX_OK;
}

/* The decoder layer's activations for the R active rows, as views of the decode scratch: one
 * token per row ([R, 1, heads, D] for attention), both norms sharing xn and rstd, x_mid in tmp,
 * and Qwen3's q/k norm in place (q_raw aliases q, no rstd kept). */
static void decode_acts(rx_generator *g, layer_acts *a, int64_t R) {
  const rx_model_config *c = &g->m->cfg;
  const int64_t H = c->num_attention_heads, KV = c->num_key_value_heads, D = c->head_dim;
  const int32_t dt = c->dtype, dev = c->device;
  int64_t s4q[4] = {R, 1, H, D}, s4k[4] = {R, 1, KV, D}, s3[3] = {R, H, 1}, sqr[2] = {R * H, D}, skr[2] = {R * KV, D};
  memset(a, 0, sizeof *a);
  a->rstd1 = a->rstd2 = g->rstd;
  a->xn1 = a->xn2 = g->xn;
  a->q = a->q_raw = g->q;
  a->k = a->k_raw = g->k;
  a->v = g->v;
  a->att = g->att;
  a->x_mid = g->tmp;
  a->gate = g->gate;
  a->up = g->up;
  a->h = g->h;
  rx_view_init(&a->q4, g->q.data, dt, dev, 4, s4q);
  rx_view_init(&a->k4, g->k.data, dt, dev, 4, s4k);
  rx_view_init(&a->v4, g->v.data, dt, dev, 4, s4k);
  rx_view_init(&a->att4, g->att.data, dt, dev, 4, s4q);
  rx_view_init(&a->lse, g->lse.data, g->lse.dtype, dev, 3, s3);
  rx_view_init(&a->q_rows, g->q.data, dt, dev, 2, sqr);
  rx_view_init(&a->k_rows, g->k.data, dt, dev, 2, skr);
  a->q_raw_rows = a->q_rows;
  a->k_raw_rows = a->k_rows;
}

/* The graph-stable hooks: the new keys and values go to each place's slot lens - 1 (read on the
 * device), and the attention reads the whole cache up to each place's length. */
static int append_kv_lens(void *ctx, int64_t l, const layer_acts *a, rx_tensor *keys, rx_tensor *values,
                          const rx_tensor **mask) {
  rx_generator *g = ctx;
  cache_view(g, keys, g->kcache, l, g->S);
  cache_view(g, values, g->vcache, l, g->S);
  TRY(rx_kv_append(keys, values, &a->k, &a->v, &g->lens_t));
  *mask = &g->gmask;
  return RX_OK;
}

static int attention_lens(void *ctx, int64_t l, layer_acts *a, const rx_tensor *keys, const rx_tensor *values,
                          const rx_tensor *mask) {
  rx_generator *g = ctx;
  return rx_decode_attention_lens(&a->att4, &a->lse, &a->q4, keys, values, mask, &g->lens_t, g->d_part);
}

/* The decode step after the embedding: every layer, the final norm and the head. */
static int decode_body(rx_generator *g, layer_acts *acts, const layer_io *io) {
  rx_model *m = g->m;
  for (int64_t l = 0; l < m->cfg.num_hidden_layers; l++) TRY(rx_model_layer(m, l, acts, io));
  TRY(rx_rmsnorm_forward(&g->xn, &g->rstd, &g->x, rx_model_w(m, m->final_norm), m->cfg.rms_norm_eps));
  return rx_model_matmul(m, &g->logits, &g->xn, rx_model_w(m, m->lm_head), NULL);
}

/* The step as a CUDA graph: the ids staged, the embedding launched as usual (its token check
 * synchronises), then the graph of this batch size, captured on its first use. */
static int graph_step(rx_generator *g, layer_acts *acts, const rx_tensor *pos) {
  rx_model *m = g->m;
  const rx_model_config *c = &m->cfg;
  const int64_t R = g->active, S = g->S;
  for (int64_t r = 0; r < R; r++) g->h_lens[r] = (int32_t)(g->step_slot + 1);
  TRY(stage_ids(g, g->d_mask, g->cache_mask, R * S));
  TRY(stage_ids(g, g->d_lens, g->h_lens, R));
  int64_t s2[2] = {R, S}, s1[1] = {R};
  rx_view_init(&g->gmask, g->d_mask, RX_I32, c->device, 2, s2);
  rx_view_init(&g->lens_t, g->d_lens, RX_I32, c->device, 1, s1);
  TRY(rx_embedding_forward(&g->x, &g->tok, rx_model_w(m, m->embed)));
  if (!g->graph_of[R]) {
    const layer_kv kv = {append_kv_lens, g, attention_lens};
    const layer_io io = {&g->x, &g->x, pos, &g->gmask, &kv, NULL};
    g->graph_refused = 1;   /* until the capture succeeds: nothing ran, the step can run plainly */
    TRY(rx_graph_begin(c->device));
    const int rc = decode_body(g, acts, &io);
    void *exec = NULL;
    const int rc_end = rx_graph_end(c->device, &exec);   /* always: the stream leaves capture */
    if (rc || rc_end) {
      rx_graph_free(c->device, exec);
      return rc ? rc : rc_end;
    }
    g->graph_refused = 0;
    g->graph_of[R] = exec;
  }
  return rx_graph_launch(c->device, g->graph_of[R]);
}

int rx_generate_step(rx_generator *g, int32_t *done) {
  TRY(compact(g));
  if (g->active == 0 || (!g->continuable && g->generated >= g->req.max_new_tokens)) { *done = 1; return RX_OK; }
  if (g->m->cfg.device == RX_CPU) rx_threads_adapt();   /* the cores other processes leave */
  if (g->slot >= g->S) TRY(repack(g));
  if (g->slot >= g->S) {   /* the cache is full even without holes: the rows decoding end at their length */
    for (int64_t r = 0; r < g->active; r++) g->done[r] = 1, g->res->finish[g->place_row[r]] = RX_FINISH_LENGTH;
    *done = 1;
    return RX_OK;
  }
  set_rows(g, g->active);
  rx_model *m = g->m;
  const rx_model_config *c = &m->cfg;
  const int64_t R = g->active, S = g->S;
  const int64_t idx = g->slot, Tk = idx + 1;   /* cache slot of the newest token */
  for (int64_t r = 0; r < R; r++) {
    g->cache_mask[r * S + idx] = 1;
    g->positions[r] = g->npos[r];
  }
  g->step_slot = idx;
  int64_t s2m[2] = {R, Tk}, s1[1] = {R};
  rx_tensor mask, pos;
  layer_acts acts;
  TRY(stage_ids(g, g->d_tok, g->current, R));
  TRY(stage_ids(g, g->d_pos, g->positions, R));
  rx_view_init(&pos, g->d_pos, RX_I32, c->device, 1, s1);
  decode_acts(g, &acts, R);
  int plain = !g->graphs;
  if (g->graphs) {
    const int rc = graph_step(g, &acts, &pos);
    /* a device that cannot capture the step (a CUDA error during capture) decodes without graphs */
    if (rc && g->graph_refused) g->graphs = 0, plain = 1;
    else if (rc) return rc;
  }
  if (plain) {
    for (int64_t r = 0; r < R; r++) memcpy(g->step_mask + r * Tk, g->cache_mask + r * S, sizeof(int32_t) * (size_t)Tk);
    TRY(stage_ids(g, g->d_mask, g->step_mask, R * Tk));
    rx_view_init(&mask, g->d_mask, RX_I32, c->device, 2, s2m);
    const layer_kv kv = {append_kv, g, NULL};
    const layer_io io = {&g->x, &g->x, &pos, &mask, &kv, NULL};
    TRY(rx_embedding_forward(&g->x, &g->tok, rx_model_w(m, m->embed)));
    m->rows_alone = 1;   /* every row's matmuls as alone: the rows beside it change no bits */
    const int rc = decode_body(g, &acts, &io);
    m->rows_alone = 0;
    TRY(rc);
  }
  for (int64_t r = 0; r < R; r++) g->npos[r]++;
  g->slot++;
  TRY(pick_tokens(g));
  g->generated++;
  g->res->decode_steps++;
  int all = 1;
  for (int64_t r = 0; r < R; r++) all &= g->done[r];
  *done = all || (!g->continuable && g->generated >= g->req.max_new_tokens);
  return RX_OK;
}

int rx_generate_stop_row(rx_generator *g, int64_t row) {
  if (!g || row < 0 || row >= g->R)
    return rx_fail(RX_EINVAL, "generate: stop_row: row %lld outside [0, %lld)", (long long)row, (long long)(g ? g->R : 0));
  const int64_t place = g->row_place[row];
  if (!g->done[place]) {
    g->done[place] = 1;
    g->res->finish[row] = RX_FINISH_STOP;
  }
  return RX_OK;
}

/* The continuation's KV-cache hook: the keys and values of the Kmax new slots of each continuing
 * row (places base + b) go to cache slots [slot, slot + Kmax); the attention reads those rows'
 * caches up to slot + Kmax, with their cache masks (padding and the holes of other turns off). */
typedef struct { rx_generator *g; int64_t base, B, K; rx_tensor mask; } cont_ctx;

static int continue_kv(void *ctx, int64_t l, const layer_acts *a, rx_tensor *keys, rx_tensor *values,
                       const rx_tensor **mask) {
  cont_ctx *cc = ctx;
  rx_generator *g = cc->g;
  const rx_model_config *c = &g->m->cfg;
  const int64_t KV = c->num_key_value_heads, D = c->head_dim, KD = KV * D, es = rx_dtype_size(c->dtype), S = g->S;
  const int64_t row = S * KD * es, layer = l * g->R * row;
  for (int64_t b = 0; b < cc->B; b++) {
    const int64_t to = (cc->base + b) * row + g->slot * KD * es, from = b * cc->K * KD * es;
    TRY(dev_copy(g, (char *)g->kcache + layer + to, (const char *)a->k.data + from, cc->K * KD));
    TRY(dev_copy(g, (char *)g->vcache + layer + to, (const char *)a->v.data + from, cc->K * KD));
  }
  int64_t shape[4] = {cc->B, g->slot + cc->K, KV, D};
  rx_view_init(keys, (char *)g->kcache + layer + cc->base * row, c->dtype, c->device, 4, shape);
  rx_view_init(values, (char *)g->vcache + layer + cc->base * row, c->dtype, c->device, 4, shape);
  keys->stride[0] = values->stride[0] = S * KD;
  *mask = &cc->mask;
  return RX_OK;
}

int rx_generate_continue(rx_generator *g, int64_t n, const int64_t *rows, const int32_t *tokens, const int64_t *offsets) {
  if (!g) return rx_fail(RX_EINVAL, "generate: continue: no generator");
  if (!g->continuable)
    return rx_fail(RX_EINVAL, "generate: continue: the request has append_capacity = 0, so its rows cannot continue "
                   "(give it room for the tokens to append)");
  if (n < 1) return RX_OK;
  rx_model *m = g->m;
  const rx_model_config *c = &m->cfg;
  const int64_t V = c->vocab_size, C = c->hidden_size, es = rx_dtype_size(c->dtype), S = g->S;
  for (int64_t i = 0; i < n; i++) {
    const int64_t r = rows[i];
    if (r < 0 || r >= g->R)
      return rx_fail(RX_EINVAL, "generate: continue: row %lld outside [0, %lld)", (long long)r, (long long)g->R);
    for (int64_t j = 0; j < i; j++)
      if (rows[j] == r) return rx_fail(RX_EINVAL, "generate: continue: row %lld is listed twice", (long long)r);
    if (!paused(g, g->row_place[r]))
      return rx_fail(RX_EINVAL, "generate: continue: row %lld is not paused (only a row that stopped, on a stop token "
                     "or rx_generate_stop_row, continues; finish %d)", (long long)r, g->res->finish[r]);
    if (g->res->lengths[r] >= g->req.rows[r].max_new_tokens)
      return rx_fail(RX_EINVAL, "generate: continue: row %lld has used its budget of %d new tokens", (long long)r,
                     g->req.rows[r].max_new_tokens);
    if (offsets[i + 1] < offsets[i])
      return rx_fail(RX_EINVAL, "generate: continue: offsets[%lld] = %lld is below offsets[%lld] = %lld", (long long)(i + 1),
                     (long long)offsets[i + 1], (long long)i, (long long)offsets[i]);
    for (int64_t t = offsets[i]; t < offsets[i + 1]; t++)
      if (tokens[t] < 0 || tokens[t] >= V)
        return rx_fail(RX_EINVAL, "generate: continue: row %lld: token %d is outside the vocabulary [0, %lld)",
                       (long long)r, tokens[t], (long long)V);
  }
  TRY(compact(g));   /* the paused rows go past the active ones, caches kept */
  const int64_t base = g->active;
  int64_t B = 0, K = 0;
  int64_t *order = calloc((size_t)n, sizeof(int64_t));   /* the rows that fit, in the order given */
  if (!order) return rx_fail(RX_ENOMEM, "generate: continue: out of memory");
  for (int pass = 0; pass < 2; pass++) {   /* a second pass after repacking, when the cache is short */
    K = 0;
    for (int64_t i = 0; i < n; i++) {
      const int64_t k = 1 + offsets[i + 1] - offsets[i];
      if (g->slot + k <= S && k > K) K = k;
    }
    int64_t full = 0;
    for (int64_t i = 0; i < n; i++) full |= g->slot + 1 + offsets[i + 1] - offsets[i] > S;
    if (!full || pass == 1) break;
    int rc = repack(g);
    if (rc) { free(order); return rc; }
  }
  for (int64_t i = 0; i < n; i++) {
    const int64_t r = rows[i], k = 1 + offsets[i + 1] - offsets[i];
    if (g->slot + k > S) {   /* no room even without holes: the episode ends at its length */
      g->res->finish[r] = RX_FINISH_LENGTH;
      continue;
    }
    int rc = swap_places(g, g->row_place[r], base + B);
    if (rc) { free(order); return rc; }
    order[B++] = i;
  }
  if (B == 0) { free(order); return RX_OK; }
  /* the batch: row b's last token and appended tokens, right-aligned in K columns */
  int32_t *ptok = calloc((size_t)(B * K), sizeof(int32_t)), *pmask = calloc((size_t)(B * K), sizeof(int32_t));
  int32_t *shift = calloc((size_t)B, sizeof(int32_t));
  int rc = ptok && pmask && shift ? RX_OK : rx_fail(RX_ENOMEM, "generate: continue: out of memory");
  for (int64_t b = 0; !rc && b < B; b++) {
    const int64_t i = order[b], place = base + b, k = 1 + offsets[i + 1] - offsets[i], at = K - k;
    ptok[b * K + at] = g->current[place];
    for (int64_t t = 1; t < k; t++) ptok[b * K + at + t] = tokens[offsets[i] + t - 1];
    for (int64_t t = at; t < K; t++) pmask[b * K + t] = 1, g->cache_mask[place * S + g->slot + t] = 1;
    shift[b] = g->npos[place];
  }
  const int64_t Tk = g->slot + K;
  cont_ctx cc = {g, base, B, K, {0}};
  rx_forward_opts fo = {0, 0, 0, 0};
  if (!rc) {
    for (int64_t b = 0; b < B; b++)
      memcpy(g->step_mask + b * Tk, g->cache_mask + (base + b) * S, sizeof(int32_t) * (size_t)Tk);
    rc = stage_ids(g, g->d_mask, g->step_mask, B * Tk);
    int64_t s2[2] = {B, Tk};
    rx_view_init(&cc.mask, g->d_mask, RX_I32, c->device, 2, s2);
  }
  if (!rc) rc = rx_model_plan(m, B, K, &fo);
  if (!rc) rc = rx_model_set_inputs(m, ptok, pmask);
  if (!rc) rc = rx_model_shift_positions(m, shift);
  const layer_kv kv = {continue_kv, &cc, NULL};
  if (!rc) rc = rx_model_forward_hidden(m, &kv);
  free(ptok);
  free(pmask);
  free(shift);
  if (rc) { free(order); return rc; }
  for (int64_t b = 0; b < B; b++) {
    const int64_t i = order[b], place = base + b;
    g->npos[place] += (int32_t)(1 + offsets[i + 1] - offsets[i]);
    g->done[place] = 0;
    g->res->finish[g->place_row[place]] = RX_FINISH_LENGTH;
  }
  free(order);
  g->slot += K;
  g->active = base + B;
  set_rows(g, g->active);
  /* logits after each row's last appended token, into the rows of its place */
  for (int64_t b = 0; b < B; b++)
    TRY(dev_copy(g, (char *)g->xn.data + (base + b) * C * es, (char *)m->plan.xf.data + (b * K + K - 1) * C * es, C));
  rx_tensor xs, ls;
  view2(&xs, (char *)g->xn.data + base * C * es, c->dtype, c->device, B, C);
  view2(&ls, (char *)g->logits.data + base * V * es, c->dtype, c->device, B, V);
  TRY(rx_matmul_forward(&ls, &xs, rx_model_w(m, m->lm_head), NULL));
  /* only the continuing rows pick a token: the others sit out as if finished */
  int32_t *was = malloc(sizeof(int32_t) * (size_t)(base > 0 ? base : 1));
  if (!was) return rx_fail(RX_ENOMEM, "generate: continue: out of memory");
  for (int64_t p = 0; p < base; p++) was[p] = g->done[p], g->done[p] = 1;
  rc = pick_tokens(g);
  for (int64_t p = 0; p < base; p++) g->done[p] = was[p];
  free(was);
  return rc;
}

const rx_tensor *rx_generate_logits(const rx_generator *g) { return &g->logits; }

int64_t rx_generate_batch_index(const rx_generator *g, int64_t row) {
  return row >= 0 && row < g->R ? g->row_place[row] : -1;
}

int rx_model_generate(rx_model *m, const rx_generate_request *req, rx_generate_result *res) {
  rx_generator *g;
  res->decode_steps = 0;
  TRY(rx_generate_begin(&g, m, req, res));
  int32_t done = 0;
  int rc = RX_OK;
  while (!rc && !done) rc = rx_generate_step(g, &done);
  rx_generate_end(g);
  return rc;
}

/* ------------------------------------------------------------------ reference */

int rx_model_next_logits(rx_model *m, const rx_tensor *tokens, const rx_tensor *mask, rx_tensor *out) {
  int64_t B = 0, T = 0;
  char a[96];
  TRY(rx_model_check_tokens(m, tokens, mask, &B, &T));
  const rx_model_config *c = &m->cfg;
  if (rx_check_tensor(out, "next_logits", "out", 2) || out->shape[0] != B || out->shape[1] != c->vocab_size ||
      out->dtype != c->dtype || out->device != c->device)
    return rx_fail(RX_EINVAL, "next_logits: out must be %s [%lld,%lld] on the model's device %d, got %s on device %d",
                   rx_dtype_name(c->dtype), (long long)B, (long long)c->vocab_size, c->device, rx_shape_str(out, a, sizeof a),
                   out->device);
  rx_forward_opts fo = {0, 0, 0, 0};
  TRY(rx_model_refresh_work(m));
  TRY(rx_model_plan(m, B, T, &fo));
  TRY(rx_model_set_inputs(m, tokens->data, mask ? mask->data : NULL));
  TRY(rx_model_forward_hidden(m, NULL));
  const int64_t C = c->hidden_size, es = rx_dtype_size(c->dtype);
  const int32_t *msk = m->plan.h_mask;
  for (int64_t b = 0; b < B; b++) {
    int64_t last = -1;
    for (int64_t t = 0; t < T; t++)
      if (msk[b * T + t]) last = t;
    if (last < 0) return rx_fail(RX_EINVAL, "next_logits: row %lld has no token", (long long)b);
    rx_tensor x, y;
    view2(&x, (char *)m->plan.xf.data + (b * T + last) * C * es, c->dtype, c->device, 1, C);
    view2(&y, (char *)out->data + b * c->vocab_size * es, c->dtype, c->device, 1, c->vocab_size);
    TRY(rx_matmul_forward(&y, &x, rx_model_w(m, m->lm_head), NULL));
  }
  return RX_OK;
}
