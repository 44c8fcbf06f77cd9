/* CUDA graph buckets and the padding of decode steps to them (internal to the engine; pure functions
 * of their arguments, no device needed).
 *
 * A captured graph replays one fixed shape, so decode steps are padded up to a bucket of sequences:
 * 1, 2, 4, 8, then multiples of 8, the largest being the graph max batch itself. A padding row has
 * token 0, position 0, slot -1 (kv_write skips it), kv_len 1 over a block table of zeros (it reads
 * block 0 and writes nothing) and a logit row of its own, after the real ones: the first n rows of
 * the step's logits are the real sequences'.
 */
#ifndef SERVD_ENGINE_GRAPH_PLAN_H
#define SERVD_ENGINE_GRAPH_PLAN_H

#include <stdbool.h>
#include <stdint.h>

#include "engine/step_arrays.h"
#include "servd/interp.h"

/* Writes the buckets for max_batch (>= 1) in increasing order into out (room for cap) and returns
 * their count, or -1 when cap is too small (servd_graph_n_buckets says how many). */
int servd_graph_buckets(int max_batch, int *out, int cap);
int servd_graph_n_buckets(int max_batch);
/* Index into buckets[] of the smallest bucket holding n sequences; -1 when n < 1 or n > the largest. */
int servd_graph_bucket_index(const int *buckets, int n_buckets, int n);

/* A step graphs can run: decode only (every sequence has one query token) and every token's logits
 * wanted, so that the step's shape is fixed by its number of sequences. */
bool servd_step_is_decode(const servd_forward_batch *b);

/* Host arrays of a padded step, allocated once for up to `cap` sequences (one token each). */
typedef struct servd_padded_step {
  servd_step_arrays step;    /* cap tokens, cap sequences */
  int32_t zero_table[1];     /* the block table of every padding row */
  servd_forward_batch batch; /* the padded step (points into step), after servd_pad_decode */
} servd_padded_step;

int servd_padded_step_init(servd_padded_step *p, int cap);
void servd_padded_step_free(servd_padded_step *p); /* accepts a zeroed struct */
/* p->batch = b (a decode step, servd_step_is_decode) padded to `bucket` sequences; the real rows
 * keep their order and values, kv, dbatch, dkv and the capacities are copied. SERVD_EINVAL when b
 * is not a decode step or does not fit bucket <= cap. */
int servd_pad_decode(servd_padded_step *p, const servd_forward_batch *b, int bucket);

/* What the runner does with each step on GPUs; the same decision for every rank. Per bucket: the
 * first sighting runs eagerly (padded: it warms up the memory the step needs), the second captures,
 * later ones replay. A failed capture disables the bucket for good, except when device memory moved
 * during the capture (warm up again and retry, up to SERVD_GRAPH_MAX_UNSTABLE times). */
typedef enum servd_graph_action {
  SERVD_GRAPH_EAGER = 0, /* run the step as given (not a graph step, or graphs off for its bucket) */
  SERVD_GRAPH_WARMUP,    /* run the padded step eagerly */
  SERVD_GRAPH_CAPTURE,   /* capture the padded step on every rank, then replay it */
  SERVD_GRAPH_REPLAY,    /* replay the bucket's graph over the padded step */
} servd_graph_action;

#define SERVD_GRAPH_MAX_UNSTABLE 3

typedef struct servd_graph_state {
  int max_batch;
  int *buckets, n_buckets;
  bool *seen;     /* ran once padded since the last reset */
  bool *captured; /* every rank holds the bucket's graph */
  bool *disabled; /* a capture failed: eager for good */
  int *unstable;  /* captures during which device memory moved */
} servd_graph_state;

int servd_graph_state_init(servd_graph_state *g, int max_batch);
void servd_graph_state_free(servd_graph_state *g); /* accepts a zeroed struct */
/* The action for step b; *bucket: the index of its bucket (-1 for SERVD_GRAPH_EAGER). */
servd_graph_action servd_graph_decide(const servd_graph_state *g, const servd_forward_batch *b, int *bucket);
/* After the step ran (rc 0) with the action decided. */
void servd_graph_ran(servd_graph_state *g, servd_graph_action a, int bucket);
/* A capture ended: ok, or failed (unstable: device memory moved during it). Returns true when the
 * bucket is now disabled. */
bool servd_graph_capture_done(servd_graph_state *g, int bucket, bool ok, bool unstable);
/* Every graph was dropped (memory moved, or a replay failed): every bucket warms up again. */
void servd_graph_reset(servd_graph_state *g);

#endif
