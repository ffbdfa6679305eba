/* add.c: elementwise sum for residual connections; body in add.inc. */
#include "cpu.h"

#define RX_KERNEL_BODY "add.inc"
#include "instantiate.h"
