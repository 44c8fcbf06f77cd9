/* Reading the model geometry from a package's config: see model_geometry.h. */
#include "engine/model_geometry.h"

#include <limits.h>
#include <string.h>

/* cfg[key] as an int; dflt when absent or not an integer, -1 when out of [0, INT_MAX]. */
static int field(json_t *cfg, const char *key, int dflt) {
  json_t *v = cfg ? json_object_get(cfg, key) : NULL;
  if (!json_is_integer(v)) return dflt;
  json_int_t x = json_integer_value(v);
  return x >= 0 && x <= INT_MAX ? (int)x : -1;
}

void servd_model_geometry_read(json_t *cfg, servd_model_geometry *g) {
  memset(g, 0, sizeof *g);
  g->n_layers = field(cfg, "num_hidden_layers", field(cfg, "block_count", 0));
  g->n_heads = field(cfg, "num_attention_heads", field(cfg, "head_count", 0));
  g->n_kv_heads = field(cfg, "num_key_value_heads", field(cfg, "head_count_kv", g->n_heads));
  g->dim = field(cfg, "hidden_size", field(cfg, "embedding_length", 0));
  g->head_dim = field(cfg, "head_dim", g->n_heads > 0 && g->dim > 0 ? g->dim / g->n_heads : 0);
  g->ffn_dim = field(cfg, "intermediate_size", field(cfg, "feed_forward_length", 0));
  g->vocab = field(cfg, "vocab_size", 0);
  g->context_length = field(cfg, "max_position_embeddings", field(cfg, "context_length", 2048));
  /* sentence-transformers' input limit (sentence_bert_config.json), below the positions the model has */
  int msl = field(cfg, "max_seq_length", 0);
  if (msl > 0 && g->context_length > 0 && msl < g->context_length) g->context_length = msl;
}
