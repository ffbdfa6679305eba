/* decode.h: ops of generation's graph-stable decode step (engine/ops/decode.c; cuda/decode_attention.cu,
 * cuda/graph.cu): shapes fixed for a batch size, each row's cache length read on the device, so
 * that one CUDA graph captured per batch shape replays for every token. Device "cuda" only: the
 * CPU decodes with rx_attention_forward over the cache it has filled. */
#ifndef RX_OPS_DECODE_H
#define RX_OPS_DECODE_H
#include "internal.h"

/* out [B,1,H,D], lse [B,H,1] (f32) from q [B,1,H,D] and the whole cache k, v [B,S,KV,D] (batch
 * strided): row b sees keys s < lens[b] with mask[b, s] = 1 (mask i32 [B,S], lens i32 [B]);
 * part: f32 scratch of rx_decode_attention_scratch elements. */
int64_t rx_decode_attention_scratch(const rx_tensor *q, const rx_tensor *k);
int rx_decode_attention_lens(rx_tensor *out, rx_tensor *lse, const rx_tensor *q, const rx_tensor *k,
                             const rx_tensor *v, const rx_tensor *mask, const rx_tensor *lens, float *part);
/* One layer's caches kc, vc [B,S,KD] (batch strided): row b's k, v [B,KD] go to slot lens[b] - 1. */
int rx_kv_append(rx_tensor *kc, rx_tensor *vc, const rx_tensor *k, const rx_tensor *v, const rx_tensor *lens);
/* Bytes a device can still give generation: its free memory plus what remax's allocator holds unused. */
int rx_device_available(int32_t device, int64_t *bytes);
/* CUDA graphs on device's stream: capture what the ops between begin and end queue; replay. */
int rx_graph_begin(int32_t device);
int rx_graph_end(int32_t device, void **exec);
int rx_graph_launch(int32_t device, void *exec);
void rx_graph_free(int32_t device, void *exec);

#endif
