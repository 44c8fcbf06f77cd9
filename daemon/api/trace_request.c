/* Request traces (otlp.h): W3C trace context from the request, a span record when a language-model
 * request ends, the exporter's life and its counters in /metrics. */
#include "api/api-impl.h"
#include "api/otlp.h"

#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

void api_trace_random(uint8_t *out, size_t n) {
  for (;;) {
    if (getrandom(out, n, 0) != (ssize_t)n) { /* no entropy source: time and address, still unique enough */
      uint64_t x = (uint64_t)api_now_ns() ^ (uint64_t)(uintptr_t)out;
      for (size_t i = 0; i < n; i++, x = x * 6364136223846793005ull + 1442695040888963407ull)
        out[i] = (uint8_t)(x >> 56);
    }
    for (size_t i = 0; i < n; i++)
      if (out[i]) return;
  }
}

static int hexval(char c) { return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1; }

/* n bytes from 2n lowercase hex digits; false if one is not, or if all bytes are zero (invalid). */
static bool unhex(const char *s, uint8_t *out, size_t n) {
  bool nonzero = false;
  for (size_t i = 0; i < n; i++) {
    int hi = hexval(s[2 * i]), lo = hexval(s[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    out[i] = (uint8_t)(hi << 4 | lo);
    nonzero |= out[i] != 0;
  }
  return nonzero;
}

/* traceparent: "00-" 32 hex (trace id) "-" 16 hex (parent span id) "-" 2 hex (flags), lowercase; a
 * later version may append fields after another '-' (W3C Trace Context, 3.2); version ff is invalid,
 * and so are an all-zero trace or span id. */
static bool parse_traceparent(const char *tp, api_trace_ctx *ctx) {
  size_t len = tp ? strlen(tp) : 0;
  if (len < 55) return false;
  int v0 = hexval(tp[0]), v1 = hexval(tp[1]);
  if (v0 < 0 || v1 < 0 || (v0 == 15 && v1 == 15)) return false;
  bool v00 = v0 == 0 && v1 == 0;
  if (tp[2] != '-' || tp[35] != '-' || tp[52] != '-') return false;
  if (v00 ? len != 55 : (len > 55 && tp[55] != '-')) return false;
  if (hexval(tp[53]) < 0 || hexval(tp[54]) < 0) return false;
  return unhex(tp + 3, ctx->trace_id, 16) && unhex(tp + 36, ctx->parent_span_id, 8);
}

void api_trace_ctx_init(api_trace_ctx *ctx, const char *tp, const char *request_id) {
  memset(ctx, 0, sizeof *ctx);
  snprintf(ctx->request_id, sizeof ctx->request_id, "%s", request_id ? request_id : "");
  if (parse_traceparent(tp, ctx)) {
    ctx->has_parent = true;
    return;
  }
  memset(ctx->parent_span_id, 0, sizeof ctx->parent_span_id);
  api_trace_random(ctx->trace_id, 16);
}

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
