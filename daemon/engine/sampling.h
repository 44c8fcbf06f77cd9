/* The engine's bridge to token sampling (internal): one call per sequence that needs a next token. */
#ifndef SERVD_ENGINE_SAMPLING_H
#define SERVD_ENGINE_SAMPLING_H

#include "engine/engine.h"

typedef struct servd_sample_result {
  int32_t token;
  float logprob;                /* log softmax of the chosen token under the model's distribution */
  const servd_top_logprob *top; /* n_top most likely tokens (valid until the next call) */
  int n_top;
} servd_sample_result;

int servd_engine_sampling_init(servd_model *m);
void servd_engine_sampling_free(servd_model *m); /* accepts a model without sampling state */
/* Picks the next token of r from its logits row (vocab floats, read only). */
int servd_engine_sample(servd_model *m, servd_request *r, const float *logits, servd_sample_result *out);

#endif
