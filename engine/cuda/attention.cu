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
//
// Packed rows (cu_seqlens, B = 1, Tq = Tk = N): the time axis holds S rows end to end, and a
// query i of row r = [cu[r], cu[r+1]) sees keys cu[r] <= s <= i only; a key s is seen by the
// queries s <= i < cu[r+1]. Without cu_seqlens every batch row is one row: lo = 0, hi = Tq.
#include "attention.cuh"

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
  const int32_t *cu;                       // packed rows' boundaries [S+1], or NULL
  int64_t S;
};

// The packed row holding token i: the last r with cu[r] <= i (binary search over S+1 entries).
__device__ __forceinline__ int64_t seq_of(const attn_args &a, int64_t i) {
  int64_t lo = 0, hi = a.S - 1;
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (a.cu[mid] <= i) lo = mid; else hi = mid - 1;
  }
  return lo;
}
// The first key token i may see (its row's start), and one past the last query key s is seen by.
__device__ __forceinline__ int64_t row_start(const attn_args &a, int64_t i) { return a.cu ? a.cu[seq_of(a, i)] : 0; }
__device__ __forceinline__ int64_t row_end(const attn_args &a, int64_t s) { return a.cu ? a.cu[seq_of(a, s) + 1] : a.Tq; }

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

// The query-major kernels' (forward, dq) shared memory: a tile of TILE keys and values of one kv
// head as floats [TILE, D], keep[t] = whether key s0 + t exists and is not masked.
template <int TILE>
struct kv_tile {
  float *K, *V;
  int *keep;
  __device__ kv_tile(float *smem, int64_t D) : K(smem), V(smem + TILE * D), keep((int *)(smem + 2 * TILE * D)) {}
  // Stages keys [s0, s0 + TILE) of row b, kv head g, between two barriers.
  template <typename T>
  __device__ void stage(const T *k, const T *v, int64_t b, int64_t g, int64_t s0, const int32_t *mask,
                        const attn_args &a) {
    const int64_t ldk = a.KV * a.D;
    __syncthreads();   // the previous tile is no longer read
    stage_rows(K, k + b * a.ksb + g * a.D, ldk, s0, a.Tk, TILE, a.D);
    stage_rows(V, v + b * a.vsb + g * a.D, ldk, s0, a.Tk, TILE, a.D);
    for (int t = threadIdx.x; t < TILE; t += blockDim.x) keep[t] = key_kept(mask, b, a.Tk, s0 + t);
    __syncthreads();
  }
};

// out[r] = rows[r] . x for each of the warp's RPW rows, from the lanes' shares (warp sums).
template <int RPW, int NJ>
__device__ __forceinline__ void warp_dots(float out[RPW], const float rows[RPW][NJ], const float x[NJ]) {
#pragma unroll
  for (int r = 0; r < RPW; r++) {
    float p = 0;
#pragma unroll
    for (int j = 0; j < NJ; j++) p += rows[r][j] * x[j];
    out[r] = rx_warp_sum(p);
  }
}

// Stores x[j] * mul, the lane's share, into the D-element row of dst at element `at`.
template <typename T, int NJ>
__device__ __forceinline__ void store_lane_share(T *dst, int64_t at, const float x[NJ], float mul, int lane,
                                                 int64_t D) {
#pragma unroll
  for (int j = 0; j < NJ; j++) {
    const int64_t d = lane + 32 * j;
    if (d < D) rx_st(dst, at + d, x[j] * mul);
  }
}

// The warp's RPW query rows in a query-major block (forward, dq; grid (ceil(Tq / (WARPS RPW)), H,
// B)): row r is query i(r) = i0 + r of head h (kv head g) in batch row b, at key position pos[r] =
// off + i(r); valid[r] when that query exists, live[r] when it is also no padding.
template <int RPW>
struct query_rows {
  int64_t b, h, g, off, i_block, i0;   // i_block: the block's first query
  int64_t pos[RPW], lo[RPW];           // lo: the row's first key (packed rows), else 0
  bool valid[RPW], live[RPW];
  __device__ query_rows(const int32_t *mask, const attn_args &a)
      : b(blockIdx.z), h(blockIdx.y), g(h / (a.H / a.KV)), off(a.Tk - a.Tq),
        i_block((int64_t)blockIdx.x * WARPS * RPW), i0(i_block + (threadIdx.x >> 5) * RPW) {
#pragma unroll
    for (int r = 0; r < RPW; r++) {
      valid[r] = i(r) < a.Tq;
      pos[r] = off + i(r);
      lo[r] = valid[r] ? row_start(a, i(r)) : 0;
      live[r] = valid[r] && key_kept(mask, b, a.Tk, pos[r]);
    }
  }
  __device__ int64_t i(int r) const { return i0 + r; }
  // Row r's element 0 in q, out, dq or dout [B,Tq,H,D], and its entry in lse or Delta [B,H,Tq].
  __device__ int64_t at(int r, const attn_args &a) const { return ((b * a.Tq + i(r)) * a.H + h) * a.D; }
  __device__ int64_t stat(int r, const attn_args &a) const { return (b * a.H + h) * a.Tq + i(r); }
  // Keys the block's last query can see, and the first key its first query can (rows start in order).
  __device__ int64_t key_end(const attn_args &a) const { return off + min(a.Tq - 1, i_block + WARPS * RPW - 1) + 1; }
  __device__ int64_t key_begin(const attn_args &a) const { return row_start(a, i_block); }
};

// ---------------------------------------------------------------- forward
// grid (ceil(Tq / (WARPS RPW)), H, B); each warp owns RPW query rows.
template <typename T, int NJ>
__global__ void __launch_bounds__(WARPS * 32) attn_forward_kernel(T *out, float *lse, const T *q, const T *k,
                                                                  const T *v, const int32_t *mask, attn_args a) {
  constexpr int RPW = attn_cfg<NJ>::RPW, TILE = attn_cfg<NJ>::TILE;
  RX_DYNAMIC_SHARED(float, smem);
  kv_tile<TILE> tile(smem, a.D);
  const query_rows<RPW> w(mask, a);
  const int lane = threadIdx.x & 31;

  float qr[RPW][NJ], acc[RPW][NJ], m[RPW], l[RPW];
#pragma unroll
  for (int r = 0; r < RPW; r++) {
    m[r] = -INFINITY;
    l[r] = 0;
#pragma unroll
    for (int j = 0; j < NJ; j++) {
      const int64_t d = lane + 32 * j;
      qr[r][j] = w.live[r] && d < a.D ? a.scale * rx_ld(q, w.at(r, a) + d) : 0.0f;
      acc[r][j] = 0;
    }
  }
  const int64_t s_end = w.key_end(a);
  for (int64_t s0 = w.key_begin(a); s0 < s_end; s0 += TILE) {
    tile.stage(k, v, w.b, w.g, s0, mask, a);
    const int nk = (int)min((int64_t)TILE, s_end - s0);
    for (int t = 0; t < nk; t++) {
      if (!tile.keep[t]) continue;   // the same for the whole block
      const int64_t s = s0 + t;
      float kk[NJ], vv[NJ], dot[RPW];
      lane_share<NJ>(kk, tile.K + t * a.D, lane, a.D);
      lane_share<NJ>(vv, tile.V + t * a.D, lane, a.D);
      warp_dots<RPW, NJ>(dot, qr, kk);
#pragma unroll
      for (int r = 0; r < RPW; r++) {
        if (!w.live[r] || s > w.pos[r] || s < w.lo[r]) continue;   // uniform across the warp
        float corr, p;
        online_softmax_add(m[r], l[r], dot[r], corr, p);
#pragma unroll
        for (int j = 0; j < NJ; j++) acc[r][j] = acc[r][j] * corr + p * vv[j];
      }
    }
  }
#pragma unroll
  for (int r = 0; r < RPW; r++) {
    if (!w.valid[r]) continue;
    const float inv = w.live[r] ? 1.0f / l[r] : 0.0f;
    store_lane_share<T, NJ>(out, w.at(r, a), acc[r], inv, lane, a.D);
    if (lane == 0) lse[w.stat(r, a)] = w.live[r] ? m[r] + logf(l[r]) : 0.0f;
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
  kv_tile<TILE> tile(smem, a.D);
  const query_rows<RPW> w(mask, a);
  const int lane = threadIdx.x & 31;

  float qr[RPW][NJ], dor[RPW][NJ], acc[RPW][NJ], L[RPW], Dl[RPW];
#pragma unroll
  for (int r = 0; r < RPW; r++) {
    L[r] = w.live[r] ? lse[w.stat(r, a)] : 0.0f;
    Dl[r] = w.live[r] ? delta[w.stat(r, a)] : 0.0f;
#pragma unroll
    for (int j = 0; j < NJ; j++) {
      const int64_t d = lane + 32 * j, at = w.at(r, a) + d;
      qr[r][j] = w.live[r] && d < a.D ? a.scale * rx_ld(q, at) : 0.0f;
      dor[r][j] = w.live[r] && d < a.D ? rx_ld(dout, at) : 0.0f;
      acc[r][j] = 0;
    }
  }
  const int64_t s_end = w.key_end(a);
  for (int64_t s0 = w.key_begin(a); s0 < s_end; s0 += TILE) {
    tile.stage(k, v, w.b, w.g, s0, mask, a);
    const int nk = (int)min((int64_t)TILE, s_end - s0);
    for (int t = 0; t < nk; t++) {
      if (!tile.keep[t]) continue;
      const int64_t s = s0 + t;
      float kk[NJ], vv[NJ], sc[RPW], dp[RPW];
      lane_share<NJ>(kk, tile.K + t * a.D, lane, a.D);
      lane_share<NJ>(vv, tile.V + t * a.D, lane, a.D);
      warp_dots<RPW, NJ>(sc, qr, kk);
      warp_dots<RPW, NJ>(dp, dor, vv);
#pragma unroll
      for (int r = 0; r < RPW; r++) {
        if (!w.live[r] || s > w.pos[r] || s < w.lo[r]) continue;
        const float p = expf(sc[r] - L[r]), ds = p * (dp[r] - Dl[r]);
#pragma unroll
        for (int j = 0; j < NJ; j++) acc[r][j] += ds * kk[j];
      }
    }
  }
#pragma unroll
  for (int r = 0; r < RPW; r++)
    if (w.valid[r]) store_lane_share<T, NJ>(dq, w.at(r, a), acc[r], a.scale, lane, a.D);
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
  int64_t srow[RPW], hi[RPW];   // hi: one past the last query that sees the key
  bool valid[RPW], live[RPW];
#pragma unroll
  for (int r = 0; r < RPW; r++) {
    const int64_t s = s_block + warp * RPW + r;
    srow[r] = s;
    valid[r] = s < a.Tk;
    hi[r] = valid[r] ? row_end(a, s) : 0;
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
  // queries that can see the block's first key: i >= s_block - off; up to the end of the row of
  // the block's last key (packed rows), else every query
  const int64_t i_first = s_block - off > 0 ? s_block - off : 0;
  const int64_t i_end = a.cu ? row_end(a, min(a.Tk - 1, s_block + WARPS * RPW - 1)) : a.Tq;
  for (int64_t h = g * group; h < (g + 1) * group; h++) {
    const T *qh = q + b * a.Tq * ldq + h * a.D, *oh = dout + b * a.Tq * ldq + h * a.D;
    for (int64_t i0 = i_first; i0 < i_end; i0 += TILE) {
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
        lane_share<NJ>(qq, Qs + t * a.D, lane, a.D);
        lane_share<NJ>(oo, Os + t * a.D, lane, a.D);
        warp_dots<RPW, NJ>(sc, kr, qq);
        warp_dots<RPW, NJ>(dp, vr, oo);
        const float Li = Ls[t], Di = Ds[t];
#pragma unroll
        for (int r = 0; r < RPW; r++) {
          if (!live[r] || srow[r] > pos || pos - off >= hi[r]) continue;
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
  attn_args a = {d->B, d->Tq, d->Tk, d->H, d->KV, d->D, d->k_batch_stride, d->v_batch_stride, (float)d->scale,
                 d->cu_seqlens, d->S};
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
