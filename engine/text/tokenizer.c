/* tokenizer.c: Hugging Face byte-level BPE tokenizers (GPT-2, Llama 3, Qwen2/2.5/3) read from
 * tokenizer.json.
 *
 * encode: added tokens are matched first (leftmost, longest), then each stretch of plain text
 * is NFC-normalised (when declared), split by the pre-tokenizer regex, and each piece is merged
 * by BPE rank. BPE works on raw bytes and token ids: the vocab's byte-level strings ("Ġthe")
 * are mapped back to bytes once at load, so the byte <-> unicode mapping costs nothing per call.
 * decode: ids -> the exact bytes (added tokens give their content).
 *
 * A handle keeps scratch buffers and a piece -> ids cache: encode/decode on one handle from
 * several threads at once is not allowed (use one handle per thread). */
#include "internal.h"
#include "json.h"
#include "text.h"
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#ifdef RX_HAVE_PCRE2
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#endif

enum { MAX_STEPS = 8, CACHE_MAX_PIECE = 64, CACHE_SLOTS = 1 << 16, SCAN_MAX = 48 };

/* The GPT-2 split that a ByteLevel pre-tokenizer with use_regex=true applies. */
static const char GPT2_PATTERN[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

typedef enum { STEP_SPLIT, STEP_BYTELEVEL } step_kind;
typedef enum { SPLIT_ISOLATED, SPLIT_REMOVED, SPLIT_MERGED_PREV, SPLIT_MERGED_NEXT } split_behavior;

typedef struct {
  step_kind kind;
  split_behavior behavior;
  int add_prefix_space;
#ifdef RX_HAVE_PCRE2
  pcre2_code *re;
  pcre2_match_data *md;
  int jit;
#else
  void *re;
#endif
} pre_step;

typedef struct {
  char *content;
  int32_t len, id;
  int lstrip, rstrip, special;
} added_token;

/* Open-addressing set of ids keyed by a byte string owned by the id (raw or display form). */
typedef struct { uint32_t *hash; int32_t *id; int64_t mask; } strmap;

typedef struct { uint64_t *key; int32_t *rank, *result; int64_t mask; } pairmap;

typedef struct {
  uint32_t *hash;        /* 0: empty */
  int32_t *key_off, *key_len, *ids_off, *ids_len;
  rx_bytes keys;
  int32_t *ids;
  int64_t nids, ids_cap, count;
} piece_cache;

struct rx_tokenizer {
  char *path;
  int32_t vocab_size;
  /* per id: raw bytes (what it decodes to) and display string (as written in the file) */
  int64_t *raw_off, *disp_off;
  int32_t *raw_len, *disp_len;
  rx_bytes raw, disp;
  uint8_t *kind;         /* 0 none, 1 vocab, 2 added, 3 added special */
  strmap by_raw, by_disp;
  pairmap merges;
  int32_t byte_id[256];
  added_token *added;
  int32_t n_added;
  int32_t first_added[257];  /* added tokens sorted by first byte, then length descending */
  int nfc, ignore_merges;
  pre_step steps[MAX_STEPS];
  int n_steps;
  int32_t *tmpl_before, *tmpl_after;  /* TemplateProcessing "single" around the text */
  int32_t n_before, n_after;
  char *role[4];         /* eos, pad, bos, unk token names from tokenizer_config.json */
  char *chat_template;
  piece_cache cache;
  /* scratch */
  rx_bytes norm, work;
  int32_t *ids;
  int64_t nids, ids_cap;
  int64_t *pieces;       /* (offset, length) pairs */
  int64_t npieces, pieces_cap;
  int32_t *sym, *prev, *next, *rank;
  int64_t sym_cap;
  int32_t *heap;
  int64_t heap_cap;
};

/* ---------------------------------------------------------------- small helpers */

static uint32_t hash_bytes(const uint8_t *s, int64_t n) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (int64_t i = 0; i < n; i++) h = (h ^ s[i]) * 0x100000001b3ull;
  uint32_t r = (uint32_t)(h ^ (h >> 32));
  return r ? r : 1;
}

static uint64_t mix64(uint64_t x) {
  x ^= x >> 33; x *= 0xff51afd7ed558ccdull; x ^= x >> 33; x *= 0xc4ceb9fe1a85ec53ull; x ^= x >> 33;
  return x;
}

static int grow(void **p, int64_t *cap, int64_t need, size_t elem) {
  if (need <= *cap) return RX_OK;
  int64_t c = *cap ? *cap : 64;
  while (c < need) c *= 2;
  void *q = realloc(*p, (size_t)c * elem);
  if (!q) return rx_fail(RX_ENOMEM, "tokenizer: out of memory (%lld elements)", (long long)c);
  *p = q;
  *cap = c;
  return RX_OK;
}

static int strmap_init(strmap *m, int64_t n) {
  int64_t cap = 16;
  while (cap < 2 * n) cap *= 2;
  m->hash = calloc((size_t)cap, sizeof *m->hash);
  m->id = malloc((size_t)cap * sizeof *m->id);
  m->mask = cap - 1;
  if (!m->hash || !m->id) return rx_fail(RX_ENOMEM, "tokenizer: out of memory for a %lld-slot table", (long long)cap);
  return RX_OK;
}

static int32_t strmap_find(const strmap *m, const rx_bytes *data, const int64_t *off, const int32_t *len,
                           const uint8_t *s, int64_t n, uint32_t h) {
  for (int64_t i = h & m->mask;; i = (i + 1) & m->mask) {
    if (!m->hash[i]) return -1;
    int32_t id = m->id[i];
    if (m->hash[i] == h && len[id] == n && memcmp(data->p + off[id], s, (size_t)n) == 0) return id;
  }
}

/* Inserts id (whose key is already stored); a key seen before keeps its first id. */
static void strmap_put(strmap *m, const rx_bytes *data, const int64_t *off, const int32_t *len, int32_t id) {
  const uint8_t *s = data->p + off[id];
  uint32_t h = hash_bytes(s, len[id]);
  if (strmap_find(m, data, off, len, s, len[id], h) >= 0) return;
  int64_t i = h & m->mask;
  while (m->hash[i]) i = (i + 1) & m->mask;
  m->hash[i] = h;
  m->id[i] = id;
}

static int pairmap_init(pairmap *m, int64_t n) {
  int64_t cap = 16;
  while (cap < 2 * n) cap *= 2;
  m->key = malloc((size_t)cap * sizeof *m->key);
  m->rank = malloc((size_t)cap * sizeof *m->rank);
  m->result = malloc((size_t)cap * sizeof *m->result);
  m->mask = cap - 1;
  if (!m->key || !m->rank || !m->result) return rx_fail(RX_ENOMEM, "tokenizer: out of memory for merges");
  memset(m->key, 0xff, (size_t)cap * sizeof *m->key);
  return RX_OK;
}

static inline int64_t pairmap_slot(const pairmap *m, uint64_t key) {
  int64_t i = (int64_t)(mix64(key) & (uint64_t)m->mask);
  while (m->key[i] != UINT64_MAX && m->key[i] != key) i = (i + 1) & m->mask;
  return i;
}

/* Rank of merging (a, b) (INT32_MAX when they do not merge), and the merged id. */
static inline int32_t merge_rank(const rx_tokenizer *t, int32_t a, int32_t b, int32_t *result) {
  uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
  int64_t i = pairmap_slot(&t->merges, key);
  if (t->merges.key[i] == UINT64_MAX) return INT32_MAX;
  *result = t->merges.result[i];
  return t->merges.rank[i];
}

/* GPT-2's byte <-> unicode table: printable bytes stand for themselves, the other 68 bytes
 * take code points 256, 257, ... in byte order. */
static void byte_unicode_table(uint32_t byte_to_cp[256]) {
  int k = 0;
  for (int b = 0; b < 256; b++) {
    int printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
    byte_to_cp[b] = printable ? (uint32_t)b : (uint32_t)(256 + k++);
  }
}

/* cp -> byte for the byte-level alphabet (cp < 324), else -1. */
static int cp_to_byte(const int16_t *inv, uint32_t cp) { return cp < 324 ? inv[cp] : -1; }

/* JavaScript's String.prototype.trim whitespace, which the reference applies for lstrip/rstrip. */
static int is_js_space(uint32_t c) {
  return c == 9 || c == 10 || c == 11 || c == 12 || c == 13 || c == 32 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000 || c == 0xFEFF;
}

static char *dup_str(const char *s, size_t n) {
  char *d = malloc(n + 1);
  if (d) { memcpy(d, s, n); d[n] = 0; }
  return d;
}

static int read_whole(const char *path, char **text, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return rx_fail(RX_EIO, "%s: cannot open: %s", path, strerror(errno));
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *buf = malloc((size_t)(n > 0 ? n : 0) + 1);
  if (!buf) { fclose(f); return rx_fail(RX_ENOMEM, "%s: out of memory for %ld bytes", path, n); }
  size_t got = fread(buf, 1, (size_t)(n > 0 ? n : 0), f);
  fclose(f);
  if ((long)got != n) { free(buf); return rx_fail(RX_EIO, "%s: short read", path); }
  buf[got] = 0;
  *text = buf;
  *len = got;
  return RX_OK;
}

static rx_json_doc *parse_file(const char *path, int *rc) {
  char *text = NULL;
  size_t len = 0;
  *rc = read_whole(path, &text, &len);
  if (*rc) return NULL;
  char err[256] = "";
  rx_json_doc *doc = rx_json_parse(text, len, err, sizeof err);
  free(text);
  if (!doc) *rc = rx_fail(RX_EFORMAT, "%s: bad JSON: %s", path, err);
  return doc;
}

static const char *type_of(const rx_json *node) {
  const rx_json *ty = node ? rx_json_get(node, "type") : NULL;
  return ty && ty->kind == RX_JSON_STRING ? ty->str : NULL;
}

static int flag(const rx_json *obj, const char *key, int dflt) {
  const rx_json *v = rx_json_get(obj, key);
  return v && v->kind == RX_JSON_BOOL ? v->boolean : dflt;
}

/* ---------------------------------------------------------------- loading */

#ifdef RX_HAVE_PCRE2
/* Hugging Face tokenizers run the file's regex with Oniguruma, whose \s (Unicode) is U+0009-U+000D,
 * U+0085 and the separators Zs, Zl, Zp. PCRE2's \s (UCP) also takes U+180E (Mongolian vowel
 * separator, a format character since Unicode 6.3), so text with U+180E next to spaces would split
 * differently. pattern with every \s and \S written as Oniguruma's set: outside a class as a class
 * of its own, inside one (\s only) as its members. *out is malloc'ed. */
static const char ONIG_SPACE[] = "\\t-\\r\\x{85}\\p{Z}";
static int onig_spaces(const char *pattern, size_t plen, char **out, size_t *outlen) {
  size_t cap = plen * 4 + 64, n = 0, add = sizeof ONIG_SPACE + 3;
  char *o = malloc(cap);
  if (!o) return -1;
  int in_class = 0;
  for (size_t i = 0; i < plen; i++) {
    if (n + add + 2 > cap) {
      char *bigger = realloc(o, cap * 2);
      if (!bigger) { free(o); return -1; }
      o = bigger;
      cap *= 2;
    }
    char c = pattern[i];
    if (c == '\\' && i + 1 < plen) {
      char e = pattern[i + 1];
      if (e == 's' || (e == 'S' && !in_class)) {
        n += (size_t)sprintf(o + n, in_class ? "%s" : (e == 's' ? "[%s]" : "[^%s]"), ONIG_SPACE);
      } else {
        o[n++] = c;
        o[n++] = e;
      }
      i++;
      continue;
    }
    if (!in_class && c == '[') {   /* a ']' right after '[' or '[^' is a member */
      in_class = 1;
      o[n++] = c;
      if (i + 1 < plen && pattern[i + 1] == '^') o[n++] = pattern[++i];
      if (i + 1 < plen && pattern[i + 1] == ']') o[n++] = pattern[++i];
      continue;
    }
    if (in_class && c == '[' && i + 1 < plen && pattern[i + 1] == ':') {   /* [:alpha:] */
      size_t upto = i + 2;
      while (upto + 1 < plen && !(pattern[upto] == ':' && pattern[upto + 1] == ']')) upto++;
      upto = upto + 1 < plen ? upto + 2 : plen;
      while (i < upto) {
        if (n + 2 > cap) {
          char *bigger = realloc(o, cap * 2);
          if (!bigger) { free(o); return -1; }
          o = bigger;
          cap *= 2;
        }
        o[n++] = pattern[i++];
      }
      i--;
      continue;
    }
    if (in_class && c == ']') in_class = 0;
    o[n++] = c;
  }
  *out = o;
  *outlen = n;
  return 0;
}
#endif

static int add_step_regex(rx_tokenizer *t, const char *where, const char *pattern, size_t plen, int literal,
                          split_behavior behavior) {
  if (t->n_steps == MAX_STEPS) return rx_fail(RX_EFORMAT, "%s: %s: more than %d pre-tokenizer steps", t->path, where, MAX_STEPS);
  pre_step *s = &t->steps[t->n_steps];
  memset(s, 0, sizeof *s);
  s->kind = STEP_SPLIT;
  s->behavior = behavior;
#ifdef RX_HAVE_PCRE2
  int errcode;
  PCRE2_SIZE erroff;
  uint32_t opts = PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF | (literal ? PCRE2_LITERAL : 0);
  char *onig = NULL;
  size_t onig_len = plen;
  if (!literal && onig_spaces(pattern, plen, &onig, &onig_len)) return rx_fail(RX_ENOMEM, "%s: out of memory for the regex", t->path);
  s->re = pcre2_compile((PCRE2_SPTR)(onig ? onig : pattern), onig_len, opts, &errcode, &erroff, NULL);
  free(onig);
  if (!s->re) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(errcode, msg, sizeof msg);
    return rx_fail(RX_EFORMAT, "%s: %s: regex does not compile at offset %zu: %s", t->path, where, (size_t)erroff, (char *)msg);
  }
  s->jit = pcre2_jit_compile(s->re, PCRE2_JIT_COMPLETE) == 0;
  s->md = pcre2_match_data_create_from_pattern(s->re, NULL);
  if (!s->md) return rx_fail(RX_ENOMEM, "%s: out of memory for regex match data", t->path);
  t->n_steps++;
  return RX_OK;
#else
  (void)pattern; (void)plen; (void)literal;
  return rx_fail(RX_EFORMAT, "%s: %s: this libremax was built without PCRE2, which the Split pre-tokenizer needs", t->path, where);
#endif
}

/* The members of a Sequence (pre-tokenizers, normalizers, decoders, post-processors): each element
 * of seq[key] goes to load as "where.key[i]", the first error stops. A missing or non-array list
 * is an error when required, else has no members. */
typedef int (*load_member_fn)(rx_tokenizer *t, const rx_json *member, const char *where);
static int load_members(rx_tokenizer *t, const rx_json *seq, const char *key, const char *where, int required,
                        load_member_fn load) {
  const rx_json *list = rx_json_get(seq, key);
  if (required && (!list || list->kind != RX_JSON_ARRAY))
    return rx_fail(RX_EFORMAT, "%s: %s.%s: missing or not an array", t->path, where, key);
  char sub[160];
  int i = 0;
  for (const rx_json *c = list ? list->child : NULL; c; c = c->next, i++) {
    snprintf(sub, sizeof sub, "%s.%s[%d]", where, key, i);
    int rc = load(t, c, sub);
    if (rc) return rc;
  }
  return RX_OK;
}

static int load_pre_tokenizer(rx_tokenizer *t, const rx_json *pt, const char *where) {
  const char *ty = type_of(pt);
  if (!ty) return rx_fail(RX_EFORMAT, "%s: %s: missing \"type\"", t->path, where);
  if (!strcmp(ty, "Sequence")) return load_members(t, pt, "pretokenizers", where, 1, load_pre_tokenizer);
  if (!strcmp(ty, "Split")) {
    const rx_json *pat = rx_json_get(pt, "pattern");
    const rx_json *re = pat ? rx_json_get(pat, "Regex") : NULL, *lit = pat ? rx_json_get(pat, "String") : NULL;
    const rx_json *src = re ? re : lit;
    if (!src || src->kind != RX_JSON_STRING)
      return rx_fail(RX_EFORMAT, "%s: %s.pattern: needs {\"Regex\": ...} or {\"String\": ...}", t->path, where);
    if (flag(pt, "invert", 0)) return rx_fail(RX_EFORMAT, "%s: %s: Split with invert=true is not supported", t->path, where);
    const rx_json *b = rx_json_get(pt, "behavior");
    const char *bs = b && b->kind == RX_JSON_STRING ? b->str : "Isolated";
    split_behavior beh;
    if (!strcmp(bs, "Isolated")) beh = SPLIT_ISOLATED;
    else if (!strcmp(bs, "Removed")) beh = SPLIT_REMOVED;
    else if (!strcmp(bs, "MergedWithPrevious")) beh = SPLIT_MERGED_PREV;
    else if (!strcmp(bs, "MergedWithNext")) beh = SPLIT_MERGED_NEXT;
    else return rx_fail(RX_EFORMAT, "%s: %s.behavior \"%s\" is not supported (Isolated, Removed, MergedWithPrevious, MergedWithNext)", t->path, where, bs);
    char sub[160];
    snprintf(sub, sizeof sub, "%s.pattern", where);
    return add_step_regex(t, sub, src->str, src->len, src == lit, beh);
  }
  if (!strcmp(ty, "ByteLevel")) {
    int add_prefix = flag(pt, "add_prefix_space", 0), use_regex = flag(pt, "use_regex", 1);
    if (use_regex) {
      int rc = add_step_regex(t, where, GPT2_PATTERN, strlen(GPT2_PATTERN), 0, SPLIT_ISOLATED);
      if (rc) return rc;
      if (add_prefix) {   /* the space goes in before the regex split: swap the two steps */
        if (t->n_steps == MAX_STEPS) return rx_fail(RX_EFORMAT, "%s: %s: too many pre-tokenizer steps", t->path, where);
        t->steps[t->n_steps] = t->steps[t->n_steps - 1];
        pre_step *s = &t->steps[t->n_steps - 1];
        memset(s, 0, sizeof *s);
        s->kind = STEP_BYTELEVEL;
        s->add_prefix_space = 1;
        t->n_steps++;
      }
    } else if (add_prefix) {
      if (t->n_steps == MAX_STEPS) return rx_fail(RX_EFORMAT, "%s: %s: too many pre-tokenizer steps", t->path, where);
      pre_step *s = &t->steps[t->n_steps++];
      memset(s, 0, sizeof *s);
      s->kind = STEP_BYTELEVEL;
      s->add_prefix_space = 1;
    }
    return RX_OK;
  }
  return rx_fail(RX_EFORMAT, "%s: %s: pre-tokenizer type \"%s\" is not supported (remax reads byte-level BPE: Split, ByteLevel, Sequence)",
                 t->path, where, ty);
}

static int pre_tokenizer_has_bytelevel(const rx_json *pt) {
  const char *ty = type_of(pt);
  if (!ty) return 0;
  if (!strcmp(ty, "ByteLevel")) return 1;
  if (!strcmp(ty, "Sequence")) {
    const rx_json *list = rx_json_get(pt, "pretokenizers");
    for (const rx_json *c = list ? list->child : NULL; c; c = c->next)
      if (pre_tokenizer_has_bytelevel(c)) return 1;
  }
  return 0;
}

static int load_normalizer(rx_tokenizer *t, const rx_json *n, const char *where) {
  if (!n || n->kind == RX_JSON_NULL) return RX_OK;
  const char *ty = type_of(n);
  if (!ty) return rx_fail(RX_EFORMAT, "%s: %s: missing \"type\"", t->path, where);
  if (!strcmp(ty, "NFC")) { t->nfc = 1; return RX_OK; }
  if (!strcmp(ty, "Sequence")) return load_members(t, n, "normalizers", where, 1, load_normalizer);
  return rx_fail(RX_EFORMAT, "%s: %s: normalizer type \"%s\" is not supported (NFC or Sequence of NFC)", t->path, where, ty);
}

static int check_decoder(rx_tokenizer *t, const rx_json *d, const char *where) {
  const char *ty = type_of(d);
  if (!ty) return rx_fail(RX_EFORMAT, "%s: %s: missing (byte-level BPE needs a ByteLevel decoder)", t->path, where);
  if (!strcmp(ty, "ByteLevel")) return RX_OK;
  if (!strcmp(ty, "Sequence")) return load_members(t, d, "decoders", where, 0, check_decoder);
  return rx_fail(RX_EFORMAT, "%s: %s: decoder type \"%s\" is not supported (ByteLevel)", t->path, where, ty);
}

/* Appends the display string s to disp and its byte-level decoding to raw for one id;
 * *in_alphabet says whether s was made of byte-level characters only. */
static int store_token(rx_tokenizer *t, const int16_t *inv, int32_t id, const char *s, size_t n, int literal,
                       int *in_alphabet_out) {
  int rc;
  /* raw gets a byte more than it needs, so that its buffer exists even when the first tokens are
   * empty strings (a NULL base plus an offset is undefined behaviour) */
  if ((rc = rx_bytes_reserve(&t->disp, (int64_t)n + 1)) || (rc = rx_bytes_reserve(&t->raw, (int64_t)n + 1))) return rc;
  t->disp_off[id] = t->disp.n;
  t->disp_len[id] = (int32_t)n;
  memcpy(t->disp.p + t->disp.n, s, n);
  t->disp.n += (int64_t)n;
  t->disp.p[t->disp.n++] = 0;
  /* byte-level string -> bytes; a token with a character outside the 256-char alphabet decodes
   * to its own UTF-8 (as the reference decoders do) and can never be produced by BPE. */
  int64_t start = t->raw.n;
  int in_alphabet = !literal;
  for (size_t i = 0; i < n && in_alphabet;) {
    uint32_t cp;
    i += (size_t)rx_utf8_decode((const uint8_t *)s + i, (int64_t)(n - i), &cp);
    int b = cp_to_byte(inv, cp);
    if (b < 0) in_alphabet = 0;
    else t->raw.p[t->raw.n++] = (uint8_t)b;
  }
  if (!in_alphabet) {
    t->raw.n = start;
    memcpy(t->raw.p + start, s, n);
    t->raw.n += (int64_t)n;
  }
  t->raw_off[id] = start;
  t->raw_len[id] = (int32_t)(t->raw.n - start);
  *in_alphabet_out = in_alphabet;
  return RX_OK;
}

static const char *role_keys[4] = {"eos_token", "pad_token", "bos_token", "unk_token"};

static int load_config(rx_tokenizer *t, const char *cfg_path) {
  int rc;
  rx_json_doc *doc = parse_file(cfg_path, &rc);
  if (!doc) return rc;
  const rx_json *root = rx_json_root(doc);
  for (int r = 0; r < 4 && root->kind == RX_JSON_OBJECT; r++) {
    const rx_json *v = rx_json_get(root, role_keys[r]);
    if (v && v->kind == RX_JSON_OBJECT) v = rx_json_get(v, "content");   /* {"__type": "AddedToken", ...} */
    if (v && v->kind == RX_JSON_STRING) t->role[r] = dup_str(v->str, v->len);
  }
  const rx_json *ct = root->kind == RX_JSON_OBJECT ? rx_json_get(root, "chat_template") : NULL;
  if (ct && ct->kind == RX_JSON_ARRAY) {   /* [{"name": "default", "template": ...}, ...] */
    const rx_json *list = ct;
    for (const rx_json *c = list->child; c; c = c->next) {
      const rx_json *name = c->kind == RX_JSON_OBJECT ? rx_json_get(c, "name") : NULL;
      const rx_json *tpl = c->kind == RX_JSON_OBJECT ? rx_json_get(c, "template") : NULL;
      if (name && name->kind == RX_JSON_STRING && !strcmp(name->str, "default") && tpl && tpl->kind == RX_JSON_STRING) ct = tpl;
    }
    if (ct == list) ct = NULL;   /* no "default" template: as transformers, none unless one is named (chat_template setting) */
  } else if (ct && ct->kind != RX_JSON_STRING && ct->kind != RX_JSON_NULL) {
    /* transformers would fail on it when rendering; say so now, naming the file and the key */
    rc = rx_fail(RX_EFORMAT, "%s: chat_template must be a string (a Jinja template) or a list of {\"name\", \"template\"}, got %s",
                 cfg_path, rx_json_kind_name(ct->kind));
    rx_json_free(doc);
    return rc;
  }
  if (ct && ct->kind == RX_JSON_STRING) t->chat_template = dup_str(ct->str, ct->len);
  rx_json_free(doc);
  return RX_OK;
}

static int load_template(rx_tokenizer *t, const rx_json *pp, const char *where) {
  const char *ty = type_of(pp);
  if (!ty) return RX_OK;
  if (!strcmp(ty, "Sequence")) return load_members(t, pp, "processors", where, 0, load_template);
  if (strcmp(ty, "TemplateProcessing")) return RX_OK;   /* ByteLevel, RobertaProcessing...: no ids added */
  const rx_json *single = rx_json_get(pp, "single");
  if (!single || single->kind != RX_JSON_ARRAY) return rx_fail(RX_EFORMAT, "%s: %s.single: missing or not an array", t->path, where);
  /* the buffers below are sized for one template: a second would write past them */
  if (t->tmpl_before) return rx_fail(RX_EFORMAT, "%s: %s: a second TemplateProcessing (one is supported)", t->path, where);
  t->tmpl_before = malloc((size_t)(single->count + 1) * sizeof(int32_t));
  t->tmpl_after = malloc((size_t)(single->count + 1) * sizeof(int32_t));
  if (!t->tmpl_before || !t->tmpl_after) return rx_fail(RX_ENOMEM, "%s: out of memory", t->path);
  int seen_a = 0, i = 0;
  for (const rx_json *c = single->child; c; c = c->next, i++) {
    const rx_json *sp = rx_json_get(c, "SpecialToken");
    if (!sp) { seen_a = 1; continue; }
    const rx_json *name = rx_json_get(sp, "id");
    if (!name || name->kind != RX_JSON_STRING) return rx_fail(RX_EFORMAT, "%s: %s.single[%d].SpecialToken.id: missing", t->path, where, i);
    int32_t id = rx_tokenizer_token_to_id(t, name->str, (int64_t)name->len);
    if (id < 0) return rx_fail(RX_EFORMAT, "%s: %s.single[%d]: token \"%s\" is not in the vocabulary", t->path, where, i, name->str);
    if (seen_a) t->tmpl_after[t->n_after++] = id;
    else t->tmpl_before[t->n_before++] = id;
  }
  return RX_OK;
}

static int added_cmp(const void *a, const void *b) {
  const added_token *x = a, *y = b;
  uint8_t fx = (uint8_t)x->content[0], fy = (uint8_t)y->content[0];
  if (fx != fy) return fx < fy ? -1 : 1;
  return y->len - x->len;
}

static int load_json(rx_tokenizer *t, const rx_json *root) {
  int rc;
  const char *p = t->path;
  if (root->kind != RX_JSON_OBJECT) return rx_fail(RX_EFORMAT, "%s: top level is %s, not an object", p, rx_json_kind_name(root->kind));
  const rx_json *model = rx_json_get(root, "model");
  if (!model || model->kind != RX_JSON_OBJECT) return rx_fail(RX_EFORMAT, "%s: missing \"model\" object", p);
  const char *mty = type_of(model);
  const rx_json *vocab = rx_json_get(model, "vocab"), *merges = rx_json_get(model, "merges");
  if (mty && strcmp(mty, "BPE"))
    return rx_fail(RX_EFORMAT, "%s: model.type \"%s\" is not supported (remax reads byte-level BPE tokenizers)", p, mty);
  if (!mty && !merges) return rx_fail(RX_EFORMAT, "%s: model has no \"type\" and no \"merges\": not a BPE model", p);
  if (!vocab || vocab->kind != RX_JSON_OBJECT) return rx_fail(RX_EFORMAT, "%s: model.vocab: missing or not an object", p);
  if (!merges || merges->kind != RX_JSON_ARRAY) return rx_fail(RX_EFORMAT, "%s: model.merges: missing or not an array", p);
  if (flag(model, "byte_fallback", 0)) return rx_fail(RX_EFORMAT, "%s: model.byte_fallback=true is not supported (SentencePiece-style BPE)", p);
  const char *affix[2] = {"continuing_subword_prefix", "end_of_word_suffix"};
  for (int k = 0; k < 2; k++) {
    const rx_json *v = rx_json_get(model, affix[k]);
    if (v && v->kind == RX_JSON_STRING && v->len) return rx_fail(RX_EFORMAT, "%s: model.%s \"%s\" is not supported", p, affix[k], v->str);
  }
  const rx_json *dropout = rx_json_get(model, "dropout");
  if (dropout && dropout->kind == RX_JSON_NUMBER && dropout->number > 0)
    return rx_fail(RX_EFORMAT, "%s: model.dropout %g is not supported (deterministic encoding only)", p, dropout->number);
  t->ignore_merges = flag(model, "ignore_merges", 0);

  const rx_json *pt = rx_json_get(root, "pre_tokenizer");
  if (!pt || pt->kind == RX_JSON_NULL || !pre_tokenizer_has_bytelevel(pt)) {
    const char *ty = type_of(pt);
    return rx_fail(RX_EFORMAT, "%s: pre_tokenizer %s%s%s: byte-level BPE needs a ByteLevel pre-tokenizer", p,
                   ty ? "type \"" : "is missing", ty ? ty : "", ty ? "\" has no ByteLevel step" : "");
  }
  if ((rc = load_pre_tokenizer(t, pt, "pre_tokenizer"))) return rc;
  if ((rc = load_normalizer(t, rx_json_get(root, "normalizer"), "normalizer"))) return rc;
  if ((rc = check_decoder(t, rx_json_get(root, "decoder"), "decoder"))) return rc;

  /* ids */
  const rx_json *added = rx_json_get(root, "added_tokens");
  if (added && added->kind != RX_JSON_ARRAY && added->kind != RX_JSON_NULL)
    return rx_fail(RX_EFORMAT, "%s: added_tokens: not an array", p);
  int64_t max_id = -1;
  for (const rx_json *v = vocab->child; v; v = v->next) {
    if (v->kind != RX_JSON_NUMBER || !v->is_integer || v->integer < 0 || v->integer >= (1 << 26))
      return rx_fail(RX_EFORMAT, "%s: model.vocab[\"%s\"]: id must be an integer in 0..2^26", p, v->key);
    if (v->integer > max_id) max_id = v->integer;
  }
  int i = 0;
  for (const rx_json *a = added ? added->child : NULL; a; a = a->next, i++) {
    const rx_json *id = rx_json_get(a, "id"), *content = rx_json_get(a, "content");
    if (!id || id->kind != RX_JSON_NUMBER || !id->is_integer || id->integer < 0 || id->integer >= (1 << 26))
      return rx_fail(RX_EFORMAT, "%s: added_tokens[%d].id: missing or not an integer in 0..2^26", p, i);
    if (!content || content->kind != RX_JSON_STRING || content->len == 0)
      return rx_fail(RX_EFORMAT, "%s: added_tokens[%d].content: missing or empty", p, i);
    if (id->integer > max_id) max_id = id->integer;
  }
  if (max_id < 0) return rx_fail(RX_EFORMAT, "%s: model.vocab is empty", p);
  int32_t n = (int32_t)max_id + 1;
  t->vocab_size = n;
  t->raw_off = calloc((size_t)n, sizeof *t->raw_off);
  t->disp_off = calloc((size_t)n, sizeof *t->disp_off);
  t->raw_len = calloc((size_t)n, sizeof *t->raw_len);
  t->disp_len = calloc((size_t)n, sizeof *t->disp_len);
  t->kind = calloc((size_t)n, 1);
  if (!t->raw_off || !t->disp_off || !t->raw_len || !t->disp_len || !t->kind) return rx_fail(RX_ENOMEM, "%s: out of memory", p);
  /* both tables are sized by the entries the file holds, not by the highest id (a file may
   * leave gaps: one token with id 2^26 - 1 must not cost a 2^27-slot table) */
  if ((rc = strmap_init(&t->by_raw, vocab->count)) ||
      (rc = strmap_init(&t->by_disp, vocab->count + (added ? added->count : 0))))
    return rc;

  uint32_t byte_to_cp[256];
  int16_t inv[324];
  byte_unicode_table(byte_to_cp);
  for (int k = 0; k < 324; k++) inv[k] = -1;
  for (int b = 0; b < 256; b++) inv[byte_to_cp[b]] = (int16_t)b;

  for (const rx_json *v = vocab->child; v; v = v->next) {
    int32_t id = (int32_t)v->integer;
    int in_alphabet;
    /* one id, two strings: encoding one would decode to the other */
    if (t->kind[id])
      return rx_fail(RX_EFORMAT, "%s: model.vocab: \"%s\" and \"%s\" both have id %d", p, t->disp.p + t->disp_off[id], v->key, id);
    if ((rc = store_token(t, inv, id, v->key, v->key_len, 0, &in_alphabet))) return rc;
    t->kind[id] = 1;
    if (in_alphabet) strmap_put(&t->by_raw, &t->raw, t->raw_off, t->raw_len, id);
  }
  /* added tokens override the vocab's string for their id */
  t->n_added = added ? (int32_t)added->count : 0;
  t->added = calloc((size_t)t->n_added + 1, sizeof *t->added);
  if (!t->added) return rx_fail(RX_ENOMEM, "%s: out of memory", p);
  i = 0;
  for (const rx_json *a = added ? added->child : NULL; a; a = a->next, i++) {
    const rx_json *content = rx_json_get(a, "content");
    added_token *at = &t->added[i];
    at->id = (int32_t)rx_json_get(a, "id")->integer;
    if (t->kind[at->id] >= 2 && (t->disp_len[at->id] != (int32_t)content->len ||
                                 memcmp(t->disp.p + t->disp_off[at->id], content->str, content->len) != 0))
      return rx_fail(RX_EFORMAT, "%s: added_tokens[%d]: \"%s\" has id %d, which an earlier added token (\"%s\") has", p, i,
                     content->str, at->id, t->disp.p + t->disp_off[at->id]);
    at->content = dup_str(content->str, content->len);
    if (!at->content) return rx_fail(RX_ENOMEM, "%s: out of memory", p);
    at->len = (int32_t)content->len;
    at->lstrip = flag(a, "lstrip", 0);
    at->rstrip = flag(a, "rstrip", 0);
    at->special = flag(a, "special", 0);
    int in_alphabet;
    if ((rc = store_token(t, inv, at->id, content->str, content->len, 1, &in_alphabet))) return rc;
    t->kind[at->id] = at->special ? 3 : 2;
  }
  qsort(t->added, (size_t)t->n_added, sizeof *t->added, added_cmp);
  for (int b = 0, k = 0; b <= 256; b++) {
    while (k < t->n_added && (uint8_t)t->added[k].content[0] < b) k++;
    t->first_added[b] = k;
  }
  for (int32_t id = 0; id < n; id++)
    if (t->kind[id]) strmap_put(&t->by_disp, &t->disp, t->disp_off, t->disp_len, id);

  for (int b = 0; b < 256; b++) {
    uint8_t c = (uint8_t)b;
    t->byte_id[b] = strmap_find(&t->by_raw, &t->raw, t->raw_off, t->raw_len, &c, 1, hash_bytes(&c, 1));
  }

  /* merges: "a b" strings or ["a", "b"] pairs -> (id a, id b) -> (rank, id of a+b) */
  if ((rc = pairmap_init(&t->merges, merges->count))) return rc;
  char *joined = NULL;
  size_t joined_cap = 0;
  int32_t rank = 0;
  rc = RX_OK;
  for (const rx_json *m = merges->child; m && !rc; m = m->next, rank++) {
    const char *a, *b;
    size_t la, lb;
    if (m->kind == RX_JSON_STRING) {
      const char *sp = memchr(m->str, ' ', m->len);
      if (!sp || memchr(sp + 1, ' ', m->len - (size_t)(sp + 1 - m->str))) {
        rc = rx_fail(RX_EFORMAT, "%s: model.merges[%d] \"%s\": needs exactly one space", p, rank, m->str);
        break;
      }
      a = m->str; la = (size_t)(sp - m->str); b = sp + 1; lb = m->len - la - 1;
    } else if (m->kind == RX_JSON_ARRAY && m->count == 2 && m->child->kind == RX_JSON_STRING &&
               m->child->next->kind == RX_JSON_STRING) {
      a = m->child->str; la = m->child->len; b = m->child->next->str; lb = m->child->next->len;
    } else {
      rc = rx_fail(RX_EFORMAT, "%s: model.merges[%d]: not a \"a b\" string or an [\"a\", \"b\"] pair", p, rank);
      break;
    }
    if (la + lb + 1 > joined_cap) {
      joined_cap = 2 * (la + lb + 1);
      char *q = realloc(joined, joined_cap);
      if (!q) { rc = rx_fail(RX_ENOMEM, "%s: out of memory", p); break; }
      joined = q;
    }
    memcpy(joined, a, la);
    memcpy(joined + la, b, lb);
    joined[la + lb] = 0;
    int32_t ia = rx_tokenizer_token_to_id(t, a, (int64_t)la), ib = rx_tokenizer_token_to_id(t, b, (int64_t)lb);
    int32_t ir = rx_tokenizer_token_to_id(t, joined, (int64_t)(la + lb));
    if (ia < 0 || ib < 0 || ir < 0) {
      const char *what = ia < 0 ? a : ib < 0 ? b : joined;
      int wl = (int)(ia < 0 ? la : ib < 0 ? lb : la + lb);
      rc = rx_fail(RX_EFORMAT, "%s: model.merges[%d] (\"%.*s\" + \"%.*s\"): token \"%.*s\" is not in model.vocab", p, rank,
                   (int)la, a, (int)lb, b, wl, what);
      break;
    }
    uint64_t key = ((uint64_t)(uint32_t)ia << 32) | (uint32_t)ib;
    int64_t slot = pairmap_slot(&t->merges, key);
    if (t->merges.key[slot] == UINT64_MAX) {   /* a repeated merge keeps its first (best) rank */
      t->merges.key[slot] = key;
      t->merges.rank[slot] = rank;
      t->merges.result[slot] = ir;
    }
  }
  free(joined);
  if (rc) return rc;
  const rx_json *pp = rx_json_get(root, "post_processor");
  if (pp && pp->kind == RX_JSON_OBJECT && (rc = load_template(t, pp, "post_processor"))) return rc;

  t->cache.hash = calloc(CACHE_SLOTS, sizeof *t->cache.hash);
  t->cache.key_off = malloc(CACHE_SLOTS * sizeof(int32_t));
  t->cache.key_len = malloc(CACHE_SLOTS * sizeof(int32_t));
  t->cache.ids_off = malloc(CACHE_SLOTS * sizeof(int32_t));
  t->cache.ids_len = malloc(CACHE_SLOTS * sizeof(int32_t));
  if (!t->cache.hash || !t->cache.key_off || !t->cache.key_len || !t->cache.ids_off || !t->cache.ids_len)
    return rx_fail(RX_ENOMEM, "%s: out of memory for the cache", p);
  return RX_OK;
}

int rx_tokenizer_load(rx_tokenizer **out, const char *path) {
  if (!out || !path) return rx_fail(RX_EINVAL, "rx_tokenizer_load: NULL argument");
  *out = NULL;
  struct stat st;
  if (stat(path, &st) != 0) return rx_fail(RX_EIO, "%s: %s", path, strerror(errno));
  size_t pl = strlen(path);
  char *file = malloc(pl + 32), *cfg = malloc(pl + 32);
  if (!file || !cfg) { free(file); free(cfg); return rx_fail(RX_ENOMEM, "%s: out of memory", path); }
  if (S_ISDIR(st.st_mode)) {
    snprintf(file, pl + 32, "%s/tokenizer.json", path);
    snprintf(cfg, pl + 32, "%s/tokenizer_config.json", path);
  } else {
    snprintf(file, pl + 32, "%s", path);
    const char *slash = strrchr(path, '/');
    if (slash) snprintf(cfg, pl + 32, "%.*s/tokenizer_config.json", (int)(slash - path), path);
    else snprintf(cfg, pl + 32, "tokenizer_config.json");
  }
  rx_tokenizer *t = calloc(1, sizeof *t);
  if (!t) { free(file); free(cfg); return rx_fail(RX_ENOMEM, "%s: out of memory", path); }
  t->path = file;
  int rc;
  rx_json_doc *doc = parse_file(file, &rc);
  if (doc) {
    rc = load_json(t, rx_json_root(doc));
    rx_json_free(doc);
  }
  if (!rc && stat(cfg, &st) == 0) rc = load_config(t, cfg);
  free(cfg);
  if (rc) { rx_tokenizer_free(t); return rc; }
  *out = t;
  return RX_OK;
}

void rx_tokenizer_free(rx_tokenizer *t) {
  if (!t) return;
  for (int i = 0; i < t->n_steps; i++) {
#ifdef RX_HAVE_PCRE2
    if (t->steps[i].md) pcre2_match_data_free(t->steps[i].md);
    if (t->steps[i].re) pcre2_code_free(t->steps[i].re);
#endif
  }
  for (int i = 0; i < t->n_added; i++) free(t->added[i].content);
  free(t->added);
  free(t->raw_off); free(t->disp_off); free(t->raw_len); free(t->disp_len); free(t->kind);
  rx_bytes_free(&t->raw); rx_bytes_free(&t->disp);
  free(t->by_raw.hash); free(t->by_raw.id); free(t->by_disp.hash); free(t->by_disp.id);
  free(t->merges.key); free(t->merges.rank); free(t->merges.result);
  free(t->tmpl_before); free(t->tmpl_after);
  for (int r = 0; r < 4; r++) free(t->role[r]);
  free(t->chat_template);
  free(t->cache.hash); free(t->cache.key_off); free(t->cache.key_len); free(t->cache.ids_off); free(t->cache.ids_len);
  rx_bytes_free(&t->cache.keys); free(t->cache.ids);
  rx_bytes_free(&t->norm); rx_bytes_free(&t->work);
  free(t->ids); free(t->pieces);
  free(t->sym); free(t->prev); free(t->next); free(t->rank); free(t->heap);
  free(t->path);
  free(t);
}

/* ---------------------------------------------------------------- BPE */

static int push_id(rx_tokenizer *t, int32_t id) {
  if (t->nids == t->ids_cap) {
    int rc = grow((void **)&t->ids, &t->ids_cap, t->nids + 1, sizeof *t->ids);
    if (rc) return rc;
  }
  t->ids[t->nids++] = id;
  return RX_OK;
}

/* Heap of pair candidates ordered by (rank, left position); entries are left positions,
 * their rank is t->rank[pos] at push time, and stale entries are skipped when popped. */
typedef struct { int32_t rank, pos, right, lid, rid; } cand;

static int64_t bpe_heap(rx_tokenizer *t, int64_t n) {
  int32_t *id = t->sym, *prev = t->prev, *next = t->next;
  int64_t cap = 0, hn = 0;
  cand *h = NULL;
  #define HLESS(x, y) ((x).rank < (y).rank || ((x).rank == (y).rank && (x).pos < (y).pos))
  #define HPUSH(c_) do {                                                              \
    if (hn == cap) { if (grow((void **)&h, &cap, hn + 1, sizeof *h)) { free(h); return -RX_ENOMEM; } } \
    int64_t k_ = hn++; h[k_] = (c_);                                                   \
    while (k_ > 0 && HLESS(h[k_], h[(k_ - 1) / 2])) {                                  \
      cand tmp_ = h[k_]; h[k_] = h[(k_ - 1) / 2]; h[(k_ - 1) / 2] = tmp_; k_ = (k_ - 1) / 2; \
    }                                                                                   \
  } while (0)
  for (int64_t i = 0; i + 1 < n; i++) {
    int32_t r, res;
    if ((r = merge_rank(t, id[i], id[i + 1], &res)) != INT32_MAX) {
      cand c = {r, (int32_t)i, (int32_t)(i + 1), id[i], id[i + 1]};
      HPUSH(c);
    }
  }
  while (hn > 0) {
    cand top = h[0];
    h[0] = h[--hn];
    for (int64_t k = 0;;) {   /* sift down */
      int64_t l = 2 * k + 1, r = l + 1, m = k;
      if (l < hn && HLESS(h[l], h[m])) m = l;
      if (r < hn && HLESS(h[r], h[m])) m = r;
      if (m == k) break;
      cand tmp = h[k]; h[k] = h[m]; h[m] = tmp; k = m;
    }
    int32_t p = top.pos, q = top.right;
    if (id[p] < 0 || next[p] != q || id[p] != top.lid || id[q] != top.rid) continue;   /* stale */
    int32_t res = 0;
    merge_rank(t, id[p], id[q], &res);
    id[p] = res;
    id[q] = -1;
    next[p] = next[q];
    if (next[q] >= 0) prev[next[q]] = p;
    int32_t r;
    if (prev[p] >= 0 && (r = merge_rank(t, id[prev[p]], id[p], &res)) != INT32_MAX) {
      cand c = {r, prev[p], p, id[prev[p]], id[p]};
      HPUSH(c);
    }
    if (next[p] >= 0 && (r = merge_rank(t, id[p], id[next[p]], &res)) != INT32_MAX) {
      cand c = {r, p, next[p], id[p], id[next[p]]};
      HPUSH(c);
    }
  }
  #undef HPUSH
  #undef HLESS
  free(h);
  /* compact the surviving symbols in order */
  int64_t w = 0;
  for (int32_t i = 0; i >= 0; i = next[i]) id[w++] = id[i];
  return w;
}

/* Merges the byte ids in t->sym[0..n) by rank; returns the number of symbols left. */
static int64_t bpe_merge(rx_tokenizer *t, int64_t n) {
  int32_t *id = t->sym;
  if (n > SCAN_MAX) {
    for (int64_t i = 0; i < n; i++) { t->prev[i] = (int32_t)i - 1; t->next[i] = i + 1 < n ? (int32_t)i + 1 : -1; }
    return bpe_heap(t, n);
  }
  /* short pieces: keep each adjacent pair's rank, merge the best (leftmost on ties), repeat */
  int32_t *rank = t->rank, res = 0;
  for (int64_t i = 0; i + 1 < n; i++) rank[i] = merge_rank(t, id[i], id[i + 1], &res);
  while (n > 1) {
    int64_t best = -1;
    int32_t br = INT32_MAX;
    for (int64_t i = 0; i + 1 < n; i++)
      if (rank[i] < br) { br = rank[i]; best = i; }
    if (best < 0) break;
    merge_rank(t, id[best], id[best + 1], &res);
    id[best] = res;
    memmove(id + best + 1, id + best + 2, (size_t)(n - best - 2) * sizeof *id);
    memmove(rank + best + 1, rank + best + 2, (size_t)(n > best + 2 ? n - best - 2 : 0) * sizeof *rank);
    n--;
    if (best > 0) rank[best - 1] = merge_rank(t, id[best - 1], id[best], &res);
    if (best + 1 < n) rank[best] = merge_rank(t, id[best], id[best + 1], &res);
  }
  return n;
}

static int encode_piece(rx_tokenizer *t, const uint8_t *s, int64_t n) {
  if (n == 0) return RX_OK;
  uint32_t h = hash_bytes(s, n);
  if (t->ignore_merges) {
    int32_t id = strmap_find(&t->by_raw, &t->raw, t->raw_off, t->raw_len, s, n, h);
    if (id >= 0) return push_id(t, id);
  }
  piece_cache *c = &t->cache;
  int64_t slot = -1;
  if (n <= CACHE_MAX_PIECE) {
    for (slot = h & (CACHE_SLOTS - 1); c->hash[slot]; slot = (slot + 1) & (CACHE_SLOTS - 1)) {
      if (c->hash[slot] == h && c->key_len[slot] == n && memcmp(c->keys.p + c->key_off[slot], s, (size_t)n) == 0) {
        int rc = grow((void **)&t->ids, &t->ids_cap, t->nids + c->ids_len[slot], sizeof *t->ids);
        if (rc) return rc;
        memcpy(t->ids + t->nids, c->ids + c->ids_off[slot], (size_t)c->ids_len[slot] * sizeof *t->ids);
        t->nids += c->ids_len[slot];
        return RX_OK;
      }
    }
  }
  int rc;
  if (n > t->sym_cap) {
    int64_t cap = t->sym_cap;
    if ((rc = grow((void **)&t->sym, &cap, n, sizeof *t->sym))) return rc;
    cap = t->sym_cap;
    if ((rc = grow((void **)&t->prev, &cap, n, sizeof *t->prev))) return rc;
    cap = t->sym_cap;
    if ((rc = grow((void **)&t->next, &cap, n, sizeof *t->next))) return rc;
    cap = t->sym_cap;
    if ((rc = grow((void **)&t->rank, &cap, n, sizeof *t->rank))) return rc;
    t->sym_cap = cap;
  }
  for (int64_t i = 0; i < n; i++) {
    int32_t id = t->byte_id[s[i]];
    if (id < 0) return rx_fail(RX_EINVAL, "%s: byte 0x%02X has no byte-level token in model.vocab", t->path, s[i]);
    t->sym[i] = id;
  }
  int64_t m = bpe_merge(t, n);
  if (m < 0) return (int)-m;
  if ((rc = grow((void **)&t->ids, &t->ids_cap, t->nids + m, sizeof *t->ids))) return rc;
  memcpy(t->ids + t->nids, t->sym, (size_t)m * sizeof *t->ids);
  t->nids += m;
  if (slot >= 0) {
    if (c->count * 2 >= CACHE_SLOTS) {   /* full: start over rather than evict one by one */
      memset(c->hash, 0, CACHE_SLOTS * sizeof *c->hash);
      c->count = 0;
      c->keys.n = 0;
      c->nids = 0;
      for (slot = h & (CACHE_SLOTS - 1); c->hash[slot]; slot = (slot + 1) & (CACHE_SLOTS - 1)) {}
    }
    if (rx_bytes_reserve(&c->keys, n) == RX_OK && grow((void **)&c->ids, &c->ids_cap, c->nids + m, sizeof *c->ids) == RX_OK) {
      c->hash[slot] = h;
      c->key_off[slot] = (int32_t)c->keys.n;
      c->key_len[slot] = (int32_t)n;
      memcpy(c->keys.p + c->keys.n, s, (size_t)n);
      c->keys.n += n;
      c->ids_off[slot] = (int32_t)c->nids;
      c->ids_len[slot] = (int32_t)m;
      memcpy(c->ids + c->nids, t->sym, (size_t)m * sizeof *c->ids);
      c->nids += m;
      c->count++;
    }
  }
  return RX_OK;
}

/* ---------------------------------------------------------------- pre-tokenization */

static int push_piece(rx_tokenizer *t, int64_t off, int64_t len) {
  if (len <= 0) return RX_OK;
  int rc = grow((void **)&t->pieces, &t->pieces_cap, 2 * (t->npieces + 1), sizeof *t->pieces);
  if (rc) return rc;
  t->pieces[2 * t->npieces] = off;
  t->pieces[2 * t->npieces + 1] = len;
  t->npieces++;
  return RX_OK;
}

#ifdef RX_HAVE_PCRE2
/* Splits buf[off..off+len) by the step's regex into new pieces (appended from index `from`). */
static int split_piece(rx_tokenizer *t, pre_step *st, const uint8_t *buf, int64_t off, int64_t len) {
  const uint8_t *s = buf + off;
  PCRE2_SIZE pos = 0;
  int64_t gap = 0, pending = -1;   /* pending: start of a match waiting for MergedWithNext */
  int rc;
  while (pos <= (PCRE2_SIZE)len) {
    int r = st->jit ? pcre2_jit_match(st->re, s, (PCRE2_SIZE)len, pos, 0, st->md, NULL)
                    : pcre2_match(st->re, s, (PCRE2_SIZE)len, pos, 0, st->md, NULL);
    if (r == PCRE2_ERROR_NOMATCH) break;
    if (r < 0) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(r, msg, sizeof msg);
      return rx_fail(RX_EINVAL, "%s: pre-tokenizer regex failed: %s", t->path, (char *)msg);
    }
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(st->md);
    int64_t ms = (int64_t)ov[0], me = (int64_t)ov[1];
    if (me == ms) {   /* empty match: step over one character */
      if (ms >= len) break;
      uint32_t cp;
      pos = (PCRE2_SIZE)(ms + rx_utf8_decode(s + ms, len - ms, &cp));
      continue;
    }
    switch (st->behavior) {
    case SPLIT_ISOLATED:
      if ((rc = push_piece(t, off + gap, ms - gap)) || (rc = push_piece(t, off + ms, me - ms))) return rc;
      break;
    case SPLIT_REMOVED:
      if ((rc = push_piece(t, off + gap, ms - gap))) return rc;
      break;
    case SPLIT_MERGED_PREV:
      if ((rc = push_piece(t, off + gap, me - gap))) return rc;
      break;
    case SPLIT_MERGED_NEXT:
      if (pending >= 0) { if ((rc = push_piece(t, off + pending, ms - pending))) return rc; }
      else if ((rc = push_piece(t, off + gap, ms - gap))) return rc;
      pending = ms;
      break;
    }
    gap = me;
    pos = (PCRE2_SIZE)me;
  }
  if (pending >= 0) return push_piece(t, off + pending, len - pending);
  return push_piece(t, off + gap, len - gap);
}
#endif

/* Pre-tokenizes text[0..n) into t->pieces (offsets into the returned buffer). */
static int pre_tokenize(rx_tokenizer *t, const uint8_t *text, int64_t n, const uint8_t **buf_out) {
  const uint8_t *buf = text;
  int rc;
  t->npieces = 0;
  if ((rc = push_piece(t, 0, n))) return rc;
  int64_t *tmp = NULL, tmp_n = 0;
  for (int k = 0; k < t->n_steps; k++) {
    pre_step *st = &t->steps[k];
    int64_t np = t->npieces;
    free(tmp);
    tmp = malloc((size_t)(2 * np + 1) * sizeof *tmp);
    if (!tmp) return rx_fail(RX_ENOMEM, "tokenizer: out of memory");
    memcpy(tmp, t->pieces, (size_t)(2 * np) * sizeof *tmp);
    tmp_n = np;
    t->npieces = 0;
    if (st->kind == STEP_BYTELEVEL) {   /* add_prefix_space: " " before each piece lacking one */
      rx_bytes *w = buf == t->work.p ? &t->norm : &t->work;
      w->n = 0;
      if ((rc = rx_bytes_reserve(w, n + tmp_n))) break;
      for (int64_t i = 0; i < tmp_n; i++) {
        int64_t o = tmp[2 * i], l = tmp[2 * i + 1], start = w->n;
        if (buf[o] != ' ') w->p[w->n++] = ' ';
        memcpy(w->p + w->n, buf + o, (size_t)l);
        w->n += l;
        if ((rc = push_piece(t, start, w->n - start))) break;
      }
      if (rc) break;
      buf = w->p;
      n = w->n;
      continue;
    }
#ifdef RX_HAVE_PCRE2
    for (int64_t i = 0; i < tmp_n && !rc; i++) rc = split_piece(t, st, buf, tmp[2 * i], tmp[2 * i + 1]);
#endif
    if (rc) break;
  }
  free(tmp);
  *buf_out = buf;
  return rc;
}

/* ---------------------------------------------------------------- encode */

/* NFC + pre-tokenize + BPE for one stretch of text between added tokens. */
static int encode_text(rx_tokenizer *t, const uint8_t *s, int64_t n) {
  if (n == 0) return RX_OK;
  int rc;
  if (t->nfc && !rx_nfc_quick_check(s, n)) {
    t->norm.n = 0;
    if ((rc = rx_nfc_append(&t->norm, s, n))) return rc;
    /* pre_tokenize may write into norm/work: move the normalized text to work first */
    t->work.n = 0;
    if ((rc = rx_bytes_reserve(&t->work, t->norm.n))) return rc;
    memcpy(t->work.p, t->norm.p, (size_t)t->norm.n);
    t->work.n = t->norm.n;
    s = t->work.p;
    n = t->work.n;
  }
  if (n == 0) return RX_OK;
  const uint8_t *buf = s;
  if ((rc = pre_tokenize(t, s, n, &buf))) return rc;
  for (int64_t i = 0; i < t->npieces; i++)
    if ((rc = encode_piece(t, buf + t->pieces[2 * i], t->pieces[2 * i + 1]))) return rc;
  return RX_OK;
}

/* The longest added token starting at s[0..n), or -1. */
static int32_t match_added(const rx_tokenizer *t, const uint8_t *s, int64_t n) {
  for (int32_t k = t->first_added[s[0]]; k < t->first_added[s[0] + 1]; k++) {
    const added_token *a = &t->added[k];
    if (a->len <= n && memcmp(a->content, s, (size_t)a->len) == 0) return k;   /* sorted longest first */
  }
  return -1;
}

static int64_t trim_end(const uint8_t *s, int64_t n) {
  while (n > 0) {
    int64_t k = n - 1;   /* start of the last character */
    while (k > 0 && (s[k] & 0xC0) == 0x80 && n - k < 4) k--;
    uint32_t cp;
    if (k + rx_utf8_decode(s + k, n - k, &cp) != n || !is_js_space(cp)) break;
    n = k;
  }
  return n;
}

static int64_t trim_start(const uint8_t *s, int64_t n) {
  int64_t i = 0;
  while (i < n) {
    uint32_t cp;
    int l = rx_utf8_decode(s + i, n - i, &cp);
    if (!is_js_space(cp)) break;
    i += l;
  }
  return i;
}

int rx_tokenizer_encode(rx_tokenizer *t, const char *text, int64_t len, int32_t flags, int32_t *ids, int64_t cap,
                        int64_t *n_out) {
  if (!t || (!text && len) || len < 0 || (!ids && cap > 0) || !n_out)
    return rx_fail(RX_EINVAL, "rx_tokenizer_encode: bad arguments (text %p, len %lld, ids %p, cap %lld)",
                   (const void *)text, (long long)len, (void *)ids, (long long)cap);
  const uint8_t *s = (const uint8_t *)text;
  int rc = RX_OK;
  t->nids = 0;
  int add_special = (flags & RX_TOK_ADD_SPECIAL) != 0;
  for (int32_t k = 0; add_special && k < t->n_before && !rc; k++) rc = push_id(t, t->tmpl_before[k]);
  /* split on added tokens (leftmost, longest), then strip whitespace next to lstrip/rstrip ones */
  int64_t start = 0, i = 0, skip_ws = 0;
  while (i < len && !rc) {
    int32_t k = t->n_added ? match_added(t, s + i, len - i) : -1;
    if (k < 0) { i++; continue; }
    const added_token *a = &t->added[k];
    int64_t seg = start + skip_ws, end = i;
    if (seg > end) seg = end;
    if (a->lstrip) end = seg + trim_end(s + seg, end - seg);
    if ((rc = encode_text(t, s + seg, end - seg))) break;
    if ((rc = push_id(t, a->id))) break;
    i += a->len;
    start = i;
    skip_ws = a->rstrip ? trim_start(s + i, len - i) : 0;
  }
  if (!rc) {
    int64_t seg = start + skip_ws;
    if (seg > len) seg = len;
    rc = encode_text(t, s + seg, len - seg);
  }
  for (int32_t k = 0; add_special && k < t->n_after && !rc; k++) rc = push_id(t, t->tmpl_after[k]);
  if (rc) return rx_fail_context(rc, "encode");
  *n_out = t->nids;
  if (t->nids > cap) return rx_fail(RX_EINVAL, "rx_tokenizer_encode: %lld ids do not fit in a buffer of %lld (call again with a larger one)",
                                    (long long)t->nids, (long long)cap);
  if (t->nids) memcpy(ids, t->ids, (size_t)t->nids * sizeof *ids);   /* t->ids is NULL before the first id */
  return RX_OK;
}

/* ---------------------------------------------------------------- decode and lookups */

int rx_tokenizer_decode(const rx_tokenizer *t, const int32_t *ids, int64_t n, int32_t flags, char *buf, int64_t cap,
                        int64_t *n_out) {
  if (!t || (!ids && n) || n < 0 || (!buf && cap > 0) || !n_out) return rx_fail(RX_EINVAL, "rx_tokenizer_decode: bad arguments");
  int64_t w = 0;
  int skip = (flags & RX_TOK_SKIP_SPECIAL) != 0;
  for (int64_t i = 0; i < n; i++) {
    int32_t id = ids[i];
    if (id < 0 || id >= t->vocab_size || !t->kind[id])
      return rx_fail(RX_EINVAL, "rx_tokenizer_decode: ids[%lld] = %d is not a token of %s (vocab size %d)", (long long)i, id,
                     t->path, t->vocab_size);
    if (skip && t->kind[id] == 3) continue;
    int64_t l = t->raw_len[id];
    if (w + l <= cap) memcpy(buf + w, t->raw.p + t->raw_off[id], (size_t)l);
    w += l;
  }
  *n_out = w;
  if (w > cap) return rx_fail(RX_EINVAL, "rx_tokenizer_decode: %lld bytes do not fit in a buffer of %lld", (long long)w, (long long)cap);
  return RX_OK;
}

int64_t rx_utf8_incomplete_tail(const char *buf, int64_t len) {
  const uint8_t *s = (const uint8_t *)buf;
  /* walk back over at most 3 continuation bytes to a lead byte */
  for (int64_t k = 1; k <= 4 && k <= len; k++) {
    uint8_t c = s[len - k];
    if ((c & 0xC0) == 0x80) continue;
    int need = c >= 0xF0 && c <= 0xF4 ? 4 : c >= 0xE0 ? 3 : c >= 0xC2 && c < 0xE0 ? 2 : 1;
    if (c < 0xC2 || c > 0xF4 || need <= k) return 0;
    /* the bytes so far must be a valid prefix (second-byte limits for E0, ED, F0, F4) */
    if (k >= 2) {
      uint8_t c1 = s[len - k + 1];
      if ((c == 0xE0 && c1 < 0xA0) || (c == 0xED && c1 > 0x9F) || (c == 0xF0 && c1 < 0x90) || (c == 0xF4 && c1 > 0x8F)) return 0;
    }
    return k;
  }
  return 0;
}

int32_t rx_tokenizer_vocab_size(const rx_tokenizer *t) { return t ? t->vocab_size : 0; }

int32_t rx_tokenizer_token_to_id(const rx_tokenizer *t, const char *s, int64_t len) {
  if (!t || !s || len < 0) return -1;
  return strmap_find(&t->by_disp, &t->disp, t->disp_off, t->disp_len, (const uint8_t *)s, len, hash_bytes((const uint8_t *)s, len));
}

const char *rx_tokenizer_id_to_token(const rx_tokenizer *t, int32_t id, int64_t *len) {
  if (!t || id < 0 || id >= t->vocab_size || !t->kind[id]) return NULL;
  if (len) *len = t->disp_len[id];
  return (const char *)t->disp.p + t->disp_off[id];
}

const char *rx_tokenizer_id_to_bytes(const rx_tokenizer *t, int32_t id, int64_t *len) {
  if (!t || id < 0 || id >= t->vocab_size || !t->kind[id]) return NULL;
  if (len) *len = t->raw_len[id];
  return (const char *)t->raw.p + t->raw_off[id];
}

int32_t rx_tokenizer_is_special(const rx_tokenizer *t, int32_t id) {
  return t && id >= 0 && id < t->vocab_size && t->kind[id] == 3;
}

int64_t rx_tokenizer_special_ids(const rx_tokenizer *t, int32_t *ids, int64_t cap) {
  int64_t n = 0;
  for (int32_t id = 0; t && id < t->vocab_size; id++)
    if (t->kind[id] == 3) { if (n < cap) ids[n] = id; n++; }
  return n;
}

const char *rx_tokenizer_role_token(const rx_tokenizer *t, int32_t role) {
  return t && role >= 0 && role < 4 ? t->role[role] : NULL;
}

const char *rx_tokenizer_chat_template(const rx_tokenizer *t) { return t ? t->chat_template : NULL; }
