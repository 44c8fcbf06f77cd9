/* Sleep and wake (vLLM's endpoints: POST /sleep?level=1|2, POST /wake_up, GET /is_sleeping) and
 * --idle-unload-seconds (llama-server's --sleep-idle-seconds), for a replica that should give its
 * memory back while nobody asks it anything.
 *
 * Level 1 frees the KV cache: once a model's running requests have ended, its prefix cache is
 * emptied and the cache's pages go back to the system (servd_model_release_kv); weights and
 * interpreters stay, so waking is immediate. Level 2 frees everything: the model is unloaded as
 * the repository API unloads it (weights unmapped, interpreters ended) and loaded again from its
 * package to wake. Idle unload is level 2 after N seconds without a request.
 *
 * Requests are never lost. While a model goes to sleep its running requests finish and new ones
 * are answered 503 (a router sends them elsewhere). A request to a sleeping model wakes it: at
 * level 1 it runs at once; at level 2 it starts the reload and is answered 503 with Retry-After
 * until the model is ready again. Server readiness does not change with sleep, so that an
 * orchestrator keeps sending the request that wakes a model; /v2/models/{m}/ready, GET /is_sleeping
 * and servd_model_sleep_level{model} say which state each model is in.
 *
 * POST /sleep and POST /wake_up answer once every model they name has got there (200), or with the
 * first failure. One of them at a time: another while one is under way is a 409.
 */
#include "api/api-impl.h"
#include "api/frontend.h"
#include "api/handlers.h"
#include "api/respond.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "servd/status.h"

#define TICK_BUSY_MS 10   /* while a model is on its way to sleep */
#define TICK_IDLE_MS 1000 /* otherwise: idle unload's resolution */

typedef struct api_sleep {
  servd_api *a;
  uv_timer_t timer;
  bool timer_open;
  double idle_s;          /* --idle-unload-seconds; 0: never */
  servd_http_req *waiter; /* the POST /sleep or /wake_up under way, or NULL */
  bool waking;            /* what the waiter waits for */
  char error[1024];       /* the first failure of the operation under way */
} sleep_state;

static bool is_lm(servd_api *a, api_model *am) { return am->m && a->ops->kind(am->m) == SERVD_MODEL_CAUSAL_LM; }

/* Requests the model has seen end, as a change detector for idle unload. */
static uint64_t activity(const api_model *am) {
  return am->vllm.e2e.count + am->infer.ok + am->infer.failed + (uint64_t)am->inflight;
}

static void tick(uv_timer_t *t);

static void arm(sleep_state *s, uint64_t ms) {
  if (!s->timer_open) return;
  uv_timer_start(&s->timer, tick, ms, 0);
}

static sleep_state *state(servd_api *a) {
  if (a->sleep) return a->sleep;
  sleep_state *s = calloc(1, sizeof *s);
  if (!s) return NULL;
  s->a = a;
  if (uv_timer_init(a->loop, &s->timer) == 0) {
    s->timer_open = true;
    s->timer.data = s;
    uv_unref((uv_handle_t *)&s->timer); /* never what keeps the loop running */
  }
  a->sleep = s;
  return s;
}

static void on_timer_closed(uv_handle_t *h) { free(h->data); }

void api_sleep_close(servd_api *a) {
  sleep_state *s = a->sleep;
  if (!s) return;
  a->sleep = NULL;
  if (s->waiter) s->waiter->on_abort = NULL; /* answered by nobody: the server is closing */
  if (s->timer_open) uv_close((uv_handle_t *)&s->timer, on_timer_closed);
  else free(s);
}

static void on_waiter_abort(servd_http_req *r) {
  sleep_state *s = r->ctx;
  s->waiter = NULL;
  uv_unref((uv_handle_t *)&s->timer);
}

/* Whether the operation under way is over: every model it named has reached its target. */
static bool settled(servd_api *a) {
  for (api_model *am = a->models; am; am = am->next) {
    if (am->sleep_target != am->sleep_level) return false;
    if (am->waking) return false;
  }
  return true;
}

static void answer_if_done(sleep_state *s) {
  if (!s->waiter || !(settled(s->a) || s->error[0])) return;
  servd_http_req *r = s->waiter;
  s->waiter = NULL;
  r->on_abort = NULL;
  uv_unref((uv_handle_t *)&s->timer); /* nobody waits: idle unload alone keeps no loop alive */
  if (s->error[0]) api_kserve_error(r, 500, "%s", s->error);
  else servd_http_respond(r, 200, "application/json", "", 0);
}

static void fail(sleep_state *s, api_model *am, const char *fmt, const char *msg) {
  if (!s->error[0]) snprintf(s->error, sizeof s->error, fmt, am->name, msg);
  fprintf(s->a->log, "servd: ");
  fprintf(s->a->log, fmt, am->name, msg);
  fprintf(s->a->log, "\n");
}

/* ---- level 1: the KV cache, on a worker thread (the engine waits for its scheduler) ---------- */

typedef struct release_job {
  uv_work_t w;
  servd_api *a;
  api_model *am;
  int rc;
  char msg[400];
} release_job;

static void release_work(uv_work_t *w) {
  release_job *j = w->data;
  j->rc = j->a->ops->release_kv ? j->a->ops->release_kv(j->am->m) : 0;
  if (j->rc) snprintf(j->msg, sizeof j->msg, "%s", servd_last_error());
}

static void release_after(uv_work_t *w, int status) {
  (void)status;
  release_job *j = w->data;
  servd_api *a = j->a;
  a->works--;
  sleep_state *s = a->sleep; /* NULL once the server is closing */
  api_model *am = j->am;
  am->sleep_busy = false;
  if (j->rc) {
    am->sleep_target = am->sleep_level; /* stays awake */
    if (s) fail(s, am, "model '%s' could not go to sleep: %s", j->msg);
  } else if (am->sleep_target >= 1) {
    am->sleep_level = 1;
    fprintf(a->log, "servd: model '%s' is asleep (level 1: KV cache released)\n", am->name);
  }
  free(j);
  if (s) {
    answer_if_done(s);
    arm(s, TICK_BUSY_MS);
  }
}

/* ---- level 2: unload and load, as the repository API does ------------------------------------ */

static void on_unloaded(void *ud, int status, const char *msg) {
  api_model *am = ud;
  am->sleep_busy = false;
  sleep_state *s = am->sleep_api ? am->sleep_api->sleep : NULL;
  if (status == 200) {
    am->sleep_level = 2;
    if (am->sleep_api) fprintf(am->sleep_api->log, "servd: model '%s' is asleep (level 2: unloaded)\n", am->name);
  } else {
    am->sleep_target = am->sleep_level;
    if (s) fail(s, am, "model '%s' could not be unloaded to sleep: %s", msg);
  }
  if (s) {
    answer_if_done(s);
    arm(s, TICK_BUSY_MS);
  }
}

static void on_woken(void *ud, int status, const char *msg) {
  api_model *am = ud;
  am->waking = false;
  sleep_state *s = am->sleep_api ? am->sleep_api->sleep : NULL;
  if (status == 200) {
    am->sleep_level = am->sleep_target = 0;
    if (am->sleep_api) fprintf(am->sleep_api->log, "servd: model '%s' is awake\n", am->name);
  } else if (s) {
    fail(s, am, "model '%s' could not be woken up: %s", msg);
  }
  if (s) answer_if_done(s);
}

/* Wakes am: level 1 at once, level 2 by starting its load (on_woken ends it). */
static void wake(servd_api *a, api_model *am) {
  if (am->sleep_level == 2 && !am->waking) {
    am->waking = true;
    am->sleep_target = 2; /* stays asleep until loaded */
    am->sleep_api = a;
    fprintf(a->log, "servd: waking model '%s' up (loading it again)\n", am->name);
    servd_api_repository_load(a, am->name, on_woken, am);
  } else if (am->sleep_level == 1 || am->sleep_target > am->sleep_level) {
    if (!am->sleep_busy) am->sleep_level = am->sleep_target = 0; /* KV pages come back as written */
  }
}

/* Moves each model toward its target; re-arms while any is on its way. */
static void tick(uv_timer_t *t) {
  sleep_state *s = t->data;
  servd_api *a = s->a;
  bool moving = false;
  int64_t now = (int64_t)api_now_ns();
  for (api_model *am = a->models; am; am = am->next) {
    if (am->sleep_target > am->sleep_level && !am->sleep_busy && !am->waking) {
      moving = true;
      if (am->state != M_READY || am->inflight > 0) continue; /* its running requests end first */
      am->sleep_busy = true;
      am->sleep_api = a;
      if (am->sleep_target == 1) {
        release_job *j = calloc(1, sizeof *j);
        if (!j || (j->w.data = j, j->a = a, j->am = am, uv_queue_work(a->loop, &j->w, release_work, release_after))) {
          free(j);
          am->sleep_busy = false;
          am->sleep_target = am->sleep_level;
          fail(s, am, "model '%s' could not go to sleep: %s", "cannot queue work");
          continue;
        }
        a->works++;
      } else {
        fprintf(a->log, "servd: model '%s' goes to sleep (level 2: unloading)\n", am->name);
        servd_api_repository_unload(a, am->name, on_unloaded, am);
      }
    } else if (am->sleep_target > am->sleep_level) {
      moving = true;
    }
    /* Idle unload: a model loaded from a file, awake, with no request for idle_s seconds. */
    uint64_t seen = activity(am);
    if (seen != am->sleep_seen || am->inflight > 0 || am->state != M_READY || am->sleep_target) {
      am->sleep_seen = seen;
      am->last_busy_ns = now;
    } else if (s->idle_s > 0 && !a->draining && am->path && now - am->last_busy_ns >= (int64_t)(s->idle_s * 1e9)) {
      fprintf(a->log, "servd: model '%s' idle for %.0f s: unloading it until the next request\n", am->name, s->idle_s);
      am->sleep_target = 2;
      moving = true;
    }
  }
  answer_if_done(s);
  arm(s, moving ? TICK_BUSY_MS : TICK_IDLE_MS);
}

/* ---- the API --------------------------------------------------------------------------------- */

void servd_api_set_idle_unload(servd_api *a, double seconds) {
  sleep_state *s = state(a);
  if (!s) return;
  s->idle_s = seconds > 0 ? seconds : 0;
  if (s->idle_s > 0) arm(s, TICK_IDLE_MS);
}

int api_sleep_gate(servd_api *a, api_model *am, servd_http_req *r, char *msg, size_t cap) {
  if (!am->sleep_level && am->sleep_target <= am->sleep_level && !am->waking) return 0;
  if (am->sleep_target > am->sleep_level && !am->waking && a->sleep && a->sleep->waiter) {
    snprintf(msg, cap, "model '%s' is going to sleep; retry later", am->name);
  } else {
    wake(a, am);
    if (!am->sleep_level && !am->waking) return 0; /* level 1: awake at once */
    snprintf(msg, cap, "model '%s' was asleep and is waking up; retry in a few seconds", am->name);
  }
  if (r) servd_http_set_header(r, "Retry-After", "2");
  return 503;
}

/* The query's value of key (level=2, model=x), copied into out; false when absent. */
static bool query_get(const char *q, const char *key, char *out, size_t cap) {
  size_t k = strlen(key);
  for (const char *p = q; p && *p;) {
    const char *end = strchr(p, '&');
    size_t n = end ? (size_t)(end - p) : strlen(p);
    if (n > k && !strncmp(p, key, k) && p[k] == '=') {
      snprintf(out, cap, "%.*s", (int)(n - k - 1), p + k + 1);
      return true;
    }
    p = end ? end + 1 : NULL;
  }
  return false;
}

/* The models a request names (?model=NAME, else every language model); 404 when unknown. */
static bool targets(servd_api *a, servd_http_req *r, api_model **only) {
  char name[256];
  *only = NULL;
  if (!query_get(r->query, "model", name, sizeof name)) return true;
  *only = api_model_find(a, name);
  if (!*only) api_kserve_error(r, 404, "model '%s' is not served here", name);
  return *only != NULL;
}

static bool begin(servd_api *a, servd_http_req *r, sleep_state **out) {
  sleep_state *s = state(a);
  if (!s) {
    api_kserve_error(r, 500, "out of memory");
    return false;
  }
  if (s->waiter) {
    api_kserve_error(r, 409, "a sleep or wake-up is under way; try again when it has finished");
    return false;
  }
  if (a->draining) {
    api_kserve_error(r, 503, "server is shutting down");
    return false;
  }
  s->error[0] = '\0';
  *out = s;
  return true;
}

static void wait_for(sleep_state *s, servd_http_req *r, bool waking) {
  s->waiter = r;
  s->waking = waking;
  r->ctx = s;
  r->on_abort = on_waiter_abort;
  if (s->timer_open) uv_ref((uv_handle_t *)&s->timer); /* the loop runs until it is answered */
  answer_if_done(s);
  arm(s, 0);
}

void api_sleep(servd_api *a, servd_http_req *r, const api_route_args *args) {
  (void)args;
  char v[16] = "1";
  query_get(r->query, "level", v, sizeof v);
  if (strcmp(v, "1") != 0 && strcmp(v, "2") != 0) {
    api_kserve_error(r, 400, "level must be 1 (free the KV cache) or 2 (unload the weights too), not '%s'", v);
    return;
  }
  int level = v[0] - '0';
  api_model *only;
  sleep_state *s;
  if (!targets(a, r, &only) || !begin(a, r, &s)) return;
  for (api_model *am = a->models; am; am = am->next) {
    if (only ? am != only : !is_lm(a, am) && am->sleep_level == 0) continue;
    if (am->state != M_READY && am->sleep_level == 0) continue; /* loading or unloading: not a sleeper */
    if (level == 1 && !is_lm(a, am) && am->sleep_level == 0) {
      api_kserve_error(r, 400, "model '%s' is not a language model: it has no KV cache (level 2 unloads it)", am->name);
      return;
    }
    if (level == 2 && !am->path && am->sleep_level == 0) {
      api_kserve_error(r, 400, "model '%s' was not loaded from a file and could not be loaded again", am->name);
      return;
    }
    if (level > am->sleep_target) am->sleep_target = level;
  }
  wait_for(s, r, false);
}

void api_wake_up(servd_api *a, servd_http_req *r, const api_route_args *args) {
  (void)args;
  api_model *only;
  sleep_state *s;
  if (!targets(a, r, &only) || !begin(a, r, &s)) return;
  for (api_model *am = a->models; am; am = am->next)
    if (!only || am == only) wake(a, am);
  wait_for(s, r, true);
}

void api_is_sleeping(servd_api *a, servd_http_req *r, const api_route_args *args) {
  (void)args;
  json_t *models = json_object();
  bool any = false;
  for (api_model *am = a->models; am; am = am->next) {
    json_object_set_new(models, am->name,
                        json_pack("{s:b, s:i, s:b}", "is_sleeping", am->sleep_level > 0, "level", am->sleep_level,
                                  "waking", am->waking));
    any |= am->sleep_level > 0;
  }
  api_json(r, 200, json_pack("{s:b, s:o}", "is_sleeping", any, "models", models));
}

void api_metrics_sleep(servd_api *a, servd_buf *b) {
  servd_buf_puts(b, "# HELP servd_model_sleep_level 0 awake, 1 KV cache released, 2 unloaded (POST /sleep, "
                    "--idle-unload-seconds).\n# TYPE servd_model_sleep_level gauge\n");
  for (api_model *am = a->models; am; am = am->next) {
    servd_buf_puts(b, "servd_model_sleep_level{model=\"");
    api_prom_label(b, am->name);
    servd_buf_printf(b, "\"} %d\n", am->sleep_level);
  }
}
