/* test_safetensors.c: safetensors round trips (every dtype, 0-d to 4-d, empty, strided, metadata,
 * sharded), crash-safe writes, and one bad file per fault class, each failing at open with a
 * message that names the file and the fault. Files are built in a fresh temporary directory. */
#define _GNU_SOURCE
#include "check.h"
#include "internal.h"
#include "io/safetensors.h"
#include <dirent.h>
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

static char dir[256];

static const char *at(const char *name) {
  static char buf[4][512];
  static int k;
  k = (k + 1) % 4;
  snprintf(buf[k], sizeof buf[k], "%s/%s", dir, name);
  return buf[k];
}

static void write_bytes(const char *path, const void *p, size_t n) {
  FILE *f = fopen(path, "wb");
  if (!f) { fprintf(stderr, "cannot write %s\n", path); exit(1); }
  fwrite(p, 1, n, f);
  fclose(f);
}

/* A file in the format: u64 header length, the header text as given, data_len data bytes. */
static void write_raw(const char *path, const char *header, size_t data_len) {
  size_t h = strlen(header);
  unsigned char *buf = calloc(1, 8 + h + data_len + 1);
  for (int i = 0; i < 8; i++) buf[i] = (unsigned char)((uint64_t)h >> (8 * i));
  memcpy(buf + 8, header, h);
  for (size_t i = 0; i < data_len; i++) buf[8 + h + i] = (unsigned char)(i * 37 + 11);
  write_bytes(path, buf, 8 + h + data_len);
  free(buf);
}

/* Opening `header` + data_len bytes must fail with a message naming the file and holding needle. */
static void check_bad(const char *header, size_t data_len, const char *needle) {
  const char *path = at("bad.safetensors");
  rx_safetensors *st = (rx_safetensors *)1;
  write_raw(path, header, data_len);
  CHECK_FAILS(rx_safetensors_open(&st, path), needle);
  CHECK(strstr(rx_last_error(), path) != NULL, "error '%s' does not name the file", rx_last_error());
  CHECK(st == NULL, "a failed open must leave the handle NULL");
  /* The in-memory path (the fuzzer's) makes the same checks. */
  FILE *f = fopen(path, "rb");
  unsigned char buf[4096];
  size_t n = fread(buf, 1, sizeof buf, f);
  fclose(f);
  CHECK_FAILS(rx_safetensors_open_memory(&st, buf, n, "mem.safetensors"), needle);
}

static rx_tensor *filled(int32_t dtype, int32_t ndim, const int64_t *shape, uint64_t seed) {
  rx_tensor *t;
  if (rx_tensor_new(&t, dtype, RX_CPU, ndim, shape)) { fprintf(stderr, "%s\n", rx_last_error()); exit(1); }
  if (rx_is_float_dtype(dtype)) rx_tensor_normal(t, seed, 0, 0.0, 3.0);
  else for (int64_t i = 0; i < t->numel; i++) rx_tensor_set(t, i, (double)((int64_t)(i * 7919 + seed) % 2001 - 1000));
  return t;
}

static int same_values(const rx_tensor *a, const rx_tensor *b) {
  if (a->numel != b->numel) return 0;
  double *x = malloc((size_t)(a->numel + 1) * 8), *y = malloc((size_t)(b->numel + 1) * 8);
  rx_tensor_read_f64(a, x);
  rx_tensor_read_f64(b, y);
  int same = 1;
  for (int64_t i = 0; i < a->numel; i++) same &= x[i] == y[i];
  free(x);
  free(y);
  return same;
}

static int tmp_files_left(void) {
  int n = 0;
  DIR *d = opendir(dir);
  for (struct dirent *e; d && (e = readdir(d));) n += strstr(e->d_name, ".tmp.") != NULL;
  if (d) closedir(d);
  return n;
}

static unsigned char *slurp(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  *n = (size_t)ftell(f);
  fseek(f, 0, SEEK_SET);
  unsigned char *p = malloc(*n + 1);
  *n = fread(p, 1, *n, f);
  fclose(f);
  return p;
}

/* ------------------------------------------------------------------------------ round trips */

static void round_trip_every_dtype(void) {
  int64_t shape[2] = {3, 5};
  rx_tensor *t[RX_DTYPE_COUNT];
  const char *names[RX_DTYPE_COUNT] = {"w.f32", "w.f64", "w.bf16", "w.f16", "w.i32", "w.i64"};
  for (int d = 0; d < RX_DTYPE_COUNT; d++) t[d] = filled(d, 2, shape, 10 + d);
  const char *path = at("all.safetensors");
  CHECK_OK(rx_safetensors_save(path, RX_DTYPE_COUNT, names, t, 0, NULL, NULL));
  rx_safetensors *st;
  CHECK_OK(rx_safetensors_open(&st, path));
  CHECK(rx_safetensors_count(st) == RX_DTYPE_COUNT, "count %lld", (long long)rx_safetensors_count(st));
  static const char *format[RX_DTYPE_COUNT] = {"F32", "F64", "BF16", "F16", "I32", "I64"};
  for (int d = 0; d < RX_DTYPE_COUNT; d++) {
    int32_t dtype = -1, ndim = -1;
    int64_t dims[4] = {0};
    CHECK_OK(rx_safetensors_info(st, names[d], &dtype, &ndim, dims));
    CHECK(dtype == d && ndim == 2 && dims[0] == 3 && dims[1] == 5, "%s: info dtype %d ndim %d", names[d], dtype, ndim);
    CHECK(strcmp(rx_safetensors_format_dtype(st, names[d]), format[d]) == 0, "%s stored as %s", names[d],
          rx_safetensors_format_dtype(st, names[d]));
    rx_tensor *same, *wide;
    rx_tensor_new(&same, d, RX_CPU, 2, shape);
    rx_tensor_new(&wide, RX_F64, RX_CPU, 2, shape);
    CHECK_OK(rx_safetensors_read(st, names[d], same));
    CHECK(memcmp(same->data, t[d]->data, (size_t)(15 * rx_dtype_size(d))) == 0, "%s: bytes differ after a round trip", names[d]);
    CHECK_OK(rx_safetensors_read(st, names[d], wide));   /* converting read: f64 holds every dtype's values */
    CHECK(same_values(wide, t[d]), "%s read as f64 differs", names[d]);
    /* Narrowing conversion agrees with rx_tensor_copy, the one conversion routine. */
    rx_tensor *half, *ref;
    rx_tensor_new(&half, RX_BF16, RX_CPU, 2, shape);
    rx_tensor_new(&ref, RX_BF16, RX_CPU, 2, shape);
    CHECK_OK(rx_safetensors_read(st, names[d], half));
    rx_tensor_copy(ref, t[d]);
    CHECK(memcmp(half->data, ref->data, 30) == 0, "%s read as bf16 differs from rx_tensor_copy", names[d]);
    rx_tensor_free(same);
    rx_tensor_free(wide);
    rx_tensor_free(half);
    rx_tensor_free(ref);
  }
  /* names come back sorted */
  for (int64_t i = 1; i < rx_safetensors_count(st); i++)
    CHECK(strcmp(rx_safetensors_name(st, i - 1), rx_safetensors_name(st, i)) < 0, "names not sorted at %lld", (long long)i);
  CHECK(rx_safetensors_name(st, RX_DTYPE_COUNT) == NULL && rx_safetensors_name(st, -1) == NULL, "out-of-range name index");
  rx_safetensors_close(st);
  for (int d = 0; d < RX_DTYPE_COUNT; d++) rx_tensor_free(t[d]);
}

static void round_trip_0d_4d_and_empty(void) {
  int64_t s4[4] = {2, 3, 1, 4}, e1[1] = {0}, e3[3] = {3, 0, 2};
  rx_tensor *t[4] = {filled(RX_F32, 0, NULL, 1), filled(RX_F64, 4, s4, 2), filled(RX_F32, 1, e1, 3), filled(RX_BF16, 3, e3, 4)};
  const char *names[4] = {"scalar", "four", "empty1", "empty3"};
  const char *path = at("shapes.safetensors");
  CHECK_OK(rx_safetensors_save(path, 4, names, t, 0, NULL, NULL));
  rx_safetensors *st;
  CHECK_OK(rx_safetensors_open(&st, path));
  for (int i = 0; i < 4; i++) {
    int32_t dtype, ndim;
    int64_t dims[4];
    CHECK_OK(rx_safetensors_info(st, names[i], &dtype, &ndim, dims));
    CHECK(ndim == t[i]->ndim && dtype == t[i]->dtype, "%s: ndim %d dtype %d", names[i], ndim, dtype);
    for (int d = 0; d < ndim; d++) CHECK(dims[d] == t[i]->shape[d], "%s: dim %d is %lld", names[i], d, (long long)dims[d]);
    rx_tensor *back;
    rx_tensor_new(&back, t[i]->dtype, RX_CPU, t[i]->ndim, t[i]->shape);
    CHECK_OK(rx_safetensors_read(st, names[i], back));
    CHECK(same_values(back, t[i]), "%s differs after a round trip", names[i]);
    rx_tensor_free(back);
  }
  rx_safetensors_close(st);
  for (int i = 0; i < 4; i++) rx_tensor_free(t[i]);
}

static void round_trip_metadata(void) {
  int64_t shape[1] = {3};
  rx_tensor *t = filled(RX_F32, 1, shape, 5);
  const char *name = "w \"quoted\"\\name\n", *keys[3] = {"format", "note", "unicode"};
  const char *values[3] = {"pt", "line one\nline \"two\"\t\\end\x01", "caf\xc3\xa9 \xe2\x9c\x93"};
  const char *path = at("meta.safetensors");
  CHECK_OK(rx_safetensors_save(path, 1, &name, &t, 3, keys, values));
  rx_safetensors *st;
  CHECK_OK(rx_safetensors_open(&st, path));
  CHECK(rx_safetensors_has(st, name) == 1 && rx_safetensors_has(st, "other") == 0, "escaped tensor name lost");
  CHECK(rx_safetensors_metadata_count(st) == 3, "metadata count %lld", (long long)rx_safetensors_metadata_count(st));
  for (int i = 0; i < 3; i++) {
    const char *v = rx_safetensors_metadata_get(st, keys[i]);
    CHECK(v && strcmp(v, values[i]) == 0, "metadata %s = '%s'", keys[i], v ? v : "(null)");
  }
  CHECK(rx_safetensors_metadata_get(st, "missing") == NULL, "missing metadata key must be NULL");
  CHECK(strcmp(rx_safetensors_metadata_key(st, 0), "format") == 0, "metadata keys written sorted");
  rx_safetensors_close(st);
  rx_tensor_free(t);
}

static void save_is_deterministic_and_aligned(void) {
  int64_t a[1] = {3}, b[2] = {2, 3};
  rx_tensor *t1 = filled(RX_BF16, 1, a, 1), *t2 = filled(RX_F64, 2, b, 2), *t3 = filled(RX_F32, 1, a, 3);
  const char *n1[3] = {"b.bf16", "a.f64", "c.f32"}, *n2[3] = {"c.f32", "b.bf16", "a.f64"};
  rx_tensor *v1[3] = {t1, t2, t3}, *v2[3] = {t3, t1, t2};
  const char *k1[2] = {"x", "a"}, *m1[2] = {"1", "2"}, *k2[2] = {"a", "x"}, *m2[2] = {"2", "1"};
  CHECK_OK(rx_safetensors_save(at("d1.safetensors"), 3, n1, v1, 2, k1, m1));
  CHECK_OK(rx_safetensors_save(at("d2.safetensors"), 3, n2, v2, 2, k2, m2));
  size_t s1 = 0, s2 = 0;
  unsigned char *f1 = slurp(at("d1.safetensors"), &s1), *f2 = slurp(at("d2.safetensors"), &s2);
  CHECK(f1 && f2 && s1 == s2 && memcmp(f1, f2, s1) == 0, "the same tensors in another order give another file");
  rx_st_file f;
  CHECK_OK(rx_st_parse(&f, "d1", f1, s1));
  CHECK((f.data - f.bytes) % 8 == 0, "data starts at byte %lld, not 8-aligned", (long long)(f.data - f.bytes));
  uint64_t end = 0;
  for (int64_t i = 0; i < f.n; i++) {
    int64_t size = f.entries[i].format->bits / 8;
    CHECK(f.entries[i].begin % (uint64_t)size == 0, "%s starts at %llu, not aligned to its dtype", f.entries[i].name,
          (unsigned long long)f.entries[i].begin);
    if (f.entries[i].end > end) end = f.entries[i].end;
  }
  CHECK(end == f.data_len, "data buffer has %llu bytes, tensors end at %llu (no gaps, no tail)",
        (unsigned long long)f.data_len, (unsigned long long)end);
  rx_st_file_release(&f);
  free(f1);
  free(f2);
  rx_tensor_free(t1);
  rx_tensor_free(t2);
  rx_tensor_free(t3);
}

static void save_strided_source(void) {
  int64_t shape[2] = {4, 6};
  rx_tensor *full = filled(RX_F32, 2, shape, 9), *view;
  CHECK_OK(rx_tensor_narrow(&view, full, 1, 2, 3));   /* [4,3], row stride 6 */
  CHECK(!rx_tensor_is_contiguous(view), "the narrowed view should be strided");
  const char *name = "strided";
  CHECK_OK(rx_safetensors_save(at("strided.safetensors"), 1, &name, &view, 0, NULL, NULL));
  rx_safetensors *st;
  CHECK_OK(rx_safetensors_open(&st, at("strided.safetensors")));
  rx_tensor *back;
  rx_tensor_new(&back, RX_F32, RX_CPU, 2, view->shape);
  CHECK_OK(rx_safetensors_read(st, name, back));
  CHECK(same_values(back, view), "strided source saved wrongly");
  /* and a strided destination */
  rx_tensor *dst_full, *dst;
  int64_t wide[2] = {4, 5};
  rx_tensor_new(&dst_full, RX_F64, RX_CPU, 2, wide);
  rx_tensor_narrow(&dst, dst_full, 1, 1, 3);
  CHECK_OK(rx_safetensors_read(st, name, dst));
  CHECK(same_values(dst, view), "read into a strided destination");
  double first_col;
  rx_tensor_get(dst_full, 0, &first_col);
  CHECK(first_col == 0, "read wrote outside the strided destination");
  rx_safetensors_close(st);
  rx_tensor_free(back);
  rx_tensor_free(dst);
  rx_tensor_free(dst_full);
  rx_tensor_free(view);
  rx_tensor_free(full);
}

static void crash_safe_write_leaves_no_temporary(void) {
  int64_t shape[1] = {4};
  rx_tensor *t = filled(RX_F32, 1, shape, 1);
  const char *name = "w", *names2[2] = {"w", "w"};
  rx_tensor *two[2] = {t, t};
  const char *path = at("safe.safetensors");
  CHECK_OK(rx_safetensors_save(path, 1, &name, &t, 0, NULL, NULL));
  CHECK_OK(rx_safetensors_save(path, 1, &name, &t, 0, NULL, NULL));   /* over an existing file */
  CHECK(tmp_files_left() == 0, "a successful save left a .tmp file");
  size_t before_n, after_n;
  unsigned char *before = slurp(path, &before_n);
  CHECK_FAILS(rx_safetensors_save(path, 2, names2, two, 0, NULL, NULL), "'w' given twice");
  rx_tensor fake = *t;
  fake.device = RX_CUDA;
  rx_tensor *pf = &fake;
  CHECK_FAILS(rx_safetensors_save(path, 1, &name, &pf, 0, NULL, NULL), "device");
  CHECK_FAILS(rx_safetensors_save(at("no/such/dir/x.safetensors"), 1, &name, &t, 0, NULL, NULL), "no/such/dir/x.safetensors");
  unsigned char *after = slurp(path, &after_n);
  CHECK(before && after && before_n == after_n && memcmp(before, after, before_n) == 0, "a failed save changed the old file");
  CHECK(tmp_files_left() == 0, "a failed save left a .tmp file");
  free(before);
  free(after);
  rx_tensor_free(t);
}

static void sharded_read_through_index(void) {
  int64_t s[2] = {2, 3};
  rx_tensor *a = filled(RX_F32, 2, s, 1), *b = filled(RX_BF16, 2, s, 2), *c = filled(RX_I64, 2, s, 3);
  const char *na[2] = {"model.embed.weight", "model.layers.0.w"}, *nb = "lm_head.weight";
  rx_tensor *va[2] = {a, b};
  const char *mk = "format", *mv = "pt";
  mkdir(at("sharded"), 0755);
  CHECK_OK(rx_safetensors_save(at("sharded/model-00001-of-00002.safetensors"), 2, na, va, 1, &mk, &mv));
  CHECK_OK(rx_safetensors_save(at("sharded/model-00002-of-00002.safetensors"), 1, &nb, &c, 0, NULL, NULL));
  const char *index =
    "{\"metadata\": {\"total_size\": 72},\n \"weight_map\": {\"lm_head.weight\": \"model-00002-of-00002.safetensors\",\n"
    "  \"model.embed.weight\": \"model-00001-of-00002.safetensors\",\n"
    "  \"model.layers.0.w\": \"model-00001-of-00002.safetensors\"}}\n";
  write_bytes(at("sharded/model.safetensors.index.json"), index, strlen(index));
  const char *paths[2] = {at("sharded"), at("sharded/model.safetensors.index.json")};
  for (int p = 0; p < 2; p++) {
    rx_safetensors *st;
    CHECK_OK(rx_safetensors_open(&st, paths[p]));
    if (!st) continue;
    CHECK(rx_safetensors_count(st) == 3, "sharded count %lld", (long long)rx_safetensors_count(st));
    CHECK(strcmp(rx_safetensors_name(st, 0), "lm_head.weight") == 0, "sorted across shards");
    rx_tensor *want[3] = {c, a, b};
    for (int i = 0; i < 3; i++) {
      rx_tensor *back;
      rx_tensor_new(&back, RX_F64, RX_CPU, 2, s);
      CHECK_OK(rx_safetensors_read(st, rx_safetensors_name(st, i), back));
      CHECK(same_values(back, want[i]), "sharded tensor %s differs", rx_safetensors_name(st, i));
      rx_tensor_free(back);
    }
    const char *total = rx_safetensors_metadata_get(st, "total_size"), *fmt = rx_safetensors_metadata_get(st, "format");
    CHECK(total && strcmp(total, "72") == 0, "index metadata total_size = %s", total ? total : "(null)");
    CHECK(fmt && strcmp(fmt, "pt") == 0, "shard metadata format = %s", fmt ? fmt : "(null)");
    rx_safetensors_close(st);
  }
  /* A tensor listed in the index but absent from its shard; a shard file that is missing. */
  const char *bad1 = "{\"weight_map\": {\"ghost.weight\": \"model-00002-of-00002.safetensors\"}}";
  write_bytes(at("sharded/bad1.index.json"), bad1, strlen(bad1));
  rx_safetensors *st = NULL;
  CHECK_FAILS(rx_safetensors_open(&st, at("sharded/bad1.index.json")), "'ghost.weight' is listed in shard 'model-00002-of-00002.safetensors'");
  const char *bad2 = "{\"weight_map\": {\"lm_head.weight\": \"model-00003-of-00003.safetensors\"}}";
  write_bytes(at("sharded/bad2.index.json"), bad2, strlen(bad2));
  CHECK_FAILS(rx_safetensors_open(&st, at("sharded/bad2.index.json")), "shard 'model-00003-of-00003.safetensors' (listed for tensor 'lm_head.weight')");
  CHECK(strstr(rx_last_error(), "No such file") != NULL, "missing shard error: %s", rx_last_error());
  const char *bad3 = "{\"metadata\": {}}";
  write_bytes(at("sharded/bad3.index.json"), bad3, strlen(bad3));
  CHECK_FAILS(rx_safetensors_open(&st, at("sharded/bad3.index.json")), "no \"weight_map\"");
  mkdir(at("emptydir"), 0755);
  CHECK_FAILS(rx_safetensors_open(&st, at("emptydir")), "neither model.safetensors nor model.safetensors.index.json");
  rx_tensor_free(a);
  rx_tensor_free(b);
  rx_tensor_free(c);
}

static void read_checks_shape_and_name(void) {
  int64_t s[2] = {64, 32}, wrong[2] = {64, 48};
  rx_tensor *t = filled(RX_F32, 2, s, 1), *dst;
  const char *name = "model.layers.0.mlp.up_proj.weight";
  const char *path = at("shape.safetensors");
  CHECK_OK(rx_safetensors_save(path, 1, &name, &t, 0, NULL, NULL));
  rx_safetensors *st;
  CHECK_OK(rx_safetensors_open(&st, path));
  rx_tensor_new(&dst, RX_F32, RX_CPU, 2, wrong);
  CHECK_FAILS(rx_safetensors_read(st, name, dst), "model.layers.0.mlp.up_proj.weight: shape [64,32] in ");
  CHECK(strstr(rx_last_error(), "shape.safetensors, destination wants [64,48]") != NULL, "%s", rx_last_error());
  CHECK_FAILS(rx_safetensors_read(st, "model.norm.weight", dst), "no tensor named 'model.norm.weight'");
  CHECK_FAILS(rx_safetensors_info(st, "nope", NULL, NULL, NULL), "no tensor named 'nope'");
  CHECK(rx_safetensors_format_dtype(st, "nope") == NULL, "format dtype of a missing tensor");
  rx_safetensors_close(st);
  rx_tensor_free(dst);
  rx_tensor_free(t);
  CHECK_FAILS(rx_safetensors_open(&st, at("missing.safetensors")), "missing.safetensors: cannot open: No such file");
}

/* Tensors at odd offsets (legal in the format) are read without misaligned loads. */
static void reads_unaligned_offsets(void) {
  const char *header = "{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
                       "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[1,9]}}";
  size_t h = strlen(header);
  unsigned char buf[512] = {0};
  for (int i = 0; i < 8; i++) buf[i] = (unsigned char)((uint64_t)h >> (8 * i));
  memcpy(buf + 8, header, h);
  float v[2] = {1.5f, -2.25f};
  memcpy(buf + 8 + h + 1, v, 8);
  write_bytes(at("odd.safetensors"), buf, 8 + h + 9);
  rx_safetensors *st;
  CHECK_OK(rx_safetensors_open(&st, at("odd.safetensors")));
  int64_t s[1] = {2};
  rx_tensor *f32, *f64;
  rx_tensor_new(&f32, RX_F32, RX_CPU, 1, s);
  rx_tensor_new(&f64, RX_F64, RX_CPU, 1, s);
  CHECK_OK(rx_safetensors_read(st, "b", f32));
  CHECK_OK(rx_safetensors_read(st, "b", f64));
  double x[2], y[2];
  rx_tensor_read_f64(f32, x);
  rx_tensor_read_f64(f64, y);
  CHECK(x[0] == 1.5 && x[1] == -2.25 && y[0] == 1.5 && y[1] == -2.25, "unaligned read gave %g %g / %g %g", x[0], x[1], y[0], y[1]);
  rx_safetensors_close(st);
  rx_tensor_free(f32);
  rx_tensor_free(f64);
}

/* ------------------------------------------------------------------------------ bad files */

static void bad_file_too_short(void) {
  const char *path = at("short.safetensors");
  rx_safetensors *st;
  write_bytes(path, "\x05\0\0\0\0", 5);
  CHECK_FAILS(rx_safetensors_open(&st, path), "short.safetensors: file is 5 bytes, too short");
  write_bytes(path, "", 0);
  CHECK_FAILS(rx_safetensors_open(&st, path), "short.safetensors: file is 0 bytes, too short");
}

static void bad_header_length(void) {
  const char *path = at("len.safetensors");
  rx_safetensors *st;
  unsigned char buf[16] = {0xe8, 0x03, 0, 0, 0, 0, 0, 0, '{', '}'};   /* 1000 bytes claimed, 8 present */
  write_bytes(path, buf, 16);
  CHECK_FAILS(rx_safetensors_open(&st, path), "header length 1000 runs past the end of the file (16 bytes)");
  unsigned char huge[16] = {0x00, 0xc2, 0xeb, 0x0b, 0, 0, 0, 0, '{', '}'};   /* 200,000,000 */
  write_bytes(path, huge, 16);
  CHECK_FAILS(rx_safetensors_open(&st, path), "header length 200000000 is over the 100 MB limit");
  unsigned char all[16];
  memset(all, 0xff, sizeof all);
  write_bytes(path, all, 16);
  CHECK_FAILS(rx_safetensors_open(&st, path), "over the 100 MB limit");
}

static void bad_header_not_json(void) {
  const char *header = "{\"w\": {\"dtype\": \"F32\",, }}";
  char needle[64];
  snprintf(needle, sizeof needle, "header is not valid JSON: header byte %d:", (int)(strstr(header, ",,") - header + 1));
  check_bad(header, 0, needle);
  check_bad("", 0, "header is not valid JSON");
  check_bad("{\"w\": 1} trailing", 0, "trailing characters");
}

static void bad_header_not_object(void) {
  check_bad("[1, 2]", 0, "header is a JSON array, expected an object");
  check_bad("\"text\"", 0, "header is a JSON string, expected an object");
}

static void bad_entry_not_object(void) {
  check_bad("{\"w\": 3}", 0, "tensor 'w': entry is a JSON number, expected an object");
  check_bad("{\"w\": [\"F32\", [1], [0, 4]]}", 4, "tensor 'w': entry is a JSON array");
}

static void bad_entry_fields(void) {
  check_bad("{\"w\": {\"shape\": [1], \"data_offsets\": [0, 4]}}", 4, "tensor 'w': missing \"dtype\"");
  check_bad("{\"w\": {\"dtype\": \"F32\", \"data_offsets\": [0, 4]}}", 4, "tensor 'w': missing \"shape\"");
  check_bad("{\"w\": {\"dtype\": \"F32\", \"shape\": [1]}}", 4, "tensor 'w': missing \"data_offsets\"");
  check_bad("{\"w\": {\"dtype\": 32, \"shape\": [1], \"data_offsets\": [0, 4]}}", 4, "\"dtype\" is a JSON number, expected a string");
  check_bad("{\"w\": {\"dtype\": \"F32\", \"shape\": 1, \"data_offsets\": [0, 4]}}", 4, "\"shape\" is a JSON number, expected an array");
  check_bad("{\"w\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": {}}}", 4, "\"data_offsets\" must be an array of 2 integers");
  check_bad("{\"w\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4, 8]}}", 8, "must be an array of 2 integers, got a JSON array of another length");
  check_bad("{\"w\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, \"4\"]}}", 4, "data_offsets[1] is not a non-negative 64-bit integer");
  check_bad("{\"w\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [-4, 0]}}", 4, "data_offsets[0] is not a non-negative");
  check_bad("{\"__metadata__\": {\"a\": 1}}", 0, "\"__metadata__\" value of 'a' is a JSON number, expected a string");
  check_bad("{\"__metadata__\": [\"a\"]}", 0, "\"__metadata__\" is a JSON array");
  check_bad("{\"a\\u0000b\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}}", 4, "contains a NUL byte");
}

static void bad_shape_dims(void) {
  check_bad("{\"w\": {\"dtype\": \"F32\", \"shape\": [2, -3], \"data_offsets\": [0, 4]}}", 4, "tensor 'w': shape[1] = -3 is negative");
  check_bad("{\"w\": {\"dtype\": \"F32\", \"shape\": [2.5], \"data_offsets\": [0, 4]}}", 4, "shape[0] = 2.5 is not a 64-bit integer");
  check_bad("{\"w\": {\"dtype\": \"F32\", \"shape\": [1e2], \"data_offsets\": [0, 400]}}", 400, "shape[0] = 100 is not a 64-bit integer");
  check_bad("{\"w\": {\"dtype\": \"F32\", \"shape\": [\"3\"], \"data_offsets\": [0, 12]}}", 12, "shape[0] is a JSON string, expected an integer");
  check_bad("{\"w\": {\"dtype\": \"F32\", \"shape\": [99999999999999999999], \"data_offsets\": [0, 4]}}", 4, "shape[0] = 1e+20 is not a 64-bit integer");
}

static void bad_shape_overflow(void) {
  check_bad("{\"w\": {\"dtype\": \"F32\", \"shape\": [4294967296, 4294967296], \"data_offsets\": [0, 4]}}", 4,
            "tensor 'w': shape [4294967296,4294967296] has too many elements");
}

static void bad_unknown_dtype(void) {
  check_bad("{\"w\": {\"dtype\": \"F128\", \"shape\": [1], \"data_offsets\": [0, 16]}}", 16, "tensor 'w': unknown dtype \"F128\"");
  check_bad("{\"w\": {\"dtype\": \"f32\", \"shape\": [1], \"data_offsets\": [0, 4]}}", 4, "unknown dtype \"f32\"");
}

static void bad_offsets(void) {
  check_bad("{\"w\": {\"dtype\": \"F32\", \"shape\": [100], \"data_offsets\": [0, 400]}}", 96,
            "tensor 'w': data_offsets [0, 400] run past the data buffer of 96 bytes");
  check_bad("{\"w\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [8, 4]}}", 16, "data_offsets [8, 4] end before they begin");
  check_bad("{\"a\": {\"dtype\": \"F32\", \"shape\": [4], \"data_offsets\": [0, 16]},"
            " \"b\": {\"dtype\": \"F32\", \"shape\": [4], \"data_offsets\": [8, 24]}}", 24,
            "tensors 'a' [0, 16) and 'b' [8, 24) overlap");
  check_bad("{\"a\": {\"dtype\": \"F32\", \"shape\": [8], \"data_offsets\": [0, 32]},"
            " \"b\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [8, 12]}}", 32, "tensors 'a' [0, 32) and 'b' [8, 12) overlap");
  check_bad("{\"w\": {\"dtype\": \"F32\", \"shape\": [2, 3], \"data_offsets\": [0, 20]}}", 24,
            "tensor 'w': shape [2,3] of F32 needs 24 bytes, data_offsets [0, 20] hold 20");
  check_bad("{\"w\": {\"dtype\": \"F4\", \"shape\": [3], \"data_offsets\": [0, 2]}}", 2, "3 elements of F4 do not fill whole bytes");
  /* bytes past the last tensor: a header length one short (the JSON's trailing space read as
   * data) shifts every tensor by a byte; the format says the tensors end where the file does */
  check_bad("{\"w\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}} ", 5,
            "the tensors end at byte 4 of the data buffer, but it holds 5 bytes; the header length");
  check_bad("{}", 3, "no tensors, but a data buffer of 3 bytes");
  /* empty tensors claim no bytes, so they overlap nothing */
  const char *ok = "{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]},"
                   " \"e\": {\"dtype\": \"F32\", \"shape\": [0], \"data_offsets\": [4, 4]}}";
  write_raw(at("ok.safetensors"), ok, 8);
  rx_safetensors *st;
  CHECK_OK(rx_safetensors_open(&st, at("ok.safetensors")));
  rx_safetensors_close(st);
}

static void bad_duplicate_names(void) {
  check_bad("{\"w\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]},"
            " \"w\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [4, 8]}}", 8, "tensor 'w' appears twice in the header");
  check_bad("{\"__metadata__\": {}, \"__metadata__\": {}}", 0, "\"__metadata__\" appears twice");
}

static void dtypes_remax_cannot_hold(void) {
  const char *header = "{\"q\": {\"dtype\": \"F8_E4M3\", \"shape\": [4], \"data_offsets\": [0, 4]},"
                       " \"m\": {\"dtype\": \"BOOL\", \"shape\": [2], \"data_offsets\": [4, 6]},"
                       " \"f\": {\"dtype\": \"F32\", \"shape\": [1, 1, 1, 1, 2], \"data_offsets\": [8, 16]}}";
  const char *path = at("exotic.safetensors");
  write_raw(path, header, 16);
  rx_safetensors *st;
  CHECK_OK(rx_safetensors_open(&st, path));   /* a valid file: only loading them fails */
  CHECK(rx_safetensors_count(st) == 3, "all three tensors listed");
  CHECK(strcmp(rx_safetensors_format_dtype(st, "q"), "F8_E4M3") == 0, "format dtype of q");
  CHECK_FAILS(rx_safetensors_info(st, "q", NULL, NULL, NULL), "tensor 'q' has dtype F8_E4M3, which remax cannot hold");
  CHECK(strstr(rx_last_error(), "exotic.safetensors") != NULL, "names the file: %s", rx_last_error());
  int64_t s[1] = {2};
  rx_tensor *t;
  rx_tensor_new(&t, RX_F32, RX_CPU, 1, s);
  CHECK_FAILS(rx_safetensors_read(st, "m", t), "tensor 'm' has dtype BOOL");
  CHECK_FAILS(rx_safetensors_info(st, "f", NULL, NULL, NULL), "tensor 'f' has 5 dims [1,1,1,1,2]; remax tensors have at most 4");
  rx_tensor_free(t);
  rx_safetensors_close(st);
}

static void remove_tree(const char *path) {
  DIR *d = opendir(path);
  if (!d) { unlink(path); return; }
  for (struct dirent *e; (e = readdir(d));) {
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
    char child[1024];
    snprintf(child, sizeof child, "%s/%s", path, e->d_name);
    remove_tree(child);
  }
  closedir(d);
  rmdir(path);
}

int main(void) {
  snprintf(dir, sizeof dir, "%s/rx_safetensors_XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
  if (!mkdtemp(dir)) { perror("mkdtemp"); return 1; }
  RUN(round_trip_every_dtype);
  RUN(round_trip_0d_4d_and_empty);
  RUN(round_trip_metadata);
  RUN(save_is_deterministic_and_aligned);
  RUN(save_strided_source);
  RUN(crash_safe_write_leaves_no_temporary);
  RUN(sharded_read_through_index);
  RUN(read_checks_shape_and_name);
  RUN(reads_unaligned_offsets);
  RUN(bad_file_too_short);
  RUN(bad_header_length);
  RUN(bad_header_not_json);
  RUN(bad_header_not_object);
  RUN(bad_entry_not_object);
  RUN(bad_entry_fields);
  RUN(bad_shape_dims);
  RUN(bad_shape_overflow);
  RUN(bad_unknown_dtype);
  RUN(bad_offsets);
  RUN(bad_duplicate_names);
  RUN(dtypes_remax_cannot_hold);
  remove_tree(dir);
  return check_summary("test_safetensors");
}
