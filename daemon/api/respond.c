/* JSON responses and errors of the API routes (see api/respond.h). */
#include "api/respond.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/request_params.h"
#include "servd/status.h"

void api_json(servd_http_req *r, int status, json_t *body) {
  char *s = body ? json_dumps(body, JSON_COMPACT) : NULL;
  json_decref(body);
  if (!s) {
    static const char oom[] = "{\"error\": \"out of memory\"}";
    servd_http_respond(r, 500, "application/json", oom, sizeof oom - 1);
    return;
  }
  servd_http_respond(r, status, "application/json", s, strlen(s));
  free(s);
}

/* The message of an error, made valid UTF-8: names from the path or the body may be cut or not
 * UTF-8, and JSON needs it. */
static void error_message(char *msg, size_t cap, const char *fmt, va_list ap) {
  vsnprintf(msg, cap, fmt, ap);
  api_utf8_fix(msg);
}

/* An error body; 429 and 503 ask the client to retry after a second. */
static void error_json(servd_http_req *r, int status, json_t *body) {
  if (status == 429 || status == 503) servd_http_set_header(r, "Retry-After", "1");
  api_json(r, status, body);
}

void api_oai_error(servd_http_req *r, int status, const char *type, const char *param, const char *code,
                   const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  error_message(msg, sizeof msg, fmt, ap);
  va_end(ap);
  error_json(r, status,
             json_pack("{s:{s:s, s:s, s:o, s:o}}", "error", "message", msg, "type", type, "param",
                       param ? json_string(param) : json_null(), "code", code ? json_string(code) : json_null()));
}

const char *api_anthropic_error_type(int status) {
  switch (status) {
  case 400: return "invalid_request_error";
  case 401: return "authentication_error";
  case 403: return "permission_error";
  case 404: return "not_found_error";
  case 413: return "request_too_large";
  case 429: return "rate_limit_error";
  case 503: return "overloaded_error";
  default: return status < 500 ? "invalid_request_error" : "api_error";
  }
}

void api_anthropic_error(servd_http_req *r, int status, const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  error_message(msg, sizeof msg, fmt, ap);
  va_end(ap);
  error_json(r, status,
             json_pack("{s:s, s:{s:s, s:s}}", "type", "error", "error", "type", api_anthropic_error_type(status),
                       "message", msg));
}

void api_kserve_error(servd_http_req *r, int status, const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  error_message(msg, sizeof msg, fmt, ap);
  va_end(ap);
  error_json(r, status, json_pack("{s:s}", "error", msg));
}

int api_status_for(int rc) {
  switch (rc) {
  case SERVD_EINVAL:
  case SERVD_EFORMAT:
  case SERVD_ERANGE:
  case SERVD_EUNSUPPORTED: return 400;
  case SERVD_EBUSY: return 429;
  case SERVD_ECANCELED: return 503;
  case SERVD_ETIMEDOUT: return 504;
  case SERVD_EMODEL: return 500; /* the model's code failed, not the request */
  default: return 500;
  }
}

const char *api_user_cause(const char *msg) {
  /* The stages daemon/engine and the tokenizer write before their messages, possibly nested
   * ("tokenizer: decode: id 7 ..."). */
  static const char *const stages[] = {"submit: ",  "chat template: ", "tokenize: ", "detokenize: ", "predict batch: ",
                                       "predict: ", "tokenizer: ",     "decode: ",   "detokenizer: "};
  if (!msg) return "";
  for (bool again = true; again;) {
    again = false;
    for (size_t i = 0; i < sizeof stages / sizeof stages[0]; i++) {
      size_t n = strlen(stages[i]);
      if (strncmp(msg, stages[i], n) == 0) {
        msg += n;
        again = true;
      }
    }
  }
  return msg;
}
