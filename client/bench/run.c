/* The load loop: workers on one libuv loop, each running one request at a time over a keep-alive
 * HTTP/1.1 connection. Fixed concurrency keeps N workers busy; a request rate issues Poisson
 * arrivals from a timer and takes an idle worker (or makes one, up to --max-concurrency).
 *
 * Phases: warm-up (results dropped), measurement, then optionally /tokenize calls to count output
 * tokens. Timestamps are taken with uv_hrtime() when a read completes, before any parsing, so the
 * client's own JSON work does not enter TTFT or ITL. */
#include <http_parser.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <uv.h>

#include "bench.h"

#define READ_BUF 65536
#define MAX_SSE_LINE (16u << 20)       /* a longer SSE line is a parse error, not unbounded memory */
#define MAX_BODY (256u << 20)          /* KServe / tokenize response bodies */
#define MAX_ERROR_BODY 400             /* bytes of an error response kept for the message */
#define WARMUP_INDEX_BASE (1ull << 40) /* prompt indices of warm-up requests, apart from measured */

typedef enum phase { PH_WARMUP, PH_MEASURE, PH_TOKENIZE, PH_DONE } phase;
typedef enum req_kind { RK_STREAM, RK_KSERVE, RK_TOKENIZE } req_kind;

typedef struct run run;
typedef struct worker worker;

/* One TCP connection; freed in its close callback. w is NULL once its worker gave it up, which
 * turns late callbacks (cancelled connect or write) into no-ops. */
typedef struct conn {
  uv_tcp_t tcp;
  uv_connect_t creq;
  uv_write_t wreq;
  http_parser parser;
  worker *w;
  bool connected;
  bool reused;     /* it served a request before, so the server may close it as we write */
  bool eof;        /* the server closed its side */
  size_t received; /* response bytes read for the current request */
  char rbuf[READ_BUF];
} conn;

struct worker {
  run *r;
  uv_timer_t timer; /* request timeout; also defers synchronous failures */
  conn *c;          /* NULL when none is open */
  bool busy;
  req_kind kind;
  bench_record cur; /* the request in flight; its buffers are reused or moved into the results */
  long tok_target;  /* tokenize phase: which record, and whether prompt (odd) or output (even) */
  char *req;        /* request bytes; owned */
  size_t req_len, req_cap;
  bench_sse sse;
  char *body; /* non-stream response body; owned */
  size_t body_len, body_cap;
  int status;
  bool msg_complete, done_seen, retried;
  int fail_err;    /* set by a parser callback; acted on after http_parser_execute */
  int pending_err; /* a synchronous failure, reported from the timer */
  char fail_msg[128];
  uint64_t now;
  worker *next_idle;
  bench_conv *conv; /* multi-turn: the conversation this worker carries on; NULL otherwise */
  uv_timer_t think; /* multi-turn: the pause before the conversation's next turn */
  bool thinking;
};

struct run {
  const bench_config *cfg;
  bench_prompts *prompts;
  bench_results *res;
  uv_loop_t loop;
  struct sockaddr_storage addr;
  http_parser_settings settings;
  uv_timer_t arrival;
  bool arrival_active;
  worker **workers;
  int n_workers, cap_workers, max_workers;
  worker *idle;
  phase ph;
  long issued, finished, target; /* within the current phase; target < 0: until the deadline */
  long queued;                   /* rate mode: arrivals waiting for a worker */
  uint64_t t0, deadline, t_last_end, next_arrival;
  long rec_cap;
  bench_rng arrival_rng;
  char *kserve_body;
  bool arrivals_done;
  long tok_next, tok_total;
  bool tok_failed;
  uv_signal_t sigint; /* first Ctrl-C: stop issuing and report; second: abandon what is in flight */
  bool sig_active;
  int interrupts;
  bench_conv *convs; /* multi-turn: every conversation, taken in order by free workers */
  int next_conv;
};

static void dispatch(worker *w);
static void finish(worker *w, int err, const char *msg);
static void advance(run *r);

const char *bench_err_name(int err) {
  static const char *const names[BENCH_ERR__COUNT] = {"ok",    "connect",    "timeout", "http",
                                                      "parse", "disconnect", "stream"};
  return err >= 0 && err < BENCH_ERR__COUNT ? names[err] : "unknown";
}

/* ---- connections ---- */

static void conn_closed(uv_handle_t *h) { free(h->data); }

/* Detaches the worker's connection and closes it. */
static void drop_conn(worker *w) {
  conn *c = w->c;
  if (!c) return;
  w->c = NULL;
  c->w = NULL;
  uv_close((uv_handle_t *)&c->tcp, conn_closed);
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  (void)suggested;
  conn *c = h->data;
  *buf = uv_buf_init(c->rbuf, sizeof c->rbuf);
}

static bool is_2xx(int s) { return s >= 200 && s < 300; }

static int append(char **buf, size_t *len, size_t *cap, const char *p, size_t n, size_t max) {
  if (*len + n + 1 > *cap) {
    if (*len + n > max) return -1;
    size_t nc = *cap ? *cap : 4096;
    while (nc < *len + n + 1) nc *= 2;
    char *b = realloc(*buf, nc);
    if (!b) return -1;
    *buf = b;
    *cap = nc;
  }
  memcpy(*buf + *len, p, n);
  *len += n;
  (*buf)[*len] = '\0';
  return 0;
}

/* A non-empty content chunk arrived at w->now. */
static int on_token(worker *w, const char *text, size_t len) {
  bench_record *rec = &w->cur;
  if (!rec->t_first) {
    rec->t_first = w->now;
  } else {
    if (rec->n_itl == rec->itl_cap) { /* only when the server sends more chunks than max_tokens */
      int nc = rec->itl_cap ? rec->itl_cap * 2 : 64;
      float *p = realloc(rec->itl_ms, (size_t)nc * sizeof *p);
      if (!p) return -1;
      rec->itl_ms = p;
      rec->itl_cap = nc;
    }
    rec->itl_ms[rec->n_itl++] = (float)((double)(w->now - rec->t_last) / 1e6);
  }
  rec->t_last = w->now;
  rec->out_chunks++;
  const bench_config *cfg = w->r->cfg;
  if ((cfg->count_mode == BENCH_COUNT_TOKENIZE || cfg->conversations > 0) &&
      append(&rec->text, &rec->text_len, &rec->text_cap, text, len, MAX_BODY))
    return -1;
  return 0;
}

static int on_sse_event(void *ctx, const char *data, size_t len) {
  worker *w = ctx;
  if (w->done_seen) return 0; /* anything after [DONE] is ignored */
  if (len == 6 && memcmp(data, "[DONE]", 6) == 0) {
    w->done_seen = true;
    return 0;
  }
  bench_chunk ch;
  json_t *doc = NULL;
  int rc = bench_chunk_parse(data, len, w->r->cfg->api, &ch, &doc);
  if (rc) {
    w->fail_err = BENCH_ERR_PARSE;
    snprintf(w->fail_msg, sizeof w->fail_msg, "%s", ch.errmsg);
  } else if (ch.is_error) {
    w->fail_err = BENCH_ERR_STREAM;
    snprintf(w->fail_msg, sizeof w->fail_msg, "%s", ch.errmsg);
    rc = -1;
  } else {
    if (ch.usage_completion_tokens >= 0) w->cur.usage_completion_tokens = ch.usage_completion_tokens;
    if (ch.text && ch.text_len && on_token(w, ch.text, ch.text_len)) {
      w->fail_err = BENCH_ERR_PARSE;
      snprintf(w->fail_msg, sizeof w->fail_msg, "out of memory storing the stream");
      rc = -1;
    }
  }
  json_decref(doc);
  return rc;
}

static int on_headers_complete(http_parser *p) {
  conn *c = p->data;
  if (c->w) c->w->status = (int)p->status_code;
  return 0;
}

static int on_body(http_parser *p, const char *at, size_t n) {
  conn *c = p->data;
  worker *w = c->w;
  if (!w) return 0;
  if (!is_2xx(w->status)) { /* keep the start of an error body for the message */
    size_t room = w->body_len < MAX_ERROR_BODY ? MAX_ERROR_BODY - w->body_len : 0;
    if (room && append(&w->body, &w->body_len, &w->body_cap, at, n < room ? n : room, MAX_BODY)) {
      w->fail_err = BENCH_ERR_PARSE;
      snprintf(w->fail_msg, sizeof w->fail_msg, "out of memory");
    }
    return 0;
  }
  if (w->kind == RK_STREAM) {
    if (bench_sse_feed(&w->sse, at, n, on_sse_event, w) && !w->fail_err) {
      w->fail_err = BENCH_ERR_PARSE;
      snprintf(w->fail_msg, sizeof w->fail_msg, "SSE line longer than %u bytes", MAX_SSE_LINE);
    }
    if (w->fail_err) http_parser_pause(p, 1);
    return 0;
  }
  if (append(&w->body, &w->body_len, &w->body_cap, at, n, MAX_BODY)) {
    w->fail_err = BENCH_ERR_PARSE;
    snprintf(w->fail_msg, sizeof w->fail_msg, "response body over %u MiB", MAX_BODY >> 20);
    http_parser_pause(p, 1);
  }
  return 0;
}

static int on_message_complete(http_parser *p) {
  conn *c = p->data;
  if (c->w) c->w->msg_complete = true;
  http_parser_pause(p, 1); /* the worker acts after http_parser_execute returns */
  return 0;
}

/* The response is complete: judge it. */
static void complete(worker *w) {
  conn *c = w->c;
  bool keep = !c->eof && http_should_keep_alive(&c->parser) != 0;
  char msg[160];
  if (!is_2xx(w->status)) {
    const char *b = w->body ? w->body : "";
    snprintf(msg, sizeof msg, "HTTP %d: %.120s", w->status, b);
    for (char *q = msg; *q; q++)
      if (*q == '\n' || *q == '\r') *q = ' ';
    if (!keep) drop_conn(w);
    finish(w, BENCH_ERR_HTTP, msg);
    return;
  }
  int err = BENCH_OK;
  msg[0] = '\0';
  if (w->kind == RK_STREAM) {
    /* a last event without its blank line still counts */
    if (!w->done_seen && w->sse.has_data && bench_sse_feed(&w->sse, "\n\n", 2, on_sse_event, w) == 0 && w->fail_err) {
      err = w->fail_err;
      snprintf(msg, sizeof msg, "%s", w->fail_msg);
    } else if (!w->done_seen) {
      err = BENCH_ERR_PARSE;
      snprintf(msg, sizeof msg, "stream ended without \"data: [DONE]\"");
    }
    w->cur.out_tokens = w->cur.out_chunks;
  } else {
    json_error_t jerr;
    json_t *doc = json_loadb(w->body ? w->body : "", w->body_len, 0, &jerr);
    if (w->kind == RK_KSERVE) {
      if (!json_is_array(json_object_get(doc, "outputs"))) {
        err = BENCH_ERR_PARSE;
        snprintf(msg, sizeof msg, "KServe response without an \"outputs\" array%s%.60s", doc ? "" : ": ",
                 doc ? "" : jerr.text);
      }
    } else { /* tokenize: llama.cpp and vLLM return {"tokens": [...]}, vLLM also "count" */
      json_t *t = json_object_get(doc, "tokens");
      json_t *cnt = json_object_get(doc, "count");
      long n = json_is_array(t) ? (long)json_array_size(t) : json_is_integer(cnt) ? (long)json_integer_value(cnt) : -1;
      if (n < 0) {
        err = BENCH_ERR_PARSE;
        snprintf(msg, sizeof msg, "/tokenize response without \"tokens\"");
      } else {
        w->cur.out_tokens = (int)n; /* carried to the target record in finish() */
      }
    }
    json_decref(doc);
  }
  if (!keep) drop_conn(w);
  finish(w, err, msg[0] ? msg : NULL);
}

static void issue_on_new_conn(worker *w);

/* The connection failed before any response byte: a reused keep-alive connection may have been
 * closed by the server just as we wrote, so retry once on a fresh one, as HTTP clients do. */
static void conn_failed(worker *w, int err, const char *msg) {
  conn *c = w->c;
  bool retry = c && c->reused && c->received == 0 && !w->retried;
  drop_conn(w);
  if (retry) {
    w->retried = true;
    issue_on_new_conn(w);
    return;
  }
  finish(w, err, msg);
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf) {
  conn *c = s->data;
  worker *w = c->w;
  if (!w) return;
  if (!w->busy) { /* an idle keep-alive connection: the server closed it or sent junk */
    if (nread != 0) drop_conn(w);
    return;
  }
  w->now = uv_hrtime();
  if (nread == 0) return;
  size_t parsed;
  if (nread < 0) {
    if (nread == UV_EOF) { /* tells the parser; completes a read-until-close body */
      c->eof = true;
      http_parser_execute(&c->parser, &w->r->settings, NULL, 0);
      /* a stream that reached [DONE] is whole even if the last empty chunk never came */
      if (w->msg_complete || (w->kind == RK_STREAM && w->done_seen && is_2xx(w->status) && !w->fail_err)) {
        complete(w);
        return;
      }
    }
    char msg[128];
    snprintf(msg, sizeof msg, "connection %s after %zu response bytes",
             nread == UV_EOF ? "closed by the server" : uv_strerror((int)nread), c->received);
    conn_failed(w, BENCH_ERR_DISCONNECT, msg);
    return;
  }
  c->received += (size_t)nread;
  parsed = http_parser_execute(&c->parser, &w->r->settings, buf->base, (size_t)nread);
  (void)parsed;
  enum http_errno e = HTTP_PARSER_ERRNO(&c->parser);
  if (w->fail_err) {
    drop_conn(w);
    finish(w, w->fail_err, w->fail_msg);
  } else if (e != HPE_OK && e != HPE_PAUSED) {
    char msg[128];
    snprintf(msg, sizeof msg, "bad HTTP response: %s", http_errno_description(e));
    drop_conn(w);
    finish(w, BENCH_ERR_PARSE, msg);
  } else if (w->msg_complete) {
    complete(w);
  }
}

static void on_write(uv_write_t *req, int status) {
  conn *c = req->data;
  if (!c->w || status == 0) return;
  char msg[128];
  snprintf(msg, sizeof msg, "write failed: %s", uv_strerror(status));
  conn_failed(c->w, BENCH_ERR_DISCONNECT, msg);
}

static void send_request(worker *w) {
  conn *c = w->c;
  http_parser_init(&c->parser, HTTP_RESPONSE);
  c->parser.data = c;
  c->received = 0;
  uv_buf_t b = uv_buf_init(w->req, (unsigned)w->req_len);
  c->wreq.data = c;
  int rc = uv_write(&c->wreq, (uv_stream_t *)&c->tcp, &b, 1, on_write);
  if (rc) {
    char msg[128];
    snprintf(msg, sizeof msg, "write failed: %s", uv_strerror(rc));
    conn_failed(w, BENCH_ERR_DISCONNECT, msg);
  }
}

/* "connect to HOST:PORT failed: WHY" for a libuv error `err`, truncated to fit `cap`. */
static void connect_failure_msg(const worker *w, int err, char *msg, size_t cap) {
  snprintf(msg, cap, "connect to %.60s:%d failed: %.40s", w->r->cfg->host, w->r->cfg->port, uv_strerror(err));
}

static void on_connect(uv_connect_t *req, int status) {
  conn *c = req->data;
  worker *w = c->w;
  if (!w) return;
  if (status) {
    char msg[128];
    connect_failure_msg(w, status, msg, sizeof msg);
    drop_conn(w);
    finish(w, BENCH_ERR_CONNECT, msg);
    return;
  }
  c->connected = true;
  int rc = uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read);
  if (rc) {
    drop_conn(w);
    finish(w, BENCH_ERR_CONNECT, uv_strerror(rc));
    return;
  }
  send_request(w);
}

/* Reports a failure from the next loop turn, so a synchronous error cannot recurse into dispatch. */
static void defer_failure(worker *w, int err, const char *msg);

static void issue_on_new_conn(worker *w) {
  conn *c = calloc(1, sizeof *c);
  if (!c) {
    defer_failure(w, BENCH_ERR_CONNECT, "out of memory");
    return;
  }
  uv_tcp_init(&w->r->loop, &c->tcp);
  c->tcp.data = c;
  c->creq.data = c;
  c->w = w;
  w->c = c;
  uv_tcp_nodelay(&c->tcp, 1);
  int rc = uv_tcp_connect(&c->creq, &c->tcp, (const struct sockaddr *)&w->r->addr, on_connect);
  if (rc) {
    char msg[128];
    connect_failure_msg(w, rc, msg, sizeof msg);
    drop_conn(w);
    defer_failure(w, BENCH_ERR_CONNECT, msg);
  }
}

/* ---- requests ---- */

static void on_timer(uv_timer_t *t) {
  worker *w = t->data;
  if (!w->busy) return;
  if (w->pending_err) {
    finish(w, w->pending_err, w->fail_msg);
    return;
  }
  char msg[128];
  snprintf(msg, sizeof msg, "no complete response within %.3g s", w->r->cfg->timeout_s);
  drop_conn(w);
  finish(w, BENCH_ERR_TIMEOUT, msg);
}

static void defer_failure(worker *w, int err, const char *msg) {
  w->pending_err = err;
  snprintf(w->fail_msg, sizeof w->fail_msg, "%s", msg ? msg : "");
  uv_timer_start(&w->timer, on_timer, 0, 0);
}

static int build_request(worker *w, const char *path, const char *body) {
  const bench_config *cfg = w->r->cfg;
  size_t blen = strlen(body);
  size_t need = blen + strlen(path) + strlen(cfg->host) + (cfg->api_key ? strlen(cfg->api_key) : 0) + 512;
  if (need > w->req_cap) {
    char *p = realloc(w->req, need);
    if (!p) return -1;
    w->req = p;
    w->req_cap = need;
  }
  bool v6 = strchr(cfg->host, ':') != NULL; /* an IPv6 literal goes in brackets */
  int n = snprintf(w->req, w->req_cap,
                   "POST %s HTTP/1.1\r\nHost: %s%s%s:%d\r\nUser-Agent: servd-bench/" BENCH_VERSION
                   "\r\nContent-Type: application/json\r\nAccept: %s\r\n%s%s%sContent-Length: %zu\r\n"
                   "Connection: keep-alive\r\n\r\n",
                   path, v6 ? "[" : "", cfg->host, v6 ? "]" : "", cfg->port,
                   w->kind == RK_STREAM ? "text/event-stream" : "application/json",
                   cfg->api_key ? "Authorization: Bearer " : "", cfg->api_key ? cfg->api_key : "",
                   cfg->api_key ? "\r\n" : "", blen);
  if (n < 0 || (size_t)n + blen >= w->req_cap) return -1;
  memcpy(w->req + n, body, blen);
  w->req_len = (size_t)n + blen;
  return 0;
}

/* Starts a request of the worker's kind; idx picks the prompt (or the record to tokenize). */
static void issue(worker *w, uint64_t idx) {
  run *r = w->r;
  const bench_config *cfg = r->cfg;
  bench_record *rec = &w->cur;
  /* reuse the record's buffers */
  float *itl = rec->itl_ms;
  int itl_cap = rec->itl_cap;
  char *text = rec->text;
  size_t text_cap = rec->text_cap;
  memset(rec, 0, sizeof *rec);
  rec->itl_ms = itl;
  rec->itl_cap = itl_cap;
  rec->text = text;
  rec->text_cap = text_cap;
  rec->usage_completion_tokens = -1;
  rec->prompt_index = (long)idx;
  rec->conversation = rec->turn = -1;
  w->busy = true;
  w->status = 0;
  w->msg_complete = w->done_seen = w->retried = false;
  w->fail_err = w->pending_err = 0;
  w->body_len = 0;
  bench_sse_reset(&w->sse);
  rec->t_start = uv_hrtime();

  char *body = NULL;
  char path[2048];
  if (w->kind == RK_TOKENIZE) {
    bench_record *t = &r->res->records[w->tok_target / 2];
    if (w->tok_target % 2 == 0) {
      body = bench_body_tokenize(cfg, t->text ? t->text : "", t->text_len);
    } else {
      int in, out;
      const char *p = bench_prompts_get(r->prompts, (uint64_t)t->prompt_index, &in, &out);
      body = p ? bench_body_tokenize(cfg, p, strlen(p)) : NULL;
    }
    snprintf(path, sizeof path, "%s/tokenize", cfg->base_path);
  } else if (w->kind == RK_KSERVE) {
    snprintf(path, sizeof path, "%s", cfg->endpoint);
  } else {
    int in = 0, out = 0;
    if (w->conv) {
      rec->conversation = w->conv->index;
      rec->turn = w->conv->next_turn;
      out = cfg->output_len;
      body = bench_body_turn(cfg, w->conv, &in);
    } else {
      const char *p = bench_prompts_get(r->prompts, idx, &in, &out);
      if (p) body = bench_body_openai(cfg, p, out);
    }
    rec->in_tokens = in;
    if (out + 8 > rec->itl_cap) { /* one allocation per request, none per token */
      float *q = realloc(rec->itl_ms, (size_t)(out + 8) * sizeof *q);
      if (q) {
        rec->itl_ms = q;
        rec->itl_cap = out + 8;
      }
    }
    snprintf(path, sizeof path, "%s", cfg->endpoint);
  }
  /* every KServe request sends the same generated tensor */
  const char *src = w->kind == RK_KSERVE ? r->kserve_body : body;
  int rc = src ? build_request(w, path, src) : -1;
  free(body);
  if (rc) {
    defer_failure(w, BENCH_ERR_PARSE, "could not build the request body (out of memory?)");
    return;
  }
  uv_timer_start(&w->timer, on_timer, (uint64_t)(cfg->timeout_s * 1000.0 + 0.5), 0);
  if (w->c && w->c->connected) {
    w->c->reused = true;
    send_request(w);
  } else {
    drop_conn(w);
    issue_on_new_conn(w);
  }
}

static int keep_record(run *r, bench_record *rec) {
  bench_results *res = r->res;
  if (res->n_records == r->rec_cap) {
    long nc = r->rec_cap ? r->rec_cap * 2 : 1024;
    bench_record *p = realloc(res->records, (size_t)nc * sizeof *p);
    if (!p) return -1;
    res->records = p;
    r->rec_cap = nc;
  }
  res->records[res->n_records++] = *rec;
  /* the results own the buffers now */
  rec->itl_ms = NULL;
  rec->itl_cap = 0;
  rec->text = NULL;
  rec->text_cap = 0;
  return 0;
}

static void finish(worker *w, int err, const char *msg) {
  run *r = w->r;
  bench_record *rec = &w->cur;
  uv_timer_stop(&w->timer);
  w->busy = false;
  rec->err = err;
  rec->http_status = w->status;
  rec->t_end = uv_hrtime();
  if (err) {
    snprintf(rec->errmsg, sizeof rec->errmsg, "%s", msg ? msg : bench_err_name(err));
    /* after a failure the connection's state is unknown, except for a complete error response */
    if (err != BENCH_ERR_HTTP) drop_conn(w);
  }
  r->finished++;
  if (r->interrupts >= 2) {
    /* abandoned by a second interrupt: not a result */
  } else if (r->ph == PH_WARMUP) {
    if (err) r->res->warmup_failed++;
  } else if (r->ph == PH_MEASURE) {
    r->t_last_end = rec->t_end;
    /* the answer joins the history the next turn resends; a failed turn leaves an empty one */
    if (w->conv &&
        bench_conv_answer(w->conv, err ? NULL : rec->text, err ? 0 : rec->text_len, err ? 0 : rec->out_tokens))
      fprintf(stderr, "servd-bench: out of memory keeping a conversation\n");
    if (err && !r->res->first_error[0])
      snprintf(r->res->first_error, sizeof r->res->first_error, "%s: %s", bench_err_name(err), rec->errmsg);
    if (keep_record(r, rec)) fprintf(stderr, "servd-bench: out of memory keeping results\n");
  } else if (r->ph == PH_TOKENIZE) {
    bench_record *t = &r->res->records[w->tok_target / 2];
    if (err) {
      if (!r->tok_failed) snprintf(r->res->tokenize_error, sizeof r->res->tokenize_error, "%s", rec->errmsg);
      r->tok_failed = true;
    } else if (w->tok_target % 2 == 0) {
      t->out_tokens = rec->out_tokens;
    } else {
      t->in_tokens = rec->out_tokens;
    }
  }
  dispatch(w);
}

/* ---- scheduling ---- */

static worker *worker_new(run *r) {
  if (r->n_workers == r->cap_workers) {
    int nc = r->cap_workers ? r->cap_workers * 2 : 16;
    worker **p = realloc(r->workers, (size_t)nc * sizeof *p);
    if (!p) return NULL;
    r->workers = p;
    r->cap_workers = nc;
  }
  worker *w = calloc(1, sizeof *w);
  if (!w) return NULL;
  w->r = r;
  uv_timer_init(&r->loop, &w->timer);
  w->timer.data = w;
  uv_timer_init(&r->loop, &w->think);
  w->think.data = w;
  bench_sse_init(&w->sse, MAX_SSE_LINE);
  r->workers[r->n_workers++] = w;
  return w;
}

/* An idle worker, or a new one when under the cap; NULL when all are busy. */
static worker *take_worker(run *r) {
  if (r->idle) {
    worker *w = r->idle;
    r->idle = w->next_idle;
    w->next_idle = NULL;
    return w;
  }
  if (r->max_workers > 0 && r->n_workers >= r->max_workers) return NULL;
  return worker_new(r);
}

static void make_idle(worker *w) {
  w->next_idle = w->r->idle;
  w->r->idle = w;
}

static bool more_to_issue(run *r) {
  if (r->interrupts) return false;
  if (r->target >= 0) return r->issued < r->target;
  return uv_hrtime() < r->deadline;
}

static uint64_t phase_index(run *r) {
  return r->ph == PH_WARMUP ? WARMUP_INDEX_BASE + (uint64_t)r->issued : (uint64_t)r->issued;
}

static void start_one(run *r, worker *w) {
  w->kind = r->cfg->api == BENCH_API_KSERVE ? RK_KSERVE : RK_STREAM;
  uint64_t idx = phase_index(r);
  r->issued++;
  issue(w, idx);
}

static void start_tokenize(run *r, worker *w) {
  /* skip failed records and empty outputs */
  while (r->tok_next < r->tok_total) {
    bench_record *t = &r->res->records[r->tok_next / 2];
    if (t->err == BENCH_OK && (r->tok_next % 2 == 1 || t->text_len > 0)) break;
    r->tok_next++;
  }
  if (r->tok_next >= r->tok_total || r->tok_failed) {
    make_idle(w);
    advance(r);
    return;
  }
  w->kind = RK_TOKENIZE;
  w->tok_target = r->tok_next++;
  r->issued++;
  issue(w, 0);
}

/* Multi-turn: asks the worker's conversation its next turn. */
static void start_turn(run *r, worker *w) {
  w->kind = RK_STREAM;
  r->issued++;
  issue(w, (uint64_t)w->conv->index * (uint64_t)r->cfg->turns + (uint64_t)w->conv->next_turn);
}

static void conv_dispatch(worker *w);

static void on_think(uv_timer_t *t) {
  worker *w = t->data;
  if (!w->thinking) return;
  w->thinking = false;
  if (w->r->interrupts) {
    w->conv = NULL;
    conv_dispatch(w);
    return;
  }
  start_turn(w->r, w);
}

/* Multi-turn: the worker carries on with its conversation (after the think time) until its last
 * turn, then takes the next conversation nobody has started. */
static void conv_dispatch(worker *w) {
  run *r = w->r;
  const bench_config *cfg = r->cfg;
  if (!r->interrupts) {
    if (w->conv && w->conv->next_turn < cfg->turns) {
      if (cfg->think_time_s > 0) {
        w->thinking = true;
        uv_timer_start(&w->think, on_think, (uint64_t)(cfg->think_time_s * 1000.0 + 0.5), 0);
      } else {
        start_turn(r, w);
      }
      return;
    }
    if (r->next_conv < cfg->conversations) {
      w->conv = &r->convs[r->next_conv++];
      start_turn(r, w);
      return;
    }
  }
  w->conv = NULL;
  make_idle(w);
  advance(r);
}

/* What a worker does next after finishing a request. */
static void dispatch(worker *w) {
  run *r = w->r;
  switch (r->ph) {
  case PH_WARMUP:
  case PH_MEASURE:
    if (r->ph == PH_MEASURE && r->cfg->conversations > 0) {
      conv_dispatch(w);
      return;
    }
    if (r->ph == PH_MEASURE && r->cfg->request_rate > 0) {
      if (r->queued > 0) {
        r->queued--;
        start_one(r, w);
        return;
      }
    } else if (more_to_issue(r)) {
      start_one(r, w);
      return;
    }
    make_idle(w);
    advance(r);
    return;
  case PH_TOKENIZE: start_tokenize(r, w); return;
  case PH_DONE: make_idle(w); return;
  }
}

static void on_arrival(uv_timer_t *t);

static void schedule_arrival(run *r) {
  uint64_t now = uv_hrtime();
  uint64_t delay_ms = r->next_arrival > now ? (r->next_arrival - now + 999999) / 1000000 : 0;
  uv_timer_start(&r->arrival, on_arrival, delay_ms, 0);
}

static void on_arrival(uv_timer_t *t) {
  run *r = t->data;
  uint64_t now = uv_hrtime();
  while (r->next_arrival <= now) {
    if (r->target >= 0 ? r->issued + r->queued >= r->target : r->next_arrival >= r->deadline) {
      r->arrivals_done = true;
      advance(r);
      return;
    }
    worker *w = take_worker(r);
    if (w) start_one(r, w);
    else r->queued++;
    r->next_arrival += (uint64_t)(bench_rng_exponential(&r->arrival_rng, r->cfg->request_rate) * 1e9);
  }
  schedule_arrival(r);
}

static int busy_workers(run *r) {
  int n = 0;
  for (int i = 0; i < r->n_workers; i++) n += r->workers[i]->busy || r->workers[i]->thinking;
  return n;
}

static void close_all(run *r) {
  if (r->arrival_active) uv_close((uv_handle_t *)&r->arrival, NULL);
  r->arrival_active = false;
  if (r->sig_active) uv_close((uv_handle_t *)&r->sigint, NULL);
  r->sig_active = false;
  for (int i = 0; i < r->n_workers; i++) {
    worker *w = r->workers[i];
    drop_conn(w);
    uv_close((uv_handle_t *)&w->timer, NULL);
    uv_close((uv_handle_t *)&w->think, NULL);
  }
}

static void begin_phase(run *r, phase ph);

/* Moves to the next phase once the current one has nothing in flight and nothing left to issue. */
static void advance(run *r) {
  if (r->ph == PH_DONE) return;
  if (busy_workers(r) > 0) return;
  if (r->interrupts) {
    begin_phase(r, PH_DONE);
    return;
  }
  if (r->ph == PH_MEASURE && r->cfg->request_rate > 0) {
    if (!r->arrivals_done || r->queued > 0) return;
  } else if (r->ph != PH_TOKENIZE && more_to_issue(r)) {
    return;
  }
  if (r->ph == PH_TOKENIZE && r->tok_next < r->tok_total && !r->tok_failed) return;
  if (r->ph == PH_WARMUP) begin_phase(r, PH_MEASURE);
  else if (r->ph == PH_MEASURE && r->cfg->count_mode == BENCH_COUNT_TOKENIZE && r->cfg->api != BENCH_API_KSERVE)
    begin_phase(r, PH_TOKENIZE);
  else begin_phase(r, PH_DONE);
}

static void begin_phase(run *r, phase ph) {
  const bench_config *cfg = r->cfg;
  r->ph = ph;
  r->issued = r->finished = 0;
  r->queued = 0;
  if (ph == PH_WARMUP) {
    r->target = cfg->warmup;
    int n = cfg->concurrency > 0 ? cfg->concurrency : (cfg->max_concurrency > 0 ? cfg->max_concurrency : 1);
    if (n > cfg->warmup) n = cfg->warmup;
    if (n == 0) {
      begin_phase(r, PH_MEASURE);
      return;
    }
    for (int i = 0; i < n; i++) {
      worker *w = take_worker(r);
      if (w) start_one(r, w);
    }
  } else if (ph == PH_MEASURE) {
    r->target = cfg->num_requests > 0 ? cfg->num_requests : -1;
    r->t0 = uv_hrtime();
    r->t_last_end = r->t0;
    r->deadline = r->t0 + (uint64_t)(cfg->duration_s * 1e9);
    if (cfg->request_rate > 0) {
      r->max_workers = cfg->max_concurrency;
      bench_rng_seed(&r->arrival_rng, bench_mix(cfg->seed, 0xa441a1ULL));
      /* the first request goes at once; later ones after exponential gaps */
      r->next_arrival = r->t0;
      r->arrivals_done = false;
      on_arrival(&r->arrival);
    } else if (cfg->conversations > 0) {
      r->max_workers = cfg->concurrency;
      for (int i = 0; i < cfg->concurrency && r->next_conv < cfg->conversations; i++) {
        worker *w = take_worker(r);
        if (!w) break;
        w->conv = NULL;
        conv_dispatch(w);
      }
      advance(r);
    } else {
      r->max_workers = cfg->concurrency;
      for (int i = 0; i < cfg->concurrency && more_to_issue(r); i++) {
        worker *w = take_worker(r);
        if (w) start_one(r, w);
      }
      advance(r); /* nothing issued at all (duration 0) */
    }
  } else if (ph == PH_TOKENIZE) {
    r->res->duration_s = (double)(r->t_last_end - r->t0) / 1e9;
    r->tok_total = 2 * r->res->n_records;
    r->tok_next = 0;
    worker *w = take_worker(r);
    if (w) start_tokenize(r, w);
  } else {
    if (r->res->duration_s == 0) r->res->duration_s = (double)(r->t_last_end - r->t0) / 1e9;
    close_all(r);
  }
}

static void on_sigint(uv_signal_t *h, int signum) {
  (void)signum;
  run *r = h->data;
  r->interrupts++;
  if (r->interrupts == 1) {
    uv_timer_stop(&r->arrival);
    r->arrivals_done = true;
    r->queued = 0;
    if (r->ph == PH_TOKENIZE && !r->tok_failed) {
      r->tok_failed = true;
      snprintf(r->res->tokenize_error, sizeof r->res->tokenize_error, "interrupted");
    }
    fprintf(stderr,
            "servd-bench: interrupted: waiting for %d request(s) in flight, then reporting "
            "(interrupt again to abandon them)\n",
            busy_workers(r));
    advance(r);
    return;
  }
  fprintf(stderr, "servd-bench: abandoning the requests in flight\n");
  for (int i = 0; i < r->n_workers; i++) {
    worker *w = r->workers[i];
    if (w->busy) {
      drop_conn(w);
      finish(w, BENCH_ERR_TIMEOUT, "abandoned");
    } else if (w->thinking) {
      uv_timer_stop(&w->think);
      w->thinking = false;
      w->conv = NULL;
      make_idle(w);
    }
  }
  advance(r);
}

/* ---- results ---- */

/* A successful request's figures in ms: TTFT (e2e when no token came), TPOT (0 under 2 tokens). */
static void request_times(const bench_record *rec, double *ttft, double *tpot, double *e2e) {
  *e2e = (double)(rec->t_end - rec->t_start) / 1e6;
  *ttft = rec->t_first ? (double)(rec->t_first - rec->t_start) / 1e6 : *e2e;
  *tpot = rec->out_tokens > 1 ? (*e2e - *ttft) / (double)(rec->out_tokens - 1) : 0;
}

long bench_metric_samples(const bench_results *res, bench_metric m, double **out) {
  long cap = 0;
  for (long i = 0; i < res->n_records; i++)
    if (res->records[i].err == BENCH_OK) cap += m == BENCH_METRIC_ITL ? res->records[i].n_itl : 1;
  double *v = calloc((size_t)cap + 1, sizeof *v);
  *out = v;
  if (!v) return -1;
  long n = 0;
  for (long i = 0; i < res->n_records; i++) {
    const bench_record *rec = &res->records[i];
    if (rec->err != BENCH_OK) continue;
    double ttft, tpot, e2e;
    request_times(rec, &ttft, &tpot, &e2e);
    switch (m) {
    case BENCH_METRIC_TTFT:
      if (rec->t_first) v[n++] = ttft;
      break;
    case BENCH_METRIC_TPOT:
      if (rec->t_first && rec->out_tokens > 1) v[n++] = tpot;
      break;
    case BENCH_METRIC_ITL:
      for (int k = 0; k < rec->n_itl; k++) v[n++] = rec->itl_ms[k];
      break;
    case BENCH_METRIC_E2E: v[n++] = e2e; break;
    case BENCH_METRIC__COUNT: break;
    }
  }
  return n;
}

static void compute(const bench_config *cfg, bench_results *res, bool tokenized) {
  bool any_usage = false;
  long usage = 0;
  for (long i = 0; i < res->n_records; i++) {
    bench_record *rec = &res->records[i];
    if (rec->err != BENCH_OK) {
      res->failed++;
      res->errors[rec->err]++;
      if (rec->err == BENCH_ERR_HTTP && rec->http_status > 0 && rec->http_status < 600)
        res->http_status_count[rec->http_status]++;
      continue;
    }
    res->completed++;
    res->input_tokens += rec->in_tokens;
    res->output_tokens += rec->out_tokens;
    res->output_chunks += rec->out_chunks;
    if (rec->usage_completion_tokens >= 0) {
      any_usage = true;
      usage += rec->usage_completion_tokens;
    }
    double ttft, tpot, e2e;
    request_times(rec, &ttft, &tpot, &e2e);
    if (cfg->has_goodput && bench_slo_met(&cfg->goodput, ttft, tpot, e2e)) res->good++;
  }
  res->usage_output_tokens = any_usage ? usage : -1;
  res->counted_by = tokenized ? BENCH_COUNT_TOKENIZE : BENCH_COUNT_CHUNKS;
  double d = res->duration_s > 0 ? res->duration_s : 1e-9;
  res->requests_per_s = (double)res->completed / d;
  res->output_tokens_per_s = (double)res->output_tokens / d;
  res->total_tokens_per_s = (double)(res->input_tokens + res->output_tokens) / d;
  res->goodput_per_s = (double)res->good / d;
  bench_summary *sums[BENCH_METRIC__COUNT] = {&res->ttft, &res->tpot, &res->itl, &res->e2e};
  for (int m = 0; m < BENCH_METRIC__COUNT; m++) {
    double *v;
    long n = bench_metric_samples(res, (bench_metric)m, &v);
    if (n < 0) fprintf(stderr, "servd-bench: out of memory computing statistics\n");
    bench_summarize(v, n < 0 ? 0 : n, sums[m]);
    free(v);
  }
}

static int resolve(run *r) {
  const bench_config *cfg = r->cfg;
  char port[16];
  snprintf(port, sizeof port, "%d", cfg->port);
  uv_getaddrinfo_t req;
  struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
  int rc = uv_getaddrinfo(&r->loop, &req, NULL, cfg->host, port, &hints); /* synchronous */
  if (rc) {
    fprintf(stderr, "servd-bench: cannot resolve %s: %s\n", cfg->host, uv_strerror(rc));
    return -1;
  }
  memcpy(&r->addr, req.addrinfo->ai_addr, req.addrinfo->ai_addrlen);
  uv_freeaddrinfo(req.addrinfo);
  return 0;
}

int bench_run(const bench_config *cfg, bench_prompts *prompts, bench_results *res) {
  memset(res, 0, sizeof *res);
  res->usage_output_tokens = -1;
  time_t now = time(NULL);
  struct tm tm;
  gmtime_r(&now, &tm);
  strftime(res->started_at, sizeof res->started_at, "%Y-%m-%dT%H:%M:%SZ", &tm);

  run *r = calloc(1, sizeof *r);
  if (!r) return -1;
  int rc = -1;
  r->cfg = cfg;
  r->prompts = prompts;
  r->res = res;
  r->settings.on_headers_complete = on_headers_complete;
  r->settings.on_body = on_body;
  r->settings.on_message_complete = on_message_complete;
  if (uv_loop_init(&r->loop)) {
    free(r);
    return -1;
  }
  if (resolve(r)) goto fail;
  if (cfg->api == BENCH_API_KSERVE) {
    r->kserve_body = bench_body_kserve(cfg, bench_mix(cfg->seed, 0x6b73ULL));
    if (!r->kserve_body) {
      fprintf(stderr, "servd-bench: could not build the KServe request body\n");
      goto fail;
    }
  }
  uv_timer_init(&r->loop, &r->arrival);
  r->arrival.data = r;
  r->arrival_active = true;
  uv_signal_init(&r->loop, &r->sigint);
  r->sigint.data = r;
  r->sig_active = uv_signal_start(&r->sigint, on_sigint, SIGINT) == 0;
  if (!r->sig_active) uv_close((uv_handle_t *)&r->sigint, NULL);
  r->max_workers = cfg->concurrency > 0 ? cfg->concurrency : cfg->max_concurrency;
  if (cfg->conversations > 0) {
    r->convs = calloc((size_t)cfg->conversations, sizeof *r->convs);
    if (!r->convs) goto fail;
    for (int i = 0; i < cfg->conversations; i++)
      if (bench_conv_init(&r->convs[i], cfg, i)) {
        fprintf(stderr, "servd-bench: out of memory for %d conversations\n", cfg->conversations);
        goto fail;
      }
  }
  begin_phase(r, PH_WARMUP);
  uv_run(&r->loop, UV_RUN_DEFAULT);
  res->interrupted = r->interrupts > 0;
  if (r->tok_failed) /* all or nothing: undo the counts that did get through */
    for (long i = 0; i < res->n_records; i++) {
      bench_record *rec = &res->records[i];
      int out;
      rec->out_tokens = rec->out_chunks;
      bench_prompts_get(prompts, (uint64_t)rec->prompt_index, &rec->in_tokens, &out);
    }
  compute(cfg, res, cfg->count_mode == BENCH_COUNT_TOKENIZE && cfg->api != BENCH_API_KSERVE && !r->tok_failed);
  if (cfg->count_mode == BENCH_COUNT_TOKENIZE && r->tok_failed)
    fprintf(stderr, "servd-bench: /tokenize failed (%s); output tokens are counted as chunks\n", res->tokenize_error);
  rc = 0;
fail:
  if (r->arrival_active) {
    uv_close((uv_handle_t *)&r->arrival, NULL);
    if (r->sig_active) uv_close((uv_handle_t *)&r->sigint, NULL);
    uv_run(&r->loop, UV_RUN_DEFAULT);
  }
  for (int i = 0; i < r->n_workers; i++) {
    worker *w = r->workers[i];
    free(w->cur.itl_ms);
    free(w->cur.text);
    free(w->req);
    free(w->body);
    bench_sse_free(&w->sse);
    free(w);
  }
  free(r->workers);
  if (r->convs)
    for (int i = 0; i < cfg->conversations; i++) bench_conv_free(&r->convs[i], cfg);
  free(r->convs);
  free(r->kserve_body);
  uv_loop_close(&r->loop);
  free(r);
  return rc;
}

void bench_results_free(bench_results *res) {
  if (!res) return;
  for (long i = 0; i < res->n_records; i++) {
    free(res->records[i].itl_ms);
    free(res->records[i].text);
  }
  free(res->records);
  res->records = NULL;
  res->n_records = 0;
}
