/* HTTP/1.1 request framing: http_parser with servd's callbacks and limits, without sockets.
 *
 * The server feeds each connection's received bytes through one framer; the fuzz target feeds it
 * arbitrary bytes. It stops after every complete request (servd answers requests of a connection
 * one at a time), and reports a limit or a syntax error as the status the server answers with:
 * 431 (request line + headers beyond max_header_bytes, or more than max_headers lines), 413 (a
 * Content-Length, a chunk size or a chunked body beyond max_body_bytes), 505 (an HTTP major version
 * other than 1), 501 (a transfer coding other than chunked) or 400 (malformed).
 *
 * http_parser 2.9 as Debian builds it (not HTTP_PARSER_STRICT) accepts what RFC 9112 says a server
 * must reject, and request smuggling feeds on: whitespace inside a header name ("Transfer-Encoding :
 * chunked" read as chunked), obsolete line folding, any version. The framer rejects these itself, as
 * nginx does: 400 for whitespace in a field name, obs-fold, several Transfer-Encoding fields or one
 * in an HTTP/1.0 request. (llhttp, its strict successor, is not packaged for Debian 12.)
 */
#ifndef SERVD_HTTP_FRAMER_H
#define SERVD_HTTP_FRAMER_H

#include <http_parser.h>
#include <stdbool.h>
#include <stddef.h>

#include "http/arena.h"
#include "http/buf.h"
#include "http/server.h"

typedef enum servd_frame_result {
  SERVD_FRAME_MORE = 0, /* every byte given was consumed; the request is not complete yet */
  SERVD_FRAME_REQUEST,  /* a complete request; *consumed bytes belong to it (or came before it) */
  SERVD_FRAME_ERROR,    /* err_status / err_msg say why; the connection cannot go on */
} servd_frame_result;

typedef struct servd_http_framer {
  http_parser parser;
  servd_http_limits lim;
  servd_buf hbuf; /* url '\0' name '\0' value '\0' ... (owned) */
  size_t url_len;
  int n_headers;
  size_t (*hoff)[2];          /* offsets of name and value in hbuf (owned, max_headers + 1 entries) */
  servd_http_header *headers; /* pointers into hbuf, set when the headers are complete (owned) */
  bool in_value;
  bool in_trailer; /* past the headers: further header lines are a chunked body's trailer */
  size_t header_bytes;
  servd_buf body;                         /* owned */
  bool keep_alive, expect_continue, head; /* of the current request, once its headers are complete */
  int err_status;      /* limit or strictness check failed inside a parser callback: 400, 413, 431, 501, 505 */
  const char *err_msg; /* why, when err_status is set (static storage) */
  int bad_status;      /* a strictness check failed in the head: reported when the head is complete */
  const char *bad_msg;
  const char *feed_start; /* the data of the current feed, for looking back from a callback */
  char last_byte;         /* last byte other than SP / HT of the bytes fed before (obs-fold check) */
  /* Hooks for the server (each may be NULL): a request's first byte, its headers complete with
   * "Expect: 100-continue", and its last byte. */
  void (*on_begin)(void *ud);
  void (*on_continue)(void *ud);
  void (*on_complete)(void *ud);
  void *ud;
} servd_http_framer;

/* lim NULL: servd_http_limits_default. Returns 0 or SERVD_ENOMEM; f is safe to free either way. */
int servd_http_framer_init(servd_http_framer *f, const servd_http_limits *lim);
void servd_http_framer_free(servd_http_framer *f); /* accepts a zeroed framer */

/* Parses up to len bytes. *consumed: how many were used (the rest, after a request, belong to the
 * next one). On SERVD_FRAME_ERROR, *status is 400, 413, 431, 501 or 505 and msg (cap bytes) says why. */
servd_frame_result servd_http_framer_feed(servd_http_framer *f, const char *data, size_t len, size_t *consumed,
                                          int *status, char *msg, size_t cap);

/* After SERVD_FRAME_REQUEST: fills the request fields the framer knows (method, target, path,
 * query, body, headers, HTTP version); the strings stay valid until the next feed, arena copies
 * until the arena is reset. Returns false when the target cannot be percent-decoded (400). */
bool servd_http_framer_request(servd_http_framer *f, servd_arena *a, servd_http_req *r);

/* The request target once the request line has been read, else "" (for error bodies). */
const char *servd_http_framer_target(const servd_http_framer *f);

/* Drops the current request's body (its memory too when it was large), between requests. */
void servd_http_framer_release_body(servd_http_framer *f);

#endif
