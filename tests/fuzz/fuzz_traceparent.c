/* The W3C traceparent header parser (daemon/api/traceparent.c): any bytes give a valid context, a
 * parent only for a well-formed value, and a well-formed value round-trips (its trace id and parent
 * span id come back as the hex it held). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/otlp.h"

#define CHECK(c) \
  do { \
    if (!(c)) { \
      fprintf(stderr, "check failed: %s\n", #c); \
      abort(); \
    } \
  } while (0)

static bool all_zero(const uint8_t *p, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (p[i]) return false;
  return true;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *s = malloc(size + 1);
  CHECK(s);
  memcpy(s, data, size);
  s[size] = '\0';
  api_trace_ctx ctx;
  api_trace_ctx_init(&ctx, s, s);
  CHECK(!all_zero(ctx.trace_id, 16));
  CHECK(strlen(ctx.request_id) < sizeof ctx.request_id);
  if (ctx.has_parent) {
    CHECK(!all_zero(ctx.parent_span_id, 8));
    char hex[33];
    for (int i = 0; i < 16; i++) snprintf(hex + 2 * i, 3, "%02x", ctx.trace_id[i]);
    CHECK(strlen(s) >= 55 && !strncmp(s + 3, hex, 32));
    for (int i = 0; i < 8; i++) snprintf(hex + 2 * i, 3, "%02x", ctx.parent_span_id[i]);
    CHECK(!strncmp(s + 36, hex, 16));
  } else {
    CHECK(all_zero(ctx.parent_span_id, 8));
  }
  free(s);
  return 0;
}
