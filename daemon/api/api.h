/* The HTTP API of servd: routes (OpenAI-compatible, KServe v2 / Open Inference Protocol, Triton's
 * repository extension, tokenizer, health, metrics), the models being served, authentication,
 * access log and metrics. Plugs into servd_http_server through servd_api_http_callbacks.
 *
 * Everything runs on the loop thread. Engine events arrive on engine threads and are passed to the
 * loop through one locked queue and a uv_async_t; blocking engine calls (chat templates,
 * tokenization, generic predict, loading, unloading) run on libuv's worker threads.
 */
#ifndef SERVD_API_H
#define SERVD_API_H

#include <stdbool.h>
#include <stdio.h>
#include <uv.h>

#include "api/model_ops.h"
#include "http/server.h"

typedef struct servd_api servd_api;

typedef enum servd_access_log {
  SERVD_ACCESS_LOG_OFF = 0,
  SERVD_ACCESS_LOG_TEXT,
  SERVD_ACCESS_LOG_JSON
} servd_access_log;

typedef struct servd_api_options {
  const servd_model_ops *ops; /* required: &servd_engine_model_ops to use the engine */
  const char *api_key;        /* NULL or "": no authentication (copied) */
  bool metrics_public;        /* API_ROUTE_METRICS rows (GET /metrics) need no key */
  servd_access_log access_log;
  FILE *log;                     /* access log and operational messages; NULL: stderr */
  int default_deadline_ms;       /* per-request deadline when the request names none; 0: none */
  int max_n;                     /* largest n (choices per request) */
  const char *const *repository; /* directories searched by repository load, as <dir>/<name>.mpk */
  int n_repository;
  servd_model_options model_defaults; /* repository loads: non-zero fields override the engine's defaults */
  int unload_timeout_ms;              /* how long an unload lets running requests finish */
  /* Called on the loop when a model finished loading (rc 0) or failed (message). May be NULL. */
  void (*on_model_loaded)(void *ud, const char *name, int rc, const char *message);
  void *ud;
} servd_api_options;

void servd_api_options_default(servd_api_options *o);

/* *out owned by the caller; free with servd_api_close. */
int servd_api_create(uv_loop_t *loop, const servd_api_options *o, servd_api **out);
/* Closes the loop handles; done(ud) runs when they have closed. Call once nothing is in flight
 * (servd_api_inflight() == 0) and models are unloaded. */
void servd_api_close(servd_api *a, void (*done)(void *ud), void *ud);

servd_http_callbacks servd_api_http_callbacks(servd_api *a);
/* The HTTP server whose counters /metrics reports (borrowed). */
void servd_api_set_server(servd_api *a, servd_http_server *s);

/* Starts loading a model on a worker thread; it serves once loaded (503 until then). o is copied. */
int servd_api_load_model(servd_api *a, const servd_model_options *o);
/* Registers the LoRA adapter at path as name on the language model base (NULL or "": the only one
 * served); the adapter is read and checked now. Returns an HTTP status (200, or 400 with msg). */
int servd_api_lora_load(servd_api *a, const char *base, const char *name, const char *path, char *msg, size_t cap);
/* Serves an already loaded model (tests, embedding). The api takes ownership of m. */
int servd_api_add_model(servd_api *a, servd_model *m);
int servd_api_models_loading(const servd_api *a);

/* Draining: readiness fails and new inference requests get 503; running ones continue. */
void servd_api_set_draining(servd_api *a, bool draining);
/* Shutdown: loads in progress are not waited for (a load can take up to the load timeout): their
 * waiting repository requests get 503 now. Returns how many loads are still running; when the models
 * are unloaded the process exits without waiting for them (servd_api_close needs none running). */
int servd_api_drain_loads(servd_api *a);
/* Requests holding engine work (generations, predictions, template/tokenization jobs, unloads; not
 * loads). */
int servd_api_inflight(const servd_api *a);
/* Cancels every running generation (they end with finish_reason "cancelled"). */
void servd_api_cancel_all(servd_api *a);
/* Unloads every model on worker threads, each letting running requests go on for deadline_ms;
 * done(ud) runs on the loop when all are unloaded. */
void servd_api_unload_all(servd_api *a, int deadline_ms, void (*done)(void *ud), void *ud);

/* Constant-time comparison of a presented key with the configured one (time depends only on the
 * configured key's length). */
bool servd_api_key_equal(const char *presented, size_t presented_len, const char *key, size_t key_len);

#endif
