/* SentencePiece-style BPE as Hugging Face tokenizers writes it in tokenizer.json: the normalizer
 * (Prepend "▁" + Replace " " -> "▁"), the Metaspace pre-tokenizer, and the character-level decoders
 * (Replace, ByteFallback, Fuse, Strip, Metaspace). Every refusal names the JSON field. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer-impl.h"

static int add_edit(text_edit *v, int *n, const char *from, const char *to, const char *field) {
  if (*n >= MAX_EDITS)
    return servd_fail(SERVD_EUNSUPPORTED, "tokenizer.json: %s: more than %d Prepend/Replace steps", field, MAX_EDITS);
  text_edit *e = &v[*n];
  e->from = from ? strdup(from) : NULL;
  e->to = strdup(to);
  if ((from && !e->from) || !e->to) {
    free(e->from);
    free(e->to);
    return servd_fail(SERVD_ENOMEM, "tokenizer: out of memory");
  }
  e->from_len = from ? strlen(from) : 0;
  e->to_len = strlen(to);
  (*n)++;
  return 0;
}

/* Replace{pattern: {"String": s}, content: c}; a Regex pattern is refused. */
static int parse_replace(json_t *o, const char *field, const char **from, const char **to) {
  json_t *pat = json_object_get(o, "pattern");
  *from = json_string_value(json_object_get(pat, "String"));
  *to = json_string_value(json_object_get(o, "content"));
  if (!*from || !**from || !*to)
    return servd_fail(SERVD_EUNSUPPORTED,
                      "tokenizer.json: %s: Replace needs pattern {\"String\": non-empty} and a content string (Regex "
                      "patterns are not supported)",
                      field);
  return 0;
}

int spm__parse_normalizer(servd_tokenizer *t, json_t *n, const char *field) {
  char f[128];
  if (!n || json_is_null(n)) return 0;
  const char *type = json_string_value(json_object_get(n, "type"));
  if (!type) return servd_fail(SERVD_EFORMAT, "tokenizer.json: %s.type: expected a string", field);
  if (!strcmp(type, "Sequence")) {
    json_t *arr = json_object_get(n, "normalizers");
    if (!json_is_array(arr))
      return servd_fail(SERVD_EFORMAT, "tokenizer.json: %s.normalizers: expected an array", field);
    for (size_t i = 0; i < json_array_size(arr); i++) {
      snprintf(f, sizeof f, "%s.normalizers[%zu]", field, i);
      int rc = spm__parse_normalizer(t, json_array_get(arr, i), f);
      if (rc) return rc;
    }
    return 0;
  }
  if (!strcmp(type, "Prepend")) {
    const char *p = json_string_value(json_object_get(n, "prepend"));
    if (!p) return servd_fail(SERVD_EFORMAT, "tokenizer.json: %s.prepend: expected a string", field);
    return *p ? add_edit(t->norm, &t->n_norm, NULL, p, field) : 0;
  }
  if (!strcmp(type, "Replace")) {
    const char *from, *to;
    int rc = parse_replace(n, field, &from, &to);
    return rc ? rc : add_edit(t->norm, &t->n_norm, from, to, field);
  }
  return servd_fail(SERVD_EUNSUPPORTED,
                    "tokenizer.json: %s.type: normalizer \"%s\" is not supported (Prepend, Replace, Sequence are)",
                    field, type);
}

/* replacement, and prepend_scheme or (older files) add_prefix_space. */
static int parse_meta_common(json_t *o, const char *field, servd_tokenizer *t, int *scheme) {
  const char *rep = json_string_value(json_object_get(o, "replacement"));
  if (!rep) rep = json_string_value(json_object_get(o, "str_rep"));
  uint32_t cp;
  size_t rl = rep ? strlen(rep) : 0;
  if (!rep || !rl || rl >= sizeof t->meta_rep || utf8__decode((const uint8_t *)rep, rl, &cp) != (int)rl)
    return servd_fail(SERVD_EFORMAT, "tokenizer.json: %s.replacement: expected one character", field);
  if (t->meta_rep_len && (rl != t->meta_rep_len || memcmp(rep, t->meta_rep, rl)))
    return servd_fail(SERVD_EUNSUPPORTED, "tokenizer.json: %s.replacement: differs from the pre-tokenizer's", field);
  memcpy(t->meta_rep, rep, rl);
  t->meta_rep_len = rl;
  const char *ps = json_string_value(json_object_get(o, "prepend_scheme"));
  if (ps) {
    if (!strcmp(ps, "always")) *scheme = META_ALWAYS;
    else if (!strcmp(ps, "first")) *scheme = META_FIRST;
    else if (!strcmp(ps, "never")) *scheme = META_NEVER;
    else
      return servd_fail(SERVD_EUNSUPPORTED,
                        "tokenizer.json: %s.prepend_scheme: \"%s\" is not one of always, first, never", field, ps);
  } else {
    json_t *ap = json_object_get(o, "add_prefix_space");
    *scheme = json_is_boolean(ap) && !json_is_true(ap) ? META_NEVER : META_ALWAYS;
  }
  return 0;
}

int spm__parse_metaspace(servd_tokenizer *t, json_t *pt, const char *field) {
  if (t->metaspace || t->n_steps)
    return servd_fail(SERVD_EUNSUPPORTED, "tokenizer.json: %s: Metaspace must be the only pre-tokenizer", field);
  int rc = parse_meta_common(pt, field, t, &t->meta_prepend);
  if (rc) return rc;
  json_t *split = json_object_get(pt, "split");
  t->meta_split = !json_is_boolean(split) || json_is_true(split);
  t->metaspace = true;
  return 0;
}

int spm__parse_decoder(servd_tokenizer *t, json_t *d, const char *field) {
  char f[128];
  if (!d || json_is_null(d)) return 0;
  const char *type = json_string_value(json_object_get(d, "type"));
  if (!type) return servd_fail(SERVD_EFORMAT, "tokenizer.json: %s.type: expected a string", field);
  if (!strcmp(type, "ByteLevel")) {
    t->dec_bytelevel = true;
    return 0;
  }
  if (!strcmp(type, "Sequence")) {
    json_t *arr = json_object_get(d, "decoders");
    if (!json_is_array(arr)) return servd_fail(SERVD_EFORMAT, "tokenizer.json: %s.decoders: expected an array", field);
    for (size_t i = 0; i < json_array_size(arr); i++) {
      snprintf(f, sizeof f, "%s.decoders[%zu]", field, i);
      int rc = spm__parse_decoder(t, json_array_get(arr, i), f);
      if (rc) return rc;
    }
    return 0;
  }
  t->dec_charlevel = true;
  if (!strcmp(type, "Replace")) {
    const char *from, *to;
    int rc = parse_replace(d, field, &from, &to);
    return rc ? rc : add_edit(t->dec_repl, &t->n_dec_repl, from, to, field);
  }
  if (!strcmp(type, "ByteFallback")) {
    t->dec_bytes = true;
    return 0;
  }
  if (!strcmp(type, "Fuse")) {
    t->dec_fused = true;
    return 0;
  }
  if (!strcmp(type, "Strip")) {
    /* on the fused text: drop up to `start` leading spaces (a non-zero stop would need the end) */
    const char *c = json_string_value(json_object_get(d, "content"));
    json_t *start = json_object_get(d, "start"), *stop = json_object_get(d, "stop");
    if (!c || strcmp(c, " ") || !json_is_integer(start) || json_integer_value(start) < 0 ||
        json_integer_value(start) > 64 || (stop && json_integer_value(stop) != 0))
      return servd_fail(SERVD_EUNSUPPORTED,
                        "tokenizer.json: %s: Strip is supported with content \" \", start 0..64 and stop 0", field);
    if (!t->dec_fused)
      return servd_fail(SERVD_EUNSUPPORTED, "tokenizer.json: %s: Strip is supported only after Fuse", field);
    t->strip_left = (int)json_integer_value(start);
    return 0;
  }
  if (!strcmp(type, "Metaspace")) {
    int scheme, rc = parse_meta_common(d, field, t, &scheme);
    if (rc) return rc;
    t->meta_first = scheme != META_NEVER;
    return add_edit(t->dec_repl, &t->n_dec_repl, t->meta_rep, " ", field);
  }
  return servd_fail(
      SERVD_EUNSUPPORTED,
      "tokenizer.json: %s: decoder \"%s\" is not supported (ByteLevel, Replace, ByteFallback, Fuse, Strip, "
      "Metaspace, Sequence are)",
      field, type);
}

static int hexval(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

/* Appends s[0..n) to out with every `from` replaced by `to` (left to right, no overlap). */
static int replace_into(const char *s, size_t n, const text_edit *e, tok_buf *out) {
  size_t i = 0, run = 0;
  int rc = 0;
  while (i + e->from_len <= n) {
    if (!memcmp(s + i, e->from, e->from_len)) {
      if ((rc = tok_buf_append(out, s + run, i - run)) || (rc = tok_buf_append(out, e->to, e->to_len))) return rc;
      i += e->from_len;
      run = i;
    } else {
      i++;
    }
  }
  return tok_buf_append(out, s + run, n - run);
}

/* Applies the edits in order; the result is in *a (b is scratch). */
static int apply_edits(const text_edit *v, int n_edits, const char *s, size_t n, tok_buf *a, tok_buf *b) {
  int rc;
  a->len = 0;
  if ((rc = tok_buf_append(a, s, n))) return rc;
  for (int k = 0; k < n_edits; k++) {
    const text_edit *e = &v[k];
    b->len = 0;
    if (!e->from) {
      if (a->len && ((rc = tok_buf_append(b, e->to, e->to_len)) || (rc = tok_buf_append(b, a->p, a->len)))) return rc;
    } else if ((rc = replace_into(a->p, a->len, e, b))) {
      return rc;
    }
    tok_buf tmp = *a;
    *a = *b;
    *b = tmp;
  }
  return 0;
}

int spm__token_bytes(const servd_tokenizer *t, const char *s, size_t n, tok_buf *out, bool *is_byte) {
  *is_byte = false;
  out->len = 0;
  /* ByteFallback: exactly "<0xHH>" */
  if (t->dec_bytes && n == 6 && !memcmp(s, "<0x", 3) && s[5] == '>' && hexval(s[3]) >= 0 && hexval(s[4]) >= 0) {
    char b = (char)(hexval(s[3]) * 16 + hexval(s[4]));
    *is_byte = true;
    return tok_buf_append(out, &b, 1);
  }
  tok_buf scratch = {0};
  int rc = apply_edits(t->dec_repl, t->n_dec_repl, s, n, out, &scratch);
  free(scratch.p);
  return rc;
}

int spm__normalize(const servd_tokenizer *t, const uint8_t *s, size_t n, tok_buf *out) {
  tok_buf a = {0}, b = {0};
  int rc = apply_edits(t->norm, t->n_norm, (const char *)s, n, &a, &b);
  if (!rc) rc = tok_buf_append(out, a.p, a.len);
  free(a.p);
  free(b.p);
  return rc;
}

int spm__metaspace(const servd_tokenizer *t, const uint8_t *s, size_t n, bool at_origin, tok_buf *out) {
  int rc = tok_buf_reserve(out, n * t->meta_rep_len + t->meta_rep_len + 1);
  if (rc) return rc;
  /* Hugging Face prepends only when the text does not already start with the replacement */
  bool starts = n && (s[0] == ' ' || (n >= t->meta_rep_len && !memcmp(s, t->meta_rep, t->meta_rep_len)));
  if (n && !starts && (t->meta_prepend == META_ALWAYS || (t->meta_prepend == META_FIRST && at_origin))) {
    memcpy(out->p + out->len, t->meta_rep, t->meta_rep_len);
    out->len += t->meta_rep_len;
  }
  for (size_t i = 0; i < n; i++) {
    if (s[i] == ' ') {
      memcpy(out->p + out->len, t->meta_rep, t->meta_rep_len);
      out->len += t->meta_rep_len;
    } else {
      out->p[out->len++] = (char)s[i];
    }
  }
  return 0;
}

size_t spm__lead_cut(const servd_tokenizer *t, int32_t id, const char *p, size_t pl, bool *first, int *budget) {
  size_t k = 0;
  if (t->meta_first && *first) {
    *first = false;
    if (!t->is_bytetok[id])
      while (k < pl && p[k] == ' ') k++;
  }
  while (*budget > 0 && k < pl && p[k] == ' ') {
    k++;
    (*budget)--;
  }
  if (k < pl) *budget = 0; /* the text has started */
  return k;
}
