/* test_tensor.c: tensors, dtypes, views, copies, Philox, and the JSON parser. */
#include "check.h"
#include "json.h"
#include "internal.h"

static void philox_known_answers(void) {
  /* Known-answer vectors of Philox4x32-10 from the Random123 distribution. */
  uint32_t out[4];
  uint32_t k0[2] = {0, 0}, c0[4] = {0, 0, 0, 0};
  rx_philox4x32(k0, c0, out);
  CHECK(out[0] == 0x6627e8d5u && out[1] == 0xe169c58du && out[2] == 0xbc57ac4cu && out[3] == 0x9b00dbd8u,
        "zero key/counter gave %08x %08x %08x %08x", out[0], out[1], out[2], out[3]);
  uint32_t k1[2] = {0xffffffffu, 0xffffffffu}, c1[4] = {0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu};
  rx_philox4x32(k1, c1, out);
  CHECK(out[0] == 0x408f276du && out[1] == 0x41c83b0eu && out[2] == 0xa20bc7c6u && out[3] == 0x6d5451fdu,
        "ones key/counter gave %08x %08x %08x %08x", out[0], out[1], out[2], out[3]);
}

static void random_fill_is_keyed_by_offset(void) {
  int64_t n = 1000, shape[1] = {n}, half[1] = {n / 2};
  rx_tensor *a, *b;
  CHECK_OK(rx_tensor_new(&a, RX_F64, RX_CPU, 1, shape));
  CHECK_OK(rx_tensor_new(&b, RX_F64, RX_CPU, 1, half));
  CHECK_OK(rx_tensor_normal(a, 42, 7, 0.0, 1.0));
  CHECK_OK(rx_tensor_normal(b, 42, 7 + n / 2, 0.0, 1.0));  /* the second half of a */
  const double *x = a->data, *y = b->data;
  double mean = 0, var = 0;
  for (int64_t i = 0; i < n; i++) mean += x[i] / n;
  for (int64_t i = 0; i < n; i++) var += (x[i] - mean) * (x[i] - mean) / n;
  CHECK(fabs(mean) < 0.15 && fabs(var - 1) < 0.15, "normal mean %g var %g", mean, var);
  int same = 1;
  for (int64_t i = 0; i < n / 2; i++) same &= x[n / 2 + i] == y[i];
  CHECK(same, "element i must depend only on (seed, offset + i)");
  CHECK_OK(rx_tensor_uniform(a, 1, 0, -2.0, 3.0));
  double lo = 1e9, hi = -1e9;
  for (int64_t i = 0; i < n; i++) { lo = fmin(lo, x[i]); hi = fmax(hi, x[i]); }
  CHECK(lo >= -2.0 && hi < 3.0 && lo < -1.9 && hi > 2.9, "uniform range [%g, %g]", lo, hi);
  rx_tensor_free(a);
  rx_tensor_free(b);
}

static void half_precision_round_trips(void) {
  CHECK(rx_bf16_to_f32(rx_f32_to_bf16(1.0f)) == 1.0f, "bf16 1.0");
  CHECK(rx_f16_to_f32(rx_f32_to_f16(-2.5f)) == -2.5f, "f16 -2.5");
  CHECK(rx_f16_to_f32(rx_f32_to_f16(65504.0f)) == 65504.0f, "f16 max");
  CHECK(isinf(rx_f16_to_f32(rx_f32_to_f16(70000.0f))), "f16 overflow is inf");
  CHECK(rx_f16_to_f32(rx_f32_to_f16(5.960464477539063e-08f)) == 5.960464477539063e-08f, "f16 min subnormal");
  CHECK(rx_bf16_to_f32(rx_f32_to_bf16(1.00390625f)) == 1.0f, "bf16 ties to even (down)");
  CHECK(rx_bf16_to_f32(rx_f32_to_bf16(1.01171875f)) == 1.015625f, "bf16 ties to even (up)");
  CHECK(isnan(rx_bf16_to_f32(rx_f32_to_bf16(NAN))), "bf16 NaN stays NaN");
  /* every f16 value survives f16 -> f32 -> f16 */
  int bad = 0;
  for (uint32_t h = 0; h < 65536; h++) {
    float f = rx_f16_to_f32((uint16_t)h);
    if (!isnan(f) && rx_f32_to_f16(f) != h) bad++;
  }
  CHECK(bad == 0, "%d f16 values did not round-trip", bad);
}

static void views_share_storage(void) {
  int64_t shape[3] = {2, 3, 4}, flat[2] = {6, -1};
  rx_tensor *t, *r, *n;
  CHECK_OK(rx_tensor_new(&t, RX_F32, RX_CPU, 3, shape));
  for (int i = 0; i < 24; i++) rx_tensor_set(t, i, i);
  CHECK_OK(rx_tensor_reshape(&r, t, 2, flat));
  CHECK(r->shape[0] == 6 && r->shape[1] == 4, "reshape inferred %lld", (long long)r->shape[1]);
  CHECK_OK(rx_tensor_narrow(&n, t, 2, 1, 2));            /* t[:, :, 1:3] */
  CHECK(!rx_tensor_is_contiguous(n), "narrowed last dim is strided");
  double v;
  CHECK_OK(rx_tensor_get(n, 5, &v));                     /* [0,2,1] -> t[0,2,2] = 10 */
  CHECK(v == 10, "narrow element %g", v);
  rx_tensor_free(t);                                     /* views keep the storage alive */
  CHECK_OK(rx_tensor_set(r, 23, -1));
  CHECK_OK(rx_tensor_get(n, 11, &v));                    /* [1,2,1] -> t[1,2,2] = 22 */
  CHECK(v == 22, "view after parent freed %g", v);
  int64_t bad[2] = {5, 5};
  rx_tensor *x;
  CHECK_FAILS(rx_tensor_reshape(&x, r, 2, bad), "24 elements");
  CHECK_FAILS(rx_tensor_reshape(&x, n, 1, flat), "not contiguous");
  CHECK_FAILS(rx_tensor_narrow(&x, r, 0, 4, 3), "outside dim 0");
  rx_tensor_free(r);
  rx_tensor_free(n);
}

static void copy_converts_dtypes(void) {
  int64_t shape[2] = {3, 5};
  rx_tensor *a, *b, *c, *view;
  CHECK_OK(rx_tensor_new(&a, RX_F32, RX_CPU, 2, shape));
  CHECK_OK(rx_tensor_new(&b, RX_BF16, RX_CPU, 2, shape));
  CHECK_OK(rx_tensor_new(&c, RX_I64, RX_CPU, 2, shape));
  CHECK_OK(rx_tensor_uniform(a, 3, 0, -4, 4));
  CHECK_OK(rx_tensor_copy(b, a));
  CHECK_OK(rx_tensor_copy(c, a));
  for (int i = 0; i < 15; i++) {
    double x, y, z;
    rx_tensor_get(a, i, &x);
    rx_tensor_get(b, i, &y);
    rx_tensor_get(c, i, &z);
    CHECK(fabs(x - y) <= fabs(x) / 128, "bf16 %g vs %g", y, x);
    CHECK(z == (double)(int64_t)x, "i64 %g vs %g", z, x);
  }
  /* the contiguous f32 -> bf16 loop (a bf16 model's working copy) rounds as rx_f32_to_bf16 does,
   * bit for bit: ties to even, NaN quiet, infinities, subnormals; past the threaded size */
  {
    int64_t big[1] = {100003};
    rx_tensor *f, *h;
    CHECK_OK(rx_tensor_new(&f, RX_F32, RX_CPU, 1, big));
    CHECK_OK(rx_tensor_new(&h, RX_BF16, RX_CPU, 1, big));
    uint32_t *fb = f->data;
    for (int64_t i = 0; i < big[0]; i++) fb[i] = (uint32_t)(i * 2654435761u) ^ (uint32_t)(i << 7);
    const uint32_t special[] = {0x3f808000u, 0x3f818000u, 0x7f800000u, 0xff800000u, 0x7fc00001u, 0x7f800001u,
                                0x00000001u, 0x807fffffu, 0x7f7fffffu, 0x00000000u, 0x80000000u};
    for (size_t i = 0; i < sizeof special / sizeof special[0]; i++) fb[i * 997] = special[i];
    CHECK_OK(rx_tensor_copy(h, f));
    int64_t bad = -1;
    for (int64_t i = 0; i < big[0] && bad < 0; i++) {
      float v;
      memcpy(&v, &fb[i], 4);
      if (((uint16_t *)h->data)[i] != rx_f32_to_bf16(v)) bad = i;
    }
    CHECK(bad < 0, "f32 -> bf16 copy of 0x%08x differs from rx_f32_to_bf16", bad < 0 ? 0u : fb[bad]);
    rx_tensor_free(f);
    rx_tensor_free(h);
  }
  CHECK_OK(rx_tensor_narrow(&view, a, 1, 2, 2));
  int64_t small[2] = {3, 2};
  rx_tensor *d;
  CHECK_OK(rx_tensor_new(&d, RX_F64, RX_CPU, 2, small));
  CHECK_OK(rx_tensor_copy(d, view));
  double x, y;
  rx_tensor_get(a, 1 * 5 + 3, &x);
  rx_tensor_get(d, 1 * 2 + 1, &y);
  CHECK(x == y, "strided copy %g vs %g", y, x);
  CHECK_FAILS(rx_tensor_copy(d, a), "differ in element count");
  int64_t bad_shape[1] = {-3};
  rx_tensor *e;
  CHECK_FAILS(rx_tensor_new(&e, RX_F32, RX_CPU, 1, bad_shape), "negative size");
  CHECK_FAILS(rx_tensor_new(&e, RX_F32, RX_CUDA + 7, 1, shape), "device 8 is not a device remax knows");
  int32_t dt;
  CHECK_OK(rx_dtype_from_name("bfloat16", &dt));
  CHECK(dt == RX_BF16, "bfloat16 alias");
  CHECK_FAILS(rx_dtype_from_name("f8", &dt), "unknown dtype 'f8'");
  rx_tensor_free(a); rx_tensor_free(b); rx_tensor_free(c); rx_tensor_free(d); rx_tensor_free(view);
}

static void json_parses_and_rejects(void) {
  char err[256];
  const char *text = "{\"a\": [1, -2.5e3, true, null], \"s\": \"x\\u00e9\\ud83d\\ude00\\n\", \"big\": 9007199254740993}";
  rx_json_doc *doc = rx_json_parse(text, strlen(text), err, sizeof err);
  CHECK(doc != NULL, "parse: %s", err);
  if (doc) {
    rx_json *root = rx_json_root(doc), *a = rx_json_get(root, "a"), *s = rx_json_get(root, "s");
    CHECK(a && a->count == 4 && a->child->is_integer && a->child->integer == 1, "array");
    CHECK(a && a->child->next->number == -2500 && !a->child->next->is_integer, "float");
    CHECK(s && strcmp(s->str, "x\xc3\xa9\xf0\x9f\x98\x80\n") == 0 && s->len == 8, "escapes");
    CHECK(rx_json_get(root, "big")->integer == 9007199254740993LL, "int64 exact");
    rx_json_free(doc);
  }
  const char *bad[] = {"{\"a\":}", "[1,]", "{\"a\" 1}", "\"abc", "[1] x", "01", "\"\\ud800\"", "", "{\"a\":1,}", "tru"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    doc = rx_json_parse(bad[i], strlen(bad[i]), err, sizeof err);
    CHECK(doc == NULL && strncmp(err, "byte ", 5) == 0, "'%s' should fail with a byte offset (got '%s')", bad[i], err);
    rx_json_free(doc);
  }
  char deep[2000];
  memset(deep, '[', sizeof deep);
  doc = rx_json_parse(deep, sizeof deep, err, sizeof err);
  CHECK(doc == NULL && strstr(err, "too deep"), "deep nesting: %s", err);
}

int main(void) {
  RUN(philox_known_answers);
  RUN(random_fill_is_keyed_by_offset);
  RUN(half_precision_round_trips);
  RUN(views_share_storage);
  RUN(copy_converts_dtypes);
  RUN(json_parses_and_rejects);
  return check_summary("test_tensor");
}
