/* model_internal.h: the decoder's internals, shared by model.c and the generation code. */
#ifndef RX_MODEL_INTERNAL_H
#define RX_MODEL_INTERNAL_H
#include "internal.h"

typedef struct rx_lora rx_lora;   /* adapters: engine/model/lora.c */

typedef struct layer_params {
  int64_t ln1, q_w, q_b, k_w, k_b, v_w, v_b, o_w, q_norm, k_norm, ln2, gate, up, down;   /* -1: absent */
} layer_params;

/* Activations of one layer; views into the activation arena. With qk_norm, q_raw / k_raw hold
 * the projections before the per-head norm (q_rows etc. are [N*heads, D] views for it). */
typedef struct layer_acts {
  rx_tensor rstd1, xn1, q, k, v, q4, k4, v4, att, att4, lse, x_mid, rstd2, xn2, gate, up, h;
  rx_tensor q_raw, k_raw, q_rstd, k_rstd, q_rows, k_rows, q_raw_rows, k_raw_rows;
} layer_acts;

typedef struct plan {
  int64_t B, T, layer_sets;  /* layer_sets: L (all layers kept) or 1 (recompute / inference) */
  int32_t train, checkpoint;
  void *arena, *arena_handle;  /* on the model's device (arena_handle: its allocator's piece) */
  int64_t bytes, capacity;
  rx_tensor *res;            /* L+1 residual streams [B*T, C]: res[l] is the input of layer l */
  layer_acts *acts;          /* layer_sets of them */
  rx_tensor xf, rstdf;       /* final norm output and its rstd */
  rx_tensor tokens, mask, positions, targets, row_logp, row_lse, row_entropy, row_dlogp, row_dentropy;
  /* Packed rows (padding-free training; B = 1, T = N tokens): S > 0 rows end to end, their
   * boundaries cu [S+1] (carved with room for N+1), attention within each row, positions
   * restarting at each row. S = 0: the padded [B,T] layout with mask. */
  rx_tensor cu;
  int64_t S;
  int32_t *h_cu;
  rx_tensor head_max, head_sum, head_sz;   /* the head's running max and sums per row (head.c) */
  /* backward scratch */
  rx_tensor dx, dxn, dtmp, dh, dgate, dup, datt, datt4, dq, dk, dv, dq4, dk4, dv4, dxf, dq_rows, dk_rows;
  void *head, *head_handle;  /* [head_rows, head_cols] logits / dlogits: a tile of rows by a vocabulary slice */
  int64_t head_rows, head_cols, head_bytes;
  /* The host side of the batch: tokens, mask, positions and targets as the host computes them
   * (on the CPU the plan's own tensors; on a device a host copy sent with rx_tensor_copy), and
   * for a device model host room for 4 [B*T] vectors of the compute dtype (log-probabilities in
   * and out, their gradients). */
  int32_t *h_tokens, *h_mask, *h_positions, *h_targets;
  void *host;
  int valid;                 /* a train forward ran and backward may use it */
} plan;

struct rx_model {
  rx_model_config cfg;
  int64_t n_params;
  char **names;
  rx_tensor *params, *grads;
  void *param_arena, *grad_arena;      /* on cfg.device */
  void *param_handle, *grad_handle;    /* their allocator's pieces (rx_arena_free) */
  int64_t param_bytes, matrix_bytes;   /* matrix_bytes: the leading part holding the weight matrices */
  rx_tensor flat_params, flat_grads;   /* rx_model_flat's views */
  /* bf16 compute: params and grads are the f32 master copy, work the bf16 copy the forward and
   * backward read (same element offsets); NULL otherwise. On the CPU cfg.dtype is then f32 (the
   * activations' dtype) and only the weight matrices' GEMMs read work (rx_model_w). The masters are
   * a mirror (core/internal.h): AdamW rounds work in the same pass; any other write to the masters
   * marks it stale, and the next forward converts them all again (rx_model_refresh_work). */
  rx_tensor *work;
  void *work_arena, *work_handle;
  layer_params *layers;
  int64_t embed, final_norm, lm_head;
  double *inv_freq;          /* RoPE frequencies [head_dim/2], rope_scaling applied */
  plan plan;
  struct rx_lora *lora;      /* adapters (engine/model/lora.c); NULL: full fine-tuning */
  int32_t rows_alone;        /* set by generation around a decode step: every matmul computes each row as
                              * it would alone (rx_model_matmul), so the rows beside it change no bits */
};

int rx_model_plan(rx_model *m, int64_t B, int64_t T, const rx_forward_opts *opts);

/* out = inp W^T (+ bias) for the model's layers: rx_matmul_forward, or while m->rows_alone (a
 * decode step) rx_matmul_forward_rows, whose rows do not depend on each other. */
int rx_model_matmul(const rx_model *m, rx_tensor *out, const rx_tensor *inp, const rx_tensor *weight,
                    const rx_tensor *bias);

/* Parameter i as the forward and backward compute with it: a bf16 model's working copy (on the
 * CPU, of the weight matrices only: norms and biases act on f32 activations), else the parameter
 * itself; NULL for an absent parameter (i < 0). */
static inline rx_tensor *rx_model_w(rx_model *m, int64_t i) {
  if (i < 0) return NULL;
  return m->work && (m->cfg.device != RX_CPU || m->params[i].ndim == 2) ? &m->work[i] : &m->params[i];
}
/* The dtype of parameters, gradients and per-row statistics: f32 for bf16 compute (master
 * weights), else the compute dtype. */
static inline int32_t rx_model_master_dtype(const rx_model_config *c) { return c->dtype == RX_BF16 ? RX_F32 : c->dtype; }
/* A frozen bf16 model (bf16 compute with weight_dtype bf16, on cuda): every parameter in bf16
 * alone, no f32 master, no working copy, no gradients (a KL reference, a LoRA base). */
static inline int rx_model_frozen_bf16(const rx_model_config *c) { return c->dtype == RX_BF16 && c->weight_dtype == RX_BF16; }
/* The dtype norms and biases are stored in: bf16 in a frozen bf16 model, else the master dtype. */
static inline int32_t rx_model_vector_dtype(const rx_model_config *c) {
  return rx_model_frozen_bf16(c) ? RX_BF16 : rx_model_master_dtype(c);
}
/* A bf16 model's working weights (and its LoRA adapters') converted from the master weights when
 * something other than AdamW wrote the masters since the last conversion (rx_mirror_sync); a no-op
 * when AdamW kept the copy current, and for a model without a working copy. */
int rx_model_refresh_work(rx_model *m);

/* The KV-cache hook of a layer: called after RoPE with the layer's activations (a->k4, a->v4
 * hold this call's keys and values, [B, T, KV, D]), it stores them where decoding keeps them
 * and sets keys / values (and may set *mask) to what the attention reads: the cache up to and
 * including these positions. Without a hook a layer attends to its own keys and values. */
typedef struct layer_kv {
  int (*attend)(void *ctx, int64_t l, const layer_acts *a, rx_tensor *keys, rx_tensor *values,
                const rx_tensor **mask);
  void *ctx;
  /* Optional: the attention itself (a->att4, a->lse from a->q4 and what attend set), for a
   * caller whose cache needs another kernel (generation's CUDA graphs: lengths read on the
   * device); NULL: rx_attention_forward. */
  int (*attention)(void *ctx, int64_t l, layer_acts *a, const rx_tensor *keys, const rx_tensor *values,
                   const rx_tensor *mask);
} layer_kv;

/* What one layer call reads and writes besides its activations. */
typedef struct layer_io {
  const rx_tensor *x;          /* input residual stream [N, C] */
  rx_tensor *out;              /* output residual [N, C] (may be x); NULL: stop after the MLP's
                                * activation (recomputing for the backward, the output is kept) */
  const rx_tensor *positions;  /* i32 [N]: RoPE positions */
  const rx_tensor *mask;       /* i32 [B, Tk]: the keys each query row may see (besides causality) */
  const layer_kv *kv;          /* NULL: attend to this call's own keys and values */
  const rx_tensor *cu_seqlens; /* packed rows' boundaries [S+1] (B = 1), or NULL: each batch row one row */
} layer_io;

/* The decoder layer, written once for training, prefill and decoding (layer.c): pre-norm
 * attention with q/k/v projections (biases for Qwen2, per-head q/k RMSNorm for Qwen3), RoPE,
 * grouped-query attention, then the SwiGLU MLP, each added to the residual stream. With qk_norm,
 * the activations either keep q_raw / k_raw apart (training: the backward needs them) or alias
 * them to q / k (decoding: normalised in place), and q_rstd / k_rstd may have no data. */
int rx_model_layer(rx_model *m, int64_t l, layer_acts *a, const layer_io *io);
/* Layer l of the planned batch: from res[l] into res[l+1] (write_output), or only the
 * activations again (gradient checkpointing). */
int rx_model_layer_forward(rx_model *m, int64_t l, layer_acts *a, int write_output);

/* Copies a batch of host tokens and mask (NULL: all real) into the plan. */
int rx_model_set_inputs(rx_model *m, const int32_t *tokens, const int32_t *mask);
/* After rx_model_set_inputs: row b's RoPE positions start at offset[b] instead of 0 (a batch that
 * continues rows whose earlier tokens sit in a KV cache, generate.c's rx_generate_continue). */
int rx_model_shift_positions(rx_model *m, const int32_t *offset);
/* The same for S packed rows of a [1, N] plan: tokens [N], boundaries cu [S+1] (checked by the
 * caller): positions restart at each row, no target crosses a boundary. */
int rx_model_set_packed_inputs(rx_model *m, const int32_t *tokens, const int32_t *cu, int64_t S);
/* The attention's mask and boundaries of the planned batch (one of them NULL). */
static inline const rx_tensor *rx_plan_mask(const plan *p) { return p->S ? NULL : &p->mask; }
static inline const rx_tensor *rx_plan_cu(const plan *p) { return p->S ? &p->cu : NULL; }
/* Embedding, every layer (with the KV-cache hook kv when given), final norm into xf. */
int rx_model_forward_hidden(rx_model *m, const layer_kv *kv);
int rx_model_backward_trunk(rx_model *m);   /* dL/d plan.dxf -> the parameters' gradients */
/* The linear layers of layer l (proj = RX_PROJ_*), with their adapter when there is one:
 * out = inp W^T + b (+ scale (dropout(inp) A^T) B^T); backward overwrites dinp and accumulates
 * the adapter's gradients, and the base's only when the base is not frozen. linear.c. */
int rx_model_linear_forward(rx_model *m, int64_t l, int32_t proj, rx_tensor *out, const rx_tensor *inp);
int rx_model_linear_backward(rx_model *m, int64_t l, int32_t proj, rx_tensor *dinp, const rx_tensor *dout,
                             const rx_tensor *inp);
/* The parameter indices of layer l's projection proj: weight *w, bias *b (-1: none). */
void rx_model_proj_param(const rx_model *m, int64_t l, int32_t proj, int64_t *w, int64_t *b);
/* The adapter's term of those layers (lora.c): added to out / dinp, its gradients accumulated;
 * nothing when the projection has no adapter on. W: the base weight. */
int rx_lora_linear_forward(rx_model *m, int64_t l, int32_t proj, rx_tensor *out, const rx_tensor *inp,
                           const rx_tensor *W);
int rx_lora_linear_backward(rx_model *m, int64_t l, int32_t proj, rx_tensor *dinp, const rx_tensor *dout,
                            const rx_tensor *inp, const rx_tensor *W);
/* Base weights take no gradients (LoRA). */
int rx_model_frozen(const rx_model *m);
void rx_lora_free(struct rx_lora *lora);
int rx_lora_ensure_grads(rx_model *m);
void rx_lora_zero_grad(rx_model *m);
void rx_lora_begin_train_forward(rx_model *m);
/* rx_model_flat of a model training adapters: their arenas as two flat views (every adapter is a
 * matrix, so *matrices is the whole). */
int rx_lora_flat(rx_model *m, rx_tensor *fp, rx_tensor *fg, rx_tensor **params, rx_tensor **grads, int64_t *matrices);
int64_t rx_lora_param_bytes(const rx_model *m);
/* Under bf16 compute: the adapters' bf16 working copy from their f32 masters (no-op otherwise). */
int rx_lora_refresh_work(rx_model *m);
int64_t rx_lora_grad_bytes(const rx_model *m);

/* The head on xf (engine/model/head.c): forward fills row_logp (log p of each row's target, 0
 * for padding), row_lse and row_entropy; backward, given row_dlogp (and row_dentropy when
 * with_entropy), accumulates the head weight's gradient and writes dxf. */
int rx_model_head_forward(rx_model *m);
int rx_model_head_backward(rx_model *m, int with_entropy);

/* cu_seqlens is a cpu i32 [S+1] tensor of rows of at least one token from 0 to N; op names the caller. */
int rx_model_check_cu_seqlens(const rx_tensor *cu, int64_t N, const char *op);
int rx_model_check_tokens(rx_model *m, const rx_tensor *tokens, const rx_tensor *mask, int64_t *B, int64_t *T);

#endif
