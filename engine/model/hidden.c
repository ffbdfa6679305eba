/* hidden.c: final-norm hidden states at chosen positions, for sequence-classification heads
 * (reward models): a forward, then a copy of one row per sequence, padded [B,T] or packed rows
 * (rx_model_hidden_at_packed); and, after a train forward, the backward from the gradient of
 * those rows (the other positions get none) into the model. */
#include "internal.h"

#include "model/model_internal.h"

static int check_index(const rx_model *m, const int64_t *index, int64_t B, int64_t T, const char *op) {
  (void)m;
  if (!index) return rx_fail(RX_EINVAL, "%s: index is NULL", op);
  for (int64_t b = 0; b < B; b++)
    if (index[b] < 0 || index[b] >= T)
      return rx_fail(RX_EINVAL, "%s: index %lld of row %lld is outside [0, %lld)", op, (long long)index[b],
                     (long long)b, (long long)T);
  return RX_OK;
}

/* rows index[b] of sequence b of the [B*T, C] tensor at rows, and row b of the [B, C] tensor
 * flat, as views; copy one to the other (the direction is the caller's) */
static int copy_rows(rx_model *m, rx_tensor *bt, rx_tensor *flat, const int64_t *index, int to_flat) {
  const rx_model_config *c = &m->cfg;
  const int64_t C = c->hidden_size, es = rx_dtype_size(c->dtype), B = m->plan.B, T = m->plan.T;
  int rc = RX_OK;
  for (int64_t b = 0; b < B && !rc; b++) {
    rx_tensor at, row;
    const int64_t one[1] = {C};
    rx_view_init(&at, (char *)bt->data + (b * T + index[b]) * C * es, c->dtype, bt->device, 1, one);
    rx_view_init(&row, (char *)flat->data + b * C * es, flat->dtype, flat->device, 1, one);
    rc = to_flat ? rx_tensor_copy(&row, &at) : rx_tensor_copy(&at, &row);
  }
  return rc;
}

static int hidden_forward(rx_model *m, const rx_tensor *tokens, const rx_tensor *mask, const int64_t *index,
                          rx_tensor *out, const rx_forward_opts *opts, const char *op) {
  int64_t B = 0, T = 0;
  char a[96];
  int rc = rx_model_check_tokens(m, tokens, mask, &B, &T);
  if (rc) return rc;
  const rx_model_config *c = &m->cfg;
  const int64_t C = c->hidden_size;
  if (rx_check_tensor(out, op, "out", 2) || out->shape[0] != B || out->shape[1] != C || out->dtype != c->dtype)
    return rx_fail(RX_EINVAL, "%s: out must be %s [%lld,%lld], got %s %s", op, rx_dtype_name(c->dtype), (long long)B,
                   (long long)C, rx_dtype_name(out->dtype), rx_shape_str(out, a, sizeof a));
  if ((rc = check_index(m, index, B, T, op))) return rc;
  if ((rc = rx_model_plan(m, B, T, opts))) return rc;
  if ((rc = rx_model_refresh_work(m))) return rc;
  if ((rc = rx_model_set_inputs(m, tokens->data, mask ? mask->data : NULL))) return rc;
  if ((rc = rx_model_forward_hidden(m, NULL))) return rc;
  if ((rc = copy_rows(m, &m->plan.xf, out, index, 1))) return rc;
  m->plan.valid = m->plan.train;
  return RX_OK;
}

int rx_model_hidden_at(rx_model *m, const rx_tensor *tokens, const rx_tensor *mask, const int64_t *index,
                       rx_tensor *out) {
  rx_forward_opts fo = {0, 0, 0, 0};
  return hidden_forward(m, tokens, mask, index, out, &fo, "hidden_at");
}

int rx_model_hidden_train(rx_model *m, const rx_tensor *tokens, const rx_tensor *mask, const int64_t *index,
                          rx_tensor *out, const rx_forward_opts *opts) {
  rx_forward_opts fo = {1, 0, 0, 0};
  if (opts) fo = *opts;
  fo.train = 1;
  return hidden_forward(m, tokens, mask, index, out, &fo, "hidden_train");
}

int rx_model_hidden_backward(rx_model *m, const int64_t *index, const rx_tensor *dout) {
  plan *p = &m->plan;
  char a[96];
  const rx_model_config *c = &m->cfg;
  if (!p->valid) return rx_fail(RX_EINVAL, "hidden_backward: no train forward to differentiate (call hidden_train first)");
  if (rx_check_tensor(dout, "hidden_backward", "dout", 2) || dout->shape[0] != p->B || dout->shape[1] != c->hidden_size ||
      dout->dtype != c->dtype)
    return rx_fail(RX_EINVAL, "hidden_backward: dout must be %s [%lld,%lld] like the forward's out, got %s %s",
                   rx_dtype_name(c->dtype), (long long)p->B, (long long)c->hidden_size, rx_dtype_name(dout->dtype),
                   rx_shape_str(dout, a, sizeof a));
  int rc = check_index(m, index, p->B, p->T, "hidden_backward");
  if (rc) return rc;
  if ((rc = rx_tensor_fill(&p->dxf, 0.0))) return rc;
  /* two rows of one sequence never share an index (one per sequence), so a copy is the sum */
  if ((rc = copy_rows(m, &p->dxf, (rx_tensor *)dout, index, 0))) return rc;
  return rx_model_backward_trunk(m);
}

int rx_model_hidden_at_packed(rx_model *m, const rx_tensor *tokens, const rx_tensor *cu_seqlens, const int64_t *index,
                              rx_tensor *out) {
  int64_t B = 0, N = 0;
  char a[96];
  int rc = rx_model_check_tokens(m, tokens, NULL, &B, &N);
  if (rc) return rc;
  if (B != 1) return rx_fail(RX_EINVAL, "hidden_at_packed: tokens %s must be [1,N], the rows end to end", rx_shape_str(tokens, a, sizeof a));
  if ((rc = rx_model_check_cu_seqlens(cu_seqlens, N, "hidden_at_packed"))) return rc;
  const rx_model_config *c = &m->cfg;
  const int64_t C = c->hidden_size, es = rx_dtype_size(c->dtype), S = cu_seqlens->shape[0] - 1;
  const int32_t *cu = cu_seqlens->data;
  if (rx_check_tensor(out, "hidden_at_packed", "out", 2) || out->shape[0] != S || out->shape[1] != C || out->dtype != c->dtype)
    return rx_fail(RX_EINVAL, "hidden_at_packed: out must be %s [%lld,%lld] (a row per packed row), got %s %s",
                   rx_dtype_name(c->dtype), (long long)S, (long long)C, rx_dtype_name(out->dtype), rx_shape_str(out, a, sizeof a));
  for (int64_t r = 0; r < S; r++)
    if (index[r] < 0 || index[r] >= cu[r + 1] - cu[r])
      return rx_fail(RX_EINVAL, "hidden_at_packed: index %lld of row %lld is outside its %d tokens", (long long)index[r],
                     (long long)r, cu[r + 1] - cu[r]);
  rx_forward_opts fo = {0, 0, 0, 0};
  if ((rc = rx_model_plan(m, 1, N, &fo))) return rc;
  if ((rc = rx_model_refresh_work(m))) return rc;
  if ((rc = rx_model_set_packed_inputs(m, tokens->data, cu, S))) return rc;
  if ((rc = rx_model_forward_hidden(m, NULL))) return rc;
  for (int64_t r = 0; r < S && !rc; r++) {   /* token index[r] of packed row r */
    rx_tensor from, to;
    const int64_t one[1] = {C};
    rx_view_init(&from, (char *)m->plan.xf.data + (cu[r] + index[r]) * C * es, c->dtype, c->device, 1, one);
    rx_view_init(&to, (char *)out->data + r * C * es, out->dtype, out->device, 1, one);
    rc = rx_tensor_copy(&to, &from);
  }
  return rc;
}
