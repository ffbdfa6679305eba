/* fuzz_safetensors.c: libFuzzer target over the safetensors header parser and read path, on a
 * file image in memory. Any input must either open, and then every tensor it lists reads without
 * touching bytes outside the image, or fail with a message that names the file.
 * Built by tests/fuzz/run.sh from these engine sources:
 * fuzz-sources: engine/core/error.c engine/cuda/none.c engine/core/dtype.c engine/core/json.c engine/core/tensor.c engine/core/profile.c engine/core/philox.c engine/core/signal.c engine/io/safetensors.c
 * With -DFUZZ_SEEDS it is instead a program that writes a seed corpus into the folder argv[1]. */
#include "io/safetensors.h"
#include "internal.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *NAME = "fuzz.safetensors";

/* Reads every loadable tensor twice: in its own dtype (plain copy) and as f32 (conversion). */
static void exercise(const rx_safetensors *st) {
  for (int64_t i = 0; i < rx_safetensors_count(st); i++) {
    const char *name = rx_safetensors_name(st, i);
    if (!name || !rx_safetensors_has(st, name) || !rx_safetensors_format_dtype(st, name)) __builtin_trap();
    int32_t dtype, ndim;
    int64_t shape[4];
    if (rx_safetensors_info(st, name, &dtype, &ndim, shape) != RX_OK) continue;
    int32_t as[2] = {dtype, RX_F32};
    for (int k = 0; k < 2; k++) {
      rx_tensor *t = NULL;
      if (rx_tensor_new(&t, as[k], RX_CPU, ndim, shape) == RX_OK) {
        if (rx_safetensors_read(st, name, t) != RX_OK) __builtin_trap();   /* info said it is loadable */
        rx_tensor_free(t);
      }
    }
  }
  for (int64_t i = 0; i < rx_safetensors_metadata_count(st); i++) {
    const char *key = rx_safetensors_metadata_key(st, i), *value = rx_safetensors_metadata_get(st, key);
    if (!key || !value) __builtin_trap();
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  rx_safetensors *st = NULL;
  if (rx_safetensors_open_memory(&st, data, size, NAME) != RX_OK) {
    if (st || !strstr(rx_last_error(), NAME)) __builtin_trap();   /* every error names the file */
    return 0;
  }
  exercise(st);
  rx_safetensors_close(st);
  return 0;
}

#ifdef FUZZ_SEEDS
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

static void put(const char *dir, const char *name, const void *p, size_t n) {
  char path[1024];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "wb");
  if (!f) { perror(path); exit(1); }
  fwrite(p, 1, n, f);
  fclose(f);
}

/* A file from header text and data_len data bytes. */
static void put_raw(const char *dir, const char *name, const char *header, size_t data_len) {
  size_t h = strlen(header);
  unsigned char *buf = calloc(1, 8 + h + data_len);
  for (int i = 0; i < 8; i++) buf[i] = (unsigned char)((uint64_t)h >> (8 * i));
  memcpy(buf + 8, header, h);
  for (size_t i = 0; i < data_len; i++) buf[8 + h + i] = (unsigned char)(i * 29 + 3);
  put(dir, name, buf, 8 + h + data_len);
  free(buf);
}

int main(int argc, char **argv) {
  if (argc != 2) { fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]); return 2; }
  const char *dir = argv[1];
  /* A valid file from the real writer: several dtypes, 0-d, empty, metadata. */
  int64_t s23[2] = {2, 3}, s4[1] = {4}, s02[2] = {0, 2};
  rx_tensor *t[5];
  rx_tensor_new(&t[0], RX_F32, RX_CPU, 2, s23);
  rx_tensor_new(&t[1], RX_BF16, RX_CPU, 1, s4);
  rx_tensor_new(&t[2], RX_I64, RX_CPU, 0, NULL);
  rx_tensor_new(&t[3], RX_F16, RX_CPU, 2, s02);
  rx_tensor_new(&t[4], RX_F64, RX_CPU, 1, s4);
  for (int i = 0; i < 5; i++) rx_tensor_uniform(t[i], 1, 0, -2, 2);
  const char *names[5] = {"model.w", "model.b", "step", "empty", "norm"}, *mk[2] = {"format", "note"}, *mv[2] = {"pt", "seed"};
  char path[1024];
  snprintf(path, sizeof path, "%s/valid.safetensors", dir);
  if (rx_safetensors_save(path, 5, names, t, 2, mk, mv)) { fprintf(stderr, "%s\n", rx_last_error()); return 1; }
  for (int i = 0; i < 5; i++) rx_tensor_free(t[i]);
  size_t n;
  unsigned char *valid = slurp(path, &n);
  /* Near-valid variants: truncated, header length off by one, one byte of the header flipped. */
  put(dir, "truncated.safetensors", valid, n - 5);
  unsigned char *v = malloc(n);
  memcpy(v, valid, n);
  v[0]++;
  put(dir, "len_plus_one.safetensors", v, n);
  memcpy(v, valid, n);
  v[8 + 20] ^= 0x20;
  put(dir, "flipped.safetensors", v, n);
  free(v);
  free(valid);
  put_raw(dir, "unaligned.safetensors",
          "{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
          "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[1,9]},"
          "\"c\":{\"dtype\":\"BF16\",\"shape\":[1,1,3],\"data_offsets\":[9,15]}}", 15);
  put_raw(dir, "exotic.safetensors",
          "{\"q\":{\"dtype\":\"F8_E4M3\",\"shape\":[4],\"data_offsets\":[0,4]},"
          "\"f\":{\"dtype\":\"F4\",\"shape\":[2,2],\"data_offsets\":[4,6]},"
          "\"x\":{\"dtype\":\"I32\",\"shape\":[1,1,1,1,1],\"data_offsets\":[8,12]},"
          "\"__metadata__\":{\"k\":\"v\"}}", 12);
  put_raw(dir, "overlap.safetensors",
          "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
          "\"b\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[8,24]}}", 24);
  put_raw(dir, "numbers.safetensors",
          "{\"a\":{\"dtype\":\"F64\",\"shape\":[1e0, -0, 4294967296],\"data_offsets\":[0,0]},"
          "\"a\":{\"dtype\":\"I64\",\"shape\":[],\"data_offsets\":[0,8]}}", 8);
  return 0;
}
#endif
