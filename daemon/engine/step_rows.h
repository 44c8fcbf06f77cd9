/* What the engine does with a step's rows besides sampling (internal to the engine): embeddings
 * pool final-norm hidden rows, prompt logprobs read a prompt token's log-probability off the row
 * before it. */
#ifndef SERVD_ENGINE_STEP_ROWS_H
#define SERVD_ENGINE_STEP_ROWS_H

#include <stdint.h>
#include <jansson.h>

#include "engine/types.h"

/* The package's embedding settings, from its model config (config.json):
 *   "pooling": "last" (default: a causal LM's summary is its last token), "mean" or "cls";
 *   "matryoshka_dimensions": a list (sentence-transformers' name): present, a client may truncate;
 *   "is_causal": false: an encoder (BERT), whose attention needs each prompt whole in one step.
 * dim is hidden_size. An unknown pooling is SERVD_EFORMAT naming the value. */
int servd_embedding_info_read(json_t *cfg, int hidden_size, servd_embedding_info *out);

/* A cross-encoder's score settings into out (n_labels: rows of its "classifier.weight", > 0): the
 * activation from the config (servd_score_activation); an activation other than Sigmoid, Identity
 * or Tanh is SERVD_EUNSUPPORTED naming it. */
int servd_score_info_read(json_t *cfg, int n_labels, servd_embedding_info *out);
/* The activation applied to n raw classifier outputs, into out (in double, rounded once). */
void servd_scores_finish(const float *raw, int n, servd_score_activation act, float *out);

/* Pooling accumulator of one request (sum of hidden rows), dim floats, owned. */
typedef struct servd_pool_sum {
  float *sum;
  int dim;
  int n; /* rows added */
} servd_pool_sum;

void servd_pool_sum_reset(servd_pool_sum *p);
/* Adds one hidden row of p->dim floats. */
void servd_pool_sum_add(servd_pool_sum *p, const float *row);
/* The pooled vector (mean of the rows) cut to dims values (0: all) and L2-normalized, into out. */
void servd_pool_sum_finish(const servd_pool_sum *p, int dims, float *out);

/* log_softmax(row)[token] and the n_top best (descending logprob, lower id first on ties), from one
 * row of n_vocab raw logits. */
float servd_row_logprob(const float *row, int n_vocab, int32_t token, int n_top, servd_top_logprob *top);

#endif
