/* safetensors.c: Hugging Face safetensors checkpoints. Reading maps the file read-only and checks
 * every header field against the file before any tensor is touched, so a bad file fails at open
 * with a message naming the file and the fault. Writing goes to a temporary file that is fsynced
 * and renamed over the target, so a crash never leaves a half-written checkpoint in its place.
 *
 * Layout: u64 little-endian header length N | N bytes of JSON | data buffer.
 * The JSON maps names to {"dtype", "shape", "data_offsets": [begin, end]} (offsets relative to
 * the data buffer) plus an optional "__metadata__" object of strings. */
#define _GNU_SOURCE
#include "safetensors.h"
#include "internal.h"
#include "json.h"
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* Every dtype the format defines; the ones remax holds map to an rx_dtype. */
static const rx_st_format formats[] = {
  {"F32", 32, RX_F32}, {"F64", 64, RX_F64}, {"BF16", 16, RX_BF16}, {"F16", 16, RX_F16},
  {"I32", 32, RX_I32}, {"I64", 64, RX_I64},
  {"BOOL", 8, -1}, {"U8", 8, -1}, {"I8", 8, -1}, {"U16", 16, -1}, {"I16", 16, -1},
  {"U32", 32, -1}, {"U64", 64, -1}, {"C64", 64, -1}, {"F8_E4M3", 8, -1}, {"F8_E5M2", 8, -1},
  {"F8_E8M0", 8, -1}, {"F8_E4M3FNUZ", 8, -1}, {"F8_E5M2FNUZ", 8, -1}, {"F6_E2M3", 6, -1},
  {"F6_E3M2", 6, -1}, {"F4", 4, -1},
};
enum { N_FORMATS = sizeof formats / sizeof formats[0] };

/* Element counts stay below this so that bytes (and rx_tensor_new's numel * 8) fit in int64. */
static const int64_t NUMEL_LIMIT = INT64_MAX / 8;

const rx_st_format *rx_st_format_by_name(const char *name) {
  for (int i = 0; i < N_FORMATS; i++)
    if (strcmp(formats[i].name, name) == 0) return &formats[i];
  return NULL;
}

/* The format's name for an rx_dtype (the first rows of the table, in rx_dtype order). */
static const char *format_name(int32_t dtype) {
  for (int i = 0; i < N_FORMATS; i++)
    if (formats[i].dtype == dtype) return formats[i].name;
  return NULL;
}

static const char *dims_str(char *buf, size_t n, int32_t ndim, const int64_t *shape) {
  size_t k = (size_t)snprintf(buf, n, "[");
  for (int i = 0; i < ndim && k < n; i++)
    k += (size_t)snprintf(buf + k, n - k, i ? ",%lld" : "%lld", (long long)shape[i]);
  if (k < n) snprintf(buf + k, n - k, "]");
  return buf;
}

static uint64_t read_le64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
  return v;
}

/* ------------------------------------------------------------------------------ header parser */

static int is_metadata_key(const rx_json *m) { return m->key_len == 12 && strcmp(m->key, "__metadata__") == 0; }

/* Checks one header entry and fills e (shape written to dims). */
static int parse_entry(const char *path, const rx_json *m, uint64_t data_len, rx_st_entry *e, int64_t *dims) {
  const char *name = m->key;
  char sbuf[256];
  if (strlen(name) != m->key_len) return rx_fail(RX_EFORMAT, "%s: tensor name '%s...' contains a NUL byte", path, name);
  if (m->kind != RX_JSON_OBJECT)
    return rx_fail(RX_EFORMAT, "%s: tensor '%s': entry is a JSON %s, expected an object", path, name, rx_json_kind_name(m->kind));
  const rx_json *dt = rx_json_get(m, "dtype"), *sh = rx_json_get(m, "shape"), *off = rx_json_get(m, "data_offsets");
  if (!dt) return rx_fail(RX_EFORMAT, "%s: tensor '%s': missing \"dtype\"", path, name);
  if (dt->kind != RX_JSON_STRING)
    return rx_fail(RX_EFORMAT, "%s: tensor '%s': \"dtype\" is a JSON %s, expected a string", path, name, rx_json_kind_name(dt->kind));
  e->format = rx_st_format_by_name(dt->str);
  if (!e->format)
    return rx_fail(RX_EFORMAT, "%s: tensor '%s': unknown dtype \"%s\" (the format defines F32, F64, BF16, F16, "
                   "I64, I32, I16, I8, U64, U32, U16, U8, BOOL, C64, F8_*, F6_*, F4)", path, name, dt->str);
  if (!sh) return rx_fail(RX_EFORMAT, "%s: tensor '%s': missing \"shape\"", path, name);
  if (sh->kind != RX_JSON_ARRAY)
    return rx_fail(RX_EFORMAT, "%s: tensor '%s': \"shape\" is a JSON %s, expected an array", path, name, rx_json_kind_name(sh->kind));
  int64_t numel = 1;
  int overflow = 0, i = 0;
  for (const rx_json *d = sh->child; d; d = d->next, i++) {
    if (d->kind != RX_JSON_NUMBER)
      return rx_fail(RX_EFORMAT, "%s: tensor '%s': shape[%d] is a JSON %s, expected an integer", path, name, i, rx_json_kind_name(d->kind));
    if (!d->is_integer)
      return rx_fail(RX_EFORMAT, "%s: tensor '%s': shape[%d] = %.17g is not a 64-bit integer", path, name, i, d->number);
    if (d->integer < 0) return rx_fail(RX_EFORMAT, "%s: tensor '%s': shape[%d] = %lld is negative", path, name, i, (long long)d->integer);
    dims[i] = d->integer;
    if (d->integer && numel > NUMEL_LIMIT / d->integer) overflow = 1;
    else numel *= d->integer;
  }
  e->name = name;
  e->ndim = i;
  e->shape = dims;
  if (overflow)
    return rx_fail(RX_EFORMAT, "%s: tensor '%s': shape %s has too many elements (the product overflows)", path, name,
                   dims_str(sbuf, sizeof sbuf, e->ndim, dims));
  e->numel = numel;
  if (!off) return rx_fail(RX_EFORMAT, "%s: tensor '%s': missing \"data_offsets\"", path, name);
  if (off->kind != RX_JSON_ARRAY || off->count != 2)
    return rx_fail(RX_EFORMAT, "%s: tensor '%s': \"data_offsets\" must be an array of 2 integers, got a JSON %s%s",
                   path, name, rx_json_kind_name(off->kind), off->kind == RX_JSON_ARRAY ? " of another length" : "");
  int64_t be[2];
  i = 0;
  for (const rx_json *x = off->child; x; x = x->next, i++) {
    if (x->kind != RX_JSON_NUMBER || !x->is_integer || x->integer < 0)
      return rx_fail(RX_EFORMAT, "%s: tensor '%s': data_offsets[%d] is not a non-negative 64-bit integer", path, name, i);
    be[i] = x->integer;
  }
  e->begin = (uint64_t)be[0];
  e->end = (uint64_t)be[1];
  if (e->begin > e->end)
    return rx_fail(RX_EFORMAT, "%s: tensor '%s': data_offsets [%llu, %llu] end before they begin", path, name,
                   (unsigned long long)e->begin, (unsigned long long)e->end);
  if (e->end > data_len)
    return rx_fail(RX_EFORMAT, "%s: tensor '%s': data_offsets [%llu, %llu] run past the data buffer of %llu bytes", path, name,
                   (unsigned long long)e->begin, (unsigned long long)e->end, (unsigned long long)data_len);
  /* numel < 2^60, so numel * bits fits in 64 bits even for the sub-byte formats */
  uint64_t bits = (uint64_t)numel * (uint64_t)e->format->bits;
  if (bits % 8)
    return rx_fail(RX_EFORMAT, "%s: tensor '%s': %lld elements of %s do not fill whole bytes", path, name,
                   (long long)numel, e->format->name);
  if (e->end - e->begin != bits / 8)
    return rx_fail(RX_EFORMAT, "%s: tensor '%s': shape %s of %s needs %llu bytes, data_offsets [%llu, %llu] hold %llu",
                   path, name, dims_str(sbuf, sizeof sbuf, e->ndim, dims), e->format->name, (unsigned long long)(bits / 8),
                   (unsigned long long)e->begin, (unsigned long long)e->end, (unsigned long long)(e->end - e->begin));
  return RX_OK;
}

static int by_name(const void *a, const void *b) {
  return strcmp(((const rx_st_entry *)a)->name, ((const rx_st_entry *)b)->name);
}

static int by_offset(const void *a, const void *b) {
  const rx_st_entry *x = *(const rx_st_entry *const *)a, *y = *(const rx_st_entry *const *)b;
  if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
  if (x->end != y->end) return x->end < y->end ? -1 : 1;
  return strcmp(x->name, y->name);
}

/* Two tensors may not claim the same bytes (empty tensors claim none), and the last tensor ends
 * where the data buffer does, as the format requires: bytes past it mean the header length is
 * wrong (a header length one short still parses when the JSON ends in padding, and every tensor
 * would then be read one byte off). Gaps between tensors are allowed: remax's writer aligns each
 * tensor to its dtype. */
static int check_overlap(const char *path, rx_st_entry *entries, int64_t n, uint64_t data_len) {
  if (n == 0) {
    if (data_len) return rx_fail(RX_EFORMAT, "%s: no tensors, but a data buffer of %llu bytes (is the header length wrong?)",
                                 path, (unsigned long long)data_len);
    return RX_OK;
  }
  rx_st_entry **order = malloc((size_t)n * sizeof *order);
  if (!order) return rx_fail(RX_ENOMEM, "%s: out of memory checking tensor offsets", path);
  for (int64_t i = 0; i < n; i++) order[i] = &entries[i];
  qsort(order, (size_t)n, sizeof *order, by_offset);
  const rx_st_entry *reach = NULL;   /* the non-empty range that ends last so far */
  int rc = RX_OK;
  for (int64_t i = 0; i < n && !rc; i++) {
    const rx_st_entry *e = order[i];
    if (e->begin == e->end) continue;
    if (reach && e->begin < reach->end)
      rc = rx_fail(RX_EFORMAT, "%s: tensors '%s' [%llu, %llu) and '%s' [%llu, %llu) overlap in the data buffer", path,
                   reach->name, (unsigned long long)reach->begin, (unsigned long long)reach->end, e->name,
                   (unsigned long long)e->begin, (unsigned long long)e->end);
    if (!reach || e->end > reach->end) reach = e;
  }
  uint64_t end = reach ? reach->end : 0;
  if (!rc && end != data_len)
    rc = rx_fail(RX_EFORMAT, "%s: the tensors end at byte %llu of the data buffer, but it holds %llu bytes; the header "
                 "length in the first 8 bytes is likely wrong (or bytes were appended to the file)", path,
                 (unsigned long long)end, (unsigned long long)data_len);
  free(order);
  return rc;
}

static int parse_header(rx_st_file *f, const char *path, const rx_json *root, uint64_t data_len) {
  if (root->kind != RX_JSON_OBJECT)
    return rx_fail(RX_EFORMAT, "%s: header is a JSON %s, expected an object", path, rx_json_kind_name(root->kind));
  /* Pass 1: sizes, so that entries, shapes, names and metadata share one allocation. */
  int64_t n = 0, n_dims = 0, n_meta = 0;
  size_t text = 0;
  const rx_json *meta = NULL;
  for (const rx_json *m = root->child; m; m = m->next) {
    if (is_metadata_key(m)) {
      if (meta) return rx_fail(RX_EFORMAT, "%s: \"__metadata__\" appears twice in the header", path);
      meta = m;
      if (m->kind != RX_JSON_OBJECT)
        return rx_fail(RX_EFORMAT, "%s: \"__metadata__\" is a JSON %s, expected an object of strings", path, rx_json_kind_name(m->kind));
      for (const rx_json *kv = m->child; kv; kv = kv->next) {
        if (kv->kind != RX_JSON_STRING)
          return rx_fail(RX_EFORMAT, "%s: \"__metadata__\" value of '%s' is a JSON %s, expected a string", path, kv->key,
                         rx_json_kind_name(kv->kind));
        if (strlen(kv->key) != kv->key_len || strlen(kv->str) != kv->len)
          return rx_fail(RX_EFORMAT, "%s: \"__metadata__\" entry '%s' contains a NUL byte", path, kv->key);
        n_meta++;
        text += kv->key_len + kv->len + 2;
      }
      continue;
    }
    n++;
    text += m->key_len + 1;
    const rx_json *sh = m->kind == RX_JSON_OBJECT ? rx_json_get(m, "shape") : NULL;
    if (sh && sh->kind == RX_JSON_ARRAY) n_dims += sh->count;
  }
  size_t bytes = (size_t)n * sizeof(rx_st_entry) + (size_t)n_dims * sizeof(int64_t) + 2 * (size_t)n_meta * sizeof(char *) + text;
  char *block = calloc(1, bytes ? bytes : 1);
  if (!block) return rx_fail(RX_ENOMEM, "%s: out of memory for a header of %lld tensors", path, (long long)n);
  f->block = block;
  f->entries = (rx_st_entry *)block;
  int64_t *dims = (int64_t *)(f->entries + n);
  f->meta_keys = (const char **)(dims + n_dims);
  f->meta_values = f->meta_keys + n_meta;
  char *names = (char *)(f->meta_values + n_meta);
  /* Pass 2: check every entry, then copy the metadata strings after the names. */
  for (const rx_json *m = root->child; m; m = m->next) {
    if (is_metadata_key(m)) continue;
    rx_st_entry *e = &f->entries[f->n];
    int rc = parse_entry(path, m, data_len, e, dims);
    if (rc) return rc;
    memcpy(names, m->key, m->key_len + 1);
    e->name = names;
    names += m->key_len + 1;
    dims += e->ndim;
    f->n++;
  }
  if (meta)
    for (const rx_json *kv = meta->child; kv; kv = kv->next) {
      memcpy(names, kv->key, kv->key_len + 1);
      f->meta_keys[f->n_meta] = names;
      names += kv->key_len + 1;
      memcpy(names, kv->str, kv->len + 1);
      f->meta_values[f->n_meta++] = names;
      names += kv->len + 1;
    }
  qsort(f->entries, (size_t)f->n, sizeof *f->entries, by_name);
  for (int64_t i = 1; i < f->n; i++)
    if (strcmp(f->entries[i - 1].name, f->entries[i].name) == 0)
      return rx_fail(RX_EFORMAT, "%s: tensor '%s' appears twice in the header", path, f->entries[i].name);
  return check_overlap(path, f->entries, f->n, data_len);
}

void rx_st_file_release(rx_st_file *f) {
  if (!f) return;
  if (f->mapped && f->bytes && f->size) munmap((void *)f->bytes, f->size);
  free(f->block);
  free(f->path);
  memset(f, 0, sizeof *f);
}

int rx_st_parse(rx_st_file *f, const char *path, const uint8_t *bytes, size_t size) {
  memset(f, 0, sizeof *f);
  if (size < 8) return rx_fail(RX_EFORMAT, "%s: file is %zu bytes, too short for the 8-byte header length", path, size);
  uint64_t hlen = read_le64(bytes);
  if (hlen > RX_ST_MAX_HEADER)
    return rx_fail(RX_EFORMAT, "%s: header length %llu is over the 100 MB limit (not a safetensors file?)", path,
                   (unsigned long long)hlen);
  if (hlen > size - 8)
    return rx_fail(RX_EFORMAT, "%s: header length %llu runs past the end of the file (%zu bytes)", path,
                   (unsigned long long)hlen, size);
  char err[256];
  rx_json_doc *doc = rx_json_parse((const char *)bytes + 8, (size_t)hlen, err, sizeof err);
  if (!doc) return rx_fail(RX_EFORMAT, "%s: header is not valid JSON: header %s", path, err);
  f->bytes = bytes;
  f->size = size;
  f->data = bytes + 8 + hlen;
  f->data_len = size - 8 - hlen;
  int rc = parse_header(f, path, rx_json_root(doc), f->data_len);
  rx_json_free(doc);
  if (!rc && !(f->path = strdup(path))) rc = rx_fail(RX_ENOMEM, "%s: out of memory", path);
  if (rc) rx_st_file_release(f);
  return rc;
}

/* ------------------------------------------------------------------------------ handles */

struct rx_safetensors {
  char *path;              /* what the caller opened */
  int32_t n_files;
  rx_st_file *files;
  int64_t n;
  rx_st_entry *entries;    /* sorted by name; entry.file indexes files */
  int64_t n_meta, cap_meta;
  char **meta_keys, **meta_values;
};

void rx_safetensors_close(rx_safetensors *st) {
  if (!st) return;
  for (int32_t i = 0; i < st->n_files; i++) rx_st_file_release(&st->files[i]);
  for (int64_t i = 0; i < st->n_meta; i++) { free(st->meta_keys[i]); free(st->meta_values[i]); }
  free(st->meta_keys);
  free(st->meta_values);
  free(st->files);
  free(st->entries);
  free(st->path);
  free(st);
}

static rx_safetensors *handle_new(const char *path, int32_t n_files) {
  rx_safetensors *st = calloc(1, sizeof *st);
  if (!st) return NULL;
  st->path = strdup(path);
  st->files = calloc((size_t)(n_files ? n_files : 1), sizeof *st->files);
  if (!st->path || !st->files) { rx_safetensors_close(st); return NULL; }
  st->n_files = n_files;
  return st;
}

/* Adds key = value unless key is already there (the first source wins). */
static int meta_add(rx_safetensors *st, const char *key, const char *value) {
  for (int64_t i = 0; i < st->n_meta; i++)
    if (strcmp(st->meta_keys[i], key) == 0) return RX_OK;
  if (st->n_meta == st->cap_meta) {
    int64_t cap = st->cap_meta ? 2 * st->cap_meta : 8;
    char **k = realloc(st->meta_keys, (size_t)cap * sizeof *k);
    if (k) st->meta_keys = k;
    char **v = realloc(st->meta_values, (size_t)cap * sizeof *v);
    if (v) st->meta_values = v;
    if (!k || !v) return rx_fail(RX_ENOMEM, "%s: out of memory for metadata", st->path);
    st->cap_meta = cap;
  }
  char *k = strdup(key), *v = strdup(value);
  if (!k || !v) { free(k); free(v); return rx_fail(RX_ENOMEM, "%s: out of memory for metadata", st->path); }
  st->meta_keys[st->n_meta] = k;
  st->meta_values[st->n_meta++] = v;
  return RX_OK;
}

static int take_file_metadata(rx_safetensors *st, const rx_st_file *f) {
  for (int64_t i = 0; i < f->n_meta; i++)
    if (meta_add(st, f->meta_keys[i], f->meta_values[i])) return RX_ENOMEM;
  return RX_OK;
}

/* A handle over one parsed file: the entries are the file's own. */
static int handle_from_file(rx_safetensors **out, const char *path, rx_st_file *f) {
  rx_safetensors *st = handle_new(path, 1);
  if (!st) { rx_st_file_release(f); return rx_fail(RX_ENOMEM, "%s: out of memory", path); }
  st->files[0] = *f;
  st->entries = malloc((size_t)(f->n ? f->n : 1) * sizeof *st->entries);
  if (!st->entries) { rx_safetensors_close(st); return rx_fail(RX_ENOMEM, "%s: out of memory", path); }
  memcpy(st->entries, f->entries, (size_t)f->n * sizeof *st->entries);
  st->n = f->n;
  if (take_file_metadata(st, f)) { rx_safetensors_close(st); return RX_ENOMEM; }
  *out = st;
  return RX_OK;
}

int rx_safetensors_open_memory(rx_safetensors **out, const void *bytes, size_t size, const char *name) {
  rx_st_file f;
  *out = NULL;
  int rc = rx_st_parse(&f, name ? name : "(memory)", bytes, size);
  if (rc) return rc;
  return handle_from_file(out, name ? name : "(memory)", &f);
}

/* Maps path read-only and parses it into f. */
static int map_file(rx_st_file *f, const char *path) {
  memset(f, 0, sizeof *f);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return rx_fail(RX_EIO, "%s: cannot open: %s", path, strerror(errno));
  struct stat sb;
  if (fstat(fd, &sb) != 0) { int e = errno; close(fd); return rx_fail(RX_EIO, "%s: cannot stat: %s", path, strerror(e)); }
  if (S_ISDIR(sb.st_mode)) { close(fd); return rx_fail(RX_EIO, "%s: is a directory, expected a .safetensors file", path); }
  size_t size = (size_t)sb.st_size;
  if (size < 8) { close(fd); return rx_st_parse(f, path, NULL, size); }   /* fails: too short */
  void *p = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
  int e = errno;
  close(fd);
  if (p == MAP_FAILED) return rx_fail(RX_EIO, "%s: cannot map %zu bytes: %s", path, size, strerror(e));
  int rc = rx_st_parse(f, path, p, size);
  if (rc) { munmap(p, size); return rc; }
  f->mapped = 1;
  return RX_OK;
}

static const rx_st_entry *find_in(const rx_st_entry *entries, int64_t n, const char *name) {
  rx_st_entry key = {.name = name};
  return n ? bsearch(&key, entries, (size_t)n, sizeof *entries, by_name) : NULL;
}

static int read_small_file(const char *path, char **text, size_t *len) {
  FILE *fp = fopen(path, "rb");
  if (!fp) return rx_fail(RX_EIO, "%s: cannot open: %s", path, strerror(errno));
  struct stat sb;
  if (fstat(fileno(fp), &sb) != 0 || sb.st_size > RX_ST_MAX_HEADER) {
    fclose(fp);
    return rx_fail(RX_EIO, "%s: cannot read (or larger than 100 MB)", path);
  }
  char *buf = malloc((size_t)sb.st_size + 1);
  if (!buf) { fclose(fp); return rx_fail(RX_ENOMEM, "%s: out of memory", path); }
  size_t got = fread(buf, 1, (size_t)sb.st_size, fp);
  fclose(fp);
  buf[got] = 0;
  *text = buf;
  *len = got;
  return RX_OK;
}

/* dirname/name, or name alone when it is absolute or dir is empty. */
static char *join_path(const char *dir, const char *name) {
  size_t a = strlen(dir), b = strlen(name);
  char *p = malloc(a + b + 2);
  if (!p) return NULL;
  if (name[0] == '/' || a == 0) memcpy(p, name, b + 1);
  else { memcpy(p, dir, a); p[a] = '/'; memcpy(p + a + 1, name, b + 1); }
  return p;
}

static char *dir_of(const char *path) {
  const char *slash = strrchr(path, '/');
  if (!slash) return strdup(".");
  if (slash == path) return strdup("/");
  return strndup(path, (size_t)(slash - path));
}

/* A sharded checkpoint: {"metadata": {...}, "weight_map": {tensor: shard file}}. */
static int open_index(rx_safetensors **out, const char *path) {
  char *text = NULL, err[256];
  size_t len = 0;
  int rc = read_small_file(path, &text, &len);
  if (rc) return rc;
  rx_json_doc *doc = rx_json_parse(text, len, err, sizeof err);
  free(text);
  if (!doc) return rx_fail(RX_EFORMAT, "%s: not valid JSON: %s", path, err);
  rx_json *root = rx_json_root(doc), *wm = rx_json_get(root, "weight_map");
  const char **shards = NULL;
  char *dir = NULL;
  rx_safetensors *st = NULL;
  int32_t n_shards = 0;
  if (!wm || wm->kind != RX_JSON_OBJECT) {
    rc = rx_fail(RX_EFORMAT, "%s: no \"weight_map\" object (not a sharded safetensors index?)", path);
    goto done;
  }
  shards = calloc((size_t)(wm->count ? wm->count : 1), sizeof *shards);
  dir = dir_of(path);
  if (!shards || !dir) { rc = rx_fail(RX_ENOMEM, "%s: out of memory", path); goto done; }
  /* Distinct shard files, in order of first mention. */
  for (rx_json *m = wm->child; m; m = m->next) {
    if (m->kind != RX_JSON_STRING || strlen(m->str) != m->len || strlen(m->key) != m->key_len || m->len == 0) {
      rc = rx_fail(RX_EFORMAT, "%s: weight_map entry '%s' is not a shard file name", path, m->key);
      goto done;
    }
    int32_t k = 0;
    while (k < n_shards && strcmp(shards[k], m->str) != 0) k++;
    if (k == n_shards) shards[n_shards++] = m->str;
  }
  st = handle_new(path, n_shards);
  if (!st) { rc = rx_fail(RX_ENOMEM, "%s: out of memory", path); goto done; }
  st->entries = malloc((size_t)(wm->count ? wm->count : 1) * sizeof *st->entries);
  if (!st->entries) { rc = rx_fail(RX_ENOMEM, "%s: out of memory", path); goto done; }
  for (int32_t k = 0; k < n_shards; k++) {
    char *shard_path = join_path(dir, shards[k]);
    if (!shard_path) { rc = rx_fail(RX_ENOMEM, "%s: out of memory", path); goto done; }
    rc = map_file(&st->files[k], shard_path);
    free(shard_path);
    if (rc) {
      const char *first = "";
      for (rx_json *m = wm->child; m; m = m->next)
        if (strcmp(m->str, shards[k]) == 0) { first = m->key; break; }
      rc = rx_fail_context(rc, "%s: shard '%s' (listed for tensor '%s')", path, shards[k], first);
      goto done;
    }
  }
  for (rx_json *m = wm->child; m; m = m->next) {
    int32_t k = 0;
    while (strcmp(shards[k], m->str) != 0) k++;
    const rx_st_entry *e = find_in(st->files[k].entries, st->files[k].n, m->key);
    if (!e) {
      rc = rx_fail(RX_EFORMAT, "%s: tensor '%s' is listed in shard '%s', but %s has no such tensor", path, m->key,
                   shards[k], st->files[k].path);
      goto done;
    }
    st->entries[st->n] = *e;
    st->entries[st->n++].file = k;
  }
  qsort(st->entries, (size_t)st->n, sizeof *st->entries, by_name);
  for (int64_t i = 1; i < st->n; i++)
    if (strcmp(st->entries[i - 1].name, st->entries[i].name) == 0) {
      rc = rx_fail(RX_EFORMAT, "%s: tensor '%s' appears twice in \"weight_map\"", path, st->entries[i].name);
      goto done;
    }
  /* The index's own metadata (e.g. total_size) first, then each shard's. */
  rx_json *meta = rx_json_get(root, "metadata");
  for (rx_json *m = meta && meta->kind == RX_JSON_OBJECT ? meta->child : NULL; m && !rc; m = m->next) {
    char num[64];
    if (m->kind == RX_JSON_STRING) rc = meta_add(st, m->key, m->str);
    else if (m->kind == RX_JSON_NUMBER && m->is_integer) { snprintf(num, sizeof num, "%lld", (long long)m->integer); rc = meta_add(st, m->key, num); }
    else if (m->kind == RX_JSON_NUMBER) { snprintf(num, sizeof num, "%.17g", m->number); rc = meta_add(st, m->key, num); }
  }
  for (int32_t k = 0; k < n_shards && !rc; k++) rc = take_file_metadata(st, &st->files[k]);
done:
  rx_json_free(doc);
  free(shards);
  free(dir);
  if (rc) rx_safetensors_close(st);
  else *out = st;
  return rc;
}

static int ends_with(const char *s, const char *suffix) {
  size_t a = strlen(s), b = strlen(suffix);
  return a >= b && strcmp(s + a - b, suffix) == 0;
}

int rx_safetensors_open(rx_safetensors **out, const char *path) {
  if (!out) return rx_fail(RX_EINVAL, "safetensors open: missing output handle");
  *out = NULL;
  if (!path) return rx_fail(RX_EINVAL, "safetensors open: missing path");
  struct stat sb;
  if (stat(path, &sb) != 0) return rx_fail(RX_EIO, "%s: cannot open: %s", path, strerror(errno));
  if (S_ISDIR(sb.st_mode)) {
    char *single = join_path(path, "model.safetensors"), *index = join_path(path, "model.safetensors.index.json");
    int rc;
    if (!single || !index) rc = rx_fail(RX_ENOMEM, "%s: out of memory", path);
    else if (access(single, F_OK) == 0) rc = rx_safetensors_open(out, single);
    else if (access(index, F_OK) == 0) rc = open_index(out, index);
    else rc = rx_fail(RX_EIO, "%s: directory has neither model.safetensors nor model.safetensors.index.json", path);
    free(single);
    free(index);
    return rc;
  }
  if (ends_with(path, ".json")) return open_index(out, path);
  rx_st_file f;
  int rc = map_file(&f, path);
  if (rc) return rc;
  return handle_from_file(out, path, &f);
}

int64_t rx_safetensors_count(const rx_safetensors *st) { return st ? st->n : 0; }

const char *rx_safetensors_name(const rx_safetensors *st, int64_t index) {
  return st && index >= 0 && index < st->n ? st->entries[index].name : NULL;
}

int rx_safetensors_has(const rx_safetensors *st, const char *name) {
  return st && name && find_in(st->entries, st->n, name) ? 1 : 0;
}

const char *rx_safetensors_format_dtype(const rx_safetensors *st, const char *name) {
  const rx_st_entry *e = st && name ? find_in(st->entries, st->n, name) : NULL;
  return e ? e->format->name : NULL;
}

/* The entry for name, checked to be something an rx_tensor can hold. */
static int loadable(const rx_safetensors *st, const char *name, const rx_st_entry **out) {
  char sbuf[256];
  if (!st || !name) return rx_fail(RX_EINVAL, "safetensors: missing handle or tensor name");
  const rx_st_entry *e = find_in(st->entries, st->n, name);
  if (!e) return rx_fail(RX_EINVAL, "%s: no tensor named '%s'", st->path, name);
  const char *file = st->files[e->file].path;
  if (e->format->dtype < 0)
    return rx_fail(RX_EFORMAT, "%s: tensor '%s' has dtype %s, which remax cannot hold (it reads F32, F64, BF16, F16, I32, I64)",
                   file, name, e->format->name);
  if (e->ndim > RX_MAX_DIMS)
    return rx_fail(RX_EFORMAT, "%s: tensor '%s' has %d dims %s; remax tensors have at most 4", file, name, e->ndim,
                   dims_str(sbuf, sizeof sbuf, e->ndim, e->shape));
  *out = e;
  return RX_OK;
}

int rx_safetensors_info(const rx_safetensors *st, const char *name, int32_t *dtype, int32_t *ndim, int64_t *shape) {
  const rx_st_entry *e;
  int rc = loadable(st, name, &e);
  if (rc) return rc;
  if (dtype) *dtype = e->format->dtype;
  if (ndim) *ndim = e->ndim;
  if (shape) for (int i = 0; i < e->ndim; i++) shape[i] = e->shape[i];
  return RX_OK;
}

int rx_safetensors_read(const rx_safetensors *st, const char *name, rx_tensor *dst) {
  const rx_st_entry *e;
  char a[256], b[256];
  int rc = loadable(st, name, &e);
  if (rc) return rc;
  const rx_st_file *f = &st->files[e->file];
  if (!dst) return rx_fail(RX_EINVAL, "%s: destination tensor is missing", name);
  int same = dst->ndim == e->ndim;
  for (int i = 0; same && i < e->ndim; i++) same = dst->shape[i] == e->shape[i];
  if (!same)
    return rx_fail(RX_EINVAL, "%s: shape %s in %s, destination wants %s", name, dims_str(a, sizeof a, e->ndim, e->shape),
                   f->path, rx_shape_str(dst, b, sizeof b));
  if (e->numel == 0) return RX_OK;
  rx_note_write(dst);
  int32_t dtype = e->format->dtype;
  const uint8_t *src = f->data + e->begin;
  size_t bytes = (size_t)(e->end - e->begin);
  if (dst->device == RX_CPU && dst->dtype == dtype && rx_tensor_is_contiguous(dst)) {
    memcpy(dst->data, src, bytes);
    return RX_OK;
  }
  /* Offsets in the file need not be aligned to the dtype: convert from an aligned copy then. */
  void *scratch = NULL;
  if ((uintptr_t)src % (uintptr_t)rx_dtype_size(dtype)) {
    if (!(scratch = rx_alloc(bytes, name))) return RX_ENOMEM;
    memcpy(scratch, src, bytes);
    src = scratch;
  }
  rx_tensor *view = NULL;
  rc = rx_tensor_wrap(&view, (void *)src, dtype, e->ndim, e->shape);
  if (!rc) rc = rx_tensor_copy(dst, view);
  rx_tensor_free(view);
  rx_free(scratch);
  if (rc) return rx_fail_context(rc, "%s: tensor '%s'", f->path, name);
  return RX_OK;
}

int64_t rx_safetensors_metadata_count(const rx_safetensors *st) { return st ? st->n_meta : 0; }

const char *rx_safetensors_metadata_key(const rx_safetensors *st, int64_t index) {
  return st && index >= 0 && index < st->n_meta ? st->meta_keys[index] : NULL;
}

const char *rx_safetensors_metadata_get(const rx_safetensors *st, const char *key) {
  for (int64_t i = 0; st && key && i < st->n_meta; i++)
    if (strcmp(st->meta_keys[i], key) == 0) return st->meta_values[i];
  return NULL;
}

/* ------------------------------------------------------------------------------ writer */

typedef struct { char *p; size_t len, cap; int oom; } strbuf;

static void sb_put(strbuf *b, const char *s, size_t n) {
  if (b->oom) return;
  if (b->len + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + n + 1) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) { b->oom = 1; return; }
    b->p = p;
    b->cap = cap;
  }
  memcpy(b->p + b->len, s, n);
  b->len += n;
  b->p[b->len] = 0;
}

static void sb_str(strbuf *b, const char *s) { sb_put(b, s, strlen(s)); }

static void sb_int(strbuf *b, long long v) {
  char num[32];
  sb_put(b, num, (size_t)snprintf(num, sizeof num, "%lld", v));
}

/* A JSON string literal: quotes, backslashes and control characters escaped. */
static void sb_json(strbuf *b, const char *s) {
  sb_put(b, "\"", 1);
  for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
    char esc[8];
    if (*c == '"' || *c == '\\') { esc[0] = '\\'; esc[1] = (char)*c; sb_put(b, esc, 2); }
    else if (*c < 0x20) sb_put(b, esc, (size_t)snprintf(esc, sizeof esc, "\\u%04x", *c));
    else sb_put(b, (const char *)c, 1);
  }
  sb_put(b, "\"", 1);
}

typedef struct { const char *name; int64_t index, size; } save_item;

static int item_by_name(const void *a, const void *b) {
  return strcmp(((const save_item *)a)->name, ((const save_item *)b)->name);
}

/* Data order: wider dtypes first, then by name, so every tensor starts aligned to its dtype
 * without gaps (Hugging Face's reader refuses gaps between tensors). */
static int item_by_size(const void *a, const void *b) {
  const save_item *x = a, *y = b;
  if (x->size != y->size) return x->size > y->size ? -1 : 1;
  return strcmp(x->name, y->name);
}

static int write_all(int fd, const void *p, size_t n) {
  const char *c = p;
  while (n) {
    ssize_t w = write(fd, c, n > ((size_t)1 << 30) ? ((size_t)1 << 30) : n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return -1;
    c += w;
    n -= (size_t)w;
  }
  return 0;
}

/* Writes one tensor's bytes; a strided tensor goes through a contiguous scratch copy. */
static int write_tensor(int fd, const rx_tensor *t, const char *tmp, const char *name) {
  size_t bytes = (size_t)(t->numel * rx_dtype_size(t->dtype));
  if (bytes == 0) return RX_OK;
  rx_tensor *scratch = NULL;
  const void *p = t->data;
  if (!rx_tensor_is_contiguous(t)) {
    int rc = rx_tensor_new(&scratch, t->dtype, RX_CPU, t->ndim, t->shape);
    if (!rc) rc = rx_tensor_copy(scratch, t);
    if (rc) { rx_tensor_free(scratch); return rx_fail_context(rc, "%s: tensor '%s'", tmp, name); }
    p = scratch->data;
  }
  int rc = write_all(fd, p, bytes) ? rx_fail(RX_EIO, "%s: writing tensor '%s': %s", tmp, name, strerror(errno)) : RX_OK;
  rx_tensor_free(scratch);
  return rc;
}

/* Checks names/keys (present, unique) and sorts them; items must hold n entries. */
static int sorted_unique(const char *path, const char *what, int64_t n, const char *const *names, save_item *items) {
  for (int64_t i = 0; i < n; i++) {
    if (!names[i]) return rx_fail(RX_EINVAL, "save %s: %s %lld has no name", path, what, (long long)i);
    items[i] = (save_item){names[i], i, 0};
  }
  qsort(items, (size_t)n, sizeof *items, item_by_name);
  for (int64_t i = 1; i < n; i++)
    if (strcmp(items[i - 1].name, items[i].name) == 0)
      return rx_fail(RX_EINVAL, "save %s: %s '%s' given twice", path, what, items[i].name);
  return RX_OK;
}

static int build_header(strbuf *h, const char *path, int64_t n, const save_item *named, rx_tensor *const *tensors,
                        const int64_t *begin, int64_t n_meta, const save_item *keys, const char *const *meta_values) {
  sb_str(h, "{");
  if (n_meta > 0) {
    sb_str(h, "\"__metadata__\":{");
    for (int64_t i = 0; i < n_meta; i++) {
      if (!meta_values[keys[i].index]) return rx_fail(RX_EINVAL, "save %s: metadata '%s' has no value", path, keys[i].name);
      if (i) sb_str(h, ",");
      sb_json(h, keys[i].name);
      sb_str(h, ":");
      sb_json(h, meta_values[keys[i].index]);
    }
    sb_str(h, "}");
  }
  for (int64_t i = 0; i < n; i++) {
    const rx_tensor *t = tensors[named[i].index];
    if (n_meta > 0 || i) sb_str(h, ",");
    sb_json(h, named[i].name);
    sb_str(h, ":{\"dtype\":\"");
    sb_str(h, format_name(t->dtype));
    sb_str(h, "\",\"shape\":[");
    for (int d = 0; d < t->ndim; d++) { if (d) sb_str(h, ","); sb_int(h, t->shape[d]); }
    sb_str(h, "],\"data_offsets\":[");
    sb_int(h, begin[named[i].index]);
    sb_str(h, ",");
    sb_int(h, begin[named[i].index] + t->numel * rx_dtype_size(t->dtype));
    sb_str(h, "]}");
  }
  sb_str(h, "}");
  while (!h->oom && (8 + h->len) % 8) sb_str(h, " ");   /* data starts 8-byte aligned */
  return h->oom ? rx_fail(RX_ENOMEM, "save %s: out of memory for the header", path) : RX_OK;
}

int rx_safetensors_save(const char *path, int64_t n, const char *const *names, rx_tensor *const *tensors,
                        int64_t n_meta, const char *const *meta_keys, const char *const *meta_values) {
  if (!path) return rx_fail(RX_EINVAL, "safetensors save: missing path");
  if (n < 0 || n_meta < 0) return rx_fail(RX_EINVAL, "save %s: negative tensor or metadata count", path);
  if ((n && (!names || !tensors)) || (n_meta && (!meta_keys || !meta_values)))
    return rx_fail(RX_EINVAL, "save %s: missing name, tensor or metadata arrays", path);
  for (int64_t i = 0; i < n; i++) {
    const char *name = names[i] ? names[i] : "(unnamed)";
    const rx_tensor *t = tensors[i];
    if (!t) return rx_fail(RX_EINVAL, "save %s: tensor '%s' is missing", path, name);
    if (t->device != RX_CPU)
      return rx_fail(RX_EDEVICE, "save %s: tensor '%s' is on device %d; copy it to the CPU first", path, name, t->device);
    if (!format_name(t->dtype)) return rx_fail(RX_EINVAL, "save %s: tensor '%s' has invalid dtype %d", path, name, t->dtype);
    if (names[i] && strcmp(names[i], "__metadata__") == 0)
      return rx_fail(RX_EINVAL, "save %s: \"__metadata__\" is reserved and cannot name a tensor", path);
  }
  save_item *named = malloc((size_t)(n + 1) * sizeof *named), *order = malloc((size_t)(n + 1) * sizeof *order);
  save_item *keys = malloc((size_t)(n_meta + 1) * sizeof *keys);
  int64_t *begin = malloc((size_t)(n + 1) * sizeof *begin);
  strbuf h = {0};
  char *tmp = NULL, *dir = NULL;
  int fd = -1, rc;
  if (!named || !order || !keys || !begin) { rc = rx_fail(RX_ENOMEM, "save %s: out of memory", path); goto done; }
  if ((rc = sorted_unique(path, "tensor", n, names, named))) goto done;
  if ((rc = sorted_unique(path, "metadata key", n_meta, meta_keys, keys))) goto done;
  for (int64_t i = 0; i < n; i++) order[i] = (save_item){names[i], i, rx_dtype_size(tensors[i]->dtype)};
  qsort(order, (size_t)n, sizeof *order, item_by_size);
  int64_t offset = 0;
  for (int64_t i = 0; i < n; i++) {
    begin[order[i].index] = offset;
    offset += tensors[order[i].index]->numel * order[i].size;
  }
  if ((rc = build_header(&h, path, n, named, tensors, begin, n_meta, keys, meta_values))) goto done;

  size_t tmp_len = strlen(path) + 32;
  tmp = malloc(tmp_len);
  dir = dir_of(path);
  if (!tmp || !dir) { rc = rx_fail(RX_ENOMEM, "save %s: out of memory", path); goto done; }
  snprintf(tmp, tmp_len, "%s.tmp.%ld", path, (long)getpid());
  fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) { rc = rx_fail(RX_EIO, "save %s: cannot create %s: %s", path, tmp, strerror(errno)); goto done; }
  uint8_t len8[8];
  for (int i = 0; i < 8; i++) len8[i] = (uint8_t)((uint64_t)h.len >> (8 * i));
  if (write_all(fd, len8, 8) || write_all(fd, h.p, h.len)) {
    rc = rx_fail(RX_EIO, "save %s: writing %s: %s", path, tmp, strerror(errno));
    goto done;
  }
  rx_crash_point("safetensors: header written");
  for (int64_t i = 0; i < n; i++) {
    if ((rc = write_tensor(fd, tensors[order[i].index], tmp, order[i].name))) goto done;
    rx_crash_point("safetensors: tensor written");
  }
  if (fsync(fd) != 0) { rc = rx_fail(RX_EIO, "save %s: fsync of %s failed: %s", path, tmp, strerror(errno)); goto done; }
  int closed = close(fd);
  fd = -1;
  if (closed != 0) { rc = rx_fail(RX_EIO, "save %s: closing %s failed: %s", path, tmp, strerror(errno)); goto done; }
  rx_crash_point("safetensors: before rename");
  if (rename(tmp, path) != 0) { rc = rx_fail(RX_EIO, "save %s: cannot rename %s over it: %s", path, tmp, strerror(errno)); goto done; }
  rx_crash_point("safetensors: after rename");
  /* The rename itself is durable only once the directory is synced. */
  int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    if (fsync(dfd) != 0 && errno != EINVAL && errno != EROFS)
      rc = rx_fail(RX_EIO, "save %s: fsync of directory %s failed: %s", path, dir, strerror(errno));
    close(dfd);
  }
done:
  if (fd >= 0) close(fd);
  if (rc && tmp) unlink(tmp);   /* a failed save leaves the old file and no temporary behind */
  free(h.p);
  free(tmp);
  free(dir);
  free(named);
  free(order);
  free(keys);
  free(begin);
  return rc;
}
