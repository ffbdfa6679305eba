/* sample.h: the sampler on the model's device as an op (engine/ops/sample.c, cuda/sample.cu):
 * generation picks each row's next token where its logits are, so that only token ids and their
 * log-probabilities reach the host. The CPU samples on the host (engine/generate/generate.c),
 * with the same rules and the same Philox streams. */
#ifndef RX_OPS_SAMPLE_H
#define RX_OPS_SAMPLE_H
#include "internal.h"
#include "cuda/cuda.h"

/* token i32 [n], logprob f32 [n], prob f32 [n, V] (scratch) and logits [n, V] on one device;
 * rows: n settings in that device's memory (temperature <= 0 or top_k == 1: greedy). seen i32
 * [rows, S] (the rows' tokens so far, appended to) and penalized f32 [n, V] (scratch): both, for
 * rows with a repetition penalty, or both NULL (every row's penalty then must be 1). */
int rx_sample_rows(rx_tensor *token, rx_tensor *logprob, rx_tensor *prob, const rx_tensor *logits,
                   const rx_cuda_sample_row *rows, uint64_t seed, rx_tensor *seen, rx_tensor *penalized);

#endif
