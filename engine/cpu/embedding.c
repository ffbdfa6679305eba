/* embedding.c: token embedding lookup and its scatter-add backward; body in embedding.inc. */
#include "cpu.h"

#define RX_KERNEL_BODY "embedding.inc"
#include "instantiate.h"
