/* HTTP/1.1 server on a libuv loop, parsing with http_parser.
 *
 * One request at a time per connection: pipelined requests are parsed only after the previous
 * response has ended, so responses keep their order. Limits: request line + headers (431), body
 * (413, checked against Content-Length before reading it), a deadline from the first byte of a
 * request to its last (408, slow clients), an idle keep-alive timeout, and a cap on unsent output per
 * connection (a reader that falls that far behind is disconnected instead of buffered without end).
 * Responses are either complete (Content-Length) or streamed with chunked transfer encoding.
 *
 * Back-pressure, as nginx does it: a connection whose unsent output passes a quarter of
 * max_output_bytes, or holds max_pipelined answered responses not yet handed to the socket, has
 * its next request neither parsed nor read (uv_read_stop) until its writes drain below a sixteenth
 * of max_output_bytes. Received, unparsed bytes are held up to max_input_bytes before reading
 * pauses. A connection's memory is so bounded by about max_input_bytes + max_output_bytes / 4 + one
 * response, however many requests its client pipelines without reading; none is lost or reordered.
 * A connection between requests whose writes make no progress for idle_timeout_ms is closed.
 *
 * Everything here runs on the loop thread. Handles are freed only in their close callbacks.
 */
#ifndef SERVD_HTTP_SERVER_H
#define SERVD_HTTP_SERVER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "http/arena.h"
#include "http/buf.h"
#include "http/tls.h"

typedef struct servd_http_server servd_http_server;
typedef struct servd_http_req servd_http_req;

typedef struct servd_http_limits {
  size_t max_header_bytes; /* request line + header names and values; 431 beyond */
  int max_headers;         /* header lines; 431 beyond */
  size_t max_body_bytes;   /* 413 beyond */
  int request_timeout_ms;  /* first byte to last byte of one request; 408 beyond */
  int idle_timeout_ms;     /* keep-alive connection without a request */
  size_t max_output_bytes; /* unsent response bytes per connection before it is dropped */
  size_t max_input_bytes;  /* received, unparsed (pipelined) bytes per connection before reading pauses */
  int max_pipelined;       /* answered responses awaiting the socket before the next request waits */
  int max_connections;     /* further connections are accepted and closed at once */
} servd_http_limits;

void servd_http_limits_default(servd_http_limits *l);

typedef struct servd_http_header {
  const char *name, *value;
} servd_http_header;

/* A request as the handler sees it. Strings are NUL-terminated and valid until the response ends
 * (or on_abort returns). */
struct servd_http_req {
  servd_arena *arena; /* freed when the response ends */
  const char *method; /* "GET", "POST", ... */
  const char *target; /* as received: path and query */
  const char *path;   /* percent-decoded path */
  const char *query;  /* after '?', or "" */
  const char *body;   /* NUL-terminated copy of the body */
  size_t body_len;
  const servd_http_header *headers;
  int n_headers;
  int http_major, http_minor;
  char remote[64];   /* peer address */
  uint64_t start_ns; /* uv_hrtime() when the request was complete */

  /* Set by the handler. */
  void *ctx;
  /* Called at most once if the connection goes away before the response ended; the handler must
   * then stop using this request (it is freed after the call). */
  void (*on_abort)(servd_http_req *r);
  const char *route;      /* label for metrics and logs (static storage) */
  const char *model;      /* model named by the request, for logs (arena or static) */
  const char *request_id; /* sent as X-Request-Id on the response and logged (arena or static); NULL: none */

  /* Filled in by the server. */
  int status;         /* 0 until a response started; 499 when the client went away first */
  uint64_t bytes_out; /* body bytes queued */
  void *conn_;        /* internal */
};

typedef struct servd_http_callbacks {
  /* A complete request. The handler responds now or later (on this loop). */
  void (*handle)(void *ud, servd_http_req *r);
  /* After the response ended or the request was aborted (metrics, access log). May be NULL. */
  void (*complete)(void *ud, const servd_http_req *r);
  /* Body of an error the server answers itself (400, 408, 413, 431, 501, 505) for a request target
   * ("" when not yet known). NULL: {"error": message}. */
  void (*error_body)(void *ud, const char *target, int status, const char *message, servd_buf *out);
  void *ud;
} servd_http_callbacks;

/* *out owned by the caller, freed by servd_http_server_close. */
int servd_http_server_create(uv_loop_t *loop, const servd_http_limits *limits, const servd_http_callbacks *cb,
                             servd_http_server **out);
/* Binds and listens; port 0 picks a free one (see servd_http_server_port). */
int servd_http_server_listen(servd_http_server *s, const char *host, int port);
int servd_http_server_port(const servd_http_server *s);
/* Stops accepting, closes idle connections, and closes the others when their response ends. */
void servd_http_server_stop_accepting(servd_http_server *s);
int servd_http_server_active_requests(const servd_http_server *s);
int servd_http_server_connections(const servd_http_server *s);
/* Socket writes issued so far (uv_write calls); for tests and metrics. */
uint64_t servd_http_server_writes(const servd_http_server *s);
/* The most any one connection has held so far of unsent output (queued plus being written) and of
 * received, unparsed input, in bytes; for tests and metrics. */
size_t servd_http_server_peak_output(const servd_http_server *s);
size_t servd_http_server_peak_input(const servd_http_server *s);
/* Times a connection stopped reading because of back-pressure (output or input over its mark). */
uint64_t servd_http_server_read_pauses(const servd_http_server *s);
/* Serves HTTPS (see http/tls.h) on connections accepted from now on; tls is borrowed and must
 * outlive the server. Plaintext requests on such a listener get a plaintext 400 and are closed, as
 * nginx answers them; failed handshakes are closed (logged with SERVD_DEBUG set). TLS output counts
 * toward max_output_bytes as ciphertext. */
void servd_http_server_set_tls(servd_http_server *s, servd_tls_ctx *tls);
/* Connections closed for a failed handshake, a bad record or plaintext on a TLS listener. */
uint64_t servd_http_server_tls_failures(const servd_http_server *s);
/* A batch of responses produced together (e.g. one wake-up's worth of engine events): between
 * begin and end, output is only queued, and batch_end writes each connection that got output once,
 * in the order it was queued. Nothing waits on a timer: the batch ends before the loop goes back to
 * polling. Batches nest; only the outermost end flushes. Loop thread only. */
void servd_http_server_batch_begin(servd_http_server *s);
void servd_http_server_batch_end(servd_http_server *s);
/* Closes every handle (aborting requests in progress) and frees the server when the last handle
 * has closed; done(ud) runs then. */
void servd_http_server_close(servd_http_server *s, void (*done)(void *ud), void *ud);

/* Case-insensitive header lookup; NULL when absent. */
const char *servd_http_header_get(const servd_http_req *r, const char *name);

/* Adds a response header (before respond / stream_begin). */
void servd_http_set_header(servd_http_req *r, const char *name, const char *value);
/* Sends a complete response and ends the request: r is invalid afterwards. */
void servd_http_respond(servd_http_req *r, int status, const char *content_type, const char *body, size_t len);
/* Starts a chunked response. */
void servd_http_stream_begin(servd_http_req *r, int status, const char *content_type);
/* Queues one chunk. Returns 0, or -1 when the client is gone or too far behind: the connection is
 * then being closed and on_abort has already run (do not touch r again). */
int servd_http_stream_write(servd_http_req *r, const char *data, size_t len);
/* Ends a chunked response; r is invalid afterwards. */
void servd_http_stream_end(servd_http_req *r);

const char *servd_http_reason(int status);

#endif
