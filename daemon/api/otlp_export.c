/* The OTLP/HTTP exporter: a bounded queue of span records and the thread that POSTs them (see
 * otlp.h). Blocking sockets with timeouts on a thread of its own: the exporter may wait on a slow
 * collector, nothing else does. */
#include "api/otlp.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "servd/status.h"

#define CONNECT_MS 1000
#define IO_MS 2000

struct api_tracer {
  char host[256], port[8], path[512];
  pthread_t thread;
  bool started, stop;
  pthread_mutex_t mu; /* the queue and the counters */
  pthread_cond_t cv;
  api_span *queue; /* a ring of OTLP_QUEUE */
  int head, n;
  uint64_t exported, dropped;
};

int api_tracer_parse(const char *url, char *host, size_t hcap, char *port, size_t pcap, char *path, size_t cap);

/* http://HOST[:PORT][/PATH]: 0 or SERVD_EINVAL. Exposed for the tests (not in otlp.h). */
int api_tracer_parse(const char *url, char *host, size_t hcap, char *port, size_t pcap, char *path, size_t cap) {
  if (!url || strncmp(url, "http://", 7) != 0)
    return servd_fail(SERVD_EINVAL, "--otlp-traces-endpoint '%s': expected http://HOST[:PORT][/PATH] (OTLP/HTTP)",
                      url ? url : "");
  const char *h = url + 7, *slash = strchr(h, '/');
  size_t hl = slash ? (size_t)(slash - h) : strlen(h);
  const char *colon = memchr(h, ':', hl);
  size_t name = colon ? (size_t)(colon - h) : hl;
  if (name == 0 || name >= hcap) return servd_fail(SERVD_EINVAL, "--otlp-traces-endpoint '%s': no host name", url);
  memcpy(host, h, name);
  host[name] = '\0';
  snprintf(port, pcap, "4318");
  if (colon) {
    size_t pl = hl - name - 1;
    char *end;
    char buf[8];
    if (pl == 0 || pl >= sizeof buf) return servd_fail(SERVD_EINVAL, "--otlp-traces-endpoint '%s': bad port", url);
    memcpy(buf, colon + 1, pl);
    buf[pl] = '\0';
    long p = strtol(buf, &end, 10);
    if (*end || p < 1 || p > 65535)
      return servd_fail(SERVD_EINVAL, "--otlp-traces-endpoint '%s': port must be 1..65535", url);
    snprintf(port, pcap, "%ld", p);
  }
  snprintf(path, cap, "%s", slash && slash[1] ? slash : "/v1/traces");
  for (const char *c = path; *c; c++)
    if ((unsigned char)*c <= ' ' || *c == 0x7f)
      return servd_fail(SERVD_EINVAL, "--otlp-traces-endpoint '%s': the path has a control or space character", url);
  return 0;
}

/* A connected socket with I/O timeouts, or -1. */
static int dial(const api_tracer *t) {
  struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *ai = NULL;
  if (getaddrinfo(t->host, t->port, &hints, &ai) != 0) return -1;
  int fd = -1;
  for (struct addrinfo *p = ai; p && fd < 0; p = p->ai_next) {
    fd = socket(p->ai_family, p->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, p->ai_protocol);
    if (fd < 0) continue;
    int rc = connect(fd, p->ai_addr, p->ai_addrlen);
    if (rc != 0 && errno == EINPROGRESS) {
      struct pollfd pfd = {.fd = fd, .events = POLLOUT};
      int err = 0;
      socklen_t el = sizeof err;
      rc = poll(&pfd, 1, CONNECT_MS) == 1 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) == 0 && err == 0 ? 0 : -1;
    }
    if (rc != 0) {
      close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(ai);
  if (fd < 0) return -1;
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  struct timeval tv = {IO_MS / 1000, (IO_MS % 1000) * 1000};
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return fd;
}

static bool send_all(int fd, const void *p, size_t n) {
  const char *c = p;
  while (n > 0) {
    ssize_t w = send(fd, c, n, MSG_NOSIGNAL);
    if (w <= 0) return false;
    c += w;
    n -= (size_t)w;
  }
  return true;
}

/* POSTs body; true when the collector answered 2xx. */
static bool post(const api_tracer *t, const uint8_t *body, size_t len) {
  int fd = dial(t);
  if (fd < 0) return false;
  char head[1024];
  int hl = snprintf(head, sizeof head,
                    "POST %s HTTP/1.1\r\nHost: %s:%s\r\nContent-Type: application/x-protobuf\r\n"
                    "Content-Length: %zu\r\nConnection: close\r\n\r\n",
                    t->path, t->host, t->port, len);
  bool ok = hl > 0 && (size_t)hl < sizeof head && send_all(fd, head, (size_t)hl) && send_all(fd, body, len);
  char status[32] = "";
  size_t got = 0;
  while (ok && got < 12) { /* "HTTP/1.1 200" */
    ssize_t r = recv(fd, status + got, 12 - got, 0);
    if (r <= 0) break;
    got += (size_t)r;
  }
  close(fd);
  return ok && got >= 12 && !strncmp(status, "HTTP/1.", 7) && status[9] == '2';
}

static void *exporter_main(void *arg) {
  api_tracer *t = arg;
  pthread_setname_np(pthread_self(), "servd-otlp");
  api_span *batch = malloc(OTLP_BATCH * sizeof *batch);
  pthread_mutex_lock(&t->mu);
  for (;;) {
    if (!t->stop && t->n < OTLP_BATCH) {
      struct timespec ts;
      clock_gettime(CLOCK_REALTIME, &ts);
      ts.tv_sec += 1;
      pthread_cond_timedwait(&t->cv, &t->mu, &ts);
    }
    if (t->n == 0) {
      if (t->stop) break;
      continue;
    }
    int n = t->n < OTLP_BATCH ? t->n : OTLP_BATCH;
    if (!batch) { /* out of memory: what waits is dropped, counted */
      t->dropped += (uint64_t)n;
      t->head = (t->head + n) % OTLP_QUEUE;
      t->n -= n;
      continue;
    }
    for (int i = 0; i < n; i++) batch[i] = t->queue[(t->head + i) % OTLP_QUEUE];
    t->head = (t->head + n) % OTLP_QUEUE;
    t->n -= n;
    bool stopping = t->stop;
    pthread_mutex_unlock(&t->mu);
    size_t len;
    uint8_t *body = api_otlp_encode(batch, n, &len);
    bool ok = body && post(t, body, len);
    free(body);
    pthread_mutex_lock(&t->mu);
    if (ok) t->exported += (uint64_t)n;
    else t->dropped += (uint64_t)n;
    if (stopping && !ok) { /* shutting down and the collector is not there: the rest is dropped */
      t->dropped += (uint64_t)t->n;
      t->n = 0;
    }
  }
  pthread_mutex_unlock(&t->mu);
  free(batch);
  return NULL;
}

int api_tracer_create(const char *endpoint, api_tracer **out) {
  *out = NULL;
  api_tracer *t = calloc(1, sizeof *t);
  if (!t) return servd_fail(SERVD_ENOMEM, "otlp traces: out of memory");
  int rc = api_tracer_parse(endpoint, t->host, sizeof t->host, t->port, sizeof t->port, t->path, sizeof t->path);
  if (rc) {
    free(t);
    return rc;
  }
  t->queue = malloc(OTLP_QUEUE * sizeof *t->queue);
  pthread_mutex_init(&t->mu, NULL);
  pthread_cond_init(&t->cv, NULL);
  if (!t->queue || pthread_create(&t->thread, NULL, exporter_main, t) != 0) {
    api_tracer_destroy(t);
    return servd_fail(SERVD_ENOMEM, "otlp traces: starting the exporter");
  }
  t->started = true;
  *out = t;
  return 0;
}

void api_tracer_destroy(api_tracer *t) {
  if (!t) return;
  if (t->started) {
    pthread_mutex_lock(&t->mu);
    t->stop = true;
    pthread_cond_signal(&t->cv);
    pthread_mutex_unlock(&t->mu);
    pthread_join(t->thread, NULL);
  }
  pthread_mutex_destroy(&t->mu);
  pthread_cond_destroy(&t->cv);
  free(t->queue);
  free(t);
}

void api_tracer_submit(api_tracer *t, const api_span *s) {
  pthread_mutex_lock(&t->mu);
  if (t->n == OTLP_QUEUE || t->stop) {
    t->dropped++;
  } else {
    t->queue[(t->head + t->n) % OTLP_QUEUE] = *s;
    if (++t->n == OTLP_BATCH) pthread_cond_signal(&t->cv); /* a full batch goes at once */
  }
  pthread_mutex_unlock(&t->mu);
}

void api_tracer_stats(api_tracer *t, uint64_t *exported, uint64_t *dropped) {
  *exported = *dropped = 0;
  if (!t) return;
  pthread_mutex_lock(&t->mu);
  *exported = t->exported;
  *dropped = t->dropped;
  pthread_mutex_unlock(&t->mu);
}
