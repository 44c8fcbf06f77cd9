/* gRPC listener of servd: KServe v2's inference.GRPCInferenceService and grpc.health.v1.Health over
 * HTTP/2 (h2c, or h2 under TLS), on the same libuv loop as the HTTP server, parsed by nghttp2 (callback-driven, no
 * threads) and protobuf-c. It serves the API's models through api/frontend.h: the same readiness,
 * API key (`authorization: Bearer KEY` metadata) and prediction queue as the HTTP routes.
 *
 * Defences: a message over max_message_bytes is refused from its 5-byte prefix, before it is
 * buffered (RESOURCE_EXHAUSTED); SETTINGS_MAX_CONCURRENT_STREAMS and SETTINGS_MAX_HEADER_LIST_SIZE
 * are advertised and enforced; nghttp2 limits SETTINGS entries, queued SETTINGS/PING acks (floods),
 * CONTINUATION frames and the rate of stream resets (rapid reset); a client past a limit gets
 * GOAWAY. Everything runs on the loop thread; handles are freed only in their close callbacks.
 */
#ifndef SERVD_GRPC_H
#define SERVD_GRPC_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "api/api.h"
#include "http/tls.h"

typedef struct servd_grpc_server servd_grpc_server;

typedef struct servd_grpc_limits {
  size_t max_message_bytes;        /* one request message; RESOURCE_EXHAUSTED beyond (64 MiB) */
  uint32_t max_concurrent_streams; /* per connection (128) */
  uint32_t max_header_list_bytes;  /* decoded request headers per stream (16 KiB) */
  int max_connections;             /* further connections are accepted and closed at once (1024) */
  int handshake_timeout_ms;        /* TLS: a handshake not done by then closes the connection (30 s) */
} servd_grpc_limits;

void servd_grpc_limits_default(servd_grpc_limits *l);

/* *out owned by the caller, freed by servd_grpc_server_close. api borrowed: it must outlive the
 * server. */
int servd_grpc_server_create(uv_loop_t *loop, servd_api *api, const servd_grpc_limits *limits, servd_grpc_server **out);
/* Serves TLS on connections accepted from now on (tls borrowed: it outlives the server; its ALPN
 * list should offer "h2"). NULL: plaintext h2c. */
void servd_grpc_server_set_tls(servd_grpc_server *s, servd_tls_ctx *tls);
/* Binds and listens; port 0 picks a free one (see servd_grpc_server_port). */
int servd_grpc_server_listen(servd_grpc_server *s, const char *host, int port);
int servd_grpc_server_port(const servd_grpc_server *s);
/* Stops accepting; open connections get GOAWAY and close when their calls have ended. */
void servd_grpc_server_stop_accepting(servd_grpc_server *s);
/* Calls in progress (streams that have not been answered). */
int servd_grpc_server_active_calls(const servd_grpc_server *s);
/* Closes every handle (dropping calls in progress) and frees the server when the last handle has
 * closed; done(ud) runs then (may be NULL). Accepts NULL. */
void servd_grpc_server_close(servd_grpc_server *s, void (*done)(void *ud), void *ud);

#endif
