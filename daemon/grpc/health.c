/* grpc.health.v1.Health: Check and Watch. The server is SERVING while it is ready (as
 * /v2/health/ready), NOT_SERVING otherwise (loading, a stuck model, draining). Service "" and
 * "inference.GRPCInferenceService" are the server; any other name is NOT_FOUND for Check and
 * SERVICE_UNKNOWN for Watch, as grpc's own health service answers. A watch is polled once a second
 * and sends a message when the status changes. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grpc/grpc-impl.h"
#include "health.pb-c.h"

#define WATCH_POLL_MS 1000

typedef Grpc__Health__V1__HealthCheckResponse__ServingStatus serving_status;

static bool known_service(const char *s) { return s[0] == '\0' || strcmp(s, "inference.GRPCInferenceService") == 0; }

static serving_status server_status(servd_api *a) {
  return servd_api_server_ready(a) ? GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING
                                   : GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__NOT_SERVING;
}

/* The request's service name (copied into name), or -1 after answering INVALID_ARGUMENT. */
static int service_of(grpc_call *c, const uint8_t *msg, size_t len, char *name, size_t cap) {
  Grpc__Health__V1__HealthCheckRequest *q = grpc__health__v1__health_check_request__unpack(NULL, len, msg);
  if (!q) {
    grpc_fail(c, GRPC_INVALID_ARGUMENT, "malformed grpc.health.v1.HealthCheckRequest message");
    return -1;
  }
  snprintf(name, cap, "%s", q->service);
  grpc__health__v1__health_check_request__free_unpacked(q, NULL);
  return 0;
}

void grpc_health_check(grpc_call *c, const uint8_t *msg, size_t len) {
  char name[256];
  if (service_of(c, msg, len, name, sizeof name) != 0) return;
  if (!known_service(name)) {
    grpc_fail(c, GRPC_NOT_FOUND, "unknown service '%s'", name);
    return;
  }
  Grpc__Health__V1__HealthCheckResponse r = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
  r.status = server_status(c->api);
  grpc_reply(c, &r.base);
}

typedef struct watch {
  uv_timer_t timer; /* freed in its close callback */
  grpc_call *c;
  serving_status last;
} watch;

static void send_status(watch *w, serving_status st) {
  Grpc__Health__V1__HealthCheckResponse r = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
  r.status = st;
  w->last = st;
  grpc_send(w->c, &r.base);
}

static void watch_tick(uv_timer_t *t) {
  watch *w = t->data;
  serving_status st = server_status(w->c->api);
  if (st != w->last) send_status(w, st);
}

static void watch_closed(uv_handle_t *h) { free(h->data); }

/* Draining: watchers learn it now, not at the next poll (the server may be gone by then). */
static void watch_drain(grpc_call *c) {
  watch *w = c->ctx;
  watch_tick(&w->timer);
}

static void watch_cancel(grpc_call *c) {
  watch *w = c->ctx;
  w->c = NULL;
  uv_close((uv_handle_t *)&w->timer, watch_closed);
}

void grpc_health_watch(grpc_call *c, const uint8_t *msg, size_t len) {
  char name[256];
  if (service_of(c, msg, len, name, sizeof name) != 0) return;
  watch *w = calloc(1, sizeof *w);
  if (!w) {
    grpc_fail(c, GRPC_RESOURCE_EXHAUSTED, "out of memory");
    return;
  }
  w->c = c;
  c->ctx = w;
  c->on_cancel = watch_cancel;
  c->on_drain = watch_drain;
  grpc_call_background(c);
  uv_timer_init(c->loop, &w->timer);
  w->timer.data = w;
  if (!known_service(name)) {
    /* Open until the client ends it; the service may appear later, but servd's set never changes. */
    c->on_drain = NULL;
    send_status(w, GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVICE_UNKNOWN);
    return;
  }
  send_status(w, server_status(c->api));
  uv_timer_start(&w->timer, watch_tick, WATCH_POLL_MS, WATCH_POLL_MS);
}
