/* Test helpers for the HTTP layer: a real libuv loop on a background thread and a blocking socket
 * client that parses responses (Content-Length and chunked) independently of the server's code. */
#ifndef TEST_HTTP_UTIL_H
#define TEST_HTTP_UTIL_H

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>
#include <uv.h>

#include "http/server.h"

typedef struct tloop {
  uv_loop_t loop;
  uv_async_t call;
  pthread_t thread;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  void (*fn)(void *);
  void *arg;
  int done;
} tloop;

static void tloop_on_call(uv_async_t *h) {
  tloop *t = h->data;
  pthread_mutex_lock(&t->mu);
  void (*fn)(void *) = t->fn;
  void *arg = t->arg;
  t->fn = NULL;
  pthread_mutex_unlock(&t->mu);
  if (fn) fn(arg);
  pthread_mutex_lock(&t->mu);
  t->done = 1;
  pthread_cond_broadcast(&t->cv);
  pthread_mutex_unlock(&t->mu);
}

static void *tloop_main(void *p) {
  tloop *t = p;
  uv_run(&t->loop, UV_RUN_DEFAULT);
  return NULL;
}

static void tloop_start(tloop *t) {
  memset(t, 0, sizeof(*t));
  uv_loop_init(&t->loop);
  uv_async_init(&t->loop, &t->call, tloop_on_call);
  t->call.data = t;
  pthread_mutex_init(&t->mu, NULL);
  pthread_cond_init(&t->cv, NULL);
  pthread_create(&t->thread, NULL, tloop_main, t);
}

/* Runs fn(arg) on the loop thread and waits for it. */
static inline void tloop_run(tloop *t, void (*fn)(void *), void *arg) {
  pthread_mutex_lock(&t->mu);
  t->fn = fn;
  t->arg = arg;
  t->done = 0;
  pthread_mutex_unlock(&t->mu);
  uv_async_send(&t->call);
  pthread_mutex_lock(&t->mu);
  while (!t->done) pthread_cond_wait(&t->cv, &t->mu);
  pthread_mutex_unlock(&t->mu);
}

static void tloop_close_cb(void *arg) {
  tloop *t = arg;
  uv_close((uv_handle_t *)&t->call, NULL);
}

/* Closes the call handle; everything else must have been closed already. */
static void tloop_stop(tloop *t) {
  pthread_mutex_lock(&t->mu);
  t->fn = tloop_close_cb;
  t->arg = t;
  pthread_mutex_unlock(&t->mu);
  uv_async_send(&t->call);
  pthread_join(t->thread, NULL);
  uv_loop_close(&t->loop);
  pthread_mutex_destroy(&t->mu);
  pthread_cond_destroy(&t->cv);
}

/* ---- client ----------------------------------------------------------------------------------- */

static int tc_connect(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a;
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_port = htons((uint16_t)port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
    close(fd);
    return -1;
  }
  struct timeval tv = {20, 0}; /* a hung server fails the test instead of hanging it */
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

static int tc_send(int fd, const char *s, size_t n) {
  while (n) {
    ssize_t k = send(fd, s, n, MSG_NOSIGNAL);
    if (k <= 0) return -1;
    s += k;
    n -= (size_t)k;
  }
  return 0;
}

static inline int tc_sends(int fd, const char *s) { return tc_send(fd, s, strlen(s)); }

typedef struct tc_resp {
  int status;
  char headers[8192];
  char *body; /* malloc'd, NUL-terminated */
  size_t body_len;
  int chunks; /* number of chunks when chunked */
} tc_resp;

typedef struct tc_reader {
  int fd;
  char buf[65536];
  size_t len, off;
} tc_reader;

static int tc_fill(tc_reader *r) {
  if (r->off > 0) {
    memmove(r->buf, r->buf + r->off, r->len - r->off);
    r->len -= r->off;
    r->off = 0;
  }
  if (r->len == sizeof r->buf) return -1;
  ssize_t k = recv(r->fd, r->buf + r->len, sizeof r->buf - r->len, 0);
  if (k <= 0) return -1;
  r->len += (size_t)k;
  return 0;
}

/* Reads a line ending in CRLF (without it) into out. */
static int tc_line(tc_reader *r, char *out, size_t cap) {
  for (;;) {
    char *p = memmem(r->buf + r->off, r->len - r->off, "\r\n", 2);
    if (p) {
      size_t n = (size_t)(p - (r->buf + r->off));
      if (n >= cap) return -1;
      memcpy(out, r->buf + r->off, n);
      out[n] = '\0';
      r->off += n + 2;
      return 0;
    }
    if (tc_fill(r) != 0) return -1;
  }
}

static int tc_bytes(tc_reader *r, char *out, size_t n) {
  while (n) {
    if (r->off == r->len && tc_fill(r) != 0) return -1;
    size_t k = r->len - r->off < n ? r->len - r->off : n;
    memcpy(out, r->buf + r->off, k);
    r->off += k;
    out += k;
    n -= k;
  }
  return 0;
}

static inline const char *tc_header(const tc_resp *resp, const char *name) {
  static char val[1024];
  size_t n = strlen(name);
  const char *p = resp->headers;
  while (*p) {
    const char *eol = strchr(p, '\n');
    if (strncasecmp(p, name, n) == 0 && p[n] == ':') {
      const char *v = p + n + 1;
      while (*v == ' ') v++;
      size_t k = eol ? (size_t)(eol - v) : strlen(v);
      if (k >= sizeof val) k = sizeof val - 1;
      memcpy(val, v, k);
      val[k] = '\0';
      return val;
    }
    if (!eol) break;
    p = eol + 1;
  }
  return NULL;
}

/* Reads one response; returns 0 or -1 (connection closed / malformed). Interim 100 responses are
 * skipped. */
static int tc_read(tc_reader *r, tc_resp *resp) {
  memset(resp, 0, sizeof(*resp));
  char line[8192];
  for (;;) {
    if (tc_line(r, line, sizeof line) != 0) return -1;
    if (sscanf(line, "HTTP/1.%*d %d", &resp->status) != 1) return -1;
    size_t hl = 0;
    resp->headers[0] = '\0';
    for (;;) {
      if (tc_line(r, line, sizeof line) != 0) return -1;
      if (!line[0]) break;
      size_t n = strlen(line);
      if (hl + n + 2 < sizeof resp->headers) {
        memcpy(resp->headers + hl, line, n);
        hl += n;
        resp->headers[hl++] = '\n';
        resp->headers[hl] = '\0';
      }
    }
    if (resp->status != 100) break;
  }
  const char *te = tc_header(resp, "Transfer-Encoding");
  const char *cl = tc_header(resp, "Content-Length");
  if (te && strcasecmp(te, "chunked") == 0) {
    size_t cap = 1024, len = 0;
    char *body = malloc(cap);
    for (;;) {
      if (tc_line(r, line, sizeof line) != 0) {
        free(body);
        return -1;
      }
      size_t n = strtoul(line, NULL, 16);
      if (n == 0) {
        tc_line(r, line, sizeof line);
        break;
      }
      while (len + n + 1 > cap) body = realloc(body, cap *= 2);
      if (tc_bytes(r, body + len, n) != 0 || tc_line(r, line, sizeof line) != 0) {
        free(body);
        return -1;
      }
      len += n;
      resp->chunks++;
    }
    body[len] = '\0';
    resp->body = body;
    resp->body_len = len;
  } else {
    size_t n = cl ? strtoul(cl, NULL, 10) : 0;
    resp->body = malloc(n + 1);
    if (tc_bytes(r, resp->body, n) != 0) {
      free(resp->body);
      resp->body = NULL;
      return -1;
    }
    resp->body[n] = '\0';
    resp->body_len = n;
  }
  return 0;
}

static void tc_resp_free(tc_resp *resp) {
  free(resp->body);
  resp->body = NULL;
}

/* True when the peer has closed the connection (reads EOF or an error within the timeout). */
static inline int tc_closed(int fd) {
  char c;
  ssize_t k = recv(fd, &c, 1, 0);
  return k <= 0;
}

/* One request on a new connection: returns the response (status -1 on failure). */
static inline tc_resp tc_request(int port, const char *method, const char *path, const char *extra_headers,
                                 const char *body) {
  tc_resp resp;
  memset(&resp, 0, sizeof resp);
  resp.status = -1;
  int fd = tc_connect(port);
  if (fd < 0) return resp;
  char head[16384];
  size_t bl = body ? strlen(body) : 0;
  snprintf(head, sizeof head, "%s %s HTTP/1.1\r\nHost: test\r\n%sContent-Length: %zu\r\nConnection: close\r\n\r\n",
           method, path, extra_headers ? extra_headers : "", bl);
  tc_sends(fd, head);
  if (bl) tc_send(fd, body, bl);
  tc_reader *rd = calloc(1, sizeof(*rd));
  rd->fd = fd;
  if (tc_read(rd, &resp) != 0) resp.status = -1;
  free(rd);
  close(fd);
  return resp;
}

#endif
