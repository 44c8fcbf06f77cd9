/* Server-Sent Events framing (the WHATWG "event stream" format): lines end in LF, CRLF or CR; a
 * blank line ends an event; "data:" lines are joined with LF; other fields and ":" comments are
 * ignored, since OpenAI-compatible servers put everything in data. */
#include <stdlib.h>
#include <string.h>

#include "bench.h"

void bench_sse_init(bench_sse *s, size_t max_len) {
  memset(s, 0, sizeof *s);
  s->max_len = max_len;
}

void bench_sse_reset(bench_sse *s) {
  s->line_len = 0;
  s->data_len = 0;
  s->has_data = false;
  s->last_cr = false;
}

void bench_sse_free(bench_sse *s) {
  if (!s) return;
  free(s->line);
  free(s->data);
  s->line = s->data = NULL;
  s->line_cap = s->data_cap = 0;
  bench_sse_reset(s);
}

/* Grows *buf to hold need+1 bytes; buffers are reused across events, so this rarely allocates. */
static int reserve(char **buf, size_t *cap, size_t need, size_t max_len) {
  if (need + 1 <= *cap) return 0;
  if (need > max_len) return -1;
  size_t n = *cap ? *cap : 256;
  while (n < need + 1) n *= 2;
  char *p = realloc(*buf, n);
  if (!p) return -1;
  *buf = p;
  *cap = n;
  return 0;
}

static int end_line(bench_sse *s, bench_sse_cb cb, void *ctx) {
  const char *l = s->line;
  size_t n = s->line_len;
  if (n == 0) { /* blank line: dispatch */
    int rc = 0;
    if (s->has_data) {
      s->data[s->data_len] = '\0';
      rc = cb(ctx, s->data, s->data_len);
    }
    s->data_len = 0;
    s->has_data = false;
    return rc;
  }
  if (n >= 5 && memcmp(l, "data", 4) == 0 && l[4] == ':') {
    const char *v = l + 5;
    size_t vn = n - 5;
    if (vn && *v == ' ') v++, vn--;
    size_t extra = s->has_data ? 1 : 0;
    if (reserve(&s->data, &s->data_cap, s->data_len + extra + vn, s->max_len)) return -1;
    if (extra) s->data[s->data_len++] = '\n';
    memcpy(s->data + s->data_len, v, vn);
    s->data_len += vn;
    s->has_data = true;
  } else if (n == 4 && memcmp(l, "data", 4) == 0) {
    s->has_data = true; /* "data" alone is an empty data line */
  }
  return 0;
}

int bench_sse_feed(bench_sse *s, const char *buf, size_t len, bench_sse_cb cb, void *ctx) {
  for (size_t i = 0; i < len; i++) {
    char c = buf[i];
    bool after_cr = s->last_cr;
    s->last_cr = (c == '\r');
    if (c == '\n' && after_cr) continue; /* second half of a CRLF whose CR ended the line */
    if (c == '\r' || c == '\n') {
      int rc = end_line(s, cb, ctx);
      s->line_len = 0;
      if (rc) return rc;
      continue;
    }
    if (reserve(&s->line, &s->line_cap, s->line_len + 1, s->max_len)) return -1;
    s->line[s->line_len++] = c;
  }
  return 0;
}
