/* model.c: the Llama / Qwen2 decoder: parameters, activation plan, forward, backward.
 *
 * One arena per role: parameters, gradients, activations (planned once per (B,T) shape), and
 * one chunk buffer for the head. The head never holds [B,T,vocab]: it computes logits for a
 * chunk of rows, turns them into log p(target) and discards them; backward recomputes them. */
#include "internal.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model/model_internal.h"
#include "core/threads.h"

/* ------------------------------------------------------------------ parameters */

typedef struct param_spec { char name[128]; int32_t ndim; int64_t shape[2]; } param_spec;

static int64_t add_spec(param_spec *specs, int64_t *n, const char *name, int32_t ndim, int64_t a, int64_t b) {
  param_spec *s = &specs[*n];
  snprintf(s->name, sizeof s->name, "%s", name);
  s->ndim = ndim;
  s->shape[0] = a;
  s->shape[1] = b;
  return (*n)++;
}

int32_t rx_model_weight_dtype(const rx_model_config *c) {
  return c->weight_dtype == RX_BF16 && (c->dtype != RX_BF16 || rx_model_frozen_bf16(c)) ? RX_BF16
                                                                                        : rx_model_master_dtype(c);
}

static int check_config(const rx_model_config *c) {
#define POSITIVE(f) if (c->f <= 0) return rx_fail(RX_EINVAL, "model config: " #f " = %lld must be > 0", (long long)c->f)
  POSITIVE(vocab_size); POSITIVE(hidden_size); POSITIVE(intermediate_size); POSITIVE(num_hidden_layers);
  POSITIVE(num_attention_heads); POSITIVE(num_key_value_heads); POSITIVE(head_dim);
#undef POSITIVE
  if (c->num_attention_heads % c->num_key_value_heads)
    return rx_fail(RX_EINVAL, "model config: num_attention_heads = %lld is not a multiple of num_key_value_heads = %lld",
                   (long long)c->num_attention_heads, (long long)c->num_key_value_heads);
  if (c->head_dim % 2) return rx_fail(RX_EINVAL, "model config: head_dim = %lld must be even for RoPE", (long long)c->head_dim);
  if (c->device != RX_CPU && c->device != RX_CUDA)
    return rx_fail(RX_EDEVICE, "model config: device %d is not a device remax knows (cpu = 0, cuda = 1)", c->device);
  if (c->device == RX_CPU && c->dtype != RX_F32 && c->dtype != RX_F64 && c->dtype != RX_BF16)
    return rx_fail(RX_EINVAL, "model config: compute dtype %s is not supported on the cpu (f32, bf16 with f32 master "
                   "weights, f64)", rx_dtype_name(c->dtype));
  if (c->device == RX_CUDA && c->dtype != RX_F32 && c->dtype != RX_BF16)
    return rx_fail(RX_EINVAL, "model config: compute dtype %s is not supported on device cuda (f32, or bf16 with f32 "
                   "master weights)", rx_dtype_name(c->dtype));
  if (c->weight_dtype == RX_BF16 && c->dtype != RX_BF16 && (c->dtype != RX_F32 || c->device != RX_CPU))
    return rx_fail(RX_EINVAL, "model config: bf16 weight storage needs f32 compute on the cpu or bf16 compute on cuda "
                   "(compute dtype %s, device %s)", rx_dtype_name(c->dtype), c->device == RX_CPU ? "cpu" : "cuda");
  if (!(c->rms_norm_eps > 0)) return rx_fail(RX_EINVAL, "model config: rms_norm_eps = %g must be > 0", c->rms_norm_eps);
  if (!(c->rope_theta > 0)) return rx_fail(RX_EINVAL, "model config: rope_theta = %g must be > 0", c->rope_theta);
  if (c->rope_scaling != RX_ROPE_DEFAULT && c->rope_scaling != RX_ROPE_LLAMA3)
    return rx_fail(RX_EINVAL, "model config: rope_scaling kind %d is not supported (default, llama3)", c->rope_scaling);
  if (c->max_position_embeddings <= 0)
    return rx_fail(RX_EINVAL, "model config: max_position_embeddings = %lld must be > 0", (long long)c->max_position_embeddings);
  /* Memory the parameters take (in doubles, which cannot overflow here), checked before anything
   * is allocated: a config asking for 10^12 parameters is refused, not attempted. Each tensor
   * costs its 64-byte-rounded data plus ~512 bytes of names and views. */
  const double L = (double)c->num_hidden_layers, C = (double)c->hidden_size, I = (double)c->intermediate_size;
  const double HD = (double)c->num_attention_heads * (double)c->head_dim, KD = (double)c->num_key_value_heads * (double)c->head_dim;
  const double per_layer = 2 * C + 2 * HD * C + 2 * KD * C + 3 * I * C + (c->attention_bias ? HD + 2 * KD : 0) +
                           (c->qk_norm ? 2 * (double)c->head_dim : 0);
  const double matrices = (double)c->vocab_size * C * (c->tie_word_embeddings ? 1 : 2) +
                          L * (2 * HD * C + 2 * KD * C + 3 * I * C);
  const double params = (double)c->vocab_size * C * (c->tie_word_embeddings ? 1 : 2) + L * per_layer + C;
  const double tensors = L * (9 + (c->attention_bias ? 3 : 0) + (c->qk_norm ? 2 : 0)) + 3;
  const double bytes = matrices * (double)rx_dtype_size(rx_model_weight_dtype(c)) +
                       (params - matrices) * (double)rx_dtype_size(rx_model_vector_dtype(c)) + tensors * (64 + 512);
  /* host memory; a device's allocator refuses what does not fit it, naming the bytes */
  const double memory = c->device == RX_CPU ? (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE) : 0;
  if (!(bytes < 9.2e18) || (memory > 0 && bytes > memory))
    return rx_fail(RX_ENOMEM, "model config: %.4g parameters in %.0f tensors need %.3g GB, more than this machine's %.3g GB of memory",
                   params, tensors, bytes / 1e9, memory / 1e9);
  return RX_OK;
}

int rx_model_new(rx_model **out, const rx_model_config *asked) {
  *out = NULL;
  if (check_config(asked)) return RX_EINVAL;
  /* bf16 on the CPU: f32 activations, master weights and statistics, the weight matrices' GEMMs
   * reading the bf16 working copy (cpu/bf16_gemm.c); the model is an f32 one besides (its config
   * says f32: the dtype of its activations and outputs; rx_model_gemm_dtype says bf16) */
  const int cpu_bf16 = asked->device == RX_CPU && asked->dtype == RX_BF16;
  rx_model_config eff = *asked;
  if (cpu_bf16) eff.dtype = eff.weight_dtype = RX_F32;
  const rx_model_config *cfg = &eff;
  const int64_t L = cfg->num_hidden_layers, C = cfg->hidden_size, I = cfg->intermediate_size, V = cfg->vocab_size;
  const int64_t HD = cfg->num_attention_heads * cfg->head_dim, KD = cfg->num_key_value_heads * cfg->head_dim;
  rx_model *m = calloc(1, sizeof *m);
  param_spec *specs = calloc((size_t)(L * 14 + 3), sizeof *specs);
  if (!m || !specs) { free(m); free(specs); return rx_fail(RX_ENOMEM, "out of memory for the model"); }
  m->cfg = *cfg;
  m->layers = calloc((size_t)L, sizeof *m->layers);
  m->inv_freq = calloc((size_t)(cfg->head_dim / 2), sizeof *m->inv_freq);
  if (!m->layers || !m->inv_freq) {
    free(m->layers); free(m->inv_freq); free(m); free(specs);
    return rx_fail(RX_ENOMEM, "out of memory for the model");
  }
  if (rx_rope_frequencies(cfg, m->inv_freq)) {
    free(m->layers); free(m->inv_freq); free(m); free(specs);
    return RX_EINVAL;
  }
  const int64_t D = cfg->head_dim;
  int64_t n = 0;
  char name[128];
  m->embed = add_spec(specs, &n, "model.embed_tokens.weight", 2, V, C);
  for (int64_t l = 0; l < L; l++) {
    layer_params *lp = &m->layers[l];
#define P(field, suffix, nd, a, b) \
    snprintf(name, sizeof name, "model.layers.%lld.%s", (long long)l, suffix); \
    lp->field = add_spec(specs, &n, name, nd, a, b);
    P(ln1, "input_layernorm.weight", 1, C, 0);
    P(q_w, "self_attn.q_proj.weight", 2, HD, C);
    lp->q_b = lp->k_b = lp->v_b = -1;
    if (cfg->attention_bias) { P(q_b, "self_attn.q_proj.bias", 1, HD, 0); }
    P(k_w, "self_attn.k_proj.weight", 2, KD, C);
    if (cfg->attention_bias) { P(k_b, "self_attn.k_proj.bias", 1, KD, 0); }
    P(v_w, "self_attn.v_proj.weight", 2, KD, C);
    if (cfg->attention_bias) { P(v_b, "self_attn.v_proj.bias", 1, KD, 0); }
    P(o_w, "self_attn.o_proj.weight", 2, C, HD);
    lp->q_norm = lp->k_norm = -1;
    if (cfg->qk_norm) {
      P(q_norm, "self_attn.q_norm.weight", 1, D, 0);
      P(k_norm, "self_attn.k_norm.weight", 1, D, 0);
    }
    P(ln2, "post_attention_layernorm.weight", 1, C, 0);
    P(gate, "mlp.gate_proj.weight", 2, I, C);
    P(up, "mlp.up_proj.weight", 2, I, C);
    P(down, "mlp.down_proj.weight", 2, C, I);
#undef P
  }
  m->final_norm = add_spec(specs, &n, "model.norm.weight", 1, C, 0);
  m->lm_head = cfg->tie_word_embeddings ? m->embed : add_spec(specs, &n, "lm_head.weight", 2, V, C);

  /* one arena for parameters, one for gradients, every tensor 64-byte aligned; the matrices
   * (in the weight dtype) first, then the vectors (norms, biases, in the compute dtype), so that
   * an optimizer over the flat buffer decays one range and not the other (rx_model_flat) */
  const int32_t wdt = rx_model_weight_dtype(cfg), mdt = rx_model_master_dtype(cfg), vdt = rx_model_vector_dtype(cfg);
  int64_t *offsets = calloc((size_t)n, sizeof *offsets), total = 0;
  for (int pass = 2; pass >= 1; pass--) {
    for (int64_t i = 0; i < n && offsets; i++) {
      if (specs[i].ndim != pass) continue;
      offsets[i] = total;
      int64_t numel = specs[i].shape[0] * (specs[i].ndim == 2 ? specs[i].shape[1] : 1);
      total += (numel * rx_dtype_size(specs[i].ndim == 2 ? wdt : vdt) + 63) & ~(int64_t)63;
    }
    if (pass == 2) m->matrix_bytes = total;
  }
  m->n_params = n;
  m->param_bytes = total;
  m->names = calloc((size_t)n, sizeof *m->names);
  m->params = calloc((size_t)n, sizeof *m->params);
  m->grads = calloc((size_t)n, sizeof *m->grads);
  m->param_arena = rx_arena_alloc(cfg->device, (size_t)total, "model parameters", 1, &m->param_handle);
  if (!offsets || !m->names || !m->params || !m->grads || !m->param_arena) {
    free(offsets);
    free(specs);
    rx_model_free(m);
    return rx_fail(RX_ENOMEM, "out of memory for %lld bytes of model parameters and gradients", (long long)(2 * total));
  }
  for (int64_t i = 0; i < n; i++) {
    m->names[i] = strdup(specs[i].name);
    rx_view_init(&m->params[i], (char *)m->param_arena + offsets[i], specs[i].ndim == 2 ? wdt : vdt, cfg->device,
                 specs[i].ndim, specs[i].shape);
    /* gradient views get their memory on first use: a model that only generates (or a frozen
     * reference model) never pays for a second copy of the weights */
    rx_view_init(&m->grads[i], NULL, mdt, cfg->device, specs[i].ndim, specs[i].shape);
  }
  if (asked->dtype == RX_BF16 && !rx_model_frozen_bf16(cfg)) {   /* the working copy: the master's element offsets, in bf16 */
    m->work = calloc((size_t)n, sizeof *m->work);
    m->work_arena = m->work ? rx_arena_alloc(cfg->device, (size_t)(total / 2), "bf16 working weights", 1, &m->work_handle)
                            : NULL;
    if (!m->work_arena) {
      free(offsets);
      free(specs);
      rx_model_free(m);
      return rx_fail(RX_ENOMEM, "out of memory for %lld bytes of bf16 working weights", (long long)(total / 2));
    }
    for (int64_t i = 0; i < n; i++)
      rx_view_init(&m->work[i], (char *)m->work_arena + offsets[i] / 2, RX_BF16, cfg->device, specs[i].ndim,
                   specs[i].shape);
    if (rx_mirror_watch(m->param_arena, (size_t)total, cfg->device, m->work_arena)) {
      free(offsets);
      free(specs);
      rx_model_free(m);
      return RX_ENOMEM;
    }
  }
  free(offsets);
  free(specs);
  *out = m;
  return RX_OK;
}

static void plan_release(plan *p, int32_t device) {
  rx_arena_free(device, p->arena, p->arena_handle);
  rx_arena_free(device, p->head, p->head_handle);
  if (device != RX_CPU) { free(p->h_tokens); free(p->host); }
  free(p->res);
  free(p->acts);
  memset(p, 0, sizeof *p);
}

void rx_model_free(rx_model *m) {
  if (!m) return;
  plan_release(&m->plan, m->cfg.device);
  rx_lora_free(m->lora);
  for (int64_t i = 0; m->names && i < m->n_params; i++) free(m->names[i]);
  free(m->names);
  free(m->params);
  free(m->grads);
  rx_arena_free(m->cfg.device, m->param_arena, m->param_handle);
  if (m->work) rx_mirror_unwatch(m->param_arena);
  rx_arena_free(m->cfg.device, m->work_arena, m->work_handle);
  free(m->work);
  rx_arena_free(m->cfg.device, m->grad_arena, m->grad_handle);
  free(m->layers);
  free(m->inv_freq);
  free(m);
}

/* The gradient arena, allocated (zeroed) the first time gradients are needed. */
static int ensure_grads(rx_model *m) {
  if (m->lora) return rx_lora_ensure_grads(m);   /* frozen base: adapter gradients only */
  if (m->grad_arena) return RX_OK;
  if (rx_model_weight_dtype(&m->cfg) != rx_model_master_dtype(&m->cfg))
    return rx_fail(RX_EINVAL, "model weights are stored in %s, which keeps them frozen: train a model loaded without "
                   "weight_dtype %s (or train LoRA adapters on it)", rx_dtype_name(rx_model_weight_dtype(&m->cfg)),
                   rx_dtype_name(rx_model_weight_dtype(&m->cfg)));
  m->grad_arena = rx_arena_alloc(m->cfg.device, (size_t)m->param_bytes, "model gradients", 1, &m->grad_handle);
  if (!m->grad_arena) return RX_ENOMEM;
  for (int64_t i = 0; i < m->n_params; i++)
    m->grads[i].data = (char *)m->grad_arena + ((char *)m->params[i].data - (char *)m->param_arena);
  return RX_OK;
}

const rx_model_config *rx_model_get_config(const rx_model *m) { return &m->cfg; }
int64_t rx_model_param_count(const rx_model *m) { return m->n_params; }
const char *rx_model_param_name(const rx_model *m, int64_t i) { return i >= 0 && i < m->n_params ? m->names[i] : NULL; }
rx_tensor *rx_model_param(rx_model *m, int64_t i) { return i >= 0 && i < m->n_params ? &m->params[i] : NULL; }
rx_tensor *rx_model_grad(rx_model *m, int64_t i) {
  if (i < 0 || i >= m->n_params || m->lora || ensure_grads(m)) return NULL;
  return &m->grads[i];
}

int rx_model_flat(rx_model *m, rx_tensor **params, rx_tensor **grads, int64_t *matrices) {
  *params = *grads = NULL;
  *matrices = 0;
  if (m->lora) return rx_lora_flat(m, &m->flat_params, &m->flat_grads, params, grads, matrices);
  if (rx_model_weight_dtype(&m->cfg) != rx_model_master_dtype(&m->cfg))
    return rx_fail(RX_EINVAL, "model_flat: the weight matrices are stored in %s, master weights are %s (a frozen model)",
                   rx_dtype_name(rx_model_weight_dtype(&m->cfg)), rx_dtype_name(rx_model_master_dtype(&m->cfg)));
  if (ensure_grads(m)) return RX_ENOMEM;
  const int32_t mdt = rx_model_master_dtype(&m->cfg);
  const int64_t es = rx_dtype_size(mdt), n[1] = {m->param_bytes / es};
  rx_view_init(&m->flat_params, m->param_arena, mdt, m->cfg.device, 1, n);
  rx_view_init(&m->flat_grads, m->grad_arena, mdt, m->cfg.device, 1, n);
  *params = &m->flat_params;
  *grads = &m->flat_grads;
  *matrices = m->matrix_bytes / es;
  return RX_OK;
}

int rx_model_refresh_work(rx_model *m) {
  int rc = rx_lora_refresh_work(m);   /* bf16 adapters from their f32 masters */
  return rc || !m->work ? rc : rx_mirror_sync(m->param_arena);
}

int32_t rx_model_gemm_dtype(const rx_model *m) { return m->work ? RX_BF16 : rx_model_weight_dtype(&m->cfg); }

int64_t rx_model_find_param(const rx_model *m, const char *name) {
  for (int64_t i = 0; i < m->n_params; i++)
    if (strcmp(m->names[i], name) == 0) return i;
  return -1;
}

void rx_model_zero_grad(rx_model *m) {
  const int prof = rx_prof_begin(RX_PROF_ZERO_GRAD);
  if (m->grad_arena) rx_memzero(m->cfg.device, m->grad_arena, (size_t)m->param_bytes);
  rx_lora_zero_grad(m);
  rx_prof_end(prof);
}

void rx_model_memory_usage(const rx_model *m, rx_model_memory *out) {
  out->param_bytes = m->param_bytes + (m->work ? m->param_bytes / 2 : 0) + rx_lora_param_bytes(m);
  out->grad_bytes = (m->grad_arena ? m->param_bytes : 0) + rx_lora_grad_bytes(m);
  out->activation_bytes = m->plan.bytes;
  out->head_bytes = m->plan.head_bytes;
}

/* ------------------------------------------------------------------ activation plan */

typedef struct carver { char *base; int64_t used; int32_t dtype, device; } carver;

/* Reserve a [d0, d1, ...] view; with base NULL only counts bytes (the sizing pass). */
static void carve(carver *c, rx_tensor *t, int32_t dtype, int32_t ndim, int64_t d0, int64_t d1, int64_t d2, int64_t d3) {
  int64_t shape[4] = {d0, d1, d2, d3}, numel = 1;
  for (int i = 0; i < ndim; i++) numel *= shape[i];
  rx_view_init(t, c->base ? c->base + c->used : NULL, dtype, c->device, ndim, shape);
  c->used += (numel * rx_dtype_size(dtype) + 63) & ~(int64_t)63;
}

/* A second view of the same memory with another shape. */
static void alias(rx_tensor *t, const rx_tensor *of, int32_t ndim, int64_t d0, int64_t d1, int64_t d2, int64_t d3) {
  int64_t shape[4] = {d0, d1, d2, d3};
  rx_view_init(t, of->data, of->dtype, of->device, ndim, shape);
}

static void carve_plan(const rx_model_config *cfg, plan *p, carver *c) {
  const int64_t B = p->B, T = p->T, N = B * T, L = cfg->num_hidden_layers, C = cfg->hidden_size;
  const int64_t I = cfg->intermediate_size, H = cfg->num_attention_heads, KV = cfg->num_key_value_heads;
  const int64_t D = cfg->head_dim, dt = cfg->dtype, st = rx_model_master_dtype(cfg);   /* st: statistics */
  for (int64_t l = 0; l <= L; l++) carve(c, &p->res[l], dt, 2, N, C, 0, 0);
  for (int64_t s = 0; s < p->layer_sets; s++) {
    layer_acts *a = &p->acts[s];
    carve(c, &a->rstd1, st, 1, N, 0, 0, 0);
    carve(c, &a->xn1, dt, 2, N, C, 0, 0);
    carve(c, &a->q, dt, 2, N, H * D, 0, 0);
    carve(c, &a->k, dt, 2, N, KV * D, 0, 0);
    carve(c, &a->v, dt, 2, N, KV * D, 0, 0);
    carve(c, &a->att, dt, 2, N, H * D, 0, 0);
    carve(c, &a->lse, st, 3, B, H, T, 0);
    carve(c, &a->x_mid, dt, 2, N, C, 0, 0);
    carve(c, &a->rstd2, st, 1, N, 0, 0, 0);
    carve(c, &a->xn2, dt, 2, N, C, 0, 0);
    carve(c, &a->gate, dt, 2, N, I, 0, 0);
    carve(c, &a->up, dt, 2, N, I, 0, 0);
    carve(c, &a->h, dt, 2, N, I, 0, 0);
    alias(&a->q4, &a->q, 4, B, T, H, D);
    alias(&a->k4, &a->k, 4, B, T, KV, D);
    alias(&a->v4, &a->v, 4, B, T, KV, D);
    alias(&a->att4, &a->att, 4, B, T, H, D);
    if (cfg->qk_norm) {
      carve(c, &a->q_raw, dt, 2, N, H * D, 0, 0);
      carve(c, &a->k_raw, dt, 2, N, KV * D, 0, 0);
      carve(c, &a->q_rstd, st, 1, N * H, 0, 0, 0);
      carve(c, &a->k_rstd, st, 1, N * KV, 0, 0, 0);
      alias(&a->q_rows, &a->q, 2, N * H, D, 0, 0);
      alias(&a->k_rows, &a->k, 2, N * KV, D, 0, 0);
      alias(&a->q_raw_rows, &a->q_raw, 2, N * H, D, 0, 0);
      alias(&a->k_raw_rows, &a->k_raw, 2, N * KV, D, 0, 0);
    }
  }
  carve(c, &p->xf, dt, 2, N, C, 0, 0);
  carve(c, &p->rstdf, st, 1, N, 0, 0, 0);
  carve(c, &p->tokens, RX_I32, 1, N, 0, 0, 0);
  carve(c, &p->mask, RX_I32, 2, B, T, 0, 0);
  carve(c, &p->positions, RX_I32, 1, N, 0, 0, 0);
  carve(c, &p->cu, RX_I32, 1, N + 1, 0, 0, 0);   /* room for N rows of one token */
  carve(c, &p->targets, RX_I32, 1, N, 0, 0, 0);
  carve(c, &p->row_logp, st, 1, N, 0, 0, 0);
  carve(c, &p->row_lse, st, 1, N, 0, 0, 0);
  carve(c, &p->row_entropy, st, 1, N, 0, 0, 0);
  carve(c, &p->row_dlogp, st, 1, N, 0, 0, 0);
  carve(c, &p->row_dentropy, st, 1, N, 0, 0, 0);
  carve(c, &p->head_max, st, 1, N, 0, 0, 0);
  carve(c, &p->head_sum, RX_F64, 1, N, 0, 0, 0);
  carve(c, &p->head_sz, RX_F64, 1, N, 0, 0, 0);
  if (p->train) {
    carve(c, &p->dx, dt, 2, N, C, 0, 0);
    carve(c, &p->dxn, dt, 2, N, C, 0, 0);
    carve(c, &p->dtmp, dt, 2, N, C, 0, 0);
    carve(c, &p->dxf, dt, 2, N, C, 0, 0);
    carve(c, &p->dh, dt, 2, N, I, 0, 0);
    carve(c, &p->dgate, dt, 2, N, I, 0, 0);
    carve(c, &p->dup, dt, 2, N, I, 0, 0);
    carve(c, &p->datt, dt, 2, N, H * D, 0, 0);
    carve(c, &p->dq, dt, 2, N, H * D, 0, 0);
    carve(c, &p->dk, dt, 2, N, KV * D, 0, 0);
    carve(c, &p->dv, dt, 2, N, KV * D, 0, 0);
    alias(&p->datt4, &p->datt, 4, B, T, H, D);
    alias(&p->dq4, &p->dq, 4, B, T, H, D);
    alias(&p->dk4, &p->dk, 4, B, T, KV, D);
    alias(&p->dv4, &p->dv, 4, B, T, KV, D);
    alias(&p->dq_rows, &p->dq, 2, N * H, D, 0, 0);
    alias(&p->dk_rows, &p->dk, 2, N * KV, D, 0, 0);
  }
}

/* The head's logits, ~32 MB at once (big enough for efficient GEMMs, small next to the model):
 * tiles of up to 1024 rows (more when the whole vocabulary of that many fits) by vocabulary
 * slices of what the budget leaves (head.c), for N rows. */
static void head_tile(const rx_model_config *cfg, int64_t N, const rx_forward_opts *opts, int64_t *rows, int64_t *cols) {
  const int64_t budget = 32ll << 20, es = rx_dtype_size(cfg->dtype), V = cfg->vocab_size;
  int64_t chunk = opts && opts->head_chunk_rows > 0 ? opts->head_chunk_rows : 0;
  if (!chunk) {
    chunk = budget / (V * es);
    if (chunk < 1024) chunk = 1024;
  }
  if (chunk > N) chunk = N;
  int64_t c = opts && opts->head_chunk_vocab > 0 ? opts->head_chunk_vocab : budget / (chunk * es) / 16 * 16;
  if (c < 16) c = 16;
  if (c > V) c = V;
  *rows = chunk;
  *cols = c;
}

int rx_model_plan_bytes(const rx_model_config *cfg, int64_t B, int64_t T, const rx_forward_opts *opts,
                        int64_t *activation_bytes, int64_t *head_bytes) {
  *activation_bytes = *head_bytes = 0;
  if (B < 1 || T < 1) return rx_fail(RX_EINVAL, "plan_bytes: B = %lld and T = %lld must be at least 1", (long long)B, (long long)T);
  plan p;
  memset(&p, 0, sizeof p);
  const int32_t train = opts && opts->train, checkpoint = train && opts->checkpoint;
  const int64_t L = cfg->num_hidden_layers;
  p.B = B; p.T = T; p.train = train; p.checkpoint = checkpoint; p.layer_sets = train && !checkpoint ? L : 1;
  p.res = calloc((size_t)(L + 1), sizeof *p.res);
  p.acts = calloc((size_t)p.layer_sets, sizeof *p.acts);
  if (!p.res || !p.acts) { free(p.res); free(p.acts); return rx_fail(RX_ENOMEM, "plan_bytes: out of memory"); }
  carver sizing = {NULL, 0, cfg->dtype, cfg->device};
  carve_plan(cfg, &p, &sizing);
  free(p.res);
  free(p.acts);
  int64_t rows, cols;
  head_tile(cfg, B * T, opts, &rows, &cols);
  *activation_bytes = sizing.used;
  *head_bytes = rows * cols * rx_dtype_size(cfg->dtype);
  return RX_OK;
}

int rx_model_reserve(rx_model *m, int64_t tokens, const rx_forward_opts *opts) {
  if (tokens < 1) return rx_fail(RX_EINVAL, "reserve: tokens = %lld must be at least 1", (long long)tokens);
  const uint64_t forwards = rx_model_lora_forward_count(m);   /* planning is no forward: dropout masks stay */
  const int rc = rx_model_plan(m, 1, tokens, opts);
  rx_model_lora_set_forward_count(m, forwards);
  return rc;
}

/* Plans activations for (B, T, mode); reuses the arena when the shape and mode are unchanged
 * (the usual case: every step has the same shape), and grows it otherwise. */
int rx_model_plan(rx_model *m, int64_t B, int64_t T, const rx_forward_opts *opts) {
  plan *p = &m->plan;
  const int32_t train = opts && opts->train, checkpoint = train && opts->checkpoint;
  const int64_t L = m->cfg.num_hidden_layers, es = rx_dtype_size(m->cfg.dtype);
  int64_t chunk, cols;
  head_tile(&m->cfg, B * T, opts, &chunk, &cols);
  const int64_t sets = train && !checkpoint ? L : 1;
  if (train) rx_lora_begin_train_forward(m);   /* a new dropout mask per train forward */
  if (p->arena && p->B == B && p->T == T && p->train == train && p->checkpoint == checkpoint && p->head_rows == chunk &&
      p->head_cols == cols) {
    p->valid = 0;
    return RX_OK;
  }
  const int32_t dev = m->cfg.device;
  void *old_arena = p->arena, *old_head = p->head, *arena_handle = p->arena_handle, *head_handle = p->head_handle;
  int64_t capacity = p->capacity, head_cap = p->head_bytes;
  free(p->res);
  free(p->acts);
  if (dev != RX_CPU) { free(p->h_tokens); free(p->host); }
  memset(p, 0, sizeof *p);
  p->B = B; p->T = T; p->train = train; p->checkpoint = checkpoint; p->layer_sets = sets;
  p->res = calloc((size_t)(L + 1), sizeof *p->res);
  p->acts = calloc((size_t)sets, sizeof *p->acts);
  if (dev != RX_CPU) {
    p->h_tokens = malloc(sizeof(int32_t) * (size_t)(5 * B * T + 1));
    p->host = malloc((size_t)(4 * B * T) * (size_t)rx_dtype_size(rx_model_master_dtype(&m->cfg)));
  }
  if (!p->res || !p->acts || (dev != RX_CPU && (!p->h_tokens || !p->host))) {
    rx_arena_free(dev, old_arena, arena_handle);
    rx_arena_free(dev, old_head, head_handle);
    plan_release(p, dev);
    return rx_fail(RX_ENOMEM, "out of memory for the activation plan");
  }
  carver sizing = {NULL, 0, m->cfg.dtype, dev};
  carve_plan(&m->cfg, p, &sizing);
  if (sizing.used > capacity) {
    rx_arena_free(dev, old_arena, arena_handle);
    old_arena = rx_arena_alloc(dev, (size_t)sizing.used, "activations", 0, &arena_handle);
    capacity = sizing.used;
    if (!old_arena) {
      rx_arena_free(dev, old_head, head_handle);
      plan_release(p, dev);
      return rx_fail(RX_ENOMEM, "out of memory: activations for B=%lld T=%lld need %.1f MiB", (long long)B,
                     (long long)T, sizing.used / 1048576.0);
    }
  }
  p->arena = old_arena;
  p->arena_handle = arena_handle;
  p->capacity = capacity;
  p->bytes = sizing.used;
  carver real = {p->arena, 0, m->cfg.dtype, dev};
  carve_plan(&m->cfg, p, &real);
  if (dev == RX_CPU) {
    p->h_tokens = p->tokens.data;
    p->h_mask = p->mask.data;
    p->h_positions = p->positions.data;
    p->h_targets = p->targets.data;
    p->h_cu = p->cu.data;
  } else {
    const int64_t N = B * T;
    p->h_mask = p->h_tokens + N;
    p->h_positions = p->h_tokens + 2 * N;
    p->h_targets = p->h_tokens + 3 * N;
    p->h_cu = p->h_tokens + 4 * N;
  }
  const int64_t head_bytes = chunk * cols * es;
  if (head_bytes > head_cap) {
    rx_arena_free(dev, old_head, head_handle);
    old_head = rx_arena_alloc(dev, (size_t)head_bytes, "head logits chunk", 0, &head_handle);
    head_cap = head_bytes;
    if (!old_head) { plan_release(p, dev); return RX_ENOMEM; }
  }
  p->head = old_head;
  p->head_handle = head_handle;
  p->head_bytes = head_cap;
  p->head_rows = chunk;
  p->head_cols = cols;
  return RX_OK;
}

/* ------------------------------------------------------------------ forward */

#define TRY(call) do { int rc_ = (call); if (rc_) return rc_; } while (0)

static rx_tensor *P(rx_model *m, int64_t i) { return rx_model_w(m, i); }
static rx_tensor *G(rx_model *m, int64_t i) { return i >= 0 && !m->lora ? &m->grads[i] : NULL; }

int rx_model_layer_forward(rx_model *m, int64_t l, layer_acts *a, int write_output) {
  plan *p = &m->plan;
  const layer_io io = {&p->res[l], write_output ? &p->res[l + 1] : NULL, &p->positions, rx_plan_mask(p), NULL,
                       rx_plan_cu(p)};
  return rx_model_layer(m, l, a, &io);
}

/* Copies the batch into the plan: tokens (pads mapped to 0), mask, positions counting real
 * tokens, and targets shifted by one (-1 where there is nothing to predict). */
/* A host vector of t's dtype and shape at data, sent to (or read from) t on its device. */
static int send(rx_tensor *t, void *data) {
  rx_tensor h;
  rx_view_init(&h, data, t->dtype, RX_CPU, t->ndim, t->shape);
  return rx_tensor_copy(t, &h);
}

static int fetch(void *data, const rx_tensor *t) {
  rx_tensor h;
  rx_view_init(&h, data, t->dtype, RX_CPU, t->ndim, t->shape);
  return rx_tensor_copy(&h, t);
}

int rx_model_set_inputs(rx_model *m, const int32_t *in_tok, const int32_t *in_mask) {
  plan *p = &m->plan;
  const int64_t B = p->B, T = p->T;
  int32_t *tok = p->h_tokens, *msk = p->h_mask, *pos = p->h_positions, *tgt = p->h_targets;
  p->S = 0;
  for (int64_t b = 0; b < B; b++) {
    int32_t count = 0;
    for (int64_t t = 0; t < T; t++) {
      int64_t i = b * T + t;
      int real = !in_mask || in_mask[i];
      msk[i] = real ? 1 : 0;
      tok[i] = real ? in_tok[i] : 0;
      pos[i] = real ? count++ : 0;
    }
    for (int64_t t = 0; t < T; t++) {
      int64_t i = b * T + t;
      tgt[i] = (t + 1 < T && msk[i] && msk[i + 1]) ? tok[i + 1] : -1;
    }
  }
  if (m->cfg.device == RX_CPU) return RX_OK;
  TRY(send(&p->tokens, tok));
  TRY(send(&p->mask, msk));
  TRY(send(&p->positions, pos));
  return send(&p->targets, tgt);
}

int rx_model_shift_positions(rx_model *m, const int32_t *offset) {
  plan *p = &m->plan;
  const int64_t B = p->B, T = p->T;
  for (int64_t b = 0; b < B; b++)
    for (int64_t t = 0; t < T; t++)
      if (p->h_mask[b * T + t]) p->h_positions[b * T + t] += offset[b];
  if (m->cfg.device == RX_CPU) return RX_OK;
  return send(&p->positions, p->h_positions);
}

int rx_model_set_packed_inputs(rx_model *m, const int32_t *in_tok, const int32_t *cu, int64_t S) {
  plan *p = &m->plan;
  const int64_t N = p->B * p->T;
  int32_t *tok = p->h_tokens, *msk = p->h_mask, *pos = p->h_positions, *tgt = p->h_targets;
  for (int64_t r = 0; r < S; r++)
    for (int64_t i = cu[r]; i < cu[r + 1]; i++) {
      msk[i] = 1;
      tok[i] = in_tok[i];
      pos[i] = (int32_t)(i - cu[r]);
      tgt[i] = i + 1 < cu[r + 1] ? in_tok[i + 1] : -1;
    }
  if (cu[S] != N) return rx_fail(RX_EINVAL, "packed inputs: %d tokens in the rows, the plan holds %lld", cu[S], (long long)N);
  memcpy(p->h_cu, cu, sizeof(int32_t) * (size_t)(S + 1));
  p->S = S;
  const int64_t n1[1] = {S + 1};
  rx_view_init(&p->cu, p->cu.data, RX_I32, m->cfg.device, 1, n1);
  if (m->cfg.device == RX_CPU) return RX_OK;
  TRY(send(&p->tokens, tok));
  TRY(send(&p->mask, msk));
  TRY(send(&p->positions, pos));
  TRY(send(&p->cu, p->h_cu));
  return send(&p->targets, tgt);
}

int rx_model_forward_hidden(rx_model *m, const layer_kv *kv) {
  plan *p = &m->plan;
  if (m->cfg.device == RX_CPU) rx_threads_adapt();   /* the cores other processes leave */
  const int64_t L = m->cfg.num_hidden_layers;
  TRY(rx_embedding_forward(&p->res[0], &p->tokens, rx_model_w(m, m->embed)));
  for (int64_t l = 0; l < L; l++) {
    const layer_io io = {&p->res[l], &p->res[l + 1], &p->positions, rx_plan_mask(p), kv, rx_plan_cu(p)};
    TRY(rx_model_layer(m, l, &p->acts[p->layer_sets == L ? l : 0], &io));
  }
  return rx_rmsnorm_forward(&p->xf, &p->rstdf, &p->res[L], rx_model_w(m, m->final_norm), m->cfg.rms_norm_eps);
}

int rx_model_check_tokens(rx_model *m, const rx_tensor *tokens, const rx_tensor *mask, int64_t *B, int64_t *T) {
  char a[96], b[96];
  if (rx_check_tensor(tokens, "logprobs", "tokens", 2)) return RX_EINVAL;
  if (tokens->dtype != RX_I32) return rx_fail(RX_EINVAL, "logprobs: tokens have dtype %s, expected i32", rx_dtype_name(tokens->dtype));
  *B = tokens->shape[0];
  *T = tokens->shape[1];
  if (*B < 1 || *T < 1) return rx_fail(RX_EINVAL, "logprobs: tokens %s are empty", rx_shape_str(tokens, a, sizeof a));
  if (mask) {
    if (rx_check_tensor(mask, "logprobs", "mask", 2)) return RX_EINVAL;
    if (mask->dtype != RX_I32 || mask->shape[0] != *B || mask->shape[1] != *T)
      return rx_fail(RX_EINVAL, "logprobs: mask %s %s does not match tokens %s", rx_dtype_name(mask->dtype),
                     rx_shape_str(mask, a, sizeof a), rx_shape_str(tokens, b, sizeof b));
  }
  if (tokens->device != RX_CPU || (mask && mask->device != RX_CPU))
    return rx_fail(RX_EINVAL, "logprobs: tokens and mask must be cpu tensors (the model copies them to its device)");
  const int32_t *tok = tokens->data;
  for (int64_t i = 0; i < *B * *T; i++) {
    int real = !mask || ((const int32_t *)mask->data)[i];
    if (real && (tok[i] < 0 || tok[i] >= m->cfg.vocab_size))
      return rx_fail(RX_EINVAL, "logprobs: token %d at row %lld, position %lld is outside the vocabulary [0, %lld)",
                     tok[i], (long long)(i / *T), (long long)(i % *T), (long long)m->cfg.vocab_size);
  }
  return RX_OK;
}

/* The shapes of logp and entropy ([B,T] in the statistics dtype) for tokens [B,T]. */
static int check_outputs(rx_model *m, int64_t B, int64_t T, const rx_tensor *logp, const rx_tensor *entropy) {
  char a[96];
  const int32_t st = rx_model_master_dtype(&m->cfg);   /* f32 for a bf16 model */
  if (rx_check_tensor(logp, "logprobs", "logp", 2) || logp->shape[0] != B || logp->shape[1] != T || logp->dtype != st)
    return rx_fail(RX_EINVAL, "logprobs: logp must be %s [%lld,%lld], got %s %s", rx_dtype_name(st),
                   (long long)B, (long long)T, rx_dtype_name(logp->dtype), rx_shape_str(logp, a, sizeof a));
  if (entropy && (rx_check_tensor(entropy, "logprobs", "entropy", 2) || entropy->numel != B * T || entropy->dtype != st))
    return rx_fail(RX_EINVAL, "logprobs: entropy must be %s [%lld,%lld]", rx_dtype_name(st), (long long)B, (long long)T);
  return RX_OK;
}

/* The forward of the planned batch (inputs set) and its per-token outputs: logp[i] (and
 * entropy[i]) from head row i-1 when that row has a target, else 0. */
static int logprobs_run(rx_model *m, rx_tensor *logp, rx_tensor *entropy) {
  plan *p = &m->plan;
  const int32_t st = rx_model_master_dtype(&m->cfg);
  const int es = (int)rx_dtype_size(st);
  TRY(rx_model_forward_hidden(m, NULL));
  const int32_t *tgt = p->h_targets;
  const int64_t B = p->B, T = p->T, N = B * T;

  TRY(rx_model_head_forward(m));
  /* the head's rows on the host (a device model's through host room), and the outputs' host side */
  const void *lp_rows = p->row_logp.data, *ent_rows = p->row_entropy.data;
  void *lp_out = logp->data, *ent_out = entropy ? entropy->data : NULL;
  if (m->cfg.device != RX_CPU) {
    lp_rows = p->host;
    ent_rows = (char *)p->host + N * es;
    TRY(fetch(p->host, &p->row_logp));
    if (entropy) TRY(fetch((char *)p->host + N * es, &p->row_entropy));
  }
  if (logp->device != RX_CPU) lp_out = (char *)p->host + 2 * N * es;
  if (entropy && entropy->device != RX_CPU) ent_out = (char *)p->host + 3 * N * es;
  if ((logp->device != RX_CPU || (entropy && entropy->device != RX_CPU)) && !p->host)
    return rx_fail(RX_EINVAL, "logprobs: logp and entropy of a cpu model must be cpu tensors");
  /* row (b,t) predicts token (b,t+1) */
  for (int64_t b = 0; b < B; b++)
    for (int64_t t = 0; t < T; t++) {
      int64_t i = b * T + t;
      int valid = t > 0 && tgt[i - 1] >= 0;
      if (es == 4) {
        ((float *)lp_out)[i] = valid ? ((const float *)lp_rows)[i - 1] : 0.0f;
        if (entropy) ((float *)ent_out)[i] = valid ? ((const float *)ent_rows)[i - 1] : 0.0f;
      } else {
        ((double *)lp_out)[i] = valid ? ((const double *)lp_rows)[i - 1] : 0.0;
        if (entropy) ((double *)ent_out)[i] = valid ? ((const double *)ent_rows)[i - 1] : 0.0;
      }
    }
  if (lp_out != logp->data) TRY(send(logp, lp_out));
  if (entropy && ent_out != entropy->data) TRY(send(entropy, ent_out));
  p->valid = p->train;
  return RX_OK;
}

int rx_model_logprobs(rx_model *m, const rx_tensor *tokens, const rx_tensor *mask, rx_tensor *logp,
                      rx_tensor *entropy, const rx_forward_opts *opts) {
  int64_t B = 0, T = 0;
  TRY(rx_model_check_tokens(m, tokens, mask, &B, &T));
  TRY(check_outputs(m, B, T, logp, entropy));
  TRY(rx_model_plan(m, B, T, opts));
  TRY(rx_model_refresh_work(m));
  TRY(rx_model_set_inputs(m, tokens->data, mask ? mask->data : NULL));
  return logprobs_run(m, logp, entropy);
}

int rx_model_check_cu_seqlens(const rx_tensor *cu, int64_t N, const char *op) {
  char a[96];
  if (rx_check_tensor(cu, op, "cu_seqlens", 1)) return RX_EINVAL;
  if (cu->dtype != RX_I32 || cu->device != RX_CPU || cu->shape[0] < 2)
    return rx_fail(RX_EINVAL, "%s: cu_seqlens must be a cpu i32 [S+1] tensor with S >= 1 rows, got %s %s", op,
                   rx_dtype_name(cu->dtype), rx_shape_str(cu, a, sizeof a));
  const int32_t *c = cu->data;
  const int64_t S = cu->shape[0] - 1;
  if (c[0] != 0 || c[S] != N)
    return rx_fail(RX_EINVAL, "%s: cu_seqlens runs from %d to %d, expected 0 to the %lld tokens", op, c[0], c[S], (long long)N);
  for (int64_t r = 0; r < S; r++)
    if (c[r + 1] <= c[r])
      return rx_fail(RX_EINVAL, "%s: row %lld of cu_seqlens is empty or negative ([%d, %d)): every packed row needs a token",
                     op, (long long)r, c[r], c[r + 1]);
  return RX_OK;
}

int rx_model_logprobs_packed(rx_model *m, const rx_tensor *tokens, const rx_tensor *cu_seqlens, rx_tensor *logp,
                             rx_tensor *entropy, const rx_forward_opts *opts) {
  int64_t B = 0, T = 0;
  char a[96];
  TRY(rx_model_check_tokens(m, tokens, NULL, &B, &T));
  if (B != 1) return rx_fail(RX_EINVAL, "logprobs_packed: tokens %s must be [1,N], the rows end to end", rx_shape_str(tokens, a, sizeof a));
  TRY(rx_model_check_cu_seqlens(cu_seqlens, T, "logprobs_packed"));
  TRY(check_outputs(m, B, T, logp, entropy));
  TRY(rx_model_plan(m, B, T, opts));
  TRY(rx_model_refresh_work(m));
  TRY(rx_model_set_packed_inputs(m, tokens->data, cu_seqlens->data, cu_seqlens->shape[0] - 1));
  return logprobs_run(m, logp, entropy);
}

/* ------------------------------------------------------------------ backward */

/* Gradients of layer l given dx = dL/d res[l+1]; leaves dL/d res[l] in dx. */
static int layer_backward(rx_model *m, int64_t l, layer_acts *a) {
  plan *p = &m->plan;
  const layer_params *lp = &m->layers[l];
  rx_tensor *x = &p->res[l];
  /* MLP: res[l+1] = x_mid + down(silu(gate) * up) */
  TRY(rx_model_linear_backward(m, l, RX_PROJ_DOWN, &p->dh, &p->dx, &a->h));
  TRY(rx_swiglu_backward(&p->dgate, &p->dup, &p->dh, &a->gate, &a->up));
  TRY(rx_model_linear_backward(m, l, RX_PROJ_GATE, &p->dxn, &p->dgate, &a->xn2));
  TRY(rx_model_linear_backward(m, l, RX_PROJ_UP, &p->dtmp, &p->dup, &a->xn2));
  TRY(rx_add(&p->dxn, &p->dxn, &p->dtmp));
  TRY(rx_rmsnorm_backward(&p->dtmp, G(m, lp->ln2), &p->dxn, &a->x_mid, P(m, lp->ln2), &a->rstd2));
  TRY(rx_add(&p->dx, &p->dx, &p->dtmp));
  /* attention: x_mid = x + o(attention(rope(q), rope(k), v)) */
  TRY(rx_model_linear_backward(m, l, RX_PROJ_O, &p->datt, &p->dx, &a->att));
  TRY(rx_attention_backward_seq(&p->dq4, &p->dk4, &p->dv4, &p->datt4, &a->q4, &a->k4, &a->v4, &a->att4, &a->lse,
                                rx_plan_mask(p), rx_plan_cu(p), 0.0));
  TRY(rx_rope_backward_freq(&p->dq4, &p->dq4, &p->positions, m->inv_freq));
  TRY(rx_rope_backward_freq(&p->dk4, &p->dk4, &p->positions, m->inv_freq));
  if (m->cfg.qk_norm) {   /* weight gradients first: the input gradient then overwrites dq / dk in place */
    if (G(m, lp->q_norm)) TRY(rx_rmsnorm_backward(NULL, G(m, lp->q_norm), &p->dq_rows, &a->q_raw_rows, P(m, lp->q_norm), &a->q_rstd));
    TRY(rx_rmsnorm_backward(&p->dq_rows, NULL, &p->dq_rows, &a->q_raw_rows, P(m, lp->q_norm), &a->q_rstd));
    if (G(m, lp->k_norm)) TRY(rx_rmsnorm_backward(NULL, G(m, lp->k_norm), &p->dk_rows, &a->k_raw_rows, P(m, lp->k_norm), &a->k_rstd));
    TRY(rx_rmsnorm_backward(&p->dk_rows, NULL, &p->dk_rows, &a->k_raw_rows, P(m, lp->k_norm), &a->k_rstd));
  }
  TRY(rx_model_linear_backward(m, l, RX_PROJ_Q, &p->dxn, &p->dq, &a->xn1));
  TRY(rx_model_linear_backward(m, l, RX_PROJ_K, &p->dtmp, &p->dk, &a->xn1));
  TRY(rx_add(&p->dxn, &p->dxn, &p->dtmp));
  TRY(rx_model_linear_backward(m, l, RX_PROJ_V, &p->dtmp, &p->dv, &a->xn1));
  TRY(rx_add(&p->dxn, &p->dxn, &p->dtmp));
  TRY(rx_rmsnorm_backward(&p->dtmp, G(m, lp->ln1), &p->dxn, x, P(m, lp->ln1), &a->rstd1));
  TRY(rx_add(&p->dx, &p->dx, &p->dtmp));
  return RX_OK;
}

int rx_model_backward(rx_model *m, const rx_tensor *dlogp) { return rx_model_backward_entropy(m, dlogp, NULL); }

int rx_model_backward_entropy(rx_model *m, const rx_tensor *dlogp, const rx_tensor *dentropy) {
  plan *p = &m->plan;
  if (m->cfg.device == RX_CPU) rx_threads_adapt();
  char a[96];
  if (!p->valid) return rx_fail(RX_EINVAL, "backward: no train forward to differentiate (call logprobs with train = true first)");
  TRY(ensure_grads(m));
  const int32_t st = rx_model_master_dtype(&m->cfg);   /* f32 for a bf16 model */
  const int64_t B = p->B, T = p->T, N = B * T;
  if (rx_check_tensor(dlogp, "backward", "dlogp", 2) || dlogp->shape[0] != B || dlogp->shape[1] != T || dlogp->dtype != st)
    return rx_fail(RX_EINVAL, "backward: dlogp must be %s [%lld,%lld] like the forward's logp, got %s %s",
                   rx_dtype_name(st), (long long)B, (long long)T, rx_dtype_name(dlogp->dtype),
                   rx_shape_str(dlogp, a, sizeof a));
  if (dentropy && (rx_check_tensor(dentropy, "backward", "dentropy", 2) || dentropy->shape[0] != B ||
                   dentropy->shape[1] != T || dentropy->dtype != st))
    return rx_fail(RX_EINVAL, "backward: dentropy must be %s [%lld,%lld] like the forward's entropy, got %s %s",
                   rx_dtype_name(st), (long long)B, (long long)T, rx_dtype_name(dentropy->dtype),
                   rx_shape_str(dentropy, a, sizeof a));
  /* dlogp[b,t] belongs to head row (b,t-1); so does dentropy[b,t]. A device model's rows and
   * a device dlogp / dentropy pass through host room. */
  const int32_t *tgt = p->h_targets;
  const int64_t es = rx_dtype_size(st);
  const void *din = dlogp->data, *dein = dentropy ? dentropy->data : NULL;
  void *rows = p->row_dlogp.data, *erows = p->row_dentropy.data;
  if ((dlogp->device != RX_CPU || (dentropy && dentropy->device != RX_CPU)) && !p->host)
    return rx_fail(RX_EINVAL, "backward: dlogp and dentropy of a cpu model must be cpu tensors");
  if (dlogp->device != RX_CPU) {
    TRY(fetch(p->host, dlogp));
    din = p->host;
  }
  if (dentropy && dentropy->device != RX_CPU) {
    TRY(fetch((char *)p->host + N * es, dentropy));
    dein = (char *)p->host + N * es;
  }
  if (m->cfg.device != RX_CPU) {
    rows = (char *)p->host + 2 * N * es;
    erows = (char *)p->host + 3 * N * es;
  }
  for (int64_t i = 0; i < N; i++) {
    int has = (i % T) + 1 < T && tgt[i] >= 0;
    if (st == RX_F32) {
      ((float *)rows)[i] = has ? ((const float *)din)[i + 1] : 0.0f;
      if (dentropy) ((float *)erows)[i] = has ? ((const float *)dein)[i + 1] : 0.0f;
    } else {
      ((double *)rows)[i] = has ? ((const double *)din)[i + 1] : 0.0;
      if (dentropy) ((double *)erows)[i] = has ? ((const double *)dein)[i + 1] : 0.0;
    }
  }
  if (rows != p->row_dlogp.data) TRY(send(&p->row_dlogp, rows));
  if (dentropy && erows != p->row_dentropy.data) TRY(send(&p->row_dentropy, erows));
  TRY(rx_model_head_backward(m, dentropy != NULL));
  return rx_model_backward_trunk(m);
}

/* From dL/d xf (plan.dxf, the final-norm hidden states) down: the final norm, the layers (the
 * checkpointed ones recomputed) and the embedding. Shared by the language-model head's backward
 * and a sequence-classification head's (hidden.c). */
int rx_model_backward_trunk(rx_model *m) {
  plan *p = &m->plan;
  const int64_t L = m->cfg.num_hidden_layers;
  TRY(ensure_grads(m));
  TRY(rx_rmsnorm_backward(&p->dx, G(m, m->final_norm), &p->dxf, &p->res[L], rx_model_w(m, m->final_norm), &p->rstdf));
  for (int64_t l = L - 1; l >= 0; l--) {
    layer_acts *acts = &p->acts[p->layer_sets == L ? l : 0];
    if (p->layer_sets != L) TRY(rx_model_layer_forward(m, l, acts, 0));            /* gradient checkpointing */
    TRY(layer_backward(m, l, acts));
  }
  if (!m->lora) TRY(rx_embedding_backward(&m->grads[m->embed], &p->dx, &p->tokens));
  p->valid = 0;
  return RX_OK;
}
