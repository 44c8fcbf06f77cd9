/* GGUF (llama architecture) -> package: model config from llama.* metadata, tokenizer.ggml.* as an
 * equivalent Hugging Face tokenizer.json, the chat template, and tensors under Hugging Face names.
 * Every ggml type a dtype keeps (servd/dtypes.def: F32 F16 BF16 and the block types) is kept as it
 * is; a NaN or infinite block scale is refused.
 * GGUF Q/K rows are permuted for interleaved-pair RoPE: rope_layout "interleaved".
 * rope_freqs.weight becomes the config's Llama 3 rope_scaling (rope_fit.c) and is not stored. */
#include <stdio.h>
#include <stdlib.h>

#include "arch.h"
#include "import-impl.h"
#include "mpk-impl.h"
#include "mpk/gguf.h"
#include "rope_fit.h"
#include "servd/dtype_traits.h"

/* The ggml type that t keeps ("Q4_K"), NULL when none: lists them in the message refusing another. */
static const char *ggml_kept(servd_dtype t) {
  const int g = servd_dtype_get_traits(t)->ggml_type;
  return g >= 0 ? mpk_ggml_type_name((uint32_t)g) : NULL;
}

static json_t *jstrn(const char *s, size_t n) { return json_stringn(s, n); } /* NULL unless valid UTF-8 */

/* The Hugging Face pre-tokenizer equivalent to llama.cpp's tokenizer.ggml.pre. */
static json_t *pre_tokenizer_for(const char *pre, bool *known) {
  json_t *bytelevel =
      json_pack("{s:s,s:b,s:b,s:b}", "type", "ByteLevel", "add_prefix_space", 0, "trim_offsets", 1, "use_regex", 1);
  *known = true;
  if (!pre || !strcmp(pre, "gpt2") || !strcmp(pre, "default") || !strcmp(pre, "gpt-2")) return bytelevel;
  if (!strcmp(pre, "smollm") || !strcmp(pre, "starcoder") || !strcmp(pre, "refact") || !strcmp(pre, "codeshell") ||
      !strcmp(pre, "command-r") || !strcmp(pre, "exaone") || !strcmp(pre, "minerva-7b"))
    return json_pack("{s:s,s:[{s:s,s:b},o]}", "type", "Sequence", "pretokenizers", "type", "Digits",
                     "individual_digits", 1, bytelevel);
  /* Llama 3 splits numbers in runs of up to 3 digits; Qwen2, Qwen2.5 and Qwen3 ("qwen2") digit by
   * digit, with the same regex otherwise (their tokenizer.json). */
  bool qwen = !strcmp(pre, "qwen2");
  if (!strcmp(pre, "llama-bpe") || !strcmp(pre, "llama3") || qwen) {
    json_decref(bytelevel);
    char re[256];
    snprintf(re, sizeof re,
             "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}%s| "
             "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
             qwen ? "" : "{1,3}");
    return json_pack("{s:s,s:[{s:s,s:{s:s},s:s,s:b},{s:s,s:b,s:b,s:b}]}", "type", "Sequence", "pretokenizers", "type",
                     "Split", "pattern", "Regex", re, "behavior", "Isolated", "invert", 0, "type", "ByteLevel",
                     "add_prefix_space", 0, "trim_offsets", 1, "use_regex", 0);
  }
  *known = false;
  return bytelevel;
}

typedef struct tok_out {
  char *json;      /* tokenizer.json */
  char *cfg;       /* tokenizer_config.json */
  json_t *special; /* manifest special_tokens */
  json_t *tokinfo; /* manifest tokenizer */
} tok_out;

static int tok_string(const mpk_gguf *g, const mpk_gguf_kv *tokens, uint64_t id, json_t **out, const char *what) {
  const char *s;
  size_t n;
  mpk_gguf_arr_str(g, tokens, id, &s, &n);
  *out = jstrn(s, n);
  if (!*out)
    return servd_fail(SERVD_EFORMAT, "%s: tokenizer.ggml.tokens[%llu]: expected valid UTF-8", what,
                      (unsigned long long)id);
  return 0;
}

/* tokenizer.ggml.model "gpt2" -> tokenizer.json (*out owned by the caller). */
static int gpt2_json(const char *what, const mpk_gguf *g, const mpk_gguf_kv *tokens, const mpk_gguf_kv *types,
                     const mpk_gguf_kv *mkv, const char *pre, json_t **out) {
  int rc = 0;
  json_t *root = NULL, *vocab = NULL, *merges = NULL, *added = NULL;
  vocab = json_object();
  merges = json_array();
  added = json_array();
  for (uint64_t i = 0; i < tokens->n; i++) {
    json_t *s;
    if ((rc = tok_string(g, tokens, i, &s, what))) goto fail;
    const char *key = json_string_value(s);
    if (strlen(key) != json_string_length(s)) {
      json_decref(s);
      rc =
          servd_fail(SERVD_EFORMAT, "%s: tokenizer.ggml.tokens[%llu]: NUL inside a token", what, (unsigned long long)i);
      goto fail;
    }
    if (!json_object_get(vocab, key)) json_object_set_new(vocab, key, json_integer((json_int_t)i)); /* first id wins */
    int64_t ty = types ? mpk_gguf_arr_int(types, i) : 1;
    if (ty == 3 || ty == 4) /* control -> special added token, user-defined -> plain added token */
      json_array_append_new(added,
                            json_pack("{s:I,s:o,s:b,s:b,s:b,s:b,s:b}", "id", (json_int_t)i, "content", s, "single_word",
                                      0, "lstrip", 0, "rstrip", 0, "normalized", ty == 4, "special", ty == 3));
    else json_decref(s);
  }
  for (uint64_t i = 0; mkv && i < mkv->n; i++) {
    const char *s;
    size_t n;
    mpk_gguf_arr_str(g, mkv, i, &s, &n);
    json_t *m = jstrn(s, n);
    if (!m || !memchr(s, ' ', n)) {
      json_decref(m);
      rc = servd_fail(SERVD_EFORMAT, "%s: tokenizer.ggml.merges[%llu]: expected \"left right\" in UTF-8", what,
                      (unsigned long long)i);
      goto fail;
    }
    json_array_append_new(merges, m);
  }
  bool known;
  json_t *pret = pre_tokenizer_for(pre[0] ? pre : NULL, &known);
  if (!known)
    fprintf(stderr,
            "modelpkg: warning: %s: tokenizer.ggml.pre \"%s\" is not known; using the GPT-2 byte-level pre-tokenizer\n",
            what, pre);
  root =
      json_pack("{s:s,s:n,s:n,s:o,s:n,s:o,s:n,s:{s:s,s:b,s:b,s:b},s:{s:s,s:n,s:n,s:n,s:n,s:b,s:b,s:b,s:o,s:o}}",
                "version", "1.0", "truncation", "padding", "added_tokens", added, "normalizer", "pre_tokenizer", pret,
                "post_processor", "decoder", "type", "ByteLevel", "add_prefix_space", 1, "trim_offsets", 1, "use_regex",
                1, "model", "type", "BPE", "dropout", "unk_token", "continuing_subword_prefix", "end_of_word_suffix",
                "fuse_unk", 0, "byte_fallback", 0, "ignore_merges", 0, "vocab", vocab, "merges", merges);
  added = vocab = merges = NULL;
  if (!root) {
    rc = servd_fail(SERVD_ENOMEM, "%s: cannot build tokenizer.json", what);
    goto fail;
  }
  *out = root;
fail:
  json_decref(vocab);
  json_decref(merges);
  json_decref(added);
  return rc;
}

/* gguf_spm.c: tokenizer.ggml.model "llama" (SentencePiece BPE) -> tokenizer.json (*out owned by the caller). */
int mpk__gguf_spm_json(const char *what, const mpk_gguf *g, const mpk_gguf_kv *tokens, const mpk_gguf_kv *types,
                       json_t **out);

/* gguf_wpm.c: tokenizer.ggml.model "bert" (WordPiece) -> tokenizer.json (*out owned by the caller). */
int mpk__gguf_wpm_json(const char *what, const mpk_gguf *g, const mpk_gguf_kv *tokens, const mpk_gguf_kv *types,
                       json_t **out);

static int convert_tokenizer(const char *what, const mpk_gguf *g, tok_out *t) {
  int rc = 0;
  const char *model;
  size_t ml;
  json_t *root = NULL, *cfg = NULL;
  if ((rc = mpk_gguf_get_str(g, "tokenizer.ggml.model", &model, &ml)))
    return rc == SERVD_EINVAL ? servd_fail(SERVD_EFORMAT, "%s: tokenizer.ggml.model: missing", what) : rc;
  bool spm = ml == 5 && !memcmp(model, "llama", 5); /* SentencePiece BPE with byte fallback */
  bool wpm = ml == 4 && !memcmp(model, "bert", 4);  /* WordPiece */
  if (!spm && !wpm && (ml != 4 || memcmp(model, "gpt2", 4)))
    return servd_fail(SERVD_EUNSUPPORTED,
                      "%s: tokenizer.ggml.model \"%.*s\": only \"gpt2\" (byte-level BPE), \"llama\" (SentencePiece "
                      "BPE) and \"bert\" (WordPiece) are supported",
                      what, (int)(ml > 32 ? 32 : ml), model);
  const mpk_gguf_kv *tokens = mpk_gguf_find(g, "tokenizer.ggml.tokens"),
                    *types = mpk_gguf_find(g, "tokenizer.ggml.token_type"),
                    *mkv = mpk_gguf_find(g, "tokenizer.ggml.merges");
  if (!tokens || tokens->type != MPK_GGUF_ARRAY || tokens->arr_type != MPK_GGUF_STRING || tokens->n == 0)
    return servd_fail(SERVD_EFORMAT, "%s: tokenizer.ggml.tokens: expected a non-empty array of strings", what);
  if (types && (types->type != MPK_GGUF_ARRAY || types->arr_type == MPK_GGUF_STRING ||
                types->arr_type == MPK_GGUF_FLOAT32 || types->arr_type == MPK_GGUF_FLOAT64 || types->n != tokens->n))
    return servd_fail(SERVD_EFORMAT,
                      "%s: tokenizer.ggml.token_type: expected an integer array as long as the tokens (%llu)", what,
                      (unsigned long long)tokens->n);
  if (mkv && (mkv->type != MPK_GGUF_ARRAY || mkv->arr_type != MPK_GGUF_STRING))
    return servd_fail(SERVD_EFORMAT, "%s: tokenizer.ggml.merges: expected an array of strings", what);
  char pre[64] = "";
  const char *ps;
  size_t pl;
  int r = mpk_gguf_get_str(g, "tokenizer.ggml.pre", &ps, &pl);
  if (r == 0) snprintf(pre, sizeof pre, "%.*s", (int)(pl < 63 ? pl : 63), ps);
  else if (r != SERVD_EINVAL) return r;

  if (spm) rc = mpk__gguf_spm_json(what, g, tokens, types, &root);
  else if (wpm) rc = mpk__gguf_wpm_json(what, g, tokens, types, &root);
  else rc = gpt2_json(what, g, tokens, types, mkv, pre, &root);
  if (rc) goto fail;
  /* tokenizer.ggml.pre goes into the manifest (tokenizer.pre): tokenizer.json allows no extra keys. */

  /* Special tokens and the tokenizer config. */
  cfg = json_object();
  t->special = json_object();
  static const struct {
    const char *key, *name;
  } sp[] = {{"tokenizer.ggml.bos_token_id", "bos_token"},
            {"tokenizer.ggml.eos_token_id", "eos_token"},
            {"tokenizer.ggml.unknown_token_id", "unk_token"},
            {"tokenizer.ggml.padding_token_id", "pad_token"}};
  for (size_t i = 0; i < 4; i++) {
    uint64_t id;
    r = mpk_gguf_get_u64(g, sp[i].key, &id);
    if (r == SERVD_EINVAL) continue;
    if (r) {
      rc = r;
      goto fail;
    }
    if (id >= tokens->n) {
      rc = servd_fail(SERVD_EFORMAT, "%s: %s = %llu, expected < %llu tokens", what, sp[i].key, (unsigned long long)id,
                      (unsigned long long)tokens->n);
      goto fail;
    }
    json_t *s;
    if ((rc = tok_string(g, tokens, id, &s, what))) goto fail;
    json_object_set(cfg, sp[i].name, s);
    json_object_set_new(t->special, sp[i].name, s);
  }
  bool abos = spm, aeos = false; /* llama.cpp's defaults */
  if ((r = mpk_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &abos)) && r != SERVD_EINVAL) {
    rc = r;
    goto fail;
  }
  if ((r = mpk_gguf_get_bool(g, "tokenizer.ggml.add_eos_token", &aeos)) && r != SERVD_EINVAL) {
    rc = r;
    goto fail;
  }
  json_object_set_new(cfg, "add_bos_token", json_boolean(abos));
  json_object_set_new(cfg, "add_eos_token", json_boolean(aeos));
  const char *tmpl;
  size_t tl;
  r = mpk_gguf_get_str(g, "tokenizer.chat_template", &tmpl, &tl);
  if (r == 0) {
    json_t *ts = jstrn(tmpl, tl);
    if (!ts) {
      rc = servd_fail(SERVD_EFORMAT, "%s: tokenizer.chat_template: expected UTF-8", what);
      goto fail;
    }
    json_object_set_new(cfg, "chat_template", ts);
  } else if (r != SERVD_EINVAL) {
    rc = r;
    goto fail;
  }
  t->tokinfo = json_pack("{s:s,s:s,s:s,s:b,s:b}", "file", "tokenizer.json", "config", "tokenizer_config.json", "pre",
                         pre, "add_bos_token", abos, "add_eos_token", aeos);
  t->json = json_dumps(root, JSON_COMPACT);
  t->cfg = json_dumps(cfg, JSON_INDENT(2));
  if (!t->json || !t->cfg || !t->tokinfo) {
    rc = servd_fail(SERVD_ENOMEM, "%s: out of memory", what);
    goto fail;
  }
fail:
  json_decref(root);
  json_decref(cfg);
  return rc;
}

/* rope_freqs.weight (Llama 3.1/3.2: llama.cpp stores the rope scaling as per-dimension divisors of the
 * inverse frequencies) -> the config's rope_scaling, exactly as Hugging Face writes it, so the tensor
 * is not needed and HF and GGUF imports of one model agree. Refused unless the factors are exactly
 * a Llama 3 scaling: servd would otherwise run with other frequencies than the file's. */
static int rope_scaling_from_freqs(const char *what, const mpk_gguf *g, const char *ga, const mpk_gguf_tensor *t,
                                   const void *data, json_t *config) {
  char key[128];
  const int64_t head_dim = json_integer_value(json_object_get(config, "head_dim"));
  const double theta = json_number_value(json_object_get(config, "rope_theta"));
  if (t->type != MPK_GGML_F32)
    return servd_fail(SERVD_EUNSUPPORTED, "%s: tensor \"%s\": ggml type %s, expected F32 frequency factors", what,
                      t->name, mpk_ggml_type_name(t->type) ? mpk_ggml_type_name(t->type) : "?");
  if (t->ndim != 1 || t->ne[0] * 2 != head_dim)
    return servd_fail(SERVD_EFORMAT, "%s: tensor \"%s\": %lld values in %d dimension(s), expected head_dim/2 = %lld",
                      what, t->name, (long long)(t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3]), t->ndim,
                      (long long)(head_dim / 2));
  /* llama.cpp applies a rope.scaling.factor on top of rope_freqs unless the type is "none". */
  const char *st = "linear";
  size_t sl = 6;
  char q[300];
  double lin = 0.0;
  snprintf(key, sizeof key, "%s.rope.scaling.type", ga);
  int r = mpk_gguf_get_str(g, key, &st, &sl);
  if (r && r != SERVD_EINVAL) return r;
  snprintf(key, sizeof key, "%s.rope.scaling.factor", ga);
  if ((r = mpk_gguf_get_f64(g, key, &lin)) && r != SERVD_EINVAL) return r;
  if (!(sl == 4 && !memcmp(st, "none", 4)) && lin != 0.0 && lin != 1.0)
    return servd_fail(SERVD_EUNSUPPORTED,
                      "%s: tensor \"%s\" with %s.rope.scaling.type \"%s\" factor %g: the two scalings "
                      "combined are not supported",
                      what, t->name, ga, mpk__printable(st, sl, q, sizeof q), lin);
  uint64_t orig = 0;
  snprintf(key, sizeof key, "%s.rope.scaling.original_context_length", ga);
  if ((r = mpk_gguf_get_u64(g, key, &orig)) && r != SERVD_EINVAL) return r;
  if (orig > UINT32_MAX) orig = 0; /* no candidate; the search tries the usual ones */
  float ff[2048];
  if (head_dim / 2 > (int64_t)(sizeof ff / sizeof *ff))
    return servd_fail(SERVD_EUNSUPPORTED, "%s: head_dim %lld: at most %zu supported with rope_freqs", what,
                      (long long)head_dim, 2 * sizeof ff / sizeof *ff);
  memcpy(ff, data, (size_t)t->ne[0] * sizeof(float)); /* the data offset need not be 4-aligned */
  mpk_llama3_rope fit;
  if ((r = mpk__rope_fit_llama3(what, t->name, ff, (int)t->ne[0], theta, (uint32_t)orig, &fit))) return r;
  /* The keys and values of the model's Hugging Face config.json; all factors 1 is plain RoPE. */
  json_t *rs = fit.factor == 1.0 ? json_null()
                                 : json_pack("{s:f,s:f,s:f,s:I,s:s}", "factor", mpk__shortest_f32(fit.factor),
                                             "high_freq_factor", fit.high_freq_factor, "low_freq_factor",
                                             fit.low_freq_factor, "original_max_position_embeddings",
                                             (json_int_t)fit.original_max_positions, "rope_type", "llama3");
  if (!rs || json_object_set_new(config, "rope_scaling", rs))
    return servd_fail(SERVD_ENOMEM, "%s: out of memory", what);
  return 0;
}

int mpk_pack_gguf(const char *gguf_path, const char *out_path, const mpk_import_options *opt) {
  mpk_import_options defaults;
  if (!opt) {
    mpk_import_options_init(&defaults);
    opt = &defaults;
  }
  int rc = 0;
  mpk_map map = {0};
  mpk_gguf *g = NULL;
  mpk_writer *w = NULL;
  json_t *config = NULL;
  tok_out tok = {0};
  char **canon = NULL;
  mpk_shapes shapes = {0};
  const mpk_arch *arch;
  if ((rc = mpk__map_file_fd(gguf_path, &map)) || (rc = mpk_gguf_parse(gguf_path, map.data, map.len, &g))) goto fail;
  const char *as;
  size_t al;
  char ga[64];
  rc = mpk_gguf_get_str(g, "general.architecture", &as, &al);
  if (rc && rc != SERVD_EINVAL) goto fail;
  if ((rc = mpk__arch_for_gguf(gguf_path, rc ? NULL : as, rc ? 0 : al, &arch))) goto fail;
  snprintf(ga, sizeof ga, "%.*s", (int)al, as); /* one of the registry's names: short and plain */
  if ((rc = convert_tokenizer(gguf_path, g, &tok))) goto fail;

  /* Canonical names and shapes (GGUF dimensions are innermost first), checked against the config
   * before the first byte is written. */
  canon = calloc(g->n_tensors + 1, sizeof *canon);
  shapes.e = calloc(g->n_tensors + 1, sizeof *shapes.e);
  if (!canon || !shapes.e) {
    rc = servd_fail(SERVD_ENOMEM, "%s: out of memory", gguf_path);
    goto fail;
  }
  const mpk_gguf_tensor *rope_freqs = NULL;
  bool tied = true;
  for (size_t i = 0; i < g->n_tensors; i++) {
    const mpk_gguf_tensor *t = &g->tensors[i];
    char cn[512];
    mpk__arch_map_name(&arch->gguf_names, t->name, cn, sizeof cn);
    if (!(canon[i] = strdup(cn))) {
      rc = servd_fail(SERVD_ENOMEM, "%s: out of memory", gguf_path);
      goto fail;
    }
    if (!strcmp(t->name, "rope_freqs.weight")) {
      rope_freqs = t;
      continue;
    }
    tied &= strcmp(cn, "lm_head.weight") != 0;
    mpk_shape_entry *e = &shapes.e[shapes.n++];
    e->name = canon[i];
    e->ndim = t->ndim;
    for (int d = 0; d < t->ndim; d++) e->shape[d] = t->ne[t->ndim - 1 - d];
  }
  mpk__shapes_sort(&shapes);
  for (size_t i = 1; i < shapes.n; i++)
    if (!strcmp(shapes.e[i - 1].name, shapes.e[i].name)) {
      rc = servd_fail(SERVD_EFORMAT, "%s: two tensors map to \"%s\"", gguf_path, shapes.e[i].name);
      goto fail;
    }
  uint64_t n_vocab = mpk_gguf_find(g, "tokenizer.ggml.tokens")->n;
  if ((rc = arch->gguf_config(arch, gguf_path, g, ga, tied, n_vocab, &config))) goto fail;
  if (rope_freqs && (rc = rope_scaling_from_freqs(gguf_path, g, ga, rope_freqs,
                                                  (const uint8_t *)map.data + rope_freqs->offset, config)))
    goto fail;
  if ((rc = mpk__arch_config(arch, gguf_path, config)) || (rc = arch->check_tensors(arch, gguf_path, config, &shapes)))
    goto fail;

  if ((rc = mpk_writer_create(out_path, &w))) goto fail;
  char name[256] = "";
  const char *base = strrchr(gguf_path, '/') ? strrchr(gguf_path, '/') + 1 : gguf_path;
  snprintf(name, sizeof name, "%s", base);
  if (strlen(name) > 5 && !strcmp(name + strlen(name) - 5, ".gguf")) name[strlen(name) - 5] = 0;
  if ((rc = mpk__common_fields(w, opt, arch, name))) goto fail;
  if ((rc = mpk_writer_add_file(w, "tokenizer.json", tok.json, strlen(tok.json))) ||
      (rc = mpk_writer_add_file(w, "tokenizer_config.json", tok.cfg, strlen(tok.cfg))))
    goto fail;
  const char *tmpl;
  size_t tl;
  if (mpk_gguf_get_str(g, "tokenizer.chat_template", &tmpl, &tl) == 0) {
    if ((rc = mpk_writer_add_file(w, "chat_template.jinja", tmpl, tl)) ||
        (rc = mpk_writer_set(w, "chat_template_file", json_string("chat_template.jinja"))))
      goto fail;
  }
  if ((rc = mpk_writer_set(w, "tokenizer", tok.tokinfo))) {
    tok.tokinfo = NULL;
    goto fail;
  }
  tok.tokinfo = NULL;
  if ((rc = mpk_writer_set(w, "special_tokens", tok.special))) {
    tok.special = NULL;
    goto fail;
  }
  tok.special = NULL;
  if ((rc = mpk_writer_set(w, "rope_layout", json_string(arch->rope_layout_gguf)))) goto fail;
  if ((rc = mpk_writer_set(w, "config", config))) {
    config = NULL;
    goto fail;
  }
  config = NULL;
  json_t *src = json_pack("{s:s,s:s}", "format", "gguf", "file", base);
  if ((rc = mpk_writer_set(w, "source", src))) goto fail;

  mpk_progress pr = {.o = opt};
  for (size_t i = 0; i < g->n_tensors; i++) pr.total += &g->tensors[i] == rope_freqs ? 0 : g->tensors[i].nbytes;
  for (size_t i = 0; i < g->n_tensors; i++) {
    const mpk_gguf_tensor *t = &g->tensors[i];
    if (t == rope_freqs) continue; /* now the config's rope_scaling */
    const char *hn = canon[i];
    int64_t shape[4];
    for (int d = 0; d < t->ndim; d++) shape[d] = t->ne[t->ndim - 1 - d]; /* innermost first -> row-major */
    const void *data = (const uint8_t *)map.data + t->offset;
    servd_dtype keep; /* every type a dtype keeps byte for byte (servd/dtypes.def), the rest refused */
    if (servd_dtype_from_ggml(t->type, &keep)) {
      char kept[160];
      rc = servd_fail(SERVD_EUNSUPPORTED, "%s: tensor \"%s\": ggml type %s is not supported (expected %s)", gguf_path,
                      t->name, mpk_ggml_type_name(t->type) ? mpk_ggml_type_name(t->type) : "?",
                      servd_dtype_list(kept, sizeof kept, ggml_kept, " ", " "));
      goto fail;
    }
    if ((rc = mpk__check_block_scales(gguf_path, t->name, keep, data, t->nbytes))) goto fail;
    rc = mpk__emit_raw(w, &pr, hn, keep, t->ndim, shape, data, t->nbytes, map.fd, t->offset);
    if (rc) goto fail;
  }
  rc = mpk_writer_finish(w);
fail:
  mpk_writer_destroy(w);
  for (size_t i = 0; canon && i < g->n_tensors; i++) free(canon[i]);
  free(canon);
  free(shapes.e);
  mpk_gguf_free(g);
  mpk__unmap(&map);
  json_decref(config);
  json_decref(tok.special);
  json_decref(tok.tokinfo);
  free(tok.json);
  free(tok.cfg);
  return rc;
}
