/* instantiate.h: compile the kernel body file named by RX_KERNEL_BODY once per float type.
 * Inside the body, REAL is the element type and FN(name) appends the type suffix
 * (FN(rx_cpu_add) -> rx_cpu_add_f32 / rx_cpu_add_f64; FN(rx_exp) picks the matching helper).
 * No include guard: a .c file defines RX_KERNEL_BODY and includes this once. */
#define REAL float
#define FN(name) name##_f32
#include RX_KERNEL_BODY
#undef REAL
#undef FN
#define REAL double
#define FN(name) name##_f64
#include RX_KERNEL_BODY
#undef REAL
#undef FN
