/* One rank's part of a forward step on its GPU (internal to the engine; the model runner drives it).
 *
 * Per rank: a servd_device_batch at the engine's capacities (its buffers never move, so a CUDA graph
 * captured over one step replays over later steps' inputs), the CUDA graphs captured per bucket
 * (graph_plan.h) with the device logits each one writes, and on rank 0 the host tensor the logits
 * are downloaded into (reused, returned to the engine as a new reference viewing the real rows).
 *
 * Every call runs on the rank's own thread (the one whose CUDA stream the step's work goes to), with
 * one exception: the runner drops graphs from its own thread while no rank is running.
 */
#ifndef SERVD_ENGINE_DEVICE_STEP_H
#define SERVD_ENGINE_DEVICE_STEP_H

#include <stdbool.h>
#include <stdint.h>

#include "servd/device.h"
#include "servd/interp.h"

typedef struct servd_device_step servd_device_step;

typedef struct servd_device_step_config {
  int device, rank;
  servd_device_kv *dkv; /* this rank's device cache; borrowed */
  int max_tokens;       /* capacities of the device batch (including padding up to the buckets) */
  int max_seqs;
  int max_blocks_per_seq;
  int block_size;
  int n_buckets; /* graph slots (0: graphs off) */
} servd_device_step_config;

int servd_device_step_create(const servd_device_step_config *c, servd_device_step **out);
void servd_device_step_destroy(servd_device_step *s); /* accepts NULL */

/* The step's rows of logits the engine gets: rank 0 downloads rows [0, n_rows) of its forward's
 * logits (n_rows <= the rows the step computed: the rest are padding). Other ranks pass logits NULL.
 * With b->want_picks, rank 0 downloads only each row's top token and its logit (picks, see
 * servd_forward_batch). */

/* Uploads b and runs the model's forward through Python. */
int servd_device_step_eager(servd_device_step *s, servd_interp *it, const servd_forward_batch *b, int n_rows,
                            servd_tensor **logits, servd_py_error *err);
/* Uploads b and captures the forward into the graph of slot `bucket` (replacing one held there);
 * nothing runs yet: the runner launches it with servd_device_step_replay once every rank captured.
 * On failure (the forward raised, an op cannot be captured, the logits are not on the device, or
 * device memory moved during the capture) no graph is kept and the error is returned. */
int servd_device_step_capture(servd_device_step *s, servd_interp *it, const servd_forward_batch *b, int bucket,
                              servd_py_error *err);
/* Uploads b (the shape the graph was captured with) and launches the graph of slot `bucket`. When
 * device memory moved since the capture (another thread released some after the runner checked),
 * runs the step as servd_device_step_eager instead: its collectives match the graph's. */
int servd_device_step_replay(servd_device_step *s, servd_interp *it, const servd_forward_batch *b, int bucket,
                             int n_rows, servd_tensor **logits, servd_py_error *err);
/* Waits for this rank's queued work (ranks other than 0, whose step has no download to wait on). */
int servd_device_step_sync(servd_device_step *s);

/* Each forward through Python is interrupted after timeout_ms (0: never); see forward_call.h. */
void servd_device_step_set_timeout(servd_device_step *s, int64_t timeout_ms);
/* Replaces the device cache (no graph may be held: they name the old one). */
void servd_device_step_set_kv(servd_device_step *s, servd_device_kv *dkv);

bool servd_device_step_has_graph(const servd_device_step *s, int bucket);
/* True when a graph is held and device memory it may reference was freed or moved since it was
 * captured (servd_device_generation). */
bool servd_device_step_stale(const servd_device_step *s);
void servd_device_step_drop(servd_device_step *s, int bucket);
void servd_device_step_drop_all(servd_device_step *s);
int servd_device_step_device(const servd_device_step *s);

#endif
