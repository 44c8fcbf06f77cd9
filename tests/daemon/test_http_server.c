/* The HTTP/1.1 server over real sockets: keep-alive, pipelining order, limits (413, 431), malformed
 * input (400), slow clients (408), idle timeout, chunked streaming, batched output (one write per
 * connection per batch, in order), client aborts, output caps, back-pressure on pipelining clients
 * that do not read, strict framing (505, 501, 400 for what RFC 9112 says to reject). */
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdatomic.h>
#include <stdio.h>
#include <cmocka.h>

#include "test_http_util.h"

static tloop L;
static servd_http_server *S;
static int port;
/* The same limits but long timeouts: the back-pressure tests' stalls must not look idle, and its
 * peaks are theirs alone. */
static servd_http_server *P;
static int pport;
static atomic_int aborts, completes, flood_dropped;
static atomic_int batch_writes = -1; /* socket writes issued by one batch of 200 chunks */

typedef struct job {
  uv_timer_t t;
  servd_http_req *r;
  int step;
  int kind; /* 0 stream abc, 1 delayed respond, 2 flood, 3 batch of 200 chunks */
} job;

static void job_closed(uv_handle_t *h) { free(h->data); }

static void job_abort(servd_http_req *r) {
  atomic_fetch_add(&aborts, 1);
  job *j = r->ctx;
  if (j) {
    j->r = NULL;
    uv_timer_stop(&j->t);
    uv_close((uv_handle_t *)&j->t, job_closed);
  }
}

static void job_tick(uv_timer_t *t) {
  job *j = t->data;
  servd_http_req *r = j->r;
  bool end = false;
  if (j->kind == 0) {
    static const char *parts[] = {"a", "bb", "ccc"};
    servd_http_stream_write(r, parts[j->step], strlen(parts[j->step]));
    if (++j->step == 3) {
      servd_http_stream_end(r);
      end = true;
    }
  } else if (j->kind == 1) {
    servd_http_respond(r, 200, "text/plain", "slow", 4);
    end = true;
  } else if (j->kind == 3) {
    /* Like one wake-up of engine events: many chunks and the end, nested batches, one flush. */
    uint64_t w0 = servd_http_server_writes(S);
    servd_http_server_batch_begin(S);
    for (int i = 0; i < 200; i++) {
      char part[16];
      int n = snprintf(part, sizeof part, "%d,", i);
      if (i == 100) servd_http_server_batch_begin(S);
      servd_http_stream_write(r, part, (size_t)n);
      if (i == 100) servd_http_server_batch_end(S);
    }
    servd_http_stream_end(r);
    int during = (int)(servd_http_server_writes(S) - w0);
    servd_http_server_batch_end(S);
    atomic_store(&batch_writes, during == 0 ? (int)(servd_http_server_writes(S) - w0) : 100 + during);
    end = true;
  } else {
    static char big[256 * 1024];
    memset(big, 'x', sizeof big);
    if (servd_http_stream_write(r, big, sizeof big) != 0) {
      atomic_fetch_add(&flood_dropped, 1);
      return; /* job_abort ran and closes the timer */
    }
    if (++j->step > 4096) { /* 1 GiB without the server dropping the reader: fail visibly */
      servd_http_stream_end(r);
      end = true;
    }
  }
  if (end) {
    uv_timer_stop(t);
    uv_close((uv_handle_t *)t, job_closed);
  }
}

static void start_job(servd_http_req *r, int kind, uint64_t ms) {
  job *j = calloc(1, sizeof(*j));
  j->r = r;
  j->kind = kind;
  j->t.data = j;
  uv_timer_init(&L.loop, &j->t);
  r->ctx = j;
  r->on_abort = job_abort;
  if (kind != 1) servd_http_stream_begin(r, 200, "text/plain");
  uv_timer_start(&j->t, job_tick, ms, kind == 1 ? 0 : 1);
}

static void handle(void *ud, servd_http_req *r) {
  (void)ud;
  if (strcmp(r->path, "/stream") == 0) {
    start_job(r, 0, 1);
  } else if (strcmp(r->path, "/slow") == 0) {
    start_job(r, 1, 50);
  } else if (strcmp(r->path, "/batch") == 0) {
    start_job(r, 3, 20);
  } else if (strcmp(r->path, "/flood") == 0) {
    start_job(r, 2, 1);
  } else if (strcmp(r->path, "/big") == 0) {
    /* A 16 KiB answer that starts with the query, so that the client can check the order. */
    size_t n = 16 * 1024;
    char *b = servd_arena_alloc(r->arena, n);
    memset(b, 'x', n);
    memcpy(b, r->query, strlen(r->query));
    b[strlen(r->query)] = '\n';
    servd_http_respond(r, 200, "text/plain", b, n);
  } else if (strcmp(r->path, "/hang") == 0) {
    r->ctx = NULL;
    r->on_abort = job_abort;
  } else {
    char *s =
        servd_arena_printf(r->arena, "%s %s q=%s h=%s body=%s", r->method, r->path, r->query,
                           servd_http_header_get(r, "x-test") ? servd_http_header_get(r, "x-test") : "-", r->body);
    servd_http_set_header(r, "X-Reply", "yes");
    servd_http_respond(r, 200, "text/plain", s, strlen(s));
  }
}

static void complete(void *ud, const servd_http_req *r) {
  (void)ud;
  (void)r;
  atomic_fetch_add(&completes, 1);
}

static void start_server(void *arg) {
  (void)arg;
  servd_http_limits lim;
  servd_http_limits_default(&lim);
  lim.max_header_bytes = 2048;
  lim.max_body_bytes = 4096;
  lim.request_timeout_ms = 300;
  lim.idle_timeout_ms = 300;
  lim.max_output_bytes = 64 * 1024; /* back-pressure above 16 KiB unsent, reading again below 4 KiB */
  lim.max_input_bytes = 64 * 1024;
  servd_http_callbacks cb = {.handle = handle, .complete = complete};
  assert_int_equal(servd_http_server_create(&L.loop, &lim, &cb, &S), 0);
  assert_int_equal(servd_http_server_listen(S, "127.0.0.1", 0), 0);
  port = servd_http_server_port(S);
  lim.request_timeout_ms = lim.idle_timeout_ms = 20000;
  assert_int_equal(servd_http_server_create(&L.loop, &lim, &cb, &P), 0);
  assert_int_equal(servd_http_server_listen(P, "127.0.0.1", 0), 0);
  pport = servd_http_server_port(P);
}

static void stop_server(void *arg) {
  (void)arg;
  servd_http_server_close(S, NULL, NULL);
  servd_http_server_close(P, NULL, NULL);
}

static int setup(void **st) {
  (void)st;
  tloop_start(&L);
  tloop_run(&L, start_server, NULL);
  return port > 0 && pport > 0 ? 0 : -1;
}

static int teardown(void **st) {
  (void)st;
  tloop_run(&L, stop_server, NULL);
  tloop_stop(&L);
  return 0;
}

static void test_basic_and_keepalive(void **st) {
  (void)st;
  int fd = tc_connect(port);
  assert_true(fd >= 0);
  tc_reader *rd = calloc(1, sizeof(*rd));
  rd->fd = fd;
  tc_resp r;
  tc_sends(fd, "GET /a%20b?x=1 HTTP/1.1\r\nHost: h\r\nX-Test: one\r\n\r\n");
  assert_int_equal(tc_read(rd, &r), 0);
  assert_int_equal(r.status, 200);
  assert_string_equal(r.body, "GET /a b q=x=1 h=one body=");
  assert_string_equal(tc_header(&r, "X-Reply"), "yes");
  assert_string_equal(tc_header(&r, "Connection"), "keep-alive");
  tc_resp_free(&r);
  /* Same connection, a body this time. */
  tc_sends(fd, "POST /p HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\r\nhello");
  assert_int_equal(tc_read(rd, &r), 0);
  assert_string_equal(r.body, "POST /p q= h=- body=hello");
  tc_resp_free(&r);
  free(rd);
  close(fd);
}

static void test_pipelining_keeps_order(void **st) {
  (void)st;
  int fd = tc_connect(port);
  tc_reader *rd = calloc(1, sizeof(*rd));
  rd->fd = fd;
  /* The first answer comes 50 ms late; the second must still come after it. */
  tc_sends(fd, "GET /slow HTTP/1.1\r\nHost: h\r\n\r\nGET /one HTTP/1.1\r\nHost: h\r\n\r\n"
               "POST /two HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\n\r\nabcGET /three HTTP/1.1\r\nHost: h\r\n\r\n");
  const char *want[] = {"slow", "GET /one q= h=- body=", "POST /two q= h=- body=abc", "GET /three q= h=- body="};
  for (int i = 0; i < 4; i++) {
    tc_resp r;
    assert_int_equal(tc_read(rd, &r), 0);
    assert_string_equal(r.body, want[i]);
    tc_resp_free(&r);
  }
  free(rd);
  close(fd);
}

static void test_body_too_large(void **st) {
  (void)st;
  int fd = tc_connect(port);
  tc_reader *rd = calloc(1, sizeof(*rd));
  rd->fd = fd;
  tc_sends(fd, "POST /x HTTP/1.1\r\nHost: h\r\nContent-Length: 100000\r\n\r\n");
  tc_resp r;
  assert_int_equal(tc_read(rd, &r), 0);
  assert_int_equal(r.status, 413);
  assert_non_null(strstr(r.body, "too large"));
  tc_resp_free(&r);
  assert_true(tc_closed(fd));
  close(fd);
  /* Chunked upload: no length up front, caught while reading. */
  fd = tc_connect(port);
  rd->fd = fd;
  rd->len = rd->off = 0;
  tc_sends(fd, "POST /x HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n");
  char chunk[1100];
  memset(chunk, 'z', sizeof chunk);
  int got = 0;
  for (int i = 0; i < 8; i++) {
    char hdr[16];
    snprintf(hdr, sizeof hdr, "%zx\r\n", sizeof chunk - 76);
    if (tc_sends(fd, hdr) || tc_send(fd, chunk, sizeof chunk - 76) || tc_sends(fd, "\r\n")) break;
  }
  if (tc_read(rd, &r) == 0) {
    got = r.status;
    if (got != 413) fprintf(stderr, "body: %s\n", r.body);
    tc_resp_free(&r);
  }
  assert_int_equal(got, 413);
  free(rd);
  close(fd);
}

static void test_headers_too_large(void **st) {
  (void)st;
  char big[4096];
  memset(big, 'a', sizeof big - 1);
  big[sizeof big - 1] = '\0';
  char hdr[5000];
  snprintf(hdr, sizeof hdr, "X-Big: %s\r\n", big);
  tc_resp r = tc_request(port, "GET", "/x", hdr, NULL);
  assert_int_equal(r.status, 431);
  tc_resp_free(&r);
}

static void test_malformed(void **st) {
  (void)st;
  int fd = tc_connect(port);
  tc_reader *rd = calloc(1, sizeof(*rd));
  rd->fd = fd;
  tc_sends(fd, "BLAH\x01 / HTTP/1.1\r\n\r\n");
  tc_resp r;
  assert_int_equal(tc_read(rd, &r), 0);
  assert_int_equal(r.status, 400);
  assert_non_null(strstr(r.body, "malformed HTTP request"));
  tc_resp_free(&r);
  assert_true(tc_closed(fd));
  close(fd);
  free(rd);
}

static void test_slow_client_and_idle(void **st) {
  (void)st;
  int fd = tc_connect(port);
  tc_reader *rd = calloc(1, sizeof(*rd));
  rd->fd = fd;
  tc_sends(fd, "GET /x HTTP/1.1\r\nHost: h\r\n"); /* never finished */
  tc_resp r;
  assert_int_equal(tc_read(rd, &r), 0);
  assert_int_equal(r.status, 408);
  tc_resp_free(&r);
  assert_true(tc_closed(fd));
  close(fd);
  /* A connection that sends nothing is closed after the idle timeout. */
  fd = tc_connect(port);
  assert_true(tc_closed(fd));
  close(fd);
  free(rd);
}

static void test_chunked_stream(void **st) {
  (void)st;
  tc_resp r = tc_request(port, "GET", "/stream", NULL, NULL);
  assert_int_equal(r.status, 200);
  assert_string_equal(tc_header(&r, "Transfer-Encoding"), "chunked");
  assert_string_equal(r.body, "abbccc");
  assert_int_equal(r.chunks, 3);
  tc_resp_free(&r);
}

static void test_batch_one_write_in_order(void **st) {
  (void)st;
  tc_resp r = tc_request(port, "GET", "/batch", NULL, NULL);
  assert_int_equal(r.status, 200);
  /* Expected body built independently: "0,1,...,199," in order, each its own chunk. */
  char want[1024];
  size_t n = 0;
  for (int i = 0; i < 200; i++) n += (size_t)snprintf(want + n, sizeof want - n, "%d,", i);
  assert_string_equal(r.body, want);
  assert_int_equal(r.chunks, 200);
  /* Nothing written inside the batch; at its end at most one write (none if the head's write was
   * still completing, in which case its completion flushes everything at once). */
  /* The loop records the count just after the write the client has already read. */
  for (int i = 0; i < 5000 && atomic_load(&batch_writes) < 0; i++) usleep(1000);
  int w = atomic_load(&batch_writes);
  assert_true(w == 0 || w == 1);
  tc_resp_free(&r);
}

static void test_abort_reaches_handler(void **st) {
  (void)st;
  int before = atomic_load(&aborts);
  int fd = tc_connect(port);
  tc_sends(fd, "GET /hang HTTP/1.1\r\nHost: h\r\n\r\n");
  /* Make sure the request was handled before closing: a second connection's answer orders it. */
  tc_resp r = tc_request(port, "GET", "/ping", NULL, NULL);
  tc_resp_free(&r);
  close(fd);
  for (int i = 0; i < 2000 && atomic_load(&aborts) == before; i++) usleep(1000);
  assert_int_equal(atomic_load(&aborts), before + 1);
}

static void test_slow_reader_dropped(void **st) {
  (void)st;
  int fd = tc_connect(port);
  int small = 4096;
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
  tc_sends(fd, "GET /flood HTTP/1.1\r\nHost: h\r\n\r\n");
  /* Never read: the server must give up on this reader instead of buffering without end. */
  for (int i = 0; i < 20000 && atomic_load(&flood_dropped) == 0; i++) usleep(1000);
  assert_int_equal(atomic_load(&flood_dropped), 1);
  close(fd);
}

static void test_expect_continue(void **st) {
  (void)st;
  int fd = tc_connect(port);
  tc_reader *rd = calloc(1, sizeof(*rd));
  rd->fd = fd;
  tc_sends(fd, "POST /e HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n");
  char line[256];
  assert_int_equal(tc_line(rd, line, sizeof line), 0);
  assert_non_null(strstr(line, " 100 "));
  tc_line(rd, line, sizeof line);
  tc_sends(fd, "ok");
  tc_resp r;
  assert_int_equal(tc_read(rd, &r), 0);
  assert_string_equal(r.body, "POST /e q= h=- body=ok");
  tc_resp_free(&r);
  close(fd);
  free(rd);
}

static void test_bad_percent_encoding(void **st) {
  (void)st;
  tc_resp r = tc_request(port, "GET", "/a%zz", NULL, NULL);
  assert_int_equal(r.status, 400);
  tc_resp_free(&r);
  r = tc_request(port, "GET", "/a%00b", NULL, NULL);
  assert_int_equal(r.status, 400);
  tc_resp_free(&r);
}

static void test_http10_stream(void **st) {
  (void)st;
  int fd = tc_connect(port);
  tc_sends(fd, "GET /stream HTTP/1.0\r\n\r\n");
  char buf[4096];
  size_t len = 0;
  ssize_t k;
  while ((k = recv(fd, buf + len, sizeof buf - 1 - len, 0)) > 0) len += (size_t)k;
  buf[len] = '\0';
  close(fd);
  /* No chunked framing for HTTP/1.0: the body is the bytes, ended by closing. */
  assert_null(strstr(buf, "chunked"));
  char *body = strstr(buf, "\r\n\r\n");
  assert_non_null(body);
  assert_string_equal(body + 4, "abbccc");
}

/* Random bytes and truncated or mangled requests: every connection ends with a 4xx or a close, and
 * the server keeps answering. */
static void test_garbage(void **st) {
  (void)st;
  static const char *seeds[] = {"GET / HTTP/1.1\r\nHost: h\r\n\r\n",
                                "POST /x HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\nzz",
                                "GET /x HTTP/1.1\r\nContent-Length: -5\r\n\r\n",
                                "GET /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nfffffffffffffffff\r\n"};
  uint64_t x = 0x9E3779B97F4A7C15ull;
  for (int round = 0; round < 200; round++) {
    char req[512];
    const char *seed = seeds[round % 4];
    size_t n = strlen(seed);
    memcpy(req, seed, n);
    for (int m = 0; m < 1 + round % 5; m++) { /* flip a few bytes */
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      req[x % n] = (char)(x >> 32);
    }
    int fd = tc_connect(port);
    tc_send(fd, req, n);
    shutdown(fd, SHUT_WR);
    char buf[1024];
    while (recv(fd, buf, sizeof buf, 0) > 0) {}
    close(fd);
  }
  tc_resp r = tc_request(port, "GET", "/alive", NULL, NULL);
  assert_int_equal(r.status, 200);
  tc_resp_free(&r);
}

/* A chunked body's trailer fields arrive after the headers were handed out: they must neither move
 * the header strings nor show up as headers without a name. */
static void test_chunked_trailer(void **st) {
  (void)st;
  int fd = tc_connect(port);
  assert_true(fd >= 0);
  tc_reader *rd = calloc(1, sizeof(*rd));
  rd->fd = fd;
  char req[2048];
  char pad[1201];
  memset(pad, 'p', sizeof pad - 1);
  pad[sizeof pad - 1] = '\0';
  /* No X-Test: the lookup walks every header. */
  snprintf(req, sizeof req,
           "POST /t HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
           "5\r\nhello\r\n6\r\n world\r\n0\r\nX-Trailer: %s\r\nX-More: 1\r\n\r\n",
           pad);
  tc_sends(fd, req);
  tc_resp r;
  assert_int_equal(tc_read(rd, &r), 0);
  assert_int_equal(r.status, 200);
  assert_string_equal(r.body, "POST /t q= h=- body=hello world");
  tc_resp_free(&r);
  /* X-Test before a long trailer: its value is read after the trailer was parsed. */
  snprintf(req, sizeof req,
           "POST /u HTTP/1.1\r\nHost: h\r\nX-Test: kept\r\nTransfer-Encoding: chunked\r\n\r\n"
           "2\r\nok\r\n0\r\nX-Trailer: %s\r\n\r\n",
           pad);
  tc_sends(fd, req);
  assert_int_equal(tc_read(rd, &r), 0);
  assert_int_equal(r.status, 200);
  assert_string_equal(r.body, "POST /u q= h=kept body=ok");
  tc_resp_free(&r);
  /* Trailers count against the header limit (2048 bytes here) like headers. */
  snprintf(req, sizeof req, "POST /v HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nX-A: %s\r\n", pad);
  tc_sends(fd, req);
  snprintf(req, sizeof req, "X-B: %s\r\n\r\n", pad);
  tc_sends(fd, req);
  assert_int_equal(tc_read(rd, &r), 0);
  assert_int_equal(r.status, 431);
  tc_resp_free(&r);
  free(rd);
  close(fd);
}

static void test_head(void **st) {
  (void)st;
  int fd = tc_connect(port);
  tc_reader *rd = calloc(1, sizeof(*rd));
  rd->fd = fd;
  tc_sends(fd, "HEAD /h HTTP/1.1\r\nHost: h\r\n\r\nGET /g HTTP/1.1\r\nHost: h\r\n\r\n");
  char line[256];
  assert_int_equal(tc_line(rd, line, sizeof line), 0);
  assert_non_null(strstr(line, " 200 "));
  while (tc_line(rd, line, sizeof line) == 0 && line[0]) {}
  /* No body after HEAD's headers: the next bytes are the GET's response. */
  tc_resp r;
  assert_int_equal(tc_read(rd, &r), 0);
  assert_string_equal(r.body, "GET /g q= h=- body=");
  tc_resp_free(&r);
  close(fd);
  free(rd);
}

/* Reads a value of the server on its loop thread. */
typedef struct peaks {
  size_t out, in;
  uint64_t pauses, writes;
} peaks;

static void read_peaks(void *arg) {
  peaks *p = arg;
  p->out = servd_http_server_peak_output(P);
  p->in = servd_http_server_peak_input(P);
  p->pauses = servd_http_server_read_pauses(P);
  p->writes = servd_http_server_writes(P);
}

typedef struct sender {
  int fd;
  int n;
  int failed;
} sender;

/* Sends n pipelined requests for 16 KiB answers, then half-closes: a client that writes everything
 * before it reads anything. Blocks while the server pushes back. */
static void *send_pipelined(void *arg) {
  sender *sd = arg;
  char *all = malloc((size_t)sd->n * 64);
  size_t len = 0;
  for (int i = 0; i < sd->n; i++) len += (size_t)sprintf(all + len, "GET /big?%d HTTP/1.1\r\nHost: h\r\n\r\n", i);
  sd->failed = tc_send(sd->fd, all, len);
  shutdown(sd->fd, SHUT_WR);
  free(all);
  return NULL;
}

/* The pipelining attack: 2000 requests for 16 KiB each (31 MiB of answers) from a client that does
 * not read. The server answers only while the connection's unsent output is below its mark and
 * stops reading meanwhile, so what it holds for the connection stays bounded whatever the client
 * sends; once the client reads, every answer arrives, in order, including those for requests that
 * came before the client's EOF. Before back-pressure the server queued every answer at once. */
/* A client with a small receive window (set before connect, so that it stays small). */
static int connect_small_window(int to_port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  int small = 4096;
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)to_port)};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
  struct timeval tv = {20, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return fd;
}

static void test_pipelining_backpressure(void **st) {
  (void)st;
  int fd = connect_small_window(pport);
  peaks p0;
  tloop_run(&L, read_peaks, &p0);
  sender sd = {.fd = fd, .n = 2000};
  pthread_t th;
  pthread_create(&th, NULL, send_pipelined, &sd);
  /* Wait until the server has stopped answering (the kernel buffers are full): 150 ms without a
   * completed request, 5 s at most. */
  int last = -1, same = 0;
  for (int i = 0; i < 500 && same < 15; i++) {
    usleep(10000);
    int now = atomic_load(&completes);
    same = now == last ? same + 1 : 0;
    last = now;
  }
  peaks mid;
  tloop_run(&L, read_peaks, &mid);
  /* Bounded: the output mark (16 KiB) plus one answer with its head; input: its mark plus a read. */
  size_t out_bound = 16 * 1024 + 16 * 1024 + 512;
  assert_true(mid.out <= out_bound);
  assert_true(mid.in <= 64 * 1024 + 65536);
  assert_true(mid.pauses > p0.pauses);
  /* Now read everything: no answer lost, none out of order. */
  tc_reader *rd = calloc(1, sizeof(*rd));
  rd->fd = fd;
  for (int i = 0; i < sd.n; i++) {
    tc_resp r;
    assert_int_equal(tc_read(rd, &r), 0);
    assert_int_equal(r.status, 200);
    assert_int_equal(r.body_len, 16 * 1024);
    assert_int_equal(atoi(r.body), i);
    tc_resp_free(&r);
  }
  assert_true(tc_closed(fd)); /* the client's EOF: closed once everything was delivered */
  pthread_join(th, NULL);
  assert_int_equal(sd.failed, 0);
  peaks end;
  tloop_run(&L, read_peaks, &end);
  assert_true(end.out <= out_bound);
  free(rd);
  close(fd);
}

/* Small answers to many pipelined requests: at most max_pipelined (32) answers wait for one socket
 * write, so a client sending 256 at once gets them in at least 8 writes, all in order. */
static void test_pipelining_depth_capped(void **st) {
  (void)st;
  int fd = tc_connect(pport);
  peaks p0, p1;
  tloop_run(&L, read_peaks, &p0);
  char *all = malloc(256 * 64);
  size_t len = 0;
  for (int i = 0; i < 256; i++) len += (size_t)sprintf(all + len, "GET /d%d HTTP/1.1\r\nHost: h\r\n\r\n", i);
  assert_int_equal(tc_send(fd, all, len), 0);
  free(all);
  tc_reader *rd = calloc(1, sizeof(*rd));
  rd->fd = fd;
  for (int i = 0; i < 256; i++) {
    tc_resp r;
    char want[64];
    snprintf(want, sizeof want, "GET /d%d q= h=- body=", i);
    assert_int_equal(tc_read(rd, &r), 0);
    assert_string_equal(r.body, want);
    tc_resp_free(&r);
  }
  tloop_run(&L, read_peaks, &p1);
  assert_true(p1.writes - p0.writes >= 256 / 32);
  free(rd);
  close(fd);
}

static void count_connections(void *arg) { *(int *)arg = servd_http_server_connections(S); }

/* A pipelining client that never reads: between requests, once the server's writes make no
 * progress for the idle timeout (300 ms here), the connection is closed (nginx's send_timeout)
 * instead of being held, bounded but for ever. */
static void test_stuck_reader_closed(void **st) {
  (void)st;
  int fd = connect_small_window(port);
  sender sd = {.fd = fd, .n = 200};
  pthread_t th;
  pthread_create(&th, NULL, send_pipelined, &sd);
  int n = -1;
  for (int i = 0; i < 300; i++) { /* 3 s at most */
    usleep(10000);
    tloop_run(&L, count_connections, &n);
    if (n == 0) break;
  }
  assert_int_equal(n, 0);
  pthread_join(th, NULL); /* its send fails or completes once the server has closed */
  close(fd);
}

/* One raw request on a new connection; returns the status of the answer (-1 when none). */
static int raw_status(const char *req) {
  int fd = tc_connect(port);
  tc_sends(fd, req);
  tc_reader *rd = calloc(1, sizeof(*rd));
  rd->fd = fd;
  tc_resp r;
  int status = tc_read(rd, &r) == 0 ? r.status : -1;
  if (status != -1) tc_resp_free(&r);
  free(rd);
  close(fd);
  return status;
}

/* What RFC 9112 says a server must reject and http_parser, built lenient, accepts (nginx's answers). */
static void test_strict_framing(void **st) {
  (void)st;
  static const struct {
    const char *req;
    int status;
  } cases[] = {
      {"GET /v HTTP/9.9\r\nHost: h\r\n\r\n", 505},
      {"GET /v HTTP/2.0\r\nHost: h\r\n\r\n", 505},
      /* Whitespace before the colon: not Transfer-Encoding, and not a field at all. */
      {"POST /t HTTP/1.1\r\nHost: h\r\nTransfer-Encoding : chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n", 400},
      {"GET /t HTTP/1.1\r\n Host: h\r\n\r\n", 400},
      /* Codings other than chunked are not decoded. */
      {"POST /t HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n", 501},
      {"POST /t HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: gzip\r\n\r\n", 501},
      {"POST /t HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400},
      {"POST /t HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400},
      /* Obsolete line folding, after a value and after an empty one. */
      {"GET /f HTTP/1.1\r\nHost: h\r\nX-Test: a\r\n b\r\n\r\n", 400},
      {"GET /f HTTP/1.1\r\nHost: h\r\nX-Test:\r\n\tb\r\n\r\n", 400},
      /* An absurd chunk size is refused at once (413), not after the request timeout (408). */
      {"POST /t HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\nffffffffffff\r\n", 413},
  };
  int wrong = 0;
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    int got = raw_status(cases[i].req);
    if (got != cases[i].status) {
      fprintf(stderr, "case %zu: %d, want %d\n", i, got, cases[i].status);
      wrong++;
    }
  }
  assert_int_equal(wrong, 0);
  /* Still accepted: the coding's name in any case, spaces inside a value, an empty value, HTTP/1.0. */
  tc_resp r;
  int fd = tc_connect(port);
  tc_reader *rd = calloc(1, sizeof(*rd));
  rd->fd = fd;
  tc_sends(fd, "POST /ok HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: Chunked \r\nX-Test: a  b\r\nX-Empty:\r\n\r\n"
               "2\r\nhi\r\n0\r\n\r\n");
  assert_int_equal(tc_read(rd, &r), 0);
  assert_int_equal(r.status, 200);
  assert_string_equal(r.body, "POST /ok q= h=a  b body=hi");
  tc_resp_free(&r);
  /* The same fold check across a split: the line break in one send, the fold in the next. */
  tc_sends(fd, "GET /f HTTP/1.1\r\nHost: h\r\nX-Test: a\r\n");
  usleep(20000);
  tc_sends(fd, " b\r\n\r\n");
  assert_int_equal(tc_read(rd, &r), 0);
  assert_int_equal(r.status, 400);
  tc_resp_free(&r);
  free(rd);
  close(fd);
  fd = tc_connect(port);
  rd = calloc(1, sizeof(*rd));
  rd->fd = fd;
  tc_sends(fd, "GET /v HTTP/1.0\r\n\r\n");
  assert_int_equal(tc_read(rd, &r), 0);
  assert_int_equal(r.status, 200);
  tc_resp_free(&r);
  free(rd);
  close(fd);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_pipelining_backpressure),
      cmocka_unit_test(test_pipelining_depth_capped),
      cmocka_unit_test(test_stuck_reader_closed),
      cmocka_unit_test(test_strict_framing),
      cmocka_unit_test(test_basic_and_keepalive),
      cmocka_unit_test(test_pipelining_keeps_order),
      cmocka_unit_test(test_body_too_large),
      cmocka_unit_test(test_headers_too_large),
      cmocka_unit_test(test_malformed),
      cmocka_unit_test(test_slow_client_and_idle),
      cmocka_unit_test(test_chunked_stream),
      cmocka_unit_test(test_batch_one_write_in_order),
      cmocka_unit_test(test_abort_reaches_handler),
      cmocka_unit_test(test_slow_reader_dropped),
      cmocka_unit_test(test_expect_continue),
      cmocka_unit_test(test_bad_percent_encoding),
      cmocka_unit_test(test_http10_stream),
      cmocka_unit_test(test_garbage),
      cmocka_unit_test(test_head),
      cmocka_unit_test(test_chunked_trailer),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
