/* The API's lifecycle and the queue that carries engine events from engine threads to the loop.
 * Routing is router.c over the table of routes.c; responses are respond.c. */
#include "api/api-impl.h"
#include "api/otlp.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "servd/clock.h"
#include "servd/status.h"

uint64_t api_now_ns(void) { return (uint64_t)servd_now_ns(); }

void servd_api_options_default(servd_api_options *o) {
  memset(o, 0, sizeof(*o));
  o->access_log = SERVD_ACCESS_LOG_TEXT;
  o->max_n = 16;
  o->unload_timeout_ms = 30000;
}

/* ---- event queue: engine threads -> loop ------------------------------------------------------ */

void api_event_push(void *ud, const servd_event *ev, api_event_sink sink) {
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
  e->sink = sink;
  e->kind = ev->kind;
  e->token = ev->token;
  e->logprob = ev->logprob;
  e->n_top = ev->n_top < 0 ? 0 : ev->n_top > API_MAX_TOP ? API_MAX_TOP : ev->n_top;
  if (e->n_top && ev->top) memcpy(e->top, ev->top, (size_t)e->n_top * sizeof(e->top[0]));
  else e->n_top = 0;
  snprintf(e->finish, sizeof e->finish, "%s", ev->finish_reason ? ev->finish_reason : "");
  e->prompt_tokens = ev->prompt_tokens;
  e->cached_tokens = ev->cached_tokens;
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
  e->queue_s = ev->queue_s;
  e->prefill_s = ev->prefill_s;
  e->decode_s = ev->decode_s;
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
    e->sink(a, e); /* the generation's consumer: OpenAI's or a front end's (gRPC) */
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
  api_tracer_destroy(a->tracer); /* sends what is queued, bounded by its socket timeouts */
  free(a);
  if (done) done(ud);
}

static void on_async_closed(uv_handle_t *h) { api_free(h->data); }

void servd_api_close(servd_api *a, void (*done)(void *), void *ud) {
  if (!a) return;
  a->close_done = done;
  a->close_ud = ud;
  api_sleep_close(a);
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
