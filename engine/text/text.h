/* text.h: UTF-8 and Unicode normalization helpers shared by the tokenizer sources.
 * Internal to the engine. */
#ifndef RX_TEXT_H
#define RX_TEXT_H
#include <stdint.h>

/* A growable byte buffer. */
typedef struct { uint8_t *p; int64_t n, cap; } rx_bytes;
int rx_bytes_reserve(rx_bytes *b, int64_t extra);   /* room for n + extra; RX_ENOMEM on failure */
void rx_bytes_free(rx_bytes *b);

/* Decodes one code point at s[0..n) (n >= 1) into *cp and returns its length. A byte that does
 * not start a well-formed sequence (overlong, surrogate, > U+10FFFF, truncated) decodes alone as
 * RX_UTF8_BAD + byte, so invalid input passes through every stage unchanged. */
enum { RX_UTF8_BAD = 0x110000 };
int rx_utf8_decode(const uint8_t *s, int64_t n, uint32_t *cp);
int rx_utf8_encode(uint8_t *o, uint32_t cp);        /* writes 1..4 bytes (or the raw bad byte) */

/* 1 when s is already in NFC by the quick check (ASCII runs take a fast path). */
int rx_nfc_quick_check(const uint8_t *s, int64_t n);
/* out = NFC(s), appended to out (out->n grows). Invalid bytes are copied unchanged. */
int rx_nfc_append(rx_bytes *out, const uint8_t *s, int64_t n);

#endif
