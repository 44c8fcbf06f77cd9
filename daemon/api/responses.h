/* POST /v1/responses (OpenAI's Responses API, stateless) over the chat machinery: the request
 * becomes the equivalent chat completions body (responses_params.c, a pure function like the other
 * parsers), and a sink of that chat request (responses.c) writes the response object and the typed
 * stream events. servd keeps no responses: store is accepted and nothing is stored. */
#ifndef SERVD_API_RESPONSES_H
#define SERVD_API_RESPONSES_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#include "api/request_params.h"

typedef struct resp_request {
  json_t *chat; /* the chat completions body (own reference) */
  json_t *echo; /* request fields the response object repeats: instructions, tools, text, ... (own) */
} resp_request;

/* Validates body (any JSON value) and builds its chat body. Returns 0 (free with resp_request_free),
 * or -1 with *err set (400 naming the Responses field) and nothing to free. */
int resp_params_parse(json_t *body, resp_request *out, api_param_error *err);
void resp_request_free(resp_request *q); /* accepts a zeroed struct */

/* The Responses name of a chat body's field, for the chat parser's errors: "messages[3].content"
 * is "input", "max_tokens" "max_output_tokens", "response_format..." "text.format",
 * "tools[1].function.name" "tools[1].name"; others are the same. */
void resp_param_name(const char *chat_param, char *out, size_t cap);

#endif
