/* What a completed request leaves behind: its count per (route label, status) for /metrics, and its
 * line in the access log (text or JSON). */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "api/api-impl.h"

static void count(servd_api *a, const char *route, int status) {
  for (int i = 0; i < a->n_routes; i++)
    if (a->routes[i].status == status && strcmp(a->routes[i].route, route) == 0) {
      a->routes[i].n++;
      return;
    }
  if (a->n_routes < (int)(sizeof a->routes / sizeof a->routes[0])) {
    a->routes[a->n_routes++] = (api_route_count){route, status, 1};
  }
}

/* Writes s for the text access log: control bytes, quotes, backslashes and spaces inside a field are
 * escaped as \xHH, so a client cannot forge log lines or fields with a decoded %0a in its path. */
static void log_field(FILE *f, const char *s) {
  if (!s || !*s) {
    fputc('-', f);
    return;
  }
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    if (*p < 0x20 || *p == 0x7f || *p == '"' || *p == '\\' || *p == ' ') fprintf(f, "\\x%02x", *p);
    else fputc(*p, f);
  }
}

static void access_log(servd_api *a, const servd_http_req *r) {
  if (a->o.access_log == SERVD_ACCESS_LOG_OFF) return;
  double secs = (double)(api_now_ns() - r->start_ns) / 1e9;
  char ts[40];
  time_t now = time(NULL);
  struct tm tm;
  gmtime_r(&now, &tm);
  strftime(ts, sizeof ts, "%Y-%m-%dT%H:%M:%SZ", &tm);
  if (a->o.access_log == SERVD_ACCESS_LOG_JSON) {
    servd_buf b;
    servd_buf_init(&b);
    servd_buf_printf(&b, "{\"time\":\"%s\",\"remote\":", ts);
    servd_buf_json_str(&b, r->remote, strlen(r->remote));
    servd_buf_puts(&b, ",\"method\":");
    servd_buf_json_str(&b, r->method ? r->method : "", r->method ? strlen(r->method) : 0);
    servd_buf_puts(&b, ",\"path\":");
    servd_buf_json_str(&b, r->path ? r->path : "", r->path ? strlen(r->path) : 0);
    servd_buf_printf(&b, ",\"status\":%d,\"bytes\":%llu,\"duration_ms\":%.3f,\"route\":\"%s\"", r->status,
                     (unsigned long long)r->bytes_out, secs * 1000.0, r->route ? r->route : "");
    if (r->model) {
      servd_buf_puts(&b, ",\"model\":");
      servd_buf_json_str(&b, r->model, strlen(r->model));
    }
    if (r->request_id) {
      servd_buf_puts(&b, ",\"request_id\":");
      servd_buf_json_str(&b, r->request_id, strlen(r->request_id));
    }
    servd_buf_puts(&b, "}\n");
    if (!b.oom) fwrite(b.data, 1, b.len, a->log);
    servd_buf_free(&b);
  } else {
    fprintf(a->log, "%s %s \"", ts, r->remote);
    log_field(a->log, r->method);
    fputc(' ', a->log);
    log_field(a->log, r->path);
    fprintf(a->log, " HTTP/%d.%d\" %d %llu %.6fs", r->http_major, r->http_minor, r->status,
            (unsigned long long)r->bytes_out, secs);
    if (r->model) {
      fputs(" model=", a->log);
      log_field(a->log, r->model);
    }
    if (r->request_id) {
      fputs(" request_id=", a->log);
      log_field(a->log, r->request_id);
    }
    fputc('\n', a->log);
  }
  fflush(a->log);
}

void api_request_done(servd_api *a, const servd_http_req *r) {
  count(a, r->route ? r->route : "other", r->status);
  access_log(a, r);
}
