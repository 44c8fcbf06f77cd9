/* Speculative decoding's acceptance over a run, read from the server's Prometheus /metrics before and
 * after it: vLLM's spec_decode counters, which servd and vLLM both export (summed over models). A
 * plain blocking GET: it runs twice, outside the measured window. */
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "bench.h"

#define SCRAPE_MAX (8 << 20)

/* The response to GET /metrics (headers and body), NUL-terminated; NULL when unreachable. */
static char *get_metrics(const bench_config *cfg) {
  char port[16];
  snprintf(port, sizeof port, "%d", cfg->port);
  struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *ai = NULL;
  if (getaddrinfo(cfg->host, port, &hints, &ai) || !ai) return NULL;
  int fd = socket(ai->ai_family, ai->ai_socktype, ai->ai_protocol);
  struct timeval tv = {5, 0};
  if (fd >= 0) {
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  }
  bool up = fd >= 0 && connect(fd, ai->ai_addr, ai->ai_addrlen) == 0;
  freeaddrinfo(ai);
  char *buf = NULL;
  if (up) {
    char req[1024];
    int n = snprintf(req, sizeof req, "GET /metrics HTTP/1.0\r\nHost: %s\r\n%s%s%sConnection: close\r\n\r\n", cfg->host,
                     cfg->api_key ? "Authorization: Bearer " : "", cfg->api_key ? cfg->api_key : "",
                     cfg->api_key ? "\r\n" : "");
    up = n > 0 && n < (int)sizeof req && send(fd, req, (size_t)n, MSG_NOSIGNAL) == n;
  }
  size_t len = 0, cap = 1 << 16;
  if (up) buf = malloc(cap + 1);
  while (buf) {
    if (len == cap) {
      char *nb = cap < SCRAPE_MAX ? realloc(buf, 2 * cap + 1) : NULL;
      if (!nb) break;
      buf = nb;
      cap *= 2;
    }
    ssize_t r = recv(fd, buf + len, cap - len, 0);
    if (r <= 0) break;
    len += (size_t)r;
  }
  if (fd >= 0) close(fd);
  if (buf) buf[len] = '\0';
  return buf;
}

/* Sum of the samples of one counter family (every label set) in a Prometheus text page. */
static double family_sum(const char *page, const char *name, bool *seen) {
  double sum = 0;
  size_t nl = strlen(name);
  for (const char *l = page; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL) {
    if (strncmp(l, name, nl) || (l[nl] != '{' && l[nl] != ' ')) continue;
    const char *v = l[nl] == '{' ? strchr(l + nl, '}') : l + nl;
    if (!v) continue;
    sum += strtod(v + 1, NULL);
    *seen = true;
  }
  return sum;
}

bool bench_spec_scrape(const bench_config *cfg, bench_spec_counts *out) {
  memset(out, 0, sizeof *out);
  char *page = get_metrics(cfg);
  if (!page) return false;
  bool seen = false;
  if (!strncmp(page, "HTTP/1.", 7) && !strncmp(page + 8, " 200", 4)) {
    out->drafts = family_sum(page, "vllm:spec_decode_num_drafts_total", &seen);
    out->draft_tokens = family_sum(page, "vllm:spec_decode_num_draft_tokens_total", &seen);
    out->accepted = family_sum(page, "vllm:spec_decode_num_accepted_tokens_total", &seen);
  }
  free(page);
  return seen;
}
