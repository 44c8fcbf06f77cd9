/* Ids -> text, whole or incrementally, and the small lookups. */
#include <stdlib.h>
#include <string.h>

#include "tokenizer-impl.h"

static const char REPL[3] = {'\xEF', '\xBF', '\xBD'};

const char *servd_tokenizer_token_to_piece(const servd_tokenizer *t, int32_t id, size_t *len) {
  if (!t || id < 0 || id >= t->n_ids || !t->has_piece[id]) {
    if (len) *len = 0;
    return NULL;
  }
  if (len) *len = t->piece_off[id + 1] - t->piece_off[id];
  return t->pieces.p + t->piece_off[id];
}

int servd_tokenizer_vocab_size(const servd_tokenizer *t) { return t ? t->n_ids : 0; }

int32_t servd_tokenizer_token_id(const servd_tokenizer *t, const char *content) {
  if (!t || !content) return -1;
  return str_map_get(&t->content_ids, content, strlen(content));
}

void servd_tokenizer_special_affixes(const servd_tokenizer *t, const int32_t **prefix, int *n_prefix,
                                     const int32_t **suffix, int *n_suffix) {
  *prefix = t->prefix_ids;
  *n_prefix = t->n_prefix;
  *suffix = t->suffix_ids;
  *n_suffix = t->n_suffix;
}

bool servd_tokenizer_is_special(const servd_tokenizer *t, int32_t id) {
  return t && id >= 0 && id < t->n_ids && t->is_special[id];
}

/* Appends the valid UTF-8 of s[0..n) to out, invalid subparts as U+FFFD. With hold, an incomplete
 * sequence at the end is not consumed; returns how many bytes were consumed. out has room for 3n. */
static size_t emit_utf8(const uint8_t *s, size_t n, bool hold, char *out, size_t *out_len) {
  size_t i = 0, o = *out_len;
  while (i < n) {
    if (s[i] < 0x80) {
      out[o++] = (char)s[i++];
      continue;
    }
    size_t l;
    int k = utf8__classify(s + i, n - i, &l);
    if (k == UTF8_VALID) {
      memcpy(out + o, s + i, l);
      o += l;
    } else if (k == UTF8_INCOMPLETE && hold) {
      break;
    } else {
      memcpy(out + o, REPL, 3);
      o += 3;
    }
    i += l;
  }
  *out_len = o;
  return i;
}

int servd_tokenizer_decode(const servd_tokenizer *t, const int32_t *ids, int n, bool skip_special, char **text,
                           size_t *len) {
  *text = NULL;
  if (len) *len = 0;
  size_t total = 0;
  for (int i = 0; i < n; i++) {
    if (ids[i] < 0 || ids[i] >= t->n_ids || !t->has_piece[ids[i]])
      return servd_fail(SERVD_ERANGE, "tokenizer: decode: id %d at position %d is not in the vocabulary (size %d)",
                        ids[i], i, t->n_ids);
    total += t->piece_off[ids[i] + 1] - t->piece_off[ids[i]];
  }
  uint8_t *raw = malloc(total + sizeof t->wp.prefix + 1);
  char *out = malloc(total * 3 + 1);
  if (!raw || !out) {
    free(raw);
    free(out);
    return servd_fail(SERVD_ENOMEM, "tokenizer: decode: out of memory for %zu bytes", total);
  }
  size_t r = 0, o = 0;
  bool first = true;
  int budget = t->strip_left;
  for (int i = 0; i < n; i++) {
    if (skip_special && t->is_special[ids[i]]) continue;
    size_t pl = t->piece_off[ids[i] + 1] - t->piece_off[ids[i]];
    const char *p = t->pieces.p + t->piece_off[ids[i]];
    size_t lead = 0;
    size_t cut = t->wordpiece    ? wp__lead_cut(t, ids[i], p, pl, &first, &lead)
                 : t->char_level ? spm__lead_cut(t, ids[i], p, pl, &first, &budget)
                                 : 0;
    memcpy(raw + r, t->wp.prefix, lead);
    r += lead;
    memcpy(raw + r, p + cut, pl - cut);
    r += pl - cut;
  }
  emit_utf8(raw, r, false, out, &o);
  out[o] = 0;
  free(raw);
  *text = out;
  if (len) *len = o;
  return 0;
}

/* ---- incremental ------------------------------------------------------------------------------ */
struct servd_detok {
  const servd_tokenizer *t;
  bool skip_special;
  uint8_t held[4]; /* an incomplete UTF-8 sequence (at most 3 bytes) */
  size_t n_held;
  bool first; /* no token decoded yet (the decoder's leading-space rules) */
  int budget;
  uint8_t *in; /* held + the new token's bytes */
  char *out;
  size_t cap; /* bytes of `in`; out has 3 * cap + 4 */
};

static int detok_reserve(servd_detok *d, size_t n) {
  if (n <= d->cap) return 0;
  size_t c = d->cap ? d->cap : 64;
  while (c < n) c *= 2;
  uint8_t *in = malloc(c);
  char *out = malloc(3 * c + 4);
  if (!in || !out) {
    free(in);
    free(out);
    return servd_fail(SERVD_ENOMEM, "tokenizer: detokenizer: out of memory");
  }
  free(d->in);
  free(d->out);
  d->in = in, d->out = out, d->cap = c;
  return 0;
}

int servd_detok_create(const servd_tokenizer *t, bool skip_special, servd_detok **out) {
  *out = NULL;
  servd_detok *d = calloc(1, sizeof *d);
  if (!d) return servd_fail(SERVD_ENOMEM, "tokenizer: detokenizer: out of memory");
  d->t = t;
  d->skip_special = skip_special;
  d->first = true;
  d->budget = t->strip_left;
  /* room for the longest token, so pushes never allocate */
  size_t longest = 0;
  for (int32_t i = 0; i < t->n_ids; i++) {
    size_t l = t->piece_off[i + 1] - t->piece_off[i];
    if (l > longest) longest = l;
  }
  int rc = detok_reserve(d, longest + sizeof t->wp.prefix + 8);
  if (rc) {
    free(d);
    return rc;
  }
  *out = d;
  return 0;
}

void servd_detok_free(servd_detok *d) {
  if (!d) return;
  free(d->in);
  free(d->out);
  free(d);
}

void servd_detok_reset(servd_detok *d) {
  d->n_held = 0;
  d->first = true;
  d->budget = d->t->strip_left;
}

int servd_detok_push(servd_detok *d, int32_t id, const char **text, size_t *len) {
  const servd_tokenizer *t = d->t;
  *text = "";
  *len = 0;
  if (id < 0 || id >= t->n_ids || !t->has_piece[id])
    return servd_fail(SERVD_ERANGE, "tokenizer: detokenize: id %d is not in the vocabulary (size %d)", id, t->n_ids);
  if (d->skip_special && t->is_special[id]) return 0;
  size_t pl = t->piece_off[id + 1] - t->piece_off[id];
  const char *p = t->pieces.p + t->piece_off[id];
  size_t lead = 0;
  size_t cut = t->wordpiece    ? wp__lead_cut(t, id, p, pl, &d->first, &lead)
               : t->char_level ? spm__lead_cut(t, id, p, pl, &d->first, &d->budget)
                               : 0;
  p += cut;
  pl -= cut;
  int rc = detok_reserve(d, d->n_held + lead + pl);
  if (rc) return rc;
  memcpy(d->in, d->held, d->n_held);
  memcpy(d->in + d->n_held, t->wp.prefix, lead);
  memcpy(d->in + d->n_held + lead, p, pl);
  size_t n = d->n_held + lead + pl, o = 0;
  size_t used = emit_utf8(d->in, n, true, d->out, &o);
  d->n_held = n - used;
  memcpy(d->held, d->in + used, d->n_held);
  d->out[o] = 0;
  *text = d->out;
  *len = o;
  return 0;
}

int servd_detok_flush(servd_detok *d, const char **text, size_t *len) {
  size_t o = 0;
  emit_utf8(d->held, d->n_held, false, d->out, &o);
  d->out[o] = 0;
  d->n_held = 0;
  *text = d->out;
  *len = o;
  return 0;
}
