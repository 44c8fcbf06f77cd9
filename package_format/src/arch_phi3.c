/* Registry row: Phi-3 / Phi-3.5-mini (Hugging Face model_type "phi3", GGUF "phi3"). Llama's decoder
 * (code models/llama) with fused projections and a true sliding window. Conventions relied on:
 *  - transformers' modeling_phi3: self_attn.qkv_proj (heads + 2 kv_heads) x head_dim rows, Q then K
 *    then V; mlp.gate_up_proj 2 x intermediate rows, gate first (silu(gate) * up); no biases;
 *    rotate_half RoPE over int(head_dim * partial_rotary_factor) dims (1.0 in every release); the
 *    sliding-window mask sees keys s from t when t - s < sliding_window (Phi-3-mini: 2047).
 *  - llama.cpp's convert_hf_to_gguf.py (Phi3MiniModel) keeps both fused: qkv_proj becomes
 *    blk.N.attn_qkv.weight and gate_up_proj blk.N.ffn_up.weight (gguf-py tensor_mapping.py; its
 *    llm_build_phi3 runs build_ffn with ffn_up only and LLM_FFN_SWIGLU, which splits the output in
 *    halves, silu of the first); it permutes nothing (LLAMA_ROPE_TYPE_NEOX); it writes
 *    phi3.attention.sliding_window, phi3.rope.dimension_count, phi3.rope.scaling.original_context_length
 *    and, for LongRoPE, the tensors rope_factors_long/short.weight and phi3.rope.scaling.attn_factor.
 *  - The model code takes Q/K/V and gate/up as row views of the fused tensors (no copy).
 *  - LongRoPE (rope_scaling "longrope", formerly "su") divides each frequency of a pair by its own
 *    factor (short ones up to original_max_position_embeddings, long ones beyond) and scales cos/sin:
 *    the model code hands both tables to the rope op (models/llama/rope_scaling.py). From a GGUF the
 *    factor tensors and phi3.rope.scaling.attn_factor become that rope_scaling. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "arch.h"
#include "mpk-impl.h"
#include "servd/status.h"

typedef struct dims {
  mpk_decoder_dims m;
  int64_t window; /* 0: none */
} dims;

/* The values model.py reads for Phi-3, with transformers' Phi3Config defaults. */
static int read_dims(const char *what, const json_t *c, dims *d) {
  int rc;
  double x;
  if ((rc = mpk__decoder_dims_read(what, c, 0, &d->m)) ||
      (rc = mpk__cfg_pos(what, c, "rms_norm_eps", false, 1e-5, &x)) ||
      (rc = mpk__cfg_pos(what, c, "rope_theta", false, 1e4, &x)) ||
      (rc = mpk__cfg_int(what, c, "sliding_window", false, 0, &d->window)))
    return rc;
  return mpk__decoder_dims_check(what, &d->m);
}

static int check_config(const mpk_arch *a, const char *what, const json_t *c) {
  (void)a;
  dims d;
  int rc;
  double prf;
  if ((rc = read_dims(what, c, &d)) || (rc = mpk__cfg_tie(what, c)) ||
      (rc = mpk__cfg_pos(what, c, "partial_rotary_factor", false, 1.0, &prf)))
    return rc;
  /* The rope op rotates every dimension of a head. */
  if (prf != 1.0)
    return servd_fail(SERVD_EUNSUPPORTED,
                      "%s: config: \"partial_rotary_factor\" %g: expected 1.0 (servd rotates whole heads)", what, prf);
  const char *act = json_string_value(json_object_get(c, "hidden_act"));
  if (json_object_get(c, "hidden_act") && !json_is_null(json_object_get(c, "hidden_act")) &&
      (!act || strcmp(act, "silu")))
    return servd_fail(SERVD_EUNSUPPORTED, "%s: config: \"hidden_act\": expected \"silu\"", what);
  const char *rt = mpk__rope_type(c);
  if (!rt) return 0;
  if (!strcmp(rt, "longrope") || !strcmp(rt, "su")) return mpk__cfg_rope_longrope(what, c, d.m.head_dim);
  char q[300];
  return servd_fail(SERVD_EUNSUPPORTED,
                    "%s: config: rope_scaling type \"%s\": expected null or \"longrope\" (Phi-3 knows no other)", what,
                    mpk__printable(rt, strlen(rt), q, sizeof q));
}

static int check_tensors(const mpk_arch *a, const char *what, const json_t *c, const mpk_shapes *s) {
  dims d;
  int rc = read_dims(what, c, &d);
  if (rc) return rc;
  int64_t H = d.m.hidden, Q = d.m.heads * d.m.head_dim, KV = d.m.kv_heads * d.m.head_dim, I = d.m.inter;
  /* Split projections next to the fused ones would be ignored by the code: refused. */
  const mpk_layer_tensor t[] = {{"input_layernorm.weight", 1, H, 0, true},
                                {"post_attention_layernorm.weight", 1, H, 0, true},
                                {"self_attn.qkv_proj.weight", 2, Q + 2 * KV, H, true},
                                {"self_attn.o_proj.weight", 2, H, Q, true},
                                {"mlp.gate_up_proj.weight", 2, 2 * I, H, true},
                                {"mlp.down_proj.weight", 2, H, I, true},
                                {"self_attn.q_proj.weight", 2, Q, H, false},
                                {"mlp.gate_proj.weight", 2, I, H, false},
                                {"self_attn.qkv_proj.bias", 1, Q + 2 * KV, 0, false}};
  if ((rc = mpk__decoder_check_tensors(what, c, s, &d.m, t, sizeof t / sizeof *t, a->name))) return rc;
  /* A GGUF's LongRoPE factors: copied into the config's rope_scaling at pack time (gguf_config), the
   * tensors kept beside it; without a longrope config they would say another rotation than it. */
  static const char *const factors[] = {"rope_factors_long.weight", "rope_factors_short.weight"};
  const char *rt = mpk__rope_type(c);
  bool longrope = rt && (!strcmp(rt, "longrope") || !strcmp(rt, "su"));
  for (int i = 0; i < 2; i++)
    if (!longrope && mpk__shapes_find(s, factors[i]))
      return servd_fail(SERVD_EFORMAT, "%s: tensor \"%s\": LongRoPE factors, while the config has no rope_scaling",
                        what, factors[i]);
  return 0;
}

/* phi3.* metadata: Llama's keys, then the window, the rotary dims and LongRoPE's traces. */
static int gguf_config(const mpk_arch *a, const char *what, const mpk_gguf *g, const char *ga, bool tied,
                       uint64_t n_vocab, json_t **out) {
  int rc = mpk__llama_gguf_config(a, what, g, ga, tied, n_vocab, out);
  if (rc) return rc;
  json_t *c = *out;
  char key[128];
  uint64_t v, orig = 0;
  snprintf(key, sizeof key, "%s.attention.sliding_window", ga);
  if (mpk_gguf_get_u64(g, key, &v) == 0 && v > 0 && v <= (1ull << 31))
    json_object_set_new(c, "sliding_window", json_integer((json_int_t)v));
  int64_t hd = json_integer_value(json_object_get(c, "head_dim"));
  snprintf(key, sizeof key, "%s.rope.dimension_count", ga);
  if (mpk_gguf_get_u64(g, key, &v) == 0 && (int64_t)v != hd) /* refused by the check unless 1 */
    json_object_set_new(c, "partial_rotary_factor", json_real((double)v / (double)hd));
  snprintf(key, sizeof key, "%s.rope.scaling.original_context_length", ga);
  if (mpk_gguf_get_u64(g, key, &orig) == 0 && orig > 0 && orig <= (1ull << 31))
    json_object_set_new(c, "original_max_position_embeddings", json_integer((json_int_t)orig));
  /* LongRoPE: the converter writes its factors as tensors (no rope.scaling.type) and the attention
   * factor it computed; they become the config's rope_scaling as transformers reads it. */
  const mpk_gguf_tensor *fl = NULL, *fs = NULL;
  for (size_t i = 0; i < g->n_tensors; i++) {
    if (!strcmp(g->tensors[i].name, "rope_factors_long.weight")) fl = &g->tensors[i];
    if (!strcmp(g->tensors[i].name, "rope_factors_short.weight")) fs = &g->tensors[i];
  }
  if (!fl && !fs) return 0;
  json_t *rs = json_pack("{s:s}", "type", "longrope");
  json_object_set_new(c, "rope_scaling", rs);
  if (orig) json_object_set_new(rs, "original_max_position_embeddings", json_integer((json_int_t)orig));
  double af;
  snprintf(key, sizeof key, "%s.rope.scaling.attn_factor", ga);
  if (mpk_gguf_get_f64(g, key, &af) == 0 && isfinite(af) && af > 0)
    json_object_set_new(rs, "attention_factor", json_real(mpk__shortest_f32(af))); /* f32 in GGUF */
  const mpk_gguf_tensor *ts[2] = {fs, fl};
  static const char *const keys[2] = {"short_factor", "long_factor"};
  for (int k = 0; k < 2; k++) {
    const mpk_gguf_tensor *t = ts[k];
    if (!t) {
      json_decref(c), *out = NULL;
      return servd_fail(SERVD_EFORMAT, "%s: tensor \"rope_factors_%s.weight\": missing beside its LongRoPE pair", what,
                        k ? "long" : "short");
    }
    if (t->type != MPK_GGML_F32 || t->ndim != 1 || t->ne[0] * 2 != hd) {
      json_decref(c), *out = NULL;
      return servd_fail(SERVD_EFORMAT,
                        "%s: tensor \"%s\": ggml type %s with %lld values in %d dimension(s), "
                        "expected F32 (head_dim/2 = %lld)",
                        what, t->name, mpk_ggml_type_name(t->type) ? mpk_ggml_type_name(t->type) : "?",
                        (long long)(t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3]), t->ndim, (long long)(hd / 2));
    }
    json_t *a = json_array();
    for (int64_t i = 0; i < t->ne[0]; i++) {
      float f;
      memcpy(&f, g->buf + t->offset + 4 * i, 4); /* the data offset need not be 4-aligned */
      json_array_append_new(a, json_real(mpk__shortest_f32(f)));
    }
    json_object_set_new(rs, keys[k], a);
  }
  return 0;
}

static const char *const hf_types[] = {"phi3", NULL};
static const char *const hf_archs[] = {"Phi3ForCausalLM", NULL};
static const char *const gguf_archs[] = {"phi3", NULL};

static const mpk_name_pair gguf_block[] = {{"attn_norm.weight", "input_layernorm.weight"},
                                           {"ffn_norm.weight", "post_attention_layernorm.weight"},
                                           {"attn_qkv.weight", "self_attn.qkv_proj.weight"},
                                           {"attn_output.weight", "self_attn.o_proj.weight"},
                                           {"ffn_up.weight", "mlp.gate_up_proj.weight"},
                                           {"ffn_down.weight", "mlp.down_proj.weight"},
                                           {NULL, NULL}};

const mpk_arch mpk__arch_phi3 = {
    .name = "phi3",
    .hf_model_types = hf_types,
    .hf_architectures = hf_archs,
    .gguf_archs = gguf_archs,
    .gguf_names = {"blk.", mpk__gguf_llama_global, gguf_block},
    .hf_names = {NULL, NULL, NULL}, /* canonical: Phi-3's own names for the fused tensors */
    .rope_layout_gguf = "half",     /* not permuted by the converter; NEOX RoPE in llama.cpp */
    .rope_layout_hf = "half",
    .code = "llama",
    .entry_point = "llama.model:LlamaModel",
    .gguf_config = gguf_config,
    .check_config = check_config,
    .check_tensors = check_tensors,
};
