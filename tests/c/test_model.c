/* test_model.c: the whole decoder against a naive reference written here with plain loops
 * (full logits, O(T^2) attention), and its gradients against central finite differences. */
#include "check.h"

typedef struct { int64_t B, T; const int32_t *tokens, *mask; } batch;

static rx_model_config tiny_config(int qwen, int tied, int kv_heads) {
  return check_tiny_config(qwen, tied, kv_heads, qwen ? 1000000.0 : 10000.0);
}

static const double *P(rx_model *m, const char *fmt, int64_t l) {
  char name[128];
  snprintf(name, sizeof name, fmt, (long long)l);
  int64_t i = rx_model_find_param(m, name);
  return i < 0 ? NULL : rx_model_param(m, i)->data;
}

/* y[n] = W[n, k] x[k] (+ b) */
static void ref_linear(double *y, const double *x, const double *W, const double *b, int64_t out, int64_t in) {
  for (int64_t o = 0; o < out; o++) {
    double s = b ? b[o] : 0;
    for (int64_t i = 0; i < in; i++) s += W[o * in + i] * x[i];
    y[o] = s;
  }
}

static void ref_rmsnorm(double *y, const double *x, const double *w, int64_t C, double eps) {
  double ss = 0;
  for (int64_t i = 0; i < C; i++) ss += x[i] * x[i];
  double r = 1 / sqrt(ss / C + eps);
  for (int64_t i = 0; i < C; i++) y[i] = x[i] * r * w[i];
}

/* inv_freq as transformers computes it: theta^(-2i/D), then for rope_type "llama3" every
 * frequency scaled, the smoothed blend computed for all, and each picked by its wavelength
 * (the torch.where formulation of _compute_llama3_parameters). */
static void ref_inv_freq(double *f, const rx_model_config *c) {
  const int64_t D = c->head_dim;
  for (int64_t i = 0; i < D / 2; i++) f[i] = 1.0 / pow(c->rope_theta, (double)(2 * i) / (double)D);
  if (c->rope_scaling != RX_ROPE_LLAMA3) return;
  const double old = (double)c->rope_original_max_position_embeddings, lo = c->rope_low_freq_factor;
  const double hi = c->rope_high_freq_factor, factor = c->rope_factor;
  for (int64_t i = 0; i < D / 2; i++) {
    double wavelen = 2 * 3.141592653589793 / f[i];
    double scaled = wavelen > old / lo ? f[i] / factor : f[i];
    double smooth = (old / wavelen - lo) / (hi - lo);
    double smoothed = (1 - smooth) * scaled / factor + smooth * scaled;
    int medium = !(wavelen < old / hi) && !(wavelen > old / lo);
    f[i] = medium ? smoothed : scaled;
  }
}

static void ref_rope(double *x, int64_t heads, int64_t D, int64_t pos, const double *inv_freq) {
  for (int64_t h = 0; h < heads; h++)
    for (int64_t i = 0; i < D / 2; i++) {
      double f = pos * inv_freq[i], c = cos(f), s = sin(f);
      double a = x[h * D + i], b = x[h * D + i + D / 2];
      x[h * D + i] = a * c - b * s;
      x[h * D + i + D / 2] = b * c + a * s;
    }
}

/* Full forward of one row with everything materialised; returns log p of each next token. */
static void ref_logprobs(rx_model *m, const rx_model_config *c, const int32_t *tok, const int32_t *mask, int64_t T, double *out) {
  const int64_t C = c->hidden_size, I = c->intermediate_size, H = c->num_attention_heads, KV = c->num_key_value_heads;
  const int64_t D = c->head_dim, V = c->vocab_size, HD = H * D, KD = KV * D;
  double *x = calloc((size_t)(T * C), sizeof(double)), *xn = malloc(sizeof(double) * C);
  double *q = calloc((size_t)(T * HD), sizeof(double)), *k = calloc((size_t)(T * KD), sizeof(double));
  double *v = calloc((size_t)(T * KD), sizeof(double)), *att = calloc((size_t)(T * HD), sizeof(double));
  double *g = malloc(sizeof(double) * I), *u = malloc(sizeof(double) * I), *tmp = malloc(sizeof(double) * C);
  double *logits = malloc(sizeof(double) * V), *scores = malloc(sizeof(double) * T);
  int64_t *pos = calloc((size_t)T, sizeof(int64_t)), count = 0;
  for (int64_t t = 0; t < T; t++) pos[t] = mask[t] ? count++ : 0;
  double inv_freq[64];
  ref_inv_freq(inv_freq, c);
  const double *E = P(m, "model.embed_tokens.weight", 0);
  for (int64_t t = 0; t < T; t++)
    for (int64_t i = 0; i < C; i++) x[t * C + i] = mask[t] ? E[tok[t] * C + i] : E[i];
  for (int64_t l = 0; l < c->num_hidden_layers; l++) {
    for (int64_t t = 0; t < T; t++) {
      ref_rmsnorm(xn, x + t * C, P(m, "model.layers.%lld.input_layernorm.weight", l), C, c->rms_norm_eps);
      ref_linear(q + t * HD, xn, P(m, "model.layers.%lld.self_attn.q_proj.weight", l), P(m, "model.layers.%lld.self_attn.q_proj.bias", l), HD, C);
      ref_linear(k + t * KD, xn, P(m, "model.layers.%lld.self_attn.k_proj.weight", l), P(m, "model.layers.%lld.self_attn.k_proj.bias", l), KD, C);
      ref_linear(v + t * KD, xn, P(m, "model.layers.%lld.self_attn.v_proj.weight", l), P(m, "model.layers.%lld.self_attn.v_proj.bias", l), KD, C);
      const double *qn = P(m, "model.layers.%lld.self_attn.q_norm.weight", l);
      const double *kn = P(m, "model.layers.%lld.self_attn.k_norm.weight", l);
      for (int64_t h = 0; qn && h < H; h++) ref_rmsnorm(q + t * HD + h * D, q + t * HD + h * D, qn, D, c->rms_norm_eps);
      for (int64_t h = 0; kn && h < KV; h++) ref_rmsnorm(k + t * KD + h * D, k + t * KD + h * D, kn, D, c->rms_norm_eps);
      ref_rope(q + t * HD, H, D, pos[t], inv_freq);
      ref_rope(k + t * KD, KV, D, pos[t], inv_freq);
    }
    for (int64_t t = 0; t < T; t++)
      for (int64_t h = 0; h < H; h++) {
        int64_t kh = h / (H / KV);
        double mx = -INFINITY, sum = 0;
        for (int64_t s = 0; s <= t; s++) {
          scores[s] = -INFINITY;
          if (!mask[s] || !mask[t]) continue;
          double d = 0;
          for (int64_t i = 0; i < D; i++) d += q[t * HD + h * D + i] * k[s * KD + kh * D + i];
          scores[s] = d / sqrt((double)D);
          if (scores[s] > mx) mx = scores[s];
        }
        for (int64_t i = 0; i < D; i++) att[t * HD + h * D + i] = 0;
        if (mx == -INFINITY) continue;
        for (int64_t s = 0; s <= t; s++) sum += scores[s] == -INFINITY ? 0 : exp(scores[s] - mx);
        for (int64_t s = 0; s <= t; s++) {
          if (scores[s] == -INFINITY) continue;
          double p = exp(scores[s] - mx) / sum;
          for (int64_t i = 0; i < D; i++) att[t * HD + h * D + i] += p * v[s * KD + kh * D + i];
        }
      }
    for (int64_t t = 0; t < T; t++) {
      ref_linear(tmp, att + t * HD, P(m, "model.layers.%lld.self_attn.o_proj.weight", l), NULL, C, HD);
      for (int64_t i = 0; i < C; i++) x[t * C + i] += tmp[i];
      ref_rmsnorm(xn, x + t * C, P(m, "model.layers.%lld.post_attention_layernorm.weight", l), C, c->rms_norm_eps);
      ref_linear(g, xn, P(m, "model.layers.%lld.mlp.gate_proj.weight", l), NULL, I, C);
      ref_linear(u, xn, P(m, "model.layers.%lld.mlp.up_proj.weight", l), NULL, I, C);
      for (int64_t i = 0; i < I; i++) g[i] = g[i] / (1 + exp(-g[i])) * u[i];
      ref_linear(tmp, g, P(m, "model.layers.%lld.mlp.down_proj.weight", l), NULL, C, I);
      for (int64_t i = 0; i < C; i++) x[t * C + i] += tmp[i];
    }
  }
  const double *head = c->tie_word_embeddings ? E : P(m, "lm_head.weight", 0);
  for (int64_t t = 0; t < T; t++) out[t] = 0;
  for (int64_t t = 0; t + 1 < T; t++) {
    if (!mask[t] || !mask[t + 1]) continue;
    ref_rmsnorm(xn, x + t * C, P(m, "model.norm.weight", 0), C, c->rms_norm_eps);
    ref_linear(logits, xn, head, NULL, V, C);   /* the whole [vocab] row, on purpose */
    double mx = -INFINITY, sum = 0;
    for (int64_t i = 0; i < V; i++) mx = fmax(mx, logits[i]);
    for (int64_t i = 0; i < V; i++) sum += exp(logits[i] - mx);
    out[t + 1] = logits[tok[t + 1]] - mx - log(sum);
  }
  free(x); free(xn); free(q); free(k); free(v); free(att); free(g); free(u); free(tmp); free(logits); free(scores); free(pos);
}

/* Rows: right padding, left padding, none, and a single token. */
enum { B = 4, T = 7 };
static const int32_t tokens[B * T] = {
  3, 17, 5, 9, 0, 0, 0,
  0, 0, 22, 4, 4, 8, 1,
  7, 1, 2, 11, 19, 13, 6,
  0, 0, 0, 0, 0, 0, 15,
};
static const int32_t mask[B * T] = {
  1, 1, 1, 1, 0, 0, 0,
  0, 0, 1, 1, 1, 1, 1,
  1, 1, 1, 1, 1, 1, 1,
  0, 0, 0, 0, 0, 0, 1,
};

static rx_tensor *i32_tensor(const int32_t *data) {
  int64_t shape[2] = {B, T};
  rx_tensor *t;
  rx_tensor_new(&t, RX_I32, RX_CPU, 2, shape);
  memcpy(t->data, data, sizeof(int32_t) * B * T);
  return t;
}

static rx_tensor *f64_tensor(void) {
  int64_t shape[2] = {B, T};
  rx_tensor *t;
  rx_tensor_new(&t, RX_F64, RX_CPU, 2, shape);
  return t;
}

static double loss_of(rx_model *m, rx_tensor *tok, rx_tensor *msk, rx_tensor *lp, const double *R) {
  rx_forward_opts fo = {0, 0, 5, 0};
  if (rx_model_logprobs(m, tok, msk, lp, NULL, &fo)) return NAN;
  double s = 0;
  for (int64_t i = 0; i < B * T; i++) s += R[i] * ((double *)lp->data)[i];
  return s;
}

/* sum(R * logp + E * entropy): the loss of an entropy bonus */
static double loss_ent_of(rx_model *m, rx_tensor *tok, rx_tensor *msk, rx_tensor *lp, rx_tensor *ent, const double *R,
                          const double *E) {
  rx_forward_opts fo = {0, 0, 5, 0};
  if (rx_model_logprobs(m, tok, msk, lp, ent, &fo)) return NAN;
  double s = 0;
  for (int64_t i = 0; i < B * T; i++) s += R[i] * ((double *)lp->data)[i] + E[i] * ((double *)ent->data)[i];
  return s;
}

static void check_model(rx_model_config cfg, int qwen, int tied, int kv) {
  rx_model *m;
  CHECK_OK(rx_model_new(&m, &cfg));
  if (!m) return;
  check_randomise(m, 11 + (uint64_t)(qwen * 4 + tied * 2 + kv));
  rx_tensor *tok = i32_tensor(tokens), *msk = i32_tensor(mask), *lp = f64_tensor(), *ent = f64_tensor(), *dlp = f64_tensor();

  /* 1. logprobs equal the naive full-logits reference, with the head on the whole vocabulary
   * and on slices of 7 of its 23 entries (the online log-sum-exp; 7 divides neither), and the
   * entropy is the same both ways. Everything below runs on the slices. */
  rx_forward_opts whole = {1, 0, 3, 0};  /* head chunks of 3 rows: not a divisor of B*T */
  rx_forward_opts fo = {1, 0, 3, 7};
  double ref[T], worst = 0, ent_whole[B * T], worst_ent = 0;
  for (int pass = 0; pass < 2; pass++) {
    CHECK_OK(rx_model_logprobs(m, tok, msk, lp, ent, pass ? &fo : &whole));
    for (int64_t b = 0; b < B; b++) {
      ref_logprobs(m, &cfg, tokens + b * T, mask + b * T, T, ref);
      for (int64_t t = 0; t < T; t++) worst = fmax(worst, fabs(((double *)lp->data)[b * T + t] - ref[t]));
    }
    for (int64_t i = 0; i < B * T; i++) {
      if (!pass) ent_whole[i] = ((double *)ent->data)[i];
      else worst_ent = fmax(worst_ent, fabs(((double *)ent->data)[i] - ent_whole[i]));
    }
  }
  CHECK(worst < 1e-10, "qwen=%d tied=%d kv=%d: logprobs differ from the reference by %g", qwen, tied, kv, worst);
  CHECK(worst_ent < 1e-12, "qwen=%d tied=%d kv=%d: entropy on vocabulary slices differs by %g", qwen, tied, kv, worst_ent);
  double e0 = ((double *)ent->data)[1 * T + 3];
  CHECK(e0 > 0 && e0 < log((double)cfg.vocab_size) + 1e-9, "entropy %g outside (0, log V]", e0);

  /* 2. gradients against central finite differences, on a sample of entries of every tensor */
  double R[B * T];
  for (int64_t i = 0; i < B * T; i++) R[i] = mask[i] ? sin(1.0 + i) : 0;
  memcpy(dlp->data, R, sizeof R);
  rx_model_zero_grad(m);
  CHECK_OK(rx_model_backward(m, dlp));
  double worst_rel = 0;
  const char *worst_name = "";
  for (int64_t i = 0; i < rx_model_param_count(m); i++) {
    rx_tensor *p = rx_model_param(m, i), *g = rx_model_grad(m, i);
    for (int s = 0; s < 3; s++) {
      int64_t j = (int64_t)((i * 7919 + s * 104729) % p->numel);
      double *x = (double *)p->data + j, keep = *x, h = 1e-4;
      *x = keep + h;
      double up = loss_of(m, tok, msk, lp, R);
      *x = keep - h;
      double down = loss_of(m, tok, msk, lp, R);
      *x = keep;
      double fd = (up - down) / (2 * h), an = ((double *)g->data)[j];
      double rel = fabs(fd - an) / fmax(1e-6, fabs(fd) + fabs(an));
      if (rel > worst_rel) { worst_rel = rel; worst_name = rx_model_param_name(m, i); }
    }
  }
  CHECK(worst_rel < 1e-6, "qwen=%d tied=%d kv=%d: worst gradient error %g at %s", qwen, tied, kv, worst_rel, worst_name);

  /* 2b. the same with a gradient through the entropy (rx_model_backward_entropy) */
  {
    double E[B * T];
    rx_tensor *dent = f64_tensor();
    for (int64_t i = 0; i < B * T; i++) E[i] = mask[i] ? cos(2.0 + i) : 0;
    memcpy(dent->data, E, sizeof E);
    rx_model_zero_grad(m);
    CHECK_OK(rx_model_logprobs(m, tok, msk, lp, ent, &fo));
    CHECK_OK(rx_model_backward_entropy(m, dlp, dent));
    double worst_e = 0;
    const char *worst_e_name = "";
    for (int64_t i = 0; i < rx_model_param_count(m); i++) {
      rx_tensor *p = rx_model_param(m, i), *g = rx_model_grad(m, i);
      for (int s = 0; s < 3; s++) {
        int64_t j = (int64_t)((i * 7919 + s * 104729) % p->numel);
        double *x = (double *)p->data + j, keep = *x, h = 1e-4;
        *x = keep + h;
        double up = loss_ent_of(m, tok, msk, lp, ent, R, E);
        *x = keep - h;
        double down = loss_ent_of(m, tok, msk, lp, ent, R, E);
        *x = keep;
        double fd = (up - down) / (2 * h), an = ((double *)g->data)[j];
        double rel = fabs(fd - an) / fmax(1e-6, fabs(fd) + fabs(an));
        if (rel > worst_e) { worst_e = rel; worst_e_name = rx_model_param_name(m, i); }
      }
    }
    /* the entropy is more curved than logp: central differences at h = 1e-4 carry ~1e-6 of truncation */
    CHECK(worst_e < 1e-5, "qwen=%d tied=%d kv=%d: worst entropy-bonus gradient error %g at %s", qwen, tied, kv,
          worst_e, worst_e_name);
    rx_tensor_free(dent);
    CHECK_OK(rx_model_logprobs(m, tok, msk, lp, NULL, &fo));   /* leave a train forward for what follows */
  }

  /* 3. gradient checkpointing gives the same gradients with a smaller activation plan */
  int64_t n = rx_model_param_count(m), total = 0;
  for (int64_t i = 0; i < n; i++) total += rx_model_grad(m, i)->numel;
  double *full = malloc(sizeof(double) * (size_t)total), *k = full;
  rx_model_zero_grad(m);
  CHECK_OK(rx_model_logprobs(m, tok, msk, lp, NULL, &fo));
  CHECK_OK(rx_model_backward(m, dlp));
  rx_model_memory mem_full, mem_ckpt;
  rx_model_memory_usage(m, &mem_full);
  for (int64_t i = 0; i < n; i++) { rx_tensor_read_f64(rx_model_grad(m, i), k); k += rx_model_grad(m, i)->numel; }
  rx_model_zero_grad(m);
  rx_forward_opts ck = {1, 1, 3, 7};
  CHECK_OK(rx_model_logprobs(m, tok, msk, lp, NULL, &ck));
  CHECK_OK(rx_model_backward(m, dlp));
  rx_model_memory_usage(m, &mem_ckpt);
  int same = 1;
  k = full;
  for (int64_t i = 0; i < n; i++) {
    rx_tensor *g = rx_model_grad(m, i);
    for (int64_t j = 0; j < g->numel; j++) same &= ((double *)g->data)[j] == k[j];
    k += g->numel;
  }
  CHECK(same, "checkpointed gradients differ");
  CHECK(mem_ckpt.activation_bytes < mem_full.activation_bytes, "checkpointing plan %lld >= full plan %lld",
        (long long)mem_ckpt.activation_bytes, (long long)mem_full.activation_bytes);
  free(full);

  /* 4. backward without a train forward, and bad tokens, are errors */
  rx_forward_opts infer = {0, 0, 0, 0};
  CHECK_OK(rx_model_logprobs(m, tok, msk, lp, NULL, &infer));
  CHECK_FAILS(rx_model_backward(m, dlp), "no train forward");
  ((int32_t *)tok->data)[2] = 99;
  CHECK_FAILS(rx_model_logprobs(m, tok, msk, lp, NULL, &infer), "token 99 at row 0, position 2 is outside the vocabulary");
  rx_tensor_free(tok); rx_tensor_free(msk); rx_tensor_free(lp); rx_tensor_free(ent); rx_tensor_free(dlp);
  rx_model_free(m);
}

static void check_config_variant(int qwen, int tied, int kv) { check_model(tiny_config(qwen, tied, kv), qwen, tied, kv); }
static void qwen2_untied_gqa(void) { check_config_variant(1, 0, 2); }
static void qwen2_tied_mqa(void) { check_config_variant(1, 1, 1); }
static void llama_tied_mha(void) { check_config_variant(0, 1, 4); }
static void llama_untied_gqa(void) { check_config_variant(0, 0, 2); }

/* Qwen3: per-head q/k RMSNorm, no q/k/v bias, head_dim 6 while hidden / heads = 4. */
static rx_model_config qwen3_config(int tied) {
  rx_model_config c = tiny_config(1, tied, 2);
  c.attention_bias = 0;
  c.qk_norm = 1;
  c.head_dim = 6;
  return c;
}
static void qwen3_untied_gqa(void) { check_model(qwen3_config(0), 3, 0, 2); }
static void qwen3_tied_gqa(void) { check_model(qwen3_config(1), 3, 1, 2); }

/* Llama 3.1 RoPE scaling with head_dim 8: wavelengths 6.3, 63, 628, 6283 against
 * original_max_position_embeddings 64 / high 4 = 16 and / low 1 = 64 put one frequency in each
 * band (kept, interpolated, divided by factor, divided). */
static rx_model_config llama31_config(void) {
  rx_model_config c = tiny_config(0, 1, 2);
  c.head_dim = 8;
  c.rope_scaling = RX_ROPE_LLAMA3;
  c.rope_factor = 8;
  c.rope_low_freq_factor = 1;
  c.rope_high_freq_factor = 4;
  c.rope_original_max_position_embeddings = 64;
  return c;
}
static void llama31_rope_scaling(void) {
  rx_model_config c = llama31_config();
  double got[4], want[4], plain[4];
  CHECK_OK(rx_rope_frequencies(&c, got));
  ref_inv_freq(want, &c);
  c.rope_scaling = RX_ROPE_DEFAULT;
  ref_inv_freq(plain, &c);
  for (int i = 0; i < 4; i++) CHECK(fabs(got[i] - want[i]) <= 1e-15 * want[i], "inv_freq[%d] %.17g, want %.17g", i, got[i], want[i]);
  CHECK(got[0] == plain[0], "the highest frequency is kept");
  CHECK(got[1] < plain[1] && got[1] > plain[1] / 8, "the middle band is interpolated");
  CHECK(fabs(got[2] - plain[2] / 8) < 1e-18 && fabs(got[3] - plain[3] / 8) < 1e-18, "low frequencies are divided by factor");
  check_model(llama31_config(), 31, 1, 2);
}

static void bad_configs_are_refused(void) {
  rx_model *m;
  rx_model_config c = tiny_config(1, 0, 3);
  CHECK_FAILS(rx_model_new(&m, &c), "num_attention_heads = 4 is not a multiple of num_key_value_heads = 3");
  c = tiny_config(1, 0, 2);
  c.hidden_size = 0;
  CHECK_FAILS(rx_model_new(&m, &c), "hidden_size = 0 must be > 0");
  c = tiny_config(1, 0, 2);
  c.dtype = RX_I32;
  CHECK_FAILS(rx_model_new(&m, &c), "compute dtype i32");
  c = llama31_config();
  c.rope_high_freq_factor = 0.5;
  CHECK_FAILS(rx_model_new(&m, &c), "low_freq_factor = 1 and high_freq_factor = 0.5");
  c = llama31_config();
  c.rope_scaling = 7;
  CHECK_FAILS(rx_model_new(&m, &c), "rope_scaling kind 7 is not supported");
}

/* The flat buffers (rx_model_flat): every parameter and its gradient inside them, the matrices
 * before the vectors, and AdamW over the two ranges (decay on the matrices only) giving the same
 * bits as AdamW tensor by tensor; the gradient norm over the flat buffer equals the norm over
 * the tensors. */
static void flat_buffers_update_like_tensors(void) {
  rx_model_config c = tiny_config(1, 0, 2);
  c.dtype = RX_F32;
  rx_model *a = NULL, *b = NULL;
  CHECK_OK(rx_model_new(&a, &c));
  CHECK_OK(rx_model_new(&b, &c));
  if (!a || !b) { rx_model_free(a); rx_model_free(b); return; }
  check_randomise(a, 5);
  check_randomise(b, 5);
  int64_t shape[2] = {B, T};
  rx_tensor *tok = i32_tensor(tokens), *msk = i32_tensor(mask), *lp, *dlp;
  rx_tensor_new(&lp, RX_F32, RX_CPU, 2, shape);
  rx_tensor_new(&dlp, RX_F32, RX_CPU, 2, shape);
  rx_tensor_normal(dlp, 9, 0, 0.0, 1.0);
  rx_forward_opts fo = {1, 0, 0, 0};
  rx_tensor *fp = NULL, *fg = NULL;
  int64_t matrices = 0;
  CHECK_OK(rx_model_flat(b, &fp, &fg, &matrices));
  if (!fp) goto done;
  const int64_t n = rx_model_param_count(a), total = fp->numel;
  CHECK(matrices > 0 && matrices < total, "matrices %lld of %lld elements", (long long)matrices, (long long)total);
  rx_tensor **ga = calloc((size_t)n, sizeof *ga), **mom = calloc((size_t)(2 * n), sizeof *mom);
  for (int64_t i = 0; i < n; i++) {
    rx_tensor *p = rx_model_param(b, i), *g = rx_model_grad(b, i);
    const int64_t at = ((char *)p->data - (char *)fp->data) / 4;
    CHECK(at >= 0 && at + p->numel <= total && (p->ndim == 2 ? at + p->numel <= matrices : at >= matrices),
          "%s at element %lld of the flat buffer (matrices end at %lld)", rx_model_param_name(b, i), (long long)at,
          (long long)matrices);
    CHECK((char *)g->data - (char *)fg->data == (char *)p->data - (char *)fp->data, "%s: gradient offset differs",
          rx_model_param_name(b, i));
    rx_tensor_new(&mom[2 * i], RX_F32, RX_CPU, p->ndim, p->shape);
    rx_tensor_new(&mom[2 * i + 1], RX_F32, RX_CPU, p->ndim, p->shape);
  }
  rx_tensor *fm, *fv, *part[6];
  int64_t fshape[1] = {total};
  rx_tensor_new(&fm, RX_F32, RX_CPU, 1, fshape);
  rx_tensor_new(&fv, RX_F32, RX_CPU, 1, fshape);
  rx_tensor *whole[4] = {fp, fg, fm, fv};
  for (int step = 1; step <= 2; step++) {
    rx_model_zero_grad(a);
    rx_model_zero_grad(b);
    CHECK_OK(rx_model_logprobs(a, tok, msk, lp, NULL, &fo));
    CHECK_OK(rx_model_backward(a, dlp));
    CHECK_OK(rx_model_logprobs(b, tok, msk, lp, NULL, &fo));
    CHECK_OK(rx_model_backward(b, dlp));
    for (int64_t i = 0; i < n; i++) ga[i] = rx_model_grad(a, i);
    double norm_t = 0, norm_f = 0;
    CHECK_OK(rx_grad_norm((const rx_tensor *const *)ga, n, &norm_t));
    CHECK_OK(rx_grad_norm((const rx_tensor *const *)&fg, 1, &norm_f));
    CHECK(fabs(norm_t - norm_f) <= 1e-12 * norm_t, "flat gradient norm %.17g, by tensors %.17g", norm_f, norm_t);
    rx_adamw_config ac = {1e-2, 0.9, 0.95, 1e-8, 0.1, step};
    for (int64_t i = 0; i < n; i++)
      CHECK_OK(rx_adamw_step(rx_model_param(a, i), ga[i], mom[2 * i], mom[2 * i + 1], &ac, rx_model_param(a, i)->ndim == 2));
    for (int r = 0; r < 2; r++) {   /* the matrices with decay, then the vectors without */
      for (int k = 0; k < 4; k++) CHECK_OK(rx_tensor_narrow(&part[k], whole[k], 0, r ? matrices : 0, r ? total - matrices : matrices));
      CHECK_OK(rx_adamw_step(part[0], part[1], part[2], part[3], &ac, r == 0));
      for (int k = 0; k < 4; k++) rx_tensor_free(part[k]);
    }
  }
  for (int64_t i = 0; i < n; i++) {
    const rx_tensor *p = rx_model_param(a, i), *q = rx_model_param(b, i);
    CHECK(memcmp(p->data, q->data, (size_t)p->numel * 4) == 0, "%s: flat AdamW differs from AdamW by tensor",
          rx_model_param_name(a, i));
  }
  for (int64_t i = 0; i < 2 * n; i++) rx_tensor_free(mom[i]);
  free(mom);
  free(ga);
  rx_tensor_free(fm);
  rx_tensor_free(fv);
done:
  rx_tensor_free(tok);
  rx_tensor_free(msk);
  rx_tensor_free(lp);
  rx_tensor_free(dlp);
  rx_model_free(a);
  rx_model_free(b);
}

/* ---------------------------------------------------------------- packed rows */

/* Relative error ||a - b|| / ||b|| of n floats. */
static double rel_f32(const float *a, const float *b, int64_t n) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; i++) { num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]); den += (double)b[i] * b[i]; }
  return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* The gradients a model (or its adapters) holds, copied out as one float vector. */
static int64_t grads_of(rx_model *m, float *out) {
  int64_t n = 0;
  const int lora = rx_model_lora_get_config(m) != NULL;
  const int64_t count = lora ? rx_model_lora_count(m) : rx_model_param_count(m);
  for (int64_t i = 0; i < count; i++) {
    rx_tensor *g = lora ? rx_model_lora_grad(m, i) : rx_model_grad(m, i);
    if (out) memcpy(out + n, g->data, sizeof(float) * (size_t)g->numel);
    n += g->numel;
  }
  return n;
}

/* Rows packed end to end (rx_model_logprobs_packed) against the same rows padded to [B,T]
 * (right or left padding): logprobs, entropies and every gradient (of sum(R logp + E entropy))
 * agree within 1e-6 relative in f32, with and without gradient checkpointing, for full
 * fine-tuning and LoRA; and a row's values do not depend on its neighbours (the rows packed
 * in another order give the same values). */
static void check_packed_case(int variant, int lora, int checkpoint, int left, int bf16) {
  enum { S = 4, TP = 9 };
  static const int64_t len[S] = {5, 9, 2, 7};
  rx_model_config cfg = variant == 3 ? qwen3_config(0) : tiny_config(variant, 0, 2);
  cfg.dtype = bf16 ? RX_BF16 : RX_F32;
  rx_model *m;
  CHECK_OK(rx_model_new(&m, &cfg));
  if (!m) return;
  check_randomise(m, 41 + (uint64_t)variant);
  if (lora) {
    rx_lora_config lc = {2, 5.0, 0.0, (1u << RX_PROJ_Q) | (1u << RX_PROJ_V) | (1u << RX_PROJ_DOWN), 0, 7};
    CHECK_OK(rx_model_lora_init(m, &lc));
    for (int64_t i = 1; i < rx_model_lora_count(m); i += 2)
      rx_tensor_normal(rx_model_lora_param(m, i), 99, (uint64_t)i << 32, 0.0, 0.2);
  }
  int64_t N = 0, cu[2][S + 1];
  for (int64_t r = 0; r < S; r++) N += len[r];
  /* the rows' tokens, and two packings: in order, and reversed */
  int32_t rowtok[S][TP];
  for (int64_t r = 0; r < S; r++)
    for (int64_t t = 0; t < len[r]; t++) rowtok[r][t] = (int32_t)((r * 7 + t * 5 + 3) % cfg.vocab_size);
  const int64_t ps[2] = {S, TP}, pk[2] = {1, N}, cs[1] = {S + 1};
  rx_tensor *ptok, *pmask, *plp, *pent, *pdlp, *pdent, *ktok, *kcu, *klp, *kent, *kdlp, *kdent;
  rx_tensor_new(&ptok, RX_I32, RX_CPU, 2, ps); rx_tensor_new(&pmask, RX_I32, RX_CPU, 2, ps);
  rx_tensor_new(&plp, RX_F32, RX_CPU, 2, ps); rx_tensor_new(&pent, RX_F32, RX_CPU, 2, ps);
  rx_tensor_new(&pdlp, RX_F32, RX_CPU, 2, ps); rx_tensor_new(&pdent, RX_F32, RX_CPU, 2, ps);
  rx_tensor_new(&ktok, RX_I32, RX_CPU, 2, pk); rx_tensor_new(&kcu, RX_I32, RX_CPU, 1, cs);
  rx_tensor_new(&klp, RX_F32, RX_CPU, 2, pk); rx_tensor_new(&kent, RX_F32, RX_CPU, 2, pk);
  rx_tensor_new(&kdlp, RX_F32, RX_CPU, 2, pk); rx_tensor_new(&kdent, RX_F32, RX_CPU, 2, pk);
  int32_t *pt = ptok->data, *pm = pmask->data;
  float *pR = pdlp->data, *pE = pdent->data;
  for (int64_t r = 0; r < S; r++)
    for (int64_t t = 0; t < TP; t++) {
      const int64_t at = r * TP + t, j = left ? t - (TP - len[r]) : t;   /* j: the row's token index */
      const int real = j >= 0 && j < len[r];
      pt[at] = real ? rowtok[r][j] : 0;
      pm[at] = real;
      pR[at] = real ? (float)sin(1.0 + r * 13 + j) : 0.0f;
      pE[at] = real ? (float)cos(2.0 + r * 11 + j) : 0.0f;
    }
  rx_forward_opts fo = {1, checkpoint, 4, 0};
  /* padded: forward, backward */
  CHECK_OK(rx_model_logprobs(m, ptok, pmask, plp, pent, &fo));
  rx_model_zero_grad(m);
  CHECK_OK(rx_model_backward_entropy(m, pdlp, pdent));
  const int64_t ng = grads_of(m, NULL);
  float *gpad = malloc(sizeof(float) * (size_t)ng), *gpk = malloc(sizeof(float) * (size_t)ng);
  grads_of(m, gpad);
  char label[128];
  snprintf(label, sizeof label, "variant %d%s%s, %s padding%s", variant, lora ? " lora" : "", checkpoint ? " checkpoint" : "",
           left ? "left" : "right", bf16 ? " bf16" : "");
  float lp_pack[2][S * TP], ent_pack[2][S * TP];
  memset(lp_pack, 0, sizeof lp_pack); memset(ent_pack, 0, sizeof ent_pack);
  for (int order = 0; order < 2; order++) {
    int32_t *kt = ktok->data, *kc = kcu->data;
    float *kR = kdlp->data, *kE = kdent->data;
    kc[0] = 0;
    for (int64_t q = 0; q < S; q++) {
      const int64_t r = order ? S - 1 - q : q;
      cu[order][r] = kc[q];
      for (int64_t j = 0; j < len[r]; j++) {
        kt[kc[q] + j] = rowtok[r][j];
        kR[kc[q] + j] = (float)sin(1.0 + r * 13 + j);
        kE[kc[q] + j] = (float)cos(2.0 + r * 11 + j);
      }
      kc[q + 1] = kc[q] + (int32_t)len[r];
    }
    CHECK_OK(rx_model_logprobs_packed(m, ktok, kcu, klp, kent, &fo));
    rx_model_zero_grad(m);
    CHECK_OK(rx_model_backward_entropy(m, kdlp, kdent));
    grads_of(m, gpk);
    /* per token: packed against padded, in the row's own order */
    for (int64_t r = 0; r < S; r++)
      for (int64_t j = 0; j < len[r]; j++) {
        lp_pack[order][r * TP + j] = ((float *)klp->data)[cu[order][r] + j];
        ent_pack[order][r * TP + j] = ((float *)kent->data)[cu[order][r] + j];
      }
    float lp_ref[S * TP], ent_ref[S * TP];
    memset(lp_ref, 0, sizeof lp_ref); memset(ent_ref, 0, sizeof ent_ref);
    for (int64_t r = 0; r < S; r++)
      for (int64_t j = 0; j < len[r]; j++) {
        const int64_t at = r * TP + (left ? j + TP - len[r] : j);
        lp_ref[r * TP + j] = ((float *)plp->data)[at];
        ent_ref[r * TP + j] = ((float *)pent->data)[at];
      }
    float lp_got[S * TP], ent_got[S * TP];
    memset(lp_got, 0, sizeof lp_got); memset(ent_got, 0, sizeof ent_got);
    for (int64_t r = 0; r < S; r++)
      for (int64_t j = 0; j < len[r]; j++) {
        lp_got[r * TP + j] = lp_pack[order][r * TP + j];
        ent_got[r * TP + j] = ent_pack[order][r * TP + j];
      }
    const double tol = bf16 ? 1e-5 : 1e-6;
    const double elp = rel_f32(lp_got, lp_ref, S * TP), eent = rel_f32(ent_got, ent_ref, S * TP), eg = rel_f32(gpk, gpad, ng);
    CHECK(elp < tol && eent < tol, "%s, order %d: packed logprobs / entropies differ from padded by %.3g / %.3g", label,
          order, elp, eent);
    CHECK(eg < tol, "%s, order %d: packed gradients differ from padded by %.3g (relative)", label, order, eg);
    CHECK(lp_got[0] == 0 && lp_got[TP] == 0, "%s: a row's first token has logp 0", label);
  }
  /* the reward models' hidden state at each row's last token: packed = padded */
  {
    int64_t ip[S], ik[S];
    const int64_t hs[2] = {S, cfg.hidden_size};
    rx_tensor *hp, *hk;
    rx_tensor_new(&hp, RX_F32, RX_CPU, 2, hs); rx_tensor_new(&hk, RX_F32, RX_CPU, 2, hs);
    for (int64_t r = 0; r < S; r++) ip[r] = left ? TP - 1 : len[r] - 1, ik[r] = len[S - 1 - r] - 1;
    CHECK_OK(rx_model_hidden_at(m, ptok, pmask, ip, hp));
    CHECK_OK(rx_model_hidden_at_packed(m, ktok, kcu, ik, hk));
    /* ktok holds the last packing (reversed): row r sits at packed row S - 1 - r */
    float got[S * 64], want[S * 64];
    const int64_t C = cfg.hidden_size;
    for (int64_t r = 0; r < S && C <= 64; r++)
      for (int64_t j = 0; j < C; j++) {
        want[r * C + j] = ((float *)hp->data)[r * C + j];
        got[r * C + j] = ((float *)hk->data)[(S - 1 - r) * C + j];
      }
    const double eh = rel_f32(got, want, S * C);
    CHECK(eh < (bf16 ? 1e-5 : 1e-6), "%s: packed hidden states differ from padded by %.3g", label, eh);
    rx_tensor_free(hp); rx_tensor_free(hk);
  }
  free(gpad); free(gpk);
  rx_tensor *all[] = {ptok, pmask, plp, pent, pdlp, pdent, ktok, kcu, klp, kent, kdlp, kdent};
  for (size_t j = 0; j < sizeof all / sizeof all[0]; j++) rx_tensor_free(all[j]);
  rx_model_free(m);
}

static void packed_rows_equal_padded(void) {
  check_packed_case(1, 0, 0, 0, 0);   /* Qwen2, right padding */
  check_packed_case(0, 0, 1, 1, 0);   /* Llama, left padding, gradient checkpointing */
  check_packed_case(3, 0, 0, 0, 0);   /* Qwen3 (q/k norm) */
  check_packed_case(1, 1, 0, 1, 0);   /* LoRA */
  check_packed_case(1, 0, 0, 0, 1);   /* bf16 compute (f32 activations, bf16 weight GEMMs on the cpu) */
}

static void packed_bad_boundaries_are_refused(void) {
  rx_model_config cfg = tiny_config(1, 0, 2);
  cfg.dtype = RX_F32;
  rx_model *m;
  CHECK_OK(rx_model_new(&m, &cfg));
  if (!m) return;
  const int64_t pk[2] = {1, 6}, cs[1] = {3}, pb[2] = {2, 3};
  rx_tensor *tok, *cu, *lp, *tok2;
  rx_tensor_new(&tok, RX_I32, RX_CPU, 2, pk); rx_tensor_new(&cu, RX_I32, RX_CPU, 1, cs);
  rx_tensor_new(&lp, RX_F32, RX_CPU, 2, pk); rx_tensor_new(&tok2, RX_I32, RX_CPU, 2, pb);
  rx_tensor_fill(tok, 1); rx_tensor_fill(tok2, 1);
  int32_t *c = cu->data;
  c[0] = 0; c[1] = 2; c[2] = 5;
  CHECK_FAILS(rx_model_logprobs_packed(m, tok, cu, lp, NULL, NULL), "cu_seqlens runs from 0 to 5, expected 0 to the 6 tokens");
  c[1] = 0; c[2] = 6;
  CHECK_FAILS(rx_model_logprobs_packed(m, tok, cu, lp, NULL, NULL), "row 0 of cu_seqlens is empty");
  c[1] = 3;
  CHECK_FAILS(rx_model_logprobs_packed(m, tok2, cu, lp, NULL, NULL), "tokens [2,3] must be [1,N]");
  CHECK_OK(rx_model_logprobs_packed(m, tok, cu, lp, NULL, NULL));
  rx_tensor_free(tok); rx_tensor_free(cu); rx_tensor_free(lp); rx_tensor_free(tok2);
  rx_model_free(m);
}

int main(void) {
  RUN(qwen2_untied_gqa);
  RUN(qwen2_tied_mqa);
  RUN(llama_tied_mha);
  RUN(llama_untied_gqa);
  RUN(qwen3_untied_gqa);
  RUN(qwen3_tied_gqa);
  RUN(llama31_rope_scaling);
  RUN(bad_configs_are_refused);
  RUN(flat_buffers_update_like_tensors);
  RUN(packed_rows_equal_padded);
  RUN(packed_bad_boundaries_are_refused);
  return check_summary("test_model");
}
