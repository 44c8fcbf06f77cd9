/* The shape of a Llama-like causal LM, read once from its package's model config (config.json: the
 * Hugging Face names, or the GGUF names a config may carry instead). The engine sizes the KV cache
 * and the sampler from it, the GPU warm-up its matrix shapes; both read it here, so they never
 * disagree on a default. */
#ifndef SERVD_ENGINE_MODEL_GEOMETRY_H
#define SERVD_ENGINE_MODEL_GEOMETRY_H

#include <jansson.h>

typedef struct servd_model_geometry {
  int n_layers;       /* num_hidden_layers | block_count */
  int n_heads;        /* num_attention_heads | head_count */
  int n_kv_heads;     /* num_key_value_heads | head_count_kv; absent: n_heads (no grouped-query attention) */
  int dim;            /* hidden_size | embedding_length */
  int head_dim;       /* head_dim; absent: dim / n_heads */
  int ffn_dim;        /* intermediate_size | feed_forward_length */
  int vocab;          /* vocab_size; absent: 0, the caller's choice (the tokenizer's size, ...) */
  int context_length; /* max_position_embeddings | context_length; absent: 2048; max_seq_length when lower */
} servd_model_geometry;

/* Fills *g from cfg (borrowed; NULL reads as an empty config). Where a name has two spellings the
 * first wins. A field that is absent, null or not an integer takes its default (0 unless said
 * above); an integer outside [0, INT_MAX] reads as -1, so the caller's "> 0" checks reject it rather
 * than a truncated value. Checking the values is the caller's: the engine and the warm-up need
 * different fields. */
void servd_model_geometry_read(json_t *cfg, servd_model_geometry *g);

#endif
