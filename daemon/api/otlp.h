/* OpenTelemetry traces of requests, exported over OTLP/HTTP (protobuf) to --otlp-traces-endpoint
 * (internal to daemon/api).
 *
 * Each language-model request (each choice) becomes a span "llm_request" (vLLM's name and gen_ai.*
 * attributes: model, request id, prompt and completion tokens, max_tokens, queue time, time to
 * first token, prefill and decode times) with three child spans, "queue", "prefill" and "decode",
 * carrying their token counts. A W3C traceparent header on the request makes the span that header's
 * child in its trace; without one, the span starts a trace of its own.
 *
 * The loop thread only copies a finished request's span record into a bounded queue (a full queue
 * drops it and counts it); an exporter thread sends batches of up to OTLP_BATCH records as one
 * ExportTraceServiceRequest per POST, at least once a second, with short socket timeouts, so a
 * collector that is down or slow costs dropped spans (counted in /metrics), never the engine's or
 * the loop's time. Plain http:// only (a collector sidecar or a node agent; TLS is not spoken).
 */
#ifndef SERVD_API_OTLP_H
#define SERVD_API_OTLP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define OTLP_QUEUE 4096 /* span records waiting for the exporter at most */
#define OTLP_BATCH 512  /* records per POST at most */

/* A request's trace context: from its traceparent header, or new. */
typedef struct api_trace_ctx {
  uint8_t trace_id[16];
  uint8_t parent_span_id[8]; /* the caller's span (remote parent) */
  bool has_parent;
  char request_id[132];
} api_trace_ctx;

/* One finished request: everything its spans say. Times are unix nanoseconds. */
typedef struct api_span {
  api_trace_ctx ctx;
  uint8_t span_id[8];
  uint64_t t_arrival, t_submit, t_first_token, t_end; /* received, handed to the engine, ... */
  double queue_s, prefill_s, decode_s;
  int prompt_tokens, completion_tokens, cached_tokens, max_tokens;
  char model[128];
  char finish[16];
  bool error;
} api_span;

typedef struct api_tracer api_tracer;

/* Parses endpoint (http://HOST[:PORT][/PATH], PATH default /v1/traces) and starts the exporter.
 * 0, or SERVD_EINVAL naming what is wrong with the URL. */
int api_tracer_create(const char *endpoint, api_tracer **out);
/* Sends what is queued (bounded by the socket timeouts), then stops. Accepts NULL. */
void api_tracer_destroy(api_tracer *t);
/* Queues a copy of s; never blocks (a full queue counts a drop). */
void api_tracer_submit(api_tracer *t, const api_span *s);
/* Spans exported (the collector answered 2xx) and dropped (queue full, or the POST failed). */
void api_tracer_stats(api_tracer *t, uint64_t *exported, uint64_t *dropped);

/* Fills ctx from a traceparent header value (NULL or malformed: a new random trace, no parent). */
void api_trace_ctx_init(api_trace_ctx *ctx, const char *traceparent, const char *request_id);
/* Eight random bytes (a span id; never all zero). */
void api_trace_random(uint8_t *out, size_t n);

/* The ExportTraceServiceRequest of n records, packed into a malloc'd buffer (*len bytes); NULL out
 * of memory. */
uint8_t *api_otlp_encode(const api_span *spans, int n, size_t *len);

#endif
