/* The checks of the Llama-style decoder (models/llama) that several registry rows share: the config
 * keys the model code reads and the tensors it takes. The options of mpk_dense_opts are the only
 * differences between those families' checks (biases, per-head norms, a sliding window). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arch.h"
#include "mpk-impl.h"
#include "servd/status.h"

#define ENGINE_DEFAULT_CONTEXT 2048 /* daemon/engine/model_geometry.c without max_position_embeddings */

typedef struct dims {
  int64_t hidden, inter, layers, heads, kv_heads, head_dim, vocab;
} dims;

/* The values models/llama/model.py reads, with its defaults. */
static int read_dims(const char *what, const json_t *c, dims *d) {
  int rc;
  double x;
  if ((rc = mpk__cfg_int(what, c, "hidden_size", true, 0, &d->hidden)) ||
      (rc = mpk__cfg_int(what, c, "intermediate_size", true, 0, &d->inter)) ||
      (rc = mpk__cfg_int(what, c, "num_hidden_layers", true, 0, &d->layers)) ||
      (rc = mpk__cfg_int(what, c, "num_attention_heads", true, 0, &d->heads)) ||
      (rc = mpk__cfg_int(what, c, "num_key_value_heads", false, d->heads, &d->kv_heads)) ||
      (rc = mpk__cfg_int(what, c, "head_dim", false, d->hidden / d->heads, &d->head_dim)) ||
      (rc = mpk__cfg_int(what, c, "vocab_size", false, -1, &d->vocab)) ||
      (rc = mpk__cfg_pos(what, c, "rms_norm_eps", false, 1e-6, &x)) || (rc = mpk__cfg_pos(what, c, "rope_theta", false, 1e4, &x)))
    return rc;
  if (d->head_dim == 0)
    return servd_fail(SERVD_EFORMAT, "%s: config: hidden_size %lld < num_attention_heads %lld and no head_dim", what,
                      (long long)d->hidden, (long long)d->heads);
  if (d->heads % d->kv_heads)
    return servd_fail(SERVD_EFORMAT, "%s: config: num_attention_heads %lld is not a multiple of num_key_value_heads %lld", what,
                      (long long)d->heads, (long long)d->kv_heads);
  if ((uint64_t)d->heads * (uint64_t)d->head_dim > (1ull << 31))
    return servd_fail(SERVD_EFORMAT, "%s: config: num_attention_heads x head_dim too large", what);
  return 0;
}

/* The window that applies (0: none) and the context the engine would serve. */
static int window_of(const char *what, const json_t *c, const mpk_dense_opts *o, int64_t *window, int64_t *ctx) {
  int rc;
  *window = 0;
  if ((rc = mpk__cfg_int(what, c, "max_position_embeddings", false, ENGINE_DEFAULT_CONTEXT, ctx))) return rc;
  if (!o->window_key) return 0;
  if (o->window_switch) {
    json_t *on = json_object_get(c, o->window_switch);
    if (on && !json_is_boolean(on) && !json_is_null(on))
      return servd_fail(SERVD_EFORMAT, "%s: config: \"%s\": expected true or false", what, o->window_switch);
    if (!json_is_true(on)) return 0;
  }
  return mpk__cfg_int(what, c, o->window_key, false, 0, window);
}

int mpk__dense_check_config(const char *what, const json_t *c, const mpk_dense_opts *o) {
  dims d;
  int rc = read_dims(what, c, &d);
  if (rc) return rc;
  json_t *tie = json_object_get(c, "tie_word_embeddings");
  if (tie && !json_is_boolean(tie) && !json_is_null(tie))
    return servd_fail(SERVD_EFORMAT, "%s: config: \"tie_word_embeddings\": expected true or false", what);
  /* The model code applies no rope_scaling but Llama 3's; another one would load and run wrong. */
  json_t *rs = json_object_get(c, "rope_scaling");
  if (rs && !json_is_null(rs) && !(json_is_object(rs) && json_object_size(rs) == 0)) {
    json_t *ty = json_object_get(rs, "rope_type");
    if (!ty) ty = json_object_get(rs, "type");
    double f = json_number_value(json_object_get(rs, "factor"));
    if (!json_is_object(rs) || !json_is_string(ty) || strcmp(json_string_value(ty), "llama3") || !isfinite(f) || f <= 0) {
      char q[300];
      const char *s = json_string_value(ty);
      return servd_fail(SERVD_EUNSUPPORTED, "%s: config: rope_scaling type \"%s\": expected null or \"llama3\" with a positive factor",
                        what, s ? mpk__printable(s, strlen(s), q, sizeof q) : "");
    }
  }
  int64_t window, ctx;
  if ((rc = window_of(what, c, o, &window, &ctx))) return rc;
  if (window && window < ctx)
    return servd_fail(SERVD_EUNSUPPORTED,
                      "%s: config: %s %lld < max_position_embeddings %lld: servd's attention has no sliding window, so it "
                      "serves at most %lld tokens of this model (repack with modelpkg, which caps max_position_embeddings)",
                      what, o->window_key, (long long)window, (long long)ctx, (long long)window);
  return 0;
}

int mpk__dense_cap_window(const char *what, json_t *c, const mpk_dense_opts *o) {
  int64_t window, ctx;
  int rc = window_of(what, c, o, &window, &ctx);
  if (rc || !window || window >= ctx) return rc;
  json_object_set_new(c, "max_position_embeddings", json_integer((json_int_t)window));
  fprintf(stderr,
          "modelpkg: %s: %s: %s %lld < max_position_embeddings %lld: servd's attention has no sliding window, so the "
          "context is capped at %lld tokens (exact within it)\n",
          what, o->family, o->window_key, (long long)window, (long long)ctx, (long long)window);
  return 0;
}

int mpk__dense_check_tensors(const char *what, const json_t *c, const mpk_shapes *s, const mpk_dense_opts *o) {
  dims d;
  int rc = read_dims(what, c, &d);
  if (rc) return rc;
  int64_t H = d.hidden, Q = d.heads * d.head_dim, KV = d.kv_heads * d.head_dim, I = d.inter, D = d.head_dim;
  const mpk_shape_entry *emb = mpk__shapes_find(s, "model.embed_tokens.weight");
  int64_t V = d.vocab > 0 ? d.vocab : emb && emb->ndim == 2 ? emb->shape[0] : 1;
  if ((rc = mpk__shapes_expect(what, s, "model.embed_tokens.weight", 2, V, H)) ||
      (rc = mpk__shapes_expect(what, s, "model.norm.weight", 1, H)))
    return rc;
  /* The model code ties the head to the embedding when lm_head is absent; a config that says
   * untied (false) while the head is missing contradicts the weights. */
  if (mpk__shapes_find(s, "lm_head.weight")) {
    if ((rc = mpk__shapes_expect(what, s, "lm_head.weight", 2, V, H))) return rc;
  } else if (json_is_false(json_object_get(c, "tie_word_embeddings"))) {
    return servd_fail(SERVD_EFORMAT, "%s: tensor \"lm_head.weight\": missing, expected (%lld, %lld) since tie_word_embeddings is false",
                      what, (long long)V, (long long)H);
  }
  const struct { const char *n; int nd; int64_t rows, cols; bool on; } t[] = {
      {"input_layernorm.weight", 1, H, 0, true},        {"post_attention_layernorm.weight", 1, H, 0, true},
      {"self_attn.q_proj.weight", 2, Q, H, true},        {"self_attn.k_proj.weight", 2, KV, H, true},
      {"self_attn.v_proj.weight", 2, KV, H, true},       {"self_attn.o_proj.weight", 2, H, Q, true},
      {"mlp.gate_proj.weight", 2, I, H, true},           {"mlp.up_proj.weight", 2, I, H, true},
      {"mlp.down_proj.weight", 2, H, I, true},           {"self_attn.q_proj.bias", 1, Q, 0, o->qkv_bias},
      {"self_attn.k_proj.bias", 1, KV, 0, o->qkv_bias},  {"self_attn.v_proj.bias", 1, KV, 0, o->qkv_bias},
      {"self_attn.q_norm.weight", 1, D, 0, o->qk_norm},  {"self_attn.k_norm.weight", 1, D, 0, o->qk_norm}};
  char name[128];
  for (int64_t l = 0; l < d.layers; l++)
    for (size_t i = 0; i < sizeof t / sizeof *t; i++) {
      snprintf(name, sizeof name, "model.layers.%lld.%s", (long long)l, t[i].n);
      /* A tensor of an option the family lacks would be ignored by the code: a wrong family. */
      if (!t[i].on) {
        if (mpk__shapes_find(s, name))
          return servd_fail(SERVD_EFORMAT, "%s: tensor \"%s\": unexpected for a %s model (its code would ignore it)", what, name,
                            o->family);
        continue;
      }
      if ((rc = t[i].nd == 1 ? mpk__shapes_expect(what, s, name, 1, t[i].rows)
                             : mpk__shapes_expect(what, s, name, 2, t[i].rows, t[i].cols)))
        return rc;
    }
  /* A layer beyond num_hidden_layers would be ignored silently: the config and weights disagree. */
  snprintf(name, sizeof name, "model.layers.%lld.input_layernorm.weight", (long long)d.layers);
  if (mpk__shapes_find(s, name))
    return servd_fail(SERVD_EFORMAT, "%s: tensor \"%s\": the config has num_hidden_layers %lld, expected no layer %lld", what, name,
                      (long long)d.layers, (long long)d.layers);
  return 0;
}
