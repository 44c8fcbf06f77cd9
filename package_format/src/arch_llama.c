/* Registry row: Llama (Llama 2, 3, 3.1, 3.2, SmolLM2, TinyLlama; GGUF "llama", Mistral GGUFs
 * included, since llama.cpp converts Mistral as "llama"). Code: models/llama. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arch.h"
#include "mpk-impl.h"
#include "servd/status.h"

/* An optional finite float of the GGUF metadata; NaN or infinity is refused, naming the key,
 * rather than replaced by the default (the model would silently run with other hyperparameters). */
static int gguf_finite(const char *what, const mpk_gguf *g, const char *key, bool positive, double *v) {
  int r = mpk_gguf_get_f64(g, key, v);
  if (r == SERVD_EINVAL) return 0; /* absent: the default stays */
  if (r) return r;
  if (!isfinite(*v) || *v < 0 || (positive && *v == 0))
    return servd_fail(SERVD_EFORMAT, "%s: %s = %g, expected a finite number %s 0", what, key, *v,
                      positive ? ">" : ">=");
  return 0;
}

/* <arch>.* metadata -> a Hugging Face-style LlamaConfig (the keys Qwen2/Qwen3 GGUFs share). */
int mpk__llama_gguf_config(const mpk_arch *a, const char *what, const mpk_gguf *g, const char *ga, bool tied,
                           uint64_t n_vocab, json_t **out) {
  static const struct {
    const char *key, *hf;
    bool required, tok;
  } ints[] = {{"embedding_length", "hidden_size", true, false},
              {"feed_forward_length", "intermediate_size", true, false},
              {"block_count", "num_hidden_layers", true, false},
              {"attention.head_count", "num_attention_heads", true, false},
              {"attention.head_count_kv", "num_key_value_heads", false, false},
              {"context_length", "max_position_embeddings", false, false},
              {"bos_token_id", "bos_token_id", false, true},
              {"eos_token_id", "eos_token_id", false, true}};
  json_t *c = json_pack("{s:s,s:[s]}", "model_type", a->hf_model_types[0], "architectures", a->hf_architectures[0]);
  int rc = 0;
  char key[128];
  uint64_t v[8] = {0};
  for (size_t i = 0; i < 8; i++) {
    snprintf(key, sizeof key, "%s.%s", ints[i].tok ? "tokenizer.ggml" : ga, ints[i].key);
    int r = mpk_gguf_get_u64(g, key, &v[i]);
    if (r == SERVD_EINVAL && !ints[i].required) continue;
    if (r == SERVD_EINVAL) {
      rc = servd_fail(SERVD_EFORMAT, "%s: %s: missing (required for a %s model)", what, key, a->name);
      goto fail;
    }
    if (r) {
      rc = r;
      goto fail;
    }
    if ((v[i] == 0 && i < 6) || v[i] > (1ull << 31)) {
      rc = servd_fail(SERVD_EFORMAT, "%s: %s = %llu, expected %s..2^31", what, key, (unsigned long long)v[i],
                      i < 6 ? "1" : "0");
      goto fail;
    }
    json_object_set_new(c, ints[i].hf, json_integer((json_int_t)v[i]));
  }
  if (!json_object_get(c, "num_key_value_heads"))
    json_object_set(c, "num_key_value_heads", json_object_get(c, "num_attention_heads"));
  uint64_t hidden = v[0], heads = v[3], head_dim = hidden / heads;
  if (hidden % heads) {
    rc = servd_fail(SERVD_EFORMAT, "%s: %s.embedding_length %llu is not a multiple of head_count %llu", what, ga,
                    (unsigned long long)hidden, (unsigned long long)heads);
    goto fail;
  }
  uint64_t kl;
  snprintf(key, sizeof key, "%s.attention.key_length", ga);
  int r = mpk_gguf_get_u64(g, key, &kl);
  if (r == 0) head_dim = kl;
  else if (r != SERVD_EINVAL) {
    rc = r;
    goto fail;
  }
  json_object_set_new(c, "head_dim", json_integer((json_int_t)head_dim));
  json_object_set_new(c, "vocab_size", json_integer((json_int_t)n_vocab));
  double eps = 1e-5, theta = 10000.0;
  snprintf(key, sizeof key, "%s.attention.layer_norm_rms_epsilon", ga);
  if ((rc = gguf_finite(what, g, key, true, &eps))) goto fail;
  snprintf(key, sizeof key, "%s.rope.freq_base", ga);
  if ((rc = gguf_finite(what, g, key, true, &theta))) goto fail;
  json_object_set_new(c, "rms_norm_eps", json_real(mpk__shortest_f32(eps))); /* stored as f32 in GGUF */
  json_object_set_new(c, "rope_theta", json_real(theta));
  json_object_set_new(c, "tie_word_embeddings", json_boolean(tied));
  const char *st;
  size_t sl;
  double factor = 1.0;
  snprintf(key, sizeof key, "%s.rope.scaling.type", ga);
  if (mpk_gguf_get_str(g, key, &st, &sl) == 0 && sl > 0 && !(sl == 4 && !memcmp(st, "none", 4))) {
    snprintf(key, sizeof key, "%s.rope.scaling.factor", ga);
    if ((rc = gguf_finite(what, g, key, true, &factor))) goto fail;
    json_t *rs = json_pack("{s:s%,s:f}", "type", st, sl, "factor", factor);
    uint64_t orig;
    snprintf(key, sizeof key, "%s.rope.scaling.original_context_length", ga);
    if (mpk_gguf_get_u64(g, key, &orig) == 0)
      json_object_set_new(rs, "original_max_position_embeddings", json_integer((json_int_t)orig));
    if (sl == 4 && !memcmp(st, "yarn", 4)) { /* llama.cpp's YaRN keys, as transformers names them */
      static const char *const yk[][2] = {{"yarn_beta_fast", "beta_fast"}, {"yarn_beta_slow", "beta_slow"}};
      double b, af;
      for (int i = 0; i < 2; i++) {
        snprintf(key, sizeof key, "%s.rope.scaling.%s", ga, yk[i][0]);
        if (mpk_gguf_get_f64(g, key, &b) == 0) json_object_set_new(rs, yk[i][1], json_real(mpk__shortest_f32(b)));
      }
      /* llama.cpp multiplies YaRN's own 1 + 0.1 ln(factor) by attn_factor; transformers takes the product. */
      snprintf(key, sizeof key, "%s.rope.scaling.attn_factor", ga);
      if (mpk_gguf_get_f64(g, key, &af) == 0 && af != 1.0 && factor > 1.0)
        json_object_set_new(rs, "attention_factor", json_real(af * (0.1 * log(factor) + 1.0)));
    }
    json_object_set_new(c, "rope_scaling", rs);
  } else {
    json_object_set_new(c, "rope_scaling", json_null());
  }
  *out = c;
  return 0;
fail:
  json_decref(c);
  return rc;
}

static const mpk_dense_opts opts = {.family = "llama"};

static const char *const hf_types[] = {"llama", NULL};
static const char *const hf_archs[] = {"LlamaForCausalLM", NULL};
static const char *const gguf_archs[] = {"llama", NULL};

/* llama.cpp's names (gguf-py tensor_mapping.py, MODEL_ARCH.LLAMA). */
const mpk_name_pair mpk__gguf_llama_global[] = {{"token_embd.weight", "model.embed_tokens.weight"},
                                                {"output_norm.weight", "model.norm.weight"},
                                                {"output.weight", "lm_head.weight"},
                                                {NULL, NULL}};
static const mpk_name_pair gguf_block[] = {
    {"attn_norm.weight", "input_layernorm.weight"}, {"ffn_norm.weight", "post_attention_layernorm.weight"},
    {"attn_q.weight", "self_attn.q_proj.weight"},   {"attn_k.weight", "self_attn.k_proj.weight"},
    {"attn_v.weight", "self_attn.v_proj.weight"},   {"attn_output.weight", "self_attn.o_proj.weight"},
    {"ffn_gate.weight", "mlp.gate_proj.weight"},    {"ffn_up.weight", "mlp.up_proj.weight"},
    {"ffn_down.weight", "mlp.down_proj.weight"},    {NULL, NULL}};

const mpk_arch mpk__arch_llama = {
    .name = "llama",
    .hf_model_types = hf_types,
    .hf_architectures = hf_archs,
    .gguf_archs = gguf_archs,
    .gguf_names = {"blk.", mpk__gguf_llama_global, gguf_block},
    .hf_names = {NULL, NULL, NULL},    /* the canonical names are Llama's Hugging Face names */
    .rope_layout_gguf = "interleaved", /* llama.cpp's converter permutes Q and K rows */
    .rope_layout_hf = "half",
    .code = "llama",
    .entry_point = "llama.model:LlamaModel",
    .gguf_config = mpk__llama_gguf_config,
    .check_config = mpk__dense_check_config,
    .check_tensors = mpk__dense_check_tensors,
    .dense = &opts,
};
