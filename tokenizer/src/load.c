/* Reading tokenizer.json into a servd_tokenizer. Every refusal names the JSON field. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer-impl.h"

#define GPT2_PATTERN "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"
#define LLAMA3_PATTERN \
  "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|" \
  "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
/* llama.cpp's Llama 3 split: contractions case-insensitive in ASCII only. */
#define LLAMA3_CPP_PATTERN \
  "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^" \
  "\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"

enum { MAX_VOCAB = 1 << 24 };

static int add_step(servd_tokenizer *t, pre_kind kind, const char *pattern, bool literal, split_behavior b, bool invert,
                    bool prefix_space, const char *field) {
  if (t->n_steps >= (int)(sizeof t->steps / sizeof t->steps[0]))
    return servd_fail(SERVD_EUNSUPPORTED, "tokenizer.json: %s: more than %d pre-tokenizer steps", field,
                      (int)(sizeof t->steps / sizeof t->steps[0]));
  pre_step *st = &t->steps[t->n_steps];
  memset(st, 0, sizeof *st);
  st->kind = kind;
  st->behavior = b;
  st->invert = invert;
  st->add_prefix_space = prefix_space;
  if (pattern) {
    int rc = pre__compile(pattern, strlen(pattern), literal, field, &st->re);
    if (rc) return rc;
  }
  t->n_steps++;
  return 0;
}

static bool json_flag(json_t *o, const char *key, bool dflt) {
  json_t *v = json_object_get(o, key);
  return json_is_boolean(v) ? json_is_true(v) : dflt;
}

/* A "Sequence" node: parses each element of the array o[key] with `parse`, naming it field.key[i]. */
typedef int (*parse_node_fn)(servd_tokenizer *t, json_t *node, const char *field);
static int parse_sequence(servd_tokenizer *t, json_t *o, const char *field, const char *key, parse_node_fn parse) {
  char f[128];
  json_t *arr = json_object_get(o, key);
  if (!json_is_array(arr)) return servd_fail(SERVD_EFORMAT, "tokenizer.json: %s.%s: expected an array", field, key);
  for (size_t i = 0; i < json_array_size(arr); i++) {
    snprintf(f, sizeof f, "%s.%s[%zu]", field, key, i);
    int rc = parse(t, json_array_get(arr, i), f);
    if (rc) return rc;
  }
  return 0;
}

static int parse_pre(servd_tokenizer *t, json_t *pt, const char *field) {
  char f[128];
  if (!json_is_object(pt)) return servd_fail(SERVD_EFORMAT, "tokenizer.json: %s: expected an object", field);
  const char *type = json_string_value(json_object_get(pt, "type"));
  if (!type) return servd_fail(SERVD_EFORMAT, "tokenizer.json: %s.type: expected a string", field);
  if (!strcmp(type, "Sequence")) {
    return parse_sequence(t, pt, field, "pretokenizers", parse_pre);
  }
  if (!strcmp(type, "Metaspace")) return spm__parse_metaspace(t, pt, field);
  if (t->metaspace)
    return servd_fail(SERVD_EUNSUPPORTED, "tokenizer.json: %s: Metaspace must be the only pre-tokenizer", field);
  if (!strcmp(type, "ByteLevel")) {
    bool regex = json_flag(pt, "use_regex", true);
    return add_step(t, PRE_BYTELEVEL, regex ? GPT2_PATTERN : NULL, false, SPLIT_ISOLATED, false,
                    json_flag(pt, "add_prefix_space", true), field);
  }
  if (!strcmp(type, "Digits")) {
    bool individual = json_flag(pt, "individual_digits", false);
    return add_step(t, PRE_SPLIT, individual ? "\\p{N}" : "\\p{N}+", false, SPLIT_ISOLATED, false, false, field);
  }
  if (!strcmp(type, "Split")) {
    json_t *pat = json_object_get(pt, "pattern");
    const char *re = json_string_value(json_object_get(pat, "Regex"));
    const char *lit = json_string_value(json_object_get(pat, "String"));
    if (!re && !lit)
      return servd_fail(SERVD_EUNSUPPORTED,
                        "tokenizer.json: %s.pattern: expected {\"Regex\": ...} or {\"String\": ...}", field);
    const char *beh = json_string_value(json_object_get(pt, "behavior"));
    static const char *names[] = {"Isolated", "Removed", "MergedWithPrevious", "MergedWithNext", "Contiguous"};
    int b = -1;
    for (int i = 0; beh && i < 5; i++)
      if (!strcmp(beh, names[i])) b = i;
    if (b < 0)
      return servd_fail(SERVD_EUNSUPPORTED,
                        "tokenizer.json: %s.behavior: \"%s\" is not one of Isolated, Removed, MergedWithPrevious, "
                        "MergedWithNext, Contiguous",
                        field, beh ? beh : "(missing)");
    snprintf(f, sizeof f, "%s.pattern", field);
    return add_step(t, PRE_SPLIT, re ? re : lit, !re, (split_behavior)b, json_flag(pt, "invert", false), false, f);
  }
  return servd_fail(SERVD_EUNSUPPORTED,
                    "tokenizer.json: %s.type: pre-tokenizer \"%s\" is not supported (ByteLevel, Digits, Split, "
                    "Sequence are)",
                    field, type);
}

/* GGUF tokenizer.ggml.pre names, with llama.cpp's splitting for each. */
static int parse_pre_hint(servd_tokenizer *t, const char *pre, const char *field) {
  if (!strcmp(pre, "smollm")) {
    int rc = add_step(t, PRE_SPLIT, "\\p{N}", false, SPLIT_ISOLATED, false, false, field);
    return rc ? rc : add_step(t, PRE_SPLIT, GPT2_PATTERN, false, SPLIT_ISOLATED, false, false, field);
  }
  if (!strcmp(pre, "gpt2") || !strcmp(pre, "gpt-2"))
    return add_step(t, PRE_SPLIT, GPT2_PATTERN, false, SPLIT_ISOLATED, false, false, field);
  if (!strcmp(pre, "llama3") || !strcmp(pre, "llama-bpe") || !strcmp(pre, "llama-v3"))
    return add_step(t, PRE_SPLIT, LLAMA3_CPP_PATTERN, false, SPLIT_ISOLATED, false, false, field);
  if (!strcmp(pre, "default")) {
    static const char *p[] = {"[\\p{P}\\$\\+<=>\\^~\\|]+",
                              "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)",
                              "\\p{N}+", "[0-9][0-9][0-9]"};
    for (int i = 0; i < 4; i++) {
      int rc = add_step(t, PRE_SPLIT, p[i], false, SPLIT_ISOLATED, false, false, field);
      if (rc) return rc;
    }
    return 0;
  }
  return servd_fail(SERVD_EUNSUPPORTED,
                    "tokenizer.json: %s: pre-tokenizer \"%s\" is not supported (smollm, gpt2, llama3, llama-bpe, "
                    "default are)",
                    field, pre);
}

/* One template (single or pair) of a TemplateProcessing: its specials' ids (each must decode) and
 * where A and B go; a pair template needs both, a single one A only. */
static int parse_template(servd_tokenizer *t, json_t *arr, json_t *specials, bool pair, const char *field,
                          tok_template *out) {
  if (!json_is_array(arr)) return servd_fail(SERVD_EFORMAT, "tokenizer.json: %s: expected an array", field);
  size_t n_ids = 0;
  for (size_t i = 0; i < json_array_size(arr); i++) {
    json_t *ids = json_object_get(
        json_object_get(
            specials,
            json_string_value(json_object_get(json_object_get(json_array_get(arr, i), "SpecialToken"), "id")) ?: ""),
        "ids");
    n_ids += json_array_size(ids);
  }
  out->ids = calloc(n_ids + 1, sizeof *out->ids);
  out->types = calloc(n_ids + 1, sizeof *out->types);
  if (!out->ids || !out->types) return servd_fail(SERVD_ENOMEM, "tokenizer: out of memory");
  out->a_at = out->b_at = -1;
  for (size_t i = 0; i < json_array_size(arr); i++) {
    json_t *it = json_array_get(arr, i), *sq = json_object_get(it, "Sequence"),
           *sp = json_object_get(it, "SpecialToken");
    if (sq) {
      const char *sid = json_string_value(json_object_get(sq, "id"));
      int *at = sid && !strcmp(sid, "A") ? &out->a_at : sid && pair && !strcmp(sid, "B") ? &out->b_at : NULL;
      if (!at || *at >= 0)
        return servd_fail(SERVD_EUNSUPPORTED, "tokenizer.json: %s[%zu]: expected one Sequence \"A\"%s", field, i,
                          pair ? " and one \"B\"" : "");
      *at = out->n;
      json_int_t ty = json_integer_value(json_object_get(sq, "type_id"));
      *(at == &out->a_at ? &out->a_type : &out->b_type) = (int32_t)(ty >= 0 && ty < 16 ? ty : 0);
      continue;
    }
    const char *name = json_string_value(json_object_get(sp, "id"));
    json_t *ids = json_object_get(json_object_get(specials, name ? name : ""), "ids");
    if (!name || !json_is_array(ids))
      return servd_fail(SERVD_EFORMAT, "tokenizer.json: %s[%zu]: special token without ids in special_tokens", field,
                        i);
    json_int_t ty = json_integer_value(json_object_get(sp, "type_id"));
    for (size_t k = 0; k < json_array_size(ids); k++) {
      json_int_t id = json_integer_value(json_array_get(ids, k));
      /* every id it adds must decode: one in the vocabulary or the added tokens */
      if (!json_is_integer(json_array_get(ids, k)) || id < 0 || id >= t->n_ids || !t->has_piece[id])
        return servd_fail(SERVD_EFORMAT,
                          "tokenizer.json: post_processor.special_tokens[\"%s\"].ids[%zu]: id out of range or "
                          "without a token",
                          name, k);
      out->types[out->n] = (int32_t)(ty >= 0 && ty < 16 ? ty : 0);
      out->ids[out->n++] = (int32_t)id;
    }
  }
  if (out->a_at < 0 || (pair && out->b_at < 0))
    return servd_fail(SERVD_EUNSUPPORTED, "tokenizer.json: %s: expected one Sequence \"A\"%s", field,
                      pair ? " and one \"B\"" : "");
  return 0;
}

/* The single template's ids around the text, as encode adds them. */
static int template_affixes(servd_tokenizer *t) {
  const tok_template *s = &t->single;
  t->prefix_ids = calloc((size_t)s->n + 1, sizeof(int32_t));
  t->suffix_ids = calloc((size_t)s->n + 1, sizeof(int32_t));
  if (!t->prefix_ids || !t->suffix_ids) return servd_fail(SERVD_ENOMEM, "tokenizer: out of memory");
  t->n_prefix = s->a_at;
  t->n_suffix = s->n - s->a_at;
  memcpy(t->prefix_ids, s->ids, (size_t)t->n_prefix * sizeof(int32_t));
  memcpy(t->suffix_ids, s->ids + s->a_at, (size_t)t->n_suffix * sizeof(int32_t));
  return 0;
}

/* BertProcessing {"cls": [content, id], "sep": [content, id]}: [CLS] A [SEP] and [CLS] A [SEP] B [SEP],
 * B and its [SEP] of type 1. */
static int parse_bert_processing(servd_tokenizer *t, json_t *pp, const char *field) {
  json_int_t id[2];
  static const char *keys[2] = {"cls", "sep"};
  for (int k = 0; k < 2; k++) {
    json_t *v = json_array_get(json_object_get(pp, keys[k]), 1);
    id[k] = json_integer_value(v);
    if (!json_is_integer(v) || id[k] < 0 || id[k] >= t->n_ids || !t->has_piece[id[k]])
      return servd_fail(SERVD_EFORMAT, "tokenizer.json: %s.%s: expected [content, id] with an id of the vocabulary",
                        field, keys[k]);
  }
  tok_template *s = &t->single, *p = &t->pair;
  s->ids = calloc(2, sizeof(int32_t)), s->types = calloc(2, sizeof(int32_t));
  p->ids = calloc(3, sizeof(int32_t)), p->types = calloc(3, sizeof(int32_t));
  if (!s->ids || !s->types || !p->ids || !p->types) return servd_fail(SERVD_ENOMEM, "tokenizer: out of memory");
  s->ids[0] = p->ids[0] = (int32_t)id[0];
  s->ids[1] = p->ids[1] = p->ids[2] = (int32_t)id[1];
  p->types[2] = 1;
  s->n = 2, s->a_at = 1, s->b_at = -1;
  p->n = 3, p->a_at = 1, p->b_at = 2, p->b_type = 1;
  t->has_pair = true;
  return template_affixes(t);
}

static int parse_post(servd_tokenizer *t, json_t *pp, const char *field) {
  if (json_is_null(pp) || !pp) return 0;
  const char *type = json_string_value(json_object_get(pp, "type"));
  if (!type) return servd_fail(SERVD_EFORMAT, "tokenizer.json: %s.type: expected a string", field);
  if (!strcmp(type, "ByteLevel")) return 0; /* offsets only */
  if (!strcmp(type, "Sequence")) {
    return parse_sequence(t, pp, field, "processors", parse_post);
  }
  bool bert = !strcmp(type, "BertProcessing");
  if (strcmp(type, "TemplateProcessing") && !bert)
    return servd_fail(SERVD_EUNSUPPORTED,
                      "tokenizer.json: %s.type: post-processor \"%s\" is not supported (ByteLevel, "
                      "TemplateProcessing, BertProcessing, Sequence are)",
                      field, type);
  if (t->single.ids)
    return servd_fail(SERVD_EUNSUPPORTED, "tokenizer.json: %s: more than one TemplateProcessing", field);
  if (bert) return parse_bert_processing(t, pp, field);
  json_t *specials = json_object_get(pp, "special_tokens");
  char f[160];
  snprintf(f, sizeof f, "%s.single", field);
  int rc = parse_template(t, json_object_get(pp, "single"), specials, false, f, &t->single);
  if (rc) return rc;
  json_t *pair = json_object_get(pp, "pair");
  if (pair && !json_is_null(pair) && json_array_size(pair)) { /* [] : no pair template */
    snprintf(f, sizeof f, "%s.pair", field);
    if ((rc = parse_template(t, pair, specials, true, f, &t->pair))) return rc;
    t->has_pair = true;
  }
  return template_affixes(t);
}

/* Hugging Face's ByteLevel decoder: a token whose every character is in the byte alphabet stands for
 * those bytes; any other token (an added token such as "<|im_end|>" with a character outside it)
 * for its own UTF-8. tmp receives the bytes. */
static int token_bytes(const char *s, size_t n, tok_buf *tmp, bool *mapped) {
  tmp->len = 0;
  int rc = tok_buf_reserve(tmp, n + 1);
  if (rc) return rc;
  *mapped = true;
  for (size_t i = 0; i < n;) {
    uint32_t cp;
    int l = utf8__decode((const uint8_t *)s + i, n - i, &cp);
    if (!l || cp >= 324 || bytelevel__cp_to_byte[cp] < 0) {
      *mapped = false;
      break;
    }
    tmp->p[tmp->len++] = (char)bytelevel__cp_to_byte[cp];
    i += (size_t)l;
  }
  if (!*mapped) {
    memcpy(tmp->p, s, n);
    tmp->len = n;
  }
  return 0;
}

static int cmp_added(const void *a, const void *b) {
  const added_token *x = a, *y = b;
  uint8_t fx = (uint8_t)x->match[0], fy = (uint8_t)y->match[0];
  if (fx != fy) return fx < fy ? -1 : 1;
  if (x->match_len != y->match_len) return x->match_len > y->match_len ? -1 : 1; /* longest first */
  return x->id < y->id ? -1 : x->id > y->id;
}

int servd_tokenizer_load(const char *json, size_t len, servd_tokenizer **out) {
  int rc = 0;
  json_error_t jerr;
  servd_tokenizer *t = NULL;
  const char **vocab_str = NULL; /* borrowed from root */
  uint32_t *vocab_len = NULL;
  uint8_t *norm_added = NULL; /* added tokens whose content the normalizer also rewrites for decoding */
  tok_buf ntmp = {0};
  tok_buf tmp = {0};
  bytelevel__init();
  *out = NULL;
  json_t *root = json_loadb(json, len, 0, &jerr);
  if (!root) {
    rc = servd_fail(SERVD_EFORMAT, "tokenizer.json: not valid JSON at line %d column %d: %s", jerr.line, jerr.column,
                    jerr.text);
    goto fail;
  }
  t = calloc(1, sizeof *t);
  if (!t) {
    rc = servd_fail(SERVD_ENOMEM, "tokenizer: out of memory");
    goto fail;
  }
  word_cache_init(&t->cache);

  json_t *model = json_object_get(root, "model");
  if (!json_is_object(model)) {
    rc = servd_fail(SERVD_EFORMAT, "tokenizer.json: model: expected an object");
    goto fail;
  }
  const char *mtype = json_string_value(json_object_get(model, "type"));
  bool wordpiece = mtype && !strcmp(mtype, "WordPiece");
  if (mtype && strcmp(mtype, "BPE") && !wordpiece) {
    rc = servd_fail(SERVD_EUNSUPPORTED, "tokenizer.json: model.type: \"%s\" is not supported (BPE, WordPiece are)",
                    mtype);
    goto fail;
  }
  t->byte_fallback = json_flag(model, "byte_fallback", false);
  t->fuse_unk = json_flag(model, "fuse_unk", false);
  t->unk_id = -1;
  json_t *dropout = json_object_get(model, "dropout");
  if (json_is_number(dropout) && json_number_value(dropout) > 0) {
    rc = servd_fail(SERVD_EUNSUPPORTED, "tokenizer.json: model.dropout: BPE dropout is not supported");
    goto fail;
  }
  static const char *affix[] = {"continuing_subword_prefix", "end_of_word_suffix"};
  for (int i = wordpiece ? 2 : 0; i < 2; i++) { /* WordPiece's prefix is its own (wp__parse) */
    const char *v = json_string_value(json_object_get(model, affix[i]));
    if (v && *v) {
      rc = servd_fail(SERVD_EUNSUPPORTED, "tokenizer.json: model.%s: \"%s\" is not supported", affix[i], v);
      goto fail;
    }
  }
  t->ignore_merges = json_flag(model, "ignore_merges", false);
  json_t *vocab = json_object_get(model, "vocab");
  json_t *merges = json_object_get(model, "merges");
  json_t *added = json_object_get(root, "added_tokens");
  if (!json_is_object(vocab) || (!json_is_array(merges) && !wordpiece)) {
    rc = servd_fail(SERVD_EFORMAT, "tokenizer.json: model.vocab and model.merges: expected an object and an array");
    goto fail;
  }
  if (added && !json_is_array(added) && !json_is_null(added)) {
    rc = servd_fail(SERVD_EFORMAT, "tokenizer.json: added_tokens: expected an array");
    goto fail;
  }

  /* ids */
  int32_t max_id = -1;
  const char *key;
  json_t *val;
  json_object_foreach(vocab, key, val) {
    json_int_t id = json_integer_value(val);
    if (!json_is_integer(val) || id < 0 || id >= MAX_VOCAB) {
      rc = servd_fail(SERVD_EFORMAT, "tokenizer.json: model.vocab[\"%.64s\"]: expected an id in [0, %d)", key,
                      MAX_VOCAB);
      goto fail;
    }
    if (id > max_id) max_id = (int32_t)id;
  }
  for (size_t i = 0; i < json_array_size(added); i++) {
    json_t *a = json_array_get(added, i), *id = json_object_get(a, "id");
    const char *content = json_string_value(json_object_get(a, "content"));
    if (!json_is_integer(id) || json_integer_value(id) < 0 || json_integer_value(id) >= MAX_VOCAB || !content ||
        !*content) {
      rc = servd_fail(SERVD_EFORMAT,
                      "tokenizer.json: added_tokens[%zu]: expected an id in [0, %d) and a non-empty content", i,
                      MAX_VOCAB);
      goto fail;
    }
    if (json_integer_value(id) > max_id) max_id = (int32_t)json_integer_value(id);
  }
  /* ids are dense in every real tokenizer; refusing sparse ones bounds the tables by the file */
  size_t n_entries = json_object_size(vocab) + json_array_size(added);
  if ((size_t)max_id + 1 > 2 * n_entries + 1024) {
    rc = servd_fail(SERVD_EFORMAT, "tokenizer.json: model.vocab/added_tokens: largest id %d for only %zu tokens",
                    max_id, n_entries);
    goto fail;
  }
  t->n_ids = max_id + 1;
  vocab_str = calloc((size_t)t->n_ids + 1, sizeof *vocab_str);
  vocab_len = calloc((size_t)t->n_ids + 1, sizeof *vocab_len);
  norm_added = calloc((size_t)t->n_ids + 1, 1);
  t->has_piece = calloc((size_t)t->n_ids + 1, 1);
  t->is_special = calloc((size_t)t->n_ids + 1, 1);
  t->is_added = calloc((size_t)t->n_ids + 1, 1);
  t->piece_off = calloc((size_t)t->n_ids + 1, sizeof *t->piece_off);
  t->in_vocab = calloc((size_t)t->n_ids + 1, 1);
  t->is_bytetok = calloc((size_t)t->n_ids + 1, 1);
  if (!vocab_str || !vocab_len || !norm_added || !t->has_piece || !t->is_special || !t->is_added || !t->piece_off ||
      !t->in_vocab || !t->is_bytetok) {
    rc = servd_fail(SERVD_ENOMEM, "tokenizer: out of memory for %d ids", t->n_ids);
    goto fail;
  }
  if ((rc = str_map_init(&t->content_ids, json_object_size(vocab) + json_array_size(added)))) goto fail;
  if (t->ignore_merges && (rc = str_map_init(&t->bytes_ids, json_object_size(vocab)))) goto fail;
  json_object_foreach(vocab, key, val) {
    int32_t id = (int32_t)json_integer_value(val);
    size_t klen = strlen(key);
    vocab_str[id] = key;
    vocab_len[id] = (uint32_t)klen;
    t->in_vocab[id] = 1;
    if ((rc = str_map_put(&t->content_ids, key, klen, id))) goto fail;
  }

  /* normalizer, pre-tokenizer and decoder decide between byte-level and character-level symbols */
  if (wordpiece) {
    if ((rc = wp__parse(t, root, model))) goto fail;
  } else if ((rc = spm__parse_normalizer(t, json_object_get(root, "normalizer"), "normalizer"))) {
    goto fail;
  }
  const char *hint = json_string_value(json_object_get(root, "pre"));
  const char *hint_field = "pre";
  if (!hint) {
    hint = json_string_value(json_object_get(model, "pre"));
    hint_field = "model.pre";
  }
  json_t *pt = json_object_get(root, "pre_tokenizer");
  bool bytelevel_pre = hint != NULL;
  /* pre-tokenizer: a GGUF pre name wins, as llama.cpp would use it for that file */
  if (wordpiece) {
    bytelevel_pre = false; /* wp__parse took pre_tokenizer and decoder */
  } else if (hint) {
    rc = parse_pre_hint(t, hint, hint_field);
  } else if (pt && !json_is_null(pt)) {
    rc = parse_pre(t, pt, "pre_tokenizer");
  }
  if (rc) goto fail;
  for (int i = 0; i < t->n_steps; i++) bytelevel_pre |= t->steps[i].kind == PRE_BYTELEVEL;
  if (!wordpiece && (rc = spm__parse_decoder(t, json_object_get(root, "decoder"), "decoder"))) goto fail;
  t->char_level = t->byte_fallback || t->n_norm || t->metaspace || t->dec_charlevel;
  if (t->char_level && (bytelevel_pre || t->dec_bytelevel)) {
    rc = servd_fail(SERVD_EUNSUPPORTED,
                    "tokenizer.json: pre_tokenizer/decoder: ByteLevel cannot be combined with byte_fallback, a "
                    "normalizer, Metaspace or character-level decoders");
    goto fail;
  }
  if (t->char_level) {
    const char *unk = json_string_value(json_object_get(model, "unk_token"));
    if (unk) t->unk_id = str_map_get(&t->content_ids, unk, strlen(unk));
  }

  /* single bytes: GPT-2's byte characters, or the <0xXX> tokens of byte_fallback */
  for (int b = 0; b < 256; b++) {
    char u[8];
    int l = t->char_level ? snprintf(u, sizeof u, "<0x%02X>", b) : utf8__encode(bytelevel__byte_to_cp[b], u);
    t->byte_id[b] = (t->char_level && !t->byte_fallback) || wordpiece ? -1 : str_map_get(&t->content_ids, u, (size_t)l);
  }

  /* merges (looked up in the model's vocabulary, before added tokens enter the map) */
  if ((rc = merge_map_init(&t->merges, json_array_size(merges)))) goto fail;
  for (size_t i = 0; i < json_array_size(merges); i++) {
    json_t *m = json_array_get(merges, i);
    const char *a = NULL, *b = NULL;
    size_t la = 0, lb = 0;
    if (json_is_string(m)) {
      a = json_string_value(m);
      const char *sp = strchr(a, ' ');
      if (sp && !strchr(sp + 1, ' ')) {
        la = (size_t)(sp - a);
        b = sp + 1;
        lb = strlen(b);
      }
    } else if (json_is_array(m) && json_array_size(m) == 2 && json_is_string(json_array_get(m, 0)) &&
               json_is_string(json_array_get(m, 1))) {
      a = json_string_value(json_array_get(m, 0));
      b = json_string_value(json_array_get(m, 1));
      la = strlen(a);
      lb = strlen(b);
    }
    if (!a || !b) {
      rc = servd_fail(SERVD_EFORMAT, "tokenizer.json: model.merges[%zu]: expected \"a b\" or [\"a\", \"b\"]", i);
      goto fail;
    }
    int32_t ia = str_map_get(&t->content_ids, a, la), ib = str_map_get(&t->content_ids, b, lb);
    tmp.len = 0;
    if ((rc = tok_buf_append(&tmp, a, la)) || (rc = tok_buf_append(&tmp, b, lb))) goto fail;
    int32_t inew = str_map_get(&t->content_ids, tmp.p, tmp.len);
    if (ia < 0 || ib < 0 || inew < 0) {
      rc = servd_fail(SERVD_EFORMAT,
                      "tokenizer.json: model.merges[%zu]: \"%.*s\" + \"%.*s\" (or their join) is not in model.vocab", i,
                      (int)(la > 64 ? 64 : la), a, (int)(lb > 64 ? 64 : lb), b);
      goto fail;
    }
    if ((rc = merge_map_put(&t->merges, ia, ib, (int32_t)i, inew))) goto fail;
  }

  /* added tokens */
  t->n_added = (int)json_array_size(added);
  t->added = calloc((size_t)t->n_added + 1, sizeof *t->added);
  if (!t->added) {
    rc = servd_fail(SERVD_ENOMEM, "tokenizer: out of memory");
    goto fail;
  }
  for (int i = 0; i < t->n_added; i++) {
    json_t *a = json_array_get(added, (size_t)i);
    added_token *at = &t->added[i];
    const char *content = json_string_value(json_object_get(a, "content"));
    at->len = strlen(content);
    at->content = strdup(content);
    if (!at->content) {
      rc = servd_fail(SERVD_ENOMEM, "tokenizer: out of memory");
      goto fail;
    }
    at->id = (int32_t)json_integer_value(json_object_get(a, "id"));
    at->special = json_flag(a, "special", false);
    at->lstrip = json_flag(a, "lstrip", false);
    at->rstrip = json_flag(a, "rstrip", false);
    at->single_word = json_flag(a, "single_word", false);
    at->normalized = json_flag(a, "normalized", !at->special);
    ntmp.len = 0;
    if (at->normalized && (t->n_norm || t->wp.norm.on))
      rc = tok__normalize(t, (const uint8_t *)at->content, at->len, &ntmp);
    else rc = tok_buf_append(&ntmp, at->content, at->len);
    if (rc) goto fail;
    at->match_len = ntmp.len;
    at->match = strndup(ntmp.p, ntmp.len);
    if (!at->match) {
      rc = servd_fail(SERVD_ENOMEM, "tokenizer: out of memory");
      goto fail;
    }
    vocab_str[at->id] = at->content;
    vocab_len[at->id] = (uint32_t)at->len;
    norm_added[at->id] = at->normalized;
    t->is_added[at->id] = 1;
    t->is_special[at->id] = at->special;
    if ((rc = str_map_put(&t->content_ids, at->content, at->len, at->id))) goto fail;
  }
  qsort(t->added, (size_t)t->n_added, sizeof *t->added, cmp_added);
  for (int i = 0; i < t->n_added; i++)
    if (t->added[i].single_word && !t->word_re) {
      /* Hugging Face tests the neighbours of a single_word token with Rust regex's Unicode \w */
      static const char w[] = "[\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\x{200C}\\x{200D}]";
      if ((rc = pre__compile(w, sizeof w - 1, false, "added_tokens single_word", &t->word_re))) goto fail;
    }
  for (int i = 0; i < t->n_added; i++) t->added_first[(uint8_t)t->added[i].match[0]] = 1;

  if (wordpiece && !(t->wp.is_cont = calloc((size_t)t->n_ids + 1, 1))) {
    rc = servd_fail(SERVD_ENOMEM, "tokenizer: out of memory");
    goto fail;
  }
  /* id -> bytes, and bytes -> id for ignore_merges */
  for (int32_t id = 0; id < t->n_ids; id++) {
    t->piece_off[id] = (uint32_t)t->pieces.len;
    if (!vocab_str[id]) continue;
    bool mapped = false, is_byte = false;
    if (wordpiece) {
      t->wp.is_cont[id] = t->in_vocab[id] && !t->is_added[id] && vocab_len[id] > t->wp.prefix_len &&
                          !memcmp(vocab_str[id], t->wp.prefix, t->wp.prefix_len);
      rc = wp__token_bytes(t, vocab_str[id], vocab_len[id], t->in_vocab[id] && !t->is_added[id], &tmp);
      if (t->in_vocab[id] && vocab_len[id] + t->wp.prefix_len > t->wp.longest)
        t->wp.longest = vocab_len[id] + t->wp.prefix_len;
    } else if (t->char_level && norm_added[id] && t->n_norm) {
      /* Hugging Face decodes a normalized added token from its normalized content ("hi" -> "▁hi") */
      ntmp.len = 0;
      if (!(rc = spm__normalize(t, (const uint8_t *)vocab_str[id], vocab_len[id], &ntmp)))
        rc = spm__token_bytes(t, ntmp.p, ntmp.len, &tmp, &is_byte);
    } else if (t->char_level) {
      rc = spm__token_bytes(t, vocab_str[id], vocab_len[id], &tmp, &is_byte);
    } else {
      rc = token_bytes(vocab_str[id], vocab_len[id], &tmp, &mapped);
    }
    if (rc) goto fail;
    t->is_bytetok[id] = is_byte;
    if ((rc = tok_buf_append(&t->pieces, tmp.p, tmp.len))) goto fail;
    if (t->pieces.len > UINT32_MAX / 2) {
      rc = servd_fail(SERVD_ERANGE, "tokenizer.json: model.vocab: tokens too long in total");
      goto fail;
    }
    t->has_piece[id] = 1;
    if (t->ignore_merges && mapped && !t->is_added[id] && (rc = str_map_put(&t->bytes_ids, tmp.p, tmp.len, id)))
      goto fail;
  }
  t->piece_off[t->n_ids] = (uint32_t)t->pieces.len;

  if (wordpiece && (rc = wp__resolve_vocab(t, model))) goto fail;
  if ((rc = parse_post(t, json_object_get(root, "post_processor"), "post_processor"))) goto fail;
  *out = t;
  t = NULL; /* the caller's now: only the scratch is freed below */
fail:
  free(vocab_str);
  free(vocab_len);
  free(norm_added);
  free(ntmp.p);
  free(tmp.p);
  json_decref(root);
  servd_tokenizer_free(t);
  return rc;
}

int servd_tokenizer_load_file(const char *path, servd_tokenizer **out) {
  *out = NULL;
  FILE *fp = fopen(path, "rb");
  if (!fp) return servd_fail(SERVD_EIO, "tokenizer: cannot open %s", path);
  char *buf = NULL;
  size_t len = 0, cap = 0;
  int rc = 0;
  for (;;) {
    if (len == cap) {
      cap = cap ? cap * 2 : 1 << 20;
      char *n = realloc(buf, cap);
      if (!n) {
        rc = servd_fail(SERVD_ENOMEM, "tokenizer: out of memory reading %s", path);
        goto done;
      }
      buf = n;
    }
    size_t r = fread(buf + len, 1, cap - len, fp);
    len += r;
    if (r == 0) break;
  }
  if (ferror(fp)) {
    rc = servd_fail(SERVD_EIO, "tokenizer: cannot read %s", path);
    goto done;
  }
  rc = servd_tokenizer_load(buf, len, out);
done:
  free(buf);
  fclose(fp);
  return rc;
}

void servd_tokenizer_free(servd_tokenizer *t) {
  if (!t) return;
  free(t->piece_off);
  free(t->has_piece);
  free(t->is_special);
  free(t->is_added);
  free(t->pieces.p);
  str_map_free(&t->content_ids);
  str_map_free(&t->bytes_ids);
  merge_map_free(&t->merges);
  for (int i = 0; i < t->n_added; i++) free(t->added[i].content), free(t->added[i].match);
  free(t->added);
  for (int i = 0; i < t->n_steps; i++) pcre2_code_free(t->steps[i].re);
  pcre2_code_free(t->word_re);
  free(t->prefix_ids);
  free(t->suffix_ids);
  free(t->single.ids);
  free(t->single.types);
  free(t->pair.ids);
  free(t->pair.types);
  free(t->wp.is_cont);
  free(t->in_vocab);
  free(t->is_bytetok);
  for (int i = 0; i < t->n_norm; i++) free(t->norm[i].from), free(t->norm[i].to);
  for (int i = 0; i < t->n_dec_repl; i++) free(t->dec_repl[i].from), free(t->dec_repl[i].to);
  word_cache_free(&t->cache);
  free(t);
}
