/* Text -> ids: make the input valid UTF-8, split out added tokens (leftmost, longest), pre-tokenize
 * each remaining segment, BPE each piece (through the bounded word cache), wrap in the template. */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer-impl.h"

enum { CACHE_MAX_PIECE = 64 };

typedef struct seg {
  uint32_t off, len;
  int32_t id; /* -1: text to tokenize */
} seg;

typedef struct seg_list {
  seg *v;
  size_t n, cap;
} seg_list;

static int seg_push(seg_list *l, uint32_t off, uint32_t len, int32_t id) {
  if (!len && id < 0) return 0;
  if (l->n == l->cap) {
    size_t c = l->cap ? l->cap * 2 : 16;
    seg *v = realloc(l->v, c * sizeof *v);
    if (!v) return servd_fail(SERVD_ENOMEM, "tokenizer: out of memory splitting added tokens");
    l->v = v;
    l->cap = c;
  }
  l->v[l->n++] = (seg){off, len, id};
  return 0;
}

/* Rust's char::is_whitespace (the White_Space property). */
static bool is_ws(uint32_t c) {
  return (c >= 9 && c <= 13) || c == 32 || c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) ||
         c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

/* Is the character starting at s[at] (end: hi) a word character? */
static bool word_at(const servd_tokenizer *t, pcre2_match_data *md, const uint8_t *s, size_t at, size_t hi) {
  return pcre2_match(t->word_re, s, hi, at, PCRE2_ANCHORED | PCRE2_NO_UTF_CHECK, md, NULL) > 0;
}

/* Is the character that ends at s[end) a word character? */
static bool word_before(const servd_tokenizer *t, pcre2_match_data *md, const uint8_t *s, size_t lo, size_t end) {
  if (end <= lo) return false;
  size_t q = end - 1;
  while (q > lo && (s[q] & 0xC0) == 0x80) q--;
  return word_at(t, md, s, q, end);
}

/* Start of the whitespace run that ends at `end` (not before lo). */
static size_t ws_back(const uint8_t *s, size_t lo, size_t end) {
  size_t p = end;
  while (p > lo) {
    size_t q = p - 1;
    while (q > lo && (s[q] & 0xC0) == 0x80) q--;
    uint32_t cp;
    if (!utf8__decode(s + q, p - q, &cp) || !is_ws(cp)) break;
    p = q;
  }
  return p;
}

static size_t ws_fwd(const uint8_t *s, size_t p, size_t hi) {
  while (p < hi) {
    uint32_t cp;
    int l = utf8__decode(s + p, hi - p, &cp);
    if (!l || !is_ws(cp)) break;
    p += (size_t)l;
  }
  return p;
}

int tok__normalize(const servd_tokenizer *t, const uint8_t *s, size_t n, tok_buf *out) {
  return t->wp.norm.on ? wp__normalize(t, s, n, out) : spm__normalize(t, s, n, out);
}

/* Each segment of `in` into out: an added token's as it is, a text segment through fn (with ctx). */
typedef int (*text_seg_fn)(const void *ctx, seg g, seg_list *out);
static int map_text_segments(const seg_list *in, text_seg_fn fn, const void *ctx, seg_list *out) {
  out->n = 0;
  for (size_t k = 0; k < in->n; k++) {
    seg g = in->v[k];
    int rc = g.id >= 0 ? seg_push(out, g.off, g.len, g.id) : fn(ctx, g, out);
    if (rc) return rc;
  }
  return 0;
}

typedef struct split_ctx {
  const servd_tokenizer *t;
  const uint8_t *s;
  bool normalized;
  pcre2_match_data *md;
} split_ctx;

/* Text segment g split by the added tokens whose `normalized` flag is c->normalized. */
static int split_text(const void *ctx, seg g, seg_list *out) {
  const split_ctx *c = ctx;
  const servd_tokenizer *t = c->t;
  const uint8_t *s = c->s;
  bool normalized = c->normalized;
  pcre2_match_data *md = c->md;
  size_t lo = g.off, hi = (size_t)g.off + g.len, text_start = lo, p = lo;
  while (p < hi) {
    if (!t->added_first[s[p]]) {
      p++;
      continue;
    }
    const added_token *hit = NULL;
    for (int i = 0; i < t->n_added; i++) { /* sorted by first byte, longest first */
      const added_token *a = &t->added[i];
      if ((uint8_t)a->match[0] != s[p] || a->normalized != normalized) continue;
      if (a->match_len > hi - p || memcmp(a->match, s + p, a->match_len)) continue;
      /* the neighbours are looked at within this segment, as Hugging Face's split does */
      size_t end = p + a->match_len;
      if (a->single_word && (word_before(t, md, s, lo, p) || (end < hi && word_at(t, md, s, end, hi)))) continue;
      hit = a;
      break;
    }
    if (!hit) {
      p++;
      continue;
    }
    size_t start = p, stop = p + hit->match_len;
    if (hit->lstrip) start = ws_back(s, text_start, start);
    if (hit->rstrip) stop = ws_fwd(s, stop, hi);
    int rc = seg_push(out, (uint32_t)text_start, (uint32_t)(start - text_start), -1);
    if (!rc) rc = seg_push(out, (uint32_t)start, (uint32_t)(stop - start), hit->id);
    if (rc) return rc;
    text_start = p = stop;
  }
  return seg_push(out, (uint32_t)text_start, (uint32_t)(hi - text_start), -1);
}

/* Splits the text segments of `in` by the added tokens whose `normalized` flag equals `normalized`. */
static int split_added(const servd_tokenizer *t, const uint8_t *s, const seg_list *in, bool normalized,
                       pcre2_match_data *md, seg_list *out) {
  split_ctx c = {t, s, normalized, md};
  return map_text_segments(in, split_text, &c, out);
}

/* Copy of s with each maximal invalid UTF-8 subpart replaced by U+FFFD. */
static int sanitize(const uint8_t *s, size_t n, size_t first_bad, tok_buf *out) {
  int rc = tok_buf_reserve(out, n * 3 + 1);
  if (rc) return rc;
  memcpy(out->p, s, first_bad);
  out->len = first_bad;
  for (size_t i = first_bad; i < n;) {
    size_t l;
    int k = utf8__classify(s + i, n - i, &l);
    if (k == UTF8_VALID) {
      memcpy(out->p + out->len, s + i, l);
      out->len += l;
    } else {
      memcpy(out->p + out->len, "\xEF\xBF\xBD", 3);
      out->len += 3;
    }
    i += l;
  }
  return 0;
}

typedef struct normalize_ctx {
  const servd_tokenizer *t;
  const uint8_t *s;
  tok_buf *buf;
} normalize_ctx;

/* Text segment g normalized onto the end of c->buf; the segment pushed has its offsets into buf. */
static int normalize_text(const void *ctx, seg g, seg_list *out) {
  const normalize_ctx *c = ctx;
  size_t start = c->buf->len;
  int rc = tok__normalize(c->t, c->s + g.off, g.len, c->buf);
  if (!rc && c->buf->len > (size_t)INT_MAX / 2)
    rc = servd_fail(SERVD_ERANGE, "tokenizer: encode: normalized text too long");
  if (!rc) rc = seg_push(out, (uint32_t)start, (uint32_t)(c->buf->len - start), -1);
  return rc;
}

/* The text segments of `in` normalized into buf (added-token segments kept); offsets into buf. */
static int normalize_segments(const servd_tokenizer *t, const uint8_t *s, const seg_list *in, tok_buf *buf,
                              seg_list *out) {
  buf->len = 0;
  normalize_ctx c = {t, s, buf};
  return map_text_segments(in, normalize_text, &c, out);
}

/* The Metaspace text in m as w->a spans: whole, or split before each replacement character. */
static int meta_split(const servd_tokenizer *t, const tok_buf *m, tok_work *w) {
  size_t need = t->meta_split ? m->len + 1 : 1;
  if (need > w->a_cap) {
    span *a = realloc(w->a, need * sizeof *a);
    if (!a) return servd_fail(SERVD_ENOMEM, "tokenizer: out of memory");
    w->a = a;
    w->a_cap = need;
  }
  w->na = 0;
  if (!m->len) return 0;
  if (!t->meta_split) {
    w->a[w->na++] = (span){0, (uint32_t)m->len};
    return 0;
  }
  size_t start = 0, rl = t->meta_rep_len;
  for (size_t i = 1; i + rl <= m->len; i++) {
    if (!memcmp(m->p + i, t->meta_rep, rl)) {
      w->a[w->na++] = (span){(uint32_t)start, (uint32_t)(i - start)};
      start = i;
      i += rl - 1;
    }
  }
  w->a[w->na++] = (span){(uint32_t)start, (uint32_t)(m->len - start)};
  return 0;
}

/* The ids of text (no post_processor specials), appended to *out (n_out used of cap). */
static int encode_text(const servd_tokenizer *t, const char *text, size_t len, int32_t **outp, size_t *n_outp,
                       size_t *capp) {
  int rc = 0;
  tok_work w = {0};
  tok_buf clean = {0};
  seg_list s1 = {0}, s2 = {0};
  tok_buf norm = {0}, meta = {0};
  int32_t *out = *outp;
  size_t n_out = *n_outp, cap = *capp;
  bool locked = false;
  word_cache *cache = (word_cache *)&t->cache; /* the one mutable part, behind its lock */
  if (!text && len) return servd_fail(SERVD_EINVAL, "tokenizer: encode: text is NULL");
  if (len > (size_t)INT_MAX / 4)
    return servd_fail(SERVD_ERANGE, "tokenizer: encode: text of %zu bytes is too long", len);

  const uint8_t *s = (const uint8_t *)text;
  size_t bad = utf8__first_invalid(s, len);
  if (bad != (size_t)-1) {
    if ((rc = sanitize(s, len, bad, &clean))) goto fail;
    s = (const uint8_t *)clean.p;
    len = clean.len;
  }
  if (cap - n_out < len / 3 + 16) {
    cap = n_out + len / 3 + 16;
    int32_t *o = realloc(out, cap * sizeof *o);
    if (!o) {
      rc = servd_fail(SERVD_ENOMEM, "tokenizer: out of memory");
      goto fail;
    }
    out = o;
  }

  /* added tokens matched in the raw text, the normalizer, added tokens matched in its output; each
   * stage reads *cur and writes *spare, then they swap */
  seg_list *cur = &s1, *spare = &s2, *x;
  if ((rc = seg_push(cur, 0, (uint32_t)len, -1))) goto fail;
  if (t->n_added) {
    if (t->word_re && !(w.md = pcre2_match_data_create(4, NULL))) {
      rc = servd_fail(SERVD_ENOMEM, "tokenizer: out of memory");
      goto fail;
    }
    if ((rc = split_added(t, s, cur, false, w.md, spare))) goto fail;
    x = cur, cur = spare, spare = x;
  }
  if (t->n_norm || t->wp.norm.on) {
    if ((rc = normalize_segments(t, s, cur, &norm, spare))) goto fail;
    s = (const uint8_t *)norm.p;
    x = cur, cur = spare, spare = x;
  }
  if (t->n_added) {
    if ((rc = split_added(t, s, cur, true, w.md, spare))) goto fail;
    x = cur, cur = spare, spare = x;
  }

  locked = pthread_mutex_trylock(&cache->lock) == 0;
  for (size_t k = 0; k < cur->n; k++) {
    seg g = cur->v[k];
    if (g.id >= 0) {
      if (n_out == cap) {
        int32_t *o = realloc(out, (cap *= 2) * sizeof *o);
        if (!o) {
          rc = servd_fail(SERVD_ENOMEM, "tokenizer: out of memory");
          goto fail;
        }
        out = o;
      }
      out[n_out++] = g.id;
      continue;
    }
    if (t->wordpiece) {
      if ((rc = wp__encode(t, s + g.off, g.len, locked ? cache : NULL, &meta, &out, &n_out, &cap))) goto fail;
      continue;
    }
    const char *base;
    if (t->metaspace) {
      meta.len = 0;
      if ((rc = spm__metaspace(t, s + g.off, g.len, g.off == 0, &meta)) || (rc = meta_split(t, &meta, &w))) goto fail;
      base = meta.p;
    } else if ((rc = pre__run(t->steps, t->n_steps, (const char *)s + g.off, g.len, &w, &base))) {
      goto fail;
    }
    for (size_t i = 0; i < w.na; i++) {
      const uint8_t *p = (const uint8_t *)base + w.a[i].off;
      size_t pl = w.a[i].len;
      if (locked && pl <= CACHE_MAX_PIECE) {
        int nc;
        const int32_t *c = word_cache_get(cache, p, pl, &nc);
        if (c) {
          if (n_out + (size_t)nc > cap) {
            while (n_out + (size_t)nc > cap) cap *= 2;
            int32_t *o = realloc(out, cap * sizeof *o);
            if (!o) {
              rc = servd_fail(SERVD_ENOMEM, "tokenizer: out of memory");
              goto fail;
            }
            out = o;
          }
          memcpy(out + n_out, c, (size_t)nc * sizeof *c);
          n_out += (size_t)nc;
          continue;
        }
      }
      size_t before = n_out;
      if ((rc = bpe__encode_word(t, p, pl, &w, &out, &n_out, &cap))) goto fail;
      if (locked && pl <= CACHE_MAX_PIECE) word_cache_put(cache, p, pl, out + before, (int)(n_out - before));
    }
  }
  if (n_out > INT_MAX / 2) rc = servd_fail(SERVD_ERANGE, "tokenizer: encode: too many tokens");
fail:
  if (locked) pthread_mutex_unlock(&cache->lock);
  *outp = out;
  *n_outp = n_out;
  *capp = cap;
  free(clean.p);
  free(s1.v);
  free(s2.v);
  free(norm.p);
  free(meta.p);
  tok_work_free(&w);
  return rc;
}

int servd_tokenizer_encode(const servd_tokenizer *t, const char *text, size_t len, bool add_special, int32_t **ids,
                           int *n) {
  *ids = NULL;
  *n = 0;
  size_t n_out = 0, cap = (size_t)t->n_prefix + (size_t)t->n_suffix + 16;
  int32_t *out = malloc(cap * sizeof *out);
  if (!out) return servd_fail(SERVD_ENOMEM, "tokenizer: out of memory");
  if (add_special)
    for (int i = 0; i < t->n_prefix; i++) out[n_out++] = t->prefix_ids[i];
  int rc = encode_text(t, text, len, &out, &n_out, &cap);
  if (!rc && add_special && t->n_suffix) {
    int32_t *o = realloc(out, (n_out + (size_t)t->n_suffix + 1) * sizeof *o);
    if (!o) {
      rc = servd_fail(SERVD_ENOMEM, "tokenizer: out of memory");
    } else {
      out = o;
      for (int i = 0; i < t->n_suffix; i++) out[n_out++] = t->suffix_ids[i];
    }
  }
  if (rc) {
    free(out);
    return rc;
  }
  *ids = out;
  *n = (int)n_out;
  return 0;
}

/* Hugging Face's LongestFirst truncation of a pair to `room` tokens: the shorter side is kept whole
 * when the longer can take the rest, else each gets half (the second the odd token). */
static void truncate_longest_first(size_t *na, size_t *nb, size_t room) {
  if (*na + *nb <= room) return;
  bool swap = *na > *nb;
  size_t n1 = swap ? *nb : *na, n2;
  n2 = n1 > room ? n1 : (n1 > room - n1 ? n1 : room - n1);
  if (n1 + n2 > room) {
    n1 = room / 2;
    n2 = n1 + room % 2;
  }
  size_t a = swap ? n2 : n1, b = swap ? n1 : n2;
  if (a < *na) *na = a;
  if (b < *nb) *nb = b;
}

int servd_tokenizer_encode_pair(const servd_tokenizer *t, const char *a, size_t alen, const char *b, size_t blen,
                                int max_len, int32_t **ids, int32_t **type_ids, int *n) {
  *ids = NULL;
  if (type_ids) *type_ids = NULL;
  *n = 0;
  const tok_template *tp = &t->pair;
  if (!t->has_pair)
    return servd_fail(SERVD_EUNSUPPORTED, "tokenizer: encode_pair: the post_processor has no pair template");
  int32_t *ta = NULL, *tb = NULL, *out = NULL, *types = NULL;
  size_t na = 0, nb = 0, ca = 16, cb = 16;
  int rc = 0;
  ta = malloc(ca * sizeof *ta);
  tb = malloc(cb * sizeof *tb);
  if (!ta || !tb) {
    rc = servd_fail(SERVD_ENOMEM, "tokenizer: out of memory");
    goto done;
  }
  if ((rc = encode_text(t, a, alen, &ta, &na, &ca)) || (rc = encode_text(t, b, blen, &tb, &nb, &cb))) goto done;
  if (max_len > 0) {
    if (max_len < tp->n + 2) {
      rc = servd_fail(SERVD_ERANGE, "tokenizer: encode_pair: max_len %d leaves no room beside %d special tokens",
                      max_len, tp->n);
      goto done;
    }
    truncate_longest_first(&na, &nb, (size_t)max_len - (size_t)tp->n);
  }
  size_t total = na + nb + (size_t)tp->n, o = 0;
  out = malloc((total + 1) * sizeof *out);
  types = malloc((total + 1) * sizeof *types);
  if (!out || !types) {
    rc = servd_fail(SERVD_ENOMEM, "tokenizer: out of memory");
    goto done;
  }
  for (int i = 0; i <= tp->n; i++) {
    if (i == tp->a_at)
      for (size_t k = 0; k < na; k++) out[o] = ta[k], types[o++] = tp->a_type;
    if (i == tp->b_at)
      for (size_t k = 0; k < nb; k++) out[o] = tb[k], types[o++] = tp->b_type;
    if (i < tp->n) out[o] = tp->ids[i], types[o++] = tp->types[i];
  }
  *ids = out;
  *n = (int)o;
  out = NULL;
  if (type_ids) *type_ids = types, types = NULL;
done:
  free(ta);
  free(tb);
  free(out);
  free(types);
  return rc;
}

bool servd_tokenizer_has_pair_template(const servd_tokenizer *t) { return t->has_pair; }
