/* cpu/attention.h: CPU kernels of causal grouped-query attention (see ops/attention.c for the
 * checks and docs/attention.md for the contract). Internal to libremax. */
#ifndef RX_CPU_ATTENTION_H
#define RX_CPU_ATTENTION_H
#include <stdint.h>

/* Sizes of one attention call. q/out/dq/dout are contiguous [B,Tq,H,D]; k/v are [B,Tk,KV,D]
 * contiguous except for their batch strides (elements); dk/dv are contiguous; lse is [B,H,Tq].
 *
 * The sequences: without cu_seqlens, each of the B batch rows is one sequence (Tq queries
 * against Tk keys, query i at key Tk-Tq+i). With cu_seqlens (packed rows: B = 1, Tq = Tk = N),
 * the time axis holds S sequences, sequence r the tokens [cu_seqlens[r], cu_seqlens[r+1]), and
 * a query sees the keys of its own sequence up to itself only. [B,T] is the case of S = B
 * sequences of length T laid end to end: both run the same code (attn_seq below). */
typedef struct rx_attn_dims {
  int64_t B, Tq, Tk, H, KV, D;
  int64_t k_batch_stride, v_batch_stride;
  double scale;                 /* already resolved: never 0 here */
  const int32_t *cu_seqlens;    /* NULL, or [S+1] on the host: 0 = cu[0] <= ... <= cu[S] = Tq */
  int64_t S;                    /* sequences in cu_seqlens (0 without) */
} rx_attn_dims;

/* Elements (of the call's float type) of the transient scratch that forward and backward need
 * when run with up to `threads` OpenMP threads: one block of scores per thread (a tile of query
 * rows times Tk keys, O(T) per thread, never O(T^2)) plus, for the backward, Delta [B,H,Tq].
 * The caller allocates it 64-byte aligned and passes the same `threads`. */
int64_t rx_cpu_attention_scratch_elems(const rx_attn_dims *dims, int threads);

void rx_cpu_attention_forward_f32(float *out, float *lse, const float *q, const float *k, const float *v,
                                  const int32_t *mask, const rx_attn_dims *dims, float *scratch, int threads);
void rx_cpu_attention_forward_f64(double *out, double *lse, const double *q, const double *k, const double *v,
                                  const int32_t *mask, const rx_attn_dims *dims, double *scratch, int threads);
/* Any of dq, dk, dv may be NULL (skipped). */
void rx_cpu_attention_backward_f32(float *dq, float *dk, float *dv, const float *dout, const float *q,
                                   const float *k, const float *v, const float *out, const float *lse,
                                   const int32_t *mask, const rx_attn_dims *dims, float *scratch, int threads);
void rx_cpu_attention_backward_f64(double *dq, double *dk, double *dv, const double *dout, const double *q,
                                   const double *k, const double *v, const double *out, const double *lse,
                                   const int32_t *mask, const rx_attn_dims *dims, double *scratch, int threads);
#endif
