/* The engine's value types: options, generation parameters, events, named tensors, statistics.
 *
 * Kept apart from engine.h (the functions of a loaded model) so that the engine's lower files
 * (sampler, batcher, isolation, step rows, package checks) use these values without including the
 * front header; engine.h includes this one, so its users see no difference.
 */
#ifndef SERVD_ENGINE_TYPES_H
#define SERVD_ENGINE_TYPES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "servd/tensor.h"

typedef struct servd_model servd_model;
typedef struct servd_request servd_request;

/* SERVD_EMODEL (status.h) is a failure of the model's own code, not of the request: the HTTP layer
 * answers 500 and keeps serving.
 *
 * Rule (forward, predict, chat template):
 * - forward (causal LM steps): any Python exception, and logits of the wrong shape, are SERVD_EMODEL:
 *   the engine built and checked the step's input itself.
 * - predict and the chat template: an exception of type ValueError, TypeError, KeyError or IndexError
 *   (for the chat template also jinja2's TemplateError, which templates raise through
 *   raise_exception() for a conversation they do not accept) says the request's input was bad:
 *   SERVD_EINVAL (HTTP 400). Any other exception (RuntimeError, AttributeError, ZeroDivisionError,
 *   MemoryError, TemplateSyntaxError, ...) is SERVD_EMODEL. The type is matched by name, so subclasses
 *   of those types count as model errors; a model that validates input should raise the base types.
 * - TimeoutError at a deadline: SERVD_ETIMEDOUT (predict, chat template); a forward step interrupted
 *   at the step timeout (step_timeout_s) is the model's: SERVD_EMODEL, type "TimeoutError". Failures
 *   outside Python keep their own codes. */

/* The Python exception behind a SERVD_EMODEL or SERVD_EINVAL failure of the model's code. */
typedef struct servd_model_error {
  char type[64];     /* exception type name; "" when the failure was not a Python exception */
  char message[512]; /* str(exception) */
} servd_model_error;

typedef enum servd_model_kind { SERVD_MODEL_CAUSAL_LM = 0, SERVD_MODEL_GENERIC = 1 } servd_model_kind;

/* AUTO (the default when the operator chose none): in-process, unless the package declares the
 * "native" capability (ctypes/cffi, which the interpreters' guards cannot contain): then a process. */
typedef enum servd_isolation {
  SERVD_ISOLATION_NONE = 0,
  SERVD_ISOLATION_PROCESS = 1,
  SERVD_ISOLATION_AUTO = 2
} servd_isolation;

typedef struct servd_model_options {
  const char *path;     /* package file */
  const char *name;     /* served name; NULL: the package's name */
  int interpreters;     /* generic: pool size; causal-lm: ignored (one per TP rank) */
  int tp;               /* tensor-parallel ranks (causal-lm) */
  int max_queue;        /* waiting requests beyond which submit returns SERVD_EBUSY */
  int max_batch_tokens; /* token budget per scheduler step */
  int max_seqs;         /* running sequences at most */
  int kv_blocks;        /* 0: sized from max_seqs * context */
  int block_size;       /* tokens per KV block */
  int max_batch_size;   /* generic dynamic batching (1: off) */
  int max_batch_delay_ms;
  /* Appended fields; servd_model_options_default sets them. */
  servd_dtype kv_dtype;       /* f16, bf16, q8_0, q4_0 or f32; SERVD_DTYPE_COUNT (default): the package's
                               * kv_cache_dtype, else f16 (kv_dtype.h) */
  int kv_budget_mb;           /* cap on KV memory when kv_blocks is 0 (all ranks together) */
  int max_context;            /* > 0: cap the model's context length */
  const char *extra_sys_path; /* NULL, or ':'-separated directories added to the interpreters' sys.path */
  /* GPUs (causal-lm; generic packages stay on the CPU). gpus > 0: rank r runs on GPU r, so tp must
   * equal gpus; the KV cache lives on the GPUs, sized from what the weights leave free. */
  int gpus;                   /* 0: CPU */
  double gpu_memory_fraction; /* of the free memory after the weights and the warm-up steps, for the
                               * KV cache: (0, 1] (all but 256 MiB at most) */
  bool cuda_graphs;           /* decode-only steps of up to cuda_graph_max_batch sequences as CUDA graphs */
  int cuda_graph_max_batch;
  /* Causal-lm: a rank's forward that has not returned after this many seconds is interrupted
   * (TimeoutError raised in its Python code) and the step fails with SERVD_EMODEL; 0: no limit.
   * Native code that never returns to Python cannot be interrupted. */
  double step_timeout_s;
  /* The package's import in the model's interpreters (module bodies, the entry object's construction)
   * must finish within this many seconds (0: no limit): past it TimeoutError is raised in it and the
   * load fails with SERVD_ETIMEDOUT. An import that cannot be interrupted (blocked in native code)
   * is abandoned 2 s later: the load fails all the same and its interpreters are quarantined (never
   * reused, never finalized; servd_engine_quarantined_interpreters counts them). */
  double load_timeout_s;
  /* Package checks before anything of the package runs (mpk_load_check): the SHA-256 of the code and
   * small entries always, of the weights too when verify_weights; with trusted_keys (a PEM public
   * key or a folder of them, borrowed) only a package signed by one of those keys loads. */
  bool verify_weights;
  const char *trusted_keys;
  /* Generic packages: SERVD_ISOLATION_PROCESS runs the interpreters in a child process of their own
   * (engine/isolated.h), so a crash of the model's code ends only that process; AUTO chooses it for
   * packages that declare native code. Language models always run in-process. */
  servd_isolation isolation;
  /* Causal-lm: automatic prefix caching (engine/prefix_cache.h): requests share the KV blocks of a
   * common prompt beginning, computed once. */
  bool prefix_cache;
  /* Causal-lm: a step that carries decodes should take about this long at most (0: no bound): its
   * prefill chunk is cut to what the learned step costs leave (engine/scheduler.h), so a decode does
   * not stall behind a max_batch_tokens chunk. Appended. */
  int max_step_ms;
  /* Causal-lm: speculative decoding (engine/speculate.h): 0 auto (the default), 1 off, 2 ngram,
   * 3 suffix (servd_spec_mode); drafts per verify row at most (0: the default, 8). Appended. */
  int speculative;
  int num_speculative_tokens;
  /* Causal-lm: LoRA adapters resident at most (engine/lora_registry.h): one more evicts the least
   * recently used one that no request holds. 0: SERVD_DEFAULT_MAX_LORAS. Appended. */
  int max_loras;
  /* Causal-lm on the CPU: the prefix cache's full blocks also go to files under this directory and
   * come back from there after a restart (engine/prefix_disk.h); NULL: memory only. Bounded by
   * prefix_cache_dir_mb (0: 4096). Appended. */
  const char *prefix_cache_dir;
  int prefix_cache_dir_mb;
  /* Causal-lm: KV-cache events (engine/kv_events.h): the prefix cache's blocks published there;
   * NULL: none. Borrowed: outlives the model. Appended. */
  struct servd_kv_events *kv_events;
} servd_model_options;

#define SERVD_DEFAULT_MAX_LORAS 4

/* A registered LoRA adapter (servd_model_lora_list). */
typedef struct servd_lora_info {
  char name[128];
  char path[512];
  int64_t id;    /* registration number */
  bool resident; /* its weights are in memory (else read again on first use) */
  int users;     /* requests holding it */
  int running;   /* of those, sequences in the latest step */
  int rank;      /* resident: the adapter's rank, scale and bytes */
  float scale;
  uint64_t bytes;
} servd_lora_info;

/* Constrained decoding (structured outputs): what the output must match. */
typedef enum servd_guide_kind {
  SERVD_GUIDE_NONE = 0,
  SERVD_GUIDE_JSON_SCHEMA = 1, /* spec: a JSON Schema (JSON text) */
  SERVD_GUIDE_JSON_OBJECT = 2, /* spec: "" (any JSON object) */
  SERVD_GUIDE_REGEX = 3,       /* spec: a regular expression (Rust regex syntax), matched whole */
  SERVD_GUIDE_CHOICE = 4,      /* spec: a JSON list of strings, one of which is the output */
  SERVD_GUIDE_GRAMMAR = 5,     /* spec: a Lark or GBNF grammar */
  SERVD_GUIDE_TOOLS = 6,       /* spec: {"tools", "choice" ("required" or a name), "parallel", "family"}: a
                                  forced tool call in the model's call format (tools.py) */
} servd_guide_kind;

/* One entry of OpenAI's logit_bias: added to the token's logit before penalties and temperature. */
typedef struct servd_logit_bias {
  int32_t token;
  float bias; /* [-100, 100]; -100 bans the token in practice */
} servd_logit_bias;

typedef struct servd_gen_params {
  int max_tokens;           /* <= 0: up to the context length */
  float temperature;        /* 0: greedy */
  float top_p;              /* 1: off */
  int top_k;                /* <= 0: off */
  float min_p;              /* 0: off */
  float repetition_penalty; /* 1: off */
  float presence_penalty;   /* 0: off */
  float frequency_penalty;  /* 0: off */
  bool has_seed;
  uint64_t seed;
  int logprobs;            /* -1: none; n >= 0: chosen token's logprob plus top n */
  const char *const *stop; /* stop strings (copied at submit) */
  int n_stop;
  const int32_t *stop_token_ids;
  int n_stop_token_ids;
  bool ignore_eos;
  int64_t deadline_ms; /* 0: none; else wall-clock budget from submit */
  /* Appended: constrained decoding, a grammar from servd_model_guide_compile (copied at submit);
   * NULL: none. Every sampled token then obeys it, and the grammar's completion ends the text. */
  const char *guide;
  /* Appended: OpenAI's logit_bias (copied at submit; ids inside the vocabulary, at most
   * SERVD_MAX_LOGIT_BIAS), and vLLM's min_tokens: until that many tokens are generated the
   * end-of-sequence and stop token ids are masked and stop strings are not looked for. */
  const servd_logit_bias *logit_bias;
  int n_logit_bias;
  int min_tokens;
  /* Appended: vLLM's priority: lower runs first (default 0); equal priorities are served in arrival
   * order. A waiting request short of KV blocks or a running slot preempts the running request of the
   * worst priority when that one is worse than its own (engine/scheduler.h). */
  int priority;
  /* Appended: an embedding (POST /v1/embeddings): the prompt is computed and its final-norm hidden
   * states pooled as the package says (servd_model_embedding_info), L2-normalized and delivered with
   * the final event (servd_event.embedding, finish_reason "stop"); nothing is sampled. Its KV blocks
   * are freed at its end and never enter the prefix cache. dimensions > 0 keeps the first that many
   * values (renormalized), only where the package allows truncation (else SERVD_EINVAL at submit). */
  bool embed;
  int dimensions;
  /* Appended: echo with logprobs. prompt_logprobs: each prompt token after the first gets a
   * SERVD_EVENT_PROMPT_TOKEN event (its logprob under the model and the top `logprobs`), in order,
   * before any generated token; the prompt is computed whole, without prefix-cache hits (a cached
   * block has no logits). prompt_only: nothing is generated; the request ends "length" once its
   * prompt is computed (OpenAI's echo with max_tokens 0). */
  bool prompt_logprobs;
  bool prompt_only;
  /* Appended: the LoRA adapter the request runs with (a name servd_model_lora_load registered;
   * copied at submit); NULL or "": the base model alone. */
  const char *lora;
  /* Appended: a cross-encoder's score (POST /v1/rerank, /v1/score): the prompt (a pair of texts) is
   * computed like an embedding's, and the package's classifier outputs for its first (CLS) row go
   * back with the final event as servd_event.embedding: num_labels values after the package's
   * activation (servd_embedding_info.activation), not normalized. Only on a classifier package
   * (servd_embedding_info.n_labels > 0, else SERVD_EUNSUPPORTED at submit), which computes nothing
   * else (an embedding there is refused the same way). pair_split > 0: the prompt's second text
   * starts at that position (BERT's token type 1 from there on, 0 before); 0: one text. */
  bool score;
  int pair_split;
} servd_gen_params;

/* Embeddings: how the package pools (SERVD_POOL_*), the vector's length (hidden_size) and whether
 * a client may ask for fewer dimensions (the package's config says the model was trained for it). */
typedef enum servd_pooling { SERVD_POOL_LAST = 0, SERVD_POOL_MEAN = 1, SERVD_POOL_CLS = 2 } servd_pooling;
/* What a cross-encoder's classifier outputs pass through (sentence-transformers' CrossEncoder
 * activation_fn): the package config's "sentence_transformers": {"activation_fn"} or the older
 * "sbert_ce_default_activation_function" (torch.nn.modules...Sigmoid, Identity or Tanh); neither
 * given: sigmoid for one label, as vLLM and sentence-transformers score it, identity for more. */
typedef enum servd_score_activation {
  SERVD_SCORE_SIGMOID = 0,
  SERVD_SCORE_IDENTITY = 1,
  SERVD_SCORE_TANH = 2,
} servd_score_activation;
typedef struct servd_embedding_info {
  servd_pooling pooling;
  int dim;
  bool truncatable;
  bool bidirectional; /* an encoder (config "is_causal": false): each prompt is computed in one step */
  /* Appended: a cross-encoder (a "classifier.weight" tensor of num_labels rows): n_labels > 0, and
   * its scores (servd_gen_params.score) pass through activation; 0: not a classifier. */
  int n_labels;
  servd_score_activation activation;
} servd_embedding_info;

#define SERVD_MAX_LOGIT_BIAS 300 /* OpenAI's limit */

typedef enum servd_event_kind {
  SERVD_EVENT_TOKEN = 0, /* text delta (may be empty while a UTF-8 sequence is incomplete) */
  SERVD_EVENT_DONE = 1,  /* final: finish_reason set; no more events */
  SERVD_EVENT_ERROR = 2, /* final: error_code, error_message */
  /* Appended: a prompt token's logprob (servd_gen_params.prompt_logprobs): token, logprob, top; no
   * text. Not final. */
  SERVD_EVENT_PROMPT_TOKEN = 3,
} servd_event_kind;

typedef struct servd_top_logprob {
  int32_t token;
  float logprob;
} servd_top_logprob;

typedef struct servd_event {
  servd_event_kind kind;
  const char *text; /* valid during the callback */
  size_t text_len;
  int32_t token;
  float logprob;
  const servd_top_logprob *top; /* n_top entries, valid during the callback */
  int n_top;
  const char *finish_reason; /* "stop", "length", "cancelled", "deadline" (the OpenAI routes map the last
                                two onto OpenAI's set: api_oai_finish_reason) */
  int prompt_tokens;
  int completion_tokens;
  int error_code;
  const char *error_message;
  /* Appended: for error_code SERVD_EMODEL, the exception type name ("RuntimeError"); else NULL.
   * Valid during the callback. The failure of a step fails only the requests of that step. */
  const char *error_type;
  /* Appended: prompt tokens whose K/V came from the prefix cache (OpenAI cached_tokens). */
  int cached_tokens;
  /* Appended, final events only (seconds, 0 for a phase never reached): queued until first
   * scheduled, first scheduled until the first token, first token until the last. */
  double queue_s, prefill_s, decode_s;
  /* Appended: the final event of an embedding: n_embedding floats, unit L2 norm (valid during the
   * callback); of a score: its n_labels scores (servd_gen_params.score); NULL otherwise. */
  const float *embedding;
  int n_embedding;
} servd_event;

/* Called on the engine's thread; must not block. After a final event the engine never touches ud. */
typedef void (*servd_event_cb)(void *ud, const servd_event *ev);

typedef struct servd_named_tensor {
  char name[64];
  servd_tensor *tensor;
} servd_named_tensor;

typedef struct servd_model_stats {
  int waiting, running;
  int kv_blocks_total, kv_blocks_used;
  uint64_t prompt_tokens, generation_tokens, preemptions; /* prompt tokens of accepted requests; tokens
                                                           generated; sequences preempted (recomputed) */
  int n_interpreters;
  double interp_busy_seconds[16];
  uint64_t steps;
  double last_step_age_s; /* seconds since the scheduler last finished a step while work was pending */
  /* Appended: GPUs (0: CPU) and how the GPU steps ran. */
  int gpus;
  uint64_t eager_steps;         /* GPU steps that called the model's forward */
  uint64_t cuda_graph_captures; /* decode buckets captured */
  uint64_t cuda_graph_replays;  /* steps run by replaying a graph (no Python) */
  uint64_t cuda_graph_capture_failures;
  /* Appended: device memory per model, summed over its ranks, as measured at load (GPUs only). */
  uint64_t gpu_base_bytes; /* in use when the warm-up began: the weights as allocated, and whatever
                            * else (other models) was on those GPUs */
  uint64_t gpu_kv_bytes;   /* the KV cache */
  uint64_t gpu_step_bytes; /* what the warm-up steps left allocated: step buffers, activations,
                            * attention scratch, collective buffers, cached blocks */
  /* Appended: GPU steps whose rows were all plain greedy, so only each row's top token crossed PCIe. */
  uint64_t pick_steps;
  /* Appended: prefix cache, in tokens: looked up at admission and found (hits); full blocks cached. */
  uint64_t prefix_cache_queries, prefix_cache_hits;
  int kv_blocks_cached;
  /* Appended: constrained decoding: rows whose token mask was computed, the time those calls took
   * (the whole call into the grammar engine, per step), sequences holding a matcher now. */
  uint64_t guided_rows;
  double guided_mask_seconds;
  int guided_sequences;
  /* Appended: isolation "process": the model's process was started again this many times. */
  bool isolated;
  int isolated_restarts;
  /* Appended: of guided_mask_seconds (computed beside the forward), what the steps waited for. */
  double guided_wait_seconds;
  /* Appended: speculative decoding (vLLM's spec_decode counters): verify rows, drafts in them,
   * drafts accepted, and accepted by position (0: the first draft of a row). */
  uint64_t spec_drafts, spec_draft_tokens, spec_accepted_tokens;
  uint64_t spec_accepted_per_pos[16];
  int spec_max_draft; /* 0: speculation off */
  /* Appended: the KV cache's dtype (a servd_dtype name, "" for generic models), tokens per block,
   * tokens it holds in all and its bytes (CPU: the pool; GPU: as measured at load). */
  char kv_cache_dtype[8];
  int kv_block_size;
  uint64_t kv_cache_tokens;
  uint64_t kv_cache_bytes;
  /* Appended: the prefix cache's disk tier (--prefix-cache-dir): blocks written, bytes written, blocks
   * read back, files rejected (foreign, truncated, corrupt), evicted for the bound, writes dropped,
   * and what is on disk now. */
  bool prefix_disk;
  uint64_t prefix_disk_written, prefix_disk_bytes_written, prefix_disk_read, prefix_disk_rejected;
  uint64_t prefix_disk_evicted, prefix_disk_dropped, prefix_disk_files, prefix_disk_bytes;
  /* Appended: KV-cache events queued for the publisher, and dropped because its queue was full. */
  uint64_t kv_events_queued, kv_events_dropped;
} servd_model_stats;

#endif
