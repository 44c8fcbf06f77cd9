/* GGUF tokenizer.ggml.model "llama" (SentencePiece BPE with byte fallback: Llama 2, TinyLlama,
 * Mistral 7B v0.1) -> the tokenizer.json that transformers' LlamaConverter writes for the same
 * model: the vocabulary with token ids, merges derived from the scores, the Prepend + Replace
 * normalizer ("legacy" behaviour, as llama.cpp and sentencepiece encode), the byte-fallback decoder,
 * and a template adding BOS/EOS as tokenizer.ggml.add_bos_token/add_eos_token say.
 *
 * Merges, as transformers' generate_merges: every way of splitting a vocabulary piece into two
 * vocabulary pieces, ordered by the piece's score (highest first), then the longer left part, then
 * the longer right part, then the piece's id, then the parts' ids. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "import-impl.h"
#include "mpk-impl.h"
#include "mpk/gguf.h"

int mpk__gguf_spm_json(const char *what, const mpk_gguf *g, const mpk_gguf_kv *tokens, const mpk_gguf_kv *types,
                       json_t **out);

enum { TT_NORMAL = 1, TT_UNKNOWN = 2, TT_CONTROL = 3, TT_USER = 4, TT_UNUSED = 5, TT_BYTE = 6 };

typedef struct spm_merge {
  double score;
  uint32_t piece, left, right; /* token ids */
  uint32_t left_chars, right_chars;
} spm_merge;

static int cmp_merge(const void *a, const void *b) {
  const spm_merge *x = a, *y = b;
  if (x->score != y->score) return x->score > y->score ? -1 : 1;
  if (x->left_chars != y->left_chars) return x->left_chars > y->left_chars ? -1 : 1;
  if (x->right_chars != y->right_chars) return x->right_chars > y->right_chars ? -1 : 1;
  if (x->piece != y->piece) return x->piece < y->piece ? -1 : 1;
  if (x->left != y->left) return x->left < y->left ? -1 : 1;
  return x->right < y->right ? -1 : x->right > y->right;
}

static size_t utf8_chars(const char *s, size_t n) {
  size_t c = 0;
  for (size_t i = 0; i < n; i++) c += ((unsigned char)s[i] & 0xC0) != 0x80;
  return c;
}

static int special_id(const char *what, const mpk_gguf *g, const char *key, uint64_t n_tokens, int64_t *id) {
  uint64_t v;
  int r = mpk_gguf_get_u64(g, key, &v);
  *id = -1;
  if (r == SERVD_EINVAL) return 0;
  if (r) return r;
  if (v >= n_tokens)
    return servd_fail(SERVD_EFORMAT, "%s: %s = %llu, expected < %llu tokens", what, key, (unsigned long long)v,
                      (unsigned long long)n_tokens);
  *id = (int64_t)v;
  return 0;
}

/* *out: the tokenizer.json object (owned by the caller). */
int mpk__gguf_spm_json(const char *what, const mpk_gguf *g, const mpk_gguf_kv *tokens, const mpk_gguf_kv *types,
                       json_t **out) {
  int rc = 0;
  const uint64_t n = tokens->n;
  json_t *vocab = json_object(), *merges = json_array(), *added = json_array(), *root = NULL;
  spm_merge *m = NULL;
  size_t nm = 0, cap = 0;
  const mpk_gguf_kv *scores = mpk_gguf_find(g, "tokenizer.ggml.scores");
  *out = NULL;
  if (!vocab || !merges || !added) {
    rc = servd_fail(SERVD_ENOMEM, "%s: out of memory", what);
    goto fail;
  }
  if (!scores || scores->type != MPK_GGUF_ARRAY || scores->n != n ||
      (scores->arr_type != MPK_GGUF_FLOAT32 && scores->arr_type != MPK_GGUF_FLOAT64)) {
    rc = servd_fail(SERVD_EFORMAT,
                    "%s: tokenizer.ggml.scores: expected a float array as long as the tokens (%llu), required for "
                    "tokenizer.ggml.model \"llama\"",
                    what, (unsigned long long)n);
    goto fail;
  }
  if (n > (1u << 24)) {
    rc = servd_fail(SERVD_EFORMAT, "%s: tokenizer.ggml.tokens: %llu tokens, expected at most 2^24", what,
                    (unsigned long long)n);
    goto fail;
  }
  /* vocab: the last id of a repeated piece wins, as in a Python dict built in id order */
  for (uint64_t i = 0; i < n; i++) {
    const char *s;
    size_t l;
    mpk_gguf_arr_str(g, tokens, i, &s, &l);
    json_t *k = json_stringn(s, l);
    if (!k || strlen(json_string_value(k)) != l) {
      json_decref(k);
      rc = servd_fail(SERVD_EFORMAT, "%s: tokenizer.ggml.tokens[%llu]: expected UTF-8 without NUL", what,
                      (unsigned long long)i);
      goto fail;
    }
    json_object_set_new(vocab, json_string_value(k), json_integer((json_int_t)i));
    int64_t ty = types ? mpk_gguf_arr_int(types, i) : TT_NORMAL;
    /* unknown and control tokens are special added tokens, user-defined ones plain added tokens,
     * all matched in the text before normalization (as llama.cpp and transformers do) */
    if (ty == TT_UNKNOWN || ty == TT_CONTROL || ty == TT_USER)
      json_array_append_new(added,
                            json_pack("{s:I,s:o,s:b,s:b,s:b,s:b,s:b}", "id", (json_int_t)i, "content", k, "single_word",
                                      0, "lstrip", 0, "rstrip", 0, "normalized", 0, "special", ty != TT_USER));
    else json_decref(k);
  }
  /* each piece once (at the id the vocabulary keeps), split in every way into two vocabulary pieces */
  for (uint64_t i = 0; i < n; i++) {
    const char *s;
    size_t l;
    mpk_gguf_arr_str(g, tokens, i, &s, &l);
    json_t *id = json_object_getn(vocab, s, l);
    if ((uint64_t)json_integer_value(id) != i) continue; /* a repeat: one entry per piece */
    double score = mpk_gguf_arr_f64(scores, i);
    for (size_t k = 1; k < l; k++) {
      if (((unsigned char)s[k] & 0xC0) == 0x80) continue; /* split between characters only */
      json_t *a = json_object_getn(vocab, s, k), *b = json_object_getn(vocab, s + k, l - k);
      if (!a || !b) continue;
      if (nm == cap) {
        cap = cap ? cap * 2 : 1024;
        spm_merge *nmv = realloc(m, cap * sizeof *m);
        if (!nmv) {
          rc = servd_fail(SERVD_ENOMEM, "%s: out of memory for %zu merges", what, cap);
          goto fail;
        }
        m = nmv;
      }
      m[nm++] = (spm_merge){score,
                            (uint32_t)i,
                            (uint32_t)json_integer_value(a),
                            (uint32_t)json_integer_value(b),
                            (uint32_t)utf8_chars(s, k),
                            (uint32_t)utf8_chars(s + k, l - k)};
    }
  }
  qsort(m, nm, sizeof *m, cmp_merge);
  for (size_t i = 0; i < nm; i++) {
    const char *a, *b;
    size_t la, lb;
    mpk_gguf_arr_str(g, tokens, m[i].left, &a, &la);
    mpk_gguf_arr_str(g, tokens, m[i].right, &b, &lb);
    if (json_array_append_new(merges, json_pack("[s%,s%]", a, la, b, lb))) {
      rc = servd_fail(SERVD_ENOMEM, "%s: out of memory", what);
      goto fail;
    }
  }

  /* BOS/EOS as llama.cpp adds them: add_bos_token defaults to true for this tokenizer model */
  int64_t bos, eos, unk;
  bool abos = true, aeos = false;
  int r;
  if ((rc = special_id(what, g, "tokenizer.ggml.bos_token_id", n, &bos)) ||
      (rc = special_id(what, g, "tokenizer.ggml.eos_token_id", n, &eos)) ||
      (rc = special_id(what, g, "tokenizer.ggml.unknown_token_id", n, &unk)))
    goto fail;
  if ((r = mpk_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &abos)) && r != SERVD_EINVAL) {
    rc = r;
    goto fail;
  }
  if ((r = mpk_gguf_get_bool(g, "tokenizer.ggml.add_eos_token", &aeos)) && r != SERVD_EINVAL) {
    rc = r;
    goto fail;
  }
  /* sentencepiece's add_dummy_prefix: the "▁" before the text, and the space decoding drops again */
  bool prefix = true;
  if ((r = mpk_gguf_get_bool(g, "tokenizer.ggml.add_space_prefix", &prefix)) && r != SERVD_EINVAL) {
    rc = r;
    goto fail;
  }
  json_t *post = json_null();
  if ((abos && bos >= 0) || (aeos && eos >= 0)) {
    json_t *single = json_array(), *pair = json_array(), *sp = json_object();
    post = json_pack("{s:s,s:o,s:o,s:o}", "type", "TemplateProcessing", "single", single, "pair", pair,
                     "special_tokens", sp);
    /* single: [BOS] $A [EOS]; pair: [BOS] $A [EOS] [BOS] $B [EOS] (type 1), as LlamaTokenizerFast */
    for (int seq = 0; seq < 2; seq++) {
      for (int part = 0; part < 3; part++) {
        int64_t id = part == 0 ? (abos ? bos : -1) : part == 2 ? (aeos ? eos : -1) : -1;
        if (part == 1) {
          json_t *e = json_pack("{s:{s:s,s:i}}", "Sequence", "id", seq ? "B" : "A", "type_id", seq);
          if (seq == 0) json_array_append(single, e);
          json_array_append_new(pair, e);
          continue;
        }
        if (id < 0) continue;
        const char *s;
        size_t l;
        mpk_gguf_arr_str(g, tokens, (uint64_t)id, &s, &l);
        json_t *name = json_stringn(s, l);
        if (!name) {
          rc = servd_fail(SERVD_EFORMAT, "%s: tokenizer.ggml.tokens[%lld]: expected UTF-8", what, (long long)id);
          json_decref(post);
          goto fail;
        }
        json_t *e = json_pack("{s:{s:O,s:i}}", "SpecialToken", "id", name, "type_id", seq);
        if (seq == 0) json_array_append(single, e);
        json_array_append_new(pair, e);
        json_object_set_new(sp, json_string_value(name),
                            json_pack("{s:O,s:[I],s:[O]}", "id", name, "ids", (json_int_t)id, "tokens", name));
        json_decref(name);
      }
    }
  }
  json_t *unk_tok = json_null();
  if (unk >= 0) {
    const char *s;
    size_t l;
    mpk_gguf_arr_str(g, tokens, (uint64_t)unk, &s, &l);
    unk_tok = json_stringn(s, l);
    if (!unk_tok) unk_tok = json_null();
  }
  json_t *norms =
      json_pack("[{s:s,s:{s:s},s:s}]", "type", "Replace", "pattern", "String", " ", "content", "\xe2\x96\x81");
  json_t *decs = json_pack("[{s:s,s:{s:s},s:s},{s:s},{s:s}]", "type", "Replace", "pattern", "String", "\xe2\x96\x81",
                           "content", " ", "type", "ByteFallback", "type", "Fuse");
  if (prefix) {
    json_array_insert_new(norms, 0, json_pack("{s:s,s:s}", "type", "Prepend", "prepend", "\xe2\x96\x81"));
    json_array_append_new(decs, json_pack("{s:s,s:s,s:i,s:i}", "type", "Strip", "content", " ", "start", 1, "stop", 0));
  }
  root = json_pack("{s:s,s:n,s:n,s:o,s:{s:s,s:o},s:n,s:o,s:{s:s,s:o},"
                   "s:{s:s,s:n,s:o,s:n,s:n,s:b,s:b,s:b,s:o,s:o}}",
                   "version", "1.0", "truncation", "padding", "added_tokens", added, "normalizer", "type", "Sequence",
                   "normalizers", norms, "pre_tokenizer", "post_processor", post, "decoder", "type", "Sequence",
                   "decoders", decs, "model", "type", "BPE", "dropout", "unk_token", unk_tok,
                   "continuing_subword_prefix", "end_of_word_suffix", "fuse_unk", 1, "byte_fallback", 1,
                   "ignore_merges", 0, "vocab", vocab, "merges", merges);
  added = vocab = merges = NULL; /* the "o" references went to root (or were released on failure) */
  if (!root) {
    rc = servd_fail(SERVD_ENOMEM, "%s: cannot build tokenizer.json", what);
    goto fail;
  }
  *out = root;
fail:
  free(m);
  json_decref(vocab);
  json_decref(merges);
  json_decref(added);
  return rc;
}
