/* Internal to daemon/api: the API's shared state (models, engine events, counters). Declares no
 * handler and no response helper: those are handlers.h and respond.h. */
#ifndef SERVD_API_IMPL_H
#define SERVD_API_IMPL_H

#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>

#include "api/api.h"
#include "http/buf.h"

#define API_HIST_MAX 24
#define API_MAX_TOP 20
#define API_EV_TAKE 16 /* free event nodes an engine thread takes per lock */

typedef struct api_hist {
  int n;                             /* finite bounds */
  const double *bounds;              /* upper bounds, seconds */
  uint64_t counts[API_HIST_MAX + 1]; /* per bucket (not cumulative); last is +Inf */
  double sum;
  uint64_t count;
} api_hist;

/* Histograms (metrics_text.c, with the other helpers of the /metrics families). */
void api_hist_init(api_hist *h, const double *bounds, int n);
void api_hist_observe(api_hist *h, double v);

typedef enum { M_LOADING, M_READY, M_UNLOADING, M_UNAVAILABLE } api_model_state;

/* vLLM's per-model series of a language model (metrics_vllm.c), with vLLM's buckets, so that
 * dashboards and autoscaling rules written for vLLM read servd unchanged. */
typedef struct api_vllm_stats {
  api_hist ttft, itl, e2e, queue, prefill, decode, inference, prompt_tokens, generation_tokens, max_tokens;
  double tok_bounds[API_HIST_MAX]; /* 1-2-5 series up to the context length, as vLLM's */
  uint64_t finished[3];            /* by vLLM's finished_reason: stop, length, abort */
} api_vllm_stats;

/* A generic model's predictions (metrics_generic.c). */
typedef struct api_infer_stats {
  api_hist latency;
  uint64_t ok, failed;
} api_infer_stats;

/* A generic model's predictions as Triton's statistics extension reports them (kserve_stats.c):
 * counts and summed nanoseconds per phase. */
typedef struct api_kserve_duration {
  uint64_t count, ns;
} api_kserve_duration;
typedef struct api_kserve_stats {
  uint64_t last_inference_ms; /* unix milliseconds of the last prediction's end; 0: none yet */
  uint64_t inference_count, execution_count;
  api_kserve_duration success, fail, queue, compute_input, compute_infer, compute_output;
} api_kserve_stats;
/* One prediction's phases, in api_now_ns() time: accepted (its input parsed for HTTP, parse_ns
 * before), started on a worker, model done, answered. */
typedef struct api_kserve_times {
  uint64_t parse_ns, accept, start, done, answered;
} api_kserve_times;

typedef struct api_model {
  struct api_model *next;
  char *name; /* owned */
  char *path; /* owned; NULL for models added already loaded */
  servd_model_options opts;
  servd_model *m;
  api_model_state state;
  char error[1024];
  int inflight;    /* api requests holding engine work on this model */
  int64_t created; /* unix seconds */
  api_hist ttft, itl, e2e;
  api_vllm_stats vllm;
  api_infer_stats infer;
  api_kserve_stats kstats;
  struct servd_http_req *waiter; /* repository load/unload request waiting for the outcome */
  bool unload_cancelled;         /* running requests were cancelled at the unload deadline */
  bool startup;                  /* given at startup and not loaded yet: server readiness waits for it */
  bool load_failed;              /* UNAVAILABLE because its last load failed (listed as FAILED, with error) */
  /* A front end's (gRPC's) repository load/unload waiting for the outcome, as waiter. */
  void (*fe_waiter)(void *ud, int status, const char *msg);
  void *fe_waiter_ud;
  uv_timer_t *unload_timer;
  /* Generic models: predictions running (at most one per interpreter, so libuv's workers never all
   * block waiting for an interpreter) and a bounded FIFO of those waiting. */
  int predict_running, predict_waiting;
  struct infer_job *wait_head, *wait_tail;
} api_model;

typedef struct api_route_count {
  const char *route;
  int status;
  uint64_t n;
} api_route_count;

struct gen;
struct api_event;

/* The consumer of a generation's events, on the loop: chosen by the engine callback the generation
 * was submitted with (api_engine_cb: OpenAI's; frontend_llm.c: a front end's), so the queue in api.c
 * names no consumer. */
typedef void (*api_event_sink)(servd_api *a, struct api_event *ev);

/* An engine event copied off the engine thread; nodes and their text buffers are recycled. */
typedef struct api_event {
  struct api_event *next;
  struct api_event *spare; /* final events: the request's unused cached nodes, going back */
  struct gen *g;
  api_event_sink sink; /* where the loop hands it */
  servd_event_kind kind;
  int32_t token;
  float logprob;
  int n_top;
  servd_top_logprob top[API_MAX_TOP];
  char finish[16];
  int prompt_tokens, completion_tokens, error_code;
  int cached_tokens; /* prompt tokens found in the prefix cache */
  char *text;
  size_t text_len, text_cap;
  char error[512];
  uint64_t t_ns;
  double queue_s, prefill_s, decode_s; /* final events: the engine's request phases */
} api_event;

/* One submitted engine request (a choice of an OpenAI request). */
typedef struct gen {
  struct servd_api *api;
  struct gen *next, *prev; /* api->gens */
  struct oai *owner;
  api_model *am;
  servd_request *r;
  int index;
  bool done;
  char finish[16];        /* OpenAI's finish_reason (api_oai_finish_reason) */
  char finish_detail[16]; /* the engine's own ending when finish stands for it ("deadline"), else "" */
  int prompt_tokens, completion_tokens, error_code;
  int cached_tokens;
  char *error;
  servd_buf text;     /* non-streaming: the generated text */
  json_t *lp;         /* non-streaming logprobs being collected */
  size_t text_offset; /* completions logprobs: offset of the next token */
  uint64_t t_submit, t_first, t_last;
  bool role_sent;
  /* Free nodes taken in bulk by the engine thread (only it touches this, until the final event
   * hands the rest back in api_event.spare), so most tokens take no lock. Padded onto a cache line
   * of its own: the loop writes the fields above on every token. */
  char pad_[64];
  api_event *ev_cache;
  char pad_end_[64 - sizeof(api_event *)];
} gen;

struct servd_api {
  uv_loop_t *loop;
  servd_api_options o;
  char *api_key;
  size_t api_key_len;
  char **repository;
  const servd_model_ops *ops;
  FILE *log;
  api_model *models;
  servd_http_server *server;
  uv_async_t async;
  bool async_open;
  /* Events pushed by engine threads, newest first: a lock-free stack (producers only push, the
   * loop only takes the whole stack at once, so there is no ABA), reversed on the loop. */
  _Atomic(api_event *) q_top;
  pthread_mutex_t lock; /* guards the free list */
  api_event *free_events;
  int n_free_events;
  uint64_t n_events, n_batches; /* handled on the loop (metrics) */
  gen *gens;
  int works;    /* worker-thread jobs in flight */
  int inflight; /* requests holding engine work */
  bool draining;
  api_route_count routes[128];
  int n_routes;
  uint64_t id_seq;
  int unloads_pending;
  void (*unload_done)(void *);
  void *unload_ud;
  void (*close_done)(void *);
  void *close_ud;
};

/* ---- models ---- */
api_model *api_model_find(servd_api *a, const char *name);
/* api_model_find, or the serving language model that has a LoRA adapter of that name: then *lora is
 * name (else NULL). lora may be NULL when the caller does not pass adapters on (its route serves
 * the base's own data). */
api_model *api_model_resolve(servd_api *a, const char *name, const char **lora);
bool api_model_ready(servd_api *a, api_model *am);
void api_model_release_ref(servd_api *a, api_model *am); /* inflight-- and continue a pending unload */
bool api_all_ready(servd_api *a);
/* Interpreter namespaces of one process (servd/interp.h's SERVD_INTERP_MAX, which the API does not
 * include). */
#define API_INTERP_NAMESPACES 15
/* Whether quarantined interpreters have taken the last interpreter namespace while a model that needs
 * one is not loaded (loading, or its load failed): it cannot load again until servd restarts. why
 * (may be NULL) gets the reason. */
bool api_interp_starved(servd_api *a, char *why, size_t cap);

/* The consumer of engine events (openai.c): one event, on the loop. */
void api_oai_event(servd_api *a, api_event *ev);
/* A request's response is complete: counts it for /metrics and writes the access log. */
void api_request_done(servd_api *a, const servd_http_req *r);

/* Copies an engine event of generation ud (a gen) into the loop's queue; the loop hands it to sink.
 * On the engine thread. */
void api_event_push(void *ud, const servd_event *ev, api_event_sink sink);
/* The engine callback of an OpenAI generation (openai.c submits with it): its events go to
 * api_oai_event. */
static inline void api_engine_cb(void *ud, const servd_event *ev) { api_event_push(ud, ev, api_oai_event); }

/* ---- metrics beside servd's own (metrics.c) ---- */
void api_vllm_init(api_vllm_stats *v);
/* A token of a language-model request: its time to first token (first) or since the previous one. */
void api_vllm_token(api_model *am, bool first, double secs);
/* A language-model request's final event, e2e_s after the request arrived; max_tokens as asked (<= 0: none). */
void api_vllm_finished(servd_api *a, api_model *am, const api_event *ev, double e2e_s, int max_tokens);
/* Appends the vllm: families; st holds the stats of the live models (READY or UNLOADING) in order. */
void api_metrics_vllm(servd_api *a, servd_buf *b, const servd_model_stats *st);
/* lora.c: the adapters of a language model as /v1/models rows (appended to data), one of them by
 * name (NULL: none), and vllm:lora_requests_info */
void api_lora_model_entries(servd_api *a, api_model *am, json_t *data);
json_t *api_lora_model_entry(servd_api *a, api_model *am, const char *name);
void api_lora_metrics(servd_api *a, servd_buf *b);
void api_infer_init(api_infer_stats *s);
/* A generic model's prediction ended (ok or not), secs after it was accepted. */
void api_infer_done(api_model *am, bool ok, double secs);
void api_metrics_generic(servd_api *a, servd_buf *b);
/* A generic model's prediction was answered (ok: with its outputs) after the phases of t. */
void api_kserve_stats_add(api_model *am, bool ok, const api_kserve_times *t);
/* Prometheus label value escaping (backslash, quote, newline). */
void api_prom_label(servd_buf *b, const char *v);

/* ---- request ids (request_id.c) ---- */
/* Sets r->request_id from a client's id when it is usable (1..128 printable ASCII bytes, no space),
 * else to a new random 128-bit hex id. Returns r->request_id (arena), NULL only out of memory. */
const char *api_request_id_set(servd_http_req *r, const char *client);

/* Monotonic nanoseconds. */
uint64_t api_now_ns(void);

#endif
