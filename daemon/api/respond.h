/* Responses of the API routes: JSON bodies, the two error dialects (OpenAI's error object and
 * KServe v2's {"error": "..."}), the status for an engine return code, and engine messages made fit
 * for a client. A leaf of daemon/api: it knows nothing of routes, handlers, models or the API's
 * state, so every file of the folder may include it and none of them includes it back.
 */
#ifndef SERVD_API_RESPOND_H
#define SERVD_API_RESPOND_H

#include <jansson.h>

#include "http/server.h"

/* Sends body as application/json; steals body (NULL: a 500 "out of memory"). */
void api_json(servd_http_req *r, int status, json_t *body);

/* OpenAI error object {"error": {message, type, param, code}}; param and code may be NULL (JSON
 * null). 429 and 503 carry Retry-After. */
void api_oai_error(servd_http_req *r, int status, const char *type, const char *param, const char *code,
                   const char *fmt, ...) __attribute__((format(printf, 6, 7)));

/* Anthropic's error {"type": "error", "error": {"type", "message"}}, its type from the status
 * (400 invalid_request_error, 401 authentication_error, 403 permission_error, 404 not_found_error,
 * 413 request_too_large, 429 rate_limit_error, 503 overloaded_error, else api_error). */
void api_anthropic_error(servd_http_req *r, int status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Anthropic's error type of a status (static string). */
const char *api_anthropic_error_type(int status);

/* KServe v2 error {"error": "..."}; 429 and 503 carry Retry-After. */
void api_kserve_error(servd_http_req *r, int status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* HTTP status for an engine return code (SERVD_E*). */
int api_status_for(int rc);

/* The part of an engine message (servd_last_error()) meant for a client: the engine names the stage
 * that failed ("submit: ", "chat template: ", ...) for its own log; that prefix is skipped. Returns
 * a pointer into msg (borrowed); "" for NULL. */
const char *api_user_cause(const char *msg);

#endif
