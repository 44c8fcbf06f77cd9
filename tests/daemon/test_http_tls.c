/* The HTTP server over TLS (http/tls.h) on real sockets, with an OpenSSL client: a request and its
 * ALPN, a reader that never reads dropped by the unsent-output limit counted in ciphertext, plaintext
 * HTTP answered 400 in plaintext, garbage handshakes closed without affecting a good connection. The
 * certificate is made at test time by the openssl command. */
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <cmocka.h>

#include "test_http_util.h"

static tloop L;
static servd_http_server *S;
static servd_tls_ctx *T;
static int port;
static char dir[64] = "/tmp/servd-tls-XXXXXX";
static atomic_int flood_dropped, flood_written;

#define MAX_OUT (256 * 1024)
#define CHUNK (16 * 1024)

static void handle(void *ud, servd_http_req *r) {
  (void)ud;
  if (strcmp(r->path, "/flood") == 0) {
    /* Far more than the client's socket buffers take: the unsent output must cross the limit. */
    static char chunk[CHUNK];
    memset(chunk, 'x', sizeof chunk);
    servd_http_stream_begin(r, 200, "text/plain");
    for (int i = 0; i < 4096; i++) {
      if (servd_http_stream_write(r, chunk, sizeof chunk) != 0) {
        atomic_store(&flood_dropped, 1);
        return;
      }
      atomic_fetch_add(&flood_written, 1);
    }
    servd_http_stream_end(r);
    return;
  }
  servd_http_respond(r, 200, "text/plain", "hello tls", 9);
}

static void start_server(void *arg) {
  (void)arg;
  servd_http_limits lim;
  servd_http_limits_default(&lim);
  lim.max_output_bytes = MAX_OUT;
  servd_http_callbacks cb = {.handle = handle};
  char cert[128], key[128];
  snprintf(cert, sizeof cert, "%s/cert.pem", dir);
  snprintf(key, sizeof key, "%s/key.pem", dir);
  static const char *const alpn[] = {"http/1.1"};
  servd_tls_options o = {cert, key, NULL, alpn, 1};
  assert_int_equal(servd_tls_ctx_create(&o, &T), 0);
  assert_int_equal(servd_http_server_create(&L.loop, &lim, &cb, &S), 0);
  servd_http_server_set_tls(S, T);
  assert_int_equal(servd_http_server_listen(S, "127.0.0.1", 0), 0);
  port = servd_http_server_port(S);
}

static void stop_server(void *arg) {
  (void)arg;
  servd_http_server_close(S, NULL, NULL);
}

static int setup(void **st) {
  (void)st;
  if (!mkdtemp(dir)) return -1;
  char cmd[512];
  snprintf(cmd, sizeof cmd,
           "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout %s/key.pem -out "
           "%s/cert.pem -days 1 -subj /CN=localhost >/dev/null 2>&1",
           dir, dir);
  if (system(cmd) != 0) return -1;
  tloop_start(&L);
  tloop_run(&L, start_server, NULL);
  return port > 0 ? 0 : -1;
}

static int teardown(void **st) {
  (void)st;
  tloop_run(&L, stop_server, NULL);
  tloop_stop(&L);
  servd_tls_ctx_destroy(T);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  return system(cmd) == 0 ? 0 : -1;
}

typedef struct tls_client {
  int fd;
  SSL_CTX *ctx;
  SSL *ssl;
} tls_client;

static int client_open(tls_client *c, const char *alpn) {
  c->fd = tc_connect(port);
  c->ctx = SSL_CTX_new(TLS_client_method());
  c->ssl = SSL_new(c->ctx);
  if (alpn) {
    unsigned char wire[32];
    size_t n = strlen(alpn);
    wire[0] = (unsigned char)n;
    memcpy(wire + 1, alpn, n);
    SSL_set_alpn_protos(c->ssl, wire, (unsigned)(n + 1));
  }
  SSL_set_fd(c->ssl, c->fd);
  return SSL_connect(c->ssl) == 1 ? 0 : -1;
}

static void client_close(tls_client *c) {
  SSL_free(c->ssl);
  SSL_CTX_free(c->ctx);
  close(c->fd);
}

/* Reads until the connection ends or n bytes came; returns the count. */
static size_t client_read(tls_client *c, char *out, size_t n) {
  size_t got = 0;
  while (got < n) {
    int k = SSL_read(c->ssl, out + got, (int)(n - got));
    if (k <= 0) break;
    got += (size_t)k;
    if (memmem(out, got, "hello tls", 9)) break;
  }
  return got;
}

static void test_request_and_alpn(void **st) {
  (void)st;
  tls_client c;
  assert_int_equal(client_open(&c, "http/1.1"), 0);
  const unsigned char *p;
  unsigned n;
  SSL_get0_alpn_selected(c.ssl, &p, &n);
  assert_int_equal(n, 8);
  assert_memory_equal(p, "http/1.1", 8);
  const char req[] = "GET /x HTTP/1.1\r\nHost: a\r\n\r\n";
  for (int i = 0; i < 2; i++) { /* keep-alive */
    assert_int_equal(SSL_write(c.ssl, req, sizeof req - 1), (int)sizeof req - 1);
    char buf[1024] = "";
    size_t got = client_read(&c, buf, sizeof buf - 1);
    assert_true(got > 0 && strncmp(buf, "HTTP/1.1 200 OK", 15) == 0 && memmem(buf, got, "hello tls", 9));
  }
  client_close(&c);
  /* A client offering only h2 is refused. */
  assert_int_not_equal(client_open(&c, "h2"), 0);
  client_close(&c);
  ERR_clear_error();
}

static void test_reader_dropped_by_ciphertext_limit(void **st) {
  (void)st;
  tls_client c;
  assert_int_equal(client_open(&c, NULL), 0);
  const char req[] = "GET /flood HTTP/1.1\r\nHost: a\r\n\r\n";
  assert_int_equal(SSL_write(c.ssl, req, sizeof req - 1), (int)sizeof req - 1);
  for (int i = 0; i < 200 && !atomic_load(&flood_dropped); i++) usleep(10000);
  assert_int_equal(atomic_load(&flood_dropped), 1);
  /* Dropped long before everything was queued, and never holding much more than the limit: what
   * waits for the socket, encrypted or not yet, is bounded by max_output_bytes plus one chunk with
   * its record overhead. */
  assert_true(atomic_load(&flood_written) < 4096);
  size_t peak = servd_http_server_peak_output(S);
  assert_true(peak <= MAX_OUT + CHUNK + 1024);
  assert_true(peak > MAX_OUT / 4);
  client_close(&c);
}

static void test_plaintext_gets_400(void **st) {
  (void)st;
  int fd = tc_connect(port);
  tc_sends(fd, "GET / HTTP/1.1\r\nHost: a\r\n\r\n");
  char buf[2048];
  size_t got = 0;
  ssize_t k;
  while (got < sizeof buf - 1 && (k = read(fd, buf + got, sizeof buf - 1 - got)) > 0) got += (size_t)k;
  buf[got] = '\0';
  assert_true(strncmp(buf, "HTTP/1.1 400 ", 13) == 0);
  assert_non_null(strstr(buf, "HTTPS port"));
  close(fd);
}

static void test_garbage_handshakes_leave_others_alone(void **st) {
  (void)st;
  tls_client good;
  assert_int_equal(client_open(&good, NULL), 0);
  uint64_t before = servd_http_server_tls_failures(S);
  static const unsigned char junk1[] = {0x16, 0x03, 0x01, 0x00, 0x05, 1, 2, 3, 4, 5, 0xff, 0xfe, 0xfd};
  static const unsigned char junk2[] = {0x00, 0x01, 0x02, 0x80, 0x90, 0xa0, 0xb0};
  const unsigned char *junks[] = {junk1, junk2};
  size_t lens[] = {sizeof junk1, sizeof junk2};
  for (int i = 0; i < 2; i++) {
    int fd = tc_connect(port);
    tc_send(fd, (const char *)junks[i], lens[i]);
    char buf[512];
    while (read(fd, buf, sizeof buf) > 0) {} /* an alert perhaps, then the close */
    close(fd);
  }
  for (int i = 0; i < 100 && servd_http_server_tls_failures(S) < before + 2; i++) usleep(10000);
  assert_true(servd_http_server_tls_failures(S) >= before + 2);
  const char req[] = "GET /x HTTP/1.1\r\nHost: a\r\n\r\n";
  assert_int_equal(SSL_write(good.ssl, req, sizeof req - 1), (int)sizeof req - 1);
  char buf[1024] = "";
  size_t got = client_read(&good, buf, sizeof buf - 1);
  assert_true(got > 0 && memmem(buf, got, "hello tls", 9));
  client_close(&good);
}

int main(void) {
  (void)tc_resp_free; /* a helper of test_http_util.h this file has no use for */
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_request_and_alpn),
      cmocka_unit_test(test_plaintext_gets_400),
      cmocka_unit_test(test_garbage_handshakes_leave_others_alone),
      cmocka_unit_test(test_reader_dropped_by_ciphertext_limit),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
