/* test_tensor.c: tensors on the CUDA device: zeros on creation, copies between devices and
 * dtypes (contiguous and strided), fill, random fills equal to the CPU's, element access, the
 * caching allocator's reuse, and the RX_ENOMEM message of an allocation that cannot fit.
 * Skips (exit 77) without a CUDA device. */
#include "gpu.h"

static void test_zeros_and_roundtrip(void) {
  int64_t s[3] = {3, 5, 7};
  rx_tensor *c = cpu_uniform(3, s, 1, -100, 100), *back;
  const int32_t dtypes[5] = {RX_F32, RX_F64, RX_BF16, RX_F16, RX_I32};
  for (int k = 0; k < 5; k++) {
    rx_tensor *g, *ref;
    gpu_must(rx_tensor_new(&g, dtypes[k], RX_CUDA, 3, s), NULL);
    double v = -1;
    CHECK_OK(rx_tensor_get(g, 17, &v));
    CHECK(v == 0, "a new %s cuda tensor holds %g, not 0", rx_dtype_name(dtypes[k]), v);
    CHECK_OK(rx_tensor_copy(g, c));   /* host f32 -> device dtype */
    gpu_must(rx_tensor_new(&ref, dtypes[k], RX_CPU, 3, s), NULL);
    gpu_must(rx_tensor_copy(ref, c), ref);   /* the same conversion on the host */
    gpu_must(rx_tensor_new(&back, RX_F64, RX_CPU, 3, s), NULL);
    CHECK_OK(rx_tensor_copy(back, g));      /* device dtype -> host f64 */
    CHECK(gpu_nrmse(back, ref) == 0, "round trip through cuda %s changes values", rx_dtype_name(dtypes[k]));
    rx_tensor_free(back); rx_tensor_free(ref); rx_tensor_free(g);
  }
  rx_tensor_free(c);
}

static void test_device_conversions_and_strides(void) {
  int64_t s[2] = {16, 24};
  rx_tensor *c = cpu_uniform(2, s, 2, -3, 3), *g32 = to_gpu(c, RX_F32), *gbf, *cbf, *nar, *dst, *host;
  gpu_must(rx_tensor_new(&gbf, RX_BF16, RX_CUDA, 2, s), NULL);
  gpu_must(rx_tensor_new(&cbf, RX_BF16, RX_CPU, 2, s), NULL);
  CHECK_OK(rx_tensor_copy(gbf, g32));   /* f32 -> bf16 on the device rounds like the host */
  CHECK_OK(rx_tensor_copy(cbf, c));
  CHECK(gpu_nrmse(gbf, cbf) == 0, "device f32 -> bf16 differs from the host's rounding");
  /* a strided view (columns 5..15) copied device -> device, device -> host and host -> device */
  gpu_must(rx_tensor_narrow(&nar, g32, 1, 5, 10), NULL);
  int64_t sd[2] = {16, 10};
  gpu_must(rx_tensor_new(&dst, RX_F32, RX_CUDA, 2, sd), NULL);
  gpu_must(rx_tensor_new(&host, RX_F32, RX_CPU, 2, sd), NULL);
  CHECK_OK(rx_tensor_copy(dst, nar));
  CHECK_OK(rx_tensor_copy(host, nar));
  int ok = 1;
  for (int i = 0; i < 16; i++)
    for (int j = 0; j < 10; j++) {
      float want = ((float *)c->data)[i * 24 + 5 + j];
      double got;
      gpu_must(rx_tensor_get(dst, i * 10 + j, &got), NULL);
      if (got != want || ((float *)host->data)[i * 10 + j] != want) ok = 0;
    }
  CHECK(ok, "strided copies from a narrowed cuda tensor");
  CHECK_OK(rx_tensor_fill(host, 7));
  CHECK_OK(rx_tensor_copy(nar, host));   /* host -> strided device view */
  double v;
  CHECK_OK(rx_tensor_get(g32, 3 * 24 + 5, &v));
  CHECK(v == 7, "host -> strided device copy wrote %g", v);
  CHECK_OK(rx_tensor_get(g32, 3 * 24 + 4, &v));
  CHECK(v == ((float *)c->data)[3 * 24 + 4], "host -> strided device copy wrote outside the view");
  CHECK_OK(rx_tensor_set(g32, 0, 42));
  CHECK_OK(rx_tensor_get(g32, 0, &v));
  CHECK(v == 42, "set/get on cuda: %g", v);
  rx_tensor_free(nar); rx_tensor_free(dst); rx_tensor_free(host);
  rx_tensor_free(c); rx_tensor_free(g32); rx_tensor_free(gbf); rx_tensor_free(cbf);
}

static void test_random_fill_matches_cpu(void) {
  int64_t s[1] = {1000};
  rx_tensor *c, *g;
  gpu_must(rx_tensor_new(&c, RX_F32, RX_CPU, 1, s), NULL);
  gpu_must(rx_tensor_new(&g, RX_F32, RX_CUDA, 1, s), NULL);
  CHECK_OK(rx_tensor_normal(c, 9, 100, 0, 1));
  CHECK_OK(rx_tensor_normal(g, 9, 100, 0, 1));
  CHECK(gpu_nrmse(g, c) == 0, "normal fill differs between cpu and cuda");
  CHECK_OK(rx_tensor_fill(g, -2.5));
  double v;
  CHECK_OK(rx_tensor_get(g, 999, &v));
  CHECK(v == -2.5, "fill on cuda: %g", v);
  rx_tensor_free(c); rx_tensor_free(g);
}

static void test_allocator(void) {
  int64_t before, peak, reserved, free_b, total;
  CHECK_OK(rx_cuda_memory(&before, &peak, &reserved, &free_b, &total));
  int64_t s[1] = {1 << 20};
  rx_tensor *a, *b;
  gpu_must(rx_tensor_new(&a, RX_F32, RX_CUDA, 1, s), NULL);
  int64_t used, reserved2;
  CHECK_OK(rx_cuda_memory(&used, NULL, &reserved2, NULL, NULL));
  CHECK(used - before >= (4 << 20), "4 MB tensor: allocated grew by %lld", (long long)(used - before));
  rx_tensor_free(a);
  gpu_must(rx_tensor_new(&b, RX_F32, RX_CUDA, 1, s), NULL);
  int64_t reserved3;
  CHECK_OK(rx_cuda_memory(NULL, NULL, &reserved3, NULL, NULL));
  CHECK(reserved3 == reserved2, "a freed piece was not reused: the driver was asked for more memory");
  rx_tensor_free(b);
  /* an allocation that cannot fit fails with RX_ENOMEM naming the bytes asked for and free */
  int64_t huge[1] = {(int64_t)1 << 50};
  rx_tensor *h = NULL;
  int rc = rx_tensor_new(&h, RX_F32, RX_CUDA, 1, huge);
  CHECK(rc == RX_ENOMEM, "huge allocation returned %d: %s", rc, rx_last_error());
  CHECK(strstr(rx_last_error(), "4503599627370496 bytes") && strstr(rx_last_error(), "bytes free"),
        "message: %s", rx_last_error());
  /* and the device still works afterwards */
  gpu_must(rx_tensor_new(&a, RX_F32, RX_CUDA, 1, s), NULL);
  CHECK_OK(rx_tensor_fill(a, 1));
  double v;
  CHECK_OK(rx_tensor_get(a, 12345, &v));
  CHECK(v == 1, "after a failed allocation: %g", v);
  rx_tensor_free(a);
}

static void test_errors_name_the_problem(void) {
  int64_t s[2] = {4, 8}, sw[1] = {8};
  rx_tensor *x = cpu_uniform(2, s, 3, -1, 1), *w = cpu_uniform(1, sw, 4, -1, 1), *gx = to_gpu(x, RX_F32), *out;
  gpu_must(rx_tensor_new(&out, RX_F32, RX_CUDA, 2, s), NULL);
  CHECK_FAILS(rx_rmsnorm_forward(out, NULL, gx, w, 1e-6), "weight is on cpu:0, expected cuda:0");
  rx_tensor *g64 = to_gpu(x, RX_F64), *w64 = to_gpu(w, RX_F64), *o64 = to_gpu(x, RX_F64);
  CHECK_FAILS(rx_rmsnorm_forward(o64, NULL, g64, w64, 1e-6), "no cuda kernel for dtype f64");
  rx_tensor_free(g64); rx_tensor_free(w64); rx_tensor_free(o64);
  rx_tensor_free(x); rx_tensor_free(w); rx_tensor_free(gx); rx_tensor_free(out);
}

int main(void) {
  if (gpu_skip_unless_present("gpu_test_tensor")) return GPU_SKIP;
  RUN(test_zeros_and_roundtrip);
  RUN(test_device_conversions_and_strides);
  RUN(test_random_fill_matches_cpu);
  RUN(test_allocator);
  RUN(test_errors_name_the_problem);
  return check_summary("gpu_test_tensor");
}
