/* W3C Trace Context: a request's traceparent header parsed into its trace context (otlp.h), or a
 * new random trace. Outside data: fuzzed by tests/fuzz/fuzz_traceparent.c. */
#include "api/otlp.h"

#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

void api_trace_random(uint8_t *out, size_t n) {
  for (;;) {
    if (getrandom(out, n, 0) != (ssize_t)n) { /* no entropy source: time and address, still unique enough */
      struct timespec ts;
      clock_gettime(CLOCK_MONOTONIC, &ts);
      uint64_t x = ((uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec) ^ (uint64_t)(uintptr_t)out;
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
