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
 * The GEMMs and the per-slice log-sum-exp go through device-neutral ops (rx_matmul_*,
 * rx_logprob_slice_*), so the head runs wherever the model's tensors live. */
#include "internal.h"
#include "ops/engine_ops.h"

#include "model/model_internal.h"

#define TRY(call) do { int rc_ = (call); if (rc_) return rc_; } while (0)

/* rows [r0, r0+n) of a [N, cols] tensor as a [n, cols] view, or of a [N] tensor (cols 0) as [n] */
static void rows_of(rx_tensor *v, const rx_tensor *t, int64_t r0, int64_t n, int64_t cols) {
  const int64_t es = rx_dtype_size(t->dtype), s2[2] = {n, cols}, s1[1] = {n};
  rx_view_init(v, (char *)t->data + r0 * (cols ? cols : 1) * es, t->dtype, t->device, cols ? 2 : 1, cols ? s2 : s1);
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
  const rx_tensor *w = rx_model_w(m, m->lm_head);
  rx_view_init(logits, p->head, m->cfg.dtype, m->cfg.device, 2, sl);
  rows_of(xf, &p->xf, r0, n, C);
  rows_of(W, w, v0, vs, C);
}

int rx_model_head_forward(rx_model *m) {
  plan *p = &m->plan;
  const int64_t N = p->B * p->T, V = m->cfg.vocab_size;
  for (int64_t r0 = 0; r0 < N; r0 += p->head_rows) {
    const int64_t n = N - r0 < p->head_rows ? N - r0 : p->head_rows;
    rx_tensor rmax, rsum, rsz, xt, tgt;
    rows_of(&rmax, &p->head_max, r0, n, 0);
    rows_of(&rsum, &p->head_sum, r0, n, 0);
    rows_of(&rsz, &p->head_sz, r0, n, 0);
    rows_of(&xt, &p->row_logp, r0, n, 0);
    rows_of(&tgt, &p->targets, r0, n, 0);
    for (int64_t v0 = 0; v0 < V; v0 += p->head_cols) {
      const int64_t vs = V - v0 < p->head_cols ? V - v0 : p->head_cols;
      rx_tensor logits, xf, W;
      tile_views(m, r0, n, v0, vs, &logits, &xf, &W);
      TRY(head_logits(&logits, &xf, &W));
      TRY(rx_logprob_slice_forward(&rmax, &rsum, &rsz, &xt, &logits, &tgt, v0, v0 == 0));
    }
  }
  return rx_logprob_slice_finish(&p->row_logp, &p->row_lse, &p->row_entropy, &p->head_max, &p->head_sum, &p->head_sz,
                                 &p->targets);
}

int rx_model_head_backward(rx_model *m, int with_entropy) {
  plan *p = &m->plan;
  const int64_t N = p->B * p->T, V = m->cfg.vocab_size, C = m->cfg.hidden_size;
  const rx_tensor *dW_all = m->lora ? NULL : &m->grads[m->lm_head];   /* frozen base: no head gradient */
  for (int64_t r0 = 0; r0 < N; r0 += p->head_rows) {
    const int64_t n = N - r0 < p->head_rows ? N - r0 : p->head_rows;
    rx_tensor dxf, dpart, dlogp, dent, H, lse, tgt;
    rows_of(&dxf, &p->dxf, r0, n, C);
    rows_of(&dpart, &p->dtmp, r0, n, C);   /* dtmp is free until the layers' backward */
    rows_of(&dlogp, &p->row_dlogp, r0, n, 0);
    rows_of(&dent, &p->row_dentropy, r0, n, 0);
    rows_of(&H, &p->head_sz, r0, n, 0);    /* the f64 entropy that the forward's finish left there */
    rows_of(&lse, &p->row_lse, r0, n, 0);
    rows_of(&tgt, &p->targets, r0, n, 0);
    for (int64_t v0 = 0; v0 < V; v0 += p->head_cols) {
      const int64_t vs = V - v0 < p->head_cols ? V - v0 : p->head_cols;
      rx_tensor logits, xf, W, dW;
      tile_views(m, r0, n, v0, vs, &logits, &xf, &W);
      if (dW_all) rows_of(&dW, dW_all, v0, vs, C);
      TRY(head_logits(&logits, &xf, &W));                                   /* recompute */
      TRY(rx_logprob_slice_backward(&logits, &dlogp, with_entropy ? &dent : NULL, &H, &logits, &tgt, &lse, v0));
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
