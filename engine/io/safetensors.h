/* safetensors.h: the parts of the safetensors reader that tests and the fuzzer reach directly.
 * Internal to the engine; the public API is the safetensors section of remax.h. */
#ifndef RX_SAFETENSORS_H
#define RX_SAFETENSORS_H
#include "remax.h"
#include <stddef.h>
#include <stdint.h>

/* Header lengths above this are refused before anything is allocated (as Hugging Face does). */
enum { RX_ST_MAX_HEADER = 100000000 };

/* One dtype of the file format. bits, not bytes: F4 and F6 pack several values per byte. */
typedef struct rx_st_format {
  const char *name;   /* "F32", "BF16", "F8_E4M3", ... */
  int32_t bits;
  int32_t dtype;      /* rx_dtype remax reads it as, or -1 when remax cannot hold it */
} rx_st_format;

/* The format dtype called `name`, or NULL. */
const rx_st_format *rx_st_format_by_name(const char *name);

/* One tensor as the header describes it, already checked against the file. */
typedef struct rx_st_entry {
  const char *name;
  const rx_st_format *format;
  int32_t ndim;
  int32_t file;            /* index of the file (shard) that holds the bytes */
  const int64_t *shape;    /* ndim dims */
  int64_t numel;
  uint64_t begin, end;     /* byte range inside the file's data buffer */
} rx_st_entry;

/* One parsed .safetensors file. The bytes are mapped (open) or borrowed (parse on memory). */
typedef struct rx_st_file {
  char *path;              /* as used in messages */
  const uint8_t *bytes;
  size_t size;
  int mapped;
  const uint8_t *data;     /* start of the data buffer */
  uint64_t data_len;
  int64_t n;
  rx_st_entry *entries;    /* sorted by name, names unique */
  int64_t n_meta;
  const char **meta_keys, **meta_values;   /* "__metadata__", in header order */
  void *block;             /* one allocation for entries, shapes, names and metadata */
} rx_st_file;

/* Checks and parses a whole file image bytes[0..size): header length, JSON, every entry
 * (dtype, shape, offsets inside the buffer, byte size, no overlap, no duplicate names).
 * `path` names the file in messages. On failure f is left empty. The bytes must outlive f. */
int rx_st_parse(rx_st_file *f, const char *path, const uint8_t *bytes, size_t size);
void rx_st_file_release(rx_st_file *f);

/* A handle over a file image in memory (not copied, not freed): the fuzzer's entry point,
 * and the same checks rx_safetensors_open makes on a mapped file. */
int rx_safetensors_open_memory(rx_safetensors **out, const void *bytes, size_t size, const char *name);

#endif
