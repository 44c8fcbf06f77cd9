/* The router: matches a request against the route table (routes.c), answers what is the same for
 * every route (401 without the key, 404 for an unknown path, model or version, 405 with Allow), sets
 * the metric label and the model of the access log, and calls the row's handler. */
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "api/api-impl.h"
#include "api/respond.h"
#include "api/route.h"

bool api_route_match(const char *pat, const char *path, api_route_span *model, api_route_span *version) {
  *model = (api_route_span){NULL, 0};
  *version = (api_route_span){NULL, 0};
  while (*pat && *path) {
    if (*pat == '{') {
      const char *close = strchr(pat, '}');
      if (!close) return false;
      size_t n = strcspn(path, "/");
      if (n == 0) return false;
      api_route_span *slot = strncmp(pat, "{model}", 7) == 0     ? model
                             : strncmp(pat, "{version}", 9) == 0 ? version
                                                                 : NULL;
      if (slot) *slot = (api_route_span){path, n};
      pat = close + 1;
      path += n;
      continue;
    }
    if (*pat != *path) return false;
    pat++;
    path++;
  }
  return *pat == '\0' && *path == '\0';
}

unsigned api_route_method_bit(const char *m) {
  if (!m) return 0;
  if (strcmp(m, "GET") == 0) return API_GET;
  if (strcmp(m, "HEAD") == 0) return API_HEAD;
  if (strcmp(m, "POST") == 0) return API_POST;
  return 0;
}

static bool authorized(servd_api *a, servd_http_req *r) {
  if (!a->api_key) return true;
  const char *h = servd_http_header_get(r, "authorization");
  const char *tok = "";
  if (h && strncasecmp(h, "Bearer ", 7) == 0) {
    tok = h + 7;
    while (*tok == ' ') tok++;
  } else if ((h = servd_http_header_get(r, "x-api-key"))) { /* Anthropic's clients send the key so */
    tok = h;
  }
  return servd_api_key_equal(tok, strlen(tok), a->api_key, a->api_key_len);
}

static bool oai_path(const char *p) { return strncmp(p, "/v1/", 4) == 0; }

static void not_found(servd_http_req *r, bool oai, const char *code, const char *param, const char *msg) {
  if (oai) api_oai_error(r, 404, "invalid_request_error", param, code, "%s", msg);
  else api_kserve_error(r, 404, "%s", msg);
}

static void method_not_allowed(servd_http_req *r, bool oai, bool anth, unsigned allowed) {
  static const struct {
    unsigned bit;
    const char *name;
  } names[] = {{API_GET, "GET"}, {API_HEAD, "HEAD"}, {API_POST, "POST"}};
  char allow[32] = "";
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
    if (allowed & names[i].bit)
      snprintf(allow + strlen(allow), sizeof allow - strlen(allow), "%s%s", allow[0] ? ", " : "", names[i].name);
  servd_http_set_header(r, "Allow", allow);
  if (anth) api_anthropic_error(r, 405, "method %s is not allowed on %s", r->method, r->path);
  else if (oai)
    api_oai_error(r, 405, "invalid_request_error", NULL, "method_not_allowed", "method %s is not allowed on %s",
                  r->method, r->path);
  else api_kserve_error(r, 405, "method %s is not allowed on %s", r->method, r->path);
}

static void on_request(void *ud, servd_http_req *r) {
  servd_api *a = ud;
  const char *p = r->path;
  api_request_id_set(r, servd_http_header_get(r, "x-request-id")); /* every answer carries one */
  unsigned bit = api_route_method_bit(r->method);
  const api_route *hit = NULL, *first = NULL;
  api_route_span model, version, m, v;
  unsigned allowed = 0;
  bool public = true; /* every row matching the path is public */
  for (size_t i = 0; i < api_n_routes; i++) {
    const api_route *row = &api_routes[i];
    if (!api_route_match(row->pattern, p, &m, &v)) continue;
    if (!first) first = row;
    allowed |= row->methods;
    public &= (row->flags & API_ROUTE_PUBLIC) || ((row->flags & API_ROUTE_METRICS) && a->o.metrics_public);
    if (!hit && (row->methods & bit)) {
      hit = row;
      model = m;
      version = v;
    }
  }
  bool oai = first ? (first->flags & API_ROUTE_OAI) != 0 : oai_path(p);
  bool anth = first && (first->flags & API_ROUTE_ANTHROPIC);
  if (!(first && public) && !authorized(a, r)) {
    r->route = "unauthorized";
    servd_http_set_header(r, "WWW-Authenticate", "Bearer");
    if (anth)
      api_anthropic_error(r, 401,
                          "missing or incorrect API key: send 'x-api-key: <key>' or 'Authorization: Bearer <key>'");
    else if (oai)
      api_oai_error(r, 401, "invalid_request_error", NULL, "invalid_api_key",
                    "missing or incorrect API key: send 'Authorization: Bearer <key>'");
    else api_kserve_error(r, 401, "missing or incorrect API key: send 'Authorization: Bearer <key>'");
    return;
  }
  if (!first) {
    r->route = "other";
    char msg[600];
    snprintf(msg, sizeof msg, "no route for %s %s", r->method, p);
    not_found(r, oai, oai ? "not_found" : NULL, NULL, msg);
    return;
  }
  r->route = (hit ? hit : first)->label;
  if (!hit) {
    method_not_allowed(r, oai, anth, allowed);
    return;
  }
  api_route_args args = {NULL, NULL, NULL, NULL};
  if (model.n) {
    args.model = servd_arena_strndup(r->arena, model.p, model.n);
    r->model = args.model;
  }
  if (version.n) args.version = servd_arena_strndup(r->arena, version.p, version.n);
  if ((model.n && !args.model) || (version.n && !args.version)) {
    api_kserve_error(r, 500, "out of memory");
    return;
  }
  char msg[600];
  if (hit->flags & API_ROUTE_MODEL) {
    args.am = api_model_resolve(a, args.model, &args.lora);
    if (!args.am) {
      if (oai) snprintf(msg, sizeof msg, "The model `%s` does not exist.", args.model);
      else snprintf(msg, sizeof msg, "model '%s' is not served here", args.model);
      not_found(r, oai, oai ? "model_not_found" : NULL, NULL, msg);
      return;
    }
  }
  if (args.version && strcmp(args.version, API_MODEL_VERSION) != 0) {
    snprintf(msg, sizeof msg, "model '%s' has no version '%s' (its only version is '" API_MODEL_VERSION "')",
             args.model ? args.model : "", args.version);
    not_found(r, oai, oai ? "model_not_found" : NULL, NULL, msg);
    return;
  }
  hit->handler(a, r, &args);
}

static void error_body(void *ud, const char *target, int status, const char *message, servd_buf *out) {
  (void)ud;
  if (!strncmp(target, "/v1/messages", 12)) {
    servd_buf_puts(out, "{\"type\": \"error\", \"error\": {\"type\": ");
    servd_buf_json_str(out, api_anthropic_error_type(status), strlen(api_anthropic_error_type(status)));
    servd_buf_puts(out, ", \"message\": ");
    servd_buf_json_str(out, message, strlen(message));
    servd_buf_puts(out, "}}");
  } else if (oai_path(target)) {
    servd_buf_puts(out, "{\"error\": {\"message\": ");
    servd_buf_json_str(out, message, strlen(message));
    servd_buf_printf(out, ", \"type\": \"invalid_request_error\", \"param\": null, \"code\": %s}}",
                     status == 413 ? "\"request_too_large\"" : "null");
  } else {
    servd_buf_puts(out, "{\"error\": ");
    servd_buf_json_str(out, message, strlen(message));
    servd_buf_puts(out, "}");
  }
}

static void on_complete(void *ud, const servd_http_req *r) { api_request_done(ud, r); }

servd_http_callbacks servd_api_http_callbacks(servd_api *a) {
  servd_http_callbacks cb = {.handle = on_request, .complete = on_complete, .error_body = error_body, .ud = a};
  return cb;
}
