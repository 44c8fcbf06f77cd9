/* Runs one forward step on every tensor-parallel rank at once (internal to the engine).
 *
 * Rank 0 runs on the caller's thread; ranks 1..world-1 each have a thread of their own that waits
 * for the next step. All ranks must run concurrently: their collectives block until every rank has
 * contributed.
 *
 * Failure of one rank: the others may be waiting in a collective for it. The failing rank aborts the
 * communicator (their collectives return SERVD_ECANCELED, their forward raises and returns), the
 * step waits for every rank, resets the communicator and reports the error of the rank that failed
 * first (the cause; the others only saw the abort). The runner stays usable for the next step. On
 * GPUs the same holds for the NCCL communicator (servd_device_comm_abort, then reset).
 *
 * On GPUs (servd_runner_create_gpu) each rank uploads the step to its device and rank 0 downloads the
 * logits into a host tensor. Decode-only steps of up to graph_max_batch sequences are padded to a
 * bucket (graph_plan.h) and run as CUDA graphs. The runner decides on the caller's thread, before
 * waking the ranks, what every rank does for a bucket, so that all take the same path:
 *   - first sighting: EAGER (padded; warms up the memory the step needs),
 *   - second: CAPTURE on every rank (nothing runs: no rank can block in a collective), then, if every
 *     rank captured, REPLAY (launch) on every rank; if any rank failed, the bucket's graphs are
 *     dropped on all ranks, the bucket is disabled (device memory that moved during a capture: it is
 *     warmed up again and retried, up to 3 times) and the step runs EAGER unpadded,
 *   - later: REPLAY only (no Python call).
 * Before each step, when device memory that a graph may reference was freed or moved on any rank
 * (servd_device_generation), every graph is dropped and every bucket warms up again.
 */
#ifndef SERVD_ENGINE_MODEL_RUNNER_H
#define SERVD_ENGINE_MODEL_RUNNER_H

#include <stdbool.h>
#include <stdint.h>

#include "servd/device.h"
#include "servd/interp.h"

typedef struct servd_runner servd_runner;

typedef struct servd_runner_gpu {
  const int *devices;          /* devices[rank]: the GPU of each rank */
  servd_device_kv *const *dkv; /* dkv[rank]: each rank's device cache; borrowed */
  servd_device_comm *dcomm;    /* the ranks' NCCL communicator (world > 1); borrowed */
  int max_tokens, max_seqs;    /* the scheduler's step limits */
  int max_blocks_per_seq;      /* blocks of one full context */
  int block_size;
  bool graphs;         /* decode steps as CUDA graphs */
  int graph_max_batch; /* largest decode batch run as a graph */
} servd_runner_gpu;

typedef struct servd_runner_stats {
  uint64_t steps;          /* steps run */
  uint64_t eager_steps;    /* GPU steps that called the model's forward */
  uint64_t graph_captures; /* buckets captured (on every rank) */
  uint64_t graph_replays;  /* steps run by launching graphs */
  uint64_t graph_capture_failures;
  uint64_t graph_drops; /* times every graph was dropped because device memory moved */
} servd_runner_stats;

/* pool: one interpreter per rank (interpreter i is rank i); kv[world]: each rank's cache; comm: the
 * ranks' communicator (NULL when world is 1). All borrowed, must outlive the runner. *out owned by the
 * caller. */
int servd_runner_create(servd_pool *pool, servd_kv_cache *const *kv, int world, servd_comm *comm, servd_runner **out);
/* The same on GPUs: interpreter i runs on gpu->devices[i] (the pool was created with them). */
int servd_runner_create_gpu(servd_pool *pool, servd_kv_cache *const *kv, int world, const servd_runner_gpu *gpu,
                            servd_runner **out);
void servd_runner_destroy(servd_runner *r); /* accepts NULL */
/* Counters, readable from any thread. */
void servd_runner_get_stats(const servd_runner *r, servd_runner_stats *s);

/* Each rank's forward is interrupted (TimeoutError, SERVD_ETIMEDOUT) when it has not returned after
 * timeout_ms (0: never); see forward_call.h. Call while no step runs. */
void servd_runner_set_step_timeout(servd_runner *r, int64_t timeout_ms);
/* Replaces each rank's device cache (dkv[rank], borrowed) and drops every graph (they name the old
 * one). Call while no step runs. */
int servd_runner_set_device_kv(servd_runner *r, servd_device_kv *const *dkv);
/* GPUs: the step capacities of the device batches (max_tokens covers padded decode steps). */
void servd_runner_capacity(const servd_runner *r, int *max_tokens, int *max_seqs);
/* Runs b eagerly on every rank (no padding, no graph bookkeeping, no step counted): the load's
 * warm-up steps. Same contract as servd_runner_step. */
int servd_runner_eager(servd_runner *r, const servd_forward_batch *b, servd_tensor **logits, servd_py_error *err,
                       int *failed_rank);

/* Runs b (its kv field is replaced by each rank's cache) on every rank; *logits (new reference)
 * from rank 0. On failure err holds the first failing rank's Python error and *failed_rank (may be
 * NULL) that rank; with more than one rank the message (servd_last_error) starts "rank N: ". */
int servd_runner_step(servd_runner *r, const servd_forward_batch *b, servd_tensor **logits, servd_py_error *err,
                      int *failed_rank);

#endif
