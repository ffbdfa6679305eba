/* model_internal.h: the decoder's internals, shared by model.c and the generation code. */
#ifndef RX_MODEL_INTERNAL_H
#define RX_MODEL_INTERNAL_H
#include "internal.h"

typedef struct layer_params {
  int64_t ln1, q_w, q_b, k_w, k_b, v_w, v_b, o_w, ln2, gate, up, down;
} layer_params;

/* Activations of one layer; views into the activation arena. */
typedef struct layer_acts {
  rx_tensor rstd1, xn1, q, k, v, q4, k4, v4, att, att4, lse, x_mid, rstd2, xn2, gate, up, h;
} layer_acts;

typedef struct plan {
  int64_t B, T, layer_sets;  /* layer_sets: L (all layers kept) or 1 (recompute / inference) */
  int32_t train, checkpoint;
  void *arena;
  int64_t bytes, capacity;
  rx_tensor *res;            /* L+1 residual streams [B*T, C]: res[l] is the input of layer l */
  layer_acts *acts;          /* layer_sets of them */
  rx_tensor xf, rstdf;       /* final norm output and its rstd */
  rx_tensor tokens, mask, positions, targets, row_logp, row_lse, row_entropy, row_dlogp;
  /* backward scratch */
  rx_tensor dx, dxn, dtmp, dh, dgate, dup, datt, datt4, dq, dk, dv, dq4, dk4, dv4, dxf;
  void *head;                /* [chunk_rows, V] logits / dlogits */
  int64_t head_rows, head_bytes;
  int valid;                 /* a train forward ran and backward may use it */
} plan;

struct rx_model {
  rx_model_config cfg;
  int64_t n_params;
  char **names;
  rx_tensor *params, *grads;
  void *param_arena, *grad_arena;
  int64_t param_bytes;
  layer_params *layers;
  int64_t embed, final_norm, lm_head;
  plan plan;
};

int rx_model_plan(rx_model *m, int64_t B, int64_t T, const rx_forward_opts *opts);
int rx_model_layer_forward(rx_model *m, int64_t l, layer_acts *a, int write_output);

void rx_model_set_inputs(rx_model *m, const int32_t *tokens, const int32_t *mask);
int rx_model_forward_hidden(rx_model *m, int (*after_layer)(void *, int64_t, layer_acts *), void *ctx);
int rx_model_check_tokens(rx_model *m, const rx_tensor *tokens, const rx_tensor *mask, int64_t *B, int64_t *T);

#endif
