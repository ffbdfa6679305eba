// decode_attention.cu: attention of one new query per row (Tq = 1, a decode step) over a long KV
// cache, flash-decoding style: the cache is split along its length into chunks, one block per
// (chunk, kv head, row) keeps an online softmax (running max, sum and weighted values) for every
// query head of the kv head's group, so each key and value row is read once for the whole group
// (GQA without repeating K/V); a second kernel merges the chunks of each (row, head) in a fixed
// order. Arithmetic in f32 whatever the cache's dtype; lse (f32 [B,H,1]) as the general kernel.
//
// Layouts as attention.cu: q, out [B,1,H,D]; k, v [B,Tk,KV,D] with batch strides; mask i32 [B,Tk]
// or NULL. The query sits at key Tk-1 and sees every key s <= Tk-1 whose mask is 1; a query whose
// own mask entry is 0 (padding) gets zeros, as the general kernel gives it. The graph-stable form
// (rx_cuda_decode_attention_lens) reads each row's length from the device instead: Tk is then
// the cache's length, row b's query sits at lens[b] - 1 and chunks past it do nothing, so a
// CUDA graph captured once replays for every step; rx_cuda_kv_append writes a step's keys and
// values at slot lens[b] - 1 the same way.
#include "attention.cuh"

enum { DEC_WARPS = 4, DEC_HEADS = 4 };   // heads per warp: a group of up to 16 query heads (RX_CUDA_DECODE_MAX_GROUP)

struct dec_args {
  int64_t B, Tk, H, KV, D, ksb, vsb, chunk, splits, tile;   // tile: keys staged at once
  float scale;
};

template <typename T, int NJ>
__global__ void __launch_bounds__(DEC_WARPS * 32) decode_partial_kernel(float *part_o, float *part_ml, const T *q,
                                                                        const T *k, const T *v, const int32_t *mask,
                                                                        const int32_t *lens, dec_args a) {
  RX_DYNAMIC_SHARED(float, smem);
  float *Ks = smem, *Vs = smem + a.tile * a.D;
  int *keep = (int *)(Vs + a.tile * a.D);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t sp = blockIdx.x, g = blockIdx.y, b = blockIdx.z, G = a.H / a.KV;
  const int64_t len = lens ? (int64_t)lens[b] : a.Tk;
  const int64_t s0 = sp * a.chunk, s1 = min(len, s0 + a.chunk), ld = a.KV * a.D;
  const T *kb = k + b * a.ksb + g * a.D, *vb = v + b * a.vsb + g * a.D;
  const bool live = len > 0 && (!mask || mask[b * a.Tk + len - 1] != 0);

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
        float corr, p;
        online_softmax_add(m[j], l[j], rx_warp_sum(dot), corr, p);
#pragma unroll
        for (int e = 0; e < NJ; e++) {
          const int64_t d = lane + 32 * e;
          acc[j][e] = acc[j][e] * corr + (d < a.D ? p * Vs[r * a.D + d] : 0.0f);
        }
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

// Chunks of the cache: enough for about two blocks per multiprocessor of a large GPU, each of at
// least 64 keys.
static dec_args plan(const rx_cuda_attn_dims *dims) {
  dec_args a = {dims->B, dims->Tk, dims->H, dims->KV, dims->D, dims->k_batch_stride, dims->v_batch_stride, 0, 0,
                dims->D > 128 ? 16 : 32, (float)dims->scale};   // K and V tiles stay within 32 KiB of shared memory
  const int64_t want = (264 + a.B * a.KV - 1) / (a.B * a.KV), most = (a.Tk + 63) / 64;
  a.splits = want < 1 ? 1 : want > most ? most : want;
  if (a.splits < 1) a.splits = 1;
  a.chunk = (a.Tk + a.splits - 1) / a.splits;
  if (a.chunk < 1) a.chunk = 1;
  a.splits = (a.Tk + a.chunk - 1) / a.chunk;
  if (a.splits < 1) a.splits = 1;
  return a;
}

static int check(const char *op, const rx_cuda_attn_dims *dims) {
  if (dims->Tq != 1 || dims->D < 1 || dims->D > RX_CUDA_ATTN_MAX_D || dims->KV < 1 || dims->H % dims->KV != 0 ||
      dims->H / dims->KV > RX_CUDA_DECODE_MAX_GROUP)
    return rx_fail(RX_EINVAL, "%s: Tq=%lld H=%lld KV=%lld D=%lld: one query per row, D <= %d and at most %d query "
                   "heads per kv head", op, (long long)dims->Tq, (long long)dims->H, (long long)dims->KV,
                   (long long)dims->D, (int)RX_CUDA_ATTN_MAX_D, (int)RX_CUDA_DECODE_MAX_GROUP);
  return RX_OK;
}

static int launch(const char *op, void *out, float *lse, const void *q, const void *k, const void *v,
                  const int32_t *mask, const int32_t *lens, float *part, const dec_args &a, int32_t dtype) {
  RX_STREAM(s);
  float *part_ml = part + (size_t)(a.B * a.H * a.splits) * (size_t)a.D;
  const size_t smem = (size_t)(2 * a.tile * a.D) * sizeof(float) + (size_t)a.tile * sizeof(int);
  const dim3 grid((unsigned)a.splits, (unsigned)a.KV, (unsigned)a.B);
  RX_DISPATCH_FLOAT(dtype, op,
    RX_DISPATCH_NJ(a.D, RX_LAUNCH((decode_partial_kernel<T, NJ>), grid, DEC_WARPS * 32, smem, s, part, part_ml,
                                   (const T *)q, (const T *)k, (const T *)v, mask, lens, a));
    RX_LAUNCH((decode_merge_kernel<T>), dim3((unsigned)a.H, (unsigned)a.B), 32, 0, s, (T *)out, lse, part, part_ml, a));
  RX_LAUNCHED(op, "B=%lld Tk=%lld H=%lld KV=%lld D=%lld splits=%lld", (long long)a.B, (long long)a.Tk, (long long)a.H,
              (long long)a.KV, (long long)a.D, (long long)a.splits);
  return RX_OK;
}

extern "C" int rx_cuda_decode_attention(void *out, float *lse, const void *q, const void *k, const void *v,
                                        const int32_t *mask, const rx_cuda_attn_dims *dims, int32_t dtype) {
  const char *op = "decode_attention";
  if (check(op, dims)) return RX_EINVAL;
  if (dims->B == 0 || dims->H == 0) return RX_OK;
  const dec_args a = plan(dims);
  float *part;
  void *handle;
  int rc = rx_cuda_malloc((void **)&part, &handle, (size_t)rx_cuda_decode_attention_scratch(dims) * sizeof(float),
                          "decode attention chunks");
  if (rc) return rx_fail_context(rc, "%s", op);
  rc = launch(op, out, lse, q, k, v, mask, NULL, part, a, dtype);
  rx_cuda_release(handle);   // stream order: the next user of this memory runs after these kernels
  return rc;
}

extern "C" int64_t rx_cuda_decode_attention_scratch(const rx_cuda_attn_dims *dims) {
  const dec_args a = plan(dims);
  return a.B * a.H * a.splits * (a.D + 2);
}

extern "C" int rx_cuda_decode_attention_lens(void *out, float *lse, const void *q, const void *k, const void *v,
                                             const int32_t *mask, const int32_t *lens, float *part,
                                             const rx_cuda_attn_dims *dims, int32_t dtype) {
  const char *op = "decode_attention";
  if (check(op, dims)) return RX_EINVAL;
  if (dims->B == 0 || dims->H == 0) return RX_OK;
  return launch(op, out, lse, q, k, v, mask, lens, part, plan(dims), dtype);
}

// kc, vc: one layer's cache [B, S, KD]; k, v: the step's [B, KD]; row b's go to slot lens[b] - 1.
template <typename T>
__global__ void kv_append_kernel(T *kc, T *vc, const T *k, const T *v, const int32_t *lens, int64_t B, int64_t S,
                                 int64_t KD) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < B * KD; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t b = i / KD, j = i % KD, at = (b * S + lens[b] - 1) * KD + j;
    kc[at] = k[i];
    vc[at] = v[i];
  }
}

extern "C" int rx_cuda_kv_append(void *kc, void *vc, const void *k, const void *v, const int32_t *lens, int64_t B,
                                 int64_t S, int64_t KD, int32_t dtype) {
  RX_STREAM(s);
  if (B * KD == 0) return RX_OK;
  RX_DISPATCH_FLOAT(dtype, "kv_append",
    RX_LAUNCH((kv_append_kernel<T>), rx_blocks(B * KD, 256), 256, 0, s, (T *)kc, (T *)vc, (const T *)k, (const T *)v,
              lens, B, S, KD));
  RX_LAUNCHED("kv_append", "B=%lld S=%lld KD=%lld", (long long)B, (long long)S, (long long)KD);
  return RX_OK;
}
