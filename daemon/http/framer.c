#include "http/framer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "servd/status.h"

/* Here rather than in server.c so that the framer stands alone (the fuzz target links it alone). */
void servd_http_limits_default(servd_http_limits *l) {
  l->max_header_bytes = 16 * 1024;
  l->max_headers = 100;
  l->max_body_bytes = 8u << 20;
  l->request_timeout_ms = 30000;
  l->idle_timeout_ms = 60000;
  l->max_output_bytes = 4u << 20;
  l->max_input_bytes = 256u << 10;
  l->max_pipelined = 32;
  l->max_connections = 4096;
}

/* Fails the request from inside a callback: the parser stops and feed reports status and msg.
 * -1, not 1: from on_headers_complete, 1 would mean 'no body follows'. */
static int fail(servd_http_framer *f, int status, const char *msg) {
  f->err_status = status;
  f->err_msg = msg;
  return -1;
}

/* Notes a problem found while the head is still arriving; on_headers_complete reports the first.
 * Reporting it at once would depend on how the bytes were split: the parser hands a token to the
 * callbacks at its end or at the end of the data given, so a split could show this problem before
 * a syntax error that comes earlier in the same token. */
static int note(servd_http_framer *f, int status, const char *msg) {
  if (!f->bad_status) {
    f->bad_status = status;
    f->bad_msg = msg;
  }
  return 0;
}

static int hb_add(servd_http_framer *f, const char *at, size_t len) {
  f->header_bytes += len;
  if (f->header_bytes > f->lim.max_header_bytes) return fail(f, 431, "request header fields too large");
  servd_buf_append(&f->hbuf, at, len);
  return f->hbuf.oom ? 1 : 0;
}

static int on_message_begin(http_parser *p) {
  servd_http_framer *f = p->data;
  servd_buf_clear(&f->hbuf);
  servd_buf_clear(&f->body);
  f->n_headers = 0;
  f->in_value = false;
  f->header_bytes = 0;
  f->url_len = 0;
  f->err_status = 0;
  f->err_msg = NULL;
  f->bad_status = 0;
  f->in_trailer = false;
  if (f->on_begin) f->on_begin(f->ud);
  return 0;
}

static int on_url(http_parser *p, const char *at, size_t len) {
  servd_http_framer *f = p->data;
  int rc = hb_add(f, at, len);
  f->url_len += len;
  return rc;
}

/* Trailer fields of a chunked body come after the headers were handed out: storing them would
 * move hbuf under the pointers already taken into it, so they are only counted against the limit. */
static int trailer_add(servd_http_framer *f, size_t len) {
  f->header_bytes += len;
  if (f->header_bytes > f->lim.max_header_bytes) return fail(f, 431, "request header fields too large");
  return 0;
}

static int on_header_field(http_parser *p, const char *at, size_t len) {
  servd_http_framer *f = p->data;
  if (f->in_trailer) return trailer_add(f, len);
  /* The lenient parser lets SP into names (and a line that starts with one after the request line). */
  if (memchr(at, ' ', len) || memchr(at, '\t', len)) note(f, 400, "whitespace in a header field name");
  if (f->n_headers == 0 && !f->in_value && f->hbuf.len == f->url_len) {
    servd_buf_append(&f->hbuf, "", 1); /* terminate the url */
  }
  if (f->in_value || f->n_headers == 0) {
    if (f->in_value) servd_buf_append(&f->hbuf, "", 1); /* terminate the previous value */
    if (f->n_headers >= f->lim.max_headers) {
      f->err_status = 431;
      return 1;
    }
    f->hoff[f->n_headers][0] = f->hbuf.len;
    f->hoff[f->n_headers][1] = 0;
    f->n_headers++;
    f->in_value = false;
  }
  return hb_add(f, at, len);
}

/* True when the value at `at` continues a header line by obsolete line folding: the parser marks
 * a folded part right after the line break (with or without its leading whitespace), a field's
 * first part after its colon. */
static bool folded(const servd_http_framer *f, const char *at) {
  const char *q = at;
  while (q > f->feed_start && (q[-1] == ' ' || q[-1] == '\t')) q--;
  char before = q > f->feed_start ? q[-1] : f->last_byte;
  return before == '\n';
}

static int on_header_value(http_parser *p, const char *at, size_t len) {
  servd_http_framer *f = p->data;
  if (f->in_trailer) return trailer_add(f, len);
  /* An empty value is reported (len 0) at the next line's first byte: no fold there. */
  if (len > 0 && folded(f, at)) note(f, 400, "obsolete line folding in a header field");
  if (!f->in_value) {
    servd_buf_append(&f->hbuf, "", 1); /* terminate the name */
    f->hoff[f->n_headers - 1][1] = f->hbuf.len;
    f->in_value = true;
  }
  return hb_add(f, at, len);
}

/* "chunked", in any case, with optional whitespace around it. */
static bool te_is_chunked(const char *v) {
  while (*v == ' ' || *v == '\t') v++;
  if (strncasecmp(v, "chunked", 7) != 0) return false;
  for (v += 7; *v == ' ' || *v == '\t'; v++) {}
  return *v == '\0';
}

static int on_headers_complete(http_parser *p) {
  servd_http_framer *f = p->data;
  if (f->n_headers == 0) servd_buf_append(&f->hbuf, "", 1);
  else if (f->in_value) servd_buf_append(&f->hbuf, "", 1);
  else { /* a name without a value */ servd_buf_append(&f->hbuf, "", 1);
    f->hoff[f->n_headers - 1][1] = f->hbuf.len;
    servd_buf_append(&f->hbuf, "", 1);
  }
  if (f->hbuf.oom) return -1; /* 1 would mean 'no body follows' */
  f->in_trailer = true;
  f->keep_alive = http_should_keep_alive(p) != 0;
  f->expect_continue = false;
  if (f->bad_status) return fail(f, f->bad_status, f->bad_msg);
  if (p->http_major != 1) return fail(f, 505, "HTTP version not supported");
  int n_te = 0;
  for (int i = 0; i < f->n_headers; i++) {
    f->headers[i].name = f->hbuf.data + f->hoff[i][0];
    f->headers[i].value = f->hbuf.data + f->hoff[i][1];
    if (strcasecmp(f->headers[i].name, "expect") == 0 && strcasecmp(f->headers[i].value, "100-continue") == 0)
      f->expect_continue = true;
    if (strcasecmp(f->headers[i].name, "transfer-encoding") == 0) {
      /* Only chunked is decoded: anything else would hand the handler coded bytes as the body. */
      if (++n_te > 1) return fail(f, 400, "more than one Transfer-Encoding header field");
      if (!te_is_chunked(f->headers[i].value)) return fail(f, 501, "transfer coding not implemented");
      if (p->http_minor == 0) return fail(f, 400, "Transfer-Encoding in an HTTP/1.0 request");
    }
  }
  if ((p->flags & F_CONTENTLENGTH) && p->content_length > f->lim.max_body_bytes)
    return fail(f, 413, "request body too large");
  if (f->expect_continue && f->on_continue) f->on_continue(f->ud);
  f->head = p->method == HTTP_HEAD;
  return 0;
}

static int on_body(http_parser *p, const char *at, size_t len) {
  servd_http_framer *f = p->data;
  /* chunked uploads have no Content-Length to check up front */
  if (f->body.len + len > f->lim.max_body_bytes) return fail(f, 413, "request body too large");
  servd_buf_append(&f->body, at, len);
  return f->body.oom ? 1 : 0;
}

/* A chunk's size is known before its data: one past the limit fails now rather than after the
 * client sent (or, for an absurd size, never sent) that much. */
static int on_chunk_header(http_parser *p) {
  servd_http_framer *f = p->data;
  if (p->content_length > f->lim.max_body_bytes - f->body.len) return fail(f, 413, "request body too large");
  return 0;
}

static int on_message_complete(http_parser *p) {
  servd_http_framer *f = p->data;
  if (f->on_complete) f->on_complete(f->ud);
  /* Stop here: the next pipelined request is parsed after this one's response. */
  http_parser_pause(p, 1);
  return 0;
}

static const http_parser_settings settings = {
    .on_message_begin = on_message_begin,
    .on_url = on_url,
    .on_header_field = on_header_field,
    .on_header_value = on_header_value,
    .on_headers_complete = on_headers_complete,
    .on_body = on_body,
    .on_chunk_header = on_chunk_header,
    .on_message_complete = on_message_complete,
};

int servd_http_framer_init(servd_http_framer *f, const servd_http_limits *lim) {
  memset(f, 0, sizeof(*f));
  if (lim) f->lim = *lim;
  else servd_http_limits_default(&f->lim);
  if (f->lim.max_headers < 1) f->lim.max_headers = 1;
  f->hoff = calloc((size_t)f->lim.max_headers + 1, sizeof(*f->hoff));
  f->headers = calloc((size_t)f->lim.max_headers + 1, sizeof(*f->headers));
  if (!f->hoff || !f->headers) return servd_fail(SERVD_ENOMEM, "http framer: out of memory");
  http_parser_init(&f->parser, HTTP_REQUEST);
  f->parser.data = f;
  return 0;
}

void servd_http_framer_free(servd_http_framer *f) {
  if (!f) return;
  servd_buf_free(&f->hbuf);
  servd_buf_free(&f->body);
  free(f->hoff);
  free(f->headers);
  f->hoff = NULL;
  f->headers = NULL;
}

servd_frame_result servd_http_framer_feed(servd_http_framer *f, const char *data, size_t len, size_t *consumed,
                                          int *status, char *msg, size_t cap) {
  f->feed_start = data;
  size_t n = http_parser_execute(&f->parser, &settings, data, len);
  enum http_errno e = HTTP_PARSER_ERRNO(&f->parser);
  *consumed = n;
  for (size_t i = n; i > 0; i--)
    if (data[i - 1] != ' ' && data[i - 1] != '\t') {
      f->last_byte = data[i - 1];
      break;
    }
  if (e == HPE_PAUSED) {
    http_parser_pause(&f->parser, 0);
    return SERVD_FRAME_REQUEST;
  }
  if (e == HPE_OK) return SERVD_FRAME_MORE;
  if (f->err_status) {
    *status = f->err_status;
    snprintf(msg, cap, "%s", f->err_msg ? f->err_msg : "malformed HTTP request");
  } else {
    *status = 400;
    snprintf(msg, cap, "malformed HTTP request: %s", http_errno_description(e));
  }
  return SERVD_FRAME_ERROR;
}

static int hexval(char ch) {
  if (ch >= '0' && ch <= '9') return ch - '0';
  if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
  if (ch >= 'A' && ch <= 'F') return ch - 'A' + 10;
  return -1;
}

static bool decode_path(servd_arena *a, const char *src, size_t n, const char **out) {
  char *d = servd_arena_alloc(a, n + 1);
  if (!d) return false;
  size_t j = 0;
  for (size_t i = 0; i < n; i++) {
    if (src[i] == '%') {
      if (i + 2 >= n) return false;
      int hi = hexval(src[i + 1]), lo = hexval(src[i + 2]);
      if (hi < 0 || lo < 0 || (hi == 0 && lo == 0)) return false;
      d[j++] = (char)(hi * 16 + lo);
      i += 2;
    } else {
      d[j++] = src[i];
    }
  }
  d[j] = '\0';
  *out = d;
  return true;
}

bool servd_http_framer_request(servd_http_framer *f, servd_arena *a, servd_http_req *r) {
  r->method = http_method_str((enum http_method)f->parser.method);
  r->target = f->hbuf.data;
  r->http_major = f->parser.http_major;
  r->http_minor = f->parser.http_minor;
  r->headers = f->headers;
  r->n_headers = f->n_headers;
  servd_buf_append(&f->body, "", 0); /* NUL-terminate */
  r->body = f->body.data ? f->body.data : "";
  r->body_len = f->body.len;
  const char *t = r->target;
  const char *q = strchr(t, '?');
  size_t plen = q ? (size_t)(q - t) : strlen(t);
  r->query = q ? q + 1 : "";
  r->path = "";
  return !f->body.oom && decode_path(a, t, plen, &r->path);
}

const char *servd_http_framer_target(const servd_http_framer *f) {
  return f->hbuf.data && f->hbuf.len > f->url_len && f->url_len > 0 ? f->hbuf.data : "";
}

void servd_http_framer_release_body(servd_http_framer *f) {
  if (f->body.cap > (1u << 20)) servd_buf_free(&f->body);
  servd_buf_clear(&f->body);
}
