// attention.cu: causal grouped-query attention, forward and backward, the twin of
// cpu/attention.inc (contract in remax.h and docs/attention.md), written in the flash-attention
// style: tiles of keys (forward, dq) or of queries (dk, dv) staged in shared memory, an online
// softmax (running max and sum per query row), only the log-sum-exp kept for the backward, which
// recomputes the probabilities tile by tile. No [T, T] matrix exists anywhere.
//
// This first version is written for correctness and determinism, not yet for speed: a warp owns a
// few query rows (or key rows), each lane holds D/32 of a row's elements in registers, and dot
// products are warp shuffles (CUDA cores, no tensor cores). The backward has no atomics: dq comes
// from a query-major pass, dk and dv from a key-major pass that loops over the group's query heads.
//
// Layouts: q, out, dq, dout [B,Tq,H,D]; k, v [B,Tk,KV,D] with batch strides; dk, dv contiguous
// [B,Tk,KV,D]; lse f32 [B,H,Tq]; mask i32 [B,Tk] or NULL. Query i sits at key position
// off + i, off = Tk - Tq, and sees keys s <= off + i with mask 1; a padded query gives zeros
// (out, lse, dq), a padded key gets zero dk and dv.
#include "common.cuh"

enum { WARPS = 4 };

// Rows per warp and the shared-memory tile length, by the lane's share NJ = ceil(D / 32).
template <int NJ>
struct attn_cfg {
  static const int RPW = NJ >= 8 ? 2 : 4;    // rows (queries or keys) per warp
  static const int TILE = NJ >= 8 ? 16 : 32; // rows of the tile in shared memory
};

struct attn_args {
  int64_t B, Tq, Tk, H, KV, D, ksb, vsb;   // ksb, vsb: k and v batch strides (elements)
  float scale;
};

__device__ __forceinline__ bool key_kept(const int32_t *mask, int64_t b, int64_t Tk, int64_t s) {
  return s < Tk && (!mask || mask[b * Tk + s] != 0);
}

// Stages rows [r0, r0 + TILE) of a [rows, ld] matrix at `base` (row stride ld, D columns) into
// shared memory as floats, zero past `rows`.
template <typename T>
__device__ __forceinline__ void stage_rows(float *dst, const T *base, int64_t ld, int64_t r0, int64_t rows, int tile,
                                           int64_t D) {
  for (int64_t idx = threadIdx.x; idx < tile * D; idx += blockDim.x) {
    const int64_t a = idx / D, d = idx % D, r = r0 + a;
    dst[idx] = r < rows ? rx_ld(base, r * ld + d) : 0.0f;
  }
}

// ---------------------------------------------------------------- forward
// grid (ceil(Tq / (WARPS RPW)), H, B); each warp owns RPW query rows.
template <typename T, int NJ>
__global__ void __launch_bounds__(WARPS * 32) attn_forward_kernel(T *out, float *lse, const T *q, const T *k,
                                                                  const T *v, const int32_t *mask, attn_args a) {
  constexpr int RPW = attn_cfg<NJ>::RPW, TILE = attn_cfg<NJ>::TILE;
  RX_DYNAMIC_SHARED(float, smem);
  float *Ks = smem, *Vs = smem + TILE * a.D;
  int *keep = (int *)(Vs + TILE * a.D);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t b = blockIdx.z, h = blockIdx.y, g = h / (a.H / a.KV), off = a.Tk - a.Tq;
  const int64_t i_block = (int64_t)blockIdx.x * WARPS * RPW;
  const T *kb = k + b * a.ksb + g * a.D, *vb = v + b * a.vsb + g * a.D;
  const int64_t ldk = a.KV * a.D;

  float qr[RPW][NJ], acc[RPW][NJ], m[RPW], l[RPW];
  int64_t pos[RPW];
  bool valid[RPW], live[RPW];
#pragma unroll
  for (int r = 0; r < RPW; r++) {
    const int64_t i = i_block + warp * RPW + r;
    valid[r] = i < a.Tq;
    pos[r] = off + i;
    live[r] = valid[r] && (!mask || mask[b * a.Tk + pos[r]] != 0);
    m[r] = -INFINITY;
    l[r] = 0;
#pragma unroll
    for (int j = 0; j < NJ; j++) {
      const int64_t d = lane + 32 * j;
      qr[r][j] = live[r] && d < a.D ? a.scale * rx_ld(q, ((b * a.Tq + i) * a.H + h) * a.D + d) : 0.0f;
      acc[r][j] = 0;
    }
  }
  const int64_t i_last = min(a.Tq - 1, i_block + WARPS * RPW - 1);
  const int64_t s_end = off + i_last + 1;   // keys the block's last query can see
  for (int64_t s0 = 0; s0 < s_end; s0 += TILE) {
    __syncthreads();
    stage_rows(Ks, kb, ldk, s0, a.Tk, TILE, a.D);
    stage_rows(Vs, vb, ldk, s0, a.Tk, TILE, a.D);
    for (int t = threadIdx.x; t < TILE; t += blockDim.x) keep[t] = key_kept(mask, b, a.Tk, s0 + t);
    __syncthreads();
    const int nk = (int)min((int64_t)TILE, s_end - s0);
    for (int t = 0; t < nk; t++) {
      if (!keep[t]) continue;   // the same for the whole block
      const int64_t s = s0 + t;
      float kk[NJ], vv[NJ], dot[RPW];
#pragma unroll
      for (int j = 0; j < NJ; j++) {
        const int64_t d = lane + 32 * j;
        kk[j] = d < a.D ? Ks[t * a.D + d] : 0.0f;
        vv[j] = d < a.D ? Vs[t * a.D + d] : 0.0f;
      }
#pragma unroll
      for (int r = 0; r < RPW; r++) {
        float p = 0;
#pragma unroll
        for (int j = 0; j < NJ; j++) p += qr[r][j] * kk[j];
        dot[r] = rx_warp_sum(p);
      }
#pragma unroll
      for (int r = 0; r < RPW; r++) {
        if (!live[r] || s > pos[r]) continue;   // uniform across the warp
        const float mn = fmaxf(m[r], dot[r]), corr = expf(m[r] - mn), p = expf(dot[r] - mn);
        l[r] = l[r] * corr + p;
#pragma unroll
        for (int j = 0; j < NJ; j++) acc[r][j] = acc[r][j] * corr + p * vv[j];
        m[r] = mn;
      }
    }
  }
#pragma unroll
  for (int r = 0; r < RPW; r++) {
    if (!valid[r]) continue;
    const int64_t i = i_block + warp * RPW + r;
    const float inv = live[r] ? 1.0f / l[r] : 0.0f;
#pragma unroll
    for (int j = 0; j < NJ; j++) {
      const int64_t d = lane + 32 * j;
      if (d < a.D) rx_st(out, ((b * a.Tq + i) * a.H + h) * a.D + d, acc[r][j] * inv);
    }
    if (lane == 0) lse[(b * a.H + h) * a.Tq + i] = live[r] ? m[r] + logf(l[r]) : 0.0f;
  }
}

// ---------------------------------------------------------------- backward
// Delta[b,h,i] = dout_i . out_i, one warp per row.
template <typename T>
__global__ void attn_delta_kernel(float *delta, const T *dout, const T *out, attn_args a) {
  const int64_t row = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);   // (b*Tq + i)*H + h
  const int lane = threadIdx.x & 31;
  if (row >= a.B * a.Tq * a.H) return;
  float s = 0;
  for (int64_t d = lane; d < a.D; d += 32) s += rx_ld(dout, row * a.D + d) * rx_ld(out, row * a.D + d);
  s = rx_warp_sum(s);
  const int64_t h = row % a.H, bi = row / a.H, i = bi % a.Tq, b = bi / a.Tq;
  if (lane == 0) delta[(b * a.H + h) * a.Tq + i] = s;
}

// dq_i = scale sum_s P_is (dP_is - Delta_i) k_s, P = exp(scale q.k - lse), dP = dout.v.
// Same grid and tiling as the forward.
template <typename T, int NJ>
__global__ void __launch_bounds__(WARPS * 32) attn_dq_kernel(T *dq, const T *dout, const T *q, const T *k, const T *v,
                                                             const float *lse, const float *delta, const int32_t *mask,
                                                             attn_args a) {
  constexpr int RPW = attn_cfg<NJ>::RPW, TILE = attn_cfg<NJ>::TILE;
  RX_DYNAMIC_SHARED(float, smem);
  float *Ks = smem, *Vs = smem + TILE * a.D;
  int *keep = (int *)(Vs + TILE * a.D);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t b = blockIdx.z, h = blockIdx.y, g = h / (a.H / a.KV), off = a.Tk - a.Tq;
  const int64_t i_block = (int64_t)blockIdx.x * WARPS * RPW;
  const T *kb = k + b * a.ksb + g * a.D, *vb = v + b * a.vsb + g * a.D;
  const int64_t ldk = a.KV * a.D;

  float qr[RPW][NJ], dor[RPW][NJ], acc[RPW][NJ], L[RPW], Dl[RPW];
  int64_t pos[RPW];
  bool valid[RPW], live[RPW];
#pragma unroll
  for (int r = 0; r < RPW; r++) {
    const int64_t i = i_block + warp * RPW + r;
    valid[r] = i < a.Tq;
    pos[r] = off + i;
    live[r] = valid[r] && (!mask || mask[b * a.Tk + pos[r]] != 0);
    L[r] = live[r] ? lse[(b * a.H + h) * a.Tq + i] : 0.0f;
    Dl[r] = live[r] ? delta[(b * a.H + h) * a.Tq + i] : 0.0f;
#pragma unroll
    for (int j = 0; j < NJ; j++) {
      const int64_t d = lane + 32 * j, at = ((b * a.Tq + i) * a.H + h) * a.D + d;
      qr[r][j] = live[r] && d < a.D ? a.scale * rx_ld(q, at) : 0.0f;
      dor[r][j] = live[r] && d < a.D ? rx_ld(dout, at) : 0.0f;
      acc[r][j] = 0;
    }
  }
  const int64_t i_last = min(a.Tq - 1, i_block + WARPS * RPW - 1);
  const int64_t s_end = off + i_last + 1;
  for (int64_t s0 = 0; s0 < s_end; s0 += TILE) {
    __syncthreads();
    stage_rows(Ks, kb, ldk, s0, a.Tk, TILE, a.D);
    stage_rows(Vs, vb, ldk, s0, a.Tk, TILE, a.D);
    for (int t = threadIdx.x; t < TILE; t += blockDim.x) keep[t] = key_kept(mask, b, a.Tk, s0 + t);
    __syncthreads();
    const int nk = (int)min((int64_t)TILE, s_end - s0);
    for (int t = 0; t < nk; t++) {
      if (!keep[t]) continue;
      const int64_t s = s0 + t;
      float kk[NJ], vv[NJ], sc[RPW], dp[RPW];
#pragma unroll
      for (int j = 0; j < NJ; j++) {
        const int64_t d = lane + 32 * j;
        kk[j] = d < a.D ? Ks[t * a.D + d] : 0.0f;
        vv[j] = d < a.D ? Vs[t * a.D + d] : 0.0f;
      }
#pragma unroll
      for (int r = 0; r < RPW; r++) {
        float x = 0, y = 0;
#pragma unroll
        for (int j = 0; j < NJ; j++) { x += qr[r][j] * kk[j]; y += dor[r][j] * vv[j]; }
        sc[r] = rx_warp_sum(x);
        dp[r] = rx_warp_sum(y);
      }
#pragma unroll
      for (int r = 0; r < RPW; r++) {
        if (!live[r] || s > pos[r]) continue;
        const float p = expf(sc[r] - L[r]), ds = p * (dp[r] - Dl[r]);
#pragma unroll
        for (int j = 0; j < NJ; j++) acc[r][j] += ds * kk[j];
      }
    }
  }
#pragma unroll
  for (int r = 0; r < RPW; r++) {
    if (!valid[r]) continue;
    const int64_t i = i_block + warp * RPW + r;
#pragma unroll
    for (int j = 0; j < NJ; j++) {
      const int64_t d = lane + 32 * j;
      if (d < a.D) rx_st(dq, ((b * a.Tq + i) * a.H + h) * a.D + d, a.scale * acc[r][j]);
    }
  }
}

// dv_s = sum_{h in group} sum_i P_is dout_i; dk_s = scale sum_h sum_i P_is (dP_is - Delta_i) q_i.
// grid (ceil(Tk / (WARPS RPW)), KV, B); each warp owns RPW key rows; query tiles in shared memory.
template <typename T, int NJ>
__global__ void __launch_bounds__(WARPS * 32) attn_dkdv_kernel(T *dk, T *dv, const T *dout, const T *q, const T *k,
                                                               const T *v, const float *lse, const float *delta,
                                                               const int32_t *mask, attn_args a) {
  constexpr int RPW = attn_cfg<NJ>::RPW, TILE = attn_cfg<NJ>::TILE;
  RX_DYNAMIC_SHARED(float, smem);
  float *Qs = smem, *Os = smem + TILE * a.D, *Ls = Os + TILE * a.D, *Ds = Ls + TILE;
  int *qkeep = (int *)(Ds + TILE);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t b = blockIdx.z, g = blockIdx.y, group = a.H / a.KV, off = a.Tk - a.Tq;
  const int64_t s_block = (int64_t)blockIdx.x * WARPS * RPW;
  const int64_t ldq = a.H * a.D, ldk = a.KV * a.D;

  float kr[RPW][NJ], vr[RPW][NJ], dka[RPW][NJ], dva[RPW][NJ];
  int64_t srow[RPW];
  bool valid[RPW], live[RPW];
#pragma unroll
  for (int r = 0; r < RPW; r++) {
    const int64_t s = s_block + warp * RPW + r;
    srow[r] = s;
    valid[r] = s < a.Tk;
    live[r] = key_kept(mask, b, a.Tk, s);
#pragma unroll
    for (int j = 0; j < NJ; j++) {
      const int64_t d = lane + 32 * j;
      kr[r][j] = live[r] && d < a.D ? a.scale * rx_ld(k, b * a.ksb + s * ldk + g * a.D + d) : 0.0f;
      vr[r][j] = live[r] && d < a.D ? rx_ld(v, b * a.vsb + s * ldk + g * a.D + d) : 0.0f;
      dka[r][j] = 0;
      dva[r][j] = 0;
    }
  }
  // queries that can see the block's first key: i >= s_block - off
  const int64_t i_first = s_block - off > 0 ? s_block - off : 0;
  for (int64_t h = g * group; h < (g + 1) * group; h++) {
    const T *qh = q + b * a.Tq * ldq + h * a.D, *oh = dout + b * a.Tq * ldq + h * a.D;
    for (int64_t i0 = i_first; i0 < a.Tq; i0 += TILE) {
      __syncthreads();
      stage_rows(Qs, qh, ldq, i0, a.Tq, TILE, a.D);
      stage_rows(Os, oh, ldq, i0, a.Tq, TILE, a.D);
      for (int t = threadIdx.x; t < TILE; t += blockDim.x) {
        const int64_t i = i0 + t;
        const bool ok = i < a.Tq && (!mask || mask[b * a.Tk + off + i] != 0);
        qkeep[t] = ok;
        Ls[t] = ok ? lse[(b * a.H + h) * a.Tq + i] : 0.0f;
        Ds[t] = ok ? delta[(b * a.H + h) * a.Tq + i] : 0.0f;
      }
      __syncthreads();
      const int nq = (int)min((int64_t)TILE, a.Tq - i0);
      for (int t = 0; t < nq; t++) {
        if (!qkeep[t]) continue;
        const int64_t pos = off + i0 + t;
        float qq[NJ], oo[NJ], sc[RPW], dp[RPW];
#pragma unroll
        for (int j = 0; j < NJ; j++) {
          const int64_t d = lane + 32 * j;
          qq[j] = d < a.D ? Qs[t * a.D + d] : 0.0f;
          oo[j] = d < a.D ? Os[t * a.D + d] : 0.0f;
        }
#pragma unroll
        for (int r = 0; r < RPW; r++) {
          float x = 0, y = 0;
#pragma unroll
          for (int j = 0; j < NJ; j++) { x += kr[r][j] * qq[j]; y += vr[r][j] * oo[j]; }
          sc[r] = rx_warp_sum(x);
          dp[r] = rx_warp_sum(y);
        }
        const float Li = Ls[t], Di = Ds[t];
#pragma unroll
        for (int r = 0; r < RPW; r++) {
          if (!live[r] || srow[r] > pos) continue;
          const float p = expf(sc[r] - Li), ds = p * (dp[r] - Di);
#pragma unroll
          for (int j = 0; j < NJ; j++) {
            dva[r][j] += p * oo[j];
            dka[r][j] += ds * qq[j];
          }
        }
      }
    }
  }
#pragma unroll
  for (int r = 0; r < RPW; r++) {
    if (!valid[r]) continue;
#pragma unroll
    for (int j = 0; j < NJ; j++) {
      const int64_t d = lane + 32 * j, at = (b * a.Tk + srow[r]) * ldk + g * a.D + d;
      if (d >= a.D) continue;
      if (dk) rx_st(dk, at, a.scale * dka[r][j]);
      if (dv) rx_st(dv, at, dva[r][j]);
    }
  }
}

// ---------------------------------------------------------------- launchers

static attn_args args_of(const rx_cuda_attn_dims *d) {
  attn_args a = {d->B, d->Tq, d->Tk, d->H, d->KV, d->D, d->k_batch_stride, d->v_batch_stride, (float)d->scale};
  return a;
}

template <int NJ>
static size_t smem_forward(int64_t D) { return (size_t)(2 * attn_cfg<NJ>::TILE * D) * sizeof(float) + attn_cfg<NJ>::TILE * sizeof(int); }
template <int NJ>
static size_t smem_dkdv(int64_t D) {
  return (size_t)(2 * attn_cfg<NJ>::TILE * D + 2 * attn_cfg<NJ>::TILE) * sizeof(float) + attn_cfg<NJ>::TILE * sizeof(int);
}

template <typename T, int NJ>
static void launch_forward(T *out, float *lse, const T *q, const T *k, const T *v, const int32_t *mask, attn_args a,
                           cudaStream_t s) {
  const int rows = WARPS * attn_cfg<NJ>::RPW;
  dim3 grid((unsigned)((a.Tq + rows - 1) / rows), (unsigned)a.H, (unsigned)a.B);
  RX_LAUNCH((attn_forward_kernel<T, NJ>), grid, WARPS * 32, smem_forward<NJ>(a.D), s, out, lse, q, k, v, mask, a);
}

template <typename T, int NJ>
static void launch_backward(T *dq, T *dk, T *dv, const T *dout, const T *q, const T *k, const T *v, const float *lse,
                            const float *delta, const int32_t *mask, attn_args a, cudaStream_t s) {
  const int rows = WARPS * attn_cfg<NJ>::RPW;
  if (dq) {
    dim3 grid((unsigned)((a.Tq + rows - 1) / rows), (unsigned)a.H, (unsigned)a.B);
    RX_LAUNCH((attn_dq_kernel<T, NJ>), grid, WARPS * 32, smem_forward<NJ>(a.D), s,
              dq, dout, q, k, v, lse, delta, mask, a);
  }
  if (dk || dv) {
    dim3 grid((unsigned)((a.Tk + rows - 1) / rows), (unsigned)a.KV, (unsigned)a.B);
    RX_LAUNCH((attn_dkdv_kernel<T, NJ>), grid, WARPS * 32, smem_dkdv<NJ>(a.D), s,
              dk, dv, dout, q, k, v, lse, delta, mask, a);
  }
}

static int check_dims(const char *op, const rx_cuda_attn_dims *d) {
  if (d->D > RX_CUDA_ATTN_MAX_D)
    return rx_fail(RX_EINVAL, "%s: head dim D = %lld exceeds the cuda kernel's %d", op, (long long)d->D, RX_CUDA_ATTN_MAX_D);
  if (d->H > 65535 || d->B > 65535)
    return rx_fail(RX_EINVAL, "%s: B = %lld or H = %lld exceeds 65535 (grid limits)", op, (long long)d->B, (long long)d->H);
  return RX_OK;
}

// Runs BODY with NJ = 1, 2, 4 or 8 for D <= 32, 64, 128, 256.
#define RX_DISPATCH_NJ(D, ...)                                  \
  do {                                                          \
    if ((D) <= 32) { constexpr int NJ = 1; __VA_ARGS__; }       \
    else if ((D) <= 64) { constexpr int NJ = 2; __VA_ARGS__; }  \
    else if ((D) <= 128) { constexpr int NJ = 4; __VA_ARGS__; } \
    else { constexpr int NJ = 8; __VA_ARGS__; }                 \
  } while (0)

extern "C" int rx_cuda_attention_forward(void *out, float *lse, const void *q, const void *k, const void *v,
                                         const int32_t *mask, const rx_cuda_attn_dims *dims, int32_t dtype) {
  const char *op = "attention_forward";
  RX_STREAM(s);
  if (check_dims(op, dims)) return RX_EINVAL;
  if (dims->B == 0 || dims->Tq == 0 || dims->H == 0) return RX_OK;
  const attn_args a = args_of(dims);
  RX_DISPATCH_FLOAT(dtype, op,
    RX_DISPATCH_NJ(a.D, launch_forward<T, NJ>((T *)out, lse, (const T *)q, (const T *)k, (const T *)v, mask, a, s)));
  RX_LAUNCHED(op, "B=%lld Tq=%lld Tk=%lld H=%lld KV=%lld D=%lld", (long long)a.B, (long long)a.Tq, (long long)a.Tk,
              (long long)a.H, (long long)a.KV, (long long)a.D);
  return RX_OK;
}

extern "C" int rx_cuda_attention_backward(void *dq, void *dk, void *dv, const void *dout, const void *q, const void *k,
                                          const void *v, const void *out, const float *lse, const int32_t *mask,
                                          const rx_cuda_attn_dims *dims, int32_t dtype) {
  const char *op = "attention_backward";
  RX_STREAM(s);
  if (check_dims(op, dims)) return RX_EINVAL;
  if (dtype != RX_F32 && dtype != RX_BF16)
    return rx_fail(RX_EINVAL, "%s: no cuda kernel for dtype %s (f32 and bf16 only)", op, rx_dtype_name(dtype));
  if (!dq && !dk && !dv) return RX_OK;
  const attn_args a = args_of(dims);
  if (a.B == 0 || a.H == 0) return RX_OK;
  if (a.Tq == 0) {   // no query sees any key: the gradients are zero
    const size_t kv_bytes = (size_t)(a.B * a.Tk * a.KV * a.D * rx_dtype_size(dtype));
    int rc = dk ? rx_cuda_memset0(dk, kv_bytes) : RX_OK;
    if (!rc && dv) rc = rx_cuda_memset0(dv, kv_bytes);
    return rc;
  }
  float *delta;
  void *handle;
  int rc = rx_cuda_malloc((void **)&delta, &handle, (size_t)(a.B * a.H * a.Tq) * sizeof(float), "attention Delta");
  if (rc) return rx_fail_context(rc, "%s", op);
  const int64_t rows = a.B * a.Tq * a.H;
  RX_DISPATCH_FLOAT(dtype, op, {
    RX_LAUNCH((attn_delta_kernel<T>), (unsigned)((rows + 7) / 8), 256, 0, s, delta, (const T *)dout, (const T *)out, a);
    RX_DISPATCH_NJ(a.D, launch_backward<T, NJ>((T *)dq, (T *)dk, (T *)dv, (const T *)dout, (const T *)q, (const T *)k,
                                               (const T *)v, lse, delta, mask, a, s));
  });
  rx_cuda_release(handle);   // stream order keeps it alive for the kernels above
  RX_LAUNCHED(op, "B=%lld Tq=%lld Tk=%lld H=%lld KV=%lld D=%lld", (long long)a.B, (long long)a.Tq, (long long)a.Tk,
              (long long)a.H, (long long)a.KV, (long long)a.D);
  return RX_OK;
}
