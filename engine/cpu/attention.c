/* cpu/attention.c: causal grouped-query attention on CPU, for float and double.
 * The kernel body lives once in attention.inc and is instantiated here per element type. */
#include <math.h>
#include <string.h>
#include "cpu/attention.h"

/* Keys scored per step of the forward's online softmax (the score buffer lives on the stack). */
enum { RX_ATTN_KEY_TILE = 32 };
/* Keys per work item of the backward's dk/dv pass: small enough for B*KV*Tk/16 items to keep
 * every core busy, large enough that a query row loaded once serves several keys. */
enum { RX_ATTN_KEY_BLOCK = 16 };

#define REAL float
#define EXP expf
#define LOG logf
#define FN(name) name##_f32
#include "cpu/attention.inc"
#undef REAL
#undef EXP
#undef LOG
#undef FN

#define REAL double
#define EXP exp
#define LOG log
#define FN(name) name##_f64
#include "cpu/attention.inc"
#undef REAL
#undef EXP
#undef LOG
#undef FN
