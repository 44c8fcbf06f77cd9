/* Triton's statistics extension for generic models' predictions (KServe v2 over HTTP and gRPC:
 * both go through kserve.c's queue): GET /v2/models/stats and GET /v2/models/{m}/stats.
 *
 * Phases of one prediction: compute_input is parsing the request into tensors (HTTP; the gRPC
 * front end decodes its own before queueing, counted as 0 ns), queue from acceptance to a worker
 * taking it, compute_infer the model's code, compute_output writing the response. success and
 * fail are whole requests, parse to answer; the phases count successful ones only, as Triton's. */
#include "api/api-impl.h"
#include "api/frontend.h"
#include "api/route.h" /* API_MODEL_VERSION */
#include "api/handlers.h"
#include "api/respond.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

static void add(api_kserve_duration *d, uint64_t from, uint64_t to) {
  d->count++;
  d->ns += to > from ? to - from : 0;
}

void api_kserve_stats_add(api_model *am, bool ok, const api_kserve_times *t) {
  api_kserve_stats *s = &am->kstats;
  struct timespec now;
  clock_gettime(CLOCK_REALTIME, &now);
  s->last_inference_ms = (uint64_t)now.tv_sec * 1000u + (uint64_t)now.tv_nsec / 1000000u;
  add(ok ? &s->success : &s->fail, t->accept - t->parse_ns, t->answered);
  if (!ok) return;
  s->inference_count++;
  s->execution_count++;
  add(&s->compute_input, 0, t->parse_ns);
  add(&s->queue, t->accept, t->start);
  add(&s->compute_infer, t->start, t->done);
  add(&s->compute_output, t->done, t->answered);
}

static json_t *duration(const api_kserve_duration *d) {
  return json_pack("{s:I, s:I}", "count", (json_int_t)d->count, "ns", (json_int_t)d->ns);
}

static json_t *model_stats(const api_model *am) {
  const api_kserve_stats *s = &am->kstats;
  api_kserve_duration none = {0, 0};
  return json_pack("{s:s, s:s, s:I, s:I, s:I, s:{s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o}, s:[]}", "name", am->name,
                   "version", API_MODEL_VERSION, "last_inference", (json_int_t)s->last_inference_ms, "inference_count",
                   (json_int_t)s->inference_count, "execution_count", (json_int_t)s->execution_count, "inference_stats",
                   "success", duration(&s->success), "fail", duration(&s->fail), "queue", duration(&s->queue),
                   "compute_input", duration(&s->compute_input), "compute_infer", duration(&s->compute_infer),
                   "compute_output", duration(&s->compute_output), "cache_hit", duration(&none), "cache_miss",
                   duration(&none), "batch_stats");
}

static void answer(servd_http_req *r, json_t *list) {
  json_t *body = json_pack("{s:o}", "model_stats", list);
  if (!body) api_kserve_error(r, 500, "out of memory");
  else api_json(r, 200, body);
}

void api_kserve_model_stats(servd_api *a, servd_http_req *r, const api_route_args *args) {
  (void)a;
  answer(r, json_pack("[o]", model_stats(args->am)));
}

/* Every model that has a prediction path: the loaded generic ones. */
static json_t *all_stats(servd_api *a) {
  json_t *list = json_array();
  for (api_model *am = a->models; am; am = am->next)
    if ((am->state == M_READY || am->state == M_UNLOADING) && am->m && a->ops->kind(am->m) == SERVD_MODEL_GENERIC)
      json_array_append_new(list, model_stats(am));
  return list;
}

void api_kserve_all_stats(servd_api *a, servd_http_req *r, const api_route_args *args) {
  (void)args;
  answer(r, all_stats(a));
}

json_t *servd_api_model_stats(servd_api *a, const char *name, const char *version, int *status, char *msg, size_t cap) {
  json_t *list;
  if (!name || !name[0]) {
    list = all_stats(a);
  } else {
    api_model *am = api_model_find(a, name);
    if (!am || (version && version[0] && strcmp(version, API_MODEL_VERSION) != 0)) {
      *status = 404;
      if (am) snprintf(msg, cap, "model '%s' has no version '%s'", name, version);
      else snprintf(msg, cap, "model '%s' is not served here", name);
      return NULL;
    }
    list = json_pack("[o]", model_stats(am));
  }
  *status = 200;
  return json_pack("{s:o}", "model_stats", list);
}
