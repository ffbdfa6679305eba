/* rope.c: rotary position embedding, Hugging Face rotate-half form; argument checks, then one
 * switch on the device. The frequencies come from rx_rope_frequencies (plain theta^(-2i/D), or
 * with a checkpoint's rope_scaling applied). */
#include "ops.h"
#include "cpu/cpu.h"
#include <math.h>
#include <stdio.h>

/* x [.., H, D] with positions i32 of numel P = numel / (H D); out (or dinp) shaped like x. */
static int check_args(const char *op, const rx_tensor *y, const char *yname, const rx_tensor *x, const char *xname,
                      const rx_tensor *positions, const double *inv_freq, int64_t *P, int64_t *H, int64_t *D) {
  char why[160], s[96];
  if (rx_op_float(x, op, xname)) return RX_EINVAL;
  rx_shape_str(x, s, sizeof s);
  if (x->ndim < 2) return rx_fail(RX_EINVAL, "%s: %s has shape %s, expected [..,heads,head_dim]", op, xname, s);
  *D = x->shape[x->ndim - 1];
  *H = x->shape[x->ndim - 2];
  *P = 1;
  for (int i = 0; i + 2 < x->ndim; i++) *P *= x->shape[i];
  if (*D % 2 != 0 || *D > RX_CPU_ROPE_MAX_D)
    return rx_fail(RX_EINVAL, "%s: head_dim %lld of %s %s must be even and at most %d", op, (long long)*D, xname, s,
                   RX_CPU_ROPE_MAX_D);
  snprintf(why, sizeof why, "one per row of heads of %s %s", xname, s);
  if (rx_op_index(positions, x, *P, op, "positions", why)) return RX_EINVAL;
  snprintf(why, sizeof why, "shape of %s %s", xname, s);
  if (y && (rx_op_like(y, x, op, yname, xname) || rx_op_rows_cols(y, rx_rows(x), *D, op, yname, why))) return RX_EINVAL;
  if (!inv_freq) return rx_fail(RX_EINVAL, "%s: inv_freq is missing", op);
  for (int64_t i = 0; i < *D / 2; i++)
    if (!(inv_freq[i] > 0) || !isfinite(inv_freq[i]))
      return rx_fail(RX_EINVAL, "%s: inv_freq[%lld] = %g must be finite and > 0", op, (long long)i, inv_freq[i]);
  return RX_OK;
}

static void plain_frequencies(double *inv_freq, int64_t D, double theta) {
  for (int64_t i = 0; i < D / 2; i++) inv_freq[i] = pow(theta, -2.0 * (double)i / (double)D);
}

int rx_rope_frequencies(const rx_model_config *c, double *inv_freq) {
  const int64_t D = c->head_dim;
  if (D <= 0 || D % 2 || D > RX_CPU_ROPE_MAX_D)
    return rx_fail(RX_EINVAL, "rope: head_dim = %lld must be even and at most %d", (long long)D, RX_CPU_ROPE_MAX_D);
  if (!(c->rope_theta > 0) || !isfinite(c->rope_theta))
    return rx_fail(RX_EINVAL, "rope: rope_theta = %g must be finite and > 0", c->rope_theta);
  plain_frequencies(inv_freq, D, c->rope_theta);
  if (c->rope_scaling == RX_ROPE_DEFAULT) return RX_OK;
  if (c->rope_scaling != RX_ROPE_LLAMA3) return rx_fail(RX_EINVAL, "rope: rope_scaling kind %d is unknown", c->rope_scaling);
  /* Llama 3.1: wavelengths longer than original_max / low_freq_factor are divided by factor,
   * shorter than original_max / high_freq_factor kept, and those between interpolated
   * smoothly (transformers' _compute_llama3_parameters). */
  const double factor = c->rope_factor, lo = c->rope_low_freq_factor, hi = c->rope_high_freq_factor;
  const double old_len = (double)c->rope_original_max_position_embeddings;
  if (!(factor > 0) || !isfinite(factor)) return rx_fail(RX_EINVAL, "rope_scaling: factor = %g must be > 0", factor);
  if (!(lo > 0) || !(hi > lo)) return rx_fail(RX_EINVAL, "rope_scaling: low_freq_factor = %g and high_freq_factor = %g must satisfy 0 < low < high", lo, hi);
  if (!(old_len > 0)) return rx_fail(RX_EINVAL, "rope_scaling: original_max_position_embeddings = %g must be > 0", old_len);
  const double low_freq_wavelen = old_len / lo, high_freq_wavelen = old_len / hi;
  for (int64_t i = 0; i < D / 2; i++) {
    const double f = inv_freq[i], wavelen = 2.0 * 3.14159265358979323846 / f;
    if (wavelen > low_freq_wavelen) inv_freq[i] = f / factor;
    else if (wavelen >= high_freq_wavelen) {
      const double smooth = (old_len / wavelen - lo) / (hi - lo);
      inv_freq[i] = (1.0 - smooth) * f / factor + smooth * f;
    }
  }
  return RX_OK;
}

int rx_rope_forward_freq(rx_tensor *out, const rx_tensor *inp, const rx_tensor *positions, const double *inv_freq) {
  const char *op = "rope";
  int64_t P, H, D;
  if (!out) return rx_fail(RX_EINVAL, "%s: out is missing", op);
  if (check_args(op, out, "out", inp, "inp", positions, inv_freq, &P, &H, &D)) return RX_EINVAL;
  rx_note_write(out);
  switch (inp->device) {
    case RX_CPU:
      if (inp->dtype == RX_F32) rx_cpu_rope_forward_f32(out->data, inp->data, positions->data, P, H, D, inv_freq);
      else if (inp->dtype == RX_F64) rx_cpu_rope_forward_f64(out->data, inp->data, positions->data, P, H, D, inv_freq);
      else return rx_op_no_dtype(op, inp);
      return RX_OK;
    case RX_CUDA:
      return rx_cuda_rope_forward(out->data, inp->data, positions->data, P, H, D, inv_freq, inp->dtype);
    default:
      return rx_op_no_kernel(op, inp);
  }
}

int rx_rope_backward_freq(rx_tensor *dinp, const rx_tensor *dout, const rx_tensor *positions, const double *inv_freq) {
  const char *op = "rope_backward";
  int64_t P, H, D;
  if (check_args(op, dinp, "dinp", dout, "dout", positions, inv_freq, &P, &H, &D)) return RX_EINVAL;
  if (!dinp) return RX_OK;
  rx_note_write(dinp);
  switch (dout->device) {
    case RX_CPU:
      if (dout->dtype == RX_F32) rx_cpu_rope_backward_f32(dinp->data, dout->data, positions->data, P, H, D, inv_freq);
      else if (dout->dtype == RX_F64) rx_cpu_rope_backward_f64(dinp->data, dout->data, positions->data, P, H, D, inv_freq);
      else return rx_op_no_dtype(op, dout);
      return RX_OK;
    case RX_CUDA:
      return rx_cuda_rope_backward(dinp->data, dout->data, positions->data, P, H, D, inv_freq, dout->dtype);
    default:
      return rx_op_no_kernel(op, dout);
  }
}

/* The plain-theta forms: frequencies theta^(-2i/D) for the D of the tensor. */
static int theta_frequencies(const char *op, const rx_tensor *x, double theta, double *inv_freq) {
  if (!(theta > 0) || !isfinite(theta)) return rx_fail(RX_EINVAL, "%s: theta %g must be finite and > 0", op, theta);
  if (!x || x->ndim < 2) return RX_OK;   /* check_args names the problem */
  const int64_t D = x->shape[x->ndim - 1];
  plain_frequencies(inv_freq, D > 0 && D <= RX_CPU_ROPE_MAX_D ? D : 2, theta);
  return RX_OK;
}

int rx_rope_forward(rx_tensor *out, const rx_tensor *inp, const rx_tensor *positions, double theta) {
  double inv_freq[RX_CPU_ROPE_MAX_D / 2] = {1.0};
  if (theta_frequencies("rope", inp, theta, inv_freq)) return RX_EINVAL;
  return rx_rope_forward_freq(out, inp, positions, inv_freq);
}

int rx_rope_backward(rx_tensor *dinp, const rx_tensor *dout, const rx_tensor *positions, double theta) {
  double inv_freq[RX_CPU_ROPE_MAX_D / 2] = {1.0};
  if (theta_frequencies("rope_backward", dout, theta, inv_freq)) return RX_EINVAL;
  return rx_rope_backward_freq(dinp, dout, positions, inv_freq);
}
