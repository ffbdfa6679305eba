/* head.c: the language-model head of a training (or log-prob) forward and its backward, on the
 * final-norm hidden states xf [N, C]: log p(target), log-sum-exp and entropy of every row, never
 * [N, vocab] logits at once.
 *
 * The logits are made for a tile of rows by a slice of the vocabulary at a time (plan.head,
 * head_rows x head_cols); each slice is folded into the rows' running max and sums of
 * exponentials, rescaled when the max grows (the online softmax of flash attention), and the
 * backward recomputes every slice. Slicing the vocabulary, not only the rows, keeps all three
 * GEMMs large: every weight row is read once per tile of rows and its gradient written once,
 * where chunks of whole-vocabulary rows (55 rows at Qwen2.5's 151936 entries in 32 MB) made the
 * gradient a rank-55 update of the whole [V, C] matrix per chunk and read the weights 19 times
 * per pass for 1024 rows.
 *
 * The model has a CPU backend only (check_config), so the per-slice kernels are called here
 * directly; the GEMMs go through the device-neutral rx_matmul_* ops. */
#include "internal.h"
#include "cpu/cpu.h"

#include "model/model_internal.h"

#define TRY(call) do { int rc_ = (call); if (rc_) return rc_; } while (0)

/* rows [r0, r0+n) of a [N, cols] tensor of dtype dt as a [n, cols] (or [n]) view */
static void rows_of(rx_tensor *v, const rx_tensor *t, int64_t r0, int64_t n, int64_t cols) {
  const int64_t es = rx_dtype_size(t->dtype), s2[2] = {n, cols}, s1[1] = {n};
  rx_view_init(v, (char *)t->data + r0 * cols * es, t->dtype, t->device, cols ? 2 : 1, cols ? s2 : s1);
}

static int head_logits(rx_tensor *logits, const rx_tensor *xf, const rx_tensor *W) {
  const int prof = rx_prof_begin(RX_PROF_HEAD_GEMM_FWD);
  const int rc = rx_matmul_forward(logits, xf, W, NULL);
  rx_prof_end(prof);
  return rc;
}

/* The views of one (tile, slice): the logits buffer as [n, vs], xf rows and the weight's rows
 * [v0, v0 + vs) (the vocabulary slice of a [V, C] weight is contiguous). */
static void tile_views(rx_model *m, int64_t r0, int64_t n, int64_t v0, int64_t vs, rx_tensor *logits, rx_tensor *xf,
                       rx_tensor *W) {
  plan *p = &m->plan;
  const int64_t C = m->cfg.hidden_size, sl[2] = {n, vs};
  const rx_tensor *w = &m->params[m->lm_head];
  rx_view_init(logits, p->head, m->cfg.dtype, m->cfg.device, 2, sl);
  rows_of(xf, &p->xf, r0, n, C);
  rows_of(W, w, v0, vs, C);
}

int rx_model_head_forward(rx_model *m) {
  plan *p = &m->plan;
  const int64_t N = p->B * p->T, V = m->cfg.vocab_size, f32 = m->cfg.dtype == RX_F32;
  const int32_t *tgt = p->targets.data;
  double *rsum = p->head_sum.data, *rsz = p->head_sz.data;
  for (int64_t r0 = 0; r0 < N; r0 += p->head_rows) {
    const int64_t n = N - r0 < p->head_rows ? N - r0 : p->head_rows;
    for (int64_t v0 = 0; v0 < V; v0 += p->head_cols) {
      const int64_t vs = V - v0 < p->head_cols ? V - v0 : p->head_cols;
      rx_tensor logits, xf, W;
      tile_views(m, r0, n, v0, vs, &logits, &xf, &W);
      TRY(head_logits(&logits, &xf, &W));
      if (f32)
        rx_cpu_logprob_slice_forward_f32((float *)p->head_max.data + r0, rsum + r0, rsz + r0,
                                         (float *)p->row_logp.data + r0, logits.data, tgt + r0, n, vs, v0, v0 == 0);
      else
        rx_cpu_logprob_slice_forward_f64((double *)p->head_max.data + r0, rsum + r0, rsz + r0,
                                         (double *)p->row_logp.data + r0, logits.data, tgt + r0, n, vs, v0, v0 == 0);
    }
  }
  if (f32)
    rx_cpu_logprob_slice_finish_f32(p->row_logp.data, p->row_lse.data, p->row_entropy.data, p->head_max.data, rsum,
                                    rsz, tgt, N);
  else
    rx_cpu_logprob_slice_finish_f64(p->row_logp.data, p->row_lse.data, p->row_entropy.data, p->head_max.data, rsum,
                                    rsz, tgt, N);
  return RX_OK;
}

int rx_model_head_backward(rx_model *m, int with_entropy) {
  plan *p = &m->plan;
  const int64_t N = p->B * p->T, V = m->cfg.vocab_size, C = m->cfg.hidden_size, f32 = m->cfg.dtype == RX_F32;
  const int32_t *tgt = p->targets.data;
  const rx_tensor *dW_all = m->lora ? NULL : &m->grads[m->lm_head];   /* frozen base: no head gradient */
  for (int64_t r0 = 0; r0 < N; r0 += p->head_rows) {
    const int64_t n = N - r0 < p->head_rows ? N - r0 : p->head_rows;
    rx_tensor dxf, dpart;
    rows_of(&dxf, &p->dxf, r0, n, C);
    rows_of(&dpart, &p->dtmp, r0, n, C);   /* dtmp is free until the layers' backward */
    for (int64_t v0 = 0; v0 < V; v0 += p->head_cols) {
      const int64_t vs = V - v0 < p->head_cols ? V - v0 : p->head_cols;
      rx_tensor logits, xf, W, dW;
      tile_views(m, r0, n, v0, vs, &logits, &xf, &W);
      if (dW_all) rows_of(&dW, dW_all, v0, vs, C);
      TRY(head_logits(&logits, &xf, &W));                                   /* recompute */
      if (f32)
        rx_cpu_logprob_slice_backward_f32(logits.data, (float *)p->row_dlogp.data + r0,
                                          with_entropy ? (float *)p->row_dentropy.data + r0 : NULL,
                                          (double *)p->head_sz.data + r0, logits.data, tgt + r0,
                                          (float *)p->row_lse.data + r0, n, vs, v0);   /* in place */
      else
        rx_cpu_logprob_slice_backward_f64(logits.data, (double *)p->row_dlogp.data + r0,
                                          with_entropy ? (double *)p->row_dentropy.data + r0 : NULL,
                                          (double *)p->head_sz.data + r0, logits.data, tgt + r0,
                                          (double *)p->row_lse.data + r0, n, vs, v0);
      /* dxf = sum over slices of dlogits W_slice: the first slice writes it, the others add */
      const int prof = rx_prof_begin(RX_PROF_HEAD_GEMM_BWD);
      int rc = rx_matmul_backward(v0 == 0 ? &dxf : &dpart, dW_all ? &dW : NULL, NULL, &logits, &xf, &W);
      rx_prof_end(prof);
      TRY(rc);
      if (v0 > 0) TRY(rx_add(&dxf, &dxf, &dpart));
    }
  }
  return RX_OK;
}
