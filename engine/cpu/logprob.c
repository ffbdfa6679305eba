/* logprob.c: the training head (log-probability of the chosen token per row); body in logprob.inc. */
#include "cpu.h"

#define RX_KERNEL_BODY "logprob.inc"
#include "instantiate.h"
