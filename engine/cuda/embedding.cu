// embedding.cu: token embedding lookup and its scatter-add backward, the twins of cpu/embedding.inc.
// The backward has no atomics: the rows are grouped by token on the host (a stable sort of the
// token ids, copied there once per call), then one block per distinct token sums its rows in row
// order and adds the sum into dweight[token, :]. The same bits every run.
#include "common.cuh"
#include <stdlib.h>

template <typename T>
__global__ void embedding_forward_kernel(T *out, const int32_t *tokens, const T *weight, int64_t N, int64_t C) {
  const int64_t total = N * C;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t n = i / C, c = i % C;
    out[i] = weight[(int64_t)tokens[n] * C + c];
  }
}

// Segment g covers order[start[g] .. start[g+1]), rows that all hold token tok[g].
template <typename T>
__global__ void embedding_backward_kernel(float *dweight, const T *dout, const int32_t *order, const int32_t *start,
                                          const int32_t *tok, int64_t C) {
  const int g = blockIdx.x;
  const int32_t r0 = start[g], r1 = start[g + 1];
  float *dw = dweight + (int64_t)tok[g] * C;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    float s = 0;
    for (int32_t r = r0; r < r1; r++) s += rx_ld(dout, (int64_t)order[r] * C + c);
    dw[c] += s;
  }
}

static int cmp_i64(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return (x > y) - (x < y);
}

extern "C" int rx_cuda_embedding_forward(void *out, const int32_t *tokens, const void *weight, int64_t N, int64_t C,
                                         int32_t dtype) {
  RX_STREAM(s);
  if (N * C == 0) return RX_OK;
  RX_DISPATCH_FLOAT(dtype, "embedding",
    RX_LAUNCH((embedding_forward_kernel<T>), rx_blocks(N * C, 256), 256, 0, s,
              (T *)out, tokens, (const T *)weight, N, C));
  RX_LAUNCHED("embedding", "N=%lld C=%lld", (long long)N, (long long)C);
  return RX_OK;
}

extern "C" int rx_cuda_embedding_backward(float *dweight, const void *dout, const int32_t *tokens, int64_t N,
                                          int64_t V, int64_t C, int32_t dtype) {
  const char *op = "embedding_backward";
  RX_STREAM(s);
  if (N == 0 || C == 0) return RX_OK;
  if (N > INT32_MAX) return rx_fail(RX_EINVAL, "%s: %lld rows exceed the 2^31 this kernel indexes", op, (long long)N);
  if (dtype != RX_F32 && dtype != RX_BF16)
    return rx_fail(RX_EINVAL, "%s: no cuda kernel for dtype %s (f32 and bf16 only)", op, rx_dtype_name(dtype));
  int rc = RX_OK;
  int32_t *host = (int32_t *)malloc((size_t)N * 3 * sizeof(int32_t) + sizeof(int32_t));
  int64_t *keys = (int64_t *)malloc((size_t)N * sizeof(int64_t));
  int32_t *dev = NULL;
  void *handle = NULL;
  if (!host || !keys) { free(host); free(keys); return rx_fail(RX_ENOMEM, "%s: out of host memory for %lld rows", op, (long long)N); }
  int32_t *order = host, *start = host + N, *tok = host + 2 * N + 1;
  cudaError_t e = cudaMemcpyAsync(order, tokens, (size_t)N * sizeof(int32_t), cudaMemcpyDeviceToHost, s);
  if (e == cudaSuccess) e = cudaStreamSynchronize(s);
  if (e != cudaSuccess) { rc = rx_cuda_error(e, "cudaMemcpyAsync(tokens to host)", op, "N=%lld", (long long)N); goto done; }
  for (int64_t n = 0; n < N; n++) keys[n] = ((int64_t)order[n] << 32) | n;   // token-major, then row
  qsort(keys, (size_t)N, sizeof *keys, cmp_i64);
  {
    int64_t groups = 0;
    for (int64_t n = 0; n < N; n++) {
      int32_t t = (int32_t)(keys[n] >> 32);
      if (n == 0 || t != tok[groups - 1]) { tok[groups] = t; start[groups] = (int32_t)n; groups++; }
      order[n] = (int32_t)(keys[n] & 0xffffffff);
    }
    start[groups] = (int32_t)N;
    // one upload: order [N], start [groups+1], tok [groups], packed
    const size_t bytes = (size_t)(N + 2 * groups + 1) * sizeof(int32_t);
    if ((rc = rx_cuda_malloc((void **)&dev, &handle, bytes, "embedding backward rows"))) goto done;
    memmove(start + groups + 1, tok, (size_t)groups * sizeof(int32_t));   // tok right after start
    e = cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, s);
    if (e == cudaSuccess) e = cudaStreamSynchronize(s);
    if (e != cudaSuccess) { rc = rx_cuda_error(e, "cudaMemcpyAsync(rows to device)", op, "N=%lld", (long long)N); goto done; }
    const int32_t *d_order = dev, *d_start = dev + N, *d_tok = dev + N + groups + 1;
    if (dtype == RX_F32)
      RX_LAUNCH((embedding_backward_kernel<float>), (unsigned)groups, 256, 0, s,
                dweight, (const float *)dout, d_order, d_start, d_tok, C);
    else
      RX_LAUNCH((embedding_backward_kernel<bf16>), (unsigned)groups, 256, 0, s,
                dweight, (const bf16 *)dout, d_order, d_start, d_tok, C);
    rc = rx_cuda_launched(op, "N=%lld V=%lld C=%lld", (long long)N, (long long)V, (long long)C);
  }
done:
  rx_cuda_release(handle);
  free(host);
  free(keys);
  return rc;
}
