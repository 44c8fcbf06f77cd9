/* Registry row: Gemma 3 text (Hugging Face model_type "gemma3_text", and "gemma3" whose text_config is
 * taken; GGUF "gemma3"). Code: models/llama (model.py's Gemma3Model). Conventions relied on:
 *  - transformers' modeling_gemma3: embeddings times sqrt(hidden_size) cast to the weights' dtype;
 *    Gemma3RMSNorm x / rms * (1 + w); input_layernorm -> attention -> post_attention_layernorm -> add,
 *    pre_feedforward_layernorm -> gelu_pytorch_tanh(gate) * up -> post_feedforward_layernorm -> add;
 *    q_norm/k_norm over each head before RoPE; scores times query_pre_attn_scalar^-0.5; layer i local
 *    (sliding_window, RoPE base rope_local_base_freq) unless layer_types says "full_attention", or by
 *    default unless (i + 1) % sliding_window_pattern == 0; global layers use rope_theta and rope_scaling.
 *    attn_logit_softcapping and final_logit_softcapping are null in Gemma 3: anything else is refused.
 *  - llama.cpp's converter (Gemma3Model) adds 1 to every *norm.weight (the GGUF holds 1 + w), does not
 *    permute Q/K (NEOX RoPE), writes no pattern, local base nor query scale: llama.cpp hard-codes a
 *    pattern of 6 and a local base of 10000, and scales queries by head_dim^-0.5 except in the 27B
 *    (62 layers: (hidden / heads)^-0.5); the GGUF reader below writes the same into the config.
 *  - gguf-py's names: blk.N.post_attention_norm, ffn_norm (pre-feedforward), post_ffw_norm. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "arch.h"
#include "mpk-impl.h"
#include "servd/status.h"

typedef struct dims {
  mpk_decoder_dims m;
  int64_t window, pattern;
} dims;

/* The values Gemma3Model reads, with transformers' Gemma3TextConfig defaults. */
static int read_dims(const char *what, const json_t *c, dims *d) {
  int rc;
  double x;
  if ((rc = mpk__decoder_dims_read(what, c, 256, &d->m)) ||
      (rc = mpk__cfg_int(what, c, "sliding_window", false, 4096, &d->window)) ||
      (rc = mpk__cfg_int(what, c, "sliding_window_pattern", false, 6, &d->pattern)) ||
      (rc = mpk__cfg_pos(what, c, "rms_norm_eps", false, 1e-6, &x)) ||
      (rc = mpk__cfg_pos(what, c, "rope_theta", false, 1e6, &x)) ||
      (rc = mpk__cfg_pos(what, c, "rope_local_base_freq", false, 1e4, &x)) ||
      (rc = mpk__cfg_pos(what, c, "query_pre_attn_scalar", false, 256, &x)))
    return rc;
  return mpk__decoder_dims_check(what, &d->m);
}

static int check_config(const mpk_arch *a, const char *what, const json_t *c) {
  (void)a;
  dims d;
  int rc;
  if ((rc = read_dims(what, c, &d)) || (rc = mpk__cfg_tie(what, c))) return rc;
  /* Gemma 2's soft-capping (Gemma 3 has none): servd has no op for it; refused rather than ignored. */
  static const char *const caps[] = {"attn_logit_softcapping", "final_logit_softcapping"};
  for (int i = 0; i < 2; i++) {
    json_t *sc = json_object_get(c, caps[i]);
    if (sc && !json_is_null(sc))
      return servd_fail(SERVD_EUNSUPPORTED,
                        "%s: config: \"%s\": expected null (Gemma 3 has none; servd does not soft-cap)", what, caps[i]);
  }
  const char *act = json_string_value(json_object_get(c, "hidden_activation"));
  if (json_object_get(c, "hidden_activation") && !json_is_null(json_object_get(c, "hidden_activation")) &&
      (!act || strcmp(act, "gelu_pytorch_tanh")))
    return servd_fail(SERVD_EUNSUPPORTED, "%s: config: \"hidden_activation\": expected \"gelu_pytorch_tanh\"", what);
  json_t *lt = json_object_get(c, "layer_types");
  if (lt && !json_is_null(lt)) {
    bool ok = json_is_array(lt) && (int64_t)json_array_size(lt) == d.m.layers;
    for (size_t i = 0; ok && i < json_array_size(lt); i++) {
      const char *s = json_string_value(json_array_get(lt, i));
      ok = s && (!strcmp(s, "sliding_attention") || !strcmp(s, "full_attention"));
    }
    if (!ok)
      return servd_fail(SERVD_EFORMAT,
                        "%s: config: \"layer_types\": expected %lld of \"sliding_attention\" or \"full_attention\"",
                        what, (long long)d.m.layers);
  }
  /* Global layers: no scaling, or transformers' linear (positions divided by factor). */
  return mpk__cfg_rope_scaling(what, c, "linear", 1, false, "\"linear\" with a factor >= 1");
}

/* "gemma3" (Gemma3ForConditionalGeneration): the text model's config is text_config; its keys are
 * lifted to the top (the vision tower's tensors are packed but not used). */
static int prepare_config(const mpk_arch *a, const char *what, json_t *c) {
  (void)a;
  json_t *tc = json_object_get(c, "text_config");
  const char *mt = json_string_value(json_object_get(c, "model_type"));
  if (!mt || strcmp(mt, "gemma3")) return 0;
  if (!json_is_object(tc))
    return servd_fail(SERVD_EFORMAT, "%s: config: model_type \"gemma3\" without a \"text_config\" object", what);
  json_object_update(c, tc);
  json_object_set_new(c, "model_type", json_string("gemma3_text"));
  json_object_del(c, "text_config");
  json_object_del(c, "vision_config");
  fprintf(stderr, "modelpkg: %s: gemma3: the text model of text_config is packed (model_type gemma3_text)\n", what);
  return 0;
}

static int check_tensors(const mpk_arch *a, const char *what, const json_t *c, const mpk_shapes *s) {
  dims d;
  int rc = read_dims(what, c, &d);
  if (rc) return rc;
  int64_t H = d.m.hidden, Q = d.m.heads * d.m.head_dim, KV = d.m.kv_heads * d.m.head_dim, I = d.m.inter,
          D = d.m.head_dim;
  const mpk_layer_tensor t[] = {{"input_layernorm.weight", 1, H, 0, true},
                                {"post_attention_layernorm.weight", 1, H, 0, true},
                                {"pre_feedforward_layernorm.weight", 1, H, 0, true},
                                {"post_feedforward_layernorm.weight", 1, H, 0, true},
                                {"self_attn.q_proj.weight", 2, Q, H, true},
                                {"self_attn.k_proj.weight", 2, KV, H, true},
                                {"self_attn.v_proj.weight", 2, KV, H, true},
                                {"self_attn.o_proj.weight", 2, H, Q, true},
                                {"self_attn.q_norm.weight", 1, D, 0, true},
                                {"self_attn.k_norm.weight", 1, D, 0, true},
                                {"mlp.gate_proj.weight", 2, I, H, true},
                                {"mlp.up_proj.weight", 2, I, H, true},
                                {"mlp.down_proj.weight", 2, H, I, true}};
  return mpk__decoder_check_tensors(what, c, s, &d.m, t, sizeof t / sizeof *t, a->name);
}

/* gemma3.* metadata: Llama's keys, then what llama.cpp fixes for Gemma 3 (see the top). */
static int gguf_config(const mpk_arch *a, const char *what, const mpk_gguf *g, const char *ga, bool tied,
                       uint64_t n_vocab, json_t **out) {
  int rc = mpk__llama_gguf_config(a, what, g, ga, tied, n_vocab, out);
  if (rc) return rc;
  json_t *c = *out;
  char key[128];
  uint64_t v;
  snprintf(key, sizeof key, "%s.attention.sliding_window", ga);
  if (mpk_gguf_get_u64(g, key, &v) == 0) json_object_set_new(c, "sliding_window", json_integer((json_int_t)v));
  json_object_set_new(c, "sliding_window_pattern", json_integer(6));
  json_object_set_new(c, "rope_local_base_freq", json_real(10000.0));
  int64_t layers = json_integer_value(json_object_get(c, "num_hidden_layers"));
  int64_t hidden = json_integer_value(json_object_get(c, "hidden_size"));
  int64_t heads = json_integer_value(json_object_get(c, "num_attention_heads"));
  int64_t hd = json_integer_value(json_object_get(c, "head_dim"));
  json_object_set_new(c, "query_pre_attn_scalar", json_integer(layers == 62 ? hidden / heads : hd));
  json_object_set_new(c, "hidden_activation", json_string("gelu_pytorch_tanh"));
  double cap;
  snprintf(key, sizeof key, "%s.final_logit_softcapping", ga);
  if (mpk_gguf_get_f64(g, key, &cap) == 0)
    json_object_set_new(c, "final_logit_softcapping", json_real(cap)); /* refused by the check */
  return 0;
}

static const char *const hf_types[] = {"gemma3_text", "gemma3", NULL};
static const char *const hf_archs[] = {"Gemma3ForCausalLM", "Gemma3ForConditionalGeneration", NULL};
static const char *const gguf_archs[] = {"gemma3", NULL};

static const mpk_name_pair gguf_block[] = {{"attn_norm.weight", "input_layernorm.weight"},
                                           {"post_attention_norm.weight", "post_attention_layernorm.weight"},
                                           {"ffn_norm.weight", "pre_feedforward_layernorm.weight"},
                                           {"post_ffw_norm.weight", "post_feedforward_layernorm.weight"},
                                           {"attn_q.weight", "self_attn.q_proj.weight"},
                                           {"attn_k.weight", "self_attn.k_proj.weight"},
                                           {"attn_v.weight", "self_attn.v_proj.weight"},
                                           {"attn_output.weight", "self_attn.o_proj.weight"},
                                           {"attn_q_norm.weight", "self_attn.q_norm.weight"},
                                           {"attn_k_norm.weight", "self_attn.k_norm.weight"},
                                           {"ffn_gate.weight", "mlp.gate_proj.weight"},
                                           {"ffn_up.weight", "mlp.up_proj.weight"},
                                           {"ffn_down.weight", "mlp.down_proj.weight"},
                                           {NULL, NULL}};
/* Gemma3ForConditionalGeneration (transformers < 4.52) keeps the text model under language_model. */
static const mpk_name_pair hf_global[] = {{"language_model.model.embed_tokens.weight", "model.embed_tokens.weight"},
                                          {"language_model.model.norm.weight", "model.norm.weight"},
                                          {"language_model.lm_head.weight", "lm_head.weight"},
                                          {NULL, NULL}};
static const mpk_name_pair hf_block[] = {
#define SAME(n) \
  { n, n }
    SAME("input_layernorm.weight"),
    SAME("post_attention_layernorm.weight"),
    SAME("pre_feedforward_layernorm.weight"),
    SAME("post_feedforward_layernorm.weight"),
    SAME("self_attn.q_proj.weight"),
    SAME("self_attn.k_proj.weight"),
    SAME("self_attn.v_proj.weight"),
    SAME("self_attn.o_proj.weight"),
    SAME("self_attn.q_norm.weight"),
    SAME("self_attn.k_norm.weight"),
    SAME("mlp.gate_proj.weight"),
    SAME("mlp.up_proj.weight"),
    SAME("mlp.down_proj.weight"),
    {NULL, NULL}};
#undef SAME

const mpk_arch mpk__arch_gemma3 = {
    .name = "gemma3",
    .hf_model_types = hf_types,
    .hf_architectures = hf_archs,
    .gguf_archs = gguf_archs,
    .gguf_names = {"blk.", mpk__gguf_llama_global, gguf_block},
    .hf_names = {"language_model.model.layers.", hf_global, hf_block},
    .rope_layout_gguf = "half",
    .rope_layout_hf = "half",
    .code = "llama",
    .entry_point = "llama.model:Gemma3Model",
    .gguf_config = gguf_config,
    .prepare_config = prepare_config,
    .check_config = check_config,
    .check_tensors = check_tensors,
};
