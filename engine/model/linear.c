/* linear.c: the decoder's linear layers, out = inp W^T + b, with the LoRA adapter's term added
 * when the projection has one (engine/model/lora.c). Forward, backward, training and generation
 * all go through rx_model_linear_*, each under its per-phase timer (engine/core/profile.c). */
#include "internal.h"

#include "model/model_internal.h"
#include "ops/engine_ops.h"

#define TRY(call) do { int rc_ = (call); if (rc_) return rc_; } while (0)

void rx_model_proj_param(const rx_model *m, int64_t l, int32_t proj, int64_t *w, int64_t *b) {
  const layer_params *lp = &m->layers[l];
  *b = -1;
  switch (proj) {
    case RX_PROJ_Q: *w = lp->q_w; *b = lp->q_b; break;
    case RX_PROJ_K: *w = lp->k_w; *b = lp->k_b; break;
    case RX_PROJ_V: *w = lp->v_w; *b = lp->v_b; break;
    case RX_PROJ_O: *w = lp->o_w; break;
    case RX_PROJ_GATE: *w = lp->gate; break;
    case RX_PROJ_UP: *w = lp->up; break;
    default: *w = lp->down; break;
  }
}

int rx_model_matmul(const rx_model *m, rx_tensor *out, const rx_tensor *inp, const rx_tensor *weight,
                    const rx_tensor *bias) {
  return m->rows_alone ? rx_matmul_forward_rows(out, inp, weight, bias) : rx_matmul_forward(out, inp, weight, bias);
}

static int linear_forward(rx_model *m, int64_t l, int32_t proj, rx_tensor *out, const rx_tensor *inp) {
  int64_t w, b;
  rx_model_proj_param(m, l, proj, &w, &b);
  const rx_tensor *W = rx_model_w(m, w);
  TRY(rx_model_matmul(m, out, inp, W, rx_model_w(m, b)));
  return m->lora ? rx_lora_linear_forward(m, l, proj, out, inp, W) : RX_OK;
}

static int linear_backward(rx_model *m, int64_t l, int32_t proj, rx_tensor *dinp, const rx_tensor *dout,
                           const rx_tensor *inp) {
  int64_t w, b;
  rx_model_proj_param(m, l, proj, &w, &b);
  const rx_tensor *W = rx_model_w(m, w);
  const int frozen = m->lora != NULL;
  TRY(rx_matmul_backward(dinp, frozen ? NULL : &m->grads[w], frozen || b < 0 ? NULL : &m->grads[b], dout, inp, W));
  return m->lora ? rx_lora_linear_backward(m, l, proj, dinp, dout, inp, W) : RX_OK;
}

int rx_model_linear_forward(rx_model *m, int64_t l, int32_t proj, rx_tensor *out, const rx_tensor *inp) {
  const int prof = rx_prof_begin(RX_PROF_LINEAR_FWD);
  const int rc = linear_forward(m, l, proj, out, inp);
  rx_prof_end(prof);
  return rc;
}

int rx_model_linear_backward(rx_model *m, int64_t l, int32_t proj, rx_tensor *dinp, const rx_tensor *dout,
                             const rx_tensor *inp) {
  const int prof = rx_prof_begin(RX_PROF_LINEAR_BWD);
  const int rc = linear_backward(m, l, proj, dinp, dout, inp);
  rx_prof_end(prof);
  return rc;
}
