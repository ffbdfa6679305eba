/* test_fuzz_found.c: one case per bug the fuzz targets (tests/fuzz/) found, each the minimised
 * input of the finding, so a fix that regresses fails here in `./remax test`, without clang.
 * docs/reliability.md lists the findings. */
#include "check.h"
#include "json.h"

/* fuzz_json: a number longer than 63 characters was cut to 63 before strtod, so a long
 * mantissa lost its exponent (1.000…0001e-5 read as 1.0), and a long integer was refused. */
static void json_long_numbers_keep_every_digit(void) {
  char err[256], text[400];
  snprintf(text, sizeof text, "[1.%0120de-5, 1%080d, -0.%0100d1]", 1, 0, 0);
  rx_json_doc *doc = rx_json_parse(text, strlen(text), err, sizeof err);
  CHECK(doc != NULL, "parse: %s", err);
  if (!doc) return;
  rx_json *a = rx_json_root(doc)->child, *b = a->next, *c = b->next;
  CHECK(a->number == 1e-5, "long mantissa: %.17g, want 1e-5", a->number);
  CHECK(b->number == 1e80 && !b->is_integer, "81-digit integer: %.17g, want 1e80 as a float", b->number);
  CHECK(c->number == -1e-101, "long fraction: %.17g", c->number);
  rx_json_free(doc);
}

static void write_text(const char *path, const char *text) {
  FILE *f = fopen(path, "wb");
  if (f) { fputs(text, f); fclose(f); }
}

static const char *BYTE_PRE = "\"pre_tokenizer\": {\"type\": \"ByteLevel\"}, \"decoder\": {\"type\": \"ByteLevel\"}";

/* fuzz_tokenizer: a post_processor Sequence with two TemplateProcessing steps wrote the second
 * one's ids past buffers sized for the first (heap overflow); now a clear error. */
static void tokenizer_second_template_is_refused(void) {
  const char *path = "/tmp/rx_fuzz_found_tok.json";
  char text[2048];
  const char *tp = "{\"type\": \"TemplateProcessing\", \"single\": [%s{\"Sequence\": {\"id\": \"A\"}}]}";
  char one[256], three[512];
  snprintf(one, sizeof one, tp, "{\"SpecialToken\": {\"id\": \"a\"}}, ");
  snprintf(three, sizeof three, tp, "{\"SpecialToken\": {\"id\": \"a\"}}, {\"SpecialToken\": {\"id\": \"a\"}}, {\"SpecialToken\": {\"id\": \"a\"}}, ");
  snprintf(text, sizeof text, "{%s, \"post_processor\": {\"type\": \"Sequence\", \"processors\": [%s, %s]},"
           " \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}}", BYTE_PRE, three, one);
  write_text(path, text);
  rx_tokenizer *tok = NULL;
  CHECK_FAILS(rx_tokenizer_load(&tok, path), "rx_fuzz_found_tok.json: post_processor.processors[1]: a second TemplateProcessing");
  CHECK(tok == NULL, "no handle on failure");
  remove(path);
}

/* fuzz_tokenizer: encoding empty text memcpy'd from a NULL scratch buffer (undefined behaviour
 * that UBSan reports; the sanitizer build of these tests runs in CI). */
static void tokenizer_encodes_empty_text(void) {
  rx_tokenizer *tok = NULL;
  CHECK_OK(rx_tokenizer_load(&tok, "tests/fixtures/byte_tokenizer"));
  if (!tok) return;
  int32_t ids[4];
  int64_t n = -1;
  CHECK_OK(rx_tokenizer_encode(tok, "", 0, 0, ids, 4, &n));
  CHECK(n == 0, "empty text gives no ids, got %lld", (long long)n);
  rx_tokenizer_free(tok);
}

/* fuzz_config: nothing stopped a config implying 10^12 parameters before rx_alloc was asked for
 * terabytes (and int64 sizes could wrap); now refused up front, naming the sizes. */
static void model_config_beyond_memory_is_refused(void) {
  rx_model_config c = {0};
  c.vocab_size = 1000000; c.hidden_size = 1000000; c.intermediate_size = 1000000; c.num_hidden_layers = 1000;
  c.num_attention_heads = 8; c.num_key_value_heads = 8; c.head_dim = 125000; c.max_position_embeddings = 1024;
  c.rms_norm_eps = 1e-6; c.rope_theta = 10000; c.dtype = RX_F32; c.device = RX_CPU;
  rx_model *m = NULL;
  CHECK_FAILS(rx_model_new(&m, &c), "more than this machine's");
  CHECK(m == NULL, "no model on failure");
  c.num_hidden_layers = 2147483647; c.vocab_size = 2147483647; c.hidden_size = 2147483647;   /* sizes that wrap int64 */
  c.intermediate_size = 2147483647;
  CHECK_FAILS(rx_model_new(&m, &c), "parameters");
  /* a small one still builds, with the parameters it implies */
  c.vocab_size = 10; c.hidden_size = 8; c.intermediate_size = 12; c.num_hidden_layers = 1;
  c.num_attention_heads = 2; c.num_key_value_heads = 1; c.head_dim = 4;
  CHECK_OK(rx_model_new(&m, &c));
  if (m) {
    int64_t total = 0;
    for (int64_t i = 0; i < rx_model_param_count(m); i++) total += rx_model_param(m, i)->numel;
    int64_t want = 2 * 10 * 8 + 8 + (2 * 8 + 8 * 8 + 8 * 4 * 2 + 8 * 8 + 3 * 12 * 8);
    CHECK(total == want, "%lld parameters, the config implies %lld", (long long)total, (long long)want);
    rx_model_free(m);
  }
}

/* fuzz_tokenizer: two added tokens (or two vocab strings) with one id loaded, and encoding the
 * first decoded to the second ("<|im_start|>" came back as "<|im_end|>"); now refused. */
static void tokenizer_shared_ids_are_refused(void) {
  const char *path = "/tmp/rx_fuzz_found_ids.json";
  char text[1024];
  rx_tokenizer *tok = NULL;
  snprintf(text, sizeof text, "{%s, \"added_tokens\": [{\"id\": 1, \"content\": \"<s>\"}, {\"id\": 1, \"content\": \"</s>\"}],"
           " \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}}", BYTE_PRE);
  write_text(path, text);
  CHECK_FAILS(rx_tokenizer_load(&tok, path), "added_tokens[1]: \"</s>\" has id 1, which an earlier added token (\"<s>\") has");
  snprintf(text, sizeof text, "{%s, \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 0}, \"merges\": []}}", BYTE_PRE);
  write_text(path, text);
  CHECK_FAILS(rx_tokenizer_load(&tok, path), "model.vocab: \"a\" and \"b\" both have id 0");
  /* the same token listed twice is harmless and still loads */
  snprintf(text, sizeof text, "{%s, \"added_tokens\": [{\"id\": 1, \"content\": \"<s>\"}, {\"id\": 1, \"content\": \"<s>\"}],"
           " \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}}", BYTE_PRE);
  write_text(path, text);
  CHECK_OK(rx_tokenizer_load(&tok, path));
  rx_tokenizer_free(tok);
  remove(path);
}

/* fuzz_tokenizer: a vocab whose first token is the empty string did pointer arithmetic on a NULL
 * buffer (undefined behaviour, reported by the sanitizer build). */
static void tokenizer_empty_vocab_string_loads(void) {
  const char *path = "/tmp/rx_fuzz_found_empty.json";
  char text[512];
  rx_tokenizer *tok = NULL;
  snprintf(text, sizeof text, "{%s, \"model\": {\"type\": \"BPE\", \"vocab\": {\"\": 0, \"a\": 1}, \"merges\": []}}", BYTE_PRE);
  write_text(path, text);
  CHECK_OK(rx_tokenizer_load(&tok, path));
  if (tok) {
    int32_t ids[4];
    int64_t n = -1;
    CHECK_OK(rx_tokenizer_encode(tok, "aa", 2, 0, ids, 4, &n));
    CHECK(n == 2 && ids[0] == 1 && ids[1] == 1, "\"aa\" -> [1, 1], got %lld ids", (long long)n);
    rx_tokenizer_free(tok);
  }
  remove(path);
}

int main(void) {
  RUN(json_long_numbers_keep_every_digit);
  RUN(tokenizer_second_template_is_refused);
  RUN(tokenizer_encodes_empty_text);
  RUN(tokenizer_shared_ids_are_refused);
  RUN(tokenizer_empty_vocab_string_loads);
  RUN(model_config_beyond_memory_is_refused);
  return check_summary("test_fuzz_found");
}
