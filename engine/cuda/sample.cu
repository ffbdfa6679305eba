// sample.cu: the next token of each row from its logits, on the device, the twin of the sampler in
// engine/generate/generate.c (sample_with): a row with a repetition penalty first gets a copy of
// its logits with the penalty applied to its tokens so far (in f32, as the CPU); greedy rows take
// the first largest logit; sampled rows keep the top-k logits (ties by lowest id), weigh them by
// exp((x - max) / temperature) in the same arithmetic as the CPU (rx_exp_f32 without top-k,
// double exp with it), keep the smallest most likely set of mass >= top_p (sorted by
// probability, ties by id), drop those below min_p x the top token's weight, and walk the kept
// tokens in id order until the cumulative mass passes u * z, u from the same Philox stream as the
// CPU's rx_sample_uniform(seed, key, position). Only token ids and their log-probabilities (of the
// raw logits) come back.
//
// One block per row. Sorting is replaced by searches over the floats' ordered bit patterns (32
// block-wide counts or sums), which find the CPU's thresholds exactly; sums run in double in a
// fixed tree (the CPU sums in another order: tokens can differ only where u * z falls within
// rounding of a boundary).
#include "common.cuh"
#include <string.h>
extern "C" {
#include "fastmath.h"
#include "philox.h"   /* rx_philox_sample_uniform: the CPU sampler's uniform */
}

enum { SAMPLE_THREADS = 256 };

// A float's bits and back (memcpy: the same under nvcc and the emulator).
__device__ __forceinline__ uint32_t bits_of(float v) {
  uint32_t u;
  memcpy(&u, &v, sizeof u);
  return u;
}
__device__ __forceinline__ float float_of(uint32_t u) {
  float v;
  memcpy(&v, &u, sizeof v);
  return v;
}

// Float bits in an order that follows the values (non-NaN).
__device__ __forceinline__ uint32_t ordered(float v) {
  uint32_t u = bits_of(v);
  return (u & 0x80000000u) ? ~u : u | 0x80000000u;
}
__device__ __forceinline__ float unordered(uint32_t k) {
  return float_of((k & 0x80000000u) ? k & 0x7fffffffu : ~k);
}

// Inclusive prefix sum over the block in shared memory (Hillis-Steele, a fixed order).
__device__ static double block_scan(double v, double *sh) {
  const int t = threadIdx.x;
  __syncthreads();
  sh[t] = v;
  __syncthreads();
  for (int o = 1; o < (int)blockDim.x; o <<= 1) {
    double add = t >= o ? sh[t - o] : 0.0;
    __syncthreads();
    sh[t] += add;
    __syncthreads();
  }
  return sh[t];
}

__device__ static int64_t block_min_i64(int64_t v, int64_t *sh) {
  const int t = threadIdx.x;
  __syncthreads();
  sh[t] = v;
  __syncthreads();
  for (int o = blockDim.x / 2; o > 0; o >>= 1) {
    if (t < o && sh[t + o] < sh[t]) sh[t] = sh[t + o];
    __syncthreads();
  }
  return sh[0];
}

__device__ static int64_t block_max_i64(int64_t v, int64_t *sh) {
  const int t = threadIdx.x;
  __syncthreads();
  sh[t] = v;
  __syncthreads();
  for (int o = blockDim.x / 2; o > 0; o >>= 1) {
    if (t < o && sh[t + o] > sh[t]) sh[t] = sh[t + o];
    __syncthreads();
  }
  return sh[0];
}

// 1 for the ties (flag set) whose rank among the flagged, in id order, is below `take`.
// Runs over the row in chunks of the block, carrying the count; returns this thread's decision
// for element i through keep[] (the prob scratch is zeroed where not kept by the caller).
template <typename Pred, typename Apply>
__device__ static void ties_in_id_order(int64_t V, int64_t take, Pred flagged, Apply apply, double *sh) {
  int64_t before = 0;
  for (int64_t c0 = 0; c0 < V; c0 += blockDim.x) {
    const int64_t i = c0 + threadIdx.x;
    const int f = i < V && flagged(i);
    const double incl = block_scan((double)f, sh);
    if (f) apply(i, before + (int64_t)incl - 1 < take);
    before += (int64_t)sh[blockDim.x - 1];
  }
}

// The largest value of lg(0 .. V) and its first id (V when none is > -inf), over the block.
template <typename Logit>
__device__ static float block_argmax(int64_t V, Logit lg, int64_t *arg, float *shf, int64_t *shi) {
  const int t = threadIdx.x, nt = blockDim.x;
  float mx = -INFINITY;
  int64_t at = V;
  for (int64_t i = t; i < V; i += nt) {
    const float v = lg(i);
    if (v > mx) { mx = v; at = i; }
  }
  __syncthreads();
  shf[t] = mx;
  shi[t] = at;
  __syncthreads();
  for (int o = nt / 2; o > 0; o >>= 1) {
    if (t < o && (shf[t + o] > shf[t] || (shf[t + o] == shf[t] && shi[t + o] < shi[t]))) {
      shf[t] = shf[t + o];
      shi[t] = shi[t + o];
    }
    __syncthreads();
  }
  *arg = shi[0];
  return shf[0];
}

template <typename T>
__global__ void sample_kernel(int32_t *token, float *logprob, float *prob_all, float *pen_all, int32_t *seen_all,
                              int64_t seen_stride, const T *logits, const rx_cuda_sample_row *rows, uint64_t seed,
                              int64_t V) {
  __shared__ double shd[SAMPLE_THREADS];
  __shared__ int64_t shi[SAMPLE_THREADS];
  __shared__ float shf[SAMPLE_THREADS];
  const int t = threadIdx.x, nt = blockDim.x;
  const int64_t row = blockIdx.x;
  const T *x = logits + row * V;
  float *prob = prob_all + row * V;
  const rx_cuda_sample_row rs = rows[row];

  // the largest raw logit and its first id
  int64_t raw_arg;
  const float raw_mx = block_argmax(V, [&](int64_t i) { return (float)rx_ld(x, i); }, &raw_arg, shf, shi);
  // log p of a token under the unscaled distribution: the sum of exp(x - max) (f32 exps, in double)
  double s = 0;
  for (int64_t i = t; i < V; i += nt) s += (double)rx_exp_f32(rx_ld(x, i) - raw_mx);
  s = rx_block_sum(s, shd);

  // the repetition penalty: the sampler reads a copy of the logits with the row's tokens so far
  // penalised (written from the raw logits, so a token seen twice is penalised once)
  const bool penalised = pen_all && seen_all && rs.repetition_penalty != 1.0f;
  float *pen = penalised ? pen_all + row * V : NULL;
  const int32_t *seen = penalised ? seen_all + rs.seen_row * seen_stride : NULL;
  if (penalised) {
    for (int64_t i = t; i < V; i += nt) pen[i] = rx_ld(x, i);
    __syncthreads();
    for (int64_t j = t; j < rs.num_seen; j += nt) {
      const int32_t id = seen[j];
      if (id < 0 || id >= V) continue;
      const float v = rx_ld(x, id);
      pen[id] = v > 0 ? v / rs.repetition_penalty : v * rs.repetition_penalty;   // equal writes where ids repeat
    }
    __syncthreads();
  }
  auto lg = [&](int64_t i) -> float { return penalised ? pen[i] : (float)rx_ld(x, i); };
  int64_t arg = raw_arg;
  float mx = raw_mx;
  if (penalised) mx = block_argmax(V, lg, &arg, shf, shi);
  arg = arg < V ? arg : 0;

  int64_t tok = arg;
  const int greedy = rs.temperature <= 0 || rs.top_k == 1;
  if (!greedy && !isfinite(mx)) tok = -1;   // the host reports logits without a finite maximum
  if (!greedy && isfinite(mx)) {
    // top-k: the k-th largest logit by its ordered bits (the largest K with count(>= K) >= k)
    float floor_logit = -INFINITY;
    int64_t ties_left = V;
    if (rs.top_k > 0 && rs.top_k < V) {
      uint32_t prefix = 0;
      for (int b = 31; b >= 0; b--) {
        const uint32_t cand = prefix | (1u << b);
        double n = 0;
        for (int64_t i = t; i < V; i += nt) n += ordered(lg(i)) >= cand;
        if (rx_block_sum(n, shd) >= (double)rs.top_k) prefix = cand;
      }
      floor_logit = unordered(prefix);
      double above = 0;
      for (int64_t i = t; i < V; i += nt) above += lg(i) > floor_logit;
      ties_left = rs.top_k - (int64_t)rx_block_sum(above, shd);
    }
    const double inv_t = 1.0 / rs.temperature;
    double z = 0;
    if (floor_logit == -INFINITY) {
      const float it = (float)inv_t;
      for (int64_t i = t; i < V; i += nt) {
        const float p = rx_exp_f32((lg(i) - mx) * it);
        prob[i] = p;
        z += p;
      }
    } else {
      for (int64_t i = t; i < V; i += nt) {
        const float v = lg(i);
        const double p = v > floor_logit ? exp((v - mx) * inv_t) : 0.0;
        prob[i] = (float)p;
        z += p;
      }
      // ties at the floor: the lowest ids, as many as make up k
      ties_in_id_order(V, ties_left, [&](int64_t i) { return lg(i) == floor_logit; },
                       [&](int64_t i, bool keep) {
                         if (keep) {
                           const double p = exp((floor_logit - mx) * inv_t);
                           prob[i] = (float)p;
                           z += p;
                         }
                       }, shd);
    }
    z = rx_block_sum(z, shd);
    const float ptop = prob[arg];   // the most likely token's weight, before top-p may reorder ties
    if (rs.top_p < 1.0) {
      // the kept set is the smallest prefix, by probability (ties by id), with mass >= need: the
      // smallest kept probability p* is the largest value whose at-least-as-likely mass reaches need
      const double need = rs.top_p * z;
      uint32_t prefix = 0;
      for (int b = 30; b >= 0; b--) {   // probabilities are >= 0: their bits order them
        const uint32_t cand = prefix | (1u << b);
        double mass = 0;
        for (int64_t i = t; i < V; i += nt) {
          const float p = prob[i];
          if (p > 0 && bits_of(p) >= cand) mass += p;
        }
        if (rx_block_sum(mass, shd) >= need) prefix = cand;
      }
      int64_t pbits = 0x7fffffff;
      for (int64_t i = t; i < V; i += nt) {
        const float p = prob[i];
        if (p > 0 && bits_of(p) >= prefix && (int64_t)bits_of(p) < pbits) pbits = bits_of(p);
      }
      pbits = block_min_i64(pbits, shi);
      const float pstar = float_of((uint32_t)pbits);
      double above = 0, ties = 0;
      for (int64_t i = t; i < V; i += nt) {
        const float p = prob[i];
        if (p > pstar) above += p;
        ties += p == pstar;
      }
      above = rx_block_sum(above, shd);
      ties = rx_block_sum(ties, shd);
      int64_t take = 0;   // ties at p* the prefix needs, lowest ids first (at least one token kept)
      double cum = above;
      while (take < (int64_t)ties && (cum < need || (take == 0 && above == 0))) { cum += pstar; take++; }
      for (int64_t i = t; i < V; i += nt)
        if (prob[i] < pstar) prob[i] = 0;
      __syncthreads();
      ties_in_id_order(V, take, [&](int64_t i) { return prob[i] == pstar; },
                       [&](int64_t i, bool keep) { if (!keep) prob[i] = 0; }, shd);
      __syncthreads();
      double kept = 0;
      for (int64_t i = t; i < V; i += nt) kept += prob[i];
      z = rx_block_sum(kept, shd);
    }
    if (rs.min_p > 0) {
      // min-p last (Hugging Face's order): weights below min_p x the top token's go
      const double floor_p = rs.min_p * (double)ptop;
      __syncthreads();
      double kept = 0;
      for (int64_t i = t; i < V; i += nt) {
        const float p = prob[i];
        if (p > 0 && (double)p < floor_p) prob[i] = 0;
        else kept += p;
      }
      z = rx_block_sum(kept, shd);
    }
    // the draw: the first kept id (in id order) whose cumulative mass passes u * z
    const double target = rx_philox_sample_uniform(seed, rs.key, rs.position) * z;
    double before = 0;
    int64_t found = V, last = -1;
    __syncthreads();
    for (int64_t c0 = 0; c0 < V && found == V; c0 += nt) {
      const int64_t i = c0 + t;
      const float p = i < V ? prob[i] : 0.0f;
      const double incl = block_scan(p > 0 ? (double)p : 0.0, shd);
      const double chunk = shd[nt - 1];
      const int64_t hit = p > 0 && before + incl > target ? i : V;
      found = block_min_i64(hit, shi);
      last = block_max_i64(p > 0 ? i : last, shi);
      before += chunk;
    }
    tok = found < V ? found : last >= 0 ? last : arg;
  }
  if (t == 0) {
    token[row] = (int32_t)tok;
    logprob[row] = tok >= 0 ? (float)((double)rx_ld(x, tok) - raw_mx - log(s)) : 0.0f;
    if (penalised && tok >= 0 && rs.num_seen < seen_stride) seen_all[rs.seen_row * seen_stride + rs.num_seen] = (int32_t)tok;
  }
}

extern "C" int rx_cuda_sample(int32_t *token, float *logprob, float *prob, float *penalized, int32_t *seen,
                              int64_t seen_stride, const void *logits, const rx_cuda_sample_row *rows, uint64_t seed,
                              int64_t n, int64_t V, int32_t dtype) {
  RX_STREAM(s);
  if (n == 0) return RX_OK;
  RX_DISPATCH_FLOAT(dtype, "sample",
    RX_LAUNCH((sample_kernel<T>), (unsigned)n, SAMPLE_THREADS, 0, s, token, logprob, prob, penalized, seen,
              seen_stride, (const T *)logits, rows, seed, V));
  RX_LAUNCHED("sample", "rows=%lld V=%lld", (long long)n, (long long)V);
  return RX_OK;
}
