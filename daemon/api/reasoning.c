/* The thought/answer splitter: see reasoning.h. */
#include "api/reasoning.h"

#include <stdio.h>
#include <string.h>

static bool is_ws(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

bool api_think_init(api_think *t, const char *start, const char *end, bool opened) {
  memset(t, 0, sizeof *t);
  servd_buf_init(&t->pend);
  size_t ns = start ? strlen(start) : 0, ne = end ? strlen(end) : 0;
  if (ne == 0 || ne >= sizeof t->end || ns >= sizeof t->start || (ns == 0 && !opened)) return false;
  memcpy(t->start, start ? start : "", ns + 1);
  memcpy(t->end, end, ne + 1);
  t->phase = opened ? THINK_IN : THINK_MAYBE;
  t->skip_ws = opened;
  t->thought = opened;
  return true;
}

void api_think_free(api_think *t) {
  if (t) servd_buf_free(&t->pend);
}

/* The longest end of s[0, n) that is a proper prefix of m. */
static size_t partial_tail(const char *s, size_t n, const char *m) {
  size_t k = strlen(m) - 1;
  for (k = k < n ? k : n; k > 0; k--)
    if (!memcmp(s + n - k, m, k)) return k;
  return 0;
}

/* Drops leading whitespace while t->skip_ws; false when nothing is left to look at. */
static bool skip_leading(api_think *t) {
  if (!t->skip_ws) return t->pend.len > 0;
  size_t i = 0;
  while (i < t->pend.len && is_ws(t->pend.data[i])) i++;
  servd_buf_consume(&t->pend, i);
  if (t->pend.len == 0) return false;
  t->skip_ws = false;
  return true;
}

/* Emits the first n held bytes as kind and drops them. */
static void out(api_think *t, size_t n, bool thinking, api_think_emit emit, void *ud) {
  if (n) emit(ud, thinking, t->pend.data, n);
  servd_buf_consume(&t->pend, n);
}

int api_think_feed(api_think *t, const char *s, size_t n, bool final, api_think_emit emit, void *ud) {
  if (t->done) { /* after the end: answer, as it comes */
    if (n) emit(ud, false, s, n);
    return 0;
  }
  servd_buf_append(&t->pend, s, n);
  if (t->pend.oom) return -1;
  for (;;) {
    const char *p = t->pend.data;
    size_t len = t->pend.len;
    if (t->phase == THINK_MAYBE) {
      size_t i = 0;
      while (i < len && is_ws(p[i])) i++;
      size_t ns = strlen(t->start), rest = len - i;
      if (rest >= ns && !memcmp(p + i, t->start, ns)) {
        servd_buf_consume(&t->pend, i + ns);
        t->phase = THINK_IN;
        t->skip_ws = true;
        t->thought = true;
        continue;
      }
      if ((rest == 0 || !memcmp(p + i, t->start, rest)) && !final) break; /* could still be the marker */
      t->phase = THINK_OUT;                                               /* no thought: all answer */
      continue;
    }
    if (t->phase == THINK_IN) {
      if (!skip_leading(t)) break;
      p = t->pend.data;
      len = t->pend.len;
      size_t ne = strlen(t->end);
      const char *hit = memmem(p, len, t->end, ne);
      size_t upto = hit ? (size_t)(hit - p) : final ? len : len - partial_tail(p, len, t->end);
      size_t keep = upto;
      while (keep > 0 && is_ws(p[keep - 1])) keep--; /* whitespace before the end marker is dropped */
      if (hit) {
        out(t, keep, true, emit, ud);
        servd_buf_consume(&t->pend, upto - keep + ne);
        t->phase = THINK_OUT;
        t->skip_ws = true;
        continue;
      }
      out(t, keep, true, emit, ud);
      if (final) servd_buf_clear(&t->pend); /* trailing whitespace of a thought cut short */
      break;
    }
    /* THINK_OUT */
    if (skip_leading(t)) out(t, t->pend.len, false, emit, ud);
    break;
  }
  if (final) {
    t->done = true;
    servd_buf_clear(&t->pend);
  }
  return 0;
}
