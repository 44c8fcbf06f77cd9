/* Validation of request bodies, apart from any server state: a pure function of the JSON text and
 * the limits it is checked against, giving the parameters or the 4xx error to answer with. The
 * routes (openai.c, kserve.c) call these; the fuzz target calls them on arbitrary bytes.
 */
#ifndef SERVD_API_REQUEST_PARAMS_H
#define SERVD_API_REQUEST_PARAMS_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/engine.h"
#include "http/arena.h"

/* What a request is checked against: the server's options and the engine's defaults. */
typedef struct api_param_limits {
  servd_gen_params defaults; /* engine defaults, before the request's fields */
  int max_n;                 /* largest n (choices per prompt) */
  int default_deadline_ms;   /* when the request names no timeout; 0: none */
  int n_vocab;               /* logit_bias ids must be below it; 0: unchecked (the engine checks) */
} api_param_limits;

/* Why a request was refused. */
typedef struct api_param_error {
  int status;        /* 4xx */
  char param[48];    /* the offending field, "" when none */
  char message[768]; /* valid UTF-8, never empty */
} api_param_error;

/* ---- parameters an engine request adopts, common to both protocols (params_adopt.c) ---- */

enum {
  API_ADOPT_DEADLINE = 1u << 0, /* timeout: seconds in (0, 86400]; else lim->default_deadline_ms */
  API_ADOPT_SAMPLING = 1u << 1, /* max_tokens, max_completion_tokens, min_tokens, temperature, top_p,
                                   top_k, min_p, penalties, seed, stop, stop_token_ids, ignore_eos,
                                   logit_bias */
  API_ADOPT_PRIORITY = 1u << 2, /* priority: an integer, lower runs first (vLLM's extension) */
};

/* Checks the fields of the given sets in obj (a JSON object: an OpenAI body, KServe's 'parameters')
 * and writes them over *gp. where prefixes field names in messages and err->param ("" or
 * "parameters."). Stop strings and ids are allocated from arena (may be NULL without
 * API_ADOPT_SAMPLING). Returns 0, or -1 with *err set (400, param naming the field). */
int api_params_adopt(json_t *obj, unsigned sets, const char *where, const api_param_limits *lim, servd_arena *arena,
                     servd_gen_params *gp, api_param_error *err);

/* Parses a request body that must be a JSON object. *out: own reference, NULL on error. */
int api_body_parse(const char *text, size_t len, json_t **out, api_param_error *err);

/* ---- OpenAI-compatible requests ---- */

typedef enum { OAI_COMPLETIONS, OAI_CHAT, OAI_TOKENIZE, OAI_DETOKENIZE, OAI_EMBEDDINGS } oai_mode;

typedef struct oai_prompt {
  const char *text; /* arena; NULL when given as token ids */
  int32_t *ids;     /* malloc'd (by the tokenizer or the parser) */
  int n_ids;
  int pair_split; /* a text pair's ids: where the second text begins (servd_gen_params.pair_split); 0: one text */
} oai_prompt;

typedef struct oai_tools oai_tools; /* api/openai_tools.h */

typedef struct oai_params {
  bool stream, include_usage, add_special, add_generation_prompt;
  int n; /* choices per prompt */
  int n_prompts;
  oai_prompt *prompts; /* arena; their ids malloc'd */
  json_t *messages;    /* chat / tokenize: normalized {role, content[, name]} (own reference) */
  servd_gen_params gp; /* stop strings and stop ids in the arena */
  int logprobs;        /* -1: none; else top count */
  /* Constrained decoding: response_format json_object/json_schema, or vLLM's guided_* fields. */
  servd_guide_kind guide_kind; /* SERVD_GUIDE_NONE: unconstrained */
  const char *guide_spec;      /* arena: schema (JSON text), regex, choices (JSON list) or grammar */
  const char *guide_param;     /* the field it came from (static string), for errors */
  oai_tools *tools;            /* chat: tools, tool_choice, ... (owned); NULL: none or "none" */
  json_t *template_kwargs;     /* chat, tokenize: chat_template_kwargs (own reference); NULL: none */
  bool echo;                   /* completions: the prompt starts each choice's text (gp.prompt_logprobs
                                  with logprobs, gp.prompt_only with max_tokens 0) */
  bool base64;                 /* embeddings: encoding_format "base64" (little-endian f32) */
  int truncate_prompt_tokens;  /* embeddings: vLLM's; 0: none, -1: the model's context, else at most k */
} oai_params;

#define OAI_MAX_EMBEDDING_INPUTS 512 /* inputs of one /v1/embeddings request */

/* Validates body (any JSON value; 'model' is not looked at) for mode. Returns 0 with *out filled
 * (free with oai_params_free), or -1 with *err set and nothing to free. Allocates strings from
 * arena. */
int oai_params_parse(json_t *body, oai_mode mode, const api_param_limits *lim, servd_arena *arena, oai_params *out,
                     api_param_error *err);
/* The same from the body's text: malformed JSON and a body that is no object are errors too. */
int oai_params_parse_text(const char *text, size_t len, oai_mode mode, const api_param_limits *lim, servd_arena *arena,
                          oai_params *out, api_param_error *err);
void oai_params_free(oai_params *p); /* frees the ids and messages; accepts a zeroed struct */

/* ---- KServe v2 inference requests ---- */

typedef struct kserve_infer_params {
  servd_named_tensor *in; /* malloc'd; tensors owned */
  int n_in;
  json_t *id;     /* own reference or NULL */
  json_t *wanted; /* 'outputs' (own reference) or NULL: every output */
  int64_t deadline_ms;
  int priority;    /* parameters.priority (0 when absent) */
  bool binary_out; /* parameters.binary_data_output: outputs as raw bytes unless they say otherwise */
} kserve_infer_params;

/* Validates an inference request and builds its input tensors. Returns 0 (free with
 * kserve_infer_params_free) or -1 with *err set (status 400). */
int kserve_infer_parse(json_t *body, const api_param_limits *lim, kserve_infer_params *out, api_param_error *err);
int kserve_infer_parse_text(const char *text, size_t len, const api_param_limits *lim, kserve_infer_params *out,
                            api_param_error *err);
/* The same for a body of the binary tensor data extension (kserve_binary.h): header_length is the
 * request's Inference-Header-Content-Length (NULL: none, the body is all JSON); bad framing is a 400
 * naming what is wrong. */
int kserve_infer_parse_framed(const char *text, size_t len, const char *header_length, const api_param_limits *lim,
                              kserve_infer_params *out, api_param_error *err);
void kserve_infer_params_free(kserve_infer_params *p); /* accepts a zeroed struct */

/* Makes s (NUL-terminated) valid UTF-8 in place, as JSON strings must be: a character that
 * snprintf cut at the end is dropped, any other invalid byte becomes '?'. */
void api_utf8_fix(char *s);

#endif
