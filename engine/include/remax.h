/* remax.h: the whole public C API of libremax.
 *
 * Rules (so that LuaJIT's ffi.cdef reads this file once the '#' lines are stripped):
 *   - no macros inside declarations; constants are enums;
 *   - fixed-width integer types; opaque handles or plain-data structs;
 *   - every fallible function returns int status (0 = ok); rx_last_error() names what failed.
 * Library code never calls exit() or abort() on bad input.
 */
#ifndef REMAX_H
#define REMAX_H
#include <stddef.h>
#include <stdint.h>
/* C++ includers wrap this header in extern "C" { } themselves: the file stays pure C for the FFI. */

/* ---------------------------------------------------------------- core: errors, version */

enum { RX_OK = 0, RX_EINVAL = 1, RX_ENOMEM = 2, RX_EIO = 3, RX_EFORMAT = 4, RX_EDEVICE = 5 };

const char *rx_last_error(void);     /* message of the last failure on this thread */
void rx_clear_error(void);
const char *rx_version(void);
int rx_has_cuda(void);               /* 1 when built with CUDA and a device is present */
/* How this build runs device "cuda": "none" (built without CUDA), "device" (nvcc, a real GPU), or
 * "emulated" (-DRX_CUDA=emulate: the CUDA sources run on the CPU, for testing, not speed). */
const char *rx_cuda_backend(void);
/* CUDA device memory (device 0): bytes in live tensors, their peak, bytes reserved from the driver
 * by remax's caching allocator, and the device's free and total bytes. Fails without a device. */
int rx_cuda_memory(int64_t *allocated, int64_t *peak, int64_t *reserved, int64_t *free_bytes, int64_t *total_bytes);
/* Waits until every queued GPU operation has finished (for timing); fails without a device. */
int rx_cuda_synchronize(void);
/* OpenBLAS's kernel set in use ("SkylakeX", "Haswell", ...), and the one to ask for with
 * OPENBLAS_CORETYPE when OpenBLAS did not recognise this CPU and fell back to an older set
 * (NULL when the choice is already right, or when OPENBLAS_CORETYPE is set). */
const char *rx_blas_core(void);
const char *rx_blas_better_core(void);
/* 1 when the f32 and f64 GEMMs give the same bits for any thread count with this kernel set:
 * OpenBLAS's AVX-512 sets (SkylakeX, Cooperlake, SapphireRapids), fed K in parts that its
 * threaded and single-threaded drivers block alike; 0 elsewhere (its AVX2 sets Haswell and Zen
 * compute the edges of each thread's share with other kernels: measured, docs/generation.md). */
int32_t rx_blas_same_bits(void);
/* The bf16 kernels this CPU runs, or why none (for `remax version`): e.g. "vdpbf16ps (AVX-512
 * BF16) for bf16 weights' matmuls". */
const char *rx_bf16_kernels(void);
/* The GEMMs bf16 training runs on this CPU (a model of compute dtype RX_BF16 on RX_CPU) and why
 * they were chosen; rx_bf16_train_pays: 1 where they are expected to outrun f32 training's (AMX,
 * or AVX-512 BF16 on AMD, with oneDNN built in), the rule of the trainer's dtype = auto. */
const char *rx_bf16_train_kernels(void);
int rx_bf16_train_pays(void);
const char *rx_abi_layout(void);     /* "name size\nname.field offset\n..." for every struct here */
/* Engine options: the behaviour switches a run's settings set (docs/trainer.md, "Engine
 * options"): bf16_gemm (auto|onednn|sgemm), bf16_dot (on|off), cuda_graphs (on|off),
 * host_sampler (on|off), cuda_alloc (caching|plain: before the first device allocation),
 * cuda_sync (on|off). An option's environment variable (REMAX_BF16_GEMM, REMAX_NO_BF16_DOT,
 * REMAX_CUDA_GRAPHS, REMAX_HOST_SAMPLER, REMAX_CUDA_ALLOC, REMAX_CUDA_SYNC), when set, overrides
 * the setting as a developer's switch; rx_engine_overrides lists those in force ("" when none).
 * rx_set_option fails naming the option and its values; rx_get_option gives the value in force
 * (NULL: no such option). */
int rx_set_option(const char *name, const char *value);
const char *rx_get_option(const char *name);
int32_t rx_option_count(void);
const char *rx_option_name(int32_t i);
const char *rx_option_values(int32_t i);
const char *rx_option_env(int32_t i);
const char *rx_engine_overrides(void);
/* Ctrl-C: after install, the first SIGINT/SIGTERM only sets a flag (its signal number) that
 * rx_signal_pending returns; a second one ends the process at once. */
int rx_signal_install(void);
int rx_signal_pending(void);
void rx_signal_clear(void);
/* Child processes (reward workers, cmd: programs) end when this process ends: each one's process
 * group is registered here, and is sent SIGKILL at exit (atexit), on a second SIGINT/SIGTERM
 * after rx_signal_install, and on a first one before it (which then ends the process as the
 * default action would). rx_child_add fails when the table (256 groups) is full. */
int rx_child_add(int pgid);
void rx_child_remove(int pgid);
/* Test hook of the crash-safety test (tests/lua/checkpoint_crash_spec.lua): the checkpoint
 * writers (engine/io/safetensors.c, lua/remax/fs.lua, runs.lua) call it at each write event.
 * With REMAX_CRASH_AT=N in the environment the Nth call raises SIGKILL; with REMAX_CRASH_LIST=1
 * each call prints "remax-crash-point N: event" to stderr. Otherwise it does nothing. */
void rx_crash_point(const char *event);
/* Per-phase timer of the CPU engine, off by default (REMAX_PROFILE=1 in the environment when the
 * library loads, or rx_profile_enable(1)): wall time and calls of each phase (the kernels,
 * linear layers, head, AdamW, zero_grad; an inner phase's time is taken out of the outer one's)
 * since the last reset. rx_profile_read gives phase i's name (NULL outside [0, phases)). */
void rx_profile_enable(int32_t on);
int32_t rx_profile_enabled(void);
void rx_profile_reset(void);
int32_t rx_profile_phases(void);
const char *rx_profile_read(int32_t i, double *seconds, int64_t *calls);

/* ---------------------------------------------------------------- core: tensors */

typedef enum rx_dtype {
  RX_F32 = 0, RX_F64 = 1, RX_BF16 = 2, RX_F16 = 3, RX_I32 = 4, RX_I64 = 5, RX_DTYPE_COUNT = 6
} rx_dtype;

typedef enum rx_device { RX_CPU = 0, RX_CUDA = 1 } rx_device;

enum { RX_MAX_DIMS = 4 };

typedef struct rx_storage rx_storage;   /* reference-counted allocation, opaque */

/* A tensor is a typed view of a storage: data points at element [0,0,...].
 * Strides are in elements. Kernels require contiguous tensors unless they say otherwise. */
typedef struct rx_tensor {
  void *data;
  rx_storage *storage;
  int64_t shape[4];
  int64_t stride[4];
  int64_t numel;
  int32_t ndim;
  int32_t dtype;        /* rx_dtype */
  int32_t device;       /* rx_device */
  int32_t device_index;
} rx_tensor;

const char *rx_dtype_name(int32_t dtype);
int64_t rx_dtype_size(int32_t dtype);
int rx_dtype_from_name(const char *name, int32_t *dtype);   /* "f32", "float32", "BF16", ... */

/* New zero-filled contiguous tensor. ndim in 0..4. */
int rx_tensor_new(rx_tensor **out, int32_t dtype, int32_t device, int32_t ndim, const int64_t *shape);
/* Wrap memory the caller owns (not freed by rx_tensor_free). */
int rx_tensor_wrap(rx_tensor **out, void *data, int32_t dtype, int32_t ndim, const int64_t *shape);
void rx_tensor_free(rx_tensor *t);
/* A view sharing storage: new shape (contiguous source only; -1 infers one dim). */
int rx_tensor_reshape(rx_tensor **out, const rx_tensor *t, int32_t ndim, const int64_t *shape);
/* A view of [start, start+len) along dim. */
int rx_tensor_narrow(rx_tensor **out, const rx_tensor *t, int32_t dim, int64_t start, int64_t len);
int rx_tensor_is_contiguous(const rx_tensor *t);
/* dst = src, converting dtype; shapes must have equal numel; src may be strided. */
int rx_tensor_copy(rx_tensor *dst, const rx_tensor *src);
int rx_tensor_fill(rx_tensor *t, double value);
/* Philox-4x32 random fill; element i depends only on (seed, offset + i), never on threads. */
int rx_tensor_uniform(rx_tensor *t, uint64_t seed, uint64_t offset, double lo, double hi);
int rx_tensor_normal(rx_tensor *t, uint64_t seed, uint64_t offset, double mean, double std);
/* Element access for bindings and tests (any dtype, flat index into the logical shape). */
int rx_tensor_get(const rx_tensor *t, int64_t index, double *value);
int rx_tensor_set(rx_tensor *t, int64_t index, double value);
/* Bulk exchange with a caller's double buffer of numel values. */
int rx_tensor_read_f64(const rx_tensor *t, double *out);
int rx_tensor_write_f64(rx_tensor *t, const double *in);

/* Philox-4x32-10: four 32-bit words from key (2 words) and counter (4 words). */
void rx_philox4x32(const uint32_t key[2], const uint32_t counter[4], uint32_t out[4]);

/* ---------------------------------------------------------------- kernels
 * Layer ops over tensors, dispatched on device. Float kernels accept f32 and f64 (f64 for
 * finite-difference checks); all tensors of one call share dtype and device.
 * Shapes: N = rows (B*T), C = channels. Backward functions ACCUMULATE (+=) into parameter
 * gradients (dweight, dbias) and OVERWRITE input gradients (dinp), unless said otherwise. */

/* y[rows,out] = x[rows,in] · W[out,in]^T (+ b[out]); x and y may have any leading dims. */
int rx_matmul_forward(rx_tensor *out, const rx_tensor *inp, const rx_tensor *weight, const rx_tensor *bias);
/* dinp = dout · W; dweight += dout^T · inp; dbias += sum over rows of dout. */
int rx_matmul_backward(rx_tensor *dinp, rx_tensor *dweight, rx_tensor *dbias, const rx_tensor *dout,
                       const rx_tensor *inp, const rx_tensor *weight);
/* out[rows,C] = weight[tokens[rows], :]; a token outside [0,V) fails naming token and row. */
int rx_embedding_forward(rx_tensor *out, const rx_tensor *tokens, const rx_tensor *weight);
int rx_embedding_backward(rx_tensor *dweight, const rx_tensor *dout, const rx_tensor *tokens);
/* out = inp * rstd * weight over the last dim C; rstd[rows] saved for backward (may be NULL). */
int rx_rmsnorm_forward(rx_tensor *out, rx_tensor *rstd, const rx_tensor *inp, const rx_tensor *weight, double eps);
int rx_rmsnorm_backward(rx_tensor *dinp, rx_tensor *dweight, const rx_tensor *dout, const rx_tensor *inp,
                        const rx_tensor *weight, const rx_tensor *rstd);
/* Hugging Face rotate-half RoPE. inp [.., heads, D] with one position per row of heads
 * (positions i32, numel = numel(inp)/(heads*D)); inv_freq_i = theta^(-2i/D). out may alias inp. */
int rx_rope_forward(rx_tensor *out, const rx_tensor *inp, const rx_tensor *positions, double theta);
int rx_rope_backward(rx_tensor *dinp, const rx_tensor *dout, const rx_tensor *positions, double theta);
/* The same with the frequencies given: angle_i = position * inv_freq[i], i < D/2 (see
 * rx_rope_frequencies). */
int rx_rope_forward_freq(rx_tensor *out, const rx_tensor *inp, const rx_tensor *positions, const double *inv_freq);
int rx_rope_backward_freq(rx_tensor *dinp, const rx_tensor *dout, const rx_tensor *positions, const double *inv_freq);
/* out = silu(gate) * up, elementwise. */
int rx_swiglu_forward(rx_tensor *out, const rx_tensor *gate, const rx_tensor *up);
int rx_swiglu_backward(rx_tensor *dgate, rx_tensor *dup, const rx_tensor *dout, const rx_tensor *gate, const rx_tensor *up);
/* out[rows,V] = log_softmax(inp) over the last dim. dinp = dout - softmax * sum(dout). */
int rx_logsoftmax_forward(rx_tensor *out, const rx_tensor *inp);
int rx_logsoftmax_backward(rx_tensor *dinp, const rx_tensor *dout, const rx_tensor *out);
/* The training head on one chunk of rows: logp[r] = log_softmax(logits[r])[targets[r]],
 * lse[r] = logsumexp(logits[r]) saved (may be NULL); entropy[r] (may be NULL) = -sum p log p.
 * A target < 0 means "no token" (padding): logp 0 and zero gradient. Other out-of-range
 * targets fail naming the row and value. */
int rx_logprob_forward(rx_tensor *logp, rx_tensor *lse, rx_tensor *entropy, const rx_tensor *logits,
                       const rx_tensor *targets);
/* dlogits[r,:] = dlogp[r] * (onehot(targets[r]) - softmax(logits[r])). dlogits may be the same
 * tensor as logits (in place), so the head needs one chunk buffer. */
int rx_logprob_backward(rx_tensor *dlogits, const rx_tensor *dlogp, const rx_tensor *logits,
                        const rx_tensor *targets, const rx_tensor *lse);
/* The head's backward with a gradient through the entropy too (an entropy bonus):
 * dlogits[r,:] = dlogp[r] (onehot - p) - dentropy[r] p (log p + H[r]). In place allowed. */
int rx_logprob_entropy_backward(rx_tensor *dlogits, const rx_tensor *dlogp, const rx_tensor *dentropy,
                                const rx_tensor *logits, const rx_tensor *targets, const rx_tensor *lse);
/* out = a + b elementwise (residual connections); out may alias a or b. */
int rx_add(rx_tensor *out, const rx_tensor *a, const rx_tensor *b);

/* Causal grouped-query attention with online softmax.
 * q [B,Tq,H,D]; k, v [B,Tk,KV,D] with KV dividing H (head h reads kv head h/(H/KV)); Tq <= Tk and
 * query i sits at key position Tk-Tq+i (Tq == Tk in training; Tq < Tk when decoding against a
 * KV cache). k and v may be views of a larger cache: their batch stride (stride[0]) may exceed
 * Tk*KV*D; the other dims are contiguous. mask i32 [B,Tk] (1 = token, 0 = padding; NULL = all
 * tokens): a query attends to keys s <= its position with mask 1. A query whose own position is
 * padding (or that sees no key) outputs zeros and gets zero gradient. lse [B,H,Tq] (same float
 * dtype) is saved for backward; extra memory stays O(B*H*T), never O(T^2).
 * scale 0 means 1/sqrt(D). */
int rx_attention_forward(rx_tensor *out, rx_tensor *lse, const rx_tensor *q, const rx_tensor *k,
                         const rx_tensor *v, const rx_tensor *mask, double scale);
/* dq, dk, dv are overwritten (dk/dv contiguous [B,Tk,KV,D]). */
int rx_attention_backward(rx_tensor *dq, rx_tensor *dk, rx_tensor *dv, const rx_tensor *dout,
                          const rx_tensor *q, const rx_tensor *k, const rx_tensor *v,
                          const rx_tensor *out, const rx_tensor *lse, const rx_tensor *mask, double scale);
/* The same over packed rows (padding-free training): cu_seqlens i32 [S+1] on q's device holds
 * the boundaries of S rows laid end to end along the time axis, 0 = cu[0] <= ... <= cu[S] = N,
 * with q [1,N,H,D], k, v [1,N,KV,D] and lse [1,H,N]. A query attends causally to the keys of
 * its own row only (row r: tokens [cu[r], cu[r+1])). NULL cu_seqlens is rx_attention_forward /
 * rx_attention_backward: each batch row one sequence, which is the case of B rows of equal
 * length T. mask may be given as well ([1,N]). */
int rx_attention_forward_seq(rx_tensor *out, rx_tensor *lse, const rx_tensor *q, const rx_tensor *k,
                             const rx_tensor *v, const rx_tensor *mask, const rx_tensor *cu_seqlens, double scale);
int rx_attention_backward_seq(rx_tensor *dq, rx_tensor *dk, rx_tensor *dv, const rx_tensor *dout,
                              const rx_tensor *q, const rx_tensor *k, const rx_tensor *v,
                              const rx_tensor *out, const rx_tensor *lse, const rx_tensor *mask,
                              const rx_tensor *cu_seqlens, double scale);

/* ---------------------------------------------------------------- optimizer */

/* AdamW with decoupled weight decay (Loshchilov & Hutter) and bias correction.
 * step is the 1-based number of this update (bias correction uses beta^step). */
typedef struct rx_adamw_config {
  double lr;
  double beta1;
  double beta2;
  double eps;
  double weight_decay;
  int64_t step;
} rx_adamw_config;

/* One update of one tensor. grad has param's shape and dtype; m and v (f32, or f64 for an f64
 * param) hold the moments. decay 0 skips weight decay for this tensor (biases, norms: the
 * caller decides by name). */
int rx_adamw_step(rx_tensor *param, const rx_tensor *grad, rx_tensor *m, rx_tensor *v,
                  const rx_adamw_config *cfg, int32_t decay);
/* Global L2 norm of n gradient tensors, accumulated in double. Inf/NaN propagate. */
int rx_grad_norm(const rx_tensor *const *grads, int64_t n, double *norm);
/* Scales all n gradients by max_norm / (norm + 1e-6) when norm > max_norm; *norm gets the
 * norm before clipping. Non-finite norms leave gradients untouched (the caller skips the step). */
int rx_clip_grad_norm(rx_tensor *const *grads, int64_t n, double max_norm, double *norm);
/* t *= s elementwise (gradient accumulation averaging). */
int rx_scale(rx_tensor *t, double s);
/* Sum of squares of n gradients (f32 / f64; f32 on cuda): a rank's ZeRO-2 shard, which the ranks
 * add into the global norm (engine/optim/zero.c). */
int rx_grad_sum_squares(const rx_tensor *const *grads, int64_t n, double *out);

/* ---------------------------------------------------------------- model */

/* A decoder transformer of the Llama / Qwen2 family. Field names follow Hugging Face's
 * config.json; the Lua side reads and validates config.json and fills this struct. */
enum { RX_ROPE_DEFAULT = 0, RX_ROPE_LLAMA3 = 1 };   /* rope_scaling kinds */

typedef struct rx_model_config {
  int64_t vocab_size;
  int64_t hidden_size;
  int64_t intermediate_size;
  int64_t num_hidden_layers;
  int64_t num_attention_heads;
  int64_t num_key_value_heads;
  int64_t head_dim;
  int64_t max_position_embeddings;
  double rms_norm_eps;
  double rope_theta;
  int32_t tie_word_embeddings;
  int32_t attention_bias;        /* q/k/v projections have biases (Qwen2) */
  int32_t dtype;                 /* compute dtype: RX_F32 (or RX_F64 for gradient checks), or RX_BF16:
                                  * f32 master weights, gradients and statistics (logp, entropy) and
                                  * a bf16 working copy of the weights; on RX_CUDA bf16 activations,
                                  * on RX_CPU f32 activations with the weight matrices' GEMMs on the
                                  * bf16 copy (inputs rounded to bf16, f32 sums), and the model's
                                  * config then reads f32 (rx_model_gemm_dtype says bf16) */
  int32_t device;                /* RX_CPU or RX_CUDA: where parameters, gradients and activations live */
  int32_t qk_norm;               /* RMSNorm of each query and key head before RoPE (Qwen3: q_norm, k_norm) */
  int32_t rope_scaling;          /* RX_ROPE_DEFAULT, or RX_ROPE_LLAMA3 with the four fields below */
  double rope_factor;
  double rope_low_freq_factor;
  double rope_high_freq_factor;
  int64_t rope_original_max_position_embeddings;
  int32_t weight_dtype;          /* storage of frozen weights. RX_BF16 with f32 compute on the CPU keeps
                                  * the weight matrices (embeddings, projections, head) in bf16, norms
                                  * and biases in f32 (half the memory); RX_BF16 with bf16 compute on
                                  * cuda keeps every parameter in bf16 alone: no f32 master weights,
                                  * no working copy (a third of a trained bf16 model's weight memory).
                                  * Either way frozen: no gradients (LoRA adapters may train on it).
                                  * Any other value (0 = RX_F32 included): trainable weights, in the
                                  * compute dtype (f32 masters for bf16 compute). */
} rx_model_config;

/* inv_freq[0 .. head_dim/2) of a config: rope_theta^(-2i/head_dim), then its rope_scaling
 * applied as Hugging Face transformers does (Llama 3.1's smooth wavelength interpolation). */
int rx_rope_frequencies(const rx_model_config *c, double *inv_freq);

typedef struct rx_model rx_model;

/* A model with zeroed parameters and gradients, one arena each, tensors named as in Hugging
 * Face checkpoints ("model.layers.0.self_attn.q_proj.weight", ...). */
int rx_model_new(rx_model **out, const rx_model_config *cfg);
void rx_model_free(rx_model *m);
const rx_model_config *rx_model_get_config(const rx_model *m);
/* The dtype the weight matrices are stored in: RX_BF16 when the config asks for bf16 storage
 * (frozen weights, see weight_dtype), else the dtype of the parameters (f32 master weights for
 * bf16 compute, else the compute dtype). */
int32_t rx_model_weight_dtype(const rx_model_config *c);
/* The dtype the weight matrices' GEMMs read: RX_BF16 for a bf16 model (its working copy) or bf16
 * storage, else the compute dtype. */
int32_t rx_model_gemm_dtype(const rx_model *m);
int64_t rx_model_param_count(const rx_model *m);
const char *rx_model_param_name(const rx_model *m, int64_t i);
/* Borrowed views into the parameter / gradient arenas (valid while the model lives). */
rx_tensor *rx_model_param(rx_model *m, int64_t i);
rx_tensor *rx_model_grad(rx_model *m, int64_t i);
/* The parameters and their gradients as two flat 1-D buffers of the compute dtype on the model's
 * device, for an optimizer that updates every tensor at once (AdamW in two calls, clipping in
 * one): each tensor lies at its own 64-byte aligned offset, the padding between tensors stays
 * zero, and the first *matrices elements hold the weight matrices (decayed by default), the rest
 * the norms and biases. The views belong to the model (valid until it is freed). For a model
 * training LoRA adapters, the adapters' buffers (all matrices). Fails for a model storing its
 * weights in another dtype than it computes in (frozen). */
int rx_model_flat(rx_model *m, rx_tensor **params, rx_tensor **grads, int64_t *matrices);
/* Index of a parameter by name, or -1. */
int64_t rx_model_find_param(const rx_model *m, const char *name);
void rx_model_zero_grad(rx_model *m);

/* Options of one forward pass. */
typedef struct rx_forward_opts {
  int32_t train;             /* keep what backward needs (1) or only what the forward needs (0) */
  int32_t checkpoint;        /* with train: keep layer inputs only, recompute layers in backward */
  int64_t head_chunk_rows;   /* rows of the head's logits computed at once; 0 = automatic */
  int64_t head_chunk_vocab;  /* ... by this many vocabulary entries at once; 0 = automatic */
} rx_forward_opts;

/* logp[b,t] = log p(tokens[b,t] | tokens[b,<t]) for t whose token and previous token are both
 * real (mask 1); 0 elsewhere (the first real token of a row, padding). tokens, mask: i32 [B,T]
 * (mask NULL = all real); left or right padding; positions count real tokens. logp (and
 * entropy of the predicting distribution, optional) are [B,T] in the compute dtype. The full
 * [B,T,vocab] logits never exist: the head works on tiles of rows by slices of the vocabulary. */
int rx_model_logprobs(rx_model *m, const rx_tensor *tokens, const rx_tensor *mask, rx_tensor *logp,
                      rx_tensor *entropy, const rx_forward_opts *opts);
/* The same over packed rows (padding-free training): tokens i32 [1,N] hold S rows end to end,
 * row r the tokens [cu[r], cu[r+1]) of cu_seqlens (cpu i32 [S+1], 0 = cu[0] < cu[1] < ... <
 * cu[S] = N). Each row is what it would be alone: positions restart at 0 at each row, attention
 * stays within it, and logp[0, cu[r]] (a row's first token) is 0. logp, entropy: [1,N].
 * rx_model_backward / rx_model_backward_entropy then take dlogp [1,N]. */
int rx_model_logprobs_packed(rx_model *m, const rx_tensor *tokens, const rx_tensor *cu_seqlens, rx_tensor *logp,
                             rx_tensor *entropy, const rx_forward_opts *opts);
/* Accumulates parameter gradients of sum(dlogp * logp) for the last train forward. */
int rx_model_backward(rx_model *m, const rx_tensor *dlogp);
/* The same for sum(dlogp * logp + dentropy * entropy): entropy as rx_model_logprobs returns it.
 * dentropy NULL is rx_model_backward. */
int rx_model_backward_entropy(rx_model *m, const rx_tensor *dlogp, const rx_tensor *dentropy);
/* The sizes the activation plan of a (B,T) forward takes (the one place they are computed; Lua's
 * memory checks ask here): the activations' arena and the head's logits tile, in bytes, for a
 * model of config cfg (as rx_model_get_config returns it) and opts (train, checkpoint, head
 * chunks). Packed rows of N tokens plan as (1, N). Allocates nothing. */
int rx_model_plan_bytes(const rx_model_config *cfg, int64_t B, int64_t T, const rx_forward_opts *opts,
                        int64_t *activation_bytes, int64_t *head_bytes);
/* Sizes the activation plan for a token budget once: every later forward of at most `tokens`
 * tokens (packed rows, or B*T <= tokens padded) reuses the arena (it only grows). */
int rx_model_reserve(rx_model *m, int64_t tokens, const rx_forward_opts *opts);
/* Bytes held by parameters, gradients, the activation plan of the last (B,T) shape, and the
 * head's logits chunk. */
typedef struct rx_model_memory {
  int64_t param_bytes;
  int64_t grad_bytes;
  int64_t activation_bytes;
  int64_t head_bytes;
} rx_model_memory;
void rx_model_memory_usage(const rx_model *m, rx_model_memory *out);

/* LoRA (Hu et al. 2021, as PEFT does it): a linear layer y = W x + b becomes
 * y = W x + b + (alpha / r) * B A dropout(x), A [r, in], B [out, r]. The base weights freeze:
 * backward leaves them without gradient buffers and rx_model_grad returns NULL for them; the
 * adapters are the only trainable tensors. Projections by index: */
enum { RX_PROJ_Q = 0, RX_PROJ_K = 1, RX_PROJ_V = 2, RX_PROJ_O = 3, RX_PROJ_GATE = 4, RX_PROJ_UP = 5,
       RX_PROJ_DOWN = 6, RX_PROJ_COUNT = 7 };

typedef struct rx_lora_config {
  int64_t r;                 /* rank, >= 1 and <= min(in, out) of every adapted projection */
  double alpha;              /* scale = alpha / r */
  double dropout;            /* probability in [0, 1) of zeroing an input of A (train forwards only) */
  uint32_t targets;          /* bit (1 << RX_PROJ_*) for every adapted projection, in every layer */
  uint32_t pad_;
  uint64_t seed;             /* A's Kaiming-uniform init and the dropout masks (Philox) */
} rx_lora_config;

/* Adds adapters to every targeted projection: A ~ U(-1/sqrt(in), 1/sqrt(in)) (PEFT's
 * kaiming_uniform_(a = sqrt(5))), B = 0, so the model starts equal to its base. Once per model;
 * frees base gradients that exist. Adapter tensors are named as the base weight with
 * ".weight" -> ".lora_A.weight" / ".lora_B.weight" ("model.layers.0.self_attn.q_proj.lora_A.weight"). */
int rx_model_lora_init(rx_model *m, const rx_lora_config *cfg);
/* The configuration given to rx_model_lora_init, or NULL when the model has no adapters. */
const rx_lora_config *rx_model_lora_get_config(const rx_model *m);
int64_t rx_model_lora_count(const rx_model *m);            /* adapter tensors (2 per adapted projection) */
const char *rx_model_lora_name(const rx_model *m, int64_t i);
rx_tensor *rx_model_lora_param(rx_model *m, int64_t i);
rx_tensor *rx_model_lora_grad(rx_model *m, int64_t i);     /* allocated (zeroed) on first use */
/* Adapters on (1, the default) or off (0: the model computes exactly its base, bit for bit:
 * the reference model of a KL penalty, with no second copy of the weights). */
void rx_model_lora_set_enabled(rx_model *m, int32_t enabled);
int32_t rx_model_lora_enabled(const rx_model *m);
/* Train forwards so far: the dropout masks of a train forward are keyed by (seed, this count,
 * layer, projection, element), so a resumed run that sets it back draws the same masks. */
uint64_t rx_model_lora_forward_count(const rx_model *m);
void rx_model_lora_set_forward_count(rx_model *m, uint64_t count);
/* out = W + (alpha / r) B A for base parameter `param` (a copy of W when it has no adapter);
 * out has W's shape, in W's dtype. The sum B A is accumulated in double. */
int rx_model_lora_merged(rx_model *m, int64_t param, rx_tensor *out);

/* Final-norm hidden states at one position per row, the input of a sequence-classification
 * head (transformers' *ForSequenceClassification): out[b, :] = hidden(tokens[b, index[b]]) for
 * tokens, mask i32 [B,T] (mask NULL = all real) and out [B, hidden] in the compute dtype. An
 * inference forward (no gradients, adapters as they are set). */
int rx_model_hidden_at(rx_model *m, const rx_tensor *tokens, const rx_tensor *mask, const int64_t *index,
                       rx_tensor *out);
/* The same hidden states from a train forward (opts->train is implied; opts->checkpoint as in
 * rx_model_logprobs), kept for rx_model_hidden_backward: the training forward of a reward model. */
int rx_model_hidden_train(rx_model *m, const rx_tensor *tokens, const rx_tensor *mask, const int64_t *index,
                          rx_tensor *out, const rx_forward_opts *opts);
/* Accumulates the gradients of sum(dout * out) for the last rx_model_hidden_train (same index):
 * dout [B, hidden] in the compute dtype, on the model's device; every other position's hidden
 * state gets no gradient. Adapters only when the model has LoRA adapters. */
int rx_model_hidden_backward(rx_model *m, const int64_t *index, const rx_tensor *dout);
/* The same over packed rows (tokens [1,N], cu_seqlens as rx_model_logprobs_packed): out [S,C]
 * row r is the hidden state at token index[r] of packed row r (0 <= index[r] < its length). */
int rx_model_hidden_at_packed(rx_model *m, const rx_tensor *tokens, const rx_tensor *cu_seqlens, const int64_t *index,
                              rx_tensor *out);

/* ---------------------------------------------------------------- generation */

/* Sampling settings of one generated row. */
typedef struct rx_sampling {
  double temperature;        /* 0 = greedy (argmax, lowest id on ties) */
  double top_p;              /* keep the smallest set of most likely tokens with mass >= top_p; 1 = off */
  int32_t top_k;             /* keep the k most likely tokens; 0 = off */
  int32_t max_new_tokens;    /* this row's budget (<= the request's max_new_tokens) */
  uint64_t key;              /* the row's random stream: same (seed, key) -> same tokens, whatever the batch */
  double min_p;              /* drop tokens less likely than min_p x the most likely one (in [0, 1]); 0 = off */
  double repetition_penalty; /* CTRL's rule on the distinct tokens of the row's prompt and completion so far:
                              * positive logits divided by it, negative ones multiplied; > 0; 1 (or 0, so a
                              * zeroed field) = off. Greedy rows too, as in Hugging Face and vLLM. */
} rx_sampling;
/* The order (Hugging Face's processors, vLLM's V0 sampler): repetition penalty on the raw logits,
 * temperature, top-k, top-p, min-p, then the draw. Log-probabilities stay those of the raw logits. */

/* A batch of rows, each continuing one of the prompts (rows of a prompt share its prefill). */
typedef struct rx_generate_request {
  int64_t num_prompts;
  const int32_t *prompt_tokens;    /* all prompts, concatenated */
  const int64_t *prompt_offsets;   /* num_prompts + 1 offsets into prompt_tokens */
  int64_t num_rows;
  const int64_t *row_prompt;       /* prompt index of each row */
  const rx_sampling *rows;         /* num_rows settings */
  const int32_t *stop_ids;         /* a row ends after emitting one of these */
  int64_t num_stop_ids;
  uint64_t seed;
  int64_t max_new_tokens;          /* capacity of each output row */
  int64_t append_capacity;         /* cache positions for what rx_generate_continue appends (observations, and
                                    * the padding of a batch of rows continuing together); 0: rows cannot continue */
} rx_generate_request;

enum { RX_FINISH_LENGTH = 0, RX_FINISH_STOP = 1 };

/* Caller-owned outputs, [num_rows, max_new_tokens] row-major, and counters. */
typedef struct rx_generate_result {
  int32_t *tokens;
  float *logprobs;                 /* log p(token) under the unscaled distribution (temperature 1) */
  int32_t *lengths;
  int32_t *finish;                 /* RX_FINISH_STOP or RX_FINISH_LENGTH */
  int64_t cache_bytes;             /* KV cache size of this request */
  int64_t decode_steps;
} rx_generate_result;

typedef struct rx_generator rx_generator;

/* The memory one generation call needs (what rx_generate_begin checks against the memory
 * available before it allocates): rows rows of prompts prompts of up to max_prompt_tokens
 * tokens, max_new_tokens each, for a model of config c on its device (penalties: whether a row
 * has a repetition penalty, which the device sampler keeps extra buffers for). Returns the
 * total bytes; *cache_bytes (when not NULL) gets the KV cache's share. Lua asks this instead of
 * repeating the arithmetic (remax.settings.schema's generation check). */
int64_t rx_generate_memory_bytes(const rx_model_config *c, int64_t rows, int64_t prompts, int64_t max_prompt_tokens,
                                 int64_t max_new_tokens, int32_t penalties, int64_t *cache_bytes);

/* Step-wise generation, for streaming: begin (checks sizes against memory before allocating,
 * prefills every prompt once, copies its KV to its rows, picks each row's first token), then
 * step until it reports done; the result arrays fill as it goes. */
int rx_generate_begin(rx_generator **out, rx_model *m, const rx_generate_request *req, rx_generate_result *res);
/* One token for every unfinished row. *done = 1 when every row has finished. */
int rx_generate_step(rx_generator *g, int32_t *done);
/* Ends a row between steps, as a stop token would (RX_FINISH_STOP, its tokens so far kept): the
 * caller's own stop rule, such as a stop string matched on the decoded text. A row that has
 * finished already stays as it is. The row leaves the batch at the next step. */
int rx_generate_stop_row(rx_generator *g, int64_t row);
/* Multi-turn episodes (a request with append_capacity > 0): a row that stopped (a stop token, or
 * rx_generate_stop_row) is paused, its KV cache kept. rx_generate_continue resumes n such rows:
 * row rows[i] gets its last token and then tokens[offsets[i], offsets[i+1]) (an observation: a tool
 * result, an environment's reply) appended to its cache by one prefill of only those tokens, batched
 * over the n rows (right-aligned, padding masked), attending to everything the row has cached; the
 * prompt and earlier turns are never recomputed. Each row's next token is then picked from the
 * logits after its last appended token and recorded as its next generated token (the result's rows
 * hold the model's own tokens only; the caller keeps the observations), and the row decodes again
 * at the next step. A row's max_new_tokens budget counts its tokens over every turn. The cache
 * grows in lockstep (a position per step for every row, paused or not); when it is full it is
 * repacked (each row's tokens moved together, no recomputation), and a row that still does not fit
 * ends with RX_FINISH_LENGTH. Failure: a row that is not paused, or that used its budget. */
int rx_generate_continue(rx_generator *g, int64_t n, const int64_t *rows, const int32_t *tokens, const int64_t *offsets);
void rx_generate_end(rx_generator *g);
/* The logits (compute dtype) that chose each row's latest token, in decoding-batch order: after
 * begin, those after the prompt ([num_rows, vocab], batch index = row); after a step, those of
 * the rows that step decoded. Rows that finish leave the batch at the next step, so the others
 * move up: row r's logits are in row rx_generate_batch_index(g, r) of the view. A view owned by
 * the generator, valid until the next step. For tests and diagnostics. */
const rx_tensor *rx_generate_logits(const rx_generator *g);
int64_t rx_generate_batch_index(const rx_generator *g, int64_t row);
/* The whole loop in one call. */
int rx_model_generate(rx_model *m, const rx_generate_request *req, rx_generate_result *res);

/* The sampler on one row of logits with a uniform u in [0, 1), the settings of s (its
 * max_new_tokens and key unused) and the row's tokens so far (seen, for the repetition penalty;
 * NULL when num_seen is 0); exposed for tests. */
int rx_sample_token(const float *logits, int64_t vocab, const rx_sampling *s, const int32_t *seen, int64_t num_seen,
                    double u, int32_t *token);
/* Uniform in [0, 1) of Philox keyed by (seed, key, position). */
double rx_sample_uniform(uint64_t seed, uint64_t key, int64_t position);
/* Logits of the token after each row's last real token, by a full forward (no cache): the
 * reference that cached decoding is tested against. tokens, mask i32 [B,T]; out f32/f64 [B,V]. */
int rx_model_next_logits(rx_model *m, const rx_tensor *tokens, const rx_tensor *mask, rx_tensor *out);

/* ---------------------------------------------------------------- safetensors
 * Hugging Face safetensors checkpoints, read through a read-only mmap. Every check of the
 * header happens at open; a bad file fails there with a message naming the file and fault. */

typedef struct rx_safetensors rx_safetensors;   /* opaque */

/* path: a .safetensors file; a sharded checkpoint's index (*.json with "weight_map");
 * or a model directory holding model.safetensors or model.safetensors.index.json. */
int rx_safetensors_open(rx_safetensors **out, const char *path);
void rx_safetensors_close(rx_safetensors *st);
int64_t rx_safetensors_count(const rx_safetensors *st);
/* Tensor names sorted by byte order; NULL when index is out of range. */
const char *rx_safetensors_name(const rx_safetensors *st, int64_t index);
int rx_safetensors_has(const rx_safetensors *st, const char *name);   /* 1 or 0 */
/* The dtype as the file spells it ("BF16", "F8_E4M3", ...), or NULL when there is no such tensor. */
const char *rx_safetensors_format_dtype(const rx_safetensors *st, const char *name);
/* dtype (rx_dtype), ndim and shape[0..ndim) (room for 4). Fails for a dtype remax cannot
 * hold (F8_E4M3, BOOL, U8, ...) or more than 4 dims, naming the tensor and the file. */
int rx_safetensors_info(const rx_safetensors *st, const char *name, int32_t *dtype, int32_t *ndim, int64_t *shape);
/* Copies the tensor into dst, converting to dst's dtype. dst's shape must match the file's.
 * dst may be strided. */
int rx_safetensors_read(const rx_safetensors *st, const char *name, rx_tensor *dst);
/* "__metadata__" (string to string); for a sharded checkpoint, the index's "metadata" first,
 * then the shards' entries. get returns NULL for a missing key. */
int64_t rx_safetensors_metadata_count(const rx_safetensors *st);
const char *rx_safetensors_metadata_key(const rx_safetensors *st, int64_t index);
const char *rx_safetensors_metadata_get(const rx_safetensors *st, const char *key);
/* Writes n tensors (each in its own dtype; CPU, any strides) and n_meta metadata pairs to path:
 * a deterministic file (names sorted), data 8-byte aligned, written to "<path>.tmp.<pid>",
 * fsynced, then renamed over path, so a crash never leaves a half-written file at path. */
int rx_safetensors_save(const char *path, int64_t n, const char *const *names, rx_tensor *const *tensors,
                        int64_t n_meta, const char *const *meta_keys, const char *const *meta_values);

/* ---------------------------------------------------------------- tokenizer */
/* Hugging Face byte-level BPE tokenizers (GPT-2, Llama 3, Qwen2/2.5/3) from tokenizer.json.
 * A handle is not safe to use from two threads at once (it keeps scratch space and a cache). */

typedef struct rx_tokenizer rx_tokenizer;

enum { RX_TOK_ADD_SPECIAL = 1,   /* encode: apply the post_processor template (e.g. BOS) */
       RX_TOK_SKIP_SPECIAL = 2   /* decode: leave out special added tokens */
};
enum { RX_TOK_EOS = 0, RX_TOK_PAD = 1, RX_TOK_BOS = 2, RX_TOK_UNK = 3 };   /* roles */

/* path: a tokenizer.json file, or a directory holding one. tokenizer_config.json next to it,
 * when present, gives the role tokens (eos/pad/bos/unk) and the chat template. */
int rx_tokenizer_load(rx_tokenizer **out, const char *path);
void rx_tokenizer_free(rx_tokenizer *tok);
/* text[0..len) -> ids. *n_out is always set to the number of ids; when it exceeds cap nothing
 * is written and the call fails (call again with cap >= *n_out). len + 16 ids always suffice for
 * NFC-stable text; 3 * len + 16 for any text. */
int rx_tokenizer_encode(rx_tokenizer *tok, const char *text, int64_t len, int32_t flags, int32_t *ids, int64_t cap,
                        int64_t *n_out);
/* ids -> the exact bytes (no NUL appended); same sizing contract as encode. */
int rx_tokenizer_decode(const rx_tokenizer *tok, const int32_t *ids, int64_t n, int32_t flags, char *buf, int64_t cap,
                        int64_t *n_out);
/* Trailing bytes of buf[0..len) that begin a UTF-8 sequence not yet complete (0..3): a streaming
 * decoder holds them back until the next token arrives. */
int64_t rx_utf8_incomplete_tail(const char *buf, int64_t len);
int32_t rx_tokenizer_vocab_size(const rx_tokenizer *tok);       /* highest id + 1 */
/* The id of a token as written in tokenizer.json ("Ġthe", "<|im_end|>"), or -1. */
int32_t rx_tokenizer_token_to_id(const rx_tokenizer *tok, const char *s, int64_t len);
/* The token's string as written in tokenizer.json / its decoded bytes; NULL for an unknown id. */
const char *rx_tokenizer_id_to_token(const rx_tokenizer *tok, int32_t id, int64_t *len);
const char *rx_tokenizer_id_to_bytes(const rx_tokenizer *tok, int32_t id, int64_t *len);
int32_t rx_tokenizer_is_special(const rx_tokenizer *tok, int32_t id);
/* Writes up to cap special-token ids (ascending) and returns how many there are. */
int64_t rx_tokenizer_special_ids(const rx_tokenizer *tok, int32_t *ids, int64_t cap);
/* Token name for a role (RX_TOK_EOS...) from tokenizer_config.json, or NULL. */
const char *rx_tokenizer_role_token(const rx_tokenizer *tok, int32_t role);
const char *rx_tokenizer_chat_template(const rx_tokenizer *tok);   /* NULL when none */
/* Unicode NFC of text[0..len) (invalid UTF-8 bytes pass through); *n_out = bytes needed
 * (at most 3 * len), min(cap, *n_out) bytes written. */
int rx_unicode_nfc(const char *text, int64_t len, char *out, int64_t cap, int64_t *n_out);
const char *rx_unicode_data_version(void);

/* ---------------------------------------------------------------- dist: data parallel
 * One process per device, started by an MPI launcher (mpirun, srun --mpi=pmix). rx_dist_init
 * reads the launcher's environment (OMPI_COMM_WORLD_SIZE, PMI_SIZE, PMI_RANK, PMIX_RANK; or
 * REMAX_DIST=mpi); with none of them the process is a world of one and needs no MPI library.
 * Under a launcher it loads libremax_mpi.so from libremax's folder (built when CMake finds MPI)
 * and fails naming what is missing. REMAX_DIST=off forces a world of one. Collectives must be
 * called by every rank in the same order; in a world of one they return at once. */
enum { RX_DIST_SUM = 0, RX_DIST_MAX = 1, RX_DIST_MIN = 2 };
int rx_dist_init(void);                   /* idempotent */
int rx_dist_finalize(void);               /* after the last collective (the host calls it) */
int32_t rx_dist_rank(void);               /* 0 before init */
int32_t rx_dist_size(void);               /* 1 before init */
int32_t rx_dist_local_rank(void);         /* rank among this machine's processes: picks the GPU */
int32_t rx_dist_local_size(void);
const char *rx_dist_backend_name(void);   /* "single", or "mpi (Open MPI v4.1.4, ...)" */
/* Seconds a collective waits for the other ranks before it fails naming the ranks that did not
 * come (default 1800, torch.distributed's 30 minutes; NCCL collectives too, whose communicator
 * is then aborted). Every collective first checks that every rank calls the same collective
 * with the same sizes, and fails naming the ranks and both calls when not; after a failure every
 * later collective fails at once. seconds must be > 0. */
int rx_dist_set_timeout(double seconds);
/* The step the run is at, for those messages (-1: before the first step). */
void rx_dist_set_step(int64_t step);
/* In place over n doubles: every rank gets the element-wise sum (max, min). */
int rx_dist_allreduce_f64(double *values, int64_t n, int32_t op);
/* Sums n tensors in place across ranks (gradients): contiguous CPU f32/f64 tensors over MPI,
 * tensors adjacent in memory (one arena) in one call; CUDA tensors over NCCL. */
int rx_dist_allreduce_tensors(rx_tensor *const *tensors, int64_t n);
int rx_dist_broadcast(void *buf, int64_t bytes, int32_t root);
/* out[r] = rank r's value on every rank (out holds rx_dist_size() entries). */
int rx_dist_allgather_i64(int64_t value, int64_t *out);
/* root receives every rank's bytes concatenated in rank order; counts[r] (read on root only)
 * is rank r's byte count. */
int rx_dist_gather(const void *send, int64_t bytes, void *recv, const int64_t *counts, int32_t root);
int rx_dist_barrier(void);
/* ZeRO collectives over a flat buffer: `flat` views one arena (gradients, parameters) as n
 * elements (f32 or f64; bf16 too on CUDA) cut into shards of `shard` elements, rank r owning
 * [r * shard, min((r + 1) * shard, n)) (the last shards may be short or empty; shard * size >= n).
 * In place; CPU tensors over MPI, CUDA tensors over NCCL. reduce_scatter leaves in each rank's
 * shard the sum over ranks of that shard (the rest of the buffer is then undefined); allgather
 * copies every rank's shard into every rank's buffer. */
int rx_dist_reduce_scatter(rx_tensor *flat, int64_t shard);
int rx_dist_allgather(rx_tensor *flat, int64_t shard);
/* Rank root's tensor into every rank's (contiguous; CPU over MPI, CUDA over NCCL). */
int rx_dist_broadcast_tensor(rx_tensor *t, int32_t root);
/* 64-bit hash of the bytes of n CPU tensors: equal on every rank while the weights are. */
int rx_dist_checksum(const rx_tensor *const *tensors, int64_t n, uint64_t *out);

#endif
