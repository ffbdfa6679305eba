/* abi.c: struct layouts as C sees them, compared with LuaJIT's view by tests/lua/abi_spec.lua.
 * Every struct in remax.h must be listed here (the spec fails on one that is missing). */
#include "internal.h"
#include <stddef.h>
#include <stdio.h>

#define SIZE(T) {#T, sizeof(T)}
#define FIELD(T, f) {#T "." #f, offsetof(T, f)}

static const struct { const char *name; size_t value; } layout[] = {
  SIZE(rx_tensor), FIELD(rx_tensor, data), FIELD(rx_tensor, storage), FIELD(rx_tensor, shape),
  FIELD(rx_tensor, stride), FIELD(rx_tensor, numel), FIELD(rx_tensor, ndim), FIELD(rx_tensor, dtype),
  FIELD(rx_tensor, device), FIELD(rx_tensor, device_index),
  SIZE(rx_adamw_config), FIELD(rx_adamw_config, lr), FIELD(rx_adamw_config, beta1),
  FIELD(rx_adamw_config, beta2), FIELD(rx_adamw_config, eps), FIELD(rx_adamw_config, weight_decay),
  FIELD(rx_adamw_config, step),
  SIZE(rx_model_config), FIELD(rx_model_config, vocab_size), FIELD(rx_model_config, hidden_size),
  FIELD(rx_model_config, intermediate_size), FIELD(rx_model_config, num_hidden_layers),
  FIELD(rx_model_config, num_attention_heads), FIELD(rx_model_config, num_key_value_heads),
  FIELD(rx_model_config, head_dim), FIELD(rx_model_config, max_position_embeddings),
  FIELD(rx_model_config, rms_norm_eps), FIELD(rx_model_config, rope_theta),
  FIELD(rx_model_config, tie_word_embeddings), FIELD(rx_model_config, attention_bias),
  FIELD(rx_model_config, dtype), FIELD(rx_model_config, device), FIELD(rx_model_config, qk_norm),
  FIELD(rx_model_config, rope_scaling), FIELD(rx_model_config, rope_factor),
  FIELD(rx_model_config, rope_low_freq_factor), FIELD(rx_model_config, rope_high_freq_factor),
  FIELD(rx_model_config, rope_original_max_position_embeddings), FIELD(rx_model_config, weight_dtype),
  SIZE(rx_forward_opts), FIELD(rx_forward_opts, train), FIELD(rx_forward_opts, checkpoint),
  FIELD(rx_forward_opts, head_chunk_rows), FIELD(rx_forward_opts, head_chunk_vocab),
  SIZE(rx_model_memory), FIELD(rx_model_memory, param_bytes), FIELD(rx_model_memory, grad_bytes),
  FIELD(rx_model_memory, activation_bytes), FIELD(rx_model_memory, head_bytes),
  SIZE(rx_lora_config), FIELD(rx_lora_config, r), FIELD(rx_lora_config, alpha), FIELD(rx_lora_config, dropout),
  FIELD(rx_lora_config, targets), FIELD(rx_lora_config, pad_), FIELD(rx_lora_config, seed),
  SIZE(rx_sampling), FIELD(rx_sampling, temperature), FIELD(rx_sampling, top_p), FIELD(rx_sampling, top_k),
  FIELD(rx_sampling, max_new_tokens), FIELD(rx_sampling, key), FIELD(rx_sampling, min_p),
  FIELD(rx_sampling, repetition_penalty),
  SIZE(rx_generate_request), FIELD(rx_generate_request, num_prompts), FIELD(rx_generate_request, prompt_tokens),
  FIELD(rx_generate_request, prompt_offsets), FIELD(rx_generate_request, num_rows),
  FIELD(rx_generate_request, row_prompt), FIELD(rx_generate_request, rows), FIELD(rx_generate_request, stop_ids),
  FIELD(rx_generate_request, num_stop_ids), FIELD(rx_generate_request, seed),
  FIELD(rx_generate_request, max_new_tokens), FIELD(rx_generate_request, append_capacity),
  SIZE(rx_generate_result), FIELD(rx_generate_result, tokens), FIELD(rx_generate_result, logprobs),
  FIELD(rx_generate_result, lengths), FIELD(rx_generate_result, finish), FIELD(rx_generate_result, cache_bytes),
  FIELD(rx_generate_result, decode_steps),
};

const char *rx_abi_layout(void) {
  static char buf[8192];
  if (!buf[0]) {
    size_t k = 0;
    for (size_t i = 0; i < sizeof layout / sizeof layout[0] && k < sizeof buf; i++)
      k += (size_t)snprintf(buf + k, sizeof buf - k, "%s %zu\n", layout[i].name, layout[i].value);
  }
  return buf;
}
