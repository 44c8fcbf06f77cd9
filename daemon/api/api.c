#include "api/api-impl.h"
#include "api/request_params.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "servd/status.h"

uint64_t api_now_ns(void) { return uv_hrtime(); }

void servd_api_options_default(servd_api_options *o) {
  memset(o, 0, sizeof(*o));
  o->access_log = SERVD_ACCESS_LOG_TEXT;
  o->max_n = 16;
  o->unload_timeout_ms = 30000;
}

/* ---- responses -------------------------------------------------------------------------------- */

void api_json(servd_http_req *r, int status, json_t *body) {
  char *s = body ? json_dumps(body, JSON_COMPACT) : NULL;
  json_decref(body);
  if (!s) {
    static const char oom[] = "{\"error\": \"out of memory\"}";
    servd_http_respond(r, 500, "application/json", oom, sizeof oom - 1);
    return;
  }
  servd_http_respond(r, status, "application/json", s, strlen(s));
  free(s);
}

void api_oai_error(servd_http_req *r, int status, const char *type, const char *param, const char *code,
                   const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  api_utf8_fix(msg); /* names from the path or the body may be cut or not UTF-8; JSON needs it */
  json_t *e = json_pack("{s:{s:s, s:s, s:o, s:o}}", "error", "message", msg, "type", type, "param",
                        param ? json_string(param) : json_null(), "code",
                        code ? json_string(code) : json_null());
  if (status == 429 || status == 503) servd_http_set_header(r, "Retry-After", "1");
  api_json(r, status, e);
}

void api_kserve_error(servd_http_req *r, int status, const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  api_utf8_fix(msg); /* names from the path or the body may be cut or not UTF-8; JSON needs it */
  if (status == 429 || status == 503) servd_http_set_header(r, "Retry-After", "1");
  api_json(r, status, json_pack("{s:s}", "error", msg));
}

int api_status_for(int rc) {
  switch (rc) {
  case SERVD_EINVAL:
  case SERVD_EFORMAT:
  case SERVD_ERANGE:
  case SERVD_EUNSUPPORTED: return 400;
  case SERVD_EBUSY: return 429;
  case SERVD_ECANCELED: return 503;
  case SERVD_ETIMEDOUT: return 504;
  case SERVD_EMODEL: return 500; /* the model's code failed, not the request */
  default: return 500;
  }
}

/* ---- event queue: engine threads -> loop ------------------------------------------------------ */

void api_engine_cb(void *ud, const servd_event *ev) {
  gen *g = ud;
  servd_api *a = g->api;
  /* Nodes come from the request's own cache, refilled from the free list a few at a time: one
   * lock per API_EV_TAKE tokens; filling and queueing a node take none. */
  api_event *e = g->ev_cache;
  if (!e) {
    pthread_mutex_lock(&a->lock);
    e = a->free_events;
    api_event *last = e;
    int k = e ? 1 : 0;
    for (; k < API_EV_TAKE && last && last->next; k++) last = last->next;
    if (last) {
      a->free_events = last->next;
      last->next = NULL;
      a->n_free_events -= k;
    }
    pthread_mutex_unlock(&a->lock);
  }
  if (e) g->ev_cache = e->next;
  else e = calloc(1, sizeof(*e));
  if (!e) {
    /* Out of memory on the engine thread: a token is lost but a final event must not be. */
    if (ev->kind == SERVD_EVENT_TOKEN) return;
    for (;;) {
      e = calloc(1, sizeof(*e));
      if (e) break;
      struct timespec ts = {0, 1000000};
      nanosleep(&ts, NULL);
    }
  }
  e->g = g;
  e->kind = ev->kind;
  e->token = ev->token;
  e->logprob = ev->logprob;
  e->n_top = ev->n_top < 0 ? 0 : ev->n_top > API_MAX_TOP ? API_MAX_TOP : ev->n_top;
  if (e->n_top && ev->top) memcpy(e->top, ev->top, (size_t)e->n_top * sizeof(e->top[0]));
  else e->n_top = 0;
  snprintf(e->finish, sizeof e->finish, "%s", ev->finish_reason ? ev->finish_reason : "");
  e->prompt_tokens = ev->prompt_tokens;
  e->completion_tokens = ev->completion_tokens;
  e->error_code = ev->error_code;
  snprintf(e->error, sizeof e->error, "%s", ev->error_message ? ev->error_message : "");
  e->text_len = 0;
  if (ev->text && ev->text_len) {
    if (e->text_cap < ev->text_len + 1) {
      size_t cap = ev->text_len + 1 < 64 ? 64 : ev->text_len + 1;
      char *t = realloc(e->text, cap);
      if (t) {
        e->text = t;
        e->text_cap = cap;
      }
    }
    if (e->text_cap >= ev->text_len + 1) {
      memcpy(e->text, ev->text, ev->text_len);
      e->text[ev->text_len] = '\0';
      e->text_len = ev->text_len;
    }
  }
  e->t_ns = api_now_ns();
  e->spare = NULL;
  if (ev->kind != SERVD_EVENT_TOKEN) { /* final: the engine never touches g again */
    e->spare = g->ev_cache;
    g->ev_cache = NULL;
  }
  /* Release: the loop that takes the stack sees the node's contents. */
  api_event *top = atomic_load_explicit(&a->q_top, memory_order_relaxed);
  do e->next = top;
  while (!atomic_compare_exchange_weak_explicit(&a->q_top, &top, e, memory_order_release, memory_order_relaxed));
  uv_async_send(&a->async);
}

static void on_async(uv_async_t *h) {
  servd_api *a = h->data;
  /* Take every queued event at once (acquire pairs with the engine's release) and restore the
   * order they were pushed in: each request's events stay in engine order. */
  api_event *e = atomic_exchange_explicit(&a->q_top, NULL, memory_order_acquire), *fifo = NULL;
  while (e) {
    api_event *next = e->next;
    e->next = fifo;
    fifo = e;
    e = next;
  }
  if (!fifo) return;
  /* Every chunk of this wake-up is queued first, then each connection is written once. */
  if (a->server) servd_http_server_batch_begin(a->server);
  api_event *last = NULL;
  int n = 0; /* nodes to recycle: the events and the spares handed back */
  for (e = fifo; e; e = e->next) {
    api_oai_event(a, e);
    a->n_events++;
    n++;
    if (e->spare) { /* splice the request's unused nodes in after its final event */
      api_event *s = e->spare, *t = s;
      for (n++; t->next; n++) t = t->next;
      e->spare = NULL;
      t->next = e->next;
      e->next = s;
      e = t;
    }
    last = e;
  }
  if (a->server) servd_http_server_batch_end(a->server);
  a->n_batches++;
  /* Recycle the batch under one lock; beyond the cap, free the surplus. */
  pthread_mutex_lock(&a->lock);
  int keep = 4096 - a->n_free_events;
  if (keep >= n) {
    last->next = a->free_events;
    a->free_events = fifo;
    a->n_free_events += n;
    fifo = NULL;
  } else {
    for (; keep > 0 && fifo; keep--) {
      e = fifo;
      fifo = e->next;
      e->next = a->free_events;
      a->free_events = e;
      a->n_free_events++;
    }
  }
  pthread_mutex_unlock(&a->lock);
  for (api_event *next; fifo; fifo = next) {
    next = fifo->next;
    free(fifo->text);
    free(fifo);
  }
}

/* ---- lifecycle -------------------------------------------------------------------------------- */

int servd_api_create(uv_loop_t *loop, const servd_api_options *o, servd_api **out) {
  *out = NULL;
  servd_api *a = calloc(1, sizeof(*a));
  if (!a) return servd_fail(SERVD_ENOMEM, "api: out of memory");
  a->loop = loop;
  atomic_init(&a->q_top, NULL);
  if (o) a->o = *o;
  else servd_api_options_default(&a->o);
  if (!a->o.ops) {
    free(a);
    return servd_fail(SERVD_EINVAL, "api: options.ops is required (servd_engine_model_ops for the engine)");
  }
  a->ops = a->o.ops;
  a->log = a->o.log ? a->o.log : stderr;
  if (a->o.max_n < 1) a->o.max_n = 1;
  if (a->o.api_key && a->o.api_key[0]) {
    a->api_key = strdup(a->o.api_key);
    if (!a->api_key) goto oom;
    a->api_key_len = strlen(a->api_key);
  }
  a->o.api_key = NULL;
  if (a->o.n_repository > 0) {
    a->repository = calloc((size_t)a->o.n_repository, sizeof(char *));
    if (!a->repository) goto oom;
    for (int i = 0; i < a->o.n_repository; i++)
      if (!(a->repository[i] = strdup(a->o.repository[i]))) goto oom;
  }
  a->o.repository = NULL;
  pthread_mutex_init(&a->lock, NULL);
  if (uv_async_init(loop, &a->async, on_async) != 0) {
    pthread_mutex_destroy(&a->lock);
    goto oom;
  }
  a->async.data = a;
  a->async_open = true;
  *out = a;
  return 0;
oom:
  if (a->repository)
    for (int i = 0; i < a->o.n_repository; i++) free(a->repository[i]);
  free(a->repository);
  free(a->api_key);
  free(a);
  return servd_fail(SERVD_ENOMEM, "api: out of memory");
}

static void api_free(servd_api *a) {
  void (*done)(void *) = a->close_done;
  void *ud = a->close_ud;
  while (a->models) {
    api_model *am = a->models;
    a->models = am->next;
    if (am->m) a->ops->unload(am->m, 0);
    free(am->name);
    free(am->path);
    free(am);
  }
  api_event *lists[2] = {atomic_load(&a->q_top), a->free_events};
  for (int i = 0; i < 2; i++)
    for (api_event *e = lists[i], *n; e; e = n) {
      n = e->next;
      free(e->text);
      free(e);
    }
  if (a->repository)
    for (int i = 0; i < a->o.n_repository; i++) free(a->repository[i]);
  free(a->repository);
  free(a->api_key);
  pthread_mutex_destroy(&a->lock);
  free(a);
  if (done) done(ud);
}

static void on_async_closed(uv_handle_t *h) { api_free(h->data); }

void servd_api_close(servd_api *a, void (*done)(void *), void *ud) {
  if (!a) return;
  a->close_done = done;
  a->close_ud = ud;
  uv_close((uv_handle_t *)&a->async, on_async_closed);
}

void servd_api_set_server(servd_api *a, servd_http_server *s) { a->server = s; }
void servd_api_set_draining(servd_api *a, bool d) { a->draining = d; }
int servd_api_inflight(const servd_api *a) { return a->inflight + a->works; }

void servd_api_cancel_all(servd_api *a) {
  for (gen *g = a->gens; g; g = g->next)
    if (!g->done && g->r) a->ops->cancel(g->r);
}

bool servd_api_key_equal(const char *p, size_t plen, const char *key, size_t klen) {
  /* Reads key_len bytes whatever is presented, so timing tells nothing about the key's content. */
  unsigned diff = (unsigned)(plen ^ klen);
  for (size_t i = 0; i < klen; i++) {
    unsigned char pc = i < plen ? (unsigned char)p[i] : 0;
    diff |= pc ^ (unsigned char)key[i];
  }
  return diff == 0;
}

/* ---- metrics counters and access log ---------------------------------------------------------- */

void api_count(servd_api *a, const char *route, int status) {
  for (int i = 0; i < a->n_routes; i++)
    if (a->routes[i].status == status && strcmp(a->routes[i].route, route) == 0) {
      a->routes[i].n++;
      return;
    }
  if (a->n_routes < (int)(sizeof a->routes / sizeof a->routes[0])) {
    a->routes[a->n_routes++] = (api_route_count){route, status, 1};
  }
}

/* Writes s for the text access log: control bytes, quotes, backslashes and spaces inside a field are
 * escaped as \xHH, so a client cannot forge log lines or fields with a decoded %0a in its path. */
static void log_field(FILE *f, const char *s) {
  if (!s || !*s) {
    fputc('-', f);
    return;
  }
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    if (*p < 0x20 || *p == 0x7f || *p == '"' || *p == '\\' || *p == ' ')
      fprintf(f, "\\x%02x", *p);
    else
      fputc(*p, f);
  }
}

static void access_log(servd_api *a, const servd_http_req *r) {
  if (a->o.access_log == SERVD_ACCESS_LOG_OFF) return;
  double secs = (double)(api_now_ns() - r->start_ns) / 1e9;
  char ts[40];
  time_t now = time(NULL);
  struct tm tm;
  gmtime_r(&now, &tm);
  strftime(ts, sizeof ts, "%Y-%m-%dT%H:%M:%SZ", &tm);
  if (a->o.access_log == SERVD_ACCESS_LOG_JSON) {
    servd_buf b;
    servd_buf_init(&b);
    servd_buf_printf(&b, "{\"time\":\"%s\",\"remote\":", ts);
    servd_buf_json_str(&b, r->remote, strlen(r->remote));
    servd_buf_puts(&b, ",\"method\":");
    servd_buf_json_str(&b, r->method ? r->method : "", r->method ? strlen(r->method) : 0);
    servd_buf_puts(&b, ",\"path\":");
    servd_buf_json_str(&b, r->path ? r->path : "", r->path ? strlen(r->path) : 0);
    servd_buf_printf(&b, ",\"status\":%d,\"bytes\":%llu,\"duration_ms\":%.3f,\"route\":\"%s\"", r->status,
                     (unsigned long long)r->bytes_out, secs * 1000.0, r->route ? r->route : "");
    if (r->model) {
      servd_buf_puts(&b, ",\"model\":");
      servd_buf_json_str(&b, r->model, strlen(r->model));
    }
    servd_buf_puts(&b, "}\n");
    if (!b.oom) fwrite(b.data, 1, b.len, a->log);
    servd_buf_free(&b);
  } else {
    fprintf(a->log, "%s %s \"", ts, r->remote);
    log_field(a->log, r->method);
    fputc(' ', a->log);
    log_field(a->log, r->path);
    fprintf(a->log, " HTTP/%d.%d\" %d %llu %.6fs", r->http_major, r->http_minor, r->status,
            (unsigned long long)r->bytes_out, secs);
    if (r->model) {
      fputs(" model=", a->log);
      log_field(a->log, r->model);
    }
    fputc('\n', a->log);
  }
  fflush(a->log);
}

static void on_complete(void *ud, const servd_http_req *r) {
  servd_api *a = ud;
  api_count(a, r->route ? r->route : "other", r->status);
  access_log(a, r);
}

/* ---- routing ---------------------------------------------------------------------------------- */

static bool is(const servd_http_req *r, const char *m) { return strcmp(r->method, m) == 0; }

static void method_not_allowed(servd_http_req *r, bool oai, const char *allow) {
  servd_http_set_header(r, "Allow", allow);
  if (oai)
    api_oai_error(r, 405, "invalid_request_error", NULL, "method_not_allowed", "method %s is not allowed on %s",
                  r->method, r->path);
  else api_kserve_error(r, 405, "method %s is not allowed on %s", r->method, r->path);
}

/* Splits "/v2/models/NAME[/versions/V][/TAIL]" into name and tail (arena copies). */
static bool split_model_path(servd_http_req *r, const char *rest, const char **name, const char **tail) {
  const char *slash = strchr(rest, '/');
  size_t n = slash ? (size_t)(slash - rest) : strlen(rest);
  if (n == 0) return false;
  *name = servd_arena_strndup(r->arena, rest, n);
  *tail = slash ? slash : "";
  if (strncmp(*tail, "/versions/", 10) == 0) { /* one version per model: accept any */
    const char *v = *tail + 10;
    const char *s2 = strchr(v, '/');
    *tail = s2 ? s2 : "";
  }
  return *name != NULL;
}

static void route_v2_model(servd_api *a, servd_http_req *r, const char *rest) {
  const char *name, *tail;
  if (!split_model_path(r, rest, &name, &tail)) {
    r->route = "other";
    api_kserve_error(r, 404, "no route for %s", r->path);
    return;
  }
  r->model = name;
  bool infer = strcmp(tail, "/infer") == 0;
  r->route = infer ? "/v2/models/{model}/infer" : strcmp(tail, "/ready") == 0 ? "/v2/models/{model}/ready"
                                                                               : "/v2/models/{model}";
  if (!infer && strcmp(tail, "/ready") != 0 && tail[0] != '\0') {
    r->route = "other";
    api_kserve_error(r, 404, "no route for %s", r->path);
    return;
  }
  if (infer ? !is(r, "POST") : !is(r, "GET")) {
    method_not_allowed(r, false, infer ? "POST" : "GET");
    return;
  }
  api_model *am = api_model_find(a, name);
  if (!am) {
    api_kserve_error(r, 404, "model '%s' is not served here", name);
    return;
  }
  if (infer) api_kserve_infer(a, r, am);
  else if (tail[0]) api_kserve_model_ready(a, r, am);
  else api_kserve_model_meta(a, r, am);
}

static void route_repository(servd_api *a, servd_http_req *r, const char *rest) {
  if (strcmp(rest, "index") == 0) {
    r->route = "/v2/repository/index";
    if (!is(r, "POST") && !is(r, "GET")) { method_not_allowed(r, false, "POST"); return; }
    api_repository_index(a, r);
    return;
  }
  const char *name, *tail;
  if (strncmp(rest, "models/", 7) != 0 || !split_model_path(r, rest + 7, &name, &tail) ||
      (strcmp(tail, "/load") != 0 && strcmp(tail, "/unload") != 0)) {
    r->route = "other";
    api_kserve_error(r, 404, "no route for %s", r->path);
    return;
  }
  bool load = strcmp(tail, "/load") == 0;
  r->route = load ? "/v2/repository/models/{model}/load" : "/v2/repository/models/{model}/unload";
  r->model = name;
  if (!is(r, "POST")) { method_not_allowed(r, false, "POST"); return; }
  if (load) api_repository_load(a, r, name);
  else api_repository_unload(a, r, name);
}

static bool authorized(servd_api *a, servd_http_req *r) {
  if (!a->api_key) return true;
  const char *h = servd_http_header_get(r, "authorization");
  const char *tok = "";
  if (h && strncasecmp(h, "Bearer ", 7) == 0) {
    tok = h + 7;
    while (*tok == ' ') tok++;
  }
  return servd_api_key_equal(tok, strlen(tok), a->api_key, a->api_key_len);
}

static void on_request(void *ud, servd_http_req *r) {
  servd_api *a = ud;
  const char *p = r->path;
  bool oai = strncmp(p, "/v1/", 4) == 0 || strcmp(p, "/tokenize") == 0 || strcmp(p, "/detokenize") == 0;

  /* Health answers without a key: orchestrators probe it. */
  if (strcmp(p, "/v2/health/live") == 0 || strcmp(p, "/health") == 0) {
    r->route = strcmp(p, "/health") == 0 ? "/health" : "/v2/health/live";
    if (!is(r, "GET") && !is(r, "HEAD")) { method_not_allowed(r, false, "GET"); return; }
    api_json(r, 200, json_pack("{s:b}", "live", 1));
    return;
  }
  if (strcmp(p, "/v2/health/ready") == 0) {
    r->route = "/v2/health/ready";
    if (!is(r, "GET") && !is(r, "HEAD")) { method_not_allowed(r, false, "GET"); return; }
    bool ready = api_all_ready(a);
    api_json(r, ready ? 200 : 503, json_pack("{s:b}", "ready", ready));
    return;
  }
  if (!authorized(a, r)) {
    r->route = "unauthorized";
    servd_http_set_header(r, "WWW-Authenticate", "Bearer");
    if (oai)
      api_oai_error(r, 401, "invalid_request_error", NULL, "invalid_api_key",
                    "missing or incorrect API key: send 'Authorization: Bearer <key>'");
    else api_kserve_error(r, 401, "missing or incorrect API key: send 'Authorization: Bearer <key>'");
    return;
  }
  if (strcmp(p, "/v1/completions") == 0 || strcmp(p, "/v1/chat/completions") == 0) {
    bool chat = p[4] == 'c' && p[5] == 'h';
    r->route = chat ? "/v1/chat/completions" : "/v1/completions";
    if (!is(r, "POST")) { method_not_allowed(r, true, "POST"); return; }
    api_oai_completions(a, r, chat);
  } else if (strcmp(p, "/v1/models") == 0) {
    r->route = "/v1/models";
    if (!is(r, "GET")) { method_not_allowed(r, true, "GET"); return; }
    api_oai_models(a, r);
  } else if (strncmp(p, "/v1/models/", 11) == 0 && p[11]) {
    r->route = "/v1/models/{model}";
    if (!is(r, "GET")) {
      method_not_allowed(r, true, "GET");
      return;
    }
    api_oai_model(a, r, p + 11);
  } else if (strcmp(p, "/tokenize") == 0) {
    r->route = "/tokenize";
    if (!is(r, "POST")) { method_not_allowed(r, true, "POST"); return; }
    api_oai_tokenize(a, r);
  } else if (strcmp(p, "/detokenize") == 0) {
    r->route = "/detokenize";
    if (!is(r, "POST")) { method_not_allowed(r, true, "POST"); return; }
    api_oai_detokenize(a, r);
  } else if (strcmp(p, "/metrics") == 0) {
    r->route = "/metrics";
    if (!is(r, "GET")) { method_not_allowed(r, false, "GET"); return; }
    api_metrics(a, r);
  } else if (strcmp(p, "/v2") == 0 || strcmp(p, "/v2/") == 0) {
    r->route = "/v2";
    if (!is(r, "GET")) { method_not_allowed(r, false, "GET"); return; }
    api_kserve_server_meta(a, r);
  } else if (strncmp(p, "/v2/models/", 11) == 0) {
    route_v2_model(a, r, p + 11);
  } else if (strncmp(p, "/v2/repository/", 15) == 0) {
    route_repository(a, r, p + 15);
  } else {
    r->route = "other";
    if (oai)
      api_oai_error(r, 404, "invalid_request_error", NULL, "not_found", "no route for %s %s", r->method, p);
    else api_kserve_error(r, 404, "no route for %s %s", r->method, p);
  }
}

static void error_body(void *ud, const char *target, int status, const char *message, servd_buf *out) {
  (void)ud;
  bool oai = strncmp(target, "/v1/", 4) == 0;
  if (oai) {
    servd_buf_puts(out, "{\"error\": {\"message\": ");
    servd_buf_json_str(out, message, strlen(message));
    servd_buf_printf(out, ", \"type\": \"invalid_request_error\", \"param\": null, \"code\": %s}}",
                     status == 413 ? "\"request_too_large\"" : "null");
  } else {
    servd_buf_puts(out, "{\"error\": ");
    servd_buf_json_str(out, message, strlen(message));
    servd_buf_puts(out, "}");
  }
}

servd_http_callbacks servd_api_http_callbacks(servd_api *a) {
  servd_http_callbacks cb = {.handle = on_request, .complete = on_complete, .error_body = error_body, .ud = a};
  return cb;
}
