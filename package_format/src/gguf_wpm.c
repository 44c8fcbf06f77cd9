/* GGUF tokenizer.ggml.model "bert" (WordPiece, as llama.cpp's convert_hf_to_gguf.py writes BERT
 * models) -> the tokenizer.json of the Hugging Face folder it came from: the converter stores the
 * vocabulary in "phantom space" form ("[X]" kept, a word-initial piece "x" as "\u2581x", a
 * continuation "##x" as "x"), which is undone here; control tokens become special added tokens;
 * BertNormalizer (lowercase, accents stripped: llama.cpp's WPM tokenizer always lowercases, so the
 * files it serves are uncased models), BertPreTokenizer, BertProcessing with [CLS] = BOS (or
 * cls_token_id) and [SEP] = seperator_token_id (or EOS), the WordPiece decoder. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "import-impl.h"
#include "mpk-impl.h"
#include "mpk/gguf.h"

enum { TT_CONTROL = 3 };

static int id_of(const char *what, const mpk_gguf *g, const char *const *keys, uint64_t n, int64_t *id) {
  *id = -1;
  for (; *keys; keys++) {
    uint64_t v;
    int r = mpk_gguf_get_u64(g, *keys, &v);
    if (r == SERVD_EINVAL) continue;
    if (r) return r;
    if (v >= n)
      return servd_fail(SERVD_EFORMAT, "%s: %s = %llu, expected < %llu tokens", what, *keys, (unsigned long long)v,
                        (unsigned long long)n);
    *id = (int64_t)v;
    return 0;
  }
  return 0;
}

int mpk__gguf_wpm_json(const char *what, const mpk_gguf *g, const mpk_gguf_kv *tokens, const mpk_gguf_kv *types,
                       json_t **out) {
  int rc = 0;
  const uint64_t n = tokens->n;
  json_t *vocab = json_object(), *added = json_array(), *root = NULL, *unk_json = NULL;
  char *buf = NULL;
  *out = NULL;
  if (!vocab || !added) {
    rc = servd_fail(SERVD_ENOMEM, "%s: out of memory", what);
    goto fail;
  }
  static const char *const cls_keys[] = {"tokenizer.ggml.cls_token_id", "tokenizer.ggml.bos_token_id", NULL};
  static const char *const sep_keys[] = {"tokenizer.ggml.seperator_token_id", "tokenizer.ggml.eos_token_id", NULL};
  static const char *const unk_keys[] = {"tokenizer.ggml.unknown_token_id", NULL};
  int64_t cls, sep, unk;
  if ((rc = id_of(what, g, cls_keys, n, &cls)) || (rc = id_of(what, g, sep_keys, n, &sep)) ||
      (rc = id_of(what, g, unk_keys, n, &unk)))
    goto fail;
  if (cls < 0 || sep < 0 || unk < 0) {
    rc = servd_fail(SERVD_EFORMAT,
                    "%s: a WordPiece vocabulary needs tokenizer.ggml.bos_token_id (or cls_token_id), "
                    "seperator_token_id (or eos_token_id) and unknown_token_id",
                    what);
    goto fail;
  }
  for (uint64_t i = 0; i < n; i++) {
    const char *s;
    size_t l;
    mpk_gguf_arr_str(g, tokens, i, &s, &l);
    free(buf);
    if (!(buf = malloc(l + 3))) {
      rc = servd_fail(SERVD_ENOMEM, "%s: out of memory", what);
      goto fail;
    }
    if (l >= 2 && s[0] == '[' && s[l - 1] == ']') { /* [CLS], [unused0]: as they are */
      memcpy(buf, s, l);
    } else if (l >= 3 && !memcmp(s, "\xE2\x96\x81", 3)) { /* a word's first piece */
      memcpy(buf, s + 3, l - 3);
      l -= 3;
    } else { /* a continuation */
      memcpy(buf, "##", 2);
      memcpy(buf + 2, s, l);
      l += 2;
    }
    buf[l] = 0;
    json_t *str = json_stringn(buf, l);
    if (!str || strlen(buf) != l) {
      json_decref(str);
      rc = servd_fail(SERVD_EFORMAT, "%s: tokenizer.ggml.tokens[%llu]: expected UTF-8 without NUL", what,
                      (unsigned long long)i);
      goto fail;
    }
    if (!json_object_get(vocab, buf)) json_object_set_new(vocab, buf, json_integer((json_int_t)i)); /* first id wins */
    if ((int64_t)i == unk) unk_json = json_incref(str);
    if ((types ? mpk_gguf_arr_int(types, i) : 1) == TT_CONTROL)
      json_array_append_new(added,
                            json_pack("{s:I,s:O,s:b,s:b,s:b,s:b,s:b}", "id", (json_int_t)i, "content", str,
                                      "single_word", 0, "lstrip", 0, "rstrip", 0, "normalized", 0, "special", 1));
    json_decref(str);
  }
  const char *cls_s, *sep_s;
  size_t cls_l, sep_l;
  mpk_gguf_arr_str(g, tokens, (uint64_t)cls, &cls_s, &cls_l);
  mpk_gguf_arr_str(g, tokens, (uint64_t)sep, &sep_s, &sep_l);
  root = json_pack("{s:s,s:n,s:n,s:o,s:{s:s,s:b,s:b,s:n,s:b},s:{s:s},s:{s:s,s:[s%,I],s:[s%,I]},s:{s:s,s:s,s:b},"
                   "s:{s:s,s:o,s:s,s:i,s:o}}",
                   "version", "1.0", "truncation", "padding", "added_tokens", added, "normalizer", "type",
                   "BertNormalizer", "clean_text", 1, "handle_chinese_chars", 1, "strip_accents", "lowercase", 1,
                   "pre_tokenizer", "type", "BertPreTokenizer", "post_processor", "type", "BertProcessing", "sep",
                   sep_s, sep_l, (json_int_t)sep, "cls", cls_s, cls_l, (json_int_t)cls, "decoder", "type", "WordPiece",
                   "prefix", "##", "cleanup", 1, "model", "type", "WordPiece", "unk_token", unk_json,
                   "continuing_subword_prefix", "##", "max_input_chars_per_word", 100, "vocab", vocab);
  added = vocab = unk_json = NULL;
  if (!root) {
    rc = servd_fail(SERVD_ENOMEM, "%s: cannot build tokenizer.json", what);
    goto fail;
  }
  *out = root;
fail:
  free(buf);
  json_decref(unk_json);
  json_decref(vocab);
  json_decref(added);
  return rc;
}
