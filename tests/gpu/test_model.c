/* test_model.c: the whole decoder on device "cuda" against the same model on the CPU (f32, the
 * same weights): log-probabilities, entropies and every parameter gradient (with the entropy
 * term, with and without gradient checkpointing, the head on vocabulary slices), then three
 * optimizer steps ending in the same weights: on the CPU clipping and AdamW tensor by tensor, on
 * the device over the model's flat buffers (rx_model_flat: one clip, AdamW in two calls), for the test
 * configurations of tests/c/test_model.c (Qwen2 tied / untied with biases, Qwen3's q/k norm,
 * Llama 3.1 RoPE scaling). The CPU model is itself checked against a naive reference and finite
 * differences in tests/c/test_model.c. Without a CUDA device the test exits 77 (skipped). */
#include "gpu.h"

enum { B = 3, T = 9, STEPS = 3 };

static const int32_t tokens[B * T] = {
  3, 17, 5, 22, 9, 1, 14, 7, 11,
  0, 0, 0, 8, 19, 2, 6, 21, 13,     /* left padding */
  4, 10, 15, 12, 18, 20, 16, 0, 0,  /* right padding */
};
static const int32_t mask[B * T] = {
  1, 1, 1, 1, 1, 1, 1, 1, 1,
  0, 0, 0, 1, 1, 1, 1, 1, 1,
  1, 1, 1, 1, 1, 1, 1, 0, 0,
};

static rx_model_config config(int variant) { return gpu_tiny_config(variant, 23, 64); }

static double worst_lp, worst_grad;   /* of the variant being checked, printed with its result */
static double tol = 1e-5;             /* f32 on the device; bf16 compute (f32 master weights): 3e-2 */
static double tensor_tol = 1e-5;      /* one gradient tensor: f32 1e-5; bf16 5e-2 (see check_variant) */

static const char *variant_name[] = {"qwen2 untied gqa", "qwen2 tied mqa", "qwen3 qk_norm", "llama3.1 rope scaling"};

static rx_tensor *host(int32_t dtype, const void *data) {
  int64_t shape[2] = {B, T};
  rx_tensor *t;
  gpu_must(rx_tensor_new(&t, dtype, RX_CPU, 2, shape), NULL);
  if (data) memcpy(t->data, data, sizeof(int32_t) * B * T);
  return t;
}

/* nrmse of a device tensor against a CPU one; adds |dev - cpu|^2 and |cpu|^2 to sums[0], sums[1] */
static double err_sums(const rx_tensor *dev, const rx_tensor *cpu, double *sums) {
  const int64_t n = cpu->numel;
  double *a = malloc((size_t)n * sizeof *a), *b = malloc((size_t)n * sizeof *b), num = 0, den = 0;
  gpu_must(rx_tensor_read_f64(dev, a), NULL);
  gpu_must(rx_tensor_read_f64(cpu, b), NULL);
  for (int64_t i = 0; i < n; i++) {
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
    if (a[i] != a[i]) num = INFINITY;   /* a NaN from the device is never close */
  }
  free(a);
  free(b);
  if (sums) { sums[0] += num; sums[1] += den; }
  return sqrt(num / (den > 1e-300 ? den : 1e-300));
}

static double err(const rx_tensor *dev, const rx_tensor *cpu) { return err_sums(dev, cpu, NULL); }

/* AdamW over the flat buffers: the matrices with decay, the vectors without. */
static int flat_adamw(rx_tensor *const flat[4], int64_t matrices, const rx_adamw_config *ac) {
  int rc = RX_OK;
  for (int r = 0; r < 2 && !rc; r++) {
    rx_tensor *part[4] = {0};
    const int64_t total = flat[0]->numel;
    for (int k = 0; k < 4 && !rc; k++) rc = rx_tensor_narrow(&part[k], flat[k], 0, r ? matrices : 0, r ? total - matrices : matrices);
    if (!rc) rc = rx_adamw_step(part[0], part[1], part[2], part[3], ac, r == 0);
    for (int k = 0; k < 4; k++) rx_tensor_free(part[k]);
  }
  return rc;
}

static void step_both(rx_model *mc, rx_model *mg, rx_tensor **mom, rx_tensor *const flat[4], int64_t matrices,
                      int64_t step, int check_grads, const char *name) {
  const int64_t n = rx_model_param_count(mc);
  rx_tensor *tok = host(RX_I32, tokens), *msk = host(RX_I32, mask);
  rx_tensor *lp_c = host(RX_F32, NULL), *ent_c = host(RX_F32, NULL), *dlp = host(RX_F32, NULL), *dent = host(RX_F32, NULL);
  rx_tensor *lp_g = to_gpu(lp_c, RX_F32), *ent_g = to_gpu(ent_c, RX_F32);
  gpu_must(rx_tensor_normal(dlp, 3 + (uint64_t)step, 0, 0.0, 1.0), dlp);
  gpu_must(rx_tensor_normal(dent, 5 + (uint64_t)step, 0, 0.0, 0.3), dent);
  rx_tensor *dlp_g = to_gpu(dlp, RX_F32);
  /* the head on tiles of 4 rows by slices of 7 of the 23 entries; step 1 checkpoints the layers */
  rx_forward_opts fo = {1, step == 1, 4, 7};
  CHECK_OK(rx_model_logprobs(mc, tok, msk, lp_c, ent_c, &fo));
  CHECK_OK(rx_model_logprobs(mg, tok, msk, lp_g, ent_g, &fo));
  double e_lp = err(lp_g, lp_c), e_ent = err(ent_g, ent_c);
  worst_lp = fmax(worst_lp, fmax(e_lp, e_ent));
  CHECK(e_lp <= tol, "%s step %lld: logprobs differ from the cpu by %g", name, (long long)step, e_lp);
  CHECK(e_ent <= tol, "%s step %lld: entropies differ from the cpu by %g", name, (long long)step, e_ent);
  rx_model_zero_grad(mc);
  rx_model_zero_grad(mg);
  CHECK_OK(rx_model_backward_entropy(mc, dlp, dent));
  CHECK_OK(rx_model_backward_entropy(mg, dlp_g, dent));   /* dlogp on the device, dentropy on the host */
  rx_tensor **gc = calloc((size_t)n, sizeof *gc), **gg = calloc((size_t)n, sizeof *gg);
  double sums[2] = {0, 0};   /* all gradients together */
  for (int64_t i = 0; i < n; i++) {
    gc[i] = rx_model_grad(mc, i);
    gg[i] = rx_model_grad(mg, i);
    CHECK(gg[i] && gg[i]->device == RX_CUDA, "%s: gradient %lld is not on the device", name, (long long)i);
    if (check_grads && gg[i]) {
      double e = err_sums(gg[i], gc[i], sums);
      worst_grad = fmax(worst_grad, e);
      CHECK(e <= tensor_tol, "%s step %lld: gradient of %s differs from the cpu by %g", name, (long long)step,
            rx_model_param_name(mc, i), e);
    }
  }
  if (check_grads) {
    const double all = sqrt(sums[0] / sums[1]);
    CHECK(all <= tol, "%s step %lld: the gradients differ from the cpu by %g (relative L2 over all)", name,
          (long long)step, all);
  }
  double norm_c = 0, norm_g = 0;
  CHECK_OK(rx_clip_grad_norm(gc, n, 0.05, &norm_c));   /* small enough to clip */
  CHECK_OK(rx_clip_grad_norm((rx_tensor *const *)&flat[1], 1, 0.05, &norm_g));
  CHECK(fabs(norm_c - norm_g) <= tol * norm_c, "%s: gradient norm %.9g on the device, %.9g on the cpu", name, norm_g, norm_c);
  /* eps 1e-6, not 1e-8: the key bias's gradient is zero in exact arithmetic (softmax ignores a
   * shift shared by a query's scores), so both devices hand AdamW rounding noise there, which an
   * eps far below it would blow up to steps of size lr in random directions */
  rx_adamw_config ac = {1e-2, 0.9, 0.95, 1e-6, 0.1, step + 1};
  for (int64_t i = 0; i < n; i++)
    CHECK_OK(rx_adamw_step(rx_model_param(mc, i), gc[i], mom[2 * i], mom[2 * i + 1], &ac, rx_model_param(mc, i)->ndim == 2));
  CHECK_OK(flat_adamw(flat, matrices, &ac));
  free(gc);
  free(gg);
  rx_tensor *all[] = {tok, msk, lp_c, ent_c, dlp, dent, lp_g, ent_g, dlp_g};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) rx_tensor_free(all[i]);
}

/* Packed rows (rx_model_logprobs_packed: the three rows' real tokens end to end) on the device
 * against the CPU: log-probabilities, entropies and every gradient, from the same weights. */
static void check_packed(rx_model *mc, rx_model *mg, const char *name) {
  enum { N = 9 + 6 + 7 };
  const int64_t n = rx_model_param_count(mc), ts[2] = {1, N}, cs[1] = {B + 1};
  rx_tensor *tok, *cu, *lp_c, *ent_c, *dlp, *dent;
  gpu_must(rx_tensor_new(&tok, RX_I32, RX_CPU, 2, ts), NULL);
  gpu_must(rx_tensor_new(&cu, RX_I32, RX_CPU, 1, cs), NULL);
  gpu_must(rx_tensor_new(&lp_c, RX_F32, RX_CPU, 2, ts), NULL);
  gpu_must(rx_tensor_new(&ent_c, RX_F32, RX_CPU, 2, ts), NULL);
  gpu_must(rx_tensor_new(&dlp, RX_F32, RX_CPU, 2, ts), NULL);
  gpu_must(rx_tensor_new(&dent, RX_F32, RX_CPU, 2, ts), NULL);
  int32_t *kt = tok->data, *kc = cu->data, k = 0;
  kc[0] = 0;
  for (int b = 0; b < B; b++) {
    for (int t = 0; t < T; t++)
      if (mask[b * T + t]) kt[k++] = tokens[b * T + t];
    kc[b + 1] = k;
  }
  gpu_must(rx_tensor_normal(dlp, 13, 0, 0.0, 1.0), dlp);
  gpu_must(rx_tensor_normal(dent, 15, 0, 0.0, 0.3), dent);
  rx_tensor *lp_g = to_gpu(lp_c, RX_F32), *ent_g = to_gpu(ent_c, RX_F32);
  rx_forward_opts fo = {1, 0, 4, 7};
  CHECK_OK(rx_model_logprobs_packed(mc, tok, cu, lp_c, ent_c, &fo));
  CHECK_OK(rx_model_logprobs_packed(mg, tok, cu, lp_g, ent_g, &fo));
  const double e_lp = err(lp_g, lp_c), e_ent = err(ent_g, ent_c);
  CHECK(e_lp <= tol && e_ent <= tol, "%s packed: logprobs / entropies differ from the cpu by %g / %g", name, e_lp, e_ent);
  rx_model_zero_grad(mc);
  rx_model_zero_grad(mg);
  CHECK_OK(rx_model_backward_entropy(mc, dlp, dent));
  CHECK_OK(rx_model_backward_entropy(mg, dlp, dent));
  double sums[2] = {0, 0}, worst = 0;
  for (int64_t i = 0; i < n; i++) worst = fmax(worst, err_sums(rx_model_grad(mg, i), rx_model_grad(mc, i), sums));
  const double all = sqrt(sums[0] / sums[1]);
  CHECK(worst <= tensor_tol && all <= tol, "%s packed: gradients differ from the cpu by %g (worst tensor), %g (all)", name,
        worst, all);
  fprintf(stderr, "%s packed on the device: logprobs %.2g, entropy %.2g, gradients %.2g\n", name, e_lp, e_ent, all);
  rx_model_zero_grad(mc);
  rx_model_zero_grad(mg);
  rx_tensor *free_[] = {tok, cu, lp_c, ent_c, dlp, dent, lp_g, ent_g};
  for (size_t i = 0; i < sizeof free_ / sizeof free_[0]; i++) rx_tensor_free(free_[i]);
}

static void check_variant(int variant, int32_t dtype) {
  rx_model_config c = config(variant), g = c;
  g.device = RX_CUDA;
  g.dtype = dtype;
  /* bf16: activations and their gradients rounded to 8 bits at every op give each gradient tensor
   * a few percent of relative error (3.3% at worst here), the log-probabilities and the gradients
   * as a whole under 3% */
  tol = dtype == RX_BF16 ? 3e-2 : 1e-5;
  tensor_tol = dtype == RX_BF16 ? 5e-2 : 1e-5;
  rx_model *mc = NULL, *mg = NULL;
  CHECK_OK(rx_model_new(&mc, &c));
  CHECK_OK(rx_model_new(&mg, &g));
  if (!mc || !mg) { rx_model_free(mc); rx_model_free(mg); return; }
  const int64_t n = rx_model_param_count(mc);
  worst_lp = worst_grad = 0;
  rx_tensor **mom = calloc((size_t)(2 * n), sizeof *mom), *flat[4] = {0};
  int64_t matrices = 0;
  CHECK_OK(rx_model_flat(mg, &flat[0], &flat[1], &matrices));
  if (!flat[0]) { free(mom); rx_model_free(mc); rx_model_free(mg); return; }
  CHECK(flat[0]->device == RX_CUDA && flat[1]->device == RX_CUDA, "%s: flat buffers off the device", variant_name[variant]);
  gpu_must(rx_tensor_new(&flat[2], RX_F32, RX_CUDA, 1, flat[0]->shape), NULL);   /* moments on the device */
  gpu_must(rx_tensor_new(&flat[3], RX_F32, RX_CUDA, 1, flat[0]->shape), NULL);
  for (int64_t i = 0; i < n; i++) {
    rx_tensor *p = rx_model_param(mc, i), *q = rx_model_param(mg, i);
    if (strstr(rx_model_param_name(mc, i), "norm.weight")) rx_tensor_uniform(p, 11, (uint64_t)i << 32, 0.5, 1.5);
    else rx_tensor_normal(p, 11, (uint64_t)i << 32, 0.0, 0.3);
    if (dtype == RX_BF16) cpu_round_through(p, RX_BF16);   /* both models then compute with the same weights */
    CHECK(q->device == RX_CUDA, "%s: parameter %s is not on the device", variant_name[variant], rx_model_param_name(mg, i));
    CHECK_OK(rx_tensor_copy(q, p));
    for (int k = 0; k < 2; k++) gpu_must(rx_tensor_new(&mom[2 * i + k], RX_F32, RX_CPU, p->ndim, p->shape), NULL);
  }
  /* the final-norm hidden state at each sequence's last real token (reward models' heads),
   * from the same weights */
  const int64_t index[B] = {8, 8, 6}, hs[2] = {B, c.hidden_size};
  rx_tensor *hc, *hg;
  gpu_must(rx_tensor_new(&hc, RX_F32, RX_CPU, 2, hs), NULL);
  gpu_must(rx_tensor_new(&hg, dtype, RX_CPU, 2, hs), NULL);
  rx_tensor *tok = host(RX_I32, tokens), *msk = host(RX_I32, mask);
  CHECK_OK(rx_model_hidden_at(mc, tok, msk, index, hc));
  CHECK_OK(rx_model_hidden_at(mg, tok, msk, index, hg));
  const double e_hidden = gpu_nrmse(hg, hc);
  CHECK(e_hidden <= tol, "%s: hidden states differ from the cpu by %g", variant_name[variant], e_hidden);
  rx_tensor_free(hc);
  rx_tensor_free(hg);
  rx_tensor_free(tok);
  rx_tensor_free(msk);
  /* bf16: the gradients are compared at the first step only, where both models hold the same
   * weights; after an AdamW step (whose sign-like updates magnify bf16's gradient error into
   * different weights) the log-probabilities and the weights are */
  check_packed(mc, mg, variant_name[variant]);
  for (int64_t s = 0; s < STEPS; s++) step_both(mc, mg, mom, flat, matrices, s, dtype == RX_F32 || s == 0, variant_name[variant]);
  double worst = 0;
  const char *worst_name = "";
  for (int64_t i = 0; i < n; i++) {
    double e = err(rx_model_param(mg, i), rx_model_param(mc, i));
    if (e > worst) { worst = e; worst_name = rx_model_param_name(mc, i); }
  }
  /* bf16: AdamW's sign-like steps on gradients that are rounding noise (the key bias's, zero in
   * exact arithmetic) move weights apart by about lr; only f32 is held to the CPU's weights */
  CHECK(dtype == RX_BF16 || worst <= tol, "%s: after %d steps the weights differ from the cpu's by up to %g (%s)", variant_name[variant],
        STEPS, worst, worst_name);
  fprintf(stderr, "%s, %s on the device: normalised error against the cpu: logprobs/entropy %.2g, gradients %.2g, "
          "weights after %d steps %.2g\n", variant_name[variant], rx_dtype_name(dtype), worst_lp, worst_grad, STEPS, worst);
  for (int64_t i = 0; i < 2 * n; i++) rx_tensor_free(mom[i]);
  rx_tensor_free(flat[2]);
  rx_tensor_free(flat[3]);
  free(mom);
  rx_model_free(mc);
  rx_model_free(mg);
}

static void qwen2_untied_gqa(void) { check_variant(0, RX_F32); }
static void qwen2_tied_mqa(void) { check_variant(1, RX_F32); }
static void qwen3_qk_norm(void) { check_variant(2, RX_F32); }
static void llama31_rope_scaling(void) { check_variant(3, RX_F32); }
/* bf16 activations and working weights, f32 master weights, gradients, statistics and moments */
static void bf16_qwen2_untied_gqa(void) { check_variant(0, RX_BF16); }
static void bf16_qwen2_tied_mqa(void) { check_variant(1, RX_BF16); }
static void bf16_qwen3_qk_norm(void) { check_variant(2, RX_BF16); }
static void bf16_llama31_rope_scaling(void) { check_variant(3, RX_BF16); }

/* A frozen bf16 model on the device (weight_dtype bf16 under bf16 compute: the KL reference, a
 * LoRA base): every parameter in bf16 alone, a third of a trained bf16 model's weight bytes, no
 * gradients; from the same weights it computes the trained bf16 model's log-probabilities and
 * entropies bit for bit (its weights are that model's working copy, rounded from the same f32). */
static void frozen_bf16_model(void) {
  for (int variant = 0; variant < 4; variant++) {
    rx_model_config c = config(variant), g = c, f = c;
    g.device = f.device = RX_CUDA;
    g.dtype = f.dtype = RX_BF16;
    f.weight_dtype = RX_BF16;
    rx_model *mc = NULL, *mg = NULL, *mf = NULL;
    CHECK_OK(rx_model_new(&mc, &c));
    CHECK_OK(rx_model_new(&mg, &g));
    CHECK_OK(rx_model_new(&mf, &f));
    if (!mc || !mg || !mf) { rx_model_free(mc); rx_model_free(mg); rx_model_free(mf); return; }
    CHECK(rx_model_weight_dtype(rx_model_get_config(mf)) == RX_BF16, "frozen model's weight dtype");
    for (int64_t i = 0; i < rx_model_param_count(mc); i++) {
      rx_tensor *p = rx_model_param(mc, i);
      if (strstr(rx_model_param_name(mc, i), "norm.weight")) rx_tensor_uniform(p, 13, (uint64_t)i << 32, 0.5, 1.5);
      else rx_tensor_normal(p, 13, (uint64_t)i << 32, 0.0, 0.3);
      CHECK(rx_model_param(mf, i)->dtype == RX_BF16 && rx_model_param(mf, i)->device == RX_CUDA, "%s: %s on device %d",
            rx_model_param_name(mf, i), rx_dtype_name(rx_model_param(mf, i)->dtype), rx_model_param(mf, i)->device);
      CHECK_OK(rx_tensor_copy(rx_model_param(mg, i), p));
      CHECK_OK(rx_tensor_copy(rx_model_param(mf, i), p));
    }
    rx_model_memory memg, memf;
    rx_model_memory_usage(mg, &memg);
    rx_model_memory_usage(mf, &memf);
    CHECK(3 * memf.param_bytes <= memg.param_bytes + 64 * 3 * rx_model_param_count(mc),
          "%s: frozen bf16 weights take %lld bytes, the trained bf16 model's %lld", variant_name[variant],
          (long long)memf.param_bytes, (long long)memg.param_bytes);
    CHECK(rx_model_grad(mf, 0) == NULL, "%s: a frozen model has no gradients", variant_name[variant]);
    CHECK(memf.grad_bytes == 0, "%s: gradient bytes %lld", variant_name[variant], (long long)memf.grad_bytes);
    rx_tensor *fp = NULL, *fg = NULL;
    int64_t matrices = 0;
    CHECK_FAILS(rx_model_flat(mf, &fp, &fg, &matrices), "a frozen model");
    rx_tensor *tok = host(RX_I32, tokens), *msk = host(RX_I32, mask);
    rx_tensor *lp_c = host(RX_F32, NULL), *ent_c = host(RX_F32, NULL), *lp_g = host(RX_F32, NULL),
              *ent_g = host(RX_F32, NULL), *lp_f = host(RX_F32, NULL), *ent_f = host(RX_F32, NULL);
    rx_forward_opts fo = {0, 0, 4, 7};
    CHECK_OK(rx_model_logprobs(mc, tok, msk, lp_c, ent_c, &fo));
    CHECK_OK(rx_model_logprobs(mg, tok, msk, lp_g, ent_g, &fo));
    CHECK_OK(rx_model_logprobs(mf, tok, msk, lp_f, ent_f, &fo));
    CHECK(gpu_same_bits(lp_f, lp_g) && gpu_same_bits(ent_f, ent_g),
          "%s: the frozen bf16 model's log-probabilities differ from the trained bf16 model's", variant_name[variant]);
    const double e = err(lp_f, lp_c);
    CHECK(e <= 3e-2, "%s: frozen bf16 log-probabilities differ from the f32 cpu's by %g", variant_name[variant], e);
    rx_tensor *all[] = {tok, msk, lp_c, ent_c, lp_g, ent_g, lp_f, ent_f};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) rx_tensor_free(all[i]);
    rx_model_free(mc);
    rx_model_free(mg);
    rx_model_free(mf);
  }
}

/* LoRA on the device, f32 and bf16 (a frozen bf16 base, f32 adapter masters with a bf16 working
 * copy), dropout on, against LoRA on the CPU from the same weights (the base rounded through bf16
 * on both sides for bf16): log-probabilities and every adapter gradient (B random, so A has one
 * too), f32 within 1e-5 each; bf16 log-probabilities within 3e-2, the adapter gradients within
 * 5e-2 as a whole and 8e-2 each (seen 3.4e-2 and 5.8e-2; 2.1e-2 and 6e-2 without dropout): beside
 * the model's own bf16 roundings (its gradients: 3.3e-2 at worst) the adapter path rounds the
 * dropped input (x / (1 - p) is not exact in bf16), x A^T and dy B once more each. */
static void lora_on_the_device(void) {
  for (int k = 0; k < 2; k++) {
    const int32_t dtype = k ? RX_BF16 : RX_F32;
    rx_model_config c = config(0), g = c;
    g.device = RX_CUDA;
    g.dtype = dtype;
    g.weight_dtype = dtype == RX_BF16 ? RX_BF16 : 0;
    rx_model *mc = NULL, *mg = NULL;
    CHECK_OK(rx_model_new(&mc, &c));
    CHECK_OK(rx_model_new(&mg, &g));
    if (!mc || !mg) { rx_model_free(mc); rx_model_free(mg); return; }
    for (int64_t i = 0; i < rx_model_param_count(mc); i++) {
      rx_tensor *p = rx_model_param(mc, i);
      if (strstr(rx_model_param_name(mc, i), "norm.weight")) rx_tensor_uniform(p, 17, (uint64_t)i << 32, 0.5, 1.5);
      else rx_tensor_normal(p, 17, (uint64_t)i << 32, 0.0, 0.3);
      if (dtype == RX_BF16) cpu_round_through(p, RX_BF16);
      CHECK_OK(rx_tensor_copy(rx_model_param(mg, i), p));
    }
    rx_lora_config lc = {4, 8.0, 0.2, 0x7f, 0, 21};
    CHECK_OK(rx_model_lora_init(mc, &lc));
    CHECK_OK(rx_model_lora_init(mg, &lc));
    const int64_t n = rx_model_lora_count(mc);
    for (int64_t i = 1; i < n; i += 2) {   /* B random (it starts at 0), the same on both */
      rx_tensor *b = rx_model_lora_param(mc, i);
      rx_tensor_normal(b, 19, (uint64_t)i << 32, 0.0, 0.2);
      CHECK_OK(rx_tensor_copy(rx_model_lora_param(mg, i), b));
    }
    for (int64_t i = 0; i < n; i++) {
      CHECK_OK(rx_tensor_copy(rx_model_lora_param(mg, i), rx_model_lora_param(mc, i)));
      CHECK(rx_model_lora_param(mg, i)->dtype == RX_F32 && rx_model_lora_param(mg, i)->device == RX_CUDA,
            "%s: adapter %s is %s on device %d", rx_dtype_name(dtype), rx_model_lora_name(mg, i),
            rx_dtype_name(rx_model_lora_param(mg, i)->dtype), rx_model_lora_param(mg, i)->device);
    }
    rx_tensor *tok = host(RX_I32, tokens), *msk = host(RX_I32, mask), *lp_c = host(RX_F32, NULL),
              *lp_g = host(RX_F32, NULL), *dlp = host(RX_F32, NULL);
    gpu_must(rx_tensor_normal(dlp, 23, 0, 0.0, 1.0), dlp);
    rx_forward_opts fo = {1, 0, 4, 7};
    CHECK_OK(rx_model_logprobs(mc, tok, msk, lp_c, NULL, &fo));
    CHECK_OK(rx_model_logprobs(mg, tok, msk, lp_g, NULL, &fo));
    const double tol = dtype == RX_BF16 ? 5e-2 : 1e-5, each = dtype == RX_BF16 ? 8e-2 : 1e-5;
    const double e_lp = err(lp_g, lp_c);
    CHECK(e_lp <= (dtype == RX_BF16 ? 3e-2 : 1e-5), "lora %s: logprobs differ from the cpu by %g", rx_dtype_name(dtype), e_lp);
    CHECK_OK(rx_model_backward(mc, dlp));
    CHECK_OK(rx_model_backward(mg, dlp));
    double sums[2] = {0, 0}, worst = 0;
    for (int64_t i = 0; i < n; i++) {
      rx_tensor *gc = rx_model_lora_grad(mc, i), *gg = rx_model_lora_grad(mg, i);
      CHECK(gg && gg->dtype == RX_F32 && gg->device == RX_CUDA, "lora %s: gradient %lld", rx_dtype_name(dtype), (long long)i);
      if (!gc || !gg) continue;
      const double e = err_sums(gg, gc, sums);
      worst = fmax(worst, e);
      CHECK(e <= each, "lora %s: gradient of %s differs from the cpu by %g", rx_dtype_name(dtype), rx_model_lora_name(mc, i), e);
    }
    const double all = sqrt(sums[0] / sums[1]);
    CHECK(all <= tol, "lora %s: the adapter gradients differ from the cpu by %g", rx_dtype_name(dtype), all);
    fprintf(stderr, "lora %s on the device: logprobs %.2g, adapter gradients %.2g (each <= %.2g)\n", rx_dtype_name(dtype),
            e_lp, all, worst);
    rx_tensor *list[] = {tok, msk, lp_c, lp_g, dlp};
    for (size_t i = 0; i < sizeof list / sizeof list[0]; i++) rx_tensor_free(list[i]);
    rx_model_free(mc);
    rx_model_free(mg);
  }
}

/* What the device cannot do is an error naming it, never a silent CPU model. */
static void device_errors_name_the_problem(void) {
  rx_model_config c = config(0);
  rx_model *m = NULL;
  c.device = 7;
  CHECK_FAILS(rx_model_new(&m, &c), "device 7 is not a device remax knows");
  c.device = RX_CUDA;
  c.dtype = RX_F64;
  CHECK_FAILS(rx_model_new(&m, &c), "compute dtype f64 is not supported on device cuda");
  c.dtype = RX_F16;
  CHECK_FAILS(rx_model_new(&m, &c), "compute dtype f16 is not supported on device cuda");
  c.dtype = RX_F32;
  c.weight_dtype = RX_BF16;
  CHECK_FAILS(rx_model_new(&m, &c), "bf16 weight storage needs f32 compute on the cpu");
  c.weight_dtype = 0;
  CHECK_OK(rx_model_new(&m, &c));
  if (!m) return;   /* generation on the device: tests/gpu/test_generate.c */
  rx_model_free(m);
}

int main(void) {
  if (gpu_skip_unless_present("gpu_test_model")) return GPU_SKIP;
  RUN(qwen2_untied_gqa);
  RUN(qwen2_tied_mqa);
  RUN(qwen3_qk_norm);
  RUN(llama31_rope_scaling);
  RUN(bf16_qwen2_untied_gqa);
  RUN(bf16_qwen2_tied_mqa);
  RUN(bf16_qwen3_qk_norm);
  RUN(bf16_llama31_rope_scaling);
  RUN(frozen_bf16_model);
  RUN(lora_on_the_device);
  RUN(device_errors_name_the_problem);
  return check_summary("gpu_test_model");
}
