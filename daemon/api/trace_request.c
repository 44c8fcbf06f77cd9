/* Request traces (otlp.h): a span record when a language-model request ends, the exporter's life
 * and its counters in /metrics. */
#include "api/api-impl.h"
#include "api/otlp.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

/* Unix nanoseconds of a monotonic time t (api_now_ns). */
static uint64_t wall(uint64_t t, uint64_t mono_now, uint64_t wall_now) {
  return t ? wall_now - (mono_now - t) : wall_now;
}

void api_trace_finished(servd_api *a, api_model *am, const api_trace_ctx *ctx, const api_event *ev, uint64_t t_start,
                        uint64_t t_submit, uint64_t t_first, int max_tokens) {
  if (!a->tracer) return;
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  uint64_t wnow = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec, mnow = api_now_ns();
  api_span s;
  memset(&s, 0, sizeof s);
  s.ctx = *ctx;
  api_trace_random(s.span_id, 8);
  s.t_arrival = wall(t_start, mnow, wnow);
  s.t_submit = wall(t_submit, mnow, wnow);
  s.t_first_token = t_first ? wall(t_first, mnow, wnow) : 0;
  s.t_end = wall(ev->t_ns, mnow, wnow);
  s.queue_s = ev->queue_s;
  s.prefill_s = ev->prefill_s;
  s.decode_s = ev->decode_s;
  s.prompt_tokens = ev->prompt_tokens;
  s.completion_tokens = ev->completion_tokens;
  s.cached_tokens = ev->cached_tokens;
  s.max_tokens = max_tokens;
  snprintf(s.model, sizeof s.model, "%s", am->name);
  s.error = ev->kind == SERVD_EVENT_ERROR;
  snprintf(s.finish, sizeof s.finish, "%s", s.error ? "error" : ev->finish[0] ? ev->finish : "stop");
  api_tracer_submit(a->tracer, &s);
}

int servd_api_set_otlp_traces(servd_api *a, const char *endpoint) {
  api_tracer_destroy(a->tracer);
  a->tracer = NULL;
  return endpoint ? api_tracer_create(endpoint, &a->tracer) : 0;
}

void api_metrics_traces(servd_api *a, servd_buf *b) {
  if (!a->tracer) return;
  uint64_t exported, dropped;
  api_tracer_stats(a->tracer, &exported, &dropped);
  servd_buf_printf(b,
                   "# HELP servd_otlp_spans_exported_total Request span records the OTLP collector accepted.\n"
                   "# TYPE servd_otlp_spans_exported_total counter\nservd_otlp_spans_exported_total %llu\n"
                   "# HELP servd_otlp_spans_dropped_total Request span records dropped: export queue full, or the "
                   "collector down, slow or refusing.\n"
                   "# TYPE servd_otlp_spans_dropped_total counter\nservd_otlp_spans_dropped_total %llu\n",
                   (unsigned long long)exported, (unsigned long long)dropped);
}
