/* hidden.c: final-norm hidden states at chosen positions, for sequence-classification heads
 * (reward models): one inference forward, then a copy of one row per sequence; padded [B,T] or
 * packed rows (rx_model_hidden_at_packed). */
#include "internal.h"

#include "model/model_internal.h"

int rx_model_hidden_at(rx_model *m, const rx_tensor *tokens, const rx_tensor *mask, const int64_t *index,
                       rx_tensor *out) {
  int64_t B = 0, T = 0;
  char a[96];
  int rc = rx_model_check_tokens(m, tokens, mask, &B, &T);
  if (rc) return rc;
  const rx_model_config *c = &m->cfg;
  const int64_t C = c->hidden_size, es = rx_dtype_size(c->dtype);
  if (rx_check_tensor(out, "hidden_at", "out", 2) || out->shape[0] != B || out->shape[1] != C || out->dtype != c->dtype)
    return rx_fail(RX_EINVAL, "hidden_at: out must be %s [%lld,%lld], got %s %s", rx_dtype_name(c->dtype), (long long)B,
                   (long long)C, rx_dtype_name(out->dtype), rx_shape_str(out, a, sizeof a));
  for (int64_t b = 0; b < B; b++)
    if (index[b] < 0 || index[b] >= T)
      return rx_fail(RX_EINVAL, "hidden_at: index %lld of row %lld is outside [0, %lld)", (long long)index[b],
                     (long long)b, (long long)T);
  rx_forward_opts fo = {0, 0, 0, 0};
  if ((rc = rx_model_plan(m, B, T, &fo))) return rc;
  if ((rc = rx_model_refresh_work(m))) return rc;
  if ((rc = rx_model_set_inputs(m, tokens->data, mask ? mask->data : NULL))) return rc;
  if ((rc = rx_model_forward_hidden(m, NULL))) return rc;
  for (int64_t b = 0; b < B && !rc; b++) {   /* row index[b] of sequence b, from the model's device to out's */
    rx_tensor from, to;
    const int64_t one[1] = {C};
    rx_view_init(&from, (char *)m->plan.xf.data + (b * T + index[b]) * C * es, c->dtype, c->device, 1, one);
    rx_view_init(&to, (char *)out->data + b * C * es, out->dtype, out->device, 1, one);
    rc = rx_tensor_copy(&to, &from);
  }
  return rc;
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
