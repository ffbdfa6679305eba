/* rope.c: rotary position embedding (Hugging Face rotate-half form); body in rope.inc. */
#include "cpu.h"

#define RX_KERNEL_BODY "rope.inc"
#include "instantiate.h"
