/* The models being served: background loading, repository load/unload, draining unloads. */
#include "api/api-impl.h"
#include "api/frontend.h"
#include "api/handlers.h"
#include "api/respond.h"

#include <libgen.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "servd/status.h"

static const double ttft_bounds[] = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,  0.25, 0.5,
                                     0.75,  1.0,   2.5,  5.0,  7.5,  10.0, 20.0, 40.0, 80.0};
static const double itl_bounds[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1,
                                    0.15,  0.2,    0.3,   0.4,  0.5,   0.75, 1.0,   2.5};
static const double e2e_bounds[] = {0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 60.0, 120.0, 300.0};

#define N_OF(x) ((int)(sizeof(x) / sizeof((x)[0])))

api_model *api_model_find(servd_api *a, const char *name) {
  for (api_model *am = a->models; am; am = am->next)
    if (strcmp(am->name, name) == 0) return am;
  return NULL;
}

api_model *api_model_resolve(servd_api *a, const char *name, const char **lora) {
  if (lora) *lora = NULL;
  api_model *am = api_model_find(a, name);
  if (am || !a->ops->has_lora) return am;
  for (am = a->models; am; am = am->next)
    if (am->state == M_READY && am->m && a->ops->kind(am->m) == SERVD_MODEL_CAUSAL_LM &&
        a->ops->has_lora(am->m, name)) {
      if (lora) *lora = name;
      return am;
    }
  return NULL;
}

bool api_model_ready(servd_api *a, api_model *am) { return am->state == M_READY && am->m && a->ops->ready(am->m); }

/* A serving model whose process died and is being restarted (isolation "process"). */
static bool restarting(servd_api *a, api_model *am, char *why, size_t cap) {
  return am->state == M_READY && am->m && a->ops->restarting && a->ops->restarting(am->m, why, cap);
}

/* Server readiness (docs/operations.md#health): the models given at startup have loaded and every
 * model serving is making progress. Loads and unloads asked for through the repository API, and
 * loads that failed, do not count: one model's import never makes the whole server unready. Nor
 * does an isolated model restarting after a crash: it counts as a failed load does (a crash loop
 * must not take the whole server out of service; its own readiness says it is down). */
bool api_all_ready(servd_api *a) {
  if (a->draining) return false;
  for (api_model *am = a->models; am; am = am->next) {
    if (am->state == M_LOADING && am->startup) return false;
    if (am->state == M_READY && !a->ops->ready(am->m) && !restarting(a, am, NULL, 0)) return false;
  }
  return true;
}

bool api_interp_starved(servd_api *a, char *why, size_t cap) {
  if (!a->ops->interpreter_namespaces_free || !a->ops->quarantined_interpreters) return false;
  int q = a->ops->quarantined_interpreters();
  if (q <= 0 || a->ops->interpreter_namespaces_free() > 0) return false;
  for (api_model *am = a->models; am; am = am->next) {
    bool waiting = am->state == M_LOADING || (am->state == M_UNAVAILABLE && am->load_failed);
    if (!waiting || am->opts.isolation == SERVD_ISOLATION_PROCESS) continue; /* a process of its own */
    if (why)
      snprintf(why, cap,
               "model '%s' cannot load: no interpreter namespace is left (%d of the process's %d are held by "
               "quarantined interpreters of abandoned loads until servd restarts)",
               am->name, q, API_INTERP_NAMESPACES);
    return true;
  }
  return false;
}

int servd_api_models_loading(const servd_api *a) {
  int n = 0;
  for (api_model *am = a->models; am; am = am->next) n += am->state == M_LOADING;
  return n;
}

static api_model *model_new(servd_api *a, const char *name, const char *path) {
  api_model *am = calloc(1, sizeof(*am));
  if (!am) return NULL;
  am->name = strdup(name);
  am->path = path ? strdup(path) : NULL;
  if (!am->name || (path && !am->path)) {
    free(am->name);
    free(am->path);
    free(am);
    return NULL;
  }
  am->created = (int64_t)time(NULL);
  api_hist_init(&am->ttft, ttft_bounds, N_OF(ttft_bounds));
  api_hist_init(&am->itl, itl_bounds, N_OF(itl_bounds));
  api_hist_init(&am->e2e, e2e_bounds, N_OF(e2e_bounds));
  api_vllm_init(&am->vllm);
  api_infer_init(&am->infer);
  /* Keep configuration order in listings. */
  api_model **tail = &a->models;
  while (*tail) tail = &(*tail)->next;
  *tail = am;
  return am;
}

/* ---- worker jobs ------------------------------------------------------------------------------ */

typedef struct job {
  uv_work_t w;
  servd_api *a;
  api_model *am;
  bool unload;
  int deadline_ms;
  servd_model *m;
  int rc;
  char msg[1024];
} job;

static void job_work(uv_work_t *w) {
  job *j = w->data;
  if (j->unload) {
    j->a->ops->unload(j->m, j->deadline_ms);
    return;
  }
  servd_model_options o = j->am->opts;
  o.path = j->am->path;
  /* Not named by the operator: the placeholder (file stem) gives way to the package's own name. */
  o.name = j->am->opts.name ? j->am->name : NULL;
  j->rc = j->a->ops->load(&o, &j->m);
  if (j->rc != 0) {
    const char *why = servd_last_error();
    snprintf(j->msg, sizeof j->msg, "%s", why && why[0] ? why : servd_strerror(j->rc));
  }
}

static void start_unload(servd_api *a, api_model *am, int deadline_ms);

static void unload_finished(servd_api *a) {
  if (a->unloads_pending > 0 && --a->unloads_pending == 0 && a->unload_done) {
    void (*done)(void *) = a->unload_done;
    a->unload_done = NULL;
    done(a->unload_ud);
  }
}

static void on_waiter_abort(servd_http_req *r) {
  api_model *am = r->ctx;
  am->waiter = NULL;
}

/* Who waits for a repository load or unload: an HTTP request or a front end's callback. */
typedef struct repo_waiter {
  servd_http_req *r;
  api_repository_cb cb;
  void *ud;
} repo_waiter;

static void repo_answer(const repo_waiter *w, int status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void repo_answer(const repo_waiter *w, int status, const char *fmt, ...) {
  char msg[1536];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (w->cb) w->cb(w->ud, status, msg);
  else if (!w->r) return;
  else if (status == 200) servd_http_respond(w->r, 200, "application/json", "", 0);
  else api_kserve_error(w->r, status, "%s", msg);
}

static void repo_wait(api_model *am, const repo_waiter *w) {
  if (w->r) {
    am->waiter = w->r;
    w->r->ctx = am;
    w->r->on_abort = on_waiter_abort;
  } else {
    am->fe_waiter = w->cb;
    am->fe_waiter_ud = w->ud;
  }
}

static bool repo_waiting(const api_model *am) { return am->waiter || am->fe_waiter; }

/* The model's waiter, taken off it (both fields NULL when none). */
static repo_waiter repo_take(api_model *am) {
  repo_waiter w = {am->waiter, am->fe_waiter, am->fe_waiter_ud};
  am->waiter = NULL;
  am->fe_waiter = NULL;
  am->fe_waiter_ud = NULL;
  if (w.r) w.r->on_abort = NULL;
  return w;
}

static void job_after(uv_work_t *w, int status) {
  (void)status;
  job *j = w->data;
  servd_api *a = j->a;
  api_model *am = j->am;
  if (j->unload) a->works--;
  repo_waiter waiter = repo_take(am);
  if (!j->unload) am->startup = false;
  if (j->unload) {
    am->m = NULL;
    am->state = M_UNAVAILABLE;
    am->load_failed = false;
    snprintf(am->error, sizeof am->error, "model '%s' is unloaded", am->name);
    fprintf(a->log, "servd: model '%s' unloaded\n", am->name);
    repo_answer(&waiter, 200, "%s", "");
    unload_finished(a);
  } else if (j->rc != 0) {
    am->state = M_UNAVAILABLE;
    am->load_failed = true;
    snprintf(am->error, sizeof am->error, "%s", j->msg);
    fprintf(a->log, "servd: model '%s' failed to load from %s: %s\n", am->name, am->path, j->msg);
    repo_answer(&waiter, 400, "failed to load model '%s': %s", am->name, j->msg);
    if (a->o.on_model_loaded) a->o.on_model_loaded(a->o.ud, am->name, j->rc, j->msg);
  } else {
    am->m = j->m;
    am->state = M_READY;
    am->load_failed = false;
    am->error[0] = '\0';
    if (!am->opts.name) {
      const char *pn = a->ops->name(am->m);
      if (pn && pn[0] && !api_model_find(a, pn)) {
        char *n = strdup(pn);
        if (n) {
          free(am->name);
          am->name = n;
        }
      }
    }
    fprintf(a->log, "servd: model '%s' loaded from %s (%s)\n", am->name, am->path,
            a->ops->kind(am->m) == SERVD_MODEL_CAUSAL_LM ? "causal-lm" : "generic");
    repo_answer(&waiter, 200, "%s", "");
    if (a->o.on_model_loaded) a->o.on_model_loaded(a->o.ud, am->name, 0, "");
    if (a->unload_done) { /* shutting down meanwhile: unload_all did not count it */
      a->unloads_pending++;
      start_unload(a, am, 0);
    }
  }
  fflush(a->log);
  free(j);
}

static int queue_job(servd_api *a, api_model *am, bool unload, int deadline_ms) {
  job *j = calloc(1, sizeof(*j));
  if (!j) return servd_fail(SERVD_ENOMEM, "model '%s': out of memory", am->name);
  j->a = a;
  j->am = am;
  j->unload = unload;
  j->deadline_ms = deadline_ms;
  j->m = unload ? am->m : NULL;
  j->w.data = j;
  int rc = uv_queue_work(a->loop, &j->w, job_work, job_after);
  if (rc != 0) {
    free(j);
    return servd_fail(SERVD_EIO, "model '%s': cannot queue work: %s", am->name, uv_strerror(rc));
  }
  /* Loads are not waited for at shutdown (servd_api_drain_loads): only unloads count as work. */
  if (unload) a->works++;
  return 0;
}

static void stem_of(const char *path, char *out, size_t cap) {
  const char *b = strrchr(path, '/');
  b = b ? b + 1 : path;
  snprintf(out, cap, "%s", b);
  char *dot = strrchr(out, '.');
  if (dot && dot != out) *dot = '\0';
}

int servd_api_load_model(servd_api *a, const servd_model_options *o) {
  if (!o || !o->path || !o->path[0]) return servd_fail(SERVD_EINVAL, "load model: a package path is required");
  char stem[256];
  stem_of(o->path, stem, sizeof stem);
  const char *name = o->name && o->name[0] ? o->name : stem;
  if (api_model_find(a, name)) return servd_fail(SERVD_EINVAL, "load model: two models are named '%s'", name);
  api_model *am = model_new(a, name, o->path);
  if (!am) return servd_fail(SERVD_ENOMEM, "load model: out of memory");
  am->opts = *o;
  am->opts.path = NULL;
  am->opts.name = o->name && o->name[0] ? am->name : NULL;
  am->state = M_LOADING;
  am->startup = true;
  fprintf(a->log, "servd: loading model '%s' from %s\n", name, o->path);
  return queue_job(a, am, false, 0);
}

int servd_api_add_model(servd_api *a, servd_model *m) {
  const char *name = a->ops->name(m);
  if (!name || !name[0]) return servd_fail(SERVD_EINVAL, "add model: the model has no name");
  if (api_model_find(a, name)) return servd_fail(SERVD_EINVAL, "add model: two models are named '%s'", name);
  api_model *am = model_new(a, name, NULL);
  if (!am) return servd_fail(SERVD_ENOMEM, "add model: out of memory");
  am->m = m;
  am->state = M_READY;
  return 0;
}

/* ---- unloading -------------------------------------------------------------------------------- */

static void on_unload_timer_closed(uv_handle_t *h) { free(h); }

static void stop_unload_timer(api_model *am) {
  if (am->unload_timer) {
    uv_timer_stop(am->unload_timer);
    uv_close((uv_handle_t *)am->unload_timer, on_unload_timer_closed);
    am->unload_timer = NULL;
  }
}

static void on_unload_deadline(uv_timer_t *t) {
  api_model *am = t->data;
  servd_api *a = *(servd_api **)(t + 1);
  /* Past the deadline: cancel what still runs; the unload proceeds when its last request ends. */
  am->unload_cancelled = true;
  for (gen *g = a->gens; g; g = g->next)
    if (g->am == am && !g->done && g->r) a->ops->cancel(g->r);
  stop_unload_timer(am);
}

static void start_unload(servd_api *a, api_model *am, int deadline_ms) {
  am->state = M_UNLOADING;
  if (am->inflight == 0) {
    if (queue_job(a, am, true, 0) != 0) am->state = M_READY;
    return;
  }
  if (!am->unload_timer && deadline_ms >= 0) {
    /* The timer carries the api pointer right after it. */
    uv_timer_t *t = malloc(sizeof(*t) + sizeof(servd_api *));
    if (!t) return;
    uv_timer_init(a->loop, t);
    t->data = am;
    *(servd_api **)(t + 1) = a;
    am->unload_timer = t;
    uv_timer_start(t, on_unload_deadline, (uint64_t)deadline_ms, 0);
  }
}

void api_model_release_ref(servd_api *a, api_model *am) {
  a->inflight--;
  if (--am->inflight == 0 && am->state == M_UNLOADING && am->m) {
    stop_unload_timer(am);
    if (queue_job(a, am, true, 0) != 0) am->state = M_READY;
  }
}

void servd_api_unload_all(servd_api *a, int deadline_ms, void (*done)(void *), void *ud) {
  a->unload_done = done;
  a->unload_ud = ud;
  a->unloads_pending = 1; /* held until every model has been started */
  for (api_model *am = a->models; am; am = am->next) {
    if (am->state == M_READY) {
      a->unloads_pending++;
      start_unload(a, am, deadline_ms);
    } else if (am->state == M_UNLOADING) {
      a->unloads_pending++; /* finishes through job_after */
    }                       /* a load in progress is not waited for: see servd_api_drain_loads */
  }
  unload_finished(a);
}

/* ---- repository extension --------------------------------------------------------------------- */

int servd_api_drain_loads(servd_api *a) {
  int n = 0;
  for (api_model *am = a->models; am; am = am->next) {
    if (am->state != M_LOADING) continue;
    n++;
    if (!repo_waiting(am)) continue;
    repo_waiter w = repo_take(am);
    repo_answer(&w, 503, "server is shutting down; the load of model '%s' is abandoned", am->name);
  }
  return n;
}

static const char *state_name(api_model_state s) {
  switch (s) {
  case M_LOADING: return "LOADING";
  case M_READY: return "READY";
  case M_UNLOADING: return "UNLOADING";
  default: return "UNAVAILABLE";
  }
}

json_t *servd_api_repository_index(servd_api *a) {
  json_t *arr = json_array();
  for (api_model *am = a->models; am; am = am->next) {
    /* A failed load is FAILED, with its reason; an unloaded model UNAVAILABLE. */
    const char *state = am->state == M_UNAVAILABLE && am->load_failed ? "FAILED" : state_name(am->state);
    /* A model restarting after its process died is UNAVAILABLE until it serves again, with why. */
    char why[512];
    bool down = restarting(a, am, why, sizeof why);
    if (down) state = "UNAVAILABLE";
    json_t *e = json_pack("{s:s, s:s, s:s}", "name", am->name, "version", "1", "state", state);
    if (down) json_object_set_new(e, "reason", json_string(why));
    else if (am->state == M_UNAVAILABLE && am->error[0]) json_object_set_new(e, "reason", json_string(am->error));
    json_array_append_new(arr, e);
  }
  /* Packages present in the repository directories but not loaded are listed too. */
  for (int i = 0; i < a->o.n_repository; i++) {
    uv_fs_t req;
    if (uv_fs_scandir(NULL, &req, a->repository[i], 0, NULL) < 0) {
      uv_fs_req_cleanup(&req);
      continue;
    }
    uv_dirent_t ent;
    while (uv_fs_scandir_next(&req, &ent) != UV_EOF) {
      size_t n = strlen(ent.name);
      if (n <= 4 || strcmp(ent.name + n - 4, ".mpk") != 0) continue;
      char stem[256];
      stem_of(ent.name, stem, sizeof stem);
      if (api_model_find(a, stem)) continue;
      json_array_append_new(arr, json_pack("{s:s, s:s, s:s}", "name", stem, "version", "1", "state", "UNAVAILABLE"));
    }
    uv_fs_req_cleanup(&req);
  }
  return arr;
}

void api_repository_index(servd_api *a, servd_http_req *r, const api_route_args *args) {
  (void)args;
  api_json(r, 200, servd_api_repository_index(a));
}

static int repository_load(servd_api *a, const repo_waiter *r, const char *name) {
  if (a->draining) {
    repo_answer(r, 503, "server is shutting down");
    return 0;
  }
  api_model *am = api_model_find(a, name);
  if (am && (repo_waiting(am) || am->state == M_LOADING || am->state == M_UNLOADING)) {
    repo_answer(r, 409, "model '%s' is %s; try again when that has finished", name,
                am->state == M_UNLOADING ? "unloading" : "loading");
    return 0;
  }
  if (am && am->state == M_READY) {
    repo_answer(r, 200, "%s", "");
    return 0;
  }
  if (!am) {
    if (name[0] == '.' || strchr(name, '/')) {
      repo_answer(r, 400, "invalid model name '%s'", name);
      return 0;
    }
    char path[4096] = "";
    for (int i = 0; i < a->o.n_repository && !path[0]; i++) {
      char cand[4096];
      struct stat st;
      snprintf(cand, sizeof cand, "%s/%s.mpk", a->repository[i], name);
      if (stat(cand, &st) == 0 && S_ISREG(st.st_mode)) snprintf(path, sizeof path, "%s", cand);
    }
    if (!path[0]) {
      repo_answer(r, 404, "model '%s' is not in the model repository (%d director%s searched for '%s.mpk')", name,
                  a->o.n_repository, a->o.n_repository == 1 ? "y" : "ies", name);
      return 0;
    }
    am = model_new(a, name, path);
    if (!am) {
      repo_answer(r, 500, "out of memory");
      return 0;
    }
    const servd_model_options *d = &a->o.model_defaults;
    a->ops->options_default(&am->opts);
    // clang-format off: a list of macro uses, one a line
#define OVERRIDE(f) \
  if (d->f > 0) am->opts.f = d->f;
    OVERRIDE(interpreters)
    OVERRIDE(tp)
    OVERRIDE(max_queue)
    OVERRIDE(max_batch_tokens)
    OVERRIDE(max_seqs)
    OVERRIDE(kv_blocks)
    OVERRIDE(block_size)
    OVERRIDE(max_batch_size)
    OVERRIDE(max_batch_delay_ms)
#undef OVERRIDE
    // clang-format on
    am->opts.path = NULL;
    am->opts.name = am->name;
  }
  if (!am->path) {
    repo_answer(r, 400, "model '%s' was not loaded from a file and cannot be reloaded", name);
    return 0;
  }
  am->state = M_LOADING;
  fprintf(a->log, "servd: loading model '%s' from %s\n", am->name, am->path);
  if (queue_job(a, am, false, 0) != 0) {
    am->state = M_UNAVAILABLE;
    repo_answer(r, 500, "%s", servd_last_error());
    return 0;
  }
  repo_wait(am, r);
  return 0;
}

static int repository_unload(servd_api *a, const repo_waiter *r, const char *name) {
  api_model *am = api_model_find(a, name);
  if (!am) {
    repo_answer(r, 404, "model '%s' is not served here", name);
    return 0;
  }
  if (am->state == M_UNAVAILABLE) {
    /* A failed load has nothing loaded to free: unloading it forgets the failure (FAILED becomes
     * UNAVAILABLE, as Triton does), so the index no longer reports it. */
    if (am->load_failed) {
      am->load_failed = false;
      snprintf(am->error, sizeof am->error, "model '%s' is unloaded", am->name);
      fprintf(a->log, "servd: model '%s' unloaded (its load had failed)\n", am->name);
    }
    repo_answer(r, 200, "%s", "");
    return 0;
  }
  if (repo_waiting(am) || am->state != M_READY) {
    repo_answer(r, 409, "model '%s' is %s; try again when that has finished", name, state_name(am->state));
    return 0;
  }
  repo_wait(am, r);
  fprintf(a->log, "servd: unloading model '%s' (%d requests running)\n", am->name, am->inflight);
  start_unload(a, am, a->o.unload_timeout_ms);
  return 0;
}

void api_repository_load(servd_api *a, servd_http_req *r, const api_route_args *args) {
  repo_waiter w = {r, NULL, NULL};
  repository_load(a, &w, args->model);
}

void api_repository_unload(servd_api *a, servd_http_req *r, const api_route_args *args) {
  repo_waiter w = {r, NULL, NULL};
  repository_unload(a, &w, args->model);
}

void servd_api_repository_load(servd_api *a, const char *name, api_repository_cb cb, void *ud) {
  repo_waiter w = {NULL, cb, ud};
  repository_load(a, &w, name);
}

void servd_api_repository_unload(servd_api *a, const char *name, api_repository_cb cb, void *ud) {
  repo_waiter w = {NULL, cb, ud};
  repository_unload(a, &w, name);
}

void servd_api_repository_forget(servd_api *a, void *ud) {
  for (api_model *am = a->models; am; am = am->next)
    if (am->fe_waiter && am->fe_waiter_ud == ud) {
      am->fe_waiter = NULL;
      am->fe_waiter_ud = NULL;
    }
}
