/* WordPiece as Hugging Face tokenizers writes it for BERT-family models: BertNormalizer (control
 * characters dropped, whitespace to spaces, CJK ideographs set apart, accents stripped by NFD minus
 * the nonspacing marks, lowercase), BertPreTokenizer (split on whitespace, every punctuation
 * character its own word), the WordPiece model (greedy longest match from the left, "##" before
 * every piece but a word's first, the unknown token for a word that cannot be spelled or is longer
 * than max_input_chars_per_word characters) and the WordPiece decoder.
 *
 * Canonical decomposition and lowercase come from utf8proc; the character classes (punctuation,
 * nonspacing marks, controls) from tables generated from Hugging Face tokenizers itself
 * (wordpiece_tables.c), whose Unicode version is older than utf8proc's.
 * Every refusal names the tokenizer.json field. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "tokenizer-impl.h"

/* ---- loading ------------------------------------------------------------------------------------ */

static bool flag_or(json_t *o, const char *key, bool dflt) {
  json_t *v = json_object_get(o, key);
  return json_is_boolean(v) ? json_is_true(v) : dflt;
}

static int parse_normalizer(servd_tokenizer *t, json_t *n) {
  if (!n || json_is_null(n)) return 0;
  const char *type = json_string_value(json_object_get(n, "type"));
  if (!type || strcmp(type, "BertNormalizer"))
    return servd_fail(SERVD_EUNSUPPORTED,
                      "tokenizer.json: normalizer.type: \"%s\" is not supported with a WordPiece model "
                      "(BertNormalizer or null is)",
                      type ? type : "(none)");
  wp_normalizer *bn = &t->wp.norm;
  bn->on = true;
  bn->clean_text = flag_or(n, "clean_text", true);
  bn->chinese = flag_or(n, "handle_chinese_chars", true);
  bn->lowercase = flag_or(n, "lowercase", true);
  /* strip_accents: null means "as lowercase" (BERT's uncased models strip, cased ones keep) */
  bn->strip_accents = flag_or(n, "strip_accents", bn->lowercase);
  return 0;
}

static int parse_pre(json_t *pt) {
  if (!pt || json_is_null(pt)) return 0;
  const char *type = json_string_value(json_object_get(pt, "type"));
  if (type && !strcmp(type, "BertPreTokenizer")) return 0;
  return servd_fail(SERVD_EUNSUPPORTED,
                    "tokenizer.json: pre_tokenizer.type: \"%s\" is not supported with a WordPiece model "
                    "(BertPreTokenizer is)",
                    type ? type : "(none)");
}

static int parse_decoder(json_t *d) {
  if (!d || json_is_null(d)) return 0;
  const char *type = json_string_value(json_object_get(d, "type"));
  const char *prefix = json_string_value(json_object_get(d, "prefix"));
  if (!type || strcmp(type, "WordPiece"))
    return servd_fail(SERVD_EUNSUPPORTED,
                      "tokenizer.json: decoder.type: \"%s\" is not supported with a WordPiece model (WordPiece is)",
                      type ? type : "(none)");
  if (prefix && strcmp(prefix, "##"))
    return servd_fail(SERVD_EUNSUPPORTED, "tokenizer.json: decoder.prefix: \"%s\" is not supported (\"##\" is)",
                      prefix);
  return 0;
}

int wp__parse(servd_tokenizer *t, json_t *root, json_t *model) {
  t->wordpiece = true;
  const char *prefix = json_string_value(json_object_get(model, "continuing_subword_prefix"));
  if (!prefix) prefix = "##";
  if (strlen(prefix) >= sizeof t->wp.prefix)
    return servd_fail(SERVD_EFORMAT, "tokenizer.json: model.continuing_subword_prefix: longer than %zu bytes",
                      sizeof t->wp.prefix - 1);
  t->wp.prefix_len = strlen(prefix);
  memcpy(t->wp.prefix, prefix, t->wp.prefix_len);
  json_t *mx = json_object_get(model, "max_input_chars_per_word");
  t->wp.max_chars = 100;
  if (mx && !json_is_null(mx)) {
    if (!json_is_integer(mx) || json_integer_value(mx) < 1 || json_integer_value(mx) > 1 << 20)
      return servd_fail(SERVD_EFORMAT, "tokenizer.json: model.max_input_chars_per_word: expected an integer in [1, %d]",
                        1 << 20);
    t->wp.max_chars = (int)json_integer_value(mx);
  }
  int rc = parse_normalizer(t, json_object_get(root, "normalizer"));
  if (!rc) rc = parse_pre(json_object_get(root, "pre_tokenizer"));
  if (!rc) rc = parse_decoder(json_object_get(root, "decoder"));
  return rc;
}

int wp__resolve_vocab(servd_tokenizer *t, json_t *model) {
  const char *unk = json_string_value(json_object_get(model, "unk_token"));
  if (!unk) unk = "[UNK]";
  t->unk_id = str_map_get(&t->content_ids, unk, strlen(unk));
  if (t->unk_id < 0 || !t->in_vocab[t->unk_id])
    return servd_fail(SERVD_EFORMAT, "tokenizer.json: model.unk_token: \"%.64s\" is not in model.vocab", unk);
  return 0;
}

/* The bytes a token decodes to: "##x" -> "x" (glued to the previous token), the punctuation the
 * decoder's cleanup glues (. , ? !) as it is, any other token a space and itself; the first token's
 * space is cut at decode (wp__lead_cut). */
int wp__token_bytes(const servd_tokenizer *t, const char *s, size_t n, bool in_vocab, tok_buf *out) {
  out->len = 0;
  if (in_vocab && n > t->wp.prefix_len && !memcmp(s, t->wp.prefix, t->wp.prefix_len))
    return tok_buf_append(out, s + t->wp.prefix_len, n - t->wp.prefix_len);
  if (!(n == 1 && strchr(".,?!", s[0]))) {
    int rc = tok_buf_append(out, " ", 1);
    if (rc) return rc;
  }
  return tok_buf_append(out, s, n);
}

size_t wp__lead_cut(const servd_tokenizer *t, int32_t id, const char *p, size_t pl, bool *first, size_t *lead) {
  bool was_first = *first;
  *first = false;
  *lead = 0;
  if (!was_first) return 0;
  /* the decoder leaves the first token as it is: a continuation keeps its "##", a word has no space */
  if (t->wp.is_cont[id]) {
    *lead = t->wp.prefix_len;
    return 0;
  }
  return pl && p[0] == ' ' ? 1 : 0;
}

/* ---- BertNormalizer ------------------------------------------------------------------------------ */

/* Rust's char::is_whitespace (the White_Space property). */
static bool is_ws(uint32_t c) {
  return (c >= 9 && c <= 13) || c == 32 || c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) ||
         c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

bool wp__in(const wp_class *k, uint32_t c) {
  size_t lo = 0, hi = k->n;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (c < k->r[mid][0]) hi = mid;
    else if (c > k->r[mid][1]) lo = mid + 1;
    else return true;
  }
  return false;
}

/* Tab, newline and carriage return count as whitespace; the other control, format and private-use
 * characters are dropped (unassigned ones are kept, as Hugging Face keeps them). */
static bool is_control(uint32_t c) {
  if (c < 0x80) return (c < 32 && c != '\t' && c != '\n' && c != '\r') || c == 127;
  return wp__in(&wp__control, c);
}

/* The CJK Unified Ideographs blocks BERT sets apart (not Hangul, Hiragana or Katakana). */
static bool is_cjk(uint32_t c) {
  return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) || (c >= 0x20000 && c <= 0x2A6DF) ||
         (c >= 0x2A700 && c <= 0x2B73F) || (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B920 && c <= 0x2CEAF) ||
         (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

static int put_cp(tok_buf *out, uint32_t c) {
  int rc = tok_buf_reserve(out, 5);
  if (rc) return rc;
  out->len += (size_t)utf8__encode(c, out->p + out->len);
  return 0;
}

/* Rust's char::to_lowercase: the simple mapping, and U+0130's two characters. */
static int put_lower(tok_buf *out, uint32_t c) {
  if (c == 0x130) return tok_buf_append(out, "i\xCC\x87", 3);
  return put_cp(out, (uint32_t)utf8proc_tolower((utf8proc_int32_t)c));
}

/* ASCII needs no table: controls dropped (tab, newline, return to spaces), letters lowered. */
static int normalize_ascii(const wp_normalizer *bn, const uint8_t *s, size_t n, tok_buf *out) {
  int rc = tok_buf_reserve(out, n + 1);
  if (rc) return rc;
  char *o = out->p + out->len;
  for (size_t i = 0; i < n; i++) {
    uint8_t c = s[i];
    if (bn->clean_text) {
      if (c == '\t' || c == '\n' || c == '\r') c = ' ';
      else if (c < 32 || c == 127) continue;
    }
    if (bn->lowercase && c >= 'A' && c <= 'Z') c = (uint8_t)(c + 32);
    *o++ = (char)c;
  }
  out->len = (size_t)(o - out->p);
  return 0;
}

int wp__normalize(const servd_tokenizer *t, const uint8_t *s, size_t n, tok_buf *out) {
  const wp_normalizer *bn = &t->wp.norm;
  size_t i = 0;
  while (i < n && s[i] < 0x80) i++;
  if (i == n) return normalize_ascii(bn, s, n, out);

  /* clean_text and the CJK spaces per character, into stage (UTF-8) */
  tok_buf stage = {0};
  utf8proc_int32_t *cps = NULL;
  int rc = tok_buf_reserve(&stage, n + 16);
  for (size_t p = 0; !rc && p < n;) {
    uint32_t c;
    int l = utf8__decode(s + p, n - p, &c);
    if (!l) { /* the caller made the text valid; keep going past a stray byte all the same */
      p++;
      continue;
    }
    p += (size_t)l;
    if (bn->clean_text) {
      if (c == 0 || is_control(c)) continue; /* the table holds U+FFFD */
      if (is_ws(c)) c = ' ';
    }
    if (bn->chinese && is_cjk(c)) {
      if (!(rc = tok_buf_append(&stage, " ", 1)) && !(rc = put_cp(&stage, c))) rc = tok_buf_append(&stage, " ", 1);
    } else {
      rc = put_cp(&stage, c);
    }
  }
  if (rc) goto done;
  if (!bn->strip_accents) {
    /* lowercase alone (or nothing): per character */
    for (size_t p = 0; !rc && p < stage.len;) {
      uint32_t c;
      int l = utf8__decode((const uint8_t *)stage.p + p, stage.len - p, &c);
      p += (size_t)(l ? l : 1);
      rc = bn->lowercase ? put_lower(out, c) : put_cp(out, c);
    }
    goto done;
  }
  /* NFD (with canonical reordering) of the whole stage, then nonspacing marks dropped */
  utf8proc_ssize_t cap = (utf8proc_ssize_t)stage.len + 16, got;
  for (;;) {
    cps = malloc((size_t)cap * sizeof *cps);
    if (!cps) {
      rc = servd_fail(SERVD_ENOMEM, "tokenizer: out of memory normalizing %zu bytes", n);
      goto done;
    }
    got = utf8proc_decompose((const utf8proc_uint8_t *)stage.p, (utf8proc_ssize_t)stage.len, cps, cap,
                             UTF8PROC_DECOMPOSE);
    if (got < 0) {
      rc = servd_fail(SERVD_EINVAL, "tokenizer: NFD failed: %s", utf8proc_errmsg(got));
      goto done;
    }
    if (got <= cap) break;
    free(cps);
    cap = got;
  }
  for (utf8proc_ssize_t k = 0; !rc && k < got; k++) {
    uint32_t c = (uint32_t)cps[k];
    if (c >= 0x300 && wp__in(&wp__mark, c)) continue;
    rc = bn->lowercase ? put_lower(out, c) : put_cp(out, c);
  }
done:
  free(cps);
  free(stage.p);
  return rc;
}

/* ---- BertPreTokenizer and the WordPiece model ---------------------------------------------------- */

/* Rust's is_ascii_punctuation or a Unicode punctuation category (Pc Pd Ps Pe Pi Pf Po). */
static bool is_punct(uint32_t c) {
  if (c < 0x80) return (c >= 33 && c <= 47) || (c >= 58 && c <= 64) || (c >= 91 && c <= 96) || (c >= 123 && c <= 126);
  return wp__in(&wp__punct, c);
}

static int push_id(int32_t **out, size_t *n_out, size_t *cap, int32_t id) {
  if (*n_out == *cap) {
    size_t c = *cap ? *cap * 2 : 16;
    int32_t *o = realloc(*out, c * sizeof *o);
    if (!o) return servd_fail(SERVD_ENOMEM, "tokenizer: out of memory");
    *out = o;
    *cap = c;
  }
  (*out)[(*n_out)++] = id;
  return 0;
}

static int32_t vocab_id(const servd_tokenizer *t, const void *s, size_t n) {
  int32_t id = str_map_get(&t->content_ids, s, n);
  return id >= 0 && t->in_vocab[id] ? id : -1;
}

/* One word (nchars characters): its pieces, or the unknown token alone. */
static int encode_word(const servd_tokenizer *t, const uint8_t *s, size_t n, size_t nchars, tok_buf *scratch,
                       int32_t **out, size_t *n_out, size_t *cap) {
  if (nchars > (size_t)t->wp.max_chars) return push_id(out, n_out, cap, t->unk_id);
  size_t before = *n_out, pl = t->wp.prefix_len;
  scratch->len = 0;
  int rc = tok_buf_reserve(scratch, pl + n + 1);
  if (rc) return rc;
  memcpy(scratch->p + pl, s, n); /* word byte k at pl + k; a piece's prefix goes right before it */
  for (size_t start = 0; start < n;) {
    size_t end = n;
    /* no vocabulary entry is longer than wp.longest bytes: start below it, on a character boundary */
    if (end - start > t->wp.longest) {
      end = start + t->wp.longest;
      while (end > start && (s[end] & 0xC0) == 0x80) end--;
    }
    if (start) memcpy(scratch->p + start, t->wp.prefix, pl); /* over word bytes already consumed */
    int32_t id = -1;
    while (end > start) {
      id = start ? vocab_id(t, scratch->p + start, pl + end - start) : vocab_id(t, s, end);
      if (id >= 0) break;
      do end--;
      while (end > start && (s[end] & 0xC0) == 0x80);
    }
    if (id < 0) {
      *n_out = before;
      return push_id(out, n_out, cap, t->unk_id);
    }
    if ((rc = push_id(out, n_out, cap, id))) return rc;
    start = end;
  }
  return 0;
}

int wp__encode(const servd_tokenizer *t, const uint8_t *s, size_t n, word_cache *cache, tok_buf *scratch, int32_t **out,
               size_t *n_out, size_t *cap) {
  size_t word = 0, nchars = 0, p = 0;
  int rc = 0;
  /* emits s[word..end) as a word (through the cache when the caller holds its lock) */
#define WP_FLUSH(end) \
  do { \
    size_t wl = (end)-word; \
    if (wl) { \
      int nc = 0; \
      const int32_t *hit = cache && wl <= 64 ? word_cache_get(cache, s + word, wl, &nc) : NULL; \
      if (hit) { \
        for (int k = 0; !rc && k < nc; k++) rc = push_id(out, n_out, cap, hit[k]); \
      } else { \
        size_t b0 = *n_out; \
        rc = encode_word(t, s + word, wl, nchars, scratch, out, n_out, cap); \
        if (!rc && cache && wl <= 64) word_cache_put(cache, s + word, wl, *out + b0, (int)(*n_out - b0)); \
      } \
      if (rc) return rc; \
    } \
  } while (0)
  while (p < n) {
    uint32_t c;
    int l;
    if (s[p] < 0x80) {
      c = s[p];
      l = 1;
    } else if (!(l = utf8__decode(s + p, n - p, &c))) {
      c = 0xFFFD;
      l = 1;
    }
    if (is_ws(c)) {
      WP_FLUSH(p);
      word = p + (size_t)l;
      nchars = 0;
    } else if (is_punct(c)) {
      WP_FLUSH(p);
      word = p;
      nchars = 1;
      WP_FLUSH(p + (size_t)l);
      word = p + (size_t)l;
      nchars = 0;
    } else {
      nchars++;
    }
    p += (size_t)l;
  }
  WP_FLUSH(n);
#undef WP_FLUSH
  return 0;
}
