/* json.c: strict recursive-descent JSON parser into an arena of nodes. */
#include "json.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>

enum { MAX_DEPTH = 512 };

typedef struct block { struct block *next; size_t used, cap; char data[]; } block;

struct rx_json_doc { block *blocks; rx_json *root; };

typedef struct {
  const char *s;
  size_t n, i;
  rx_json_doc *doc;
  char *err;
  size_t errlen;
  int depth;
} parser;

static void *arena(parser *p, size_t bytes) {
  bytes = (bytes + 15) & ~(size_t)15;
  block *b = p->doc->blocks;
  if (!b || b->cap - b->used < bytes) {
    size_t cap = bytes > (1u << 20) ? bytes : (1u << 20);
    block *nb = malloc(sizeof *nb + cap);
    if (!nb) return NULL;
    nb->next = b;
    nb->used = 0;
    nb->cap = cap;
    p->doc->blocks = nb;
    b = nb;
  }
  void *r = b->data + b->used;
  b->used += bytes;
  return r;
}

static int fail(parser *p, const char *what) {
  if (p->err && !p->err[0]) snprintf(p->err, p->errlen, "byte %zu: %s", p->i, what);
  return -1;
}

static void skip_ws(parser *p) {
  while (p->i < p->n) {
    char c = p->s[p->i];
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r') p->i++;
    else break;
  }
}

static int hex4(parser *p, uint32_t *out) {
  if (p->n - p->i < 4) return fail(p, "truncated \\u escape");
  uint32_t v = 0;
  for (int k = 0; k < 4; k++) {
    char c = p->s[p->i++];
    v <<= 4;
    if (c >= '0' && c <= '9') v |= (uint32_t)(c - '0');
    else if (c >= 'a' && c <= 'f') v |= (uint32_t)(c - 'a' + 10);
    else if (c >= 'A' && c <= 'F') v |= (uint32_t)(c - 'A' + 10);
    else return fail(p, "bad hex digit in \\u escape");
  }
  *out = v;
  return 0;
}

static size_t put_utf8(char *o, uint32_t cp) {
  if (cp < 0x80) { o[0] = (char)cp; return 1; }
  if (cp < 0x800) { o[0] = (char)(0xC0 | (cp >> 6)); o[1] = (char)(0x80 | (cp & 0x3F)); return 2; }
  if (cp < 0x10000) {
    o[0] = (char)(0xE0 | (cp >> 12)); o[1] = (char)(0x80 | ((cp >> 6) & 0x3F)); o[2] = (char)(0x80 | (cp & 0x3F));
    return 3;
  }
  o[0] = (char)(0xF0 | (cp >> 18)); o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
  o[2] = (char)(0x80 | ((cp >> 6) & 0x3F)); o[3] = (char)(0x80 | (cp & 0x3F));
  return 4;
}

/* Parses a string at p->i (on the opening quote) into arena memory. */
static int parse_string(parser *p, const char **out, size_t *out_len) {
  p->i++; /* opening quote */
  size_t start = p->i, j = start;
  while (j < p->n && p->s[j] != '"') j += (p->s[j] == '\\') ? 2 : 1;
  if (j >= p->n) return fail(p, "unterminated string");
  char *o = arena(p, j - start + 1);   /* decoded text is never longer than the source */
  if (!o) return fail(p, "out of memory");
  size_t k = 0;
  while (p->s[p->i] != '"') {
    unsigned char c = (unsigned char)p->s[p->i];
    if (c < 0x20) return fail(p, "control character in string");
    if (c != '\\') { o[k++] = (char)c; p->i++; continue; }
    p->i++;
    char e = p->s[p->i++];
    switch (e) {
      case '"': o[k++] = '"'; break;
      case '\\': o[k++] = '\\'; break;
      case '/': o[k++] = '/'; break;
      case 'b': o[k++] = '\b'; break;
      case 'f': o[k++] = '\f'; break;
      case 'n': o[k++] = '\n'; break;
      case 'r': o[k++] = '\r'; break;
      case 't': o[k++] = '\t'; break;
      case 'u': {
        uint32_t cp;
        if (hex4(p, &cp)) return -1;
        if (cp >= 0xD800 && cp <= 0xDBFF) {
          uint32_t lo;
          if (p->n - p->i >= 6 && p->s[p->i] == '\\' && p->s[p->i + 1] == 'u') {
            p->i += 2;
            if (hex4(p, &lo)) return -1;
            if (lo < 0xDC00 || lo > 0xDFFF) return fail(p, "unpaired surrogate in \\u escape");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          } else return fail(p, "unpaired surrogate in \\u escape");
        } else if (cp >= 0xDC00 && cp <= 0xDFFF) return fail(p, "unpaired surrogate in \\u escape");
        k += put_utf8(o + k, cp);
        break;
      }
      default: p->i--; return fail(p, "bad escape in string");
    }
  }
  p->i++; /* closing quote */
  o[k] = 0;
  *out = o;
  *out_len = k;
  return 0;
}

static int parse_number(parser *p, rx_json *v) {
  size_t start = p->i;
  int integral = 1;
  if (p->s[p->i] == '-') p->i++;
  if (p->i >= p->n) return fail(p, "truncated number");
  if (p->s[p->i] == '0') p->i++;
  else if (p->s[p->i] >= '1' && p->s[p->i] <= '9') while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9') p->i++;
  else return fail(p, "bad number");
  if (p->i < p->n && p->s[p->i] == '.') {
    integral = 0;
    p->i++;
    if (p->i >= p->n || p->s[p->i] < '0' || p->s[p->i] > '9') return fail(p, "bad number fraction");
    while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9') p->i++;
  }
  if (p->i < p->n && (p->s[p->i] == 'e' || p->s[p->i] == 'E')) {
    integral = 0;
    p->i++;
    if (p->i < p->n && (p->s[p->i] == '+' || p->s[p->i] == '-')) p->i++;
    if (p->i >= p->n || p->s[p->i] < '0' || p->s[p->i] > '9') return fail(p, "bad number exponent");
    while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9') p->i++;
  }
  /* strtod needs a NUL-terminated copy; a long one (many digits) goes to the heap whole, since
   * every digit can change the nearest double and a cut could drop the exponent */
  char small[64], *buf = small;
  size_t len = p->i - start;
  if (len >= sizeof small && !(buf = malloc(len + 1))) return fail(p, "out of memory");
  memcpy(buf, p->s + start, len);
  buf[len] = 0;
  v->kind = RX_JSON_NUMBER;
  v->number = strtod(buf, NULL);
  if (integral) {
    errno = 0;
    long long x = strtoll(buf, NULL, 10);
    if (errno == 0) { v->is_integer = 1; v->integer = x; }
  }
  if (buf != small) free(buf);
  return 0;
}

static int parse_value(parser *p, rx_json **out);

static int parse_container(parser *p, rx_json *v, int object) {
  char close = object ? '}' : ']';
  rx_json **tail = &v->child;
  if (++p->depth > MAX_DEPTH) return fail(p, "nesting too deep");
  p->i++;
  skip_ws(p);
  if (p->i < p->n && p->s[p->i] == close) { p->i++; p->depth--; return 0; }
  for (;;) {
    const char *key = NULL;
    size_t key_len = 0;
    skip_ws(p);
    if (object) {
      if (p->i >= p->n || p->s[p->i] != '"') return fail(p, "expected member name string");
      if (parse_string(p, &key, &key_len)) return -1;
      skip_ws(p);
      if (p->i >= p->n || p->s[p->i] != ':') return fail(p, "expected ':'");
      p->i++;
    }
    rx_json *item;
    if (parse_value(p, &item)) return -1;
    item->key = key;
    item->key_len = key_len;
    *tail = item;
    tail = &item->next;
    v->count++;
    skip_ws(p);
    if (p->i >= p->n) return fail(p, object ? "unterminated object" : "unterminated array");
    if (p->s[p->i] == ',') { p->i++; continue; }
    if (p->s[p->i] == close) { p->i++; break; }
    return fail(p, object ? "expected ',' or '}'" : "expected ',' or ']'");
  }
  p->depth--;
  return 0;
}

static int literal(parser *p, const char *word) {
  size_t n = strlen(word);
  if (p->n - p->i < n || memcmp(p->s + p->i, word, n) != 0) return fail(p, "unexpected character");
  p->i += n;
  return 0;
}

static int parse_value(parser *p, rx_json **out) {
  skip_ws(p);
  if (p->i >= p->n) return fail(p, "unexpected end of input");
  rx_json *v = arena(p, sizeof *v);
  if (!v) return fail(p, "out of memory");
  memset(v, 0, sizeof *v);
  v->offset = p->i;
  *out = v;
  char c = p->s[p->i];
  switch (c) {
    case '{': v->kind = RX_JSON_OBJECT; return parse_container(p, v, 1);
    case '[': v->kind = RX_JSON_ARRAY; return parse_container(p, v, 0);
    case '"': v->kind = RX_JSON_STRING; return parse_string(p, &v->str, &v->len);
    case 't': v->kind = RX_JSON_BOOL; v->boolean = 1; return literal(p, "true");
    case 'f': v->kind = RX_JSON_BOOL; return literal(p, "false");
    case 'n': v->kind = RX_JSON_NULL; return literal(p, "null");
    default:
      if (c == '-' || (c >= '0' && c <= '9')) return parse_number(p, v);
      return fail(p, "unexpected character");
  }
}

rx_json_doc *rx_json_parse(const char *text, size_t len, char *err, size_t errlen) {
  parser p = {text, len, 0, NULL, err, errlen, 0};
  if (err && errlen) err[0] = 0;
  p.doc = calloc(1, sizeof *p.doc);
  if (!p.doc) { if (err) snprintf(err, errlen, "out of memory"); return NULL; }
  if (parse_value(&p, &p.doc->root)) { rx_json_free(p.doc); return NULL; }
  skip_ws(&p);
  if (p.i != p.n) { fail(&p, "trailing characters after the JSON value"); rx_json_free(p.doc); return NULL; }
  return p.doc;
}

rx_json *rx_json_root(rx_json_doc *doc) { return doc ? doc->root : NULL; }

void rx_json_free(rx_json_doc *doc) {
  if (!doc) return;
  for (block *b = doc->blocks, *n; b; b = n) { n = b->next; free(b); }
  free(doc);
}

rx_json *rx_json_get(const rx_json *obj, const char *key) {
  if (!obj || obj->kind != RX_JSON_OBJECT) return NULL;
  for (rx_json *m = obj->child; m; m = m->next)
    if (strcmp(m->key, key) == 0) return m;
  return NULL;
}

const char *rx_json_kind_name(rx_json_kind kind) {
  static const char *names[] = {"null", "boolean", "number", "string", "array", "object"};
  return kind <= RX_JSON_OBJECT ? names[kind] : "?";
}
