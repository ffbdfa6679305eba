/* json.h: a small strict JSON (RFC 8259) DOM parser for checkpoint headers, configs and
 * tokenizer files. Internal to the engine. */
#ifndef RX_JSON_H
#define RX_JSON_H
#include <stddef.h>
#include <stdint.h>

typedef enum { RX_JSON_NULL, RX_JSON_BOOL, RX_JSON_NUMBER, RX_JSON_STRING, RX_JSON_ARRAY, RX_JSON_OBJECT } rx_json_kind;

typedef struct rx_json rx_json;
struct rx_json {
  rx_json_kind kind;
  int boolean;
  int is_integer;       /* number written without fraction or exponent, fits int64 */
  int64_t integer;
  double number;
  const char *str;      /* decoded UTF-8, NUL-terminated (strings) */
  size_t len;           /* string byte length */
  const char *key;      /* member name when inside an object, decoded, NUL-terminated */
  size_t key_len;
  rx_json *child;       /* first element or member */
  rx_json *next;        /* next sibling */
  int64_t count;        /* number of elements or members */
  size_t offset;        /* byte offset in the source, for messages */
};

typedef struct rx_json_doc rx_json_doc;

/* Parses text[0..len). On failure returns NULL and writes "byte N: what" into err. */
rx_json_doc *rx_json_parse(const char *text, size_t len, char *err, size_t errlen);
rx_json *rx_json_root(rx_json_doc *doc);
void rx_json_free(rx_json_doc *doc);
/* Member of an object by name (first match), or NULL. */
rx_json *rx_json_get(const rx_json *obj, const char *key);
const char *rx_json_kind_name(rx_json_kind kind);

#endif
