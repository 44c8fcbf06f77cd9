/* ModelStatistics: Triton's statistics extension over gRPC, the same counters as GET
 * /v2/models[/{m}]/stats (api/kserve_stats.c): both front ends' predictions are counted there. */
#include <jansson.h>
#include <stdlib.h>

#include "grpc/grpc-impl.h"

enum { N_DURATIONS = 8 };
static const char *const duration_names[N_DURATIONS] = {"success",       "fail",           "queue",     "compute_input",
                                                        "compute_infer", "compute_output", "cache_hit", "cache_miss"};

/* One model's entry; strings borrowed from j. d: its N_DURATIONS durations. */
static void fill(Inference__ModelStatistics *m, Inference__InferStatistics *is, Inference__StatisticDuration *d,
                 json_t *j) {
  m->name = (char *)json_string_value(json_object_get(j, "name"));
  m->version = (char *)json_string_value(json_object_get(j, "version"));
  if (!m->name) m->name = "";
  if (!m->version) m->version = "";
  m->last_inference = (uint64_t)json_integer_value(json_object_get(j, "last_inference"));
  m->inference_count = (uint64_t)json_integer_value(json_object_get(j, "inference_count"));
  m->execution_count = (uint64_t)json_integer_value(json_object_get(j, "execution_count"));
  json_t *stats = json_object_get(j, "inference_stats");
  Inference__StatisticDuration **slot[N_DURATIONS] = {&is->success,       &is->fail,          &is->queue,
                                                      &is->compute_input, &is->compute_infer, &is->compute_output,
                                                      &is->cache_hit,     &is->cache_miss};
  for (int i = 0; i < N_DURATIONS; i++) {
    json_t *e = json_object_get(stats, duration_names[i]);
    d[i].count = (uint64_t)json_integer_value(json_object_get(e, "count"));
    d[i].ns = (uint64_t)json_integer_value(json_object_get(e, "ns"));
    *slot[i] = &d[i];
  }
  m->inference_stats = is;
}

void grpc_model_statistics(grpc_call *c, const uint8_t *msg, size_t len) {
  Inference__ModelStatisticsRequest *q = inference__model_statistics_request__unpack(NULL, len, msg);
  if (!q) {
    grpc_fail(c, GRPC_INVALID_ARGUMENT, "malformed inference.ModelStatisticsRequest message");
    return;
  }
  char err[1024];
  int st = 0;
  json_t *j = servd_api_model_stats(c->api, q->name, q->version, &st, err, sizeof err);
  inference__model_statistics_request__free_unpacked(q, NULL);
  if (!j) {
    grpc_fail(c, grpc_code_for_status(st), "%s", err);
    return;
  }
  json_t *list = json_object_get(j, "model_stats");
  size_t n = json_array_size(list);
  /* One block: the pointers, then per model its message, its InferStatistics and its durations. */
  size_t each = sizeof(Inference__ModelStatistics) + sizeof(Inference__InferStatistics) +
                N_DURATIONS * sizeof(Inference__StatisticDuration);
  void *block = n ? calloc(n, sizeof(void *) + each) : NULL;
  if (n && !block) {
    json_decref(j);
    grpc_fail(c, GRPC_RESOURCE_EXHAUSTED, "out of memory");
    return;
  }
  Inference__ModelStatistics **models = block;
  char *p = (char *)block + n * sizeof(void *);
  for (size_t i = 0; i < n; i++, p += each) {
    Inference__ModelStatistics *m = (void *)p;
    Inference__InferStatistics *is = (void *)(m + 1);
    Inference__StatisticDuration *d = (void *)(is + 1);
    Inference__ModelStatistics mi = INFERENCE__MODEL_STATISTICS__INIT;
    Inference__InferStatistics ii = INFERENCE__INFER_STATISTICS__INIT;
    Inference__StatisticDuration di = INFERENCE__STATISTIC_DURATION__INIT;
    *m = mi;
    *is = ii;
    for (int k = 0; k < N_DURATIONS; k++) d[k] = di;
    fill(m, is, d, json_array_get(list, i));
    models[i] = m;
  }
  Inference__ModelStatisticsResponse r = INFERENCE__MODEL_STATISTICS_RESPONSE__INIT;
  r.n_model_stats = n;
  r.model_stats = models;
  grpc_reply(c, &r.base);
  free(block);
  json_decref(j);
}
