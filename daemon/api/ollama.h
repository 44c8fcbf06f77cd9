/* Ollama's API (/api/chat, /api/generate, /api/embed, /api/tags, /api/show, /api/ps, /api/version)
 * over the chat, completions and embeddings machinery, as /v1/responses is over chat: a request
 * becomes the equivalent OpenAI body (ollama_params.c, a pure function), and a sink of that request
 * (ollama.c) writes Ollama's objects and its NDJSON stream. Errors are Ollama's {"error": "..."}. */
#ifndef SERVD_API_OLLAMA_H
#define SERVD_API_OLLAMA_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#include "api/request_params.h"

typedef enum { OLLAMA_CHAT, OLLAMA_GENERATE, OLLAMA_EMBED } ollama_kind;

typedef struct ollama_request {
  json_t *body;      /* the OpenAI body: chat, completions (generate with raw) or embeddings (own) */
  oai_mode mode;     /* OAI_CHAT, OAI_COMPLETIONS or OAI_EMBEDDINGS */
  const char *model; /* the request's model name as given (borrowed from the request's JSON) */
  long long num_ctx; /* options.num_ctx, 0: not given (the handler checks it against the model) */
  bool empty;        /* generate with an empty prompt: Ollama's "load the model" request, no generation */
} ollama_request;

/* Validates body (any JSON value) and builds its OpenAI body. Ollama's options map onto OpenAI's
 * fields (num_predict -> max_tokens, repeat_penalty -> repetition_penalty, ...), format onto
 * response_format, stream defaults to true. Returns 0 (free with ollama_request_free; model borrows
 * from body), or -1 with *err set (400 naming the field) and nothing to free. */
int ollama_params_parse(json_t *body, ollama_kind kind, ollama_request *out, api_param_error *err);
void ollama_request_free(ollama_request *q); /* accepts a zeroed struct */

/* Ollama's name of an OpenAI field, for the parsers' errors: "max_tokens" is "options.num_predict",
 * "repetition_penalty" "options.repeat_penalty", "stop" "options.stop", "response_format" "format",
 * "prompt" "prompt", "input" "input"; others keep theirs (sampling fields under "options."). */
void ollama_param_name(const char *oai_param, char *out, size_t cap);

#endif
