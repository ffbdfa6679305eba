/* lora.c: low-rank adapters on the decoder's linear layers: their term in the linear layers'
 * forward and backward (rx_lora_linear_*, called by the base linear in engine/model/linear.c).
 *
 *   y = x W^T + b + s * (drop(x) A^T) B^T,  s = alpha / r,  A [r, in], B [out, r]
 *
 * Adapters and their gradients live in two arenas of their own. The adapter term runs over
 * chunks of rows so its scratch stays small ([chunk, in + out + 2r]) whatever the batch: the
 * product x A^T is recomputed in backward (r is small, so that costs r/out of the base GEMM)
 * instead of being kept per layer. Dropout masks are Philox draws keyed by (seed, train
 * forward, layer, projection, element), so backward and gradient checkpointing redraw the
 * forward's mask instead of storing it.
 *
 * Under bf16 compute (cuda) the adapters keep f32 master weights and f32 gradients (what the
 * optimizer sees: rx_model_flat) and a bf16 working copy that the matmuls read, a mirror of the
 * masters (core/internal.h) as the model's own: AdamW rounds it, other writes make the next
 * forward convert it (rx_model_refresh_work); the base is
 * then usually a frozen bf16 model (weight_dtype bf16: its weights in bf16 alone). */
#include "internal.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/model_internal.h"
#include "ops/engine_ops.h"

enum { LORA_CHUNK_ROWS = 256 };

struct rx_lora {
  rx_lora_config cfg;
  double scale;
  int32_t enabled;
  uint64_t forwards;           /* train forwards so far; the current one's masks use this value */
  int64_t n;                   /* adapter tensors */
  char **names;
  int64_t *base;               /* base parameter of each adapter tensor */
  rx_tensor *params, *grads;
  rx_tensor *work;             /* bf16 compute: the adapters in bf16 (master offsets / 2); else NULL */
  void *param_arena, *grad_arena, *work_arena;
  int64_t bytes;
  int64_t (*index)[RX_PROJ_COUNT];   /* [layer][proj]: index of A (B follows), or -1 */
  int64_t *of_param;           /* base parameter -> index of A, or -1 */
  void *scratch;               /* chunk rows of: dropped x [in], x A^T [r], dout B [r], y / dx [max(in, out)] */
  int64_t max_in, max_out;
  int32_t device;              /* the model's: adapters, their gradients and the scratch live there */
  void *param_handle, *grad_handle, *scratch_handle, *work_handle;   /* their allocator's pieces (rx_arena_free) */
  float *draws;                /* a device model's dropout: the uniform draws of a chunk, [rows, max_in] f32 */
  void *draws_handle;
};


void rx_lora_free(rx_lora *lo) {
  if (!lo) return;
  for (int64_t i = 0; lo->names && i < lo->n; i++) free(lo->names[i]);
  free(lo->names);
  free(lo->base);
  free(lo->params);
  free(lo->grads);
  free(lo->index);
  free(lo->of_param);
  rx_arena_free(lo->device, lo->param_arena, lo->param_handle);
  rx_arena_free(lo->device, lo->grad_arena, lo->grad_handle);
  rx_arena_free(lo->device, lo->scratch, lo->scratch_handle);
  if (lo->work_arena) rx_mirror_unwatch(lo->param_arena);
  rx_arena_free(lo->device, lo->work_arena, lo->work_handle);
  free(lo->work);
  rx_arena_free(lo->device, lo->draws, lo->draws_handle);
  free(lo);
}

int rx_model_frozen(const rx_model *m) { return m->lora != NULL; }

int rx_model_lora_init(rx_model *m, const rx_lora_config *cfg) {
  const rx_model_config *c = &m->cfg;
  const int64_t L = c->num_hidden_layers;
  if (m->lora) return rx_fail(RX_EINVAL, "lora: the model already has adapters");
  if (!cfg->targets || (cfg->targets >> RX_PROJ_COUNT))
    return rx_fail(RX_EINVAL, "lora: targets = 0x%x names no projection (bits 0..6: q, k, v, o, gate, up, down)",
                   cfg->targets);
  if (!(cfg->dropout >= 0 && cfg->dropout < 1))
    return rx_fail(RX_EINVAL, "lora: dropout = %g must be in [0, 1)", cfg->dropout);
  if (!isfinite(cfg->alpha)) return rx_fail(RX_EINVAL, "lora: alpha = %g must be finite", cfg->alpha);
  rx_lora *lo = calloc(1, sizeof *lo);
  if (!lo) return rx_fail(RX_ENOMEM, "out of memory for LoRA adapters");
  lo->cfg = *cfg;
  lo->enabled = 1;
  lo->scale = cfg->alpha / (double)cfg->r;
  const int64_t per_layer = 2 * __builtin_popcount(cfg->targets);
  lo->n = L * per_layer;
  lo->names = calloc((size_t)lo->n, sizeof *lo->names);
  lo->base = calloc((size_t)lo->n, sizeof *lo->base);
  lo->params = calloc((size_t)lo->n, sizeof *lo->params);
  lo->grads = calloc((size_t)lo->n, sizeof *lo->grads);
  lo->index = calloc((size_t)L, sizeof *lo->index);
  lo->of_param = malloc(sizeof *lo->of_param * (size_t)m->n_params);
  int64_t *offsets = calloc((size_t)lo->n, sizeof *offsets);
  if (!lo->names || !lo->base || !lo->params || !lo->grads || !lo->index || !lo->of_param || !offsets) {
    free(offsets);
    rx_lora_free(lo);
    return rx_fail(RX_ENOMEM, "out of memory for LoRA adapters");
  }
  for (int64_t i = 0; i < m->n_params; i++) lo->of_param[i] = -1;
  /* adapters and gradients in the master dtype (f32 under bf16 compute), the scratch in the
   * compute dtype */
  const int32_t mdt = rx_model_master_dtype(c);
  const int64_t es = rx_dtype_size(mdt), ces = rx_dtype_size(c->dtype);
  int64_t k = 0, total = 0;
  for (int64_t l = 0; l < L; l++)
    for (int32_t p = 0; p < RX_PROJ_COUNT; p++) {
      lo->index[l][p] = -1;
      if (!(cfg->targets & (1u << p))) continue;
      int64_t w, b;
      rx_model_proj_param(m, l, p, &w, &b);
      const int64_t out = m->params[w].shape[0], in = m->params[w].shape[1];
      if (cfg->r < 1 || cfg->r > (in < out ? in : out)) {
        free(offsets);
        rx_lora_free(lo);
        return rx_fail(RX_EINVAL, "lora: r = %lld must be in [1, %lld] for %s [%lld,%lld]", (long long)cfg->r,
                       (long long)(in < out ? in : out), m->names[w], (long long)out, (long long)in);
      }
      if (in > lo->max_in) lo->max_in = in;
      if (out > lo->max_out) lo->max_out = out;
      lo->index[l][p] = k;
      lo->of_param[w] = k;
      for (int ab = 0; ab < 2; ab++, k++) {
        char name[160];
        const size_t stem = strlen(m->names[w]) - strlen(".weight");
        snprintf(name, sizeof name, "%.*s.lora_%c.weight", (int)stem, m->names[w], ab ? 'B' : 'A');
        lo->names[k] = strdup(name);
        lo->base[k] = w;
        int64_t shape[2] = {ab ? out : cfg->r, ab ? cfg->r : in};
        rx_view_init(&lo->params[k], NULL, mdt, c->device, 2, shape);
        rx_view_init(&lo->grads[k], NULL, mdt, c->device, 2, shape);
        offsets[k] = total;
        total += (shape[0] * shape[1] * es + 63) & ~(int64_t)63;
      }
    }
  lo->bytes = total;
  const int64_t wide = lo->max_in > lo->max_out ? lo->max_in : lo->max_out;
  lo->device = c->device;
  /* zeroed: the padding between adapters stays 0 under an optimizer over the flat buffer */
  lo->param_arena = rx_arena_alloc(c->device, (size_t)total, "LoRA adapters", 1, &lo->param_handle);
  lo->scratch = rx_arena_alloc(c->device, (size_t)(LORA_CHUNK_ROWS * (lo->max_in + 2 * cfg->r + wide) * ces),
                               "LoRA scratch", 0, &lo->scratch_handle);
  if (c->device != RX_CPU && cfg->dropout > 0)
    lo->draws = rx_arena_alloc(c->device, sizeof(float) * (size_t)(LORA_CHUNK_ROWS * lo->max_in), "LoRA dropout draws", 0,
                               &lo->draws_handle);
  if (c->dtype == RX_BF16) {
    lo->work = calloc((size_t)lo->n, sizeof *lo->work);
    lo->work_arena = lo->work ? rx_arena_alloc(c->device, (size_t)(total / 2), "LoRA adapters (bf16 working copy)", 1,
                                               &lo->work_handle)
                              : NULL;
  }
  if (!lo->param_arena || !lo->scratch || (c->device != RX_CPU && cfg->dropout > 0 && !lo->draws) ||
      (c->dtype == RX_BF16 && (!lo->work_arena ||
                               rx_mirror_watch(lo->param_arena, (size_t)total, c->device, lo->work_arena)))) {
    free(offsets);
    rx_lora_free(lo);
    return RX_ENOMEM;
  }
  for (int64_t i = 0; i < lo->n; i++) {
    rx_tensor *t = &lo->params[i];
    t->data = (char *)lo->param_arena + offsets[i];
    if (lo->work)
      rx_view_init(&lo->work[i], (char *)lo->work_arena + offsets[i] / 2, RX_BF16, c->device, 2, t->shape);
    if (i % 2 == 0) {   /* A: kaiming_uniform_(a = sqrt(5)) over fan_in = in, i.e. U(-1/sqrt(in), 1/sqrt(in)) */
      const double bound = 1.0 / sqrt((double)t->shape[1]);
      rx_tensor_uniform(t, cfg->seed, (uint64_t)i << 40, -bound, bound);
    } else {
      rx_tensor_fill(t, 0.0);
    }
  }
  free(offsets);
  /* the base is frozen from here on: its gradients (if any were made) go */
  rx_arena_free(m->cfg.device, m->grad_arena, m->grad_handle);
  m->grad_arena = m->grad_handle = NULL;
  for (int64_t i = 0; i < m->n_params; i++) m->grads[i].data = NULL;
  m->lora = lo;
  return RX_OK;
}

int rx_lora_ensure_grads(rx_model *m) {
  rx_lora *lo = m->lora;
  if (lo->grad_arena) return RX_OK;
  lo->grad_arena = rx_arena_alloc(lo->device, (size_t)lo->bytes, "LoRA gradients", 1, &lo->grad_handle);
  if (!lo->grad_arena) return RX_ENOMEM;
  for (int64_t i = 0; i < lo->n; i++)
    lo->grads[i].data = (char *)lo->grad_arena + ((char *)lo->params[i].data - (char *)lo->param_arena);
  return RX_OK;
}

void rx_lora_zero_grad(rx_model *m) {
  if (m->lora && m->lora->grad_arena) rx_memzero(m->lora->device, m->lora->grad_arena, (size_t)m->lora->bytes);
}

void rx_lora_begin_train_forward(rx_model *m) {
  if (m->lora) m->lora->forwards++;
}

int rx_lora_flat(rx_model *m, rx_tensor *fp, rx_tensor *fg, rx_tensor **params, rx_tensor **grads, int64_t *matrices) {
  rx_lora *lo = m->lora;
  int rc = rx_lora_ensure_grads(m);
  if (rc) return rc;
  const int32_t dt = lo->params[0].dtype;
  const int64_t n[1] = {lo->bytes / rx_dtype_size(dt)};
  rx_view_init(fp, lo->param_arena, dt, lo->device, 1, n);
  rx_view_init(fg, lo->grad_arena, dt, lo->device, 1, n);
  *params = fp;
  *grads = fg;
  *matrices = n[0];
  return RX_OK;
}

int64_t rx_lora_param_bytes(const rx_model *m) { return m->lora ? m->lora->bytes + (m->lora->work ? m->lora->bytes / 2 : 0) : 0; }

int rx_lora_refresh_work(rx_model *m) {
  return m->lora && m->lora->work ? rx_mirror_sync(m->lora->param_arena) : RX_OK;
}

/* Adapter tensor k as the matmuls read it: the bf16 working copy under bf16 compute. */
static const rx_tensor *lora_w(const rx_lora *lo, int64_t k) { return lo->work ? &lo->work[k] : &lo->params[k]; }
int64_t rx_lora_grad_bytes(const rx_model *m) { return m->lora && m->lora->grad_arena ? m->lora->bytes : 0; }

const rx_lora_config *rx_model_lora_get_config(const rx_model *m) { return m->lora ? &m->lora->cfg : NULL; }
int64_t rx_model_lora_count(const rx_model *m) { return m->lora ? m->lora->n : 0; }
const char *rx_model_lora_name(const rx_model *m, int64_t i) {
  return m->lora && i >= 0 && i < m->lora->n ? m->lora->names[i] : NULL;
}
rx_tensor *rx_model_lora_param(rx_model *m, int64_t i) {
  return m->lora && i >= 0 && i < m->lora->n ? &m->lora->params[i] : NULL;
}
rx_tensor *rx_model_lora_grad(rx_model *m, int64_t i) {
  if (!m->lora || i < 0 || i >= m->lora->n || rx_lora_ensure_grads(m)) return NULL;
  return &m->lora->grads[i];
}
void rx_model_lora_set_enabled(rx_model *m, int32_t enabled) {
  if (m->lora) m->lora->enabled = enabled ? 1 : 0;
}
int32_t rx_model_lora_enabled(const rx_model *m) { return m->lora ? m->lora->enabled : 0; }
uint64_t rx_model_lora_forward_count(const rx_model *m) { return m->lora ? m->lora->forwards : 0; }
void rx_model_lora_set_forward_count(rx_model *m, uint64_t count) {
  if (m->lora) m->lora->forwards = count;
}

/* ------------------------------------------------------------------ the adapter term */

typedef struct chunk {
  rx_tensor x, xd, xa, u, wide;   /* rows of inp; dropped inp; s * xd A^T; dout B; y or dxd */
  int64_t r0, n;
} chunk;

/* Views for rows [r0, r0+n) of a call with `in` inputs and `out` outputs. */
static void chunk_views(const rx_lora *lo, chunk *ch, const rx_tensor *inp, int64_t r0, int64_t n, int64_t in,
                        int64_t out, int wide_cols) {
  const int64_t es = rx_dtype_size(inp->dtype), r = lo->cfg.r;
  char *s = lo->scratch;
  int64_t sx[2] = {n, in}, sr[2] = {n, r}, sw[2] = {n, wide_cols ? out : in};
  ch->r0 = r0;
  ch->n = n;
  rx_view_init(&ch->x, (char *)inp->data + r0 * in * es, inp->dtype, inp->device, 2, sx);
  rx_view_init(&ch->xd, s, inp->dtype, inp->device, 2, sx);
  s += LORA_CHUNK_ROWS * lo->max_in * es;
  rx_view_init(&ch->xa, s, inp->dtype, inp->device, 2, sr);
  s += LORA_CHUNK_ROWS * r * es;
  rx_view_init(&ch->u, s, inp->dtype, inp->device, 2, sr);
  s += LORA_CHUNK_ROWS * r * es;
  rx_view_init(&ch->wide, s, inp->dtype, inp->device, 2, sw);
  (void)out;
}

/* Dropout keep factor of element i of the chunk: 0 or 1/(1-p), from the Philox draw in u. */
static uint64_t mask_offset(const rx_model *m, int64_t l, int32_t proj) {
  return (((m->lora->forwards * (uint64_t)m->cfg.num_hidden_layers + (uint64_t)l) * RX_PROJ_COUNT + (uint64_t)proj)
          << 36);
}

/* xd = x * keep / (1 - p), or with dy given also dy *= keep / (1 - p) (the mask redrawn): the
 * draws are made in xd itself on the CPU (its dtype), in an f32 scratch on a device (the CPU's f32
 * numbers, so bf16 activations get the CPU's masks), and the dropout op applies them there. */
static int dropout_rows(const rx_model *m, int64_t l, int32_t proj, chunk *ch, rx_tensor *dy) {
  const rx_lora *lo = m->lora;
  const int64_t in = ch->x.shape[1];
  rx_tensor u = ch->xd;
  if (lo->device != RX_CPU) rx_view_init(&u, lo->draws, RX_F32, lo->device, 2, ch->xd.shape);
  int rc = rx_tensor_uniform(&u, lo->cfg.seed ^ 0x9e3779b97f4a7c15ull, mask_offset(m, l, proj) + (uint64_t)(ch->r0 * in), 0, 1);
  return rc ? rc : rx_dropout_apply(&ch->xd, &ch->x, &u, lo->cfg.dropout, dy);
}

#define TRY(call) do { int rc_ = (call); if (rc_) return rc_; } while (0)

/* The adapter's input of a chunk: xd (dropout only in train forwards) and xa = s * xd A^T. */
static int adapter_input(rx_model *m, int64_t l, int32_t proj, int64_t a, chunk *ch, int train, rx_tensor *dy) {
  const rx_lora *lo = m->lora;
  if (train && lo->cfg.dropout > 0) TRY(dropout_rows(m, l, proj, ch, dy));
  else ch->xd = ch->x;
  TRY(rx_model_matmul(m, &ch->xa, &ch->xd, lora_w(lo, a), NULL));
  return rx_scale(&ch->xa, lo->scale);
}

static int64_t adapter_of(const rx_model *m, int64_t l, int32_t proj) {
  return m->lora && m->lora->enabled ? m->lora->index[l][proj] : -1;
}

/* The adapter's term added to out = inp W^T + b (the base linear, engine/model/linear.c), when
 * layer l's projection proj has an adapter that is on; W: the base weight (its shape). */
int rx_lora_linear_forward(rx_model *m, int64_t l, int32_t proj, rx_tensor *out, const rx_tensor *inp,
                           const rx_tensor *W) {
  const int64_t a = adapter_of(m, l, proj);
  if (a < 0) return RX_OK;
  const int64_t in = W->shape[1], o = W->shape[0], N = inp->numel / in, es = rx_dtype_size(out->dtype);
  const int train = m->plan.train;
  for (int64_t r0 = 0; r0 < N; r0 += LORA_CHUNK_ROWS) {
    chunk ch;
    const int64_t n = N - r0 < LORA_CHUNK_ROWS ? N - r0 : LORA_CHUNK_ROWS;
    chunk_views(m->lora, &ch, inp, r0, n, in, o, 1);
    TRY(adapter_input(m, l, proj, a, &ch, train, NULL));
    TRY(rx_model_matmul(m, &ch.wide, &ch.xa, lora_w(m->lora, a + 1), NULL));
    rx_tensor y;
    int64_t sy[2] = {n, o};
    rx_view_init(&y, (char *)out->data + r0 * o * es, out->dtype, out->device, 2, sy);
    TRY(rx_add(&y, &y, &ch.wide));
  }
  return RX_OK;
}

/* The adapter's part of the linear backward: its gradients accumulated, its dinp added. */
int rx_lora_linear_backward(rx_model *m, int64_t l, int32_t proj, rx_tensor *dinp, const rx_tensor *dout,
                            const rx_tensor *inp, const rx_tensor *W) {
  const int64_t a = adapter_of(m, l, proj);
  if (a < 0) return RX_OK;
  rx_lora *lo = m->lora;
  const int64_t in = W->shape[1], o = W->shape[0], N = inp->numel / in, es = rx_dtype_size(inp->dtype);
  for (int64_t r0 = 0; r0 < N; r0 += LORA_CHUNK_ROWS) {
    chunk ch;
    const int64_t n = N - r0 < LORA_CHUNK_ROWS ? N - r0 : LORA_CHUNK_ROWS;
    chunk_views(lo, &ch, inp, r0, n, in, o, 0);
    TRY(adapter_input(m, l, proj, a, &ch, 1, NULL));
    rx_tensor dy, dx;
    int64_t sy[2] = {n, o}, sx[2] = {n, in};
    rx_view_init(&dy, (char *)dout->data + r0 * o * es, dout->dtype, dout->device, 2, sy);
    rx_view_init(&dx, (char *)dinp->data + r0 * in * es, dinp->dtype, dinp->device, 2, sx);
    /* y = xa B^T: u = dout B, dB += dout^T xa; xa = s xd A^T: dA += (s u)^T xd, dxd = s u A */
    TRY(rx_matmul_backward(&ch.u, &lo->grads[a + 1], NULL, &dy, &ch.xa, lora_w(lo, a + 1)));
    TRY(rx_scale(&ch.u, lo->scale));
    TRY(rx_matmul_backward(&ch.wide, &lo->grads[a], NULL, &ch.u, &ch.xd, lora_w(lo, a)));
    if (lo->cfg.dropout > 0) TRY(dropout_rows(m, l, proj, &ch, &ch.wide));   /* dx = dxd * keep / (1-p) */
    TRY(rx_add(&dx, &dx, &ch.wide));
  }
  return RX_OK;
}

int rx_model_lora_merged(rx_model *m, int64_t param, rx_tensor *out) {
  char a[96], b[96];
  if (param < 0 || param >= m->n_params) return rx_fail(RX_EINVAL, "lora_merged: no parameter %lld", (long long)param);
  const rx_tensor *W = rx_model_w(m, param);
  if (!out || out->numel != W->numel || out->dtype != W->dtype || !rx_tensor_is_contiguous(out))
    return rx_fail(RX_EINVAL, "lora_merged: out must be a contiguous %s %s like %s, got %s %s", rx_dtype_name(W->dtype),
                   rx_shape_str(W, a, sizeof a), m->names[param], out ? rx_dtype_name(out->dtype) : "NULL",
                   out ? rx_shape_str(out, b, sizeof b) : "");
  if (out->device != RX_CPU) return rx_fail(RX_EINVAL, "lora_merged: out must be a cpu tensor (got device %d)", out->device);
  TRY(rx_tensor_copy(out, W));
  const int64_t k = m->lora ? m->lora->of_param[param] : -1;
  if (k < 0) return RX_OK;
  const rx_tensor *A = &m->lora->params[k], *B = &m->lora->params[k + 1];
  const int64_t r = A->shape[0], in = A->shape[1], o = B->shape[0];
  const double s = m->lora->scale;
  double *row = malloc(sizeof(double) * (size_t)in), *ad = malloc(sizeof(double) * (size_t)(r * in));
  double *bd = malloc(sizeof(double) * (size_t)(o * r));
  if (!row || !ad || !bd) { free(row); free(ad); free(bd); return rx_fail(RX_ENOMEM, "lora_merged: out of memory"); }
  rx_tensor_read_f64(A, ad);
  rx_tensor_read_f64(B, bd);
  for (int64_t i = 0; i < o; i++) {
    for (int64_t j = 0; j < in; j++) row[j] = 0;
    for (int64_t q = 0; q < r; q++) {
      const double bq = bd[i * r + q];
      const double *aq = ad + q * in;
      for (int64_t j = 0; j < in; j++) row[j] += bq * aq[j];
    }
    if (out->dtype == RX_BF16) {   /* a base stored in bf16: the merged weight rounded once */
      uint16_t *y = (uint16_t *)out->data + i * in;
      for (int64_t j = 0; j < in; j++) y[j] = rx_f32_to_bf16((float)((double)rx_bf16_to_f32(y[j]) + s * row[j]));
    } else if (out->dtype == RX_F32) {
      float *y = (float *)out->data + i * in;
      for (int64_t j = 0; j < in; j++) y[j] = (float)((double)y[j] + s * row[j]);
    } else {
      double *y = (double *)out->data + i * in;
      for (int64_t j = 0; j < in; j++) y[j] += s * row[j];
    }
  }
  free(row); free(ad); free(bd);
  return RX_OK;
}
