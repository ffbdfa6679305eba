/* test_tokenizer.c: byte-level BPE (engine/text/tokenizer.c) and NFC (engine/text/nfc.c).
 * The comparison with the Hugging Face reference on real Qwen3 / Llama 3 files lives in
 * tests/lua/tokenizer_spec.lua; here: merges against a plain reference BPE, the byte-level
 * tokenizer of the tiny models, NFC against Unicode's own test file, and load errors. */
#include "check.h"

static const char *BYTE_FIXTURE = "tests/fixtures/byte_tokenizer";

static uint32_t lcg(uint32_t *s) { *s = *s * 1103515245u + 12345u; return *s >> 8; }

static void write_file(const char *path, const char *text) {
  FILE *f = fopen(path, "wb");
  CHECK(f != NULL, "cannot write %s", path);
  if (!f) return;
  fputs(text, f);
  fclose(f);
}

/* ---------------------------------------------------------------- byte-level tokenizer */

static void byte_level_round_trips(void) {
  rx_tokenizer *tok;
  CHECK_OK(rx_tokenizer_load(&tok, BYTE_FIXTURE));
  if (!tok) return;
  CHECK(rx_tokenizer_vocab_size(tok) == 260, "vocab size %d", rx_tokenizer_vocab_size(tok));
  uint32_t seed = 1;
  char text[4096], back[4096];
  int32_t ids[4096];
  for (int trial = 0; trial < 200; trial++) {
    int64_t n = lcg(&seed) % 2000, got, nb;
    for (int64_t i = 0; i < n; i++) text[i] = (char)(lcg(&seed) & 0xFF);   /* NULs, invalid UTF-8 */
    CHECK_OK(rx_tokenizer_encode(tok, text, n, RX_TOK_ADD_SPECIAL, ids, 4096, &got));
    /* one id per byte unless the random bytes happen to spell a special token */
    int same = got == n;
    for (int64_t i = 0; same && i < n; i++) same = ids[i] == (uint8_t)text[i];
    CHECK(same || memchr(text, '<', (size_t)n), "trial %d: ids are not the bytes", trial);
    CHECK_OK(rx_tokenizer_decode(tok, ids, got, 0, back, 4096, &nb));
    CHECK(nb == n && memcmp(back, text, (size_t)n) == 0, "trial %d: decode(encode(x)) != x (%lld vs %lld bytes)", trial,
          (long long)nb, (long long)n);
  }
  const char *chat = "<|im_start|>\xff\x00<|im_end|>";
  int64_t len = 12 + 2 + 10, got, nb;
  CHECK_OK(rx_tokenizer_encode(tok, chat, len, 0, ids, 4096, &got));
  CHECK(got == 4 && ids[0] == rx_tokenizer_token_to_id(tok, "<|im_start|>", 12) && ids[1] == 255 && ids[2] == 0 &&
        ids[3] == rx_tokenizer_token_to_id(tok, "<|im_end|>", 10),
        "specials: %lld ids, first %d last %d", (long long)got, ids[0], ids[got - 1]);
  CHECK(rx_tokenizer_is_special(tok, ids[0]) && !rx_tokenizer_is_special(tok, ids[1]), "special flags");
  CHECK_OK(rx_tokenizer_decode(tok, ids, got, RX_TOK_SKIP_SPECIAL, back, 4096, &nb));
  CHECK(nb == 2 && memcmp(back, "\xff\x00", 2) == 0, "skip_special gave %lld bytes", (long long)nb);
  /* too small a buffer: the call fails and reports the size it needs */
  CHECK_FAILS(rx_tokenizer_encode(tok, "abcdef", 6, 0, ids, 3, &got), "do not fit");
  CHECK(got == 6, "needed %lld", (long long)got);
  int32_t bad = 9999;
  CHECK_FAILS(rx_tokenizer_decode(tok, &bad, 1, 0, back, 16, &nb), "9999");
  rx_tokenizer_free(tok);
}

/* ---------------------------------------------------------------- BPE merges vs a reference */

enum { NSYM = 4, NMERGE = 40 };
typedef struct { char a[64], b[64]; } merge_rule;

/* Plain BPE on strings: repeatedly merge the adjacent pair with the lowest rank (leftmost on ties). */
static int reference_bpe(const char *text, const merge_rule *rules, int nrules, char out[][64]) {
  int n = 0;
  for (const char *p = text; *p; p++) { out[n][0] = *p; out[n][1] = 0; n++; }
  for (;;) {
    int best = -1, best_rank = nrules;
    for (int i = 0; i + 1 < n; i++)
      for (int r = 0; r < best_rank; r++)
        if (!strcmp(out[i], rules[r].a) && !strcmp(out[i + 1], rules[r].b)) { best = i; best_rank = r; break; }
    if (best < 0) return n;
    char joined[64];
    snprintf(joined, sizeof joined, "%s%s", out[best], out[best + 1]);
    memcpy(out[best], joined, sizeof joined);
    memmove(out + best + 1, out + best + 2, (size_t)(n - best - 2) * sizeof out[0]);
    n--;
  }
}

/* Random merges over the letters a..d, written in the "a b" form or the ["a", "b"] form. */
static int make_bpe_file(const char *path, int pair_form, int ignore_merges, merge_rule *rules) {
  char vocab[NSYM + NMERGE][64];
  int nv = 0, nr = 0;
  for (int i = 0; i < NSYM; i++) { vocab[nv][0] = (char)('a' + i); vocab[nv][1] = 0; nv++; }
  uint32_t seed = 99;
  while (nr < NMERGE) {
    const char *a = vocab[lcg(&seed) % nv], *b = vocab[lcg(&seed) % nv];
    if (strlen(a) + strlen(b) >= 20) continue;
    char ab[64];
    snprintf(ab, sizeof ab, "%s%s", a, b);
    int dup = 0;
    for (int i = 0; i < nv; i++) dup |= !strcmp(vocab[i], ab);
    if (dup) continue;
    snprintf(rules[nr].a, 64, "%s", a);
    snprintf(rules[nr].b, 64, "%s", b);
    snprintf(vocab[nv++], 64, "%s", ab);
    nr++;
  }
  FILE *f = fopen(path, "wb");
  if (!f) return 0;
  fprintf(f, "{\"added_tokens\": [], \"normalizer\": null,\n"
             " \"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"use_regex\": false},\n"
             " \"decoder\": {\"type\": \"ByteLevel\"},\n"
             " \"model\": {\"type\": \"BPE\", \"ignore_merges\": %s, \"vocab\": {", ignore_merges ? "true" : "false");
  for (int i = 0; i < nv; i++) fprintf(f, "%s\"%s\": %d", i ? ", " : "", vocab[i], i);
  fprintf(f, "},\n \"merges\": [");
  for (int r = 0; r < nr; r++) {
    if (pair_form) fprintf(f, "%s[\"%s\", \"%s\"]", r ? ", " : "", rules[r].a, rules[r].b);
    else fprintf(f, "%s\"%s %s\"", r ? ", " : "", rules[r].a, rules[r].b);
  }
  fprintf(f, "]}}\n");
  fclose(f);
  return 1;
}

static void merges_match_reference_bpe(void) {
  merge_rule rules[NMERGE];
  const char *paths[2] = {"/tmp/rx_test_bpe_string.json", "/tmp/rx_test_bpe_pair.json"};
  rx_tokenizer *tok[2] = {NULL, NULL};
  for (int k = 0; k < 2; k++) {
    CHECK(make_bpe_file(paths[k], k, 0, rules), "cannot write %s", paths[k]);
    CHECK_OK(rx_tokenizer_load(&tok[k], paths[k]));
  }
  if (!tok[0] || !tok[1]) return;
  uint32_t seed = 5;
  static char text[600], want[600][64];
  int32_t ids[600], ids2[600];
  int bad = 0;
  for (int trial = 0; trial < 300 && bad < 3; trial++) {
    /* lengths on both sides of the short-piece scan / heap switch */
    int n = 1 + (int)(lcg(&seed) % (trial < 150 ? 40 : 500));
    for (int i = 0; i < n; i++) text[i] = (char)('a' + lcg(&seed) % (trial % 3 ? NSYM : 2));
    text[n] = 0;
    int nw = reference_bpe(text, rules, NMERGE, want);
    int64_t got, got2;
    CHECK_OK(rx_tokenizer_encode(tok[0], text, n, 0, ids, 600, &got));
    CHECK_OK(rx_tokenizer_encode(tok[1], text, n, 0, ids2, 600, &got2));
    int same = got == nw && got2 == got;
    for (int i = 0; same && i < nw; i++) {
      int64_t len;
      const char *s = rx_tokenizer_id_to_token(tok[0], ids[i], &len);
      same = s && len == (int64_t)strlen(want[i]) && !memcmp(s, want[i], (size_t)len) && ids2[i] == ids[i];
    }
    if (!same) bad++;
    CHECK(same, "trial %d: '%s' gave %lld/%lld tokens, reference %d", trial, text, (long long)got, (long long)got2, nw);
  }
  for (int k = 0; k < 2; k++) { rx_tokenizer_free(tok[k]); remove(paths[k]); }

  /* ignore_merges: a whole piece found in the vocab is one token even when merges would not get there */
  const char *path = "/tmp/rx_test_bpe_ignore.json";
  rx_tokenizer *t;
  CHECK(make_bpe_file(path, 0, 1, rules), "cannot write %s", path);
  CHECK_OK(rx_tokenizer_load(&t, path));
  if (t) {
    for (int r = 0; r < NMERGE; r++) {
      char ab[64];
      snprintf(ab, sizeof ab, "%s%s", rules[r].a, rules[r].b);
      int64_t got;
      CHECK_OK(rx_tokenizer_encode(t, ab, (int64_t)strlen(ab), 0, ids, 600, &got));
      CHECK(got == 1 && ids[0] == rx_tokenizer_token_to_id(t, ab, (int64_t)strlen(ab)), "'%s' gave %lld ids", ab, (long long)got);
    }
    rx_tokenizer_free(t);
  }
  remove(path);
}

/* ---------------------------------------------------------------- NFC */

static int nfc_is(const char *in, const char *want) {
  char out[64];
  int64_t n;
  if (rx_unicode_nfc(in, (int64_t)strlen(in), out, sizeof out, &n) != RX_OK) return 0;
  return n == (int64_t)strlen(want) && memcmp(out, want, (size_t)n) == 0;
}

static void nfc_known_facts(void) {
  CHECK(nfc_is("e\xcc\x81", "\xc3\xa9"), "e + COMBINING ACUTE -> U+00E9");
  CHECK(nfc_is("\xe2\x84\xab", "\xc3\x85"), "ANGSTROM SIGN U+212B -> U+00C5 (singleton)");
  CHECK(nfc_is("\xe2\x84\xa6", "\xce\xa9"), "OHM SIGN U+2126 -> U+03A9 (singleton)");
  CHECK(nfc_is("\xe1\x84\x80\xe1\x85\xa1\xe1\x86\xa8", "\xea\xb0\x81"), "Hangul L V T -> U+AC01");
  CHECK(nfc_is("\xea\xb0\x80\xe1\x86\xa8", "\xea\xb0\x81"), "Hangul LV + T -> U+AC01");
  CHECK(nfc_is("e\xcc\xa3\xcc\x82", "\xe1\xbb\x87"), "e + dot below + circumflex -> U+1EC7");
  CHECK(nfc_is("e\xcc\x82\xcc\xa3", "\xe1\xbb\x87"), "marks out of order are reordered, then composed");
  CHECK(nfc_is("\xe0\xa5\x98", "\xe0\xa4\x95\xe0\xa4\xbc"), "U+0958 is a composition exclusion: stays decomposed");
  CHECK(nfc_is("\xe1\xb8\x8b\xcc\xa3", "\xe1\xb8\x8d\xcc\x87"), "U+1E0B U+0323 -> U+1E0D U+0307");
  CHECK(nfc_is("\xef\xac\x81", "\xef\xac\x81"), "U+FB01 ligature fi is a compatibility mapping: unchanged");
  CHECK(nfc_is("\xcc\x81" "a", "\xcc\x81" "a"), "a leading combining mark does not compose with what follows");
  CHECK(nfc_is("plain ascii\n", "plain ascii\n"), "ASCII unchanged");
  CHECK(nfc_is("a\xff\xc3", "a\xff\xc3"), "invalid bytes pass through");
  int64_t n;
  char big[16];
  CHECK_OK(rx_unicode_nfc("\xe0\xa5\x98", 3, big, 2, &n));   /* reports the full size needed */
  CHECK(n == 6, "needed %lld", (long long)n);
}

/* Every line of Unicode's NormalizationTest.txt: c2 == NFC(c1) == NFC(c2) == NFC(c3), c4 == NFC(c4) == NFC(c5). */
static int parse_hex_field(const char **p, char *out, int64_t *n) {
  *n = 0;
  while (**p && **p != ';') {
    while (**p == ' ') (*p)++;
    if (**p == ';') break;
    char *end;
    unsigned long cp = strtoul(*p, &end, 16);
    if (end == *p) return 0;
    *p = end;
    unsigned char *o = (unsigned char *)out + *n;
    if (cp < 0x80) { o[0] = (unsigned char)cp; *n += 1; }
    else if (cp < 0x800) { o[0] = 0xC0 | (cp >> 6); o[1] = 0x80 | (cp & 0x3F); *n += 2; }
    else if (cp < 0x10000) { o[0] = 0xE0 | (cp >> 12); o[1] = 0x80 | ((cp >> 6) & 0x3F); o[2] = 0x80 | (cp & 0x3F); *n += 3; }
    else { o[0] = 0xF0 | (cp >> 18); o[1] = 0x80 | ((cp >> 12) & 0x3F); o[2] = 0x80 | ((cp >> 6) & 0x3F); o[3] = 0x80 | (cp & 0x3F); *n += 4; }
  }
  if (**p == ';') (*p)++;
  return 1;
}

static void nfc_matches_unicode_test_file(void) {
  const char *file = "/usr/share/unicode/NormalizationTest.txt.bz2";
  FILE *probe = fopen(file, "rb");
  if (!probe) {
    fprintf(stderr, "skipped: %s not found (apt-get install unicode-data)\n", file);
    return;
  }
  fclose(probe);
  FILE *p = popen("bzcat /usr/share/unicode/NormalizationTest.txt.bz2", "r");
  CHECK(p != NULL, "cannot run bzcat");
  if (!p) return;
  char line[1024], col[5][256], out[1024];
  int64_t len[5], lines = 0, bad = 0;
  while (fgets(line, sizeof line, p)) {
    if (line[0] == '#' || line[0] == '@' || line[0] == '\n') continue;
    const char *s = line;
    int ok = 1;
    for (int c = 0; c < 5 && ok; c++) ok = parse_hex_field(&s, col[c], &len[c]);
    if (!ok) continue;
    lines++;
    const int src[5] = {0, 1, 2, 3, 4}, want[5] = {1, 1, 1, 3, 3};
    for (int k = 0; k < 5; k++) {
      int64_t n;
      if (rx_unicode_nfc(col[src[k]], len[src[k]], out, sizeof out, &n) != RX_OK || n != len[want[k]] ||
          memcmp(out, col[want[k]], (size_t)n) != 0) {
        if (bad++ < 5) fprintf(stderr, "NormalizationTest: %s", line);
      }
    }
  }
  pclose(p);
  CHECK(lines > 15000, "read only %lld test lines", (long long)lines);
  CHECK(bad == 0, "%lld NFC mismatches in %lld lines (Unicode %s tables)", (long long)bad, (long long)lines, rx_unicode_data_version());
}

/* ---------------------------------------------------------------- errors */

/* "{" + the ByteLevel pre_tokenizer and decoder + ", " + rest, in out (1024 bytes). */
static const char *with_pre(char *out, const char *rest) {
  snprintf(out, 1024, "{\"pre_tokenizer\": {\"type\": \"ByteLevel\"}, \"decoder\": {\"type\": \"ByteLevel\"}, %s", rest);
  return out;
}

/* Writes tokenizer.json text `json` to the caller's path; loading it into the caller's tok fails
 * with a message containing needle. */
#define LOAD_FAILS(json, needle)                         \
  do {                                                   \
    write_file(path, json);                              \
    CHECK_FAILS(rx_tokenizer_load(&tok, path), needle);  \
  } while (0)

static void malformed_files_name_file_and_key(void) {
  const char *path = "/tmp/rx_test_tok_bad.json";
  rx_tokenizer *tok = NULL;
  char text[1024];

  LOAD_FAILS("{\"added_tokens\": [], \"normalizer\": null}", "/tmp/rx_test_tok_bad.json: missing \"model\"");

  LOAD_FAILS(with_pre(text, "\"model\": {\"type\": \"WordPiece\", \"vocab\": {\"a\": 0}}}"),
             "rx_test_tok_bad.json: model.type \"WordPiece\" is not supported");
  LOAD_FAILS(with_pre(text, "\"model\": {\"type\": \"Unigram\", \"vocab\": [[\"a\", 0.0]]}}"),
             "model.type \"Unigram\"");

  LOAD_FAILS(with_pre(text, "\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2}, \"merges\": [\"a b\", \"a c\"]}}"),
             "rx_test_tok_bad.json: model.merges[1] (\"a\" + \"c\"): token \"c\" is not in model.vocab");
  LOAD_FAILS(with_pre(text, "\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1}, \"merges\": [[\"a\", \"b\"]]}}"),
             "model.merges[0] (\"a\" + \"b\"): token \"ab\" is not in model.vocab");

  LOAD_FAILS("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0,}}}", "rx_test_tok_bad.json: bad JSON: byte");

  LOAD_FAILS("{\"pre_tokenizer\": {\"type\": \"Metaspace\"}, \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}}",
             "pre_tokenizer type \"Metaspace\"");
  LOAD_FAILS("{\"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Digits\"}, {\"type\": \"ByteLevel\"}]},"
             " \"decoder\": {\"type\": \"ByteLevel\"}, \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}}",
             "pre_tokenizer.pretokenizers[0]: pre-tokenizer type \"Digits\" is not supported");
  LOAD_FAILS(with_pre(text, "\"normalizer\": {\"type\": \"NFKC\"}, \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}}"),
             "normalizer: normalizer type \"NFKC\" is not supported");
  LOAD_FAILS("{\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"(unclosed\"}, \"behavior\": \"Isolated\"},"
             " \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}}", "pre_tokenizer");
  LOAD_FAILS(with_pre(text, "\"added_tokens\": [{\"id\": 5}], \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}}"),
             "added_tokens[0].content");
  CHECK_FAILS(rx_tokenizer_load(&tok, "/tmp/rx_no_such_dir_xyz"), "/tmp/rx_no_such_dir_xyz");
  CHECK(tok == NULL, "a failed load leaves the handle NULL");
  remove(path);
}

static void utf8_tail(void) {
  CHECK(rx_utf8_incomplete_tail("ab", 2) == 0, "ascii");
  CHECK(rx_utf8_incomplete_tail("a\xe2\x82", 3) == 2, "2 of 3 bytes");
  CHECK(rx_utf8_incomplete_tail("a\xe2\x82\xac", 4) == 0, "complete euro sign");
  CHECK(rx_utf8_incomplete_tail("\xf0\x9f\x91", 3) == 3, "3 of 4 bytes");
  CHECK(rx_utf8_incomplete_tail("\xf0", 1) == 1, "a lone lead byte");
  CHECK(rx_utf8_incomplete_tail("a\x82", 2) == 0, "a stray continuation byte is not pending");
  CHECK(rx_utf8_incomplete_tail("\xed\xa0", 2) == 0, "a surrogate prefix never completes");
}

int main(void) {
  RUN(byte_level_round_trips);
  RUN(merges_match_reference_bpe);
  RUN(nfc_known_facts);
  RUN(nfc_matches_unicode_test_file);
  RUN(malformed_files_name_file_and_key);
  RUN(utf8_tail);
  return check_summary("test_tokenizer");
}
