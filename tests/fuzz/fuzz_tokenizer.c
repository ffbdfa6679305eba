/* fuzz_tokenizer.c: libFuzzer target over tokenizer.json loading and encode/decode
 * (engine/text/tokenizer.c, nfc.c, the JSON parser, PCRE2 regexes from the file).
 *
 * An input is  TOKENIZER_JSON <SEP> TEXT [<SEP> TOKENIZER_CONFIG_JSON]  with SEP four NUL bytes
 * (which JSON text cannot hold). Without a SEP the whole input is TEXT for two fixed tokenizers:
 * the tiny models' byte-level one and a Qwen2-style one with merges, a Split regex, added
 * tokens and a BOS template. Checks:
 *   - loading either succeeds or fails with a message naming the file;
 *   - encode keeps its contract: every id a token, *n_out within 3 * len + 16, a buffer one id
 *     short refused with the size needed; decode of those ids succeeds and the SKIP_SPECIAL
 *     decode is never longer;
 *   - where the tokenizer is lossless (no normalizer, no lstrip/rstrip added token, no Split
 *     that removes text, no added token overriding a vocab token's id with other text),
 *     decode(encode(text)) == text, byte for byte.
 * Built by tests/fuzz/run.sh from these engine sources:
 * fuzz-sources: engine/core/error.c engine/cuda/none.c engine/core/tensor.c engine/core/profile.c engine/core/dtype.c engine/core/philox.c engine/core/json.c engine/text/tokenizer.c engine/text/nfc.c engine/text/unicode_tables.c
 * fuzz-libs: -DRX_HAVE_PCRE2 -lpcre2-8
 * fuzz-dict: tokenizer.dict
 * fuzz-options: -max_len=16384
 * With -DFUZZ_SEEDS it is instead a program that writes a seed corpus into the folder argv[1]. */
#include "remax.h"
#include "json.h"
#include "fuzz_cpu.h"
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char SEP[4] = {0, 0, 0, 0};

/* ---------------------------------------------------------------- a Qwen2-style tokenizer */

static const char QWEN_SPLIT[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+|\\\\p{N}| ?[^\\\\s\\\\p{L}\\\\p{N}]+[\\\\r\\\\n]*|"
    "\\\\s*[\\\\r\\\\n]+|\\\\s+(?!\\\\S)|\\\\s+";

/* The byte-level alphabet: byte b is written as code point cp[b] (GPT-2's table). */
static void byte_cps(uint32_t cp[256]) {
  int k = 0;
  for (int b = 0; b < 256; b++) {
    int printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
    cp[b] = printable ? (uint32_t)b : (uint32_t)(256 + k++);
  }
}

static void put_cp(FILE *f, uint32_t c) {
  if (c == '"' || c == '\\') fprintf(f, "\\%c", (char)c);
  else if (c < 0x80) fputc((int)c, f);
  else fprintf(f, "\\u%04x", c);
}

/* Writes a byte-level BPE tokenizer.json: 256 byte tokens, merges of a few common pairs, added
 * tokens, a Split + ByteLevel pre-tokenizer, optionally NFC and a BOS template. */
static void write_qwen_like(const char *path, int nfc, int bos) {
  static const char *merges[][2] = {{" ", "t"}, {"h", "e"}, {" t", "he"}, {"i", "n"}, {" ", "a"}, {"e", "r"},
                                    {" ", " "}, {"  ", "  "}, {"o", "n"}, {" a", "n"}, {"\n", "\n"}, {"\xc3", "\xa9"}};
  uint32_t cp[256];
  byte_cps(cp);
  FILE *f = fopen(path, "wb");
  if (!f) { perror(path); exit(1); }
  fprintf(f, "{\"version\": \"1.0\", \"added_tokens\": ["
             "{\"id\": 300, \"content\": \"<|endoftext|>\", \"special\": true},"
             "{\"id\": 301, \"content\": \"<|im_start|>\", \"special\": true},"
             "{\"id\": 302, \"content\": \"<think>\", \"special\": false}],\n");
  fprintf(f, " \"normalizer\": %s,\n", nfc ? "{\"type\": \"NFC\"}" : "null");
  fprintf(f, " \"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": ["
             "{\"type\": \"Split\", \"pattern\": {\"Regex\": \"%s\"}, \"behavior\": \"Isolated\", \"invert\": false},"
             "{\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"trim_offsets\": false, \"use_regex\": false}]},\n",
          QWEN_SPLIT);
  if (bos)
    fprintf(f, " \"post_processor\": {\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": {\"id\": \"<|endoftext|>\", "
               "\"type_id\": 0}}, {\"Sequence\": {\"id\": \"A\", \"type_id\": 0}}]},\n");
  fprintf(f, " \"decoder\": {\"type\": \"ByteLevel\"},\n \"model\": {\"type\": \"BPE\", \"vocab\": {");
  for (int b = 0; b < 256; b++) {
    fprintf(f, "%s\"", b ? ", " : "");
    put_cp(f, cp[b]);
    fprintf(f, "\": %d", b);
  }
  int n = (int)(sizeof merges / sizeof merges[0]);
  for (int m = 0; m < n; m++) {
    fprintf(f, ", \"");
    for (int k = 0; k < 2; k++)
      for (const unsigned char *s = (const unsigned char *)merges[m][k]; *s; s++) put_cp(f, cp[*s]);
    fprintf(f, "\": %d", 256 + m);
  }
  fprintf(f, "}, \"merges\": [");
  for (int m = 0; m < n; m++) {
    fprintf(f, "%s[\"", m ? ", " : "");
    for (const unsigned char *s = (const unsigned char *)merges[m][0]; *s; s++) put_cp(f, cp[*s]);
    fprintf(f, "\", \"");
    for (const unsigned char *s = (const unsigned char *)merges[m][1]; *s; s++) put_cp(f, cp[*s]);
    fprintf(f, "\"]");
  }
  fprintf(f, "]}}\n");
  fclose(f);
}

#ifndef FUZZ_SEEDS
/* ---------------------------------------------------------------- checks */

static char dir[64];
static rx_tokenizer *fixed[2];
static int fixed_lossless[2];

static void write_file(const char *path, const void *p, size_t n) {
  FILE *f = fopen(path, "wb");
  if (!f) { perror(path); __builtin_trap(); }
  if (n) fwrite(p, 1, n, f);
  fclose(f);
}

/* Some value under node (any depth) is the string s. */
static int has_string(const rx_json *node, const char *s) {
  if (!node) return 0;
  if (node->kind == RX_JSON_STRING) return strcmp(node->str, s) == 0;
  for (const rx_json *c = node->child; c; c = c->next)
    if (has_string(c, s)) return 1;
  return 0;
}

static int flag_set(const rx_json *obj, const char *key) {
  const rx_json *v = rx_json_get(obj, key);
  return v && v->kind == RX_JSON_BOOL && v->boolean;
}

/* The tokenizer file promises a lossless round trip (see the top of this file). */
static int lossless(const char *json, size_t n) {
  char err[128];
  rx_json_doc *doc = rx_json_parse(json, n, err, sizeof err);
  if (!doc) return 0;
  const rx_json *root = rx_json_root(doc), *norm = rx_json_get(root, "normalizer");
  int ok = !norm || norm->kind == RX_JSON_NULL;
  if (has_string(rx_json_get(root, "pre_tokenizer"), "Removed")) ok = 0;
  const rx_json *added = rx_json_get(root, "added_tokens");
  const rx_json *model = rx_json_get(root, "model"), *vocab = model ? rx_json_get(model, "vocab") : NULL;
  for (const rx_json *a = added ? added->child : NULL; a; a = a->next) {
    if (flag_set(a, "lstrip") || flag_set(a, "rstrip")) ok = 0;
    /* an added token that takes a vocab token's id with other text overrides it (documented):
     * BPE may still produce that id, which then decodes to the added text */
    const rx_json *id = rx_json_get(a, "id"), *content = rx_json_get(a, "content");
    for (const rx_json *v = vocab ? vocab->child : NULL; v && id && content && content->kind == RX_JSON_STRING; v = v->next)
      if (v->kind == RX_JSON_NUMBER && v->integer == id->integer && (v->key_len != content->len || memcmp(v->key, content->str, content->len)))
        ok = 0;
  }
  rx_json_free(doc);
  return ok;
}

static void exercise(rx_tokenizer *tok, const uint8_t *text, size_t len, int check_round_trip) {
  int64_t cap = 3 * (int64_t)len + 16, n = -1;
  int32_t *ids = malloc((size_t)cap * sizeof *ids);
  int32_t vocab = rx_tokenizer_vocab_size(tok);
  for (int32_t flags = 0; flags <= RX_TOK_ADD_SPECIAL; flags++) {
    if (rx_tokenizer_encode(tok, (const char *)text, (int64_t)len, flags, ids, cap, &n) != RX_OK) {
      /* the one refusal allowed: a byte the vocabulary has no token for */
      if (!strstr(rx_last_error(), "has no byte-level token")) {
        fprintf(stderr, "encode failed: %s\n", rx_last_error());
        __builtin_trap();
      }
      break;
    }
    if (n < 0 || n > cap) __builtin_trap();
    for (int64_t i = 0; i < n; i++)
      if (ids[i] < 0 || ids[i] >= vocab || !rx_tokenizer_id_to_token(tok, ids[i], NULL)) __builtin_trap();
    if (n > 0) {   /* a buffer one short: refused, with the size it needs */
      int64_t need = -1;
      if (rx_tokenizer_encode(tok, (const char *)text, (int64_t)len, flags, ids, n - 1, &need) == RX_OK || need != n)
        __builtin_trap();
    }
    int64_t out_n = -1, skip_n = -1;
    if (rx_tokenizer_decode(tok, ids, n, 0, NULL, 0, &out_n) == RX_OK && out_n > 0) __builtin_trap();
    if (out_n < 0) __builtin_trap();
    char *out = malloc((size_t)out_n + 1);
    if (rx_tokenizer_decode(tok, ids, n, 0, out, out_n, &out_n) != RX_OK) __builtin_trap();
    if (rx_tokenizer_decode(tok, ids, n, RX_TOK_SKIP_SPECIAL, out, out_n, &skip_n) != RX_OK || skip_n > out_n) __builtin_trap();
    if (rx_tokenizer_decode(tok, ids, n, 0, out, out_n, &out_n) != RX_OK) __builtin_trap();
    if (check_round_trip && flags == 0 && ((size_t)out_n != len || memcmp(out, text, len) != 0)) {
      fprintf(stderr, "round trip: %zu bytes in, %lld out, %lld ids\n", len, (long long)out_n, (long long)n);
      __builtin_trap();
    }
    int64_t tail = rx_utf8_incomplete_tail(out, out_n);
    if (tail < 0 || tail > 3 || tail > out_n) __builtin_trap();
    free(out);
  }
  free(ids);
}

static void setup(void) {
  snprintf(dir, sizeof dir, "/tmp/fuzz_tokenizer.%d", (int)getpid());
  char path[128];
  snprintf(path, sizeof path, "mkdir -p %s/qwen", dir);
  if (system(path) != 0) __builtin_trap();
  snprintf(path, sizeof path, "%s/qwen/tokenizer.json", dir);
  write_qwen_like(path, 0, 1);
  if (rx_tokenizer_load(&fixed[0], "tests/fixtures/byte_tokenizer") != RX_OK ||
      rx_tokenizer_load(&fixed[1], path) != RX_OK) {
    fprintf(stderr, "fuzz_tokenizer: run from the repository root: %s\n", rx_last_error());
    exit(1);
  }
  fixed_lossless[0] = fixed_lossless[1] = 1;
}

static const uint8_t *find_sep(const uint8_t *p, size_t n) {
  for (size_t i = 0; i + 4 <= n; i++)
    if (!memcmp(p + i, SEP, 4)) return p + i;
  return NULL;
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc; (void)argv;
  setup();
  return 0;
}

static void one_input(const uint8_t *data, size_t size) {
  const uint8_t *sep = find_sep(data, size);
  if (!sep) {
    for (int k = 0; k < 2; k++) exercise(fixed[k], data, size, fixed_lossless[k]);
    return;
  }
  size_t json_len = (size_t)(sep - data);
  const uint8_t *text = sep + 4, *end = data + size, *sep2 = find_sep(text, (size_t)(end - text));
  size_t text_len = (size_t)((sep2 ? sep2 : end) - text);
  char file[128], cfg[128];
  snprintf(file, sizeof file, "%s/tokenizer.json", dir);
  snprintf(cfg, sizeof cfg, "%s/tokenizer_config.json", dir);
  write_file(file, data, json_len);
  if (sep2) write_file(cfg, sep2 + 4, (size_t)(end - sep2 - 4));
  else unlink(cfg);
  rx_tokenizer *tok = NULL;
  if (rx_tokenizer_load(&tok, file) != RX_OK) {
    if (tok || !strstr(rx_last_error(), dir)) {   /* every error names the file */
      fprintf(stderr, "load error without the file's name: %s\n", rx_last_error());
      __builtin_trap();
    }
    return;
  }
  for (int r = 0; r < 4; r++) (void)rx_tokenizer_role_token(tok, r);
  int32_t special[64];
  int64_t ns = rx_tokenizer_special_ids(tok, special, 64);
  for (int64_t i = 0; i < ns && i < 64; i++)
    if (!rx_tokenizer_is_special(tok, special[i])) __builtin_trap();
  exercise(tok, text, text_len, lossless((const char *)data, json_len));
  rx_tokenizer_free(tok);
  return;
}

FUZZ_CPU_TARGET(one_input)

#else
/* ---------------------------------------------------------------- seeds */

static void put_seed(const char *dir, const char *name, const char *json_path, const char *text, size_t text_len,
                     const char *config) {
  char path[1024];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *out = fopen(path, "wb");
  if (!out) { perror(path); exit(1); }
  if (json_path) {
    FILE *in = fopen(json_path, "rb");
    if (!in) { perror(json_path); exit(1); }
    int c;
    while ((c = fgetc(in)) != EOF) fputc(c, out);
    fclose(in);
    fwrite(SEP, 1, 4, out);
  }
  fwrite(text, 1, text_len, out);
  if (config) {
    fwrite(SEP, 1, 4, out);
    fputs(config, out);
  }
  fclose(out);
}

int main(int argc, char **argv) {
  if (argc != 2) { fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]); return 2; }
  const char *d = argv[1];
  char tmp[1024];
  static const char text[] = "<|im_start|>user\nWhat is 12 + 30?  Natalia's caf\xc3\xa9 e\xcc\x81 \xf0\x9f\x98\x80<|endoftext|>\n\n\t \xff\xfe end";
  static const char config[] = "{\"eos_token\": \"<|endoftext|>\", \"pad_token\": {\"content\": \"<|im_start|>\"},"
                               " \"chat_template\": [{\"name\": \"default\", \"template\": \"{{ x }}\"}]}";
  put_seed(d, "text_only", NULL, text, sizeof text - 1, NULL);
  put_seed(d, "byte_level", "tests/fixtures/byte_tokenizer/tokenizer.json", text, sizeof text - 1,
           "{\"eos_token\": \"<|endoftext|>\"}");
  snprintf(tmp, sizeof tmp, "%s/.qwen.json", d);
  write_qwen_like(tmp, 0, 1);
  put_seed(d, "qwen_like", tmp, text, sizeof text - 1, config);
  write_qwen_like(tmp, 1, 0);
  put_seed(d, "qwen_like_nfc", tmp, text, sizeof text - 1, NULL);
  remove(tmp);
  return 0;
}
#endif
