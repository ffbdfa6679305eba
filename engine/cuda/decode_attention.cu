// decode_attention.cu: attention of one new query per row (Tq = 1, a decode step) over a long KV
// cache, flash-decoding style: the cache is split along its length into chunks, one block per
// (chunk, kv head, row) keeps an online softmax (running max, sum and weighted values) for every
// query head of the kv head's group, so each key and value row is read once for the whole group
// (GQA without repeating K/V); a second kernel merges the chunks of each (row, head) in a fixed
// order. Arithmetic in f32 whatever the cache's dtype; lse (f32 [B,H,1]) as the general kernel.
//
// Layouts as attention.cu: q, out [B,1,H,D]; k, v [B,Tk,KV,D] with batch strides; mask i32 [B,Tk]
// or NULL. The query sits at key Tk-1 and sees every key s <= Tk-1 whose mask is 1; a query whose
// own mask entry is 0 (padding) gets zeros, as the general kernel gives it.
#include "common.cuh"

enum { DEC_WARPS = 4, DEC_HEADS = 4 };   // heads per warp: a group of up to 16 query heads (RX_CUDA_DECODE_MAX_GROUP)

struct dec_args {
  int64_t B, Tk, H, KV, D, ksb, vsb, chunk, splits, tile;   // tile: keys staged at once
  float scale;
};

template <typename T, int NJ>
__global__ void __launch_bounds__(DEC_WARPS * 32) decode_partial_kernel(float *part_o, float *part_ml, const T *q,
                                                                        const T *k, const T *v, const int32_t *mask,
                                                                        dec_args a) {
  RX_DYNAMIC_SHARED(float, smem);
  float *Ks = smem, *Vs = smem + a.tile * a.D;
  int *keep = (int *)(Vs + a.tile * a.D);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t sp = blockIdx.x, g = blockIdx.y, b = blockIdx.z, G = a.H / a.KV;
  const int64_t s0 = sp * a.chunk, s1 = min(a.Tk, s0 + a.chunk), ld = a.KV * a.D;
  const T *kb = k + b * a.ksb + g * a.D, *vb = v + b * a.vsb + g * a.D;
  const bool live = !mask || mask[b * a.Tk + a.Tk - 1] != 0;

  float qr[DEC_HEADS][NJ], acc[DEC_HEADS][NJ], m[DEC_HEADS], l[DEC_HEADS];
#pragma unroll
  for (int j = 0; j < DEC_HEADS; j++) {
    const int64_t hh = warp + (int64_t)DEC_WARPS * j, h = g * G + hh;
    m[j] = -INFINITY;
    l[j] = 0;
#pragma unroll
    for (int e = 0; e < NJ; e++) {
      const int64_t d = lane + 32 * e;
      qr[j][e] = hh < G && d < a.D ? a.scale * rx_ld(q, (b * a.H + h) * a.D + d) : 0.0f;
      acc[j][e] = 0;
    }
  }
  for (int64_t t0 = s0; t0 < s1; t0 += a.tile) {
    const int64_t rows = min(a.tile, s1 - t0);
    __syncthreads();   // the previous tile is no longer read
    for (int64_t idx = threadIdx.x; idx < a.tile * a.D; idx += blockDim.x) {
      const int64_t r = idx / a.D, d = idx % a.D;
      Ks[idx] = r < rows ? rx_ld(kb, (t0 + r) * ld + d) : 0.0f;
      Vs[idx] = r < rows ? rx_ld(vb, (t0 + r) * ld + d) : 0.0f;
    }
    for (int64_t r = threadIdx.x; r < a.tile; r += blockDim.x)
      keep[r] = live && r < rows && (!mask || mask[b * a.Tk + t0 + r] != 0);
    __syncthreads();
#pragma unroll
    for (int j = 0; j < DEC_HEADS; j++) {
      if (warp + (int64_t)DEC_WARPS * j >= G) continue;   // the same for the whole warp
      for (int64_t r = 0; r < rows; r++) {
        if (!keep[r]) continue;
        float dot = 0;
#pragma unroll
        for (int e = 0; e < NJ; e++) {
          const int64_t d = lane + 32 * e;
          if (d < a.D) dot += qr[j][e] * Ks[r * a.D + d];
        }
        const float sc = rx_warp_sum(dot);
        const float mn = fmaxf(m[j], sc), corr = expf(m[j] - mn), p = expf(sc - mn);
        l[j] = l[j] * corr + p;
#pragma unroll
        for (int e = 0; e < NJ; e++) {
          const int64_t d = lane + 32 * e;
          acc[j][e] = acc[j][e] * corr + (d < a.D ? p * Vs[r * a.D + d] : 0.0f);
        }
        m[j] = mn;
      }
    }
  }
#pragma unroll
  for (int j = 0; j < DEC_HEADS; j++) {
    const int64_t hh = warp + (int64_t)DEC_WARPS * j;
    if (hh >= G) continue;
    const int64_t at = (b * a.H + g * G + hh) * a.splits + sp;
    if (lane == 0) {
      part_ml[2 * at] = m[j];
      part_ml[2 * at + 1] = l[j];
    }
#pragma unroll
    for (int e = 0; e < NJ; e++) {
      const int64_t d = lane + 32 * e;
      if (d < a.D) part_o[at * a.D + d] = acc[j][e];
    }
  }
}

// grid (H, B), one warp: the chunks of (row, head) merged in chunk order.
template <typename T>
__global__ void decode_merge_kernel(T *out, float *lse, const float *part_o, const float *part_ml, dec_args a) {
  const int64_t h = blockIdx.x, b = blockIdx.y, base = (b * a.H + h) * a.splits;
  float M = -INFINITY;
  for (int64_t sp = 0; sp < a.splits; sp++) M = fmaxf(M, part_ml[2 * (base + sp)]);
  float L = 0;
  for (int64_t sp = 0; sp < a.splits; sp++) {
    const float mi = part_ml[2 * (base + sp)];
    if (mi != -INFINITY) L += part_ml[2 * (base + sp) + 1] * expf(mi - M);
  }
  for (int64_t d = threadIdx.x; d < a.D; d += blockDim.x) {
    float o = 0;
    for (int64_t sp = 0; sp < a.splits; sp++) {
      const float mi = part_ml[2 * (base + sp)];
      if (mi != -INFINITY) o += part_o[(base + sp) * a.D + d] * expf(mi - M);
    }
    rx_st(out, (b * a.H + h) * a.D + d, L > 0 ? o / L : 0.0f);
  }
  if (threadIdx.x == 0) lse[b * a.H + h] = L > 0 ? M + logf(L) : 0.0f;
}

#define DEC_DISPATCH_NJ(D, ...)                                 \
  do {                                                          \
    if ((D) <= 32) { constexpr int NJ = 1; __VA_ARGS__; }       \
    else if ((D) <= 64) { constexpr int NJ = 2; __VA_ARGS__; }  \
    else if ((D) <= 128) { constexpr int NJ = 4; __VA_ARGS__; } \
    else { constexpr int NJ = 8; __VA_ARGS__; }                 \
  } while (0)

extern "C" int rx_cuda_decode_attention(void *out, float *lse, const void *q, const void *k, const void *v,
                                        const int32_t *mask, const rx_cuda_attn_dims *dims, int32_t dtype) {
  const char *op = "decode_attention";
  RX_STREAM(s);
  if (dims->Tq != 1 || dims->D < 1 || dims->D > RX_CUDA_ATTN_MAX_D || dims->KV < 1 || dims->H % dims->KV != 0 ||
      dims->H / dims->KV > RX_CUDA_DECODE_MAX_GROUP)
    return rx_fail(RX_EINVAL, "%s: Tq=%lld H=%lld KV=%lld D=%lld: one query per row, D <= %d and at most %d query "
                   "heads per kv head", op, (long long)dims->Tq, (long long)dims->H, (long long)dims->KV,
                   (long long)dims->D, (int)RX_CUDA_ATTN_MAX_D, (int)RX_CUDA_DECODE_MAX_GROUP);
  if (dims->B == 0 || dims->H == 0) return RX_OK;
  dec_args a = {dims->B, dims->Tk, dims->H, dims->KV, dims->D, dims->k_batch_stride, dims->v_batch_stride, 0, 0,
                dims->D > 128 ? 16 : 32, (float)dims->scale};   // K and V tiles stay within 32 KiB of shared memory
  // enough chunks for about two blocks per multiprocessor of a large GPU, each of at least 64 keys
  int64_t want = (264 + a.B * a.KV - 1) / (a.B * a.KV), most = (a.Tk + 63) / 64;
  a.splits = want < 1 ? 1 : want > most ? most : want;
  if (a.splits < 1) a.splits = 1;
  a.chunk = (a.Tk + a.splits - 1) / a.splits;
  a.splits = (a.Tk + a.chunk - 1) / a.chunk;
  if (a.splits < 1) a.splits = 1;
  const size_t parts = (size_t)(a.B * a.H * a.splits);
  float *part;
  void *handle;
  int rc = rx_cuda_malloc((void **)&part, &handle, parts * (size_t)(a.D + 2) * sizeof(float), "decode attention chunks");
  if (rc) return rx_fail_context(rc, "%s", op);
  float *part_ml = part + parts * (size_t)a.D;
  const size_t smem = (size_t)(2 * a.tile * a.D) * sizeof(float) + (size_t)a.tile * sizeof(int);
  const dim3 grid((unsigned)a.splits, (unsigned)a.KV, (unsigned)a.B);
  RX_DISPATCH_FLOAT(dtype, op,
    DEC_DISPATCH_NJ(a.D, RX_LAUNCH((decode_partial_kernel<T, NJ>), grid, DEC_WARPS * 32, smem, s, part, part_ml,
                                   (const T *)q, (const T *)k, (const T *)v, mask, a));
    RX_LAUNCH((decode_merge_kernel<T>), dim3((unsigned)a.H, (unsigned)a.B), 32, 0, s, (T *)out, lse, part, part_ml, a));
  rx_cuda_release(handle);   // stream order: the next user of this memory runs after these kernels
  RX_LAUNCHED(op, "B=%lld Tk=%lld H=%lld KV=%lld D=%lld splits=%lld", (long long)a.B, (long long)a.Tk, (long long)a.H,
              (long long)a.KV, (long long)a.D, (long long)a.splits);
  return RX_OK;
}
