/* rmsnorm.c: RMS normalisation over the channel dimension; body in rmsnorm.inc. */
#include "cpu.h"

#define RX_KERNEL_BODY "rmsnorm.inc"
#include "instantiate.h"
