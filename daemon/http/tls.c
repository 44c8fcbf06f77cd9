#include "http/tls.h"

#include <errno.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "servd/status.h"

struct servd_tls_ctx {
  SSL_CTX *ssl_ctx; /* the current one; connections hold their own reference */
  char *cert_file, *key_file, *ca_file;
  unsigned char alpn[256]; /* ALPN wire format: length-prefixed names */
  unsigned alpn_len;
};

struct servd_tls_conn {
  SSL *ssl;
  BIO *rbio, *wbio; /* ciphertext in (from the socket), out (to the socket); owned by ssl */
  bool notify_sent;
  char err[200];
};

/* OpenSSL's reason for the last failure on this thread, and the queue cleared. */
static void ssl_reason(char *out, size_t cap) {
  unsigned long e = ERR_peek_last_error();
  if (e) ERR_error_string_n(e, out, cap);
  else snprintf(out, cap, "unknown error");
  ERR_clear_error();
}

static int file_fail(const char *what, const char *path) {
  char why[256];
  FILE *f = fopen(path, "r");
  if (!f) {
    ERR_clear_error();
    return servd_fail(SERVD_EINVAL, "TLS %s '%s': %s", what, path, strerror(errno));
  }
  fclose(f);
  ssl_reason(why, sizeof why);
  return servd_fail(SERVD_EINVAL, "TLS %s '%s': not usable (%s)", what, path, why);
}

static int alpn_select(SSL *ssl, const unsigned char **out, unsigned char *outlen, const unsigned char *in,
                       unsigned inlen, void *arg) {
  (void)ssl;
  const servd_tls_ctx *t = arg;
  unsigned char *sel = NULL;
  if (SSL_select_next_proto(&sel, outlen, t->alpn, t->alpn_len, in, inlen) != OPENSSL_NPN_NEGOTIATED)
    return SSL_TLSEXT_ERR_ALERT_FATAL; /* RFC 7301: no_application_protocol */
  *out = sel;
  return SSL_TLSEXT_ERR_OK;
}

/* A complete context from the files, or NULL with the error recorded. */
static SSL_CTX *ctx_build(servd_tls_ctx *t) {
  ERR_clear_error();
  SSL_CTX *ctx = SSL_CTX_new(TLS_server_method());
  if (!ctx) {
    servd_fail(SERVD_ENOMEM, "TLS: cannot create a context");
    return NULL;
  }
  SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
  /* No client-initiated renegotiation (a CPU-exhaustion vector); records may leave a mem BIO whole. */
  SSL_CTX_set_options(ctx, SSL_OP_NO_RENEGOTIATION | SSL_OP_CIPHER_SERVER_PREFERENCE);
  SSL_CTX_set_mode(ctx, SSL_MODE_RELEASE_BUFFERS);
  if (SSL_CTX_use_certificate_chain_file(ctx, t->cert_file) != 1) {
    file_fail("certificate", t->cert_file);
    goto fail;
  }
  if (SSL_CTX_use_PrivateKey_file(ctx, t->key_file, SSL_FILETYPE_PEM) != 1) {
    file_fail("key", t->key_file);
    goto fail;
  }
  if (SSL_CTX_check_private_key(ctx) != 1) {
    ERR_clear_error();
    servd_fail(SERVD_EINVAL, "TLS key '%s' does not match the certificate '%s'", t->key_file, t->cert_file);
    goto fail;
  }
  if (t->ca_file) {
    STACK_OF(X509_NAME) *names = SSL_load_client_CA_file(t->ca_file);
    if (!names || SSL_CTX_load_verify_locations(ctx, t->ca_file, NULL) != 1) {
      sk_X509_NAME_pop_free(names, X509_NAME_free);
      file_fail("client CA", t->ca_file);
      goto fail;
    }
    SSL_CTX_set_client_CA_list(ctx, names); /* takes names */
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, NULL);
  }
  if (t->alpn_len) SSL_CTX_set_alpn_select_cb(ctx, alpn_select, t);
  return ctx;
fail:
  SSL_CTX_free(ctx);
  return NULL;
}

int servd_tls_ctx_create(const servd_tls_options *o, servd_tls_ctx **out) {
  *out = NULL;
  if (!o->cert_file || !o->key_file)
    return servd_fail(SERVD_EINVAL, "TLS needs both a certificate (--tls-cert) and a key (--tls-key)");
  servd_tls_ctx *t = calloc(1, sizeof *t);
  if (!t) return servd_fail(SERVD_ENOMEM, "TLS: out of memory");
  t->cert_file = strdup(o->cert_file);
  t->key_file = strdup(o->key_file);
  t->ca_file = o->ca_file ? strdup(o->ca_file) : NULL;
  int rc;
  if (!t->cert_file || !t->key_file || (o->ca_file && !t->ca_file)) {
    rc = servd_fail(SERVD_ENOMEM, "TLS: out of memory");
    goto fail;
  }
  for (int i = 0; i < o->n_alpn; i++) {
    size_t n = strlen(o->alpn[i]);
    if (n == 0 || n > 255 || t->alpn_len + 1 + n > sizeof t->alpn) {
      rc = servd_fail(SERVD_EINVAL, "TLS: bad ALPN protocol list");
      goto fail;
    }
    t->alpn[t->alpn_len++] = (unsigned char)n;
    memcpy(t->alpn + t->alpn_len, o->alpn[i], n);
    t->alpn_len += (unsigned)n;
  }
  if (!(t->ssl_ctx = ctx_build(t))) {
    rc = SERVD_EINVAL;
    goto fail;
  }
  *out = t;
  return 0;
fail:
  servd_tls_ctx_destroy(t);
  return rc;
}

int servd_tls_ctx_reload(servd_tls_ctx *t) {
  SSL_CTX *ctx = ctx_build(t);
  if (!ctx) return SERVD_EINVAL;
  SSL_CTX_free(t->ssl_ctx); /* connections made on it hold their own references */
  t->ssl_ctx = ctx;
  return 0;
}

void servd_tls_ctx_destroy(servd_tls_ctx *t) {
  if (!t) return;
  SSL_CTX_free(t->ssl_ctx);
  free(t->cert_file);
  free(t->key_file);
  free(t->ca_file);
  free(t);
}

void servd_tls_ctx_describe(const servd_tls_ctx *t, char *out, size_t cap) {
  X509 *x = SSL_CTX_get0_certificate(t->ssl_ctx);
  if (!x || cap == 0) {
    if (cap) out[0] = '\0';
    return;
  }
  char subj[256] = "";
  X509_NAME_oneline(X509_get_subject_name(x), subj, sizeof subj);
  char *serial = NULL;
  BIGNUM *bn = ASN1_INTEGER_to_BN(X509_get0_serialNumber(x), NULL);
  if (bn) serial = BN_bn2hex(bn);
  snprintf(out, cap, "subject %s, serial %s", subj, serial ? serial : "?");
  OPENSSL_free(serial);
  BN_free(bn);
}

/* ---- connections ------------------------------------------------------------------------------ */

servd_tls_conn *servd_tls_conn_create(servd_tls_ctx *t) {
  servd_tls_conn *c = calloc(1, sizeof *c);
  if (!c) return NULL;
  c->ssl = SSL_new(t->ssl_ctx);
  c->rbio = BIO_new(BIO_s_mem());
  c->wbio = BIO_new(BIO_s_mem());
  if (!c->ssl || !c->rbio || !c->wbio) {
    BIO_free(c->rbio);
    BIO_free(c->wbio);
    SSL_free(c->ssl);
    free(c);
    ERR_clear_error();
    return NULL;
  }
  /* An empty input BIO means "wait for more", not end of stream. */
  BIO_set_mem_eof_return(c->rbio, -1);
  SSL_set_bio(c->ssl, c->rbio, c->wbio);
  SSL_set_accept_state(c->ssl);
  return c;
}

void servd_tls_conn_destroy(servd_tls_conn *c) {
  if (!c) return;
  SSL_free(c->ssl); /* frees the BIOs */
  free(c);
}

servd_tls_status servd_tls_conn_input(servd_tls_conn *c, const void *data, size_t len, servd_buf *plain) {
  ERR_clear_error();
  if (len && BIO_write(c->rbio, data, (int)len) != (int)len) {
    snprintf(c->err, sizeof c->err, "out of memory");
    return SERVD_TLS_ERROR;
  }
  for (;;) {
    if (servd_buf_reserve(plain, 16384) != 0) {
      snprintf(c->err, sizeof c->err, "out of memory");
      return SERVD_TLS_ERROR;
    }
    size_t room = plain->cap - plain->len - 1; /* keep the buffer's NUL */
    int n = SSL_read(c->ssl, plain->data + plain->len, room > 1u << 30 ? 1 << 30 : (int)room);
    if (n > 0) {
      plain->len += (size_t)n;
      plain->data[plain->len] = '\0';
      continue;
    }
    switch (SSL_get_error(c->ssl, n)) {
    case SSL_ERROR_WANT_READ:
    case SSL_ERROR_WANT_WRITE: return SERVD_TLS_OK;
    case SSL_ERROR_ZERO_RETURN: return SERVD_TLS_EOF;
    default: ssl_reason(c->err, sizeof c->err); return SERVD_TLS_ERROR;
    }
  }
}

int servd_tls_conn_write(servd_tls_conn *c, const void *data, size_t len) {
  if (!SSL_is_init_finished(c->ssl)) return -1;
  ERR_clear_error();
  const char *p = data;
  while (len > 0) {
    int chunk = len > (1u << 30) ? 1 << 30 : (int)len;
    int n = SSL_write(c->ssl, p, chunk); /* a mem BIO takes it all: n == chunk */
    if (n <= 0) {
      ssl_reason(c->err, sizeof c->err);
      return -1;
    }
    p += n;
    len -= (size_t)n;
  }
  return 0;
}

void servd_tls_conn_close_notify(servd_tls_conn *c) {
  if (c->notify_sent || !SSL_is_init_finished(c->ssl)) return;
  c->notify_sent = true;
  SSL_shutdown(c->ssl); /* writes the alert; the peer's reply is not waited for */
  ERR_clear_error();
}

size_t servd_tls_conn_output_pending(const servd_tls_conn *c) { return BIO_ctrl_pending(c->wbio); }

int servd_tls_conn_take_output(servd_tls_conn *c, servd_buf *out) {
  size_t n = BIO_ctrl_pending(c->wbio);
  if (n == 0) return 0;
  if (servd_buf_reserve(out, n) != 0) return -1;
  int got = BIO_read(c->wbio, out->data + out->len, (int)n);
  if (got > 0) out->len += (size_t)got;
  out->data[out->len] = '\0';
  return 0;
}

bool servd_tls_conn_established(const servd_tls_conn *c) { return SSL_is_init_finished(c->ssl); }

void servd_tls_conn_alpn(const servd_tls_conn *c, char *out, size_t cap) {
  const unsigned char *p = NULL;
  unsigned n = 0;
  SSL_get0_alpn_selected(c->ssl, &p, &n);
  if (cap == 0) return;
  if (!p || n >= cap) n = 0;
  if (n) memcpy(out, p, n);
  out[n] = '\0';
}

const char *servd_tls_conn_error(const servd_tls_conn *c) { return c->err[0] ? c->err : "unknown error"; }

bool servd_tls_looks_like_http(const void *data, size_t len) {
  /* A TLS record starts with its content type (0x16 for a handshake); an HTTP request with an
   * upper-case method token ("GET ", "POST ", ...). */
  const unsigned char *p = data;
  size_t i = 0;
  while (i < len && i < 8 && p[i] >= 'A' && p[i] <= 'Z') i++;
  return i > 0 && (i == len || (i < len && p[i] == ' '));
}
