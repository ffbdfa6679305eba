/* logsoftmax.c: log-softmax over the last dimension; body in logsoftmax.inc. */
#include "cpu.h"

#define RX_KERNEL_BODY "logsoftmax.inc"
#include "instantiate.h"
