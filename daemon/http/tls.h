/* TLS for listeners on a libuv loop (OpenSSL with memory BIOs: no OpenSSL sockets, no threads).
 *
 * A servd_tls_ctx holds the certificate, key and optional client CA of a listener. A
 * servd_tls_conn is one connection's TLS state: the caller feeds it the ciphertext it read from the
 * socket, takes the plaintext out, hands it plaintext to send, and writes the ciphertext it produces
 * to the socket. It never touches a socket or a loop, so the HTTP/1.1 server and the gRPC listener
 * use it alike.
 *
 * Reload (servd_tls_ctx_reload, on SIGHUP) builds a complete new OpenSSL context from the files and
 * swaps it in only when every file loaded: connections made later use it, open connections keep the
 * one they started with (OpenSSL counts its references), and a bad file leaves the old one serving.
 *
 * Loop thread only. Errors are negative servd status codes with servd_last_error() set.
 */
#ifndef SERVD_HTTP_TLS_H
#define SERVD_HTTP_TLS_H

#include <stdbool.h>
#include <stddef.h>

#include "http/buf.h"

typedef struct servd_tls_ctx servd_tls_ctx;
typedef struct servd_tls_conn servd_tls_conn;

typedef struct servd_tls_options {
  const char *cert_file; /* PEM certificate chain (leaf first); required */
  const char *key_file;  /* PEM private key; required */
  const char *ca_file;   /* PEM CA bundle: clients must present a certificate it signed; NULL: none asked */
  /* ALPN protocols offered, in preference order, e.g. {"http/1.1"}; a client whose list shares none
   * is refused (no_application_protocol). A client without ALPN is accepted. */
  const char *const *alpn;
  int n_alpn;
} servd_tls_options;

/* Loads the files (errors name the file and OpenSSL's reason). Strings are copied. *out: the
 * caller destroys it. */
int servd_tls_ctx_create(const servd_tls_options *o, servd_tls_ctx **out);
/* Reads the same files again; on failure the old context stays in use and the error is returned. */
int servd_tls_ctx_reload(servd_tls_ctx *t);
/* Open connections keep their OpenSSL state, but the ALPN choice reads t: destroy it after the
 * listeners using it have closed. Accepts NULL. */
void servd_tls_ctx_destroy(servd_tls_ctx *t);
/* Subject and serial of the certificate new connections get, e.g. for the reload log line. */
void servd_tls_ctx_describe(const servd_tls_ctx *t, char *out, size_t cap);

/* A server-side connection on the context's current certificate; NULL when out of memory. */
servd_tls_conn *servd_tls_conn_create(servd_tls_ctx *t);
void servd_tls_conn_destroy(servd_tls_conn *c); /* accepts NULL */

typedef enum {
  SERVD_TLS_OK = 0,     /* progress; more input may be needed */
  SERVD_TLS_EOF = 1,    /* the peer sent close_notify: no more plaintext will come */
  SERVD_TLS_ERROR = -1, /* handshake or record failure: servd_tls_conn_error says why; an alert may
                          * be waiting in the output, then the connection must close */
} servd_tls_status;

/* Feeds ciphertext read from the socket and appends every plaintext byte it yields to *plain.
 * Handshake messages to send may appear in the output (servd_tls_conn_take_output). */
servd_tls_status servd_tls_conn_input(servd_tls_conn *c, const void *data, size_t len, servd_buf *plain);
/* Encrypts plaintext (after the handshake). Returns 0 or -1 (error, or the handshake is not done). */
int servd_tls_conn_write(servd_tls_conn *c, const void *data, size_t len);
/* Queues a close_notify alert (once). */
void servd_tls_conn_close_notify(servd_tls_conn *c);
/* Ciphertext produced and not yet taken, in bytes. */
size_t servd_tls_conn_output_pending(const servd_tls_conn *c);
/* Moves that ciphertext to the end of *out. Returns 0 or -1 (out of memory). */
int servd_tls_conn_take_output(servd_tls_conn *c, servd_buf *out);

bool servd_tls_conn_established(const servd_tls_conn *c);
/* The protocol ALPN chose into out, or "" when none was. */
void servd_tls_conn_alpn(const servd_tls_conn *c, char *out, size_t cap);
/* Why the last SERVD_TLS_ERROR happened (borrowed, valid while c lives). */
const char *servd_tls_conn_error(const servd_tls_conn *c);

/* Whether the first bytes of a connection on a TLS port look like a plaintext HTTP request (a method
 * name) rather than a TLS record (0x16 ...). */
bool servd_tls_looks_like_http(const void *data, size_t len);

#endif
