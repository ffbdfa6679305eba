// adamw.cu: the optimizer on the device, the twin of optim/adamw.c: AdamW on f32 master weights,
// gradients and moments (the update in double per element, as on the CPU); the sum of squares of
// the gradient norm in double in a fixed order (block partials, then the partials in order); and
// the clipping scale (and LoRA's scale on bf16 activations).
#include "common.cuh"

// W, when not NULL, is P's bf16 working copy, written in the same pass (rounded as the f32 -> bf16
// copy rounds: nearest even).
__global__ void adamw_kernel(float *P, const float *G, float *M, float *Vv, bf16 *W, int64_t n, double beta1,
                             double beta2, double eps, double shrink, double step_size, double sqrt_bc2) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    const double g = G[i];
    const double m = beta1 * M[i] + (1 - beta1) * g, v = beta2 * Vv[i] + (1 - beta2) * g * g;
    M[i] = (float)m;
    Vv[i] = (float)v;
    const double p = P[i] * shrink;
    const float out = (float)(p - step_size * m / (sqrt(v) / sqrt_bc2 + eps));
    P[i] = out;
    if (W) rx_st(W, i, out);
  }
}

extern "C" int rx_cuda_adamw(float *param, const float *grad, float *m, float *v, void *work, int64_t n, double lr,
                             double beta1, double beta2, double eps, double shrink, double bc1, double sqrt_bc2) {
  RX_STREAM(s);
  if (n == 0) return RX_OK;
  RX_LAUNCH(adamw_kernel, rx_blocks(n, 256), 256, 0, s,
            param, grad, m, v, (bf16 *)work, n, beta1, beta2, eps, shrink, lr / bc1, sqrt_bc2);
  RX_LAUNCHED("adamw", "n=%lld", (long long)n);
  return RX_OK;
}

enum { SUM_THREADS = 256, SUM_BLOCKS = 1024 };

// partial[b] = sum over the elements of block b's grid-stride share (fixed for a given n).
__global__ void sum_squares_partial(double *partial, const float *x, int64_t n) {
  __shared__ double red[32];
  double s = 0;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    const double v = x[i];
    s += v * v;
  }
  s = rx_block_sum(s, red);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

__global__ void sum_squares_final(double *acc, const double *partial, int nb) {
  __shared__ double red[32];
  double s = 0;
  for (int i = threadIdx.x; i < nb; i += blockDim.x) s += partial[i];
  s = rx_block_sum(s, red);
  if (threadIdx.x == 0) *acc += s;
}

extern "C" int rx_cuda_sum_squares(double *acc, const float *x, int64_t n) {
  RX_STREAM(s);
  if (n == 0) return RX_OK;
  int64_t nb = (n + SUM_THREADS - 1) / SUM_THREADS;
  if (nb > SUM_BLOCKS) nb = SUM_BLOCKS;
  if (nb > rx_cuda_block_cap()) nb = rx_cuda_block_cap();
  double *partial;
  void *handle;
  int rc = rx_cuda_malloc((void **)&partial, &handle, (size_t)nb * sizeof(double), "grad norm partials");
  if (rc) return rc;
  RX_LAUNCH(sum_squares_partial, (unsigned)nb, SUM_THREADS, 0, s, partial, x, n);
  RX_LAUNCH(sum_squares_final, 1, 1024, 0, s, acc, partial, (int)nb);
  rx_cuda_release(handle);
  RX_LAUNCHED("grad_norm", "n=%lld", (long long)n);
  return RX_OK;
}

template <typename T>
__global__ void scale_kernel(T *x, int64_t n, float f) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    rx_st(x, i, rx_ld(x, i) * f);
}

// x *= f in x's dtype (f32: the clipping scale; bf16: LoRA's alpha / r on bf16 activations),
// the product formed in f32 and rounded once.
extern "C" int rx_cuda_scale(void *x, int64_t n, double f, int32_t dtype) {
  RX_STREAM(s);
  if (n == 0) return RX_OK;
  RX_DISPATCH_FLOAT(dtype, "scale", RX_LAUNCH((scale_kernel<T>), rx_blocks(n, 256), 256, 0, s, (T *)x, n, (float)f));
  RX_LAUNCHED("scale", "n=%lld", (long long)n);
  return RX_OK;
}
