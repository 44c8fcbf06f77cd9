/* Isolated embedded Python interpreters and the pool that serves one package.
 *
 * Mechanism-independent API: today each interpreter is a complete libpython3.11 loaded with
 * dlmopen into its own link-map namespace (own GIL, own modules); Python 3.12+ own-GIL
 * subinterpreters can be a second backend behind the same calls. At most SERVD_INTERP_MAX
 * interpreters per process (glibc has 16 namespaces; the main program uses one).
 *
 * Call servd_interp_early_init(argc, argv) first thing in main(): it re-executes the process with
 * GLIBC_TUNABLES=glibc.rtld.nns=16 when needed (static TLS for many namespaces; returns an error
 * only when that fails). At exit, destroy the pools, flush, and leave with _exit(): library
 * destructors of the interpreters' namespaces are not safe to run. Design: docs/interpreters.md.
 */
#ifndef SERVD_INTERP_H
#define SERVD_INTERP_H

#include <stdint.h>
#include <jansson.h>

#include "servd/status.h"
#include "servd/ops.h"
#include "servd/device.h"

#define SERVD_INTERP_MAX 15

typedef struct mpk_package mpk_package;
typedef struct servd_pool servd_pool;
typedef struct servd_interp servd_interp;
struct servd_py_error;

SERVD_API int servd_interp_early_init(int argc, char **argv);
/* Link-map namespaces an interpreter could still take (of SERVD_INTERP_MAX): never used, or released by
 * a finalized interpreter. Quarantined interpreters keep theirs until the process exits. */
SERVD_API int servd_interp_namespaces_free(void);

typedef struct servd_pool_options {
  int n_interpreters;           /* 1..SERVD_INTERP_MAX */
  int world_size;               /* tensor-parallel ranks; interpreter i has rank i % world_size */
  servd_comm *comm;             /* collectives between ranks (world_size > 1); borrowed */
  const char *extra_sys_path;   /* NULL, or ':'-separated directories added to sys.path */
  struct servd_py_error *error; /* NULL, or filled when starting an interpreter or importing the
                                 * package raised (type, message, full traceback) */
  const int *rank_devices;      /* NULL: every rank on the CPU; else rank r runs on GPU rank_devices[r] */
  servd_device_comm *dcomm;     /* NCCL collectives between GPU ranks (world_size > 1); borrowed */
  /* 0: none. The imports of the package in all the interpreters (module bodies, the entry object's
   * construction) must be done within this many ms of servd_pool_create's start: past it TimeoutError
   * is raised inside the running import (again every 100 ms) and servd_pool_create fails with
   * SERVD_ETIMEDOUT. Code blocked in native code does not see the exception until it returns to
   * Python, so servd_pool_create may still not return: a caller that must not wait for that runs it
   * on a thread it can abandon (daemon/engine does), leaving that pool's interpreters unusable. */
  int64_t load_timeout_ms;
} servd_pool_options;

/* Creates the interpreters, imports the package's entry module from the package itself and builds
 * the entry object in each. On failure (e.g. the import raised) returns an error whose message holds
 * the exception and the last lines of the Python traceback (o->error, when given, gets all of it).
 * More than SERVD_INTERP_MAX interpreters in the process at once: SERVD_ERANGE. The package must
 * outlive the pool. pkg may be NULL: interpreters without a package (no entry object). */
SERVD_API int servd_pool_create(mpk_package *pkg, const servd_pool_options *o, servd_pool **out);
SERVD_API void servd_pool_destroy(servd_pool *p); /* accepts NULL */
SERVD_API int servd_pool_size(const servd_pool *p);

/* Takes an idle interpreter (blocks until one is free, FIFO so the load spreads); release gives it
 * back. servd_pool_get returns a specific interpreter without taking it (never release it): calls
 * on one interpreter from several threads are allowed and run one at a time under its GIL. */
SERVD_API servd_interp *servd_pool_acquire(servd_pool *p);
SERVD_API servd_interp *servd_pool_get(servd_pool *p, int index); /* a specific one (TP rank) */
SERVD_API void servd_pool_release(servd_pool *p, servd_interp *it);
SERVD_API int servd_interp_index(const servd_interp *it);
/* Sum of the durations of the calls made on it (concurrent calls on one interpreter add up). */
SERVD_API double servd_interp_busy_seconds(const servd_interp *it);

/* A structured failure of a Python call. Calls return SERVD_EINVAL for an exception raised by the
 * model code, SERVD_ETIMEDOUT when it was interrupted at its deadline (type "TimeoutError"); err may
 * be NULL. */
typedef struct servd_py_error {
  char type[64]; /* exception type name, e.g. "ValueError", "TimeoutError" */
  char message[512];
  char traceback[4096];
} servd_py_error;

/* Generic predict: calls entry.predict({name: Tensor}) -> {name: Tensor}. outputs: new references,
 * caller releases each tensor and frees the arrays (names are malloc'd). deadline_ms 0: none; past it
 * a TimeoutError is raised inside the interpreter, which stays usable. */
SERVD_API int servd_interp_predict(servd_interp *it, int n_in, const char *const *in_names,
                                   servd_tensor *const *in_tensors, int *n_out, char ***out_names,
                                   servd_tensor ***out_tensors, int64_t deadline_ms, servd_py_error *err);

/* Calls entry.<method>(*args) with JSON-convertible arguments and returns the JSON-converted
 * result (new ref). Used for chat templates and model info. */
SERVD_API int servd_interp_call_json(servd_interp *it, const char *method, json_t *args, json_t **result,
                                     int64_t deadline_ms, servd_py_error *err);

/* A forward step of a causal LM: calls entry.forward(batch) where batch is a servd.Batch built from
 * this description; returns logits f32 (n_logit_rows, vocab) as a new reference (rank 0; other ranks
 * return NULL in *logits). */
/* The rows of a step that one LoRA adapter applies to (servd_forward_batch.lora). */
typedef struct servd_lora_group {
  int first, n; /* rows [first, first + n) of the token batch */
  int64_t id;   /* the adapter's registration number: one id, the same weights */
  float scale;  /* alpha / r (rsLoRA: alpha / sqrt(r)) */
  int n_layers;
  /* [layer * 7 + projection] (q k v o gate up down): servd.ops.lora's ab, or NULL where the adapter
   * leaves that projection alone; borrowed, valid while the step runs */
  servd_tensor *const *ab;
} servd_lora_group;

typedef struct servd_forward_batch {
  int n_tokens;
  const int32_t *tokens;    /* (n_tokens) */
  const int32_t *positions; /* (n_tokens) */
  const int32_t *slots;     /* (n_tokens) KV slot of each token */
  int n_logit_rows;
  const int32_t *logit_rows; /* rows of the token batch whose logits are needed */
  servd_attn_batch attn;     /* per-sequence layout for the attention op */
  servd_kv_cache *kv;        /* this rank's cache (on a GPU: block bookkeeping only) */
  /* GPU ranks: the step's inputs uploaded to this rank's device, and its device KV cache. NULL on
   * the CPU. The model code then sees device tensors in batch.tokens, .positions, .slots and
   * .logit_rows, and batch.kv covers the device cache. */
  servd_device_batch *dbatch;
  servd_device_kv *dkv;
  int max_tokens, max_seqs; /* the engine's step capacities (buffers sized once), 0: unknown */
  /* The engine needs only each logit row's top token (every row is plain greedy). A GPU step may
   * then hand back picks instead of logits: an I32 tensor (n_logit_rows, 2) of the token id and the
   * bits of its f32 logit per row, so the vocabulary-wide rows never cross PCIe. The model code does
   * not see it. */
  bool want_picks;
  /* Appended: the step computes embeddings: the model returns its final-norm hidden states f32
   * (n_logit_rows, hidden_size) of the logit rows instead of logits (batch.hidden in Python). */
  bool want_hidden;
  /* CPU: the step's inputs as host i32 tensors at fixed addresses, in servd_device_batch_field
   * order (a plan capture's, servd/plan.h); NULL: the model gets fresh copies of the arrays. */
  servd_tensor *host_inputs[4];
  /* Appended: LoRA adapter groups in row order (batch.lora in Python); rows outside every group run
   * the base alone. Only a decode step with one group over every row is captured as a plan (keyed by
   * the group's id: daemon/engine/plan_cache.c); groups that mix adapters change step by step. */
  int n_lora;
  const servd_lora_group *lora;
  /* Appended: each token's segment (BERT's token_type_ids: 0 for a pair's first text, 1 for its
   * second), (n_tokens); NULL: all 0. batch.token_types in Python (CPU steps). */
  const int32_t *token_types;
  /* Appended, with want_hidden: a cross-encoder's step: the model returns its classifier's outputs
   * f32 (n_logit_rows, num_labels) of the logit rows (batch.scores in Python). */
  bool want_scores;
} servd_forward_batch;

SERVD_API int servd_interp_forward(servd_interp *it, const servd_forward_batch *b, servd_tensor **logits,
                                   servd_py_error *err);
/* servd_interp_forward with a deadline (timeout_ms 0: none): past it TimeoutError is raised inside the
 * running forward (again every 100 ms until it returns) and the call returns SERVD_ETIMEDOUT with
 * err->type "TimeoutError"; the interpreter stays usable. Native code that never returns to Python
 * (an op, a collective that is never aborted) is not interrupted. */
SERVD_API int servd_interp_forward_deadline(servd_interp *it, const servd_forward_batch *b, int64_t timeout_ms,
                                            servd_tensor **logits, servd_py_error *err);

#endif
