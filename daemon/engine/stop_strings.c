/* Stop strings over a stream of text deltas: see stop_strings.h. */
#include "engine/stop_strings.h"

#include <stdlib.h>
#include <string.h>

#include "servd/status.h"

static int reserve(char **buf, size_t *cap, size_t need) {
  if (need <= *cap) return 0;
  size_t c = *cap ? *cap : 64;
  while (c < need) c *= 2;
  char *p = realloc(*buf, c);
  if (!p) return servd_fail(SERVD_ENOMEM, "stop strings: buffer of %zu bytes", c);
  *buf = p;
  *cap = c;
  return 0;
}

int servd_stopper_init(servd_stopper *s, const char *const *stops, int n) {
  memset(s, 0, sizeof *s);
  if (n <= 0) return 0;
  s->stops = calloc((size_t)n, sizeof *s->stops);
  s->lens = calloc((size_t)n, sizeof *s->lens);
  if (!s->stops || !s->lens) goto nomem;
  for (int i = 0; i < n; i++) {
    if (!stops[i] || !stops[i][0]) continue;
    s->stops[s->n] = strdup(stops[i]);
    if (!s->stops[s->n]) goto nomem;
    s->lens[s->n] = strlen(stops[i]);
    s->n++;
  }
  return 0;
nomem:
  servd_stopper_free(s);
  return servd_fail(SERVD_ENOMEM, "stop strings: copying %d strings", n);
}

void servd_stopper_free(servd_stopper *s) {
  if (!s) return;
  for (int i = 0; i < s->n; i++) free(s->stops[i]);
  free(s->stops);
  free(s->lens);
  free(s->held);
  free(s->out);
  memset(s, 0, sizeof *s);
}

/* Longest suffix of buf[0,n) that is a proper prefix of some stop string. */
static size_t held_suffix(const servd_stopper *s, const char *buf, size_t n) {
  size_t best = 0;
  for (int i = 0; i < s->n; i++) {
    size_t m = s->lens[i] - 1 < n ? s->lens[i] - 1 : n;
    for (size_t k = m; k > best; k--)
      if (memcmp(buf + n - k, s->stops[i], k) == 0) {
        best = k;
        break;
      }
  }
  return best;
}

static int release(servd_stopper *s, size_t n) {
  if (reserve(&s->out, &s->cap_out, n + 1)) return SERVD_ENOMEM;
  if (n) memcpy(s->out, s->held, n);
  s->out[n] = 0;
  if (s->n_held > n) memmove(s->held, s->held + n, s->n_held - n);
  s->n_held -= n;
  return 0;
}

int servd_stopper_push(servd_stopper *s, const char *delta, size_t len, const char **text, size_t *text_len,
                       bool *stopped) {
  *stopped = false;
  if (s->n == 0) { /* nothing to watch: pass through */
    *text = delta;
    *text_len = len;
    return 0;
  }
  if (reserve(&s->held, &s->cap_held, s->n_held + len)) return SERVD_ENOMEM;
  memcpy(s->held + s->n_held, delta, len);
  s->n_held += len;
  /* Earliest stop string occurrence wins. */
  size_t at = (size_t)-1;
  for (int i = 0; i < s->n; i++) {
    const char *p = memmem(s->held, s->n_held, s->stops[i], s->lens[i]);
    if (p && (size_t)(p - s->held) < at) at = (size_t)(p - s->held);
  }
  size_t n;
  if (at != (size_t)-1) {
    n = at;
    *stopped = true;
  } else {
    n = s->n_held - held_suffix(s, s->held, s->n_held);
  }
  if (release(s, n)) return SERVD_ENOMEM;
  if (*stopped) s->n_held = 0;
  *text = s->out;
  *text_len = n;
  return 0;
}

int servd_stopper_flush(servd_stopper *s, const char **text, size_t *text_len) {
  size_t n = s->n_held;
  if (release(s, n)) return SERVD_ENOMEM;
  *text = s->out ? s->out : "";
  *text_len = n;
  return 0;
}
