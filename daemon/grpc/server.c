/* The gRPC listener: TCP connections on the loop, one nghttp2 server session each, a stream per
 * call. A call's request message is collected from DATA frames (refused from its 5-byte prefix when
 * over the limit), handed to its method at END_STREAM, and answered either with HEADERS, one
 * length-prefixed message and trailers, or with trailers only (errors).
 *
 * Output: nghttp2_session_mem_send is drained into one uv_write at a time (up to WRITE_CHUNK bytes);
 * the next is gathered when it completes, so a client that does not read holds at most one chunk
 * plus its streams' answers.
 *
 * TLS (servd_grpc_server_set_tls): http/tls.c sits between the socket and nghttp2 — ciphertext read
 * goes through servd_tls_conn_input before mem_recv, and what mem_send gathers is sealed into one
 * write. nghttp2 output waits for the handshake. */
#include <nghttp2/nghttp2.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grpc/grpc-impl.h"
#include "grpc/grpc.h"
#include "http/tls.h"
#include "servd/status.h"

#define WRITE_CHUNK (256 * 1024)
#define LOCAL_WINDOW (16 * 1024 * 1024) /* connection receive window: large messages in few round trips */
#define STREAM_WINDOW (1024 * 1024)
#define CONN_BUFFER_MIN ((size_t)256 << 20) /* request bytes one connection may be receiving at once */

typedef struct conn conn;

typedef struct stream {
  grpc_call call;
  conn *c;
  struct stream *next, *prev; /* c->streams */
  int32_t id;
  char path[128];
  char *authorization;
  bool grpc_ct;    /* content-type application/grpc[+proto|;...] */
  bool bad_header; /* a header past the limits: answered at END_STREAM */
  uint32_t header_bytes;
  uint8_t prefix[5]; /* the message's length prefix, as it arrives */
  size_t prefix_got;
  uint32_t msg_len;
  uint8_t *msg; /* msg_cap bytes, grown as the message arrives */
  size_t msg_got, msg_cap;
  bool counted; /* msg_len is in c->buffering */
  int n_msgs;   /* prefixes seen: a unary call carries exactly one */
  int refused;  /* a gRPC code decided while receiving (too large, compressed): 0 none */
  char refused_msg[160];
  bool dispatched, answered;
  bool streaming;    /* a client streaming method: dispatched at its headers, messages as they come */
  bool headers_sent; /* response HEADERS submitted */
  bool background;   /* a long-lived stream (Health/Watch): not an active call for draining */
  bool finished;     /* the outcome is known: no more messages */
  uint8_t *out;      /* framed response messages not yet handed to nghttp2 */
  size_t out_len, out_off, out_cap;
  int code;
  char *message;
} stream;

struct conn {
  uv_tcp_t tcp;
  servd_grpc_server *srv;
  conn *next, *prev;
  nghttp2_session *h2;
  stream *streams;
  uv_write_t wreq;
  uv_buf_t wbuf;
  bool writing, closing, goaway;
  bool in_recv;         /* inside nghttp2_session_mem_recv: output waits until it returns */
  size_t buffering;     /* announced lengths of the messages its streams are receiving */
  servd_tls_conn *tls;  /* NULL on a plaintext listener */
  servd_buf plain;      /* decrypted input, handed to nghttp2 at once */
  bool tls_started;     /* the first bytes arrived (a plaintext client is told apart from a handshake) */
  bool close_after;     /* a TLS failure: close once its alert is written */
  uv_timer_t handshake; /* TLS only: the handshake's deadline */
  bool handshake_timer;
  int handles_open; /* tcp, and handshake when started: freed when both have closed */
};

struct servd_grpc_server {
  uv_loop_t *loop;
  servd_api *api;
  const grpc_method *methods; /* methods.c's table */
  size_t n_methods;
  servd_grpc_limits lim;
  uv_tcp_t listener;
  bool listening, listener_open, closing;
  conn *conns;
  int n_conns, active_calls;
  nghttp2_session_callbacks *cbs;
  nghttp2_option *opt;
  servd_tls_ctx *tls; /* borrowed; NULL: plaintext (h2c) */
  void (*done)(void *);
  void *done_ud;
};

void servd_grpc_limits_default(servd_grpc_limits *l) {
  l->max_message_bytes = 64u << 20;
  l->max_concurrent_streams = 128;
  l->max_header_list_bytes = 16 * 1024;
  l->max_connections = 1024;
  l->handshake_timeout_ms = 30000;
}

static void conn_close(conn *c);
static void conn_flush(conn *c);

/* ---- streams ---------------------------------------------------------------------------------- */

static stream *stream_new(conn *c, int32_t id) {
  stream *s = calloc(1, sizeof *s);
  if (!s) return NULL;
  s->c = c;
  s->id = id;
  s->call.api = c->srv->api;
  s->call.loop = c->srv->loop;
  s->call.timeout_ms = -1;
  s->call.stream_ = s;
  s->next = c->streams;
  if (c->streams) c->streams->prev = s;
  c->streams = s;
  return s;
}

/* The call ends without an answer reaching the client: its handler is told. */
static void stream_cancel(stream *s) {
  if (s->dispatched && !s->answered) {
    s->answered = true;
    if (!s->background) s->c->srv->active_calls--;
  }
  void (*cb)(grpc_call *) = s->call.on_cancel;
  s->call.on_cancel = NULL;
  if (cb) cb(&s->call);
}

/* The request message is no longer needed (handled, refused or the stream is gone). */
static void stream_drop_msg(stream *s) {
  if (s->counted) s->c->buffering -= s->msg_len;
  s->counted = false;
  free(s->msg);
  s->msg = NULL;
  s->msg_cap = 0;
}

static void stream_free(stream *s) {
  stream_cancel(s);
  conn *c = s->c;
  stream_drop_msg(s);
  if (s->prev) s->prev->next = s->next;
  else c->streams = s->next;
  if (s->next) s->next->prev = s->prev;
  free(s->authorization);
  free(s->out);
  free(s->message);
  free(s);
}

/* ---- answers ---------------------------------------------------------------------------------- */

#define NV(n, v, vl) \
  { (uint8_t *)(n), (uint8_t *)(v), sizeof(n) - 1, (vl), NGHTTP2_NV_FLAG_NONE }

/* Trailers carrying the call's status; nghttp2 copies them. */
static int submit_trailers(stream *s) {
  char code[16], enc[1024];
  snprintf(code, sizeof code, "%d", s->code);
  grpc_message_encode(s->message ? s->message : "", enc, sizeof enc);
  nghttp2_nv tr[] = {NV("grpc-status", code, strlen(code)), NV("grpc-message", enc, strlen(enc))};
  return nghttp2_submit_trailer(s->c->h2, s->id, tr, enc[0] ? 2 : 1);
}

static ssize_t read_out(nghttp2_session *h2, int32_t id, uint8_t *buf, size_t len, uint32_t *flags,
                        nghttp2_data_source *src, void *ud) {
  (void)ud;
  (void)src;
  stream *s = nghttp2_session_get_stream_user_data(h2, id);
  if (!s) return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
  size_t n = s->out_len - s->out_off;
  if (n > len) n = len;
  memcpy(buf, s->out + s->out_off, n);
  s->out_off += n;
  if (s->out_off == s->out_len) {
    s->out_off = s->out_len = 0;
    if (!s->finished) return n ? (ssize_t)n : NGHTTP2_ERR_DEFERRED; /* a stream: resumed by grpc_send */
    *flags |= NGHTTP2_DATA_FLAG_EOF | NGHTTP2_DATA_FLAG_NO_END_STREAM;
    if (submit_trailers(s) != 0) return NGHTTP2_ERR_CALLBACK_FAILURE;
  }
  return (ssize_t)n;
}

/* Appends one length-prefixed message to the stream's output. */
static int out_append(stream *s, const ProtobufCMessage *m) {
  size_t n = protobuf_c_message_get_packed_size(m);
  if (n > UINT32_MAX) return -1;
  if (s->out_len + n + 5 > s->out_cap) {
    size_t nc = s->out_len + n + 5;
    uint8_t *nb = realloc(s->out, nc);
    if (!nb) return -1;
    s->out = nb;
    s->out_cap = nc;
  }
  uint8_t *p = s->out + s->out_len;
  p[0] = 0;
  p[1] = (uint8_t)(n >> 24);
  p[2] = (uint8_t)(n >> 16);
  p[3] = (uint8_t)(n >> 8);
  p[4] = (uint8_t)n;
  protobuf_c_message_pack(m, p + 5);
  s->out_len += n + 5;
  return 0;
}

/* Sends what the stream has: response headers with a data source the first time, else wakes the
 * deferred data source. */
static void out_push(stream *s) {
  conn *c = s->c;
  if (!s->headers_sent) {
    nghttp2_nv h[] = {NV(":status", "200", 3), NV("content-type", "application/grpc", 16)};
    nghttp2_data_provider prd = {.source.ptr = s, .read_callback = read_out};
    s->headers_sent = true;
    if (nghttp2_submit_response(c->h2, s->id, h, 2, &prd) != 0) {
      conn_close(c);
      return;
    }
  } else {
    nghttp2_session_resume_data(c->h2, s->id);
  }
  conn_flush(c);
}

/* The call has its outcome: the handler is done with it. */
static void stream_finish(stream *s) {
  s->finished = true;
  if (!s->answered) {
    s->answered = true;
    if (s->dispatched && !s->background) s->c->srv->active_calls--;
  }
}

void grpc_call_background(grpc_call *call) {
  stream *s = call->stream_;
  if (s->background || s->answered) return;
  s->background = true;
  s->c->srv->active_calls--;
}

void grpc_send(grpc_call *call, const ProtobufCMessage *m) {
  stream *s = call->stream_;
  if (s->finished) return;
  if (out_append(s, m) != 0) {
    grpc_fail(call, GRPC_RESOURCE_EXHAUSTED, "response: out of memory");
    return;
  }
  out_push(s);
}

void grpc_reply(grpc_call *call, const ProtobufCMessage *m) {
  stream *s = call->stream_;
  if (out_append(s, m) != 0) {
    grpc_fail(call, GRPC_RESOURCE_EXHAUSTED, "response of %zu bytes: out of memory",
              protobuf_c_message_get_packed_size(m));
    return;
  }
  s->code = GRPC_OK;
  stream_finish(s);
  out_push(s);
}

void grpc_fail(grpc_call *call, int code, const char *fmt, ...) {
  stream *s = call->stream_;
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  free(s->message);
  s->message = strdup(msg);
  s->code = code;
  stream_finish(s);
  if (s->headers_sent) {
    /* Messages went out already: the status follows them in the trailers. */
    out_push(s);
    return;
  }
  /* Trailers-only: one HEADERS frame with the status, ending the stream. */
  conn *c = s->c;
  char cs[16], enc[1024];
  snprintf(cs, sizeof cs, "%d", code);
  grpc_message_encode(msg, enc, sizeof enc);
  nghttp2_nv h[] = {NV(":status", "200", 3), NV("content-type", "application/grpc", 16),
                    NV("grpc-status", cs, strlen(cs)), NV("grpc-message", enc, strlen(enc))};
  s->headers_sent = true;
  if (nghttp2_submit_response(c->h2, s->id, h, enc[0] ? 4 : 3, NULL) != 0) {
    conn_close(c);
    return;
  }
  conn_flush(c);
}

int grpc_code_for_status(int st) {
  switch (st) {
  case 200: return GRPC_OK;
  case 400:
  case 413:
  case 422: return GRPC_INVALID_ARGUMENT;
  case 401: return GRPC_UNAUTHENTICATED;
  case 404: return GRPC_NOT_FOUND;
  case 408:
  case 504: return GRPC_DEADLINE_EXCEEDED;
  case 409: return GRPC_FAILED_PRECONDITION; /* a load or unload of the model is in progress */
  case 429: return GRPC_RESOURCE_EXHAUSTED;
  case 503: return GRPC_UNAVAILABLE;
  case 501: return GRPC_UNIMPLEMENTED;
  default: return st >= 500 ? GRPC_INTERNAL : GRPC_UNKNOWN;
  }
}

/* ---- a complete request ----------------------------------------------------------------------- */

static const grpc_method *method_find(const servd_grpc_server *srv, const char *path) {
  for (size_t i = 0; i < srv->n_methods; i++)
    if (strcmp(srv->methods[i].path, path) == 0) return &srv->methods[i];
  return NULL;
}

static void dispatch(stream *s) {
  conn *c = s->c;
  s->dispatched = true;
  c->srv->active_calls++;
  grpc_call *call = &s->call;
  /* The message leaves the connection's budget now; the handler gets it for the call's duration. */
  uint8_t *msg = s->msg;
  s->msg = NULL;
  bool whole = s->n_msgs == 1 && s->msg_got == s->msg_len;
  stream_drop_msg(s);
  const grpc_method *m = method_find(c->srv, s->path);
  s->streaming = m && m->client_streaming;
  if (s->bad_header)
    grpc_fail(call, GRPC_RESOURCE_EXHAUSTED, "request headers over %u bytes", c->srv->lim.max_header_list_bytes);
  else if (!s->grpc_ct) grpc_fail(call, GRPC_INVALID_ARGUMENT, "content-type must be application/grpc");
  else if (s->refused) grpc_fail(call, s->refused, "%s", s->refused_msg);
  else if (!m) grpc_fail(call, GRPC_UNIMPLEMENTED, "unknown method %s", s->path);
  else if (!m->is_public && !servd_api_authorized(c->srv->api, s->authorization))
    grpc_fail(call, GRPC_UNAUTHENTICATED, "missing or incorrect API key: send 'authorization: Bearer <key>'");
  else if (!whole && !s->streaming)
    grpc_fail(call, GRPC_INVALID_ARGUMENT, "a unary call carries exactly one complete message (got %d%s)", s->n_msgs,
              s->n_msgs == 1 ? ", truncated" : "");
  else if (call->timeout_ms == 0) grpc_fail(call, GRPC_DEADLINE_EXCEEDED, "deadline exceeded before the call started");
  else {
    call->authorization = s->authorization;
    m->handler(call, msg ? msg : (const uint8_t *)"", s->msg_len);
  }
  free(msg);
}

/* A message refused while receiving (s->refused set): a unary call is answered now; an open
 * streaming call ends, its handler told first. */
static void refuse(stream *s) {
  if (!s->dispatched) {
    dispatch(s);
    return;
  }
  if (s->finished) return;
  stream_drop_msg(s);
  stream_cancel(s);
  grpc_fail(&s->call, s->refused, "%s", s->refused_msg);
}

/* A streaming call's request message is complete: handed to the handler, and the next one starts. */
static void deliver(stream *s) {
  uint8_t *msg = s->msg;
  size_t len = s->msg_len;
  s->msg = NULL;
  stream_drop_msg(s);
  s->prefix_got = 0;
  s->msg_got = 0;
  s->msg_len = 0;
  if (!s->finished && s->call.on_message) s->call.on_message(&s->call, msg ? msg : (const uint8_t *)"", len);
  free(msg);
}

/* ---- nghttp2 callbacks ------------------------------------------------------------------------ */

static int on_begin_headers(nghttp2_session *h2, const nghttp2_frame *f, void *ud) {
  conn *c = ud;
  if (f->hd.type != NGHTTP2_HEADERS || f->headers.cat != NGHTTP2_HCAT_REQUEST) return 0;
  stream *s = stream_new(c, f->hd.stream_id);
  if (!s) return NGHTTP2_ERR_CALLBACK_FAILURE;
  nghttp2_session_set_stream_user_data(h2, f->hd.stream_id, s);
  return 0;
}

static int on_header(nghttp2_session *h2, const nghttp2_frame *f, const uint8_t *name, size_t nlen,
                     const uint8_t *value, size_t vlen, uint8_t flags, void *ud) {
  (void)flags;
  conn *c = ud;
  if (f->hd.type != NGHTTP2_HEADERS) return 0;
  stream *s = nghttp2_session_get_stream_user_data(h2, f->hd.stream_id);
  if (!s || f->headers.cat != NGHTTP2_HCAT_REQUEST) return 0; /* trailers from the client: ignored */
  s->header_bytes += (uint32_t)(nlen + vlen + 32);
  if (s->header_bytes > c->srv->lim.max_header_list_bytes) {
    s->bad_header = true;
    return 0;
  }
#define IS(lit) (nlen == sizeof(lit) - 1 && memcmp(name, lit, nlen) == 0)
  if (IS(":path")) {
    snprintf(s->path, sizeof s->path, "%.*s", (int)vlen, (const char *)value);
  } else if (IS("content-type")) {
    s->grpc_ct = vlen >= 16 && memcmp(value, "application/grpc", 16) == 0 &&
                 (vlen == 16 || value[16] == '+' || value[16] == ';');
  } else if (IS("authorization")) {
    free(s->authorization);
    s->authorization = strndup((const char *)value, vlen);
  } else if (IS("grpc-timeout")) {
    char v[16];
    snprintf(v, sizeof v, "%.*s", (int)(vlen < 15 ? vlen : 15), (const char *)value);
    s->call.timeout_ms = grpc_timeout_parse(v);
  } else if (IS("grpc-encoding")) {
    if (!(vlen == 8 && memcmp(value, "identity", 8) == 0)) {
      s->refused = GRPC_UNIMPLEMENTED;
      snprintf(s->refused_msg, sizeof s->refused_msg, "grpc-encoding '%.*s' is not supported (identity only)",
               (int)(vlen < 32 ? vlen : 32), (const char *)value);
    }
  }
#undef IS
  return 0;
}

static int on_data(nghttp2_session *h2, uint8_t flags, int32_t id, const uint8_t *data, size_t len, void *ud) {
  (void)flags;
  conn *c = ud;
  stream *s = nghttp2_session_get_stream_user_data(h2, id);
  if (!s || s->refused || (s->dispatched && !s->streaming) || s->finished) return 0;
  while (len > 0 && !s->finished) {
    if (s->prefix_got < 5) {
      size_t k = 5 - s->prefix_got < len ? 5 - s->prefix_got : len;
      memcpy(s->prefix + s->prefix_got, data, k);
      s->prefix_got += k;
      data += k;
      len -= k;
      if (s->prefix_got < 5) break;
      if (++s->n_msgs > 1 && !s->streaming) {
        s->refused = GRPC_INVALID_ARGUMENT;
        snprintf(s->refused_msg, sizeof s->refused_msg, "a unary call carries exactly one message");
        return 0;
      }
      s->msg_len =
          (uint32_t)s->prefix[1] << 24 | (uint32_t)s->prefix[2] << 16 | (uint32_t)s->prefix[3] << 8 | s->prefix[4];
      if (s->prefix[0] != 0) {
        s->refused = GRPC_UNIMPLEMENTED;
        snprintf(s->refused_msg, sizeof s->refused_msg, "compressed messages are not supported");
        if (s->streaming) refuse(s);
        return 0;
      }
      if (s->msg_len > c->srv->lim.max_message_bytes) {
        /* Refused from the prefix: nothing of it is buffered. */
        s->refused = GRPC_RESOURCE_EXHAUSTED;
        snprintf(s->refused_msg, sizeof s->refused_msg, "message of %u bytes is over the limit of %zu bytes",
                 s->msg_len, c->srv->lim.max_message_bytes);
        refuse(s); /* answered now: the client need not send the rest */
        return 0;
      }
      /* All streams of a connection together: a client cannot make it hold max_concurrent_streams
       * messages of the largest size at once. */
      size_t budget =
          c->srv->lim.max_message_bytes * 2 > CONN_BUFFER_MIN ? c->srv->lim.max_message_bytes * 2 : CONN_BUFFER_MIN;
      if (c->buffering + s->msg_len > budget) {
        s->refused = GRPC_RESOURCE_EXHAUSTED;
        snprintf(s->refused_msg, sizeof s->refused_msg,
                 "message of %u bytes: the connection is receiving %zu bytes of messages already (at most %zu)",
                 s->msg_len, c->buffering, budget);
        refuse(s);
        return 0;
      }
      c->buffering += s->msg_len;
      s->counted = true;
      if (s->streaming && s->msg_len == 0) deliver(s);
      continue;
    }
    size_t k = s->msg_len - s->msg_got;
    if (k == 0) {
      /* Bytes after the message: the next message's prefix. */
      s->prefix_got = 0;
      continue;
    }
    if (k > len) k = len;
    if (s->msg_got + k > s->msg_cap) {
      /* Grown as bytes arrive (doubling): an announced length costs nothing until it is sent. */
      size_t nc = s->msg_cap ? s->msg_cap * 2 : 16384;
      while (nc < s->msg_got + k) nc *= 2;
      if (nc > s->msg_len) nc = s->msg_len;
      uint8_t *nb = realloc(s->msg, nc);
      if (!nb) {
        stream_drop_msg(s);
        s->refused = GRPC_RESOURCE_EXHAUSTED;
        snprintf(s->refused_msg, sizeof s->refused_msg, "message of %u bytes: out of memory", s->msg_len);
        refuse(s);
        return 0;
      }
      s->msg = nb;
      s->msg_cap = nc;
    }
    memcpy(s->msg + s->msg_got, data, k);
    s->msg_got += k;
    data += k;
    len -= k;
    if (s->streaming && s->msg_got == s->msg_len) deliver(s);
  }
  return 0;
}

static int on_frame_recv(nghttp2_session *h2, const nghttp2_frame *f, void *ud) {
  (void)ud;
  if (f->hd.type != NGHTTP2_HEADERS && f->hd.type != NGHTTP2_DATA) return 0;
  stream *s = nghttp2_session_get_stream_user_data(h2, f->hd.stream_id);
  if (!s) return 0;
  if (f->hd.type == NGHTTP2_HEADERS && f->headers.cat == NGHTTP2_HCAT_REQUEST && !s->dispatched) {
    /* A client streaming call opens at its headers; a unary one waits for its message. */
    const grpc_method *m = method_find(s->c->srv, s->path);
    if (m && m->client_streaming) dispatch(s);
  }
  if (!(f->hd.flags & NGHTTP2_FLAG_END_STREAM)) return 0;
  if (!s->dispatched) dispatch(s);
  else if (s->streaming && !s->finished && s->call.on_half_close) s->call.on_half_close(&s->call);
  return 0;
}

static int on_stream_close(nghttp2_session *h2, int32_t id, uint32_t error_code, void *ud) {
  (void)error_code;
  (void)ud;
  stream *s = nghttp2_session_get_stream_user_data(h2, id);
  if (s) {
    nghttp2_session_set_stream_user_data(h2, id, NULL);
    stream_free(s); /* RST_STREAM before the answer: the handler drops the call */
  }
  return 0;
}

/* ---- connections ------------------------------------------------------------------------------ */

static void on_conn_closed(uv_handle_t *h) {
  conn *c = h->data;
  if (--c->handles_open > 0) return;
  servd_grpc_server *srv = c->srv;
  while (c->streams) stream_free(c->streams);
  nghttp2_session_del(c->h2);
  servd_tls_conn_destroy(c->tls);
  servd_buf_free(&c->plain);
  free(c->wbuf.base);
  if (c->prev) c->prev->next = c->next;
  else srv->conns = c->next;
  if (c->next) c->next->prev = c->prev;
  srv->n_conns--;
  free(c);
  if (srv->closing && !srv->conns && !srv->listener_open) {
    nghttp2_session_callbacks_del(srv->cbs);
    nghttp2_option_del(srv->opt);
    void (*done)(void *) = srv->done;
    void *ud = srv->done_ud;
    free(srv);
    if (done) done(ud);
  }
}

static void conn_close(conn *c) {
  if (c->closing) return;
  c->closing = true;
  /* The calls end now: their handlers are told before the handle closes. */
  for (stream *s = c->streams; s; s = s->next) stream_cancel(s);
  uv_close((uv_handle_t *)&c->tcp, on_conn_closed);
  if (c->handshake_timer) uv_close((uv_handle_t *)&c->handshake, on_conn_closed);
}

static void on_write(uv_write_t *w, int status) {
  conn *c = w->data;
  c->writing = false;
  free(c->wbuf.base);
  c->wbuf.base = NULL;
  if (status < 0) {
    conn_close(c);
    return;
  }
  conn_flush(c);
}

/* Encrypts the len bytes nghttp2 produced (buf, freed here) with any handshake output into *out
 * (a malloc'd buffer, NULL when nothing is to be written). Returns 0 or -1. */
static int tls_seal(conn *c, char *buf, size_t len, char **out, size_t *out_len) {
  int rc = len ? servd_tls_conn_write(c->tls, buf, len) : 0;
  free(buf);
  servd_buf sealed;
  servd_buf_init(&sealed);
  if (rc != 0 || servd_tls_conn_take_output(c->tls, &sealed) != 0) {
    servd_buf_free(&sealed);
    return -1;
  }
  *out = sealed.len ? sealed.data : NULL;
  *out_len = sealed.len;
  if (!sealed.len) servd_buf_free(&sealed);
  return 0;
}

static void conn_flush(conn *c) {
  if (c->writing || c->closing || c->in_recv) return;
  size_t cap = 0, len = 0;
  char *buf = NULL;
  /* Before the handshake has finished only OpenSSL speaks; nghttp2's SETTINGS wait. */
  bool h2_ready = !c->close_after && (!c->tls || servd_tls_conn_established(c->tls));
  while (h2_ready && len < WRITE_CHUNK) {
    const uint8_t *d;
    ssize_t n = nghttp2_session_mem_send(c->h2, &d);
    if (n < 0) {
      free(buf);
      conn_close(c);
      return;
    }
    if (n == 0) break;
    if (len + (size_t)n > cap) {
      size_t nc = cap ? cap * 2 : 16384;
      while (nc < len + (size_t)n) nc *= 2;
      char *nb = realloc(buf, nc);
      if (!nb) {
        free(buf);
        conn_close(c);
        return;
      }
      buf = nb;
      cap = nc;
    }
    memcpy(buf + len, d, (size_t)n);
    len += (size_t)n;
  }
  if (c->tls && tls_seal(c, buf, len, &buf, &len) != 0) {
    conn_close(c);
    return;
  }
  if (len == 0) {
    free(buf);
    if (c->close_after || (!nghttp2_session_want_read(c->h2) && !nghttp2_session_want_write(c->h2))) conn_close(c);
    return;
  }
  c->wbuf = uv_buf_init(buf, (unsigned)len);
  c->wreq.data = c;
  if (uv_write(&c->wreq, (uv_stream_t *)&c->tcp, &c->wbuf, 1, on_write) != 0) {
    free(buf);
    c->wbuf.base = NULL;
    conn_close(c);
    return;
  }
  c->writing = true;
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *b) {
  (void)h;
  (void)suggested;
  static char slab[64 * 1024]; /* the loop reads one connection at a time and consumes it at once */
  *b = uv_buf_init(slab, sizeof slab);
}

/* Ciphertext from the socket: its plaintext lands in c->plain. Returns 0 to go on, -1 when the
 * connection is being closed (a plaintext client, a failed handshake, a bad record, close_notify). */
static int tls_read(conn *c, const char *data, size_t len) {
  if (!c->tls_started) {
    c->tls_started = true;
    /* "PRI * HTTP/2.0": an h2c client on the TLS port cannot read an answer; it is closed. */
    if (servd_tls_looks_like_http(data, len)) {
      conn_close(c);
      return -1;
    }
  }
  servd_tls_status st = servd_tls_conn_input(c->tls, data, len, &c->plain);
  if (c->handshake_timer && servd_tls_conn_established(c->tls)) uv_timer_stop(&c->handshake);
  if (st == SERVD_TLS_ERROR) {
    /* The alert OpenSSL queued, if any, goes out; then the connection closes. */
    c->close_after = true;
    uv_read_stop((uv_stream_t *)&c->tcp);
    conn_flush(c);
    return -1;
  }
  if (st == SERVD_TLS_EOF) {
    conn_close(c);
    return -1;
  }
  return 0;
}

static void on_read(uv_stream_t *st, ssize_t n, const uv_buf_t *b) {
  conn *c = st->data;
  if (n < 0) {
    conn_close(c);
    return;
  }
  if (n == 0 || c->closing) return;
  const uint8_t *in = (const uint8_t *)b->base;
  size_t in_len = (size_t)n;
  if (c->tls) {
    if (tls_read(c, b->base, (size_t)n) != 0) return;
    in = (const uint8_t *)c->plain.data;
    in_len = c->plain.len;
  }
  c->in_recv = true; /* answers given from its callbacks are sent once it returns */
  ssize_t r = in_len ? nghttp2_session_mem_recv(c->h2, in, in_len) : 0;
  c->in_recv = false;
  if (c->tls) servd_buf_clear(&c->plain);
  if (r < 0) {
    /* A protocol violation or a flood: nghttp2 has queued GOAWAY where it could. */
    nghttp2_session_terminate_session(c->h2, NGHTTP2_PROTOCOL_ERROR);
    uv_read_stop(st);
  }
  conn_flush(c);
}

static void on_handshake_timeout(uv_timer_t *t) {
  conn *c = t->data;
  if (!servd_tls_conn_established(c->tls)) conn_close(c);
}

static void on_connection(uv_stream_t *l, int status) {
  servd_grpc_server *srv = l->data;
  if (status < 0) return;
  conn *c = calloc(1, sizeof *c);
  if (!c) return;
  c->srv = srv;
  uv_tcp_init(srv->loop, &c->tcp);
  c->tcp.data = c;
  c->handles_open = 1;
  if (srv->tls && srv->lim.handshake_timeout_ms > 0) {
    /* A client that never finishes its handshake holds no connection for longer than this. */
    uv_timer_init(srv->loop, &c->handshake);
    c->handshake.data = c;
    c->handshake_timer = true;
    c->handles_open++;
    uv_timer_start(&c->handshake, on_handshake_timeout, (uint64_t)srv->lim.handshake_timeout_ms, 0);
  }
  c->next = srv->conns;
  if (srv->conns) srv->conns->prev = c;
  srv->conns = c;
  srv->n_conns++;
  if (uv_accept(l, (uv_stream_t *)&c->tcp) != 0 || srv->n_conns > srv->lim.max_connections ||
      nghttp2_session_server_new2(&c->h2, srv->cbs, c, srv->opt) != 0 ||
      (srv->tls && !(c->tls = servd_tls_conn_create(srv->tls)))) {
    conn_close(c);
    return;
  }
  uv_tcp_nodelay(&c->tcp, 1);
  nghttp2_settings_entry iv[] = {
      {NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS, srv->lim.max_concurrent_streams},
      {NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE, srv->lim.max_header_list_bytes},
      {NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, STREAM_WINDOW},
  };
  if (nghttp2_submit_settings(c->h2, NGHTTP2_FLAG_NONE, iv, sizeof iv / sizeof iv[0]) != 0 ||
      nghttp2_session_set_local_window_size(c->h2, NGHTTP2_FLAG_NONE, 0, LOCAL_WINDOW) != 0 ||
      uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read) != 0) {
    conn_close(c);
    return;
  }
  conn_flush(c);
}

/* ---- the server ------------------------------------------------------------------------------- */

int grpc_server_create(uv_loop_t *loop, servd_api *api, const servd_grpc_limits *lim, const grpc_method *methods,
                       size_t n_methods, servd_grpc_server **out) {
  *out = NULL;
  servd_grpc_server *s = calloc(1, sizeof *s);
  if (!s) return servd_fail(SERVD_ENOMEM, "grpc: out of memory");
  s->loop = loop;
  s->api = api;
  if (lim) s->lim = *lim;
  else servd_grpc_limits_default(&s->lim);
  s->methods = methods;
  s->n_methods = n_methods;
  if (nghttp2_session_callbacks_new(&s->cbs) != 0 || nghttp2_option_new(&s->opt) != 0) {
    if (s->cbs) nghttp2_session_callbacks_del(s->cbs);
    free(s);
    return servd_fail(SERVD_ENOMEM, "grpc: out of memory");
  }
  nghttp2_session_callbacks_set_on_begin_headers_callback(s->cbs, on_begin_headers);
  nghttp2_session_callbacks_set_on_header_callback(s->cbs, on_header);
  nghttp2_session_callbacks_set_on_data_chunk_recv_callback(s->cbs, on_data);
  nghttp2_session_callbacks_set_on_frame_recv_callback(s->cbs, on_frame_recv);
  nghttp2_session_callbacks_set_on_stream_close_callback(s->cbs, on_stream_close);
  /* Floods and oversized blocks: nghttp2 answers a client past these with GOAWAY. */
  nghttp2_option_set_max_settings(s->opt, 32);                  /* entries in one SETTINGS frame */
  nghttp2_option_set_max_outbound_ack(s->opt, 1000);            /* queued SETTINGS/PING acks (floods) */
  nghttp2_option_set_max_continuations(s->opt, 8);              /* CONTINUATION frames per header block */
  nghttp2_option_set_stream_reset_rate_limit(s->opt, 1000, 33); /* rapid reset: burst, per second */
  nghttp2_option_set_max_deflate_dynamic_table_size(s->opt, 4096);
  nghttp2_option_set_max_send_header_block_length(s->opt, 64 * 1024);
  *out = s;
  return 0;
}

int servd_grpc_server_listen(servd_grpc_server *s, const char *host, int port) {
  struct sockaddr_storage ss;
  if (uv_ip4_addr(host, port, (struct sockaddr_in *)&ss) != 0 &&
      uv_ip6_addr(host, port, (struct sockaddr_in6 *)&ss) != 0)
    return servd_fail(SERVD_EINVAL, "grpc: '%s' is not an IP address", host);
  uv_tcp_init(s->loop, &s->listener);
  s->listener.data = s;
  s->listener_open = true;
  int rc = uv_tcp_bind(&s->listener, (const struct sockaddr *)&ss, 0);
  if (rc == 0) rc = uv_listen((uv_stream_t *)&s->listener, 511, on_connection);
  if (rc != 0) return servd_fail(SERVD_EIO, "grpc: cannot listen on %s:%d: %s", host, port, uv_strerror(rc));
  s->listening = true;
  return 0;
}

void servd_grpc_server_set_tls(servd_grpc_server *s, servd_tls_ctx *tls) { s->tls = tls; }

int servd_grpc_server_port(const servd_grpc_server *s) {
  struct sockaddr_storage ss;
  int len = sizeof ss;
  if (uv_tcp_getsockname(&s->listener, (struct sockaddr *)&ss, &len) != 0) return -1;
  if (ss.ss_family == AF_INET6) return ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
  return ntohs(((struct sockaddr_in *)&ss)->sin_port);
}

int servd_grpc_server_active_calls(const servd_grpc_server *s) { return s ? s->active_calls : 0; }

static void on_listener_closed(uv_handle_t *h) {
  servd_grpc_server *s = h->data;
  s->listener_open = false;
  if (s->closing && !s->conns) {
    nghttp2_session_callbacks_del(s->cbs);
    nghttp2_option_del(s->opt);
    void (*done)(void *) = s->done;
    void *ud = s->done_ud;
    free(s);
    if (done) done(ud);
  }
}

static void listener_close(servd_grpc_server *s) {
  s->listening = false;
  if (s->listener_open && !uv_is_closing((uv_handle_t *)&s->listener))
    uv_close((uv_handle_t *)&s->listener, on_listener_closed);
}

void servd_grpc_server_stop_accepting(servd_grpc_server *s) {
  if (!s || !s->listening) return;
  listener_close(s);
  for (conn *c = s->conns; c; c = c->next) {
    if (c->closing || c->goaway) continue;
    c->goaway = true;
    for (stream *st = c->streams; st; st = st->next)
      if (st->call.on_drain && !st->finished) st->call.on_drain(&st->call);
    /* Calls in progress finish; the client opens no new ones here. */
    nghttp2_submit_goaway(c->h2, NGHTTP2_FLAG_NONE, nghttp2_session_get_last_proc_stream_id(c->h2), NGHTTP2_NO_ERROR,
                          NULL, 0);
    conn_flush(c);
  }
}

void servd_grpc_server_close(servd_grpc_server *s, void (*done)(void *), void *ud) {
  if (!s) {
    if (done) done(ud);
    return;
  }
  s->closing = true;
  s->done = done;
  s->done_ud = ud;
  listener_close(s);
  bool any = s->listener_open || s->conns;
  for (conn *c = s->conns; c; c = c->next) conn_close(c);
  if (!any) {
    nghttp2_session_callbacks_del(s->cbs);
    nghttp2_option_del(s->opt);
    free(s);
    if (done) done(ud);
  }
}
