/* decode.c: argument checks and dispatch of the graph-stable decode step's ops (decode.h). */
#include "ops.h"
#include "ops/decode.h"
#include <math.h>

static rx_cuda_attn_dims dims_of(const rx_tensor *q, const rx_tensor *k) {
  return (rx_cuda_attn_dims){.B = q->shape[0], .Tq = 1, .Tk = k->shape[1], .H = q->shape[2], .KV = k->shape[2],
                             .D = q->shape[3], .k_batch_stride = k->stride[0], .v_batch_stride = k->stride[0],
                             .scale = 1.0 / sqrt((double)q->shape[3])};
}

int64_t rx_decode_attention_scratch(const rx_tensor *q, const rx_tensor *k) {
  const rx_cuda_attn_dims d = dims_of(q, k);
  return rx_cuda_decode_attention_scratch(&d);
}

int rx_decode_attention_lens(rx_tensor *out, rx_tensor *lse, const rx_tensor *q, const rx_tensor *k,
                             const rx_tensor *v, const rx_tensor *mask, const rx_tensor *lens, float *part) {
  const char *op = "decode_attention";
  char a[96], b[96];
  if (rx_check_tensor(q, op, "q", 4) || q->shape[1] != 1 || rx_check_tensor(out, op, "out", 4) ||
      out->numel != q->numel || k->ndim != 4 || k->shape[0] != q->shape[0] || k->shape[3] != q->shape[3] ||
      v->ndim != 4 || v->shape[1] != k->shape[1] || v->stride[0] != k->stride[0] || !mask ||
      mask->shape[0] != q->shape[0] || mask->shape[1] != k->shape[1] || lens->numel != q->shape[0] ||
      lens->dtype != RX_I32 || mask->dtype != RX_I32 || lse->dtype != RX_F32)
    return rx_fail(RX_EINVAL, "%s: q %s and cache %s: one query per row, a [B,S] i32 mask, i32 lengths [B] and f32 lse",
                   op, rx_shape_str(q, a, sizeof a), rx_shape_str(k, b, sizeof b));
  rx_note_write(out); rx_note_write(lse);
  switch (q->device) {
    case RX_CUDA: {
      const rx_cuda_attn_dims d = dims_of(q, k);
      return rx_cuda_decode_attention_lens(out->data, lse->data, q->data, k->data, v->data, mask->data, lens->data,
                                           part, &d, q->dtype);
    }
    default:
      return rx_op_no_kernel(op, q);
  }
}

int rx_kv_append(rx_tensor *kc, rx_tensor *vc, const rx_tensor *k, const rx_tensor *v, const rx_tensor *lens) {
  const char *op = "kv_append";
  const int64_t B = k->shape[0], KD = k->numel / (B > 0 ? B : 1);
  if (kc->shape[0] != B || lens->numel != B || lens->dtype != RX_I32 || kc->dtype != k->dtype ||
      kc->stride[0] != vc->stride[0] || kc->stride[0] % KD != 0)
    return rx_fail(RX_EINVAL, "%s: cache and step's keys disagree (rows %lld, %lld values each)", op, (long long)B,
                   (long long)KD);
  rx_note_write(kc); rx_note_write(vc);
  switch (k->device) {
    case RX_CUDA:
      return rx_cuda_kv_append(kc->data, vc->data, k->data, v->data, lens->data, B, kc->stride[0] / KD, KD, k->dtype);
    default:
      return rx_op_no_kernel(op, k);
  }
}

int rx_device_available(int32_t device, int64_t *bytes) {
  *bytes = 0;
  if (device != RX_CUDA) return rx_fail(RX_EDEVICE, "memory: device %d has no memory report", device);
  int64_t held = 0, peak = 0, reserved = 0, free_bytes = 0, total = 0;
  if (rx_cuda_memory(&held, &peak, &reserved, &free_bytes, &total)) return RX_EDEVICE;
  *bytes = free_bytes + (reserved - held);
  return RX_OK;
}

int rx_graph_begin(int32_t device) {
  if (device == RX_CUDA) return rx_cuda_graph_begin();
  return rx_fail(RX_EDEVICE, "graph: device %d has no graphs", device);
}
int rx_graph_end(int32_t device, void **exec) {
  *exec = NULL;
  if (device == RX_CUDA) return rx_cuda_graph_end(exec);
  return rx_fail(RX_EDEVICE, "graph: device %d has no graphs", device);
}
int rx_graph_launch(int32_t device, void *exec) {
  if (device == RX_CUDA) return rx_cuda_graph_launch(exec);
  return rx_fail(RX_EDEVICE, "graph: device %d has no graphs", device);
}
void rx_graph_free(int32_t device, void *exec) {
  if (device == RX_CUDA) rx_cuda_graph_free(exec);
}
