/* Calls for servd's front ends other than HTTP (the gRPC listener, daemon/grpc): the same models,
 * readiness, API key and prediction queue as the HTTP routes, without HTTP.
 *
 * Outcomes are HTTP statuses, the API layer's one vocabulary (200, 400, 401, 404, 429, 500, 503,
 * 504); a front end maps them to its own codes. Loop thread only.
 */
#ifndef SERVD_API_FRONTEND_H
#define SERVD_API_FRONTEND_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "api/api.h"

/* The server's readiness as /v2/health/ready reports it. */
bool servd_api_server_ready(servd_api *a);
/* Whether an 'authorization' value ("Bearer KEY", or NULL when absent) passes; true without a key. */
bool servd_api_authorized(servd_api *a, const char *authorization);
/* The per-request deadline when a request names none (ms; 0: none). */
int servd_api_default_deadline(const servd_api *a);

/* Readiness of one model: 200 ready, 404 unknown (or a version other than "" / "1"), 503 loading,
 * unloading, draining or stuck; msg says which. */
int servd_api_model_status(servd_api *a, const char *name, const char *version, char *msg, size_t cap);
/* The model's metadata as GET /v2/models/{m} answers it ({"name", "versions", "platform", "inputs",
 * "outputs"}), a new reference; NULL with *status (404, 503) and msg otherwise. */
json_t *servd_api_model_metadata(servd_api *a, const char *name, const char *version, int *status, char *msg,
                                 size_t cap);

/* Triton's statistics extension as GET /v2/models[/{m}]/stats answers it ({"model_stats": [...]}):
 * every generic model's when name is "" or NULL. A new reference; NULL with *status 404 and msg. */
json_t *servd_api_model_stats(servd_api *a, const char *name, const char *version, int *status, char *msg, size_t cap);

/* ---- the repository extension (models.c) ---------------------------------------------------- */

/* The models served and the packages in the repository directories, as POST /v2/repository/index
 * answers it: [{"name", "version", "state", "reason"?}]. A new reference. */
json_t *servd_api_repository_index(servd_api *a);
/* The outcome of a load or unload: 200, or an HTTP status (400, 404, 409, 500, 503) with message. */
typedef void (*api_repository_cb)(void *ud, int status, const char *message);
/* Loads (or unloads) a model as POST /v2/repository/models/{m}/load (/unload) does. cb runs once,
 * now or when the load has finished, unless servd_api_repository_forget(ud) is called first. */
void servd_api_repository_load(servd_api *a, const char *name, api_repository_cb cb, void *ud);
void servd_api_repository_unload(servd_api *a, const char *name, api_repository_cb cb, void *ud);
/* The caller waiting with ud went away: its cb will not run (the load or unload goes on). */
void servd_api_repository_forget(servd_api *a, void *ud);

typedef struct servd_api_prediction servd_api_prediction;
/* A prediction's outcome: status 200 with the outputs (the callee owns out[] and its tensors), or
 * an error status with a message (out NULL). */
typedef void (*api_predict_cb)(void *ud, int status, const char *message, servd_named_tensor *out, int n_out);
/* Queues a prediction of a generic model, as POST /v2/models/{m}/infer does. Takes in[] (malloc'd)
 * and its tensors whatever the outcome. Returns 0 with *out set (cb runs once, later, on the loop,
 * unless abandoned first) or an HTTP status with msg: 404, 503, 400 (a language model), 429 (the
 * model's queue is full), 500. */
int servd_api_predict(servd_api *a, const char *model, const char *version, servd_named_tensor *in, int n_in,
                      int64_t deadline_ms, api_predict_cb cb, void *ud, servd_api_prediction **out, char *msg,
                      size_t cap);
/* The client went away: cb will not run. The prediction itself cannot be stopped; its result is
 * dropped. Accepts NULL. */
void servd_api_predict_abandon(servd_api_prediction *p);

/* ---- language models (frontend_llm.c) ------------------------------------------------------- */

/* Whether the served model named is a language model (false when unknown or not loaded). */
bool servd_api_is_language_model(servd_api *a, const char *name);

/* The sampling defaults of the model's requests (its generation_config.json over the engine's), for
 * the caller to override field by field before servd_api_generate. */
void servd_api_generate_defaults(servd_api *a, const char *model, servd_gen_params *gp);

typedef struct servd_api_generation servd_api_generation;
/* What a generation delivers: text pieces as the engine releases them, then one final event. */
typedef struct servd_api_gen_event {
  bool final;
  const char *text; /* the new text (not NUL-terminated), valid during the call; len may be 0 when final */
  size_t len;
  /* Final events only: status 200 with finish_reason ("stop", "length", "deadline"), or an HTTP
   * status (400 bad input, 429 queue full, 500, 503) with message. */
  int status;
  const char *message;
  const char *finish_reason;
  int prompt_tokens, completion_tokens;
} servd_api_gen_event;
/* Called on the loop; after the final event the generation is gone. */
typedef void (*api_generate_cb)(void *ud, const servd_api_gen_event *ev);

/* Starts a text generation on a language model, as POST /v1/completions does: prompt (len bytes,
 * copied) is tokenized on a worker thread (special tokens added), checked against the context
 * length and submitted with gp (copied, stop strings included; guide and logit_bias are not taken).
 * Returns 0 with *out set (cb runs on the loop for each piece of text and once more at the end,
 * unless cancelled first) or an HTTP status with msg: 404, 503, 400 (not a language model). */
int servd_api_generate(servd_api *a, const char *model, const char *version, const char *prompt, size_t len,
                       const servd_gen_params *gp, api_generate_cb cb, void *ud, servd_api_generation **out, char *msg,
                       size_t cap);
/* The client went away: cb will not run again, and the engine stops the request at its next step
 * (its KV blocks are freed). Accepts NULL. */
void servd_api_generate_cancel(servd_api_generation *g);

#endif
