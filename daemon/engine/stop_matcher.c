/* Stop strings (see stop_matcher.h). */
#include <stdlib.h>
#include <string.h>

#include "engine/stop_matcher.h"
#include "servd/status.h"

struct servd_stop_matcher {
  char **stops;
  size_t *lens;
  int n;
  size_t max_len;
  char *buf; /* held text + the new delta */
  size_t n_held, cap;
  char *out;
  size_t cap_out;
  bool stopped;
};

int servd_stop_matcher_create(const char *const *stops, int n, servd_stop_matcher **out) {
  *out = NULL;
  servd_stop_matcher *m = calloc(1, sizeof *m);
  if (!m) return servd_fail(SERVD_ENOMEM, "stop strings: out of memory");
  m->stops = calloc((size_t)(n > 0 ? n : 1), sizeof *m->stops);
  m->lens = calloc((size_t)(n > 0 ? n : 1), sizeof *m->lens);
  if (!m->stops || !m->lens) goto oom;
  for (int i = 0; i < n; i++) {
    if (!stops[i] || !*stops[i]) continue;
    size_t l = strlen(stops[i]);
    if (!(m->stops[m->n] = strdup(stops[i]))) goto oom;
    m->lens[m->n++] = l;
    if (l > m->max_len) m->max_len = l;
  }
  m->cap = m->cap_out = m->max_len + 256;
  m->buf = malloc(m->cap);
  m->out = malloc(m->cap_out);
  if (!m->buf || !m->out) goto oom;
  *out = m;
  return 0;
oom:
  servd_stop_matcher_free(m);
  return servd_fail(SERVD_ENOMEM, "stop strings: out of memory");
}

void servd_stop_matcher_free(servd_stop_matcher *m) {
  if (!m) return;
  for (int i = 0; i < m->n; i++) free(m->stops[i]);
  free(m->stops);
  free(m->lens);
  free(m->buf);
  free(m->out);
  free(m);
}

static int reserve(char **p, size_t *cap, size_t need) {
  if (need <= *cap) return 0;
  size_t c = *cap * 2 > need ? *cap * 2 : need;
  char *q = realloc(*p, c);
  if (!q) return servd_fail(SERVD_ENOMEM, "stop strings: out of memory");
  *p = q;
  *cap = c;
  return 0;
}

int servd_stop_matcher_push(servd_stop_matcher *m, const char *delta, size_t len, const char **text, size_t *text_len,
                            bool *stopped) {
  *text = m->out;
  *text_len = 0;
  *stopped = m->stopped;
  if (m->stopped) return 0;
  if (!m->n) { /* nothing to match: pass through */
    if (delta == m->out) {
      *text_len = len;
      return 0;
    }
    if (reserve(&m->buf, &m->cap, len + 1)) return SERVD_ENOMEM; /* delta may be our old output */
    memcpy(m->buf, delta, len);
    if (reserve(&m->out, &m->cap_out, len + 1)) return SERVD_ENOMEM;
    memcpy(m->out, m->buf, len);
    *text = m->out;
    *text_len = len;
    return 0;
  }
  /* delta may be this matcher's previous output: take it before `out` can move */
  if (reserve(&m->buf, &m->cap, m->n_held + len + 1)) return SERVD_ENOMEM;
  memcpy(m->buf + m->n_held, delta, len);
  if (reserve(&m->out, &m->cap_out, m->n_held + len + 1)) return SERVD_ENOMEM;
  size_t n = m->n_held + len;
  /* earliest occurrence of any stop string; held text holds no complete one */
  size_t first = n;
  for (int i = 0; i < m->n; i++) {
    const char *hit = memmem(m->buf, n, m->stops[i], m->lens[i]);
    if (hit && (size_t)(hit - m->buf) < first) first = (size_t)(hit - m->buf);
  }
  size_t release;
  if (first < n) {
    release = first;
    m->stopped = true;
    *stopped = true;
  } else {
    /* hold the longest suffix that is a proper prefix of a stop string */
    size_t hold = 0;
    for (int i = 0; i < m->n; i++) {
      size_t maxk = m->lens[i] - 1 < n ? m->lens[i] - 1 : n;
      for (size_t k = maxk; k > hold; k--)
        if (!memcmp(m->buf + n - k, m->stops[i], k)) {
          hold = k;
          break;
        }
    }
    release = n - hold;
  }
  memcpy(m->out, m->buf, release);
  m->n_held = m->stopped ? 0 : n - release;
  memmove(m->buf, m->buf + release, m->n_held);
  *text = m->out;
  *text_len = release;
  return 0;
}

int servd_stop_matcher_flush(servd_stop_matcher *m, const char **text, size_t *text_len) {
  memcpy(m->out, m->buf, m->n_held);
  *text = m->out;
  *text_len = m->n_held;
  m->n_held = 0;
  return 0;
}
