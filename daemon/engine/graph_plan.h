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

/* Host arrays of a padded step, allocated once for up to `cap` sequences. */
typedef struct servd_padded_step {
  int cap;
  int32_t *tokens, *positions, *slots, *logit_rows, *q_start, *q_len, *kv_len;
  const int32_t **block_tables;
  int32_t zero_table[1];     /* the block table of every padding row */
  servd_forward_batch batch; /* the padded step (points into the arrays above), after servd_pad_decode */
} servd_padded_step;

int servd_padded_step_init(servd_padded_step *p, int cap);
void servd_padded_step_free(servd_padded_step *p); /* accepts a zeroed struct */
/* p->batch = b (a decode step, servd_step_is_decode) padded to `bucket` sequences; the real rows
 * keep their order and values, kv, dbatch, dkv and the capacities are copied. SERVD_EINVAL when b
 * is not a decode step or does not fit bucket <= cap. */
int servd_pad_decode(servd_padded_step *p, const servd_forward_batch *b, int bucket);

#endif
