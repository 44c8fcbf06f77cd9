/* Request ids: a client's X-Request-Id (or the id in its body) names the request in the response
 * header and the access log, so one id follows a request through proxies, servd and the client's
 * own logs. An id that could forge log fields or headers is replaced, never escaped: an id is only
 * useful when every system writes it the same way. */
#include <stdio.h>
#include <string.h>
#include <sys/random.h>

#include "api/api-impl.h"
#include "servd/clock.h"

#define ID_MAX 128

/* Printable ASCII without space (space splits the text access log's fields), 1..ID_MAX bytes. */
static bool usable(const char *s) {
  size_t n = 0;
  for (; s[n]; n++)
    if (n >= ID_MAX || (unsigned char)s[n] <= 0x20 || (unsigned char)s[n] >= 0x7f) return false;
  return n > 0;
}

/* 128 random bits as 32 hex digits. getrandom does not fail for 16 bytes once the pool is
 * initialized; should it, the clock and a counter still keep ids apart within this process. */
static void generate(char out[33]) {
  static _Atomic uint64_t seq;
  uint64_t w[2];
  if (getrandom(w, sizeof w, GRND_NONBLOCK) != (ssize_t)sizeof w) {
    w[0] = (uint64_t)servd_now_ns();
    w[1] = ++seq * 0x9E3779B97F4A7C15ull ^ (uint64_t)(uintptr_t)out;
  }
  snprintf(out, 33, "%016llx%016llx", (unsigned long long)w[0], (unsigned long long)w[1]);
}

const char *api_request_id_set(servd_http_req *r, const char *client) {
  if (client && usable(client)) {
    char *id = servd_arena_strndup(r->arena, client, strlen(client));
    if (id) r->request_id = id;
    return id;
  }
  char buf[33];
  generate(buf);
  char *id = servd_arena_strndup(r->arena, buf, 32);
  if (id) r->request_id = id;
  return id;
}
