/* api_otlp_encode: span records as one ExportTraceServiceRequest (see otlp.h). Each record is a
 * root span and its three phases; the messages live on the stack and a per-record scratch array,
 * and protobuf-c packs them. */
#include "api/otlp.h"

#include <stdlib.h>
#include <string.h>

#include "otlp_trace.pb-c.h"

#define ATTRS 12 /* per span at most */

typedef struct span_msgs {
  Servd__Otlp__Span span;
  Servd__Otlp__KeyValue kv[ATTRS];
  Servd__Otlp__AnyValue val[ATTRS];
  Servd__Otlp__KeyValue *kvp[ATTRS];
  Servd__Otlp__Status status;
  uint8_t span_id[8];
} span_msgs;

static void attr_str(span_msgs *m, const char *key, const char *v) {
  size_t i = m->span.n_attributes++;
  m->kv[i] = (Servd__Otlp__KeyValue)SERVD__OTLP__KEY_VALUE__INIT;
  m->val[i] = (Servd__Otlp__AnyValue)SERVD__OTLP__ANY_VALUE__INIT;
  m->kv[i].key = (char *)key;
  m->val[i].value_case = SERVD__OTLP__ANY_VALUE__VALUE_STRING_VALUE;
  m->val[i].string_value = (char *)v;
  m->kv[i].value = &m->val[i];
  m->kvp[i] = &m->kv[i];
}

static void attr_int(span_msgs *m, const char *key, int64_t v) {
  attr_str(m, key, "");
  size_t i = m->span.n_attributes - 1;
  m->val[i].value_case = SERVD__OTLP__ANY_VALUE__VALUE_INT_VALUE;
  m->val[i].int_value = v;
}

static void attr_dbl(span_msgs *m, const char *key, double v) {
  attr_str(m, key, "");
  size_t i = m->span.n_attributes - 1;
  m->val[i].value_case = SERVD__OTLP__ANY_VALUE__VALUE_DOUBLE_VALUE;
  m->val[i].double_value = v;
}

static void span_init(span_msgs *m, const api_span *s, const char *name, const uint8_t *span_id, const uint8_t *parent,
                      uint64_t t0, uint64_t t1, bool server) {
  m->span = (Servd__Otlp__Span)SERVD__OTLP__SPAN__INIT;
  m->span.trace_id = (ProtobufCBinaryData){16, (uint8_t *)s->ctx.trace_id};
  memcpy(m->span_id, span_id, 8);
  m->span.span_id = (ProtobufCBinaryData){8, m->span_id};
  if (parent) m->span.parent_span_id = (ProtobufCBinaryData){8, (uint8_t *)parent};
  m->span.name = (char *)name;
  m->span.kind =
      server ? SERVD__OTLP__SPAN__SPAN_KIND__SPAN_KIND_SERVER : SERVD__OTLP__SPAN__SPAN_KIND__SPAN_KIND_INTERNAL;
  m->span.start_time_unix_nano = t0;
  m->span.end_time_unix_nano = t1 > t0 ? t1 : t0;
  m->span.attributes = m->kvp;
  m->status = (Servd__Otlp__Status)SERVD__OTLP__STATUS__INIT;
  m->status.code =
      s->error ? SERVD__OTLP__STATUS__STATUS_CODE__STATUS_CODE_ERROR : SERVD__OTLP__STATUS__STATUS_CODE__STATUS_CODE_OK;
  m->span.status = &m->status;
}

/* The four spans of record s into m[0..3]. */
static void record(span_msgs *m, const api_span *s) {
  span_init(&m[0], s, "llm_request", s->span_id, s->ctx.has_parent ? s->ctx.parent_span_id : NULL, s->t_arrival,
            s->t_end, true);
  attr_str(&m[0], "gen_ai.request.model", s->model);
  attr_str(&m[0], "gen_ai.response.model", s->model);
  attr_str(&m[0], "gen_ai.request.id", s->ctx.request_id);
  attr_int(&m[0], "gen_ai.usage.prompt_tokens", s->prompt_tokens);
  attr_int(&m[0], "gen_ai.usage.completion_tokens", s->completion_tokens);
  attr_int(&m[0], "gen_ai.request.max_tokens", s->max_tokens);
  attr_dbl(&m[0], "gen_ai.latency.time_in_queue", s->queue_s);
  attr_dbl(&m[0], "gen_ai.latency.time_to_first_token",
           s->t_first_token > s->t_arrival ? (double)(s->t_first_token - s->t_arrival) / 1e9 : 0.0);
  attr_dbl(&m[0], "gen_ai.latency.e2e", (double)(s->t_end - s->t_arrival) / 1e9);
  attr_dbl(&m[0], "gen_ai.latency.time_in_model_prefill", s->prefill_s);
  attr_dbl(&m[0], "gen_ai.latency.time_in_model_decode", s->decode_s);
  attr_str(&m[0], "gen_ai.response.finish_reasons", s->finish);
  /* The phases, back to back from the time the engine took the request: child span ids are the
   * root's with the last byte changed (unique within the trace, derived, no more randomness). */
  uint64_t q0 = s->t_submit, q1 = q0 + (uint64_t)(s->queue_s * 1e9);
  uint64_t p1 = q1 + (uint64_t)(s->prefill_s * 1e9), d1 = p1 + (uint64_t)(s->decode_s * 1e9);
  static const char *const names[3] = {"queue", "prefill", "decode"};
  const uint64_t t[4] = {q0, q1, p1, d1};
  for (int k = 0; k < 3; k++) {
    uint8_t id[8];
    memcpy(id, s->span_id, 8);
    id[7] ^= (uint8_t)(k + 1);
    span_init(&m[1 + k], s, names[k], id, s->span_id, t[k], t[k + 1], false);
  }
  attr_int(&m[2], "gen_ai.usage.prompt_tokens", s->prompt_tokens);
  attr_int(&m[2], "servd.prefix_cache.cached_tokens", s->cached_tokens);
  attr_int(&m[3], "gen_ai.usage.completion_tokens", s->completion_tokens);
}

uint8_t *api_otlp_encode(const api_span *spans, int n, size_t *len) {
  *len = 0;
  span_msgs *m = calloc((size_t)(n > 0 ? n : 1) * 4, sizeof *m);
  Servd__Otlp__Span **sp = calloc((size_t)(n > 0 ? n : 1) * 4, sizeof *sp);
  uint8_t *out = NULL;
  if (!m || !sp) goto done;
  for (int i = 0; i < n; i++) {
    record(&m[4 * i], &spans[i]);
    for (int k = 0; k < 4; k++) sp[4 * i + k] = &m[4 * i + k].span;
  }
  Servd__Otlp__AnyValue svc_v = SERVD__OTLP__ANY_VALUE__INIT;
  svc_v.value_case = SERVD__OTLP__ANY_VALUE__VALUE_STRING_VALUE;
  svc_v.string_value = "servd";
  Servd__Otlp__KeyValue svc = SERVD__OTLP__KEY_VALUE__INIT, *svcp = &svc;
  svc.key = "service.name";
  svc.value = &svc_v;
  Servd__Otlp__Resource res = SERVD__OTLP__RESOURCE__INIT;
  res.n_attributes = 1;
  res.attributes = &svcp;
  Servd__Otlp__InstrumentationScope scope = SERVD__OTLP__INSTRUMENTATION_SCOPE__INIT;
  scope.name = "servd";
  Servd__Otlp__ScopeSpans ss = SERVD__OTLP__SCOPE_SPANS__INIT, *ssp = &ss;
  ss.scope = &scope;
  ss.n_spans = (size_t)n * 4;
  ss.spans = sp;
  Servd__Otlp__ResourceSpans rs = SERVD__OTLP__RESOURCE_SPANS__INIT, *rsp = &rs;
  rs.resource = &res;
  rs.n_scope_spans = 1;
  rs.scope_spans = &ssp;
  Servd__Otlp__ExportTraceServiceRequest req = SERVD__OTLP__EXPORT_TRACE_SERVICE_REQUEST__INIT;
  req.n_resource_spans = 1;
  req.resource_spans = &rsp;
  size_t sz = servd__otlp__export_trace_service_request__get_packed_size(&req);
  out = malloc(sz ? sz : 1);
  if (out) *len = servd__otlp__export_trace_service_request__pack(&req, out);
done:
  free(m);
  free(sp);
  return out;
}
