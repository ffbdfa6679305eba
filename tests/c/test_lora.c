/* test_lora.c: LoRA adapters in float64 against independent references: adapter gradients
 * against central finite differences (with and without dropout), against the full model's
 * gradient projected through the chain rule (dB = s G A^T, dA = s B^T G at W + s B A), the
 * adapted model against a plain model holding the merged weights, adapters off against the
 * base bit for bit, and merged weights against W + s B A computed here. */
#include "check.h"

static rx_model_config tiny_config(int qwen) { return check_tiny_config(qwen, 0, 2, 10000.0); }

enum { B = 3, T = 6 };
static const int32_t tokens[B * T] = {
  3, 17, 5, 9, 0, 0,
  0, 0, 22, 4, 4, 8,
  7, 1, 2, 11, 19, 13,
};
static const int32_t mask[B * T] = {
  1, 1, 1, 1, 0, 0,
  0, 0, 1, 1, 1, 1,
  1, 1, 1, 1, 1, 1,
};

static rx_tensor *new2(int32_t dtype, const int32_t *data) {
  int64_t shape[2] = {B, T};
  rx_tensor *t;
  rx_tensor_new(&t, dtype, RX_CPU, 2, shape);
  if (data) memcpy(t->data, data, sizeof(int32_t) * B * T);
  return t;
}

typedef struct fixture {
  rx_tensor *tok, *msk, *lp, *dlp;
  double R[B * T];
} fixture;

static void fixture_init(fixture *f) {
  f->tok = new2(RX_I32, tokens);
  f->msk = new2(RX_I32, mask);
  f->lp = new2(RX_F64, NULL);
  f->dlp = new2(RX_F64, NULL);
  for (int64_t i = 0; i < B * T; i++) f->R[i] = mask[i] ? sin(1.0 + i) : 0;
  memcpy(f->dlp->data, f->R, sizeof f->R);
}

static void fixture_free(fixture *f) {
  rx_tensor_free(f->tok); rx_tensor_free(f->msk); rx_tensor_free(f->lp); rx_tensor_free(f->dlp);
}

/* sum R * logp; train forwards redraw the dropout masks of train forward number `count`. */
static double loss_of(rx_model *m, fixture *f, int train, uint64_t count) {
  rx_forward_opts fo = {train, 0, 5, 0};
  rx_model_lora_set_forward_count(m, count - 1);
  if (rx_model_logprobs(m, f->tok, f->msk, f->lp, NULL, &fo)) return NAN;
  double s = 0;
  for (int64_t i = 0; i < B * T; i++) s += f->R[i] * ((double *)f->lp->data)[i];
  return s;
}

static rx_model *base_model(int qwen, uint64_t seed) {
  rx_model_config cfg = tiny_config(qwen);
  rx_model *m = NULL;
  CHECK_OK(rx_model_new(&m, &cfg));
  if (m) check_randomise(m, seed);
  return m;
}

static rx_model *lora_model(int qwen, uint64_t seed, int64_t r, uint32_t targets, double dropout) {
  rx_model *m = base_model(qwen, seed);
  if (!m) return NULL;
  rx_lora_config lc = {r, 2.0 * r + 1.0, dropout, targets, 0, 7};
  CHECK_OK(rx_model_lora_init(m, &lc));
  /* B starts at zero (the model equals its base); make it non-zero so every path carries signal */
  for (int64_t i = 1; i < rx_model_lora_count(m); i += 2)
    rx_tensor_normal(rx_model_lora_param(m, i), 99, (uint64_t)i << 32, 0.0, 0.2);
  return m;
}

/* A plain model (no adapters) holding m's merged weights. */
static rx_model *merged_copy(rx_model *m) {
  rx_model *p = NULL;
  CHECK_OK(rx_model_new(&p, rx_model_get_config(m)));
  for (int64_t i = 0; p && i < rx_model_param_count(m); i++) CHECK_OK(rx_model_lora_merged(m, i, rx_model_param(p, i)));
  return p;
}

static const uint32_t ALL = (1u << RX_PROJ_COUNT) - 1;

/* Adapter gradients against central finite differences. */
static void check_fd(int qwen, int64_t r, uint32_t targets, double dropout, int checkpoint) {
  rx_model *m = lora_model(qwen, 5, r, targets, dropout);
  if (!m) return;
  fixture f;
  fixture_init(&f);
  const int train_fd = dropout > 0;   /* with dropout the masks of one train forward are held fixed */
  rx_forward_opts fo = {1, checkpoint, 5, 0};
  rx_model_zero_grad(m);
  rx_model_lora_set_forward_count(m, 41);
  CHECK_OK(rx_model_logprobs(m, f.tok, f.msk, f.lp, NULL, &fo));
  CHECK_OK(rx_model_backward(m, f.dlp));
  double worst = 0;
  const char *where = "";
  for (int64_t i = 0; i < rx_model_lora_count(m); i++) {
    rx_tensor *p = rx_model_lora_param(m, i), *g = rx_model_lora_grad(m, i);
    for (int s = 0; s < 3; s++) {
      int64_t j = (int64_t)((i * 7919 + s * 104729) % p->numel);
      double *x = (double *)p->data + j, keep = *x, h = 1e-4;
      *x = keep + h;
      double up = loss_of(m, &f, train_fd, 42);
      *x = keep - h;
      double down = loss_of(m, &f, train_fd, 42);
      *x = keep;
      double fd = (up - down) / (2 * h), an = ((double *)g->data)[j];
      double rel = fabs(fd - an) / fmax(1e-3, fabs(fd) + fabs(an));   /* FD truncation ~4e-10 at h = 1e-4 */
      if (rel > worst) { worst = rel; where = rx_model_lora_name(m, i); }
    }
  }
  CHECK(worst < 1e-6, "r=%lld targets=0x%x dropout=%g checkpoint=%d: worst adapter gradient error %g at %s",
        (long long)r, targets, dropout, checkpoint, worst, where);
  fixture_free(&f);
  rx_model_free(m);
}

static void fd_all_linear(void) { check_fd(1, 3, ALL, 0.0, 0); }
static void fd_attention_full_rank_llama(void) {
  check_fd(0, 16, (1u << RX_PROJ_Q) | (1u << RX_PROJ_O), 0.0, 0);
}
static void fd_with_dropout(void) { check_fd(1, 2, ALL, 0.3, 0); }
static void fd_with_dropout_checkpointed(void) { check_fd(0, 2, ALL, 0.3, 1); }

/* The chain rule through W_eff = W + s B A: the adapter gradients are the full model's gradient
 * at W_eff projected on them. Full rank r for q/o: every update of W is reachable. */
static void projection_of_full_gradient(void) {
  for (int variant = 0; variant < 2; variant++) {
    const int64_t r = variant ? 16 : 4;
    const uint32_t targets = variant ? ((1u << RX_PROJ_Q) | (1u << RX_PROJ_O)) : ALL;
    rx_model *m = lora_model(variant, 13, r, targets, 0.0);
    if (!m) return;
    rx_model *full = merged_copy(m);
    fixture f;
    fixture_init(&f);
    rx_forward_opts fo = {1, 0, 5, 0};
    rx_model_zero_grad(m);
    CHECK_OK(rx_model_logprobs(m, f.tok, f.msk, f.lp, NULL, &fo));
    CHECK_OK(rx_model_backward(m, f.dlp));
    rx_model_zero_grad(full);
    CHECK_OK(rx_model_logprobs(full, f.tok, f.msk, f.lp, NULL, &fo));
    CHECK_OK(rx_model_backward(full, f.dlp));
    const rx_lora_config *lc = rx_model_lora_get_config(m);
    const double s = lc->alpha / (double)lc->r;
    double worst = 0, scale = 0;
    for (int64_t k = 0; k < rx_model_lora_count(m); k += 2) {
      char wname[160];
      const char *an = rx_model_lora_name(m, k);
      snprintf(wname, sizeof wname, "%.*s.weight", (int)(strstr(an, ".lora_A") - an), an);
      int64_t w = rx_model_find_param(full, wname);
      CHECK(w >= 0, "no base weight %s for %s", wname, an);
      if (w < 0) continue;
      const double *G = rx_model_grad(full, w)->data;
      const rx_tensor *A = rx_model_lora_param(m, k), *Bt = rx_model_lora_param(m, k + 1);
      const double *a = A->data, *b = Bt->data, *dA = rx_model_lora_grad(m, k)->data, *dB = rx_model_lora_grad(m, k + 1)->data;
      const int64_t rr = A->shape[0], in = A->shape[1], out = Bt->shape[0];
      for (int64_t o = 0; o < out; o++)
        for (int64_t q = 0; q < rr; q++) {   /* dB[o,q] = s sum_i G[o,i] A[q,i] */
          double e = 0;
          for (int64_t i = 0; i < in; i++) e += G[o * in + i] * a[q * in + i];
          worst = fmax(worst, fabs(s * e - dB[o * rr + q]));
          scale = fmax(scale, fabs(s * e));
        }
      for (int64_t q = 0; q < rr; q++)
        for (int64_t i = 0; i < in; i++) {   /* dA[q,i] = s sum_o B[o,q] G[o,i] */
          double e = 0;
          for (int64_t o = 0; o < out; o++) e += b[o * rr + q] * G[o * in + i];
          worst = fmax(worst, fabs(s * e - dA[q * in + i]));
          scale = fmax(scale, fabs(s * e));
        }
    }
    CHECK(scale > 1e-3, "projected gradients are all ~0 (%g): the check would prove nothing", scale);
    CHECK(worst < 1e-9 * fmax(1, scale), "r=%lld: adapter gradients differ from the projected full gradient by %g (scale %g)",
          (long long)r, worst, scale);
    fixture_free(&f);
    rx_model_free(full);
    rx_model_free(m);
  }
}

/* Forward with adapters = a plain model with merged weights; adapters off = the base, bit for bit;
 * merged weights = W + s B A computed here. */
static void forward_merged_and_disabled(void) {
  rx_model *m = lora_model(1, 21, 3, ALL, 0.25);   /* dropout must not touch inference forwards */
  rx_model *base = base_model(1, 21), *full = m ? merged_copy(m) : NULL;
  if (!m || !base || !full) return;
  fixture f;
  fixture_init(&f);
  rx_tensor *lp2 = new2(RX_F64, NULL);
  rx_forward_opts fo = {0, 0, 0, 0};
  CHECK_OK(rx_model_logprobs(m, f.tok, f.msk, f.lp, NULL, &fo));
  CHECK_OK(rx_model_logprobs(full, f.tok, f.msk, lp2, NULL, &fo));
  double worst = 0, moved = 0;
  for (int64_t i = 0; i < B * T; i++) worst = fmax(worst, fabs(((double *)f.lp->data)[i] - ((double *)lp2->data)[i]));
  CHECK(worst < 1e-12, "adapted forward differs from the merged model by %g", worst);
  CHECK(rx_model_lora_enabled(m) == 1, "adapters start enabled");
  rx_model_lora_set_enabled(m, 0);
  CHECK_OK(rx_model_logprobs(m, f.tok, f.msk, f.lp, NULL, &fo));
  CHECK_OK(rx_model_logprobs(base, f.tok, f.msk, lp2, NULL, &fo));
  CHECK(memcmp(f.lp->data, lp2->data, sizeof(double) * B * T) == 0, "adapters off: logprobs are not the base's bit for bit");
  CHECK_OK(rx_model_logprobs(full, f.tok, f.msk, lp2, NULL, &fo));
  for (int64_t i = 0; i < B * T; i++) moved = fmax(moved, fabs(((double *)f.lp->data)[i] - ((double *)lp2->data)[i]));
  CHECK(moved > 1e-3, "the adapters change nothing (%g): the comparison above proves nothing", moved);
  rx_model_lora_set_enabled(m, 1);

  /* merged = W + s B A, by plain loops here */
  const double s = rx_model_lora_get_config(m)->alpha / 3.0;
  double werr = 0;
  for (int64_t k = 0; k < rx_model_lora_count(m); k += 2) {
    char wname[160];
    const char *an = rx_model_lora_name(m, k);
    snprintf(wname, sizeof wname, "%.*s.weight", (int)(strstr(an, ".lora_A") - an), an);
    int64_t w = rx_model_find_param(m, wname);
    const rx_tensor *A = rx_model_lora_param(m, k), *Bt = rx_model_lora_param(m, k + 1);
    const double *W = rx_model_param(m, w)->data, *M = rx_model_param(full, w)->data, *a = A->data, *b = Bt->data;
    const int64_t r = A->shape[0], in = A->shape[1], out = Bt->shape[0];
    for (int64_t o = 0; o < out; o++)
      for (int64_t i = 0; i < in; i++) {
        double e = W[o * in + i];
        for (int64_t q = 0; q < r; q++) e += s * b[o * r + q] * a[q * in + i];
        werr = fmax(werr, fabs(e - M[o * in + i]));
      }
  }
  CHECK(werr < 1e-13, "merged weights differ from W + s B A by %g", werr);
  /* parameters without an adapter come back as they are */
  int64_t ln = rx_model_find_param(m, "model.norm.weight");
  CHECK(memcmp(rx_model_param(m, ln)->data, rx_model_param(full, ln)->data, 16 * sizeof(double)) == 0, "norm changed by merge");

  /* generation applies the adapters: greedy tokens and logits as the merged model's */
  int32_t prompt[4] = {3, 17, 5, 9}, stop = 22;
  int64_t offs[2] = {0, 4}, row_prompt[2] = {0, 0};
  rx_sampling rows[2] = {{0.0, 1.0, 0, 6, 1, 0, 0}, {1.0, 1.0, 0, 6, 2, 0, 0}};
  rx_generate_request req = {1, prompt, offs, 2, row_prompt, rows, &stop, 1, 5, 6};
  int32_t t1[12], t2[12], l1[2], l2[2], f1[2], f2[2];
  float p1[12], p2[12];
  rx_generate_result r1 = {t1, p1, l1, f1, 0, 0}, r2 = {t2, p2, l2, f2, 0, 0};
  CHECK_OK(rx_model_generate(m, &req, &r1));
  CHECK_OK(rx_model_generate(full, &req, &r2));
  int same = l1[0] == l2[0] && l1[1] == l2[1];
  for (int i = 0; same && i < l1[0]; i++) same &= t1[i] == t2[i] && fabsf(p1[i] - p2[i]) < 1e-5f;
  for (int i = 0; same && i < l1[1]; i++) same &= t1[6 + i] == t2[6 + i];
  CHECK(same, "generation with adapters differs from the merged model's");

  rx_tensor_free(lp2);
  fixture_free(&f);
  rx_model_free(full);
  rx_model_free(base);
  rx_model_free(m);
}

/* The base keeps no gradient buffers; only adapters count as gradients. */
static void frozen_base_has_no_gradients(void) {
  rx_model *m = lora_model(1, 3, 2, (1u << RX_PROJ_Q) | (1u << RX_PROJ_V), 0.0);
  if (!m) return;
  fixture f;
  fixture_init(&f);
  rx_forward_opts fo = {1, 0, 0, 0};
  CHECK_OK(rx_model_logprobs(m, f.tok, f.msk, f.lp, NULL, &fo));
  CHECK_OK(rx_model_backward(m, f.dlp));
  rx_model_memory mem;
  rx_model_memory_usage(m, &mem);
  int64_t adapter_bytes = 0;
  for (int64_t i = 0; i < rx_model_lora_count(m); i++) adapter_bytes += rx_model_lora_param(m, i)->numel * 8;
  CHECK(rx_model_lora_count(m) == 2 * 2 * 2, "2 layers x 2 projections x (A, B): got %lld", (long long)rx_model_lora_count(m));
  CHECK(mem.grad_bytes <= adapter_bytes + 64 * rx_model_lora_count(m) && mem.grad_bytes >= adapter_bytes,
        "gradient bytes %lld, adapters %lld", (long long)mem.grad_bytes, (long long)adapter_bytes);
  CHECK(rx_model_grad(m, 0) == NULL, "a frozen base parameter has a gradient buffer");
  CHECK(strcmp(rx_model_lora_name(m, 0), "model.layers.0.self_attn.q_proj.lora_A.weight") == 0, "name %s", rx_model_lora_name(m, 0));
  CHECK(strcmp(rx_model_lora_name(m, 3), "model.layers.0.self_attn.v_proj.lora_B.weight") == 0, "name %s", rx_model_lora_name(m, 3));
  const rx_tensor *A = rx_model_lora_param(m, 0), *Bt = rx_model_lora_param(m, 3);
  CHECK(A->shape[0] == 2 && A->shape[1] == 16 && Bt->shape[0] == 8 && Bt->shape[1] == 2, "adapter shapes");
  fixture_free(&f);
  rx_model_free(m);

  /* fresh adapters: A inside PEFT's Kaiming-uniform bound 1/sqrt(in) and spread over it, B zero */
  rx_model *n = base_model(0, 3);
  rx_lora_config lc = {4, 8, 0, ALL, 0, 1};
  CHECK_OK(rx_model_lora_init(n, &lc));
  for (int64_t i = 0; i < rx_model_lora_count(n); i++) {
    const rx_tensor *t = rx_model_lora_param(n, i);
    double mx = 0;
    for (int64_t j = 0; j < t->numel; j++) mx = fmax(mx, fabs(((double *)t->data)[j]));
    if (i % 2) CHECK(mx == 0, "%s is not zero", rx_model_lora_name(n, i));
    else CHECK(mx <= 1 / sqrt((double)t->shape[1]) && mx > 0.5 / sqrt((double)t->shape[1]), "%s: max |A| = %g, in = %lld",
               rx_model_lora_name(n, i), mx, (long long)t->shape[1]);
  }
  CHECK_FAILS(rx_model_lora_init(n, &lc), "already has adapters");
  rx_model_free(n);
}

static void bad_settings_are_refused(void) {
  rx_model *m = base_model(1, 1);
  if (!m) return;
  rx_lora_config lc = {9, 16, 0, 1u << RX_PROJ_K, 0, 0};
  CHECK_FAILS(rx_model_lora_init(m, &lc), "r = 9 must be in [1, 8] for model.layers.0.self_attn.k_proj.weight [8,16]");
  lc.r = 2; lc.targets = 0;
  CHECK_FAILS(rx_model_lora_init(m, &lc), "names no projection");
  lc.targets = 1; lc.dropout = 1.0;
  CHECK_FAILS(rx_model_lora_init(m, &lc), "dropout = 1 must be in [0, 1)");
  CHECK(rx_model_lora_count(m) == 0 && rx_model_lora_get_config(m) == NULL, "a refused init left adapters behind");
  rx_model_free(m);
}

int main(void) {
  RUN(fd_all_linear);
  RUN(fd_attention_full_rank_llama);
  RUN(fd_with_dropout);
  RUN(fd_with_dropout_checkpointed);
  RUN(projection_of_full_gradient);
  RUN(forward_merged_and_disabled);
  RUN(frozen_base_has_no_gradients);
  RUN(bad_settings_are_refused);
  return check_summary("test_lora");
}
