/* fuzz_json.c: libFuzzer target over the engine's JSON parser (engine/core/json.c). Any input
 * either fails with "byte N: what" (N inside the input), or parses into a tree whose counts,
 * strings and offsets are consistent, and which survives a round trip: the tree written back
 * as JSON parses again to the same tree (the written text is then identical).
 * Built by tests/fuzz/run.sh from these engine sources:
 * fuzz-sources: engine/core/json.c
 * fuzz-dict: json.dict
 * Seeds: tests/fuzz/corpus/fuzz_json/ (real configs, tokenizers and data files). */
#include "json.h"
#include "fuzz_cpu.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

typedef struct { char *p; size_t n, cap; } buf;

static void put(buf *b, const char *s, size_t n) {
  if (b->n + n + 1 > b->cap) {
    b->cap = 2 * (b->n + n + 1);
    b->p = realloc(b->p, b->cap);
    if (!b->p) __builtin_trap();
  }
  memcpy(b->p + b->n, s, n);
  b->n += n;
  b->p[b->n] = 0;
}

static void put_string(buf *b, const char *s, size_t n) {
  put(b, "\"", 1);
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)s[i];
    char esc[8];
    if (c == '"' || c == '\\') { esc[0] = '\\'; esc[1] = (char)c; put(b, esc, 2); }
    else if (c < 0x20) { snprintf(esc, sizeof esc, "\\u%04x", c); put(b, esc, 6); }
    else put(b, (const char *)&c, 1);
  }
  put(b, "\"", 1);
}

/* Writes v as JSON and checks the node's own invariants on the way. */
static const char *source;   /* the input, NUL-terminated: numbers are checked against strtod */

static void write_value(buf *b, const rx_json *v, size_t src_len) {
  char num[64];
  if (v->offset >= src_len) __builtin_trap();
  if (v->kind == RX_JSON_NUMBER && source) {   /* the value is the source text's, to the last bit */
    double want = strtod(source + v->offset, NULL);
    if (memcmp(&want, &v->number, sizeof want) != 0) {
      fprintf(stderr, "number at byte %zu: parsed %.17g, the text says %.17g\n", v->offset, v->number, want);
      __builtin_trap();
    }
    if (v->is_integer && (strtoll(source + v->offset, NULL, 10) != v->integer || (double)v->integer != v->number)) __builtin_trap();
  }
  switch (v->kind) {
    case RX_JSON_NULL: put(b, "null", 4); break;
    case RX_JSON_BOOL: put(b, v->boolean ? "true" : "false", v->boolean ? 4 : 5); break;
    case RX_JSON_NUMBER:
      /* "-0" is the integer 0 with the double -0.0: keep the sign so a second pass writes the same */
      if (v->is_integer && v->integer == 0 && signbit(v->number)) snprintf(num, sizeof num, "-0");
      else if (v->is_integer) snprintf(num, sizeof num, "%lld", (long long)v->integer);
      else if (v->number != v->number) __builtin_trap();             /* JSON has no NaN */
      else if (v->number > 1.7976931348623157e308) snprintf(num, sizeof num, "1e999");
      else if (v->number < -1.7976931348623157e308) snprintf(num, sizeof num, "-1e999");
      else snprintf(num, sizeof num, "%.17g", v->number);
      put(b, num, strlen(num));
      break;
    case RX_JSON_STRING:
      if (!v->str || v->str[v->len] != 0) __builtin_trap();
      put_string(b, v->str, v->len);
      break;
    case RX_JSON_ARRAY:
    case RX_JSON_OBJECT: {
      int object = v->kind == RX_JSON_OBJECT;
      int64_t count = 0;
      put(b, object ? "{" : "[", 1);
      for (const rx_json *c = v->child; c; c = c->next, count++) {
        if (count) put(b, ",", 1);
        if (object) {
          if (!c->key || c->key[c->key_len] != 0) __builtin_trap();
          put_string(b, c->key, c->key_len);
          put(b, ":", 1);
          /* rx_json_get finds a member by its name (first match) when the name has no NUL */
          if (strlen(c->key) == c->key_len) {
            const rx_json *g = rx_json_get(v, c->key);
            if (!g || strcmp(g->key, c->key) != 0) __builtin_trap();
          }
        } else if (c->key) __builtin_trap();
        write_value(b, c, src_len);
      }
      if (count != v->count) __builtin_trap();
      put(b, object ? "}" : "]", 1);
      break;
    }
    default: __builtin_trap();
  }
}

static int one_input(const uint8_t *data, size_t size) {
  char err[256];
  rx_json_doc *doc = rx_json_parse((const char *)data, size, err, sizeof err);
  if (!doc) {
    size_t at;
    if (sscanf(err, "byte %zu: ", &at) != 1 || at > size) __builtin_trap();   /* every error says where */
    return 0;
  }
  if (rx_json_get(rx_json_root(doc), "no such key \x01") != NULL) __builtin_trap();
  buf once = {0}, twice = {0};
  char *copy = malloc(size + 1);
  memcpy(copy, data, size);
  copy[size] = 0;
  source = copy;
  write_value(&once, rx_json_root(doc), size);
  source = NULL;
  free(copy);
  rx_json_free(doc);
  rx_json_doc *again = rx_json_parse(once.p, once.n, err, sizeof err);
  if (!again) {
    fprintf(stderr, "the parser rejects its own tree written back: %s\n%.*s\n", err, (int)(once.n > 400 ? 400 : once.n), once.p);
    __builtin_trap();
  }
  write_value(&twice, rx_json_root(again), once.n);
  rx_json_free(again);
  if (once.n != twice.n || memcmp(once.p, twice.p, once.n) != 0) __builtin_trap();
  free(once.p);
  free(twice.p);
  return 0;
}

FUZZ_CPU_TARGET(one_input)
