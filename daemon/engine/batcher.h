/* Dynamic batching of generic predict calls (internal to the engine).
 *
 * Callers queue a job and wait. One worker thread per interpreter takes the oldest job, waits until
 * max_batch_size compatible jobs are queued or the oldest has waited max_batch_delay_ms, concatenates
 * their inputs along dimension 0, runs one predict on an idle interpreter and hands each job its rows
 * of the outputs (views, no copy). Compatible: the same input names in the same order, plain dtypes,
 * equal dtypes and trailing dimensions. A batch's deadline is the loosest of its jobs' (0 if any has
 * none). Every output of a batched call must have the batch's rows as its first dimension.
 */
#ifndef SERVD_ENGINE_BATCHER_H
#define SERVD_ENGINE_BATCHER_H

#include "engine/types.h"
#include "servd/interp.h"

typedef struct servd_batcher servd_batcher;

/* pool borrowed (must outlive the batcher); *out owned by the caller. */
int servd_batcher_create(servd_pool *pool, int max_batch_size, int max_batch_delay_ms, servd_batcher **out);
void servd_batcher_destroy(servd_batcher *b); /* accepts NULL; fails queued jobs with SERVD_ECANCELED */

/* Same contract as servd_model_predict. */
int servd_batcher_predict(servd_batcher *b, const servd_named_tensor *inputs, int n_inputs,
                          servd_named_tensor **outputs, int *n_outputs, int64_t deadline_ms, servd_model_error *err);

/* One predict on an idle interpreter of pool (no batching). err may be NULL. */
int servd_predict_direct(servd_pool *pool, const servd_named_tensor *inputs, int n_inputs, servd_named_tensor **outputs,
                         int *n_outputs, int64_t deadline_ms, servd_model_error *err);

#endif
