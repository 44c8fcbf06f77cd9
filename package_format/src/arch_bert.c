/* Registry row: BERT encoders (Hugging Face model_type "bert": BertModel for sentence embeddings,
 * MiniLM, bge, e5, gte; BertForSequenceClassification for cross-encoder rerankers). Conventions
 * relied on (transformers' modeling_bert):
 *  - embeddings: word + absolute position + token type, then LayerNorm (with bias);
 *  - post-norm blocks: x = LN(x + O(attn(x))), x = LN(x + down(gelu(up(x)))), every Linear with a
 *    bias, attention bidirectional (a padding mask only), hidden_act "gelu" = GELU with erf;
 *  - a cross-encoder's tensors sit under "bert." with "classifier.{weight,bias}" (num_labels rows)
 *    after the pooler (tanh(dense(h[CLS]))).
 * Canonical names follow Llama's where the role is the same (model.embed_tokens, self_attn.q_proj,
 * o_proj, mlp.up_proj, mlp.down_proj); BERT's own parts are model.embed_positions,
 * model.embed_token_types, model.embed_norm, and per layer post_attention_layernorm and
 * post_feedforward_layernorm (each .weight and .bias).
 * GGUF (llama.cpp's convert_hf_to_gguf.py, BertModel: token_embd, position_embd, token_types,
 * token_embd_norm, blk.N.attn_{q,k,v,output}, attn_output_norm, ffn_up, ffn_down, layer_output_norm)
 * maps its names here, its bert.* metadata becomes the config (gguf_config) and its WordPiece
 * vocabulary a tokenizer.json (gguf_wpm.c). */
#include <stdio.h>
#include <string.h>

#include "arch.h"
#include "mpk-impl.h"
#include "servd/status.h"

static const char *const hf_types[] = {"bert", NULL};
static const char *const hf_archs[] = {"BertModel", "BertForSequenceClassification", NULL};
static const char *const gguf_archs[] = {"bert", NULL};

static const mpk_name_pair hf_global[] = {
    {"embeddings.word_embeddings.weight", "model.embed_tokens.weight"},
    {"embeddings.position_embeddings.weight", "model.embed_positions.weight"},
    {"embeddings.token_type_embeddings.weight", "model.embed_token_types.weight"},
    {"embeddings.LayerNorm.weight", "model.embed_norm.weight"},
    {"embeddings.LayerNorm.bias", "model.embed_norm.bias"},
    /* transformers' position_ids buffer (0..max-1, I64): the code counts positions itself */
    {"embeddings.position_ids", ""},
    {NULL, NULL}};
static const mpk_name_pair hf_block[] = {{"attention.self.query.weight", "self_attn.q_proj.weight"},
                                         {"attention.self.query.bias", "self_attn.q_proj.bias"},
                                         {"attention.self.key.weight", "self_attn.k_proj.weight"},
                                         {"attention.self.key.bias", "self_attn.k_proj.bias"},
                                         {"attention.self.value.weight", "self_attn.v_proj.weight"},
                                         {"attention.self.value.bias", "self_attn.v_proj.bias"},
                                         {"attention.output.dense.weight", "self_attn.o_proj.weight"},
                                         {"attention.output.dense.bias", "self_attn.o_proj.bias"},
                                         {"attention.output.LayerNorm.weight", "post_attention_layernorm.weight"},
                                         {"attention.output.LayerNorm.bias", "post_attention_layernorm.bias"},
                                         {"intermediate.dense.weight", "mlp.up_proj.weight"},
                                         {"intermediate.dense.bias", "mlp.up_proj.bias"},
                                         {"output.dense.weight", "mlp.down_proj.weight"},
                                         {"output.dense.bias", "mlp.down_proj.bias"},
                                         {"output.LayerNorm.weight", "post_feedforward_layernorm.weight"},
                                         {"output.LayerNorm.bias", "post_feedforward_layernorm.bias"},
                                         {NULL, NULL}};

static const mpk_name_pair gguf_global[] = {{"token_embd.weight", "model.embed_tokens.weight"},
                                            {"position_embd.weight", "model.embed_positions.weight"},
                                            {"token_types.weight", "model.embed_token_types.weight"},
                                            {"token_embd_norm.weight", "model.embed_norm.weight"},
                                            {"token_embd_norm.bias", "model.embed_norm.bias"},
                                            {"cls.weight", "classifier.weight"},
                                            {"cls.bias", "classifier.bias"},
                                            {NULL, NULL}};
static const mpk_name_pair gguf_block[] = {{"attn_q.weight", "self_attn.q_proj.weight"},
                                           {"attn_q.bias", "self_attn.q_proj.bias"},
                                           {"attn_k.weight", "self_attn.k_proj.weight"},
                                           {"attn_k.bias", "self_attn.k_proj.bias"},
                                           {"attn_v.weight", "self_attn.v_proj.weight"},
                                           {"attn_v.bias", "self_attn.v_proj.bias"},
                                           {"attn_output.weight", "self_attn.o_proj.weight"},
                                           {"attn_output.bias", "self_attn.o_proj.bias"},
                                           {"attn_output_norm.weight", "post_attention_layernorm.weight"},
                                           {"attn_output_norm.bias", "post_attention_layernorm.bias"},
                                           {"ffn_up.weight", "mlp.up_proj.weight"},
                                           {"ffn_up.bias", "mlp.up_proj.bias"},
                                           {"ffn_down.weight", "mlp.down_proj.weight"},
                                           {"ffn_down.bias", "mlp.down_proj.bias"},
                                           {"layer_output_norm.weight", "post_feedforward_layernorm.weight"},
                                           {"layer_output_norm.bias", "post_feedforward_layernorm.bias"},
                                           {NULL, NULL}};

typedef struct dims {
  int64_t hidden, inter, layers, heads, vocab, positions, types;
} dims;

/* The values the encoder reads, with transformers' BertConfig defaults. */
static int read_dims(const char *what, const json_t *c, dims *d) {
  int rc;
  double eps;
  if ((rc = mpk__cfg_int(what, c, "hidden_size", true, 0, &d->hidden)) ||
      (rc = mpk__cfg_int(what, c, "intermediate_size", true, 0, &d->inter)) ||
      (rc = mpk__cfg_int(what, c, "num_hidden_layers", true, 0, &d->layers)) ||
      (rc = mpk__cfg_int(what, c, "num_attention_heads", true, 0, &d->heads)) ||
      (rc = mpk__cfg_int(what, c, "vocab_size", true, 0, &d->vocab)) ||
      (rc = mpk__cfg_int(what, c, "max_position_embeddings", false, 512, &d->positions)) ||
      (rc = mpk__cfg_int(what, c, "type_vocab_size", false, 2, &d->types)) ||
      (rc = mpk__cfg_pos(what, c, "layer_norm_eps", false, 1e-12, &eps)))
    return rc;
  if (d->hidden % d->heads)
    return servd_fail(SERVD_EFORMAT, "%s: config: hidden_size %lld is not a multiple of num_attention_heads %lld", what,
                      (long long)d->hidden, (long long)d->heads);
  return 0;
}

static int check_config(const mpk_arch *a, const char *what, const json_t *c) {
  (void)a;
  dims d;
  int rc = read_dims(what, c, &d);
  if (rc) return rc;
  static const struct {
    const char *key, *want;
  } fixed[] = {{"hidden_act", "gelu"}, {"position_embedding_type", "absolute"}};
  for (size_t i = 0; i < sizeof fixed / sizeof *fixed; i++) {
    json_t *v = json_object_get(c, fixed[i].key);
    if (v && !json_is_null(v) && (!json_is_string(v) || strcmp(json_string_value(v), fixed[i].want))) {
      char q[128];
      const char *s = json_is_string(v) ? json_string_value(v) : "(not a string)";
      return servd_fail(SERVD_EUNSUPPORTED, "%s: config: \"%s\" \"%s\": expected \"%s\"", what, fixed[i].key,
                        mpk__printable(s, strlen(s), q, sizeof q), fixed[i].want);
    }
  }
  return 0;
}

/* Pack time: the engine reads "is_causal": false as "an encoder" (whole prompts in one step). */
static int prepare_config(const mpk_arch *a, const char *what, json_t *c) {
  (void)a, (void)what;
  return json_object_set_new(c, "is_causal", json_false()) ? servd_fail(SERVD_ENOMEM, "out of memory") : 0;
}

static int check_tensors(const mpk_arch *a, const char *what, const json_t *c, const mpk_shapes *s) {
  (void)a;
  dims d;
  int rc = read_dims(what, c, &d);
  if (rc) return rc;
  int64_t H = d.hidden, I = d.inter;
  if ((rc = mpk__shapes_expect(what, s, "model.embed_tokens.weight", 2, d.vocab, H)) ||
      (rc = mpk__shapes_expect(what, s, "model.embed_positions.weight", 2, d.positions, H)) ||
      (rc = mpk__shapes_expect(what, s, "model.embed_token_types.weight", 2, d.types, H)) ||
      (rc = mpk__shapes_expect(what, s, "model.embed_norm.weight", 1, H)) ||
      (rc = mpk__shapes_expect(what, s, "model.embed_norm.bias", 1, H)))
    return rc;
  static const struct {
    const char *name;
    int rows_inter, cols_inter; /* 1: that dimension is intermediate_size, else hidden_size */
    bool matrix;
  } per_layer[] = {{"self_attn.q_proj", 0, 0, true},
                   {"self_attn.k_proj", 0, 0, true},
                   {"self_attn.v_proj", 0, 0, true},
                   {"self_attn.o_proj", 0, 0, true},
                   {"mlp.up_proj", 1, 0, true},
                   {"mlp.down_proj", 0, 1, true},
                   {"post_attention_layernorm", 0, 0, false},
                   {"post_feedforward_layernorm", 0, 0, false}};
  char name[160];
  for (int64_t l = 0; l < d.layers; l++)
    for (size_t i = 0; i < sizeof per_layer / sizeof *per_layer; i++) {
      int64_t rows = per_layer[i].rows_inter ? I : H, cols = per_layer[i].cols_inter ? I : H;
      snprintf(name, sizeof name, "model.layers.%lld.%s.weight", (long long)l, per_layer[i].name);
      rc = per_layer[i].matrix ? mpk__shapes_expect(what, s, name, 2, rows, cols)
                               : mpk__shapes_expect(what, s, name, 1, rows);
      snprintf(name, sizeof name, "model.layers.%lld.%s.bias", (long long)l, per_layer[i].name);
      if (rc || (rc = mpk__shapes_expect(what, s, name, 1, rows))) return rc;
    }
  snprintf(name, sizeof name, "model.layers.%lld.self_attn.q_proj.weight", (long long)d.layers);
  if (mpk__shapes_find(s, name))
    return servd_fail(SERVD_EFORMAT, "%s: tensor \"%s\": a layer beyond num_hidden_layers %lld", what, name,
                      (long long)d.layers);
  /* A cross-encoder's head: the pooler and classifier (num_labels, H), both or neither classifier part. */
  const mpk_shape_entry *cw = mpk__shapes_find(s, "classifier.weight");
  if (cw || mpk__shapes_find(s, "classifier.bias")) {
    int64_t labels = cw && cw->ndim == 2 ? cw->shape[0] : 0;
    if (!labels)
      return servd_fail(SERVD_EFORMAT, "%s: tensor \"classifier.weight\": expected (num_labels, %lld)", what,
                        (long long)H);
    if ((rc = mpk__shapes_expect(what, s, "classifier.weight", 2, labels, H)) ||
        (rc = mpk__shapes_expect(what, s, "classifier.bias", 1, labels)))
      return rc;
  }
  if (mpk__shapes_find(s, "pooler.dense.weight") &&
      ((rc = mpk__shapes_expect(what, s, "pooler.dense.weight", 2, H, H)) ||
       (rc = mpk__shapes_expect(what, s, "pooler.dense.bias", 1, H))))
    return rc;
  return 0;
}

/* bert.* metadata (llama.cpp's names) -> BertConfig keys: Llama's shared reader for the dimensions,
 * then the norm epsilon, the token types (rows of token_types.weight), pooling and the activation. */
static int gguf_config(const mpk_arch *a, const char *what, const mpk_gguf *g, const char *ga, bool tied,
                       uint64_t n_vocab, json_t **out) {
  int rc = mpk__llama_gguf_config(a, what, g, ga, tied, n_vocab, out);
  if (rc) return rc;
  json_t *c = *out;
  char key[128];
  double eps = 1e-12;
  snprintf(key, sizeof key, "%s.attention.layer_norm_epsilon", ga);
  if (mpk_gguf_get_f64(g, key, &eps) == 0 && eps > 0) json_object_set_new(c, "layer_norm_eps", json_real(eps));
  uint64_t pool = 0;
  snprintf(key, sizeof key, "%s.pooling_type", ga);
  static const char *const pools[] = {NULL, "mean", "cls"}; /* llama.cpp's LLAMA_POOLING_TYPE_NONE, MEAN, CLS */
  if (mpk_gguf_get_u64(g, key, &pool) == 0) {
    if (pool < 1 || pool > 2) {
      json_decref(c);
      *out = NULL;
      return servd_fail(SERVD_EUNSUPPORTED, "%s: %s = %llu: expected 1 (mean) or 2 (cls)", what, key,
                        (unsigned long long)pool);
    }
    json_object_set_new(c, "pooling", json_string(pools[pool]));
  }
  int64_t types = 2;
  for (size_t i = 0; i < g->n_tensors; i++)
    if (!strcmp(g->tensors[i].name, "token_types.weight") && g->tensors[i].ndim == 2)
      types = g->tensors[i].ne[1]; /* innermost first: ne[1] is the rows */
  json_object_set_new(c, "type_vocab_size", json_integer(types));
  json_object_set_new(c, "hidden_act", json_string("gelu"));
  json_object_set_new(c, "position_embedding_type", json_string("absolute"));
  /* a decoder's keys the shared reader wrote mean nothing here */
  static const char *const drop[] = {"num_key_value_heads", "head_dim", "rms_norm_eps", "rope_theta",
                                     "tie_word_embeddings"};
  for (size_t i = 0; i < sizeof drop / sizeof *drop; i++) json_object_del(c, drop[i]);
  return 0;
}

const mpk_arch mpk__arch_bert = {
    .name = "bert",
    .hf_model_types = hf_types,
    .hf_architectures = hf_archs,
    .gguf_archs = gguf_archs,
    .gguf_names = {"blk.", gguf_global, gguf_block},
    .hf_names = {"encoder.layer.", hf_global, hf_block},
    .hf_prefix = "bert.",
    /* no RoPE (absolute positions); the manifest's field is required of every causal-lm package */
    .rope_layout_gguf = "half",
    .rope_layout_hf = "half",
    .code = "bert",
    .entry_point = "bert.model:BertModel",
    .gguf_config = gguf_config,
    .prepare_config = prepare_config,
    .check_config = check_config,
    .check_tensors = check_tensors,
};
