#include "http/server.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "http/buf.h"
#include "http/framer.h"
#include "http/tls.h"
#include "servd/status.h"

#define READ_CHUNK 65536

typedef enum { C_IDLE, C_READING, C_HANDLING } conn_state;
typedef enum { T_NONE, T_IDLE, T_REQUEST } timer_kind;

typedef struct conn {
  uv_tcp_t tcp;
  uv_timer_t timer;
  int open_handles;
  servd_http_server *srv;
  struct conn *prev, *next;
  servd_http_framer fr; /* request framing: parser, headers, body */
  conn_state state;
  timer_kind timer_kind;
  bool reading, closing, close_after, in_process, chunked, responded;
  bool close_at_end; /* the response said Connection: close */
  bool raw_stream;   /* HTTP/1.0 has no chunked encoding: stream bytes as they are, then close */
  bool peer_eof;     /* the client has finished sending (EOF); answer what it sent, then close */
  bool out_blocked;  /* back-pressure: the next request waits for the output to drain */
  char *rbuf;
  servd_buf pending;        /* received, not yet parsed */
  servd_buf obuf, wbuf;     /* accumulating output, output being written */
  int resp_obuf, resp_wbuf; /* responses that ended in obuf, in wbuf */
  bool writing;
  uint64_t writes_done, seen_writes; /* write progress, checked by the idle timer */
  size_t seen_queue;
  bool dirty; /* on srv->dirty: output queued while the server was in a batch */
  struct conn *dirty_next;
  uv_write_t wreq;
  servd_buf ehdr; /* extra response headers of the current request */
  servd_arena *arena;
  servd_http_req req;
  servd_tls_conn *tls; /* NULL on a plaintext listener; then obuf/wbuf hold plaintext, else wbuf ciphertext */
  bool tls_started;    /* the first bytes arrived (a plaintext request is told apart from a handshake) */
} conn;

struct servd_http_server {
  uv_loop_t *loop;
  uv_tcp_t listener;
  bool listening, stopping, closing;
  int open_handles;
  servd_http_limits lim;
  servd_http_callbacks cb;
  conn *conns;
  int n_conns, active;
  int batch_depth;   /* > 0: flushes are deferred to servd_http_server_batch_end */
  conn *dirty;       /* connections with output deferred by the batch */
  uint64_t n_writes; /* uv_write calls issued */
  size_t peak_out, peak_in;
  uint64_t read_pauses;
  servd_tls_ctx *tls; /* borrowed; NULL: plaintext */
  uint64_t tls_failures;
  void (*done)(void *);
  void *done_ud;
};

const char *servd_http_reason(int s) {
  switch (s) {
  case 100: return "Continue";
  case 200: return "OK";
  case 201: return "Created";
  case 204: return "No Content";
  case 400: return "Bad Request";
  case 401: return "Unauthorized";
  case 403: return "Forbidden";
  case 404: return "Not Found";
  case 405: return "Method Not Allowed";
  case 408: return "Request Timeout";
  case 409: return "Conflict";
  case 413: return "Payload Too Large";
  case 415: return "Unsupported Media Type";
  case 422: return "Unprocessable Entity";
  case 429: return "Too Many Requests";
  case 431: return "Request Header Fields Too Large";
  case 500: return "Internal Server Error";
  case 501: return "Not Implemented";
  case 503: return "Service Unavailable";
  case 504: return "Gateway Timeout";
  case 505: return "HTTP Version Not Supported";
  default: return "Unknown";
  }
}

static void conn_close(conn *c);
static void conn_process(conn *c);
static void conn_flush(conn *c);
static void error_response(conn *c, int status, const char *msg);
static void reading_update(conn *c);
static void timer_set(conn *c, timer_kind k, int ms);

/* ---- server-level bookkeeping ---------------------------------------------------------------- */

static void server_maybe_done(servd_http_server *s) {
  if (!s->closing || s->open_handles > 0 || s->n_conns > 0 || s->batch_depth > 0) return;
  void (*done)(void *) = s->done;
  void *ud = s->done_ud;
  free(s);
  if (done) done(ud);
}

static void on_conn_handle_closed(uv_handle_t *h) {
  conn *c = h->data;
  if (--c->open_handles > 0) return;
  servd_http_server *s = c->srv;
  if (c->dirty) /* closed inside a batch (not reached in practice: close callbacks run later) */
    for (conn **pp = &s->dirty; *pp; pp = &(*pp)->dirty_next)
      if (*pp == c) {
        *pp = c->dirty_next;
        break;
      }
  if (c->prev) c->prev->next = c->next;
  else s->conns = c->next;
  if (c->next) c->next->prev = c->prev;
  s->n_conns--;
  servd_buf_free(&c->pending);
  servd_http_framer_free(&c->fr);
  servd_buf_free(&c->obuf);
  servd_buf_free(&c->wbuf);
  servd_buf_free(&c->ehdr);
  servd_arena_destroy(c->arena);
  servd_tls_conn_destroy(c->tls);
  free(c->rbuf);
  free(c);
  server_maybe_done(s);
}

/* ---- timers ----------------------------------------------------------------------------------- */

static void on_timer(uv_timer_t *t) {
  conn *c = t->data;
  timer_kind k = c->timer_kind;
  c->timer_kind = T_NONE;
  if (c->closing) return;
  if (k == T_REQUEST && c->state == C_READING && !c->writing && c->obuf.len == 0) {
    /* Slow client: tell it why, then drop it. */
    c->state = C_IDLE;
    error_response(c, 408, "request not received in time");
    return;
  }
  if (k == T_IDLE && (c->writing || c->obuf.len)) {
    /* Still delivering responses to a slow reader: idle only when its writes made no progress for a
     * whole timeout (nginx's send_timeout). Its unsent bytes are bounded meanwhile. */
    size_t q = uv_stream_get_write_queue_size((uv_stream_t *)&c->tcp);
    if (c->writes_done != c->seen_writes || q != c->seen_queue) {
      c->seen_writes = c->writes_done;
      c->seen_queue = q;
      timer_set(c, T_IDLE, c->srv->lim.idle_timeout_ms);
      return;
    }
  }
  conn_close(c);
}

static void timer_set(conn *c, timer_kind k, int ms) {
  c->timer_kind = k;
  if (k == T_NONE || ms <= 0) {
    uv_timer_stop(&c->timer);
    c->timer_kind = T_NONE;
    return;
  }
  uv_timer_start(&c->timer, on_timer, (uint64_t)ms, 0);
}

/* ---- output ----------------------------------------------------------------------------------- */

/* Plaintext not yet encrypted, ciphertext being written, and ciphertext OpenSSL produced since (a
 * TLS connection's limits so count the bytes that really wait for the socket). */
static size_t conn_unsent(const conn *c) {
  return c->obuf.len + c->wbuf.len + (c->tls ? servd_tls_conn_output_pending(c->tls) : 0);
}

/* Back-pressure on output (see server.h): whether the next request must wait for the writes. The
 * marks differ so that reading does not stop and start again at every write. */
static void out_update(conn *c) {
  servd_http_server *s = c->srv;
  size_t unsent = conn_unsent(c);
  if (unsent > s->peak_out) s->peak_out = unsent;
  size_t mark = c->out_blocked ? s->lim.max_output_bytes / 16 : s->lim.max_output_bytes / 4;
  c->out_blocked = unsent > mark || c->resp_obuf + c->resp_wbuf >= s->lim.max_pipelined;
}

static void on_write(uv_write_t *w, int status) {
  conn *c = w->data;
  c->writing = false;
  c->writes_done++;
  c->resp_wbuf = 0;
  servd_buf_clear(&c->wbuf);
  if (c->wbuf.cap > (1u << 20)) servd_buf_free(&c->wbuf);
  if (status < 0) {
    conn_close(c);
    return;
  }
  if (c->closing) return;
  conn_flush(c);
  /* The output drained: the next pipelined request may go on. */
  if (c->state != C_HANDLING) conn_process(c);
  else reading_update(c);
}

static void on_shutdown_close(uv_shutdown_t *sh, int status) {
  (void)status;
  conn *c = sh->data;
  free(sh);
  conn_close(c);
}

/* Encrypts the queued plaintext into wbuf (empty: no write in flight), with a close_notify when this
 * is the last output, and any handshake bytes OpenSSL produced since the last write. */
static int tls_seal(conn *c) {
  if (c->obuf.len) {
    if (servd_tls_conn_write(c->tls, c->obuf.data, c->obuf.len) != 0) return -1;
    servd_buf_clear(&c->obuf);
    if (c->obuf.cap > (1u << 20)) servd_buf_free(&c->obuf);
  }
  if (c->close_after) servd_tls_conn_close_notify(c->tls);
  return servd_tls_conn_take_output(c->tls, &c->wbuf);
}

static void conn_flush(conn *c) {
  if (c->closing) return;
  out_update(c);
  if (c->out_blocked && c->reading) reading_update(c);
  if (c->srv->batch_depth > 0) {
    /* Inside a batch: one write per connection at its end instead of one per chunk. */
    if (!c->dirty) {
      c->dirty = true;
      c->dirty_next = c->srv->dirty;
      c->srv->dirty = c;
    }
    return;
  }
  if (c->writing) return;
  if (c->tls && tls_seal(c) != 0) {
    conn_close(c);
    return;
  }
  if (c->obuf.len == 0 && c->wbuf.len == 0) {
    if (c->close_after) {
      /* Half-close so the client reads everything before the connection goes. */
      uv_shutdown_t *sh = malloc(sizeof(*sh));
      if (sh) {
        sh->data = c;
        if (uv_shutdown(sh, (uv_stream_t *)&c->tcp, on_shutdown_close) == 0) {
          c->close_after = false;
          return;
        }
        free(sh);
      }
      conn_close(c);
    }
    return;
  }
  if (!c->tls) {
    servd_buf tmp = c->wbuf;
    c->wbuf = c->obuf;
    c->obuf = tmp;
  }
  c->resp_wbuf = c->resp_obuf;
  c->resp_obuf = 0;
  uv_buf_t b = uv_buf_init(c->wbuf.data, (unsigned)c->wbuf.len);
  c->wreq.data = c;
  c->srv->n_writes++;
  if (uv_write(&c->wreq, (uv_stream_t *)&c->tcp, &b, 1, on_write) != 0) {
    conn_close(c);
    return;
  }
  c->writing = true;
}

/* ---- closing ---------------------------------------------------------------------------------- */

static void req_finish(conn *c, bool aborted) {
  servd_http_server *s = c->srv;
  servd_http_req *r = &c->req;
  if (aborted) {
    void (*ab)(servd_http_req *) = r->on_abort;
    r->on_abort = NULL;
    if (ab) ab(r);
    r->status = 499; /* the client closed first, as nginx logs it */
  }
  if (s->cb.complete) s->cb.complete(s->cb.ud, r);
  s->active--;
  servd_arena_reset(c->arena);
  memset(r, 0, sizeof(*r));
  servd_buf_clear(&c->ehdr);
  servd_http_framer_release_body(&c->fr);
  c->state = C_IDLE;
}

static void conn_close(conn *c) {
  if (c->closing) return;
  c->closing = true;
  if (c->state == C_HANDLING) req_finish(c, true);
  c->state = C_IDLE;
  uv_close((uv_handle_t *)&c->timer, on_conn_handle_closed);
  uv_close((uv_handle_t *)&c->tcp, on_conn_handle_closed);
}

/* ---- framer hooks --------------------------------------------------------------------------- */

static void on_request_begin(void *ud) {
  conn *c = ud;
  c->state = C_READING;
  timer_set(c, T_REQUEST, c->srv->lim.request_timeout_ms);
}

static void on_request_continue(void *ud) {
  conn *c = ud;
  static const char cont[] = "HTTP/1.1 100 Continue\r\n\r\n";
  servd_buf_append(&c->obuf, cont, sizeof cont - 1);
  conn_flush(c);
}

static void on_request_complete(void *ud) { timer_set((conn *)ud, T_NONE, 0); }

/* ---- dispatch --------------------------------------------------------------------------------- */

static void error_response(conn *c, int status, const char *msg) {
  servd_http_server *s = c->srv;
  servd_buf body;
  servd_buf_init(&body);
  /* The target is known once the url has been terminated (at the first header or headers end). */
  const char *target = servd_http_framer_target(&c->fr);
  if (s->cb.error_body) s->cb.error_body(s->cb.ud, target, status, msg, &body);
  else {
    servd_buf_puts(&body, "{\"error\": ");
    servd_buf_json_str(&body, msg, strlen(msg));
    servd_buf_puts(&body, "}");
  }
  servd_buf_printf(&c->obuf,
                   "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n"
                   "Connection: close\r\n\r\n",
                   status, servd_http_reason(status), body.len);
  servd_buf_append(&c->obuf, body.data ? body.data : "", body.len);
  servd_buf_free(&body);
  c->close_after = true;
  if (c->reading) {
    uv_read_stop((uv_stream_t *)&c->tcp);
    c->reading = false;
  }
  timer_set(c, T_NONE, 0);
  if (s->cb.complete) {
    /* Count and log it like any other response. */
    servd_http_req r;
    memset(&r, 0, sizeof r);
    r.method = http_method_str((enum http_method)c->fr.parser.method);
    r.path = target;
    r.target = target;
    r.status = status;
    r.route = "rejected";
    r.start_ns = uv_hrtime();
    r.http_major = 1;
    r.http_minor = 1;
    s->cb.complete(s->cb.ud, &r);
  }
  conn_flush(c);
}

static void dispatch(conn *c) {
  servd_http_server *s = c->srv;
  servd_http_req *r = &c->req;
  memset(r, 0, sizeof(*r));
  r->conn_ = c;
  r->arena = c->arena;
  bool target_ok = servd_http_framer_request(&c->fr, c->arena, r);
  r->start_ns = uv_hrtime();
  struct sockaddr_storage ss;
  int len = sizeof ss;
  if (uv_tcp_getpeername(&c->tcp, (struct sockaddr *)&ss, &len) == 0) {
    if (ss.ss_family == AF_INET6) uv_ip6_name((struct sockaddr_in6 *)&ss, r->remote, sizeof r->remote);
    else uv_ip4_name((struct sockaddr_in *)&ss, r->remote, sizeof r->remote);
  }
  c->state = C_HANDLING;
  c->responded = false;
  c->chunked = false;
  s->active++;
  if (target_ok) {
    s->cb.handle(s->cb.ud, r);
    return;
  }
  r->path = "";
  r->route = "invalid";
  servd_http_respond(r, 400, "application/json", "{\"error\": \"malformed request target\"}", 37);
}

/* Parses and dispatches pipelined requests while the connection is free and its output is not
 * backed up (out_blocked), then decides whether to read more. */
static void conn_process(conn *c) {
  if (c->in_process || c->closing) return;
  c->in_process = true;
  servd_http_server *s = c->srv;
  size_t off = 0; /* consumed once at the end: one memmove however many requests were parsed */
  while (!c->closing && !c->close_after && c->state != C_HANDLING && !c->out_blocked && off < c->pending.len) {
    size_t n = 0;
    int status = 0;
    char msg[160];
    servd_frame_result fr =
        servd_http_framer_feed(&c->fr, c->pending.data + off, c->pending.len - off, &n, &status, msg, sizeof msg);
    off += n;
    if (fr == SERVD_FRAME_REQUEST) {
      dispatch(c);
      continue;
    }
    if (fr == SERVD_FRAME_ERROR) {
      error_response(c, status, msg);
      off = c->pending.len;
      break;
    }
    if (n == 0) break;
  }
  servd_buf_consume(&c->pending, off);
  c->in_process = false;
  if (c->closing || c->close_after) return;
  if (c->peer_eof && c->state != C_HANDLING && (c->pending.len == 0 || !c->out_blocked)) {
    /* The client has finished sending and every complete request it sent is answered: deliver the
     * output (a half-closing client reads it all), then close. */
    c->close_after = true;
    conn_flush(c);
    return;
  }
  reading_update(c);
  if (c->state == C_IDLE && c->timer_kind == T_NONE && (c->pending.len == 0 || c->out_blocked)) {
    if (s->stopping && c->pending.len == 0) {
      c->close_after = true;
      conn_flush(c);
    } else {
      timer_set(c, T_IDLE, s->lim.idle_timeout_ms); /* also a send timeout while blocked (on_timer) */
    }
  }
}

/* ---- reading ---------------------------------------------------------------------------------- */

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *b) {
  (void)suggested;
  conn *c = h->data;
  *b = uv_buf_init(c->rbuf, READ_CHUNK);
}

/* Debug lines (SERVD_DEBUG set): what a client did wrong that an operator only sometimes wants to see. */
static void debug_log(conn *c, const char *fmt, const char *arg) {
  static int on = -1;
  if (on < 0) on = getenv("SERVD_DEBUG") && getenv("SERVD_DEBUG")[0];
  if (!on) return;
  char peer[64] = "?";
  struct sockaddr_storage ss;
  int len = sizeof ss;
  if (uv_tcp_getpeername(&c->tcp, (struct sockaddr *)&ss, &len) == 0) {
    if (ss.ss_family == AF_INET6) uv_ip6_name((struct sockaddr_in6 *)&ss, peer, sizeof peer);
    else uv_ip4_name((struct sockaddr_in *)&ss, peer, sizeof peer);
  }
  fprintf(stderr, "servd: debug: %s: ", peer);
  fprintf(stderr, fmt, arg);
  fputc('\n', stderr);
}

/* Ciphertext from the socket: its plaintext goes to pending, handshake replies out. Returns 0 to go
 * on, -1 when the connection is being closed (a plaintext request, a failed handshake, a bad record). */
static int tls_read(conn *c, const char *data, size_t len) {
  servd_http_server *s = c->srv;
  if (!c->tls_started) {
    c->tls_started = true;
    if (servd_tls_looks_like_http(data, len)) {
      /* As nginx does: an answer in plaintext that the client can show, then close. */
      s->tls_failures++;
      debug_log(c, "%s", "plaintext HTTP on the TLS port");
      servd_tls_conn_destroy(c->tls);
      c->tls = NULL;
      error_response(c, 400, "plain HTTP request sent to the HTTPS port");
      return -1;
    }
  }
  bool was_established = servd_tls_conn_established(c->tls);
  servd_tls_status st = servd_tls_conn_input(c->tls, data, len, &c->pending);
  if (st == SERVD_TLS_ERROR) {
    s->tls_failures++;
    debug_log(c, was_established ? "TLS record error: %s" : "TLS handshake failed: %s", servd_tls_conn_error(c->tls));
    /* Deliver the alert OpenSSL queued, if any, then close. */
    c->close_after = true;
    if (c->reading) {
      uv_read_stop((uv_stream_t *)&c->tcp);
      c->reading = false;
    }
    if (c->state == C_HANDLING) {
      conn_close(c);
      return -1;
    }
    timer_set(c, T_NONE, 0);
    conn_flush(c);
    return -1;
  }
  if (!was_established && servd_tls_conn_established(c->tls) && c->state == C_IDLE && c->timer_kind == T_IDLE)
    timer_set(c, T_IDLE, s->lim.idle_timeout_ms);           /* the handshake deadline becomes the idle timeout */
  if (servd_tls_conn_output_pending(c->tls)) conn_flush(c); /* handshake messages, session tickets */
  if (st == SERVD_TLS_EOF) {
    /* close_notify: the client sends nothing more, as at a TCP EOF (on_read). */
    if (c->state == C_HANDLING) {
      conn_close(c);
      return -1;
    }
    c->peer_eof = true;
    reading_update(c);
  }
  return c->closing ? -1 : 0;
}

static void on_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *b) {
  conn *c = st->data;
  if (nread < 0) {
    if (nread == UV_EOF && c->state != C_HANDLING) {
      /* The client finished sending: answer what it sent, deliver it, then close (conn_process). */
      c->peer_eof = true;
      reading_update(c);
      conn_process(c);
      return;
    }
    conn_close(c); /* an error, or EOF while a request runs: the client is gone, abort it */
    return;
  }
  if (nread == 0) return;
  if (c->close_after) return; /* an error response is on its way; ignore the rest */
  if (c->tls) {
    if (tls_read(c, b->base, (size_t)nread) != 0) return;
  } else {
    servd_buf_append(&c->pending, b->base, (size_t)nread);
  }
  if (c->pending.oom) {
    conn_close(c);
    return;
  }
  if (c->pending.len > c->srv->peak_in) c->srv->peak_in = c->pending.len;
  /* Bytes of a handshake in progress do not stop its deadline. */
  if (c->state == C_IDLE && c->timer_kind == T_IDLE && (!c->tls || servd_tls_conn_established(c->tls)))
    timer_set(c, T_NONE, 0);
  conn_process(c);
}

/* Reads while the connection can take more: not closing, its input below max_input_bytes and its
 * output not backed up. Stopping lets TCP flow control push back on the client. */
static void reading_update(conn *c) {
  bool want =
      !c->closing && !c->close_after && !c->peer_eof && !c->out_blocked && c->pending.len < c->srv->lim.max_input_bytes;
  if (want == c->reading) return;
  if (want) {
    if (uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read) == 0) c->reading = true;
    return;
  }
  uv_read_stop((uv_stream_t *)&c->tcp);
  c->reading = false;
  if (c->out_blocked || c->pending.len >= c->srv->lim.max_input_bytes) c->srv->read_pauses++;
}

static void on_connection(uv_stream_t *l, int status) {
  servd_http_server *s = l->data;
  if (status < 0 || s->stopping) return;
  conn *c = calloc(1, sizeof(*c));
  if (!c) return;
  c->rbuf = malloc(READ_CHUNK);
  c->arena = servd_arena_create(8192);
  c->srv = s;
  int frc = servd_http_framer_init(&c->fr, &s->lim);
  if (frc != 0 || !c->rbuf || !c->arena || uv_tcp_init(s->loop, &c->tcp) != 0) {
    free(c->rbuf);
    servd_http_framer_free(&c->fr);
    servd_arena_destroy(c->arena);
    free(c);
    return;
  }
  c->tcp.data = c;
  c->timer.data = c;
  c->open_handles = 2;
  uv_timer_init(s->loop, &c->timer);
  c->next = s->conns;
  if (s->conns) s->conns->prev = c;
  s->conns = c;
  s->n_conns++;
  if (uv_accept(l, (uv_stream_t *)&c->tcp) != 0 || s->n_conns > s->lim.max_connections) {
    conn_close(c);
    return;
  }
  uv_tcp_nodelay(&c->tcp, 1);
  if (s->tls && !(c->tls = servd_tls_conn_create(s->tls))) {
    conn_close(c);
    return;
  }
  c->fr.on_begin = on_request_begin;
  c->fr.on_continue = on_request_continue;
  c->fr.on_complete = on_request_complete;
  c->fr.ud = c;
  reading_update(c);
  /* A handshake must be done within the request deadline (a client that stalls in it holds a
   * connection as a slow request would); then the idle timeout applies. */
  timer_set(c, T_IDLE, c->tls ? s->lim.request_timeout_ms : s->lim.idle_timeout_ms);
}

/* ---- public ----------------------------------------------------------------------------------- */

int servd_http_server_create(uv_loop_t *loop, const servd_http_limits *limits, const servd_http_callbacks *cb,
                             servd_http_server **out) {
  *out = NULL;
  if (!cb || !cb->handle) return servd_fail(SERVD_EINVAL, "http server: a request handler is required");
  servd_http_server *s = calloc(1, sizeof(*s));
  if (!s) return servd_fail(SERVD_ENOMEM, "http server: out of memory");
  s->loop = loop;
  if (limits) s->lim = *limits;
  else servd_http_limits_default(&s->lim);
  if (s->lim.max_headers < 1) s->lim.max_headers = 1;
  if (s->lim.max_pipelined < 1) s->lim.max_pipelined = 1;
  if (s->lim.max_input_bytes < READ_CHUNK) s->lim.max_input_bytes = READ_CHUNK;
  s->cb = *cb;
  *out = s;
  return 0;
}

int servd_http_server_listen(servd_http_server *s, const char *host, int port) {
  struct sockaddr_storage addr;
  int rc;
  if (strchr(host, ':')) rc = uv_ip6_addr(host, port, (struct sockaddr_in6 *)&addr);
  else rc = uv_ip4_addr(host, port, (struct sockaddr_in *)&addr);
  if (rc != 0) return servd_fail(SERVD_EINVAL, "http listen: bad host address '%s'", host);
  if ((rc = uv_tcp_init(s->loop, &s->listener)) != 0) return servd_fail(SERVD_EIO, "http listen: %s", uv_strerror(rc));
  s->listener.data = s;
  s->open_handles++;
  s->listening = true;
  if ((rc = uv_tcp_bind(&s->listener, (struct sockaddr *)&addr, 0)) != 0 ||
      (rc = uv_listen((uv_stream_t *)&s->listener, 511, on_connection)) != 0)
    return servd_fail(SERVD_EIO, "http listen on %s:%d: %s", host, port, uv_strerror(rc));
  return 0;
}

int servd_http_server_port(const servd_http_server *s) {
  struct sockaddr_storage ss;
  int len = sizeof ss;
  if (!s->listening || uv_tcp_getsockname(&s->listener, (struct sockaddr *)&ss, &len) != 0) return -1;
  if (ss.ss_family == AF_INET6) return ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
  return ntohs(((struct sockaddr_in *)&ss)->sin_port);
}

static void on_listener_closed(uv_handle_t *h) {
  servd_http_server *s = h->data;
  s->open_handles--;
  server_maybe_done(s);
}

void servd_http_server_stop_accepting(servd_http_server *s) {
  if (s->stopping) return;
  s->stopping = true;
  if (s->listening) {
    s->listening = false;
    uv_close((uv_handle_t *)&s->listener, on_listener_closed);
  }
  for (conn *c = s->conns, *next; c; c = next) {
    next = c->next;
    if (c->state == C_IDLE && c->pending.len == 0 && !c->writing && c->obuf.len == 0) conn_close(c);
  }
}

int servd_http_server_active_requests(const servd_http_server *s) { return s->active; }
uint64_t servd_http_server_writes(const servd_http_server *s) { return s->n_writes; }
size_t servd_http_server_peak_output(const servd_http_server *s) { return s->peak_out; }
size_t servd_http_server_peak_input(const servd_http_server *s) { return s->peak_in; }
uint64_t servd_http_server_read_pauses(const servd_http_server *s) { return s->read_pauses; }

void servd_http_server_batch_begin(servd_http_server *s) { s->batch_depth++; }

void servd_http_server_batch_end(servd_http_server *s) {
  if (s->batch_depth <= 0 || --s->batch_depth > 0) return;
  /* conn_flush may close a connection, but handles are freed only in close callbacks, which the
   * loop runs after this returns, so every entry stays valid while the list is walked. */
  while (s->dirty) {
    conn *c = s->dirty;
    s->dirty = c->dirty_next;
    c->dirty = false;
    c->dirty_next = NULL;
    conn_flush(c);
  }
  server_maybe_done(s); /* closed during the batch: freeing waited for its end */
}

int servd_http_server_connections(const servd_http_server *s) { return s->n_conns; }

void servd_http_server_set_tls(servd_http_server *s, servd_tls_ctx *tls) { s->tls = tls; }
uint64_t servd_http_server_tls_failures(const servd_http_server *s) { return s->tls_failures; }

void servd_http_server_close(servd_http_server *s, void (*done)(void *), void *ud) {
  servd_http_server_stop_accepting(s);
  s->closing = true;
  s->done = done;
  s->done_ud = ud;
  for (conn *c = s->conns; c; c = c->next) conn_close(c);
  server_maybe_done(s);
}

const char *servd_http_header_get(const servd_http_req *r, const char *name) {
  for (int i = 0; i < r->n_headers; i++)
    if (strcasecmp(r->headers[i].name, name) == 0) return r->headers[i].value;
  return NULL;
}

void servd_http_set_header(servd_http_req *r, const char *name, const char *value) {
  conn *c = r->conn_;
  servd_buf_printf(&c->ehdr, "%s: %s\r\n", name, value);
}

static void write_head(conn *c, int status, const char *ctype, long long content_length) {
  servd_http_req *r = &c->req;
  bool keep = c->fr.keep_alive && !c->srv->stopping;
  r->status = status;
  servd_buf_printf(&c->obuf, "HTTP/1.1 %d %s\r\n", status, servd_http_reason(status));
  if (ctype) servd_buf_printf(&c->obuf, "Content-Type: %s\r\n", ctype);
  c->raw_stream = content_length < 0 && r->http_major == 1 && r->http_minor == 0;
  if (c->raw_stream) keep = false;
  if (content_length >= 0) servd_buf_printf(&c->obuf, "Content-Length: %lld\r\n", content_length);
  else if (c->raw_stream) servd_buf_puts(&c->obuf, "Cache-Control: no-cache\r\n");
  else servd_buf_puts(&c->obuf, "Transfer-Encoding: chunked\r\nCache-Control: no-cache\r\n");
  servd_buf_puts(&c->obuf, keep ? "Connection: keep-alive\r\n" : "Connection: close\r\n");
  if (r->request_id) servd_buf_printf(&c->obuf, "X-Request-Id: %s\r\n", r->request_id);
  if (c->ehdr.len) servd_buf_append(&c->obuf, c->ehdr.data, c->ehdr.len);
  servd_buf_append(&c->obuf, "\r\n", 2);
  if (!keep) c->close_at_end = true;
}

static void req_end(conn *c) {
  bool close = c->close_at_end || c->srv->stopping;
  req_finish(c, false);
  c->close_at_end = false;
  c->resp_obuf++; /* counts toward max_pipelined until written */
  if (c->obuf.oom) {
    conn_close(c); /* a truncated response must not reach the client */
    return;
  }
  if (close) {
    c->close_after = true;
    if (c->reading) {
      uv_read_stop((uv_stream_t *)&c->tcp);
      c->reading = false;
    }
    conn_flush(c);
    return;
  }
  conn_flush(c);
  conn_process(c); /* the next pipelined request, if any */
}

void servd_http_respond(servd_http_req *r, int status, const char *content_type, const char *body, size_t len) {
  conn *c = r->conn_;
  if (c->responded || c->closing) return;
  c->responded = true;
  write_head(c, status, content_type, (long long)len);
  if (!c->fr.head && len) servd_buf_append(&c->obuf, body, len);
  r->bytes_out = len;
  req_end(c);
}

void servd_http_stream_begin(servd_http_req *r, int status, const char *content_type) {
  conn *c = r->conn_;
  if (c->responded || c->closing) return;
  c->responded = true;
  c->chunked = true;
  write_head(c, status, content_type, -1);
  conn_flush(c);
}

int servd_http_stream_write(servd_http_req *r, const char *data, size_t len) {
  conn *c = r->conn_;
  if (c->closing || !c->chunked) return -1;
  if (len == 0) return 0;
  if (c->raw_stream) {
    if (!c->fr.head) servd_buf_append(&c->obuf, data, len);
  } else if (!c->fr.head) {
    servd_buf_printf(&c->obuf, "%zx\r\n", len);
    servd_buf_append(&c->obuf, data, len);
    servd_buf_append(&c->obuf, "\r\n", 2);
  }
  r->bytes_out += len;
  if (c->obuf.oom || conn_unsent(c) > c->srv->lim.max_output_bytes) {
    conn_close(c); /* a reader this far behind is dropped rather than buffered without end */
    return -1;
  }
  conn_flush(c);
  return 0;
}

void servd_http_stream_end(servd_http_req *r) {
  conn *c = r->conn_;
  if (c->closing || !c->chunked) return;
  if (!c->fr.head && !c->raw_stream) servd_buf_append(&c->obuf, "0\r\n\r\n", 5);
  c->chunked = false;
  req_end(c);
}
