/* The pre-tokenizer pipeline: each step splits every current piece further (as Hugging Face's
 * PreTokenizedString::split does), so a regex never sees across the boundary of an earlier split. */
#include <stdlib.h>
#include <string.h>

#include "tokenizer-impl.h"

int pre__compile(const char *pattern, size_t len, bool literal, const char *field, pcre2_code **out) {
  int err;
  PCRE2_SIZE eoff;
  uint32_t opts = PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK | (literal ? PCRE2_LITERAL : 0);
  pcre2_code *re = pcre2_compile((PCRE2_SPTR)pattern, len, opts, &err, &eoff, NULL);
  if (!re) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    return servd_fail(SERVD_EUNSUPPORTED, "tokenizer.json: %s: pattern \"%.*s\" does not compile at offset %zu: %s",
                      field, (int)(len > 200 ? 200 : len), pattern, (size_t)eoff, (char *)msg);
  }
  /* JIT is an optimization; without it pcre2_match interprets the same pattern. */
  (void)pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);
  *out = re;
  return 0;
}

static int grow(void **p, size_t *cap, size_t need, size_t elem) {
  if (need <= *cap) return 0;
  size_t c = *cap ? *cap : 64;
  while (c < need) c *= 2;
  void *n = realloc(*p, c * elem);
  if (!n) return servd_fail(SERVD_ENOMEM, "tokenizer: out of memory (%zu pieces)", c);
  *p = n;
  *cap = c;
  return 0;
}

static int push_span(tok_work *w, size_t *nb, uint32_t off, uint32_t len) {
  if (!len) return 0;
  int rc = grow((void **)&w->b, &w->b_cap, *nb + 1, sizeof(span));
  if (rc) return rc;
  w->b[(*nb)++] = (span){off, len};
  return 0;
}

static int push_part(tok_work *w, size_t *np, uint32_t s, uint32_t e, bool match) {
  if (s == e) return 0;
  int rc = grow((void **)&w->parts, &w->parts_cap, *np + 1, sizeof(part));
  if (rc) return rc;
  w->parts[(*np)++] = (part){s, e, match};
  return 0;
}

/* Finds all matches of re in base[off..off+len) as alternating gap/match parts (absolute offsets). */
static int find_parts(const pcre2_code *re, const char *base, uint32_t off, uint32_t len, bool invert, tok_work *w,
                      size_t *np) {
  const PCRE2_SPTR subj = (PCRE2_SPTR)(base + off);
  size_t pos = 0, prev = 0;
  *np = 0;
  while (pos <= len) {
    int rc = pcre2_match(re, subj, len, pos, PCRE2_NO_UTF_CHECK, w->md, w->mctx);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT && !w->jit) {
      w->jit = pcre2_jit_stack_create(64 * 1024, 8 * 1024 * 1024, NULL);
      if (!w->jit) return servd_fail(SERVD_ENOMEM, "tokenizer: out of memory for the regex stack");
      pcre2_jit_stack_assign(w->mctx, NULL, w->jit);
      continue;
    }
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(rc, msg, sizeof msg);
      return servd_fail(SERVD_EINVAL, "tokenizer: pre-tokenizer regex failed on a piece of %u bytes: %s", len,
                        (char *)msg);
    }
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(w->md);
    size_t s = ov[0], e = ov[1];
    if (s == e) { /* empty match: nothing to split; step over one character */
      pos = e + 1;
      while (pos < len && (subj[pos] & 0xC0) == 0x80) pos++;
      continue;
    }
    int r = push_part(w, np, off + (uint32_t)prev, off + (uint32_t)s, invert);
    if (!r) r = push_part(w, np, off + (uint32_t)s, off + (uint32_t)e, !invert);
    if (r) return r;
    prev = pos = e;
  }
  return push_part(w, np, off + (uint32_t)prev, off + len, invert);
}

static int split_step(const pre_step *st, const char *base, tok_work *w) {
  size_t nb = 0;
  for (size_t i = 0; i < w->na; i++) {
    size_t np;
    int rc = find_parts(st->re, base, w->a[i].off, w->a[i].len, st->invert, w, &np);
    if (rc) return rc;
    part *p = w->parts;
    size_t first = nb; /* pieces of this span start here */
    switch (st->behavior) {
    case SPLIT_ISOLATED:
      for (size_t k = 0; k < np && !rc; k++) rc = push_span(w, &nb, p[k].start, p[k].end - p[k].start);
      break;
    case SPLIT_REMOVED:
      for (size_t k = 0; k < np && !rc; k++)
        if (!p[k].match) rc = push_span(w, &nb, p[k].start, p[k].end - p[k].start);
      break;
    case SPLIT_MERGED_PREV: {
      bool prev_match = false;
      for (size_t k = 0; k < np && !rc; k++) {
        if (p[k].match && !prev_match && nb > first) w->b[nb - 1].len = p[k].end - w->b[nb - 1].off;
        else rc = push_span(w, &nb, p[k].start, p[k].end - p[k].start);
        prev_match = p[k].match;
      }
      break;
    }
    case SPLIT_MERGED_NEXT: {
      /* Hugging Face folds from the right: a match joins the part after it unless that part is a
       * match too. Walk backwards into the tail of b, then reverse the pieces of this span. */
      bool next_match = false;
      for (size_t k = np; k-- > 0 && !rc;) {
        if (p[k].match && !next_match && nb > first) {
          span *last = &w->b[nb - 1];
          last->len += last->off - p[k].start;
          last->off = p[k].start;
        } else {
          rc = push_span(w, &nb, p[k].start, p[k].end - p[k].start);
        }
        next_match = p[k].match;
      }
      for (size_t x = first, y = nb; x + 1 < y; x++, y--) {
        span t = w->b[x];
        w->b[x] = w->b[y - 1];
        w->b[y - 1] = t;
      }
      break;
    }
    case SPLIT_CONTIGUOUS: {
      bool prev_match = false;
      for (size_t k = 0; k < np && !rc; k++) {
        if (p[k].match == prev_match && nb > first) w->b[nb - 1].len = p[k].end - w->b[nb - 1].off;
        else rc = push_span(w, &nb, p[k].start, p[k].end - p[k].start);
        prev_match = p[k].match;
      }
      break;
    }
    }
    if (rc) return rc;
  }
  span *t = w->a;
  size_t tc = w->a_cap;
  w->a = w->b, w->a_cap = w->b_cap, w->na = nb;
  w->b = t, w->b_cap = tc;
  return 0;
}

/* ByteLevel(add_prefix_space): every piece not starting with a space gets one, so the text is
 * rebuilt with the inserted bytes. */
static int prefix_space_step(const char **base, tok_work *w) {
  tok_buf nt = {0};
  size_t extra = 0;
  for (size_t i = 0; i < w->na; i++) extra += w->a[i].len + 1;
  int rc = tok_buf_reserve(&nt, extra + 1);
  if (rc) return rc;
  for (size_t i = 0; i < w->na; i++) {
    const char *s = *base + w->a[i].off;
    uint32_t off = (uint32_t)nt.len;
    if (s[0] != ' ') nt.p[nt.len++] = ' ';
    memcpy(nt.p + nt.len, s, w->a[i].len);
    nt.len += w->a[i].len;
    w->a[i] = (span){off, (uint32_t)(nt.len - off)};
  }
  free(w->text.p);
  w->text = nt;
  *base = w->text.p;
  return 0;
}

int pre__run(const pre_step *steps, int n_steps, const char *text, size_t len, tok_work *w, const char **base) {
  if (len > UINT32_MAX / 2) return servd_fail(SERVD_ERANGE, "tokenizer: text of %zu bytes is too long", len);
  int rc = grow((void **)&w->a, &w->a_cap, 1, sizeof(span));
  if (rc) return rc;
  *base = text;
  w->na = 0;
  if (len) w->a[w->na++] = (span){0, (uint32_t)len};
  if (!w->md) w->md = pcre2_match_data_create(4, NULL);
  if (!w->mctx) w->mctx = pcre2_match_context_create(NULL);
  if (!w->md || !w->mctx) return servd_fail(SERVD_ENOMEM, "tokenizer: out of memory for regex match data");
  for (int i = 0; i < n_steps && w->na; i++) {
    const pre_step *st = &steps[i];
    if (st->kind == PRE_BYTELEVEL && st->add_prefix_space) {
      rc = prefix_space_step(base, w);
      if (rc) return rc;
    }
    if (st->re) {
      rc = split_step(st, *base, w);
      if (rc) return rc;
    }
  }
  return 0;
}

void tok_work_free(tok_work *w) {
  free(w->a);
  free(w->b);
  free(w->parts);
  pcre2_match_data_free(w->md);
  pcre2_match_context_free(w->mctx);
  if (w->jit) pcre2_jit_stack_free(w->jit);
  free(w->text.p);
  free(w->sym);
  free(w->heap);
  memset(w, 0, sizeof *w);
}
