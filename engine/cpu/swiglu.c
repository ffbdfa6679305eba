/* swiglu.c: the gated activation of Llama/Qwen2 MLPs; body in swiglu.inc. */
#include "cpu.h"

#define RX_KERNEL_BODY "swiglu.inc"
#include "instantiate.h"
