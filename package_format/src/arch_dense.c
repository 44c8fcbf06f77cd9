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

/* The values models/llama/model.py reads, with its defaults. */
static int read_dims(const char *what, const json_t *c, mpk_decoder_dims *d) {
  int rc;
  double x;
  if ((rc = mpk__decoder_dims_read(what, c, 0, d)) || (rc = mpk__cfg_pos(what, c, "rms_norm_eps", false, 1e-6, &x)) ||
      (rc = mpk__cfg_pos(what, c, "rope_theta", false, 1e4, &x)))
    return rc;
  return mpk__decoder_dims_check(what, d);
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

int mpk__dense_check_config(const mpk_arch *a, const char *what, const json_t *c) {
  const mpk_dense_opts *o = a->dense;
  mpk_decoder_dims d;
  int rc;
  /* The model code applies Llama 3's rope_scaling and YaRN; another one would load and run wrong. */
  const char *rt = mpk__rope_type(c);
  if ((rc = read_dims(what, c, &d)) || (rc = mpk__cfg_tie(what, c)) ||
      (rc = rt && !strcmp(rt, "yarn")
                ? mpk__cfg_rope_yarn(what, c)
                : mpk__cfg_rope_scaling(what, c, "llama3", 0, true, "\"llama3\" with a positive factor, or \"yarn\"")))
    return rc;
  int64_t window, ctx;
  if ((rc = window_of(what, c, o, &window, &ctx))) return rc;
  if (window && window < ctx)
    return servd_fail(
        SERVD_EUNSUPPORTED,
        "%s: config: %s %lld < max_position_embeddings %lld: servd's attention has no sliding window, so it "
        "serves at most %lld tokens of this model (repack with modelpkg, which caps max_position_embeddings)",
        what, o->window_key, (long long)window, (long long)ctx, (long long)window);
  return 0;
}

int mpk__dense_cap_window(const mpk_arch *a, const char *what, json_t *c) {
  const mpk_dense_opts *o = a->dense;
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

int mpk__dense_check_tensors(const mpk_arch *a, const char *what, const json_t *c, const mpk_shapes *s) {
  const mpk_dense_opts *o = a->dense;
  mpk_decoder_dims d;
  int rc = read_dims(what, c, &d);
  if (rc) return rc;
  int64_t H = d.hidden, Q = d.heads * d.head_dim, KV = d.kv_heads * d.head_dim, I = d.inter, D = d.head_dim;
  const mpk_layer_tensor t[] = {
      {"input_layernorm.weight", 1, H, 0, true},        {"post_attention_layernorm.weight", 1, H, 0, true},
      {"self_attn.q_proj.weight", 2, Q, H, true},       {"self_attn.k_proj.weight", 2, KV, H, true},
      {"self_attn.v_proj.weight", 2, KV, H, true},      {"self_attn.o_proj.weight", 2, H, Q, true},
      {"mlp.gate_proj.weight", 2, I, H, true},          {"mlp.up_proj.weight", 2, I, H, true},
      {"mlp.down_proj.weight", 2, H, I, true},          {"self_attn.q_proj.bias", 1, Q, 0, o->qkv_bias},
      {"self_attn.k_proj.bias", 1, KV, 0, o->qkv_bias}, {"self_attn.v_proj.bias", 1, KV, 0, o->qkv_bias},
      {"self_attn.q_norm.weight", 1, D, 0, o->qk_norm}, {"self_attn.k_norm.weight", 1, D, 0, o->qk_norm}};
  return mpk__decoder_check_tensors(what, c, s, &d, t, sizeof t / sizeof *t, o->family);
}
