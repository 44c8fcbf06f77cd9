/* Internal to the OpenAI-compatible routes: one API request and its engine requests. */
#ifndef SERVD_API_OPENAI_IMPL_H
#define SERVD_API_OPENAI_IMPL_H

#include "api/api-impl.h"
#include "api/otlp.h"
#include "api/request_params.h"

typedef struct oai oai;

/* What a choice holds beside its gen: its echoed prompt, its embedding. */
typedef struct oai_choice_x {
  char *echo;        /* the prompt's text (malloc'd), NULL without echo */
  size_t prompt_off; /* echo with logprobs: text_offset of the next prompt token */
  bool echo_sent;    /* streaming: the prompt's chunk went out */
  float *vec;        /* embeddings: the vector (malloc'd on the engine thread before the final event) */
  int n_vec;
} oai_choice_x;

/* Another route's output over the chat machinery (responses.c): the chat request runs as usual and
 * these replace its chunks and its body. n is 1. Each is called on the loop with o->req set. */
typedef struct oai_sink {
  const char *id_prefix;                                        /* o->id: prefix + hex */
  void (*stream_begin)(oai *o);                                 /* the 200 is sent */
  void (*stream_text)(oai *o, gen *g, const char *s, size_t n); /* content released (n > 0) */
  void (*stream_end)(oai *o, gen *g);                           /* g is over: finish or error set, its calls parsed */
  void (*stream_finish)(oai *o); /* every choice is over: ends the stream (oai_stream_close) */
  void (*respond)(oai *o);       /* not streaming, no choice failed: the body (oai_respond) */
  /* The route's name for a chat field in an error ("messages[2]" -> "input"), into out. */
  void (*param)(const char *chat_param, char *out, size_t cap);
  void (*ctx_free)(void *ctx); /* o->sink_ctx, when o is freed */
  /* Optional (NULL: OpenAI's). The route's own error body in place of OpenAI's error object
   * (anthropic.c); msg names the field where one is at fault. */
  void (*error)(servd_http_req *r, int status, const char *msg);
  /* Optional. Every generated token's event, streamed or not, before the request's own handling
   * (anthropic.c tells a stop sequence from the end of the sequence by the last tokens). */
  void (*token)(oai *o, gen *g, const api_event *ev);
  /* Optional: the streamed body's Content-Type (NULL: text/event-stream). */
  const char *content_type;
  /* Optional (NULL: the thought is not streamed). A reasoning model's thought released (n > 0),
   * before any of the answer's text (openai_reasoning.c); the whole thought is
   * oai_reasoning_text at the end, streamed or not. */
  void (*stream_reasoning)(oai *o, gen *g, const char *s, size_t n);
} oai_sink;

/* Chat completions' own streamed thought (openai.c): a chunk whose delta is {"reasoning_content"}. */
typedef void (*oai_reasoning_chunk_fn)(oai *o, gen *g, const char *s, size_t n);

typedef struct oai_reasoning oai_reasoning; /* openai_reasoning.c */

struct oai {
  servd_api *a;
  servd_http_req *req; /* NULL once the response has been sent or the client went away */
  api_model *am;
  oai_mode mode;
  servd_arena *arena; /* this request's own allocations; outlives the HTTP request if needed */
  bool stream, include_usage, add_special, add_generation_prompt;
  int n; /* choices per prompt */
  int n_prompts;
  oai_prompt *prompts;
  json_t *messages; /* chat / tokenize: the messages (own reference) */
  servd_gen_params gp;
  int logprobs;                /* -1: none; else top count */
  servd_guide_kind guide_kind; /* constrained decoding: the request's constraint (arena spec) */
  const char *guide_spec, *guide_param;
  char *guide;              /* its grammar from the model (malloc'd); gp.guide points here */
  oai_tools *tools;         /* chat with tools (api/openai_tools.h); NULL: none */
  json_t *template_kwargs;  /* chat_template_kwargs (own reference); NULL: none */
  oai_reasoning *reasoning; /* the thought of a reasoning model's output, split off; NULL: none */
  char *detok_text;         /* detokenize result (malloc'd) */
  gen *gens;
  int n_gens, n_submitted, n_done;
  bool work_pending;
  int err_rc;
  int err_status;        /* > 0: the status of err (instead of err_rc's) */
  char err[1024];        /* a message for the client (no engine stage prefixes) */
  const char *err_param; /* the request field at fault, or NULL (static string) */
  char id[48];
  int64_t created;
  const char *model_name;
  servd_buf sse;
  uint64_t t_start;
  const oai_sink *sink;                   /* NULL: chat completions' own output */
  const struct oai_embed_hooks *embed;    /* OAI_EMBEDDINGS: what embeddings.c adds */
  oai_reasoning_chunk_fn reasoning_chunk; /* without a sink: streams a thought's pieces */
  void *sink_ctx;
  bool echo;                  /* completions: each choice's text starts with its prompt */
  bool base64;                /* embeddings: encoding_format base64 */
  int truncate_prompt_tokens; /* embeddings: 0 none, -1 the model's context, else at most k tokens */
  oai_choice_x *x;            /* per choice (n_gens): echo and embedding state; NULL until submitted */
  /* With --otlp-traces-endpoint: the request's trace context (api/otlp.h). */
  api_trace_ctx trace;
};

/* For sinks (openai.c). A stream write; -1 when the client is gone (o->req is NULL then). */
int oai_stream_write(oai *o, const char *s, size_t n);
/* OpenAI's finish_reason for an engine ending (finish_reason.c): "stop" and "length" as they are,
 * "deadline" -> "length" (cut short by a limit), "cancelled" and anything else -> "stop". */
const char *api_oai_finish_reason(const char *engine_reason);
/* Ends the stream, or sends the 200 body (stolen), and lets go of the HTTP request. */
void oai_stream_close(oai *o);
void oai_respond(oai *o, json_t *body);
/* A JSON string of raw model output (invalid UTF-8 becomes U+FFFD). */
json_t *oai_json_text(const char *s, size_t n);

/* Serves body (stolen) as a chat completions request whose output sink formats; sink_ctx is freed
 * with sink->ctx_free, also when this answers an error itself. */
void oai_chat_serve(servd_api *a, servd_http_req *r, json_t *body, const oai_sink *sink, void *sink_ctx);
/* What embeddings add to this machinery (embeddings.c): the check of what the model must allow
 * (false: answered with a 400), each input's engine callback (keeps the vector), the 200 body
 * without a sink. The embeddings routes pass them; openai.c names none of embeddings.c. */
typedef struct oai_embed_hooks {
  bool (*check)(oai *o);
  servd_event_cb engine_cb;
  void (*respond)(oai *o);
  /* On the prep worker, once the inputs are tokenized (NULL: nothing): may cut them, or set o->err. */
  void (*tokenized)(oai *o);
  /* Optional, on the prep worker: tokenizes the inputs itself in place of one text each (text pairs:
   * rerank.c), setting each prompt's ids and pair_split, or o->err. */
  void (*tokenize)(oai *o);
} oai_embed_hooks;
extern const oai_embed_hooks oai_embedding_hooks;

/* The same for another mode: OAI_COMPLETIONS (a raw prompt), OAI_EMBEDDINGS (embed: the hooks;
 * sink->respond reads o->x[i].vec), OAI_TOKENIZE (sink->respond reads o->prompts[0].n_ids: counting
 * tokens); embed NULL for the modes other than OAI_EMBEDDINGS. */
void oai_sink_serve(servd_api *a, servd_http_req *r, json_t *body, oai_mode mode, const oai_sink *sink, void *sink_ctx,
                    const oai_embed_hooks *embed);
/* Serves a POST /v1/embeddings body in OpenAI's shape. */
void oai_embeddings_serve(servd_api *a, servd_http_req *r, const oai_embed_hooks *embed);
/* Reasoning output (openai_reasoning.c; the splitter is api/reasoning.h). Prep worker: renders the
 * chat (with o->tools when set, through oai_tools_prepare) with o->template_kwargs and sets
 * o->reasoning when the package says the output holds a thought. *prompt: caller frees; *grammar:
 * a forced call's (caller frees, NULL otherwise); *param: the field at fault. 0 or an engine code. */
int oai_chat_render(oai *o, char **prompt, char **grammar, const char **param);
/* Loop: a token event's text; the thought goes out (streamed, or kept), ev->text keeps the answer. */
void oai_reasoning_token(oai *o, gen *g, api_event *ev);
/* Loop: g's final event (ev); the thought held back goes out. Returns answer text that was held
 * back in case it began the thought ("<thi" at the very end), *len bytes (valid until the next call
 * for o), for the caller to send as a last token's text; NULL: none. */
const char *oai_reasoning_end(oai *o, gen *g, const api_event *ev, size_t *len);
/* Choice gen's thought so far (NULL: the output has none) and its length; its tokens. */
const char *oai_reasoning_text(const oai *o, int gen, size_t *len);
int oai_reasoning_tokens(const oai *o, int gen);
void oai_reasoning_free(oai_reasoning *r); /* accepts NULL */

/* oai_error of openai.c for the other files of the OpenAI routes. */
void oai_fail(oai *o, int status, const char *param, const char *code, const char *msg);

#endif
