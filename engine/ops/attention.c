/* ops/attention.c: causal grouped-query attention: argument checks, then dispatch on device.
 * The contract is in remax.h and docs/attention.md; the CPU kernels are in cpu/attention.inc. */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include "ops.h"
#include "cpu/attention.h"

/* A tensor contiguous in its last three dims whose batch stride may exceed one batch entry
 * (k and v may be views of a longer KV cache). */
static int check_batch_strided(const rx_tensor *t, const char *op, const char *what) {
  char buf[96];
  if (!t) return rx_fail(RX_EINVAL, "%s: %s is missing", op, what);
  if (t->ndim != 4) return rx_fail(RX_EINVAL, "%s: %s has shape %s, expected 4 dims [B,Tk,KV,D]", op, what, rx_shape_str(t, buf, sizeof buf));
  int64_t s = 1;
  for (int d = 3; d >= 1; d--) {
    if (t->shape[d] != 1 && t->stride[d] != s)
      return rx_fail(RX_EINVAL, "%s: %s %s must be contiguous in its last three dims (only the batch stride may be larger)",
                     op, what, rx_shape_str(t, buf, sizeof buf));
    s *= t->shape[d];
  }
  if (t->shape[0] > 1 && t->stride[0] < s)
    return rx_fail(RX_EINVAL, "%s: %s %s has batch stride %lld, less than one batch entry (%lld)", op, what,
                   rx_shape_str(t, buf, sizeof buf), (long long)t->stride[0], (long long)s);
  return RX_OK;
}

/* t must be contiguous with exactly the given 3 or 4 dims; `like` names where they come from. */
static int check_shape(const rx_tensor *t, const char *op, const char *what, int32_t ndim, const int64_t *dims,
                       const char *like, const rx_tensor *like_t) {
  char a[96], b[96];
  if (rx_check_tensor(t, op, what, ndim)) return RX_EINVAL;
  for (int d = 0; d < ndim; d++)
    if (t->shape[d] != dims[d])
      return rx_fail(RX_EINVAL, "%s: %s has shape %s, expected %s (%s %s)", op, what, rx_shape_str(t, a, sizeof a),
                     ndim == 4 ? "the same shape" : "[B,H,Tq]", like, rx_shape_str(like_t, b, sizeof b));
  return RX_OK;
}

/* The checks shared by forward and backward: q, k, v, mask and scale; fills dims. */
static int check_inputs(const char *op, const rx_tensor *q, const rx_tensor *k, const rx_tensor *v,
                        const rx_tensor *mask, double scale, rx_attn_dims *dims) {
  char a[96], b[96];
  if (rx_check_tensor(q, op, "q", 4)) return RX_EINVAL;
  if (q->dtype != RX_F32 && q->dtype != RX_F64 && !(q->dtype == RX_BF16 && q->device == RX_CUDA))
    return rx_fail(RX_EINVAL, "%s: q has dtype %s, expected f32 or f64 (or bf16 on cuda)", op, rx_dtype_name(q->dtype));
  if (check_batch_strided(k, op, "k") || check_batch_strided(v, op, "v")) return RX_EINVAL;
  if (rx_check_same(q, k, op, "k") || rx_check_same(q, v, op, "v")) return RX_EINVAL;
  const int64_t B = q->shape[0], Tq = q->shape[1], H = q->shape[2], D = q->shape[3];
  const int64_t Tk = k->shape[1], KV = k->shape[2];
  if (k->shape[0] != B)
    return rx_fail(RX_EINVAL, "%s: k has shape %s and q %s: batch sizes differ", op, rx_shape_str(k, a, sizeof a), rx_shape_str(q, b, sizeof b));
  if (k->shape[3] != D)
    return rx_fail(RX_EINVAL, "%s: k has shape %s and q %s: head dims D differ", op, rx_shape_str(k, a, sizeof a), rx_shape_str(q, b, sizeof b));
  if (D < 1) return rx_fail(RX_EINVAL, "%s: q has shape %s: head dim D must be at least 1", op, rx_shape_str(q, a, sizeof a));
  if (KV < 1 || H % KV != 0)
    return rx_fail(RX_EINVAL, "%s: k has shape %s and q %s: the %lld query heads are not a multiple of the %lld kv heads",
                   op, rx_shape_str(k, a, sizeof a), rx_shape_str(q, b, sizeof b), (long long)H, (long long)KV);
  if (Tq > Tk)
    return rx_fail(RX_EINVAL, "%s: q has shape %s and k %s: Tq = %lld exceeds Tk = %lld (query i sits at key Tk-Tq+i)",
                   op, rx_shape_str(q, a, sizeof a), rx_shape_str(k, b, sizeof b), (long long)Tq, (long long)Tk);
  for (int d = 0; d < 4; d++)
    if (v->shape[d] != k->shape[d])
      return rx_fail(RX_EINVAL, "%s: v has shape %s, expected the shape of k %s", op, rx_shape_str(v, a, sizeof a), rx_shape_str(k, b, sizeof b));
  if (mask) {
    if (rx_check_tensor(mask, op, "mask", 2)) return RX_EINVAL;
    if (mask->dtype != RX_I32) return rx_fail(RX_EINVAL, "%s: mask has dtype %s, expected i32", op, rx_dtype_name(mask->dtype));
    if (mask->device != q->device) return rx_fail(RX_EINVAL, "%s: mask is on device %d, expected %d", op, mask->device, q->device);
    if (mask->shape[0] != B || mask->shape[1] != Tk)
      return rx_fail(RX_EINVAL, "%s: mask has shape %s, expected [B,Tk] = [%lld,%lld] (k %s)", op, rx_shape_str(mask, a, sizeof a),
                     (long long)B, (long long)Tk, rx_shape_str(k, b, sizeof b));
  }
  if (!isfinite(scale)) return rx_fail(RX_EINVAL, "%s: scale %g is not finite", op, scale);
  /* the kernels' GEMMs take int sizes: a tile of 64 queries times Tk scores, and rows of H*D */
  if (Tk > (1 << 24) || H * D > (1 << 24))
    return rx_fail(RX_EINVAL, "%s: q has shape %s and k %s: Tk or H*D exceeds 2^24", op, rx_shape_str(q, a, sizeof a),
                   rx_shape_str(k, b, sizeof b));
  *dims = (rx_attn_dims){.B = B, .Tq = Tq, .Tk = Tk, .H = H, .KV = KV, .D = D,
                         .k_batch_stride = k->stride[0], .v_batch_stride = v->stride[0],
                         .scale = scale != 0 ? scale : 1.0 / sqrt((double)D)};
  return RX_OK;
}

/* The packed rows' boundaries: i32 [S+1] on q's device, 0 = cu[0] <= cu[1] <= ... <= cu[S] = Tq,
 * with B = 1 and Tq = Tk (the rows lie end to end along the time axis). A device tensor is
 * read back once to check it (S+1 integers). Fills dims->cu_seqlens with a host pointer for
 * the CPU kernel (the tensor's own data) or the device pointer for CUDA, and dims->S. */
static _Thread_local int32_t *cu_host;
static _Thread_local int64_t cu_host_cap;

static int check_cu_seqlens(const char *op, const rx_tensor *cu, const rx_tensor *q, rx_attn_dims *dims) {
  char a[96], b[96];
  dims->cu_seqlens = NULL;
  dims->S = 0;
  if (!cu) return RX_OK;
  if (rx_check_tensor(cu, op, "cu_seqlens", 1)) return RX_EINVAL;
  if (cu->dtype != RX_I32) return rx_fail(RX_EINVAL, "%s: cu_seqlens has dtype %s, expected i32", op, rx_dtype_name(cu->dtype));
  if (cu->device != q->device)
    return rx_fail(RX_EINVAL, "%s: cu_seqlens is on device %d, expected %d (q's)", op, cu->device, q->device);
  if (cu->shape[0] < 2) return rx_fail(RX_EINVAL, "%s: cu_seqlens has shape %s, expected [S+1] with S >= 1", op, rx_shape_str(cu, a, sizeof a));
  if (dims->B != 1 || dims->Tq != dims->Tk)
    return rx_fail(RX_EINVAL, "%s: packed rows (cu_seqlens) need q [1,N,H,D] and k [1,N,KV,D], got q %s", op,
                   rx_shape_str(q, b, sizeof b));
  const int64_t n = cu->shape[0];
  const int32_t *h = cu->data;
  if (cu->device != RX_CPU) {
    if (n > cu_host_cap) {
      free(cu_host);
      cu_host = malloc(sizeof(int32_t) * (size_t)n);
      cu_host_cap = cu_host ? n : 0;
      if (!cu_host) return rx_fail(RX_ENOMEM, "%s: out of memory for %lld cu_seqlens", op, (long long)n);
    }
    rx_tensor hv;
    rx_view_init(&hv, cu_host, RX_I32, RX_CPU, 1, cu->shape);
    if (rx_tensor_copy(&hv, cu)) return rx_fail_context(RX_EDEVICE, "%s: cu_seqlens", op);
    h = cu_host;
  }
  if (h[0] != 0 || h[n - 1] != dims->Tq)
    return rx_fail(RX_EINVAL, "%s: cu_seqlens runs from %d to %d, expected 0 to N = %lld (the tokens of q %s)", op, h[0],
                   h[n - 1], (long long)dims->Tq, rx_shape_str(q, b, sizeof b));
  for (int64_t r = 0; r + 1 < n; r++)
    if (h[r + 1] < h[r])
      return rx_fail(RX_EINVAL, "%s: cu_seqlens[%lld] = %d is less than cu_seqlens[%lld] = %d (boundaries must not decrease)",
                     op, (long long)(r + 1), h[r + 1], (long long)r, h[r]);
  dims->cu_seqlens = cu->data;
  dims->S = n - 1;
  return RX_OK;
}

/* The kernels' transient scratch (scores of one tile per thread, Delta for the backward). It is
 * kept between calls and only grows: attention runs once per layer per step (and per decoded
 * token), and a fresh large allocation each time costs page faults that showed in profiles. */
static _Thread_local void *scratch_buf;
static _Thread_local size_t scratch_cap;

static void *attn_scratch(const rx_attn_dims *dims, int32_t dtype, int threads, const char *op) {
  const size_t es = dtype == RX_F32 ? sizeof(float) : sizeof(double);
  const size_t bytes = (size_t)rx_cpu_attention_scratch_elems(dims, threads) * es;
  if (bytes > scratch_cap) {
    rx_free(scratch_buf);
    scratch_buf = rx_alloc(bytes, "attention scratch");
    scratch_cap = scratch_buf ? bytes : 0;
    if (!scratch_buf) rx_fail_context(RX_ENOMEM, "%s", op);
  }
  return scratch_buf;
}

/* An output or saved tensor: contiguous, shaped like q (4 dims) or [B,H,Tq] (lse), same dtype/device. */
static int check_like_q(const rx_tensor *t, const char *op, const char *what, const rx_tensor *q) {
  if (check_shape(t, op, what, 4, q->shape, "q", q)) return RX_EINVAL;
  return rx_check_same(q, t, op, what);
}

static int check_lse(const rx_tensor *lse, const char *op, const rx_tensor *q) {
  const int64_t dims[3] = {q->shape[0], q->shape[2], q->shape[1]};
  if (check_shape(lse, op, "lse", 3, dims, "for q", q)) return RX_EINVAL;
  return rx_op_acc_like(lse, q, op, "lse", "q");   /* f32 for bf16 q */
}

/* The same sizes for the CUDA backend, whose header does not include the CPU's. */
static const rx_cuda_attn_dims *cuda_dims(const rx_attn_dims *d) {
  static _Thread_local rx_cuda_attn_dims c;
  c = (rx_cuda_attn_dims){.B = d->B, .Tq = d->Tq, .Tk = d->Tk, .H = d->H, .KV = d->KV, .D = d->D,
                          .k_batch_stride = d->k_batch_stride, .v_batch_stride = d->v_batch_stride, .scale = d->scale,
                          .cu_seqlens = d->cu_seqlens, .S = d->S};
  return &c;
}

int rx_attention_forward(rx_tensor *out, rx_tensor *lse, const rx_tensor *q, const rx_tensor *k,
                         const rx_tensor *v, const rx_tensor *mask, double scale) {
  return rx_attention_forward_seq(out, lse, q, k, v, mask, NULL, scale);
}

int rx_attention_backward(rx_tensor *dq, rx_tensor *dk, rx_tensor *dv, const rx_tensor *dout,
                          const rx_tensor *q, const rx_tensor *k, const rx_tensor *v,
                          const rx_tensor *out, const rx_tensor *lse, const rx_tensor *mask, double scale) {
  return rx_attention_backward_seq(dq, dk, dv, dout, q, k, v, out, lse, mask, NULL, scale);
}

int rx_attention_forward_seq(rx_tensor *out, rx_tensor *lse, const rx_tensor *q, const rx_tensor *k,
                             const rx_tensor *v, const rx_tensor *mask, const rx_tensor *cu_seqlens, double scale) {
  const char *op = "attention_forward";
  rx_attn_dims dims;
  if (check_inputs(op, q, k, v, mask, scale, &dims) || check_cu_seqlens(op, cu_seqlens, q, &dims)) return RX_EINVAL;
  if (check_like_q(out, op, "out", q) || check_lse(lse, op, q)) return RX_EINVAL;
  const int32_t *keep = mask ? mask->data : NULL;
  rx_note_write(out); rx_note_write(lse);
  switch (q->device) {
    case RX_CPU: {
      const int threads = omp_get_max_threads();
      void *scratch = attn_scratch(&dims, q->dtype, threads, op);
      if (!scratch) return RX_ENOMEM;
      if (q->dtype == RX_F32)
        rx_cpu_attention_forward_f32(out->data, lse->data, q->data, k->data, v->data, keep, &dims, scratch, threads);
      else
        rx_cpu_attention_forward_f64(out->data, lse->data, q->data, k->data, v->data, keep, &dims, scratch, threads);
      return RX_OK;
    }
    case RX_CUDA:   /* a decode step (one query per row): split along the cache (cuda/decode_attention.cu) */
      if (dims.Tq == 1 && !dims.cu_seqlens && dims.H / dims.KV <= RX_CUDA_DECODE_MAX_GROUP)
        return rx_cuda_decode_attention(out->data, lse->data, q->data, k->data, v->data, keep, cuda_dims(&dims), q->dtype);
      return rx_cuda_attention_forward(out->data, lse->data, q->data, k->data, v->data, keep, cuda_dims(&dims), q->dtype);
    default:
      return rx_fail(RX_EDEVICE, "%s: device %d has no implementation in this build", op, q->device);
  }
}

int rx_attention_backward_seq(rx_tensor *dq, rx_tensor *dk, rx_tensor *dv, const rx_tensor *dout,
                              const rx_tensor *q, const rx_tensor *k, const rx_tensor *v,
                              const rx_tensor *out, const rx_tensor *lse, const rx_tensor *mask,
                              const rx_tensor *cu_seqlens, double scale) {
  const char *op = "attention_backward";
  rx_attn_dims dims;
  if (check_inputs(op, q, k, v, mask, scale, &dims) || check_cu_seqlens(op, cu_seqlens, q, &dims)) return RX_EINVAL;
  if (check_like_q(dout, op, "dout", q) || check_like_q(out, op, "out", q) || check_lse(lse, op, q)) return RX_EINVAL;
  if (dq && check_like_q(dq, op, "dq", q)) return RX_EINVAL;
  /* dk and dv are contiguous [B,Tk,KV,D] even when k and v are strided cache views. */
  const int64_t kv_dims[4] = {k->shape[0], k->shape[1], k->shape[2], k->shape[3]};
  if (dk && (check_shape(dk, op, "dk", 4, kv_dims, "k", k) || rx_check_same(q, dk, op, "dk"))) return RX_EINVAL;
  if (dv && (check_shape(dv, op, "dv", 4, kv_dims, "k", k) || rx_check_same(q, dv, op, "dv"))) return RX_EINVAL;
  const int32_t *keep = mask ? mask->data : NULL;
  rx_note_write(dq); rx_note_write(dk); rx_note_write(dv);
  switch (q->device) {
    case RX_CPU: {
      if (!dq && !dk && !dv) return RX_OK;
      const int threads = omp_get_max_threads();
      void *scratch = attn_scratch(&dims, q->dtype, threads, op);
      if (!scratch) return RX_ENOMEM;
      if (q->dtype == RX_F32)
        rx_cpu_attention_backward_f32(dq ? dq->data : NULL, dk ? dk->data : NULL, dv ? dv->data : NULL, dout->data, q->data,
                                      k->data, v->data, out->data, lse->data, keep, &dims, scratch, threads);
      else
        rx_cpu_attention_backward_f64(dq ? dq->data : NULL, dk ? dk->data : NULL, dv ? dv->data : NULL, dout->data, q->data,
                                      k->data, v->data, out->data, lse->data, keep, &dims, scratch, threads);
      return RX_OK;
    }
    case RX_CUDA:
      return rx_cuda_attention_backward(dq ? dq->data : NULL, dk ? dk->data : NULL, dv ? dv->data : NULL, dout->data,
                                        q->data, k->data, v->data, out->data, lse->data, keep, cuda_dims(&dims),
                                        q->dtype);
    default:
      return rx_fail(RX_EDEVICE, "%s: device %d has no implementation in this build", op, q->device);
  }
}
