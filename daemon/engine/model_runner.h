/* Runs one forward step on every tensor-parallel rank at once (internal to the engine).
 *
 * Rank 0 runs on the caller's thread; ranks 1..world-1 each have a thread of their own that waits
 * for the next step. All ranks must run concurrently: their collectives block until every rank has
 * contributed.
 *
 * Failure of one rank: the others may be waiting in a collective for it. The failing rank aborts the
 * communicator (their collectives return SERVD_ECANCELED, their forward raises and returns), the
 * step waits for every rank, resets the communicator and reports the error of the rank that failed
 * first (the cause; the others only saw the abort). The runner stays usable for the next step.
 */
#ifndef SERVD_ENGINE_MODEL_RUNNER_H
#define SERVD_ENGINE_MODEL_RUNNER_H

#include "servd/interp.h"

typedef struct servd_runner servd_runner;

/* pool: one interpreter per rank (interpreter i is rank i); kv[world]: each rank's cache; comm: the
 * ranks' communicator (NULL when world is 1). All borrowed, must outlive the runner. *out owned by the
 * caller. */
int servd_runner_create(servd_pool *pool, servd_kv_cache *const *kv, int world, servd_comm *comm,
                        servd_runner **out);
void servd_runner_destroy(servd_runner *r); /* accepts NULL */

/* Runs b (its kv field is replaced by each rank's cache) on every rank; *logits (new reference)
 * from rank 0. On failure err holds the first failing rank's Python error and *failed_rank (may be
 * NULL) that rank. */
int servd_runner_step(servd_runner *r, const servd_forward_batch *b, servd_tensor **logits,
                      servd_py_error *err, int *failed_rank);

#endif
