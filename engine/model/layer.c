/* layer.c: the decoder layer, one function for the training forward, the prefill and the decode
 * step (model_internal.h, rx_model_layer). A model feature (Qwen3's q/k norm, a RoPE variant, a
 * new attention) is written here once, for every caller and every device: the layer only calls
 * ops. Decoding differs in two things only, both given by the caller: the activations are views
 * of the decoder's scratch (with q_raw aliasing q), and a KV-cache hook decides which keys and
 * values the attention reads. */
#include "internal.h"

#include "model/model_internal.h"

#define TRY(call) do { int rc_ = (call); if (rc_) return rc_; } while (0)

static rx_tensor *P(rx_model *m, int64_t i) { return rx_model_w(m, i); }
static rx_tensor *stat(rx_tensor *t) { return t->data ? t : NULL; }

int rx_model_layer(rx_model *m, int64_t l, layer_acts *a, const layer_io *io) {
  const layer_params *lp = &m->layers[l];
  const rx_model_config *cfg = &m->cfg;
  const int qk_norm = cfg->qk_norm != 0;
  const double eps = cfg->rms_norm_eps;
  /* attention: x_mid = x + o(attention(rope(q), rope(k), v)) */
  TRY(rx_rmsnorm_forward(&a->xn1, stat(&a->rstd1), io->x, P(m, lp->ln1), eps));
  TRY(rx_model_linear_forward(m, l, RX_PROJ_Q, qk_norm ? &a->q_raw : &a->q, &a->xn1));
  TRY(rx_model_linear_forward(m, l, RX_PROJ_K, qk_norm ? &a->k_raw : &a->k, &a->xn1));
  TRY(rx_model_linear_forward(m, l, RX_PROJ_V, &a->v, &a->xn1));
  if (qk_norm) {   /* Qwen3: each head of q and k RMS-normalised over head_dim before RoPE */
    TRY(rx_rmsnorm_forward(&a->q_rows, stat(&a->q_rstd), &a->q_raw_rows, P(m, lp->q_norm), eps));
    TRY(rx_rmsnorm_forward(&a->k_rows, stat(&a->k_rstd), &a->k_raw_rows, P(m, lp->k_norm), eps));
  }
  TRY(rx_rope_forward_freq(&a->q4, &a->q4, io->positions, m->inv_freq));
  TRY(rx_rope_forward_freq(&a->k4, &a->k4, io->positions, m->inv_freq));
  rx_tensor keys = a->k4, values = a->v4;
  const rx_tensor *mask = io->mask;
  if (io->kv) TRY(io->kv->attend(io->kv->ctx, l, a, &keys, &values, &mask));
  if (io->kv && io->kv->attention) TRY(io->kv->attention(io->kv->ctx, l, a, &keys, &values, mask));
  else TRY(rx_attention_forward_seq(&a->att4, &a->lse, &a->q4, &keys, &values, mask, io->cu_seqlens, 0.0));
  TRY(rx_model_linear_forward(m, l, RX_PROJ_O, &a->x_mid, &a->att));
  TRY(rx_add(&a->x_mid, &a->x_mid, io->x));
  /* MLP: out = x_mid + down(silu(gate(xn2)) * up(xn2)) */
  TRY(rx_rmsnorm_forward(&a->xn2, stat(&a->rstd2), &a->x_mid, P(m, lp->ln2), eps));
  TRY(rx_model_linear_forward(m, l, RX_PROJ_GATE, &a->gate, &a->xn2));
  TRY(rx_model_linear_forward(m, l, RX_PROJ_UP, &a->up, &a->xn2));
  TRY(rx_swiglu_forward(&a->h, &a->gate, &a->up));
  if (io->out) {
    TRY(rx_model_linear_forward(m, l, RX_PROJ_DOWN, io->out, &a->h));
    TRY(rx_add(io->out, io->out, &a->x_mid));
  }
  return RX_OK;
}
