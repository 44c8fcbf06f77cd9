/* Generic (non-LLM) models' predictions for /metrics: a count by outcome and a latency histogram,
 * from acceptance (queued included) to the result, for KServe v2 over HTTP and gRPC alike. */
#include "api/api-impl.h"

#include <string.h>

static const double latency_bounds[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,  0.25,
                                        0.5,   1.0,    2.5,   5.0,  10.0,  30.0, 60.0, 120.0};

void api_infer_init(api_infer_stats *s) {
  memset(s, 0, sizeof(*s));
  api_hist_init(&s->latency, latency_bounds, (int)(sizeof latency_bounds / sizeof latency_bounds[0]));
}

void api_infer_done(api_model *am, bool ok, double secs) {
  if (ok) am->infer.ok++;
  else am->infer.failed++;
  api_hist_observe(&am->infer.latency, secs);
}

static bool generic(servd_api *a, const api_model *am) {
  return (am->state == M_READY || am->state == M_UNLOADING) && am->m && a->ops->kind(am->m) == SERVD_MODEL_GENERIC;
}

void api_metrics_generic(servd_api *a, servd_buf *b) {
  servd_buf_puts(b, "# HELP servd_inference_requests_total Predictions of generic models by outcome.\n"
                    "# TYPE servd_inference_requests_total counter\n");
  for (api_model *am = a->models; am; am = am->next) {
    if (!generic(a, am)) continue;
    for (int k = 0; k < 2; k++) {
      servd_buf_puts(b, "servd_inference_requests_total{model=\"");
      api_prom_label(b, am->name);
      servd_buf_printf(b, "\",outcome=\"%s\"} %llu\n", k ? "error" : "success",
                       (unsigned long long)(k ? am->infer.failed : am->infer.ok));
    }
  }
  servd_buf_puts(b, "# HELP servd_inference_latency_seconds Time from a prediction's acceptance to its result.\n"
                    "# TYPE servd_inference_latency_seconds histogram\n");
  for (api_model *am = a->models; am; am = am->next) {
    if (!generic(a, am)) continue;
    const api_hist *h = &am->infer.latency;
    uint64_t cum = 0;
    for (int i = 0; i <= h->n; i++) {
      cum += h->counts[i];
      servd_buf_puts(b, "servd_inference_latency_seconds_bucket{model=\"");
      api_prom_label(b, am->name);
      if (i < h->n) servd_buf_printf(b, "\",le=\"%g\"} %llu\n", h->bounds[i], (unsigned long long)cum);
      else servd_buf_printf(b, "\",le=\"+Inf\"} %llu\n", (unsigned long long)cum);
    }
    servd_buf_puts(b, "servd_inference_latency_seconds_sum{model=\"");
    api_prom_label(b, am->name);
    servd_buf_printf(b, "\"} %.9g\nservd_inference_latency_seconds_count{model=\"", h->sum);
    api_prom_label(b, am->name);
    servd_buf_printf(b, "\"} %llu\n", (unsigned long long)h->count);
  }
}
