/* Internal to the OpenAI-compatible routes: one API request and its engine requests. */
#ifndef SERVD_API_OPENAI_IMPL_H
#define SERVD_API_OPENAI_IMPL_H

#include "api/api-impl.h"
#include "api/request_params.h"

typedef struct oai {
  servd_api *a;
  servd_http_req *req; /* NULL once the response has been sent or the client went away */
  api_model *am;
  oai_mode mode;
  servd_arena *arena;  /* this request's own allocations; outlives the HTTP request if needed */
  bool stream, include_usage, add_special, add_generation_prompt;
  int n;               /* choices per prompt */
  int n_prompts;
  oai_prompt *prompts;
  json_t *messages;    /* chat / tokenize: the messages (own reference) */
  servd_gen_params gp;
  int logprobs;        /* -1: none; else top count */
  servd_guide_kind guide_kind; /* constrained decoding: the request's constraint (arena spec) */
  const char *guide_spec, *guide_param;
  char *guide;         /* its grammar from the model (malloc'd); gp.guide points here */
  oai_tools *tools;    /* chat with tools (api/openai_tools.h); NULL: none */
  char *detok_text;    /* detokenize result (malloc'd) */
  gen *gens;
  int n_gens, n_submitted, n_done;
  bool work_pending;
  int err_rc;
  char err[1024];      /* a message for the client (no engine stage prefixes) */
  const char *err_param; /* the request field at fault, or NULL (static string) */
  char id[48];
  int64_t created;
  const char *model_name;
  servd_buf sse;
  uint64_t t_start;
} oai;

#endif
