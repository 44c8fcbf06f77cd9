/* POST /v1/messages and /v1/messages/count_tokens (Anthropic's Messages API) over the chat machinery,
 * as /v1/responses is: the request becomes the equivalent chat completions body (anthropic_params.c,
 * a pure function like the other parsers), and a sink of that chat request (anthropic.c) writes the
 * message object, Anthropic's stream events and Anthropic's error shape. Tools go through the chat
 * route's tool machinery (openai_tools.c): the package's per-family parser, forced calls by grammar. */
#ifndef SERVD_API_ANTHROPIC_H
#define SERVD_API_ANTHROPIC_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#include "api/request_params.h"

typedef struct anth_request {
  json_t *chat;  /* the chat completions body, or for count_tokens the /tokenize body (own reference) */
  json_t *stop;  /* stop_sequences as given (own reference), NULL: none */
  bool thinking; /* thinking {type: "enabled"} */
  int thinking_budget;
} anth_request;

/* Validates body (any JSON value) and builds its chat body; count: a count_tokens body (no
 * max_tokens, no sampling fields; the chat body is a /tokenize body with the messages and tools).
 * Returns 0 (free with anth_request_free), or -1 with *err set (400 naming the Anthropic field in its
 * message and param) and nothing to free. */
int anth_params_parse(json_t *body, bool count, anth_request *out, api_param_error *err);
void anth_request_free(anth_request *q); /* accepts a zeroed struct */

/* The Anthropic name of a chat body's field, for the chat parser's errors: "messages[3].content" is
 * "messages" (system and tool results shift the indices), "stop" "stop_sequences",
 * "tools[1].function.parameters" "tools[1].input_schema", "tools[1].function.name" "tools[1].name";
 * others are the same. */
void anth_param_name(const char *chat_param, char *out, size_t cap);

#endif
