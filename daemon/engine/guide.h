/* Constrained decoding in the engine (internal): a request with a grammar (servd_gen_params.guide)
 * gets a masked sampler; before each step's sampling, one call into the model's Python hooks
 * (models/llama/guided.py, llguidance) feeds every constrained row the tokens it generated since the
 * last step and writes its next allowed-token bitmask straight into that row's sampler mask. All of
 * it runs on the scheduler thread, on the interpreter that renders chat templates, so the forward
 * ranks never wait for it and a grammar never blocks another model.
 *
 * Why one batched call per step: a call into an interpreter costs ~20 us of JSON and thread-state
 * switching; the mask itself is computed by llguidance with the GIL dropped.
 */
#ifndef SERVD_ENGINE_GUIDE_H
#define SERVD_ENGINE_GUIDE_H

#include <stdbool.h>
#include <stdint.h>

typedef struct servd_model servd_model;
typedef struct servd_request servd_request;

/* Per model: sequences to free, counters. Created at load (causal-lm). */
typedef struct servd_guides servd_guides;
int servd_guides_create(servd_guides **out);
void servd_guides_free(servd_guides *g); /* accepts NULL */

/* Per request: its grammar (copied at submit) and how far its matcher has been fed. */
typedef struct servd_guide_seq {
  char *grammar; /* malloc'd llguidance grammar; NULL: unconstrained */
  uint64_t id;   /* the matcher's key in the interpreter */
  int fed;       /* generated tokens the matcher has consumed */
  bool started;  /* the matcher exists in the interpreter */
  int status;    /* of the last prepare: 0 mask ready, 1 grammar complete, 2 error */
  char error[512];
} servd_guide_seq;

/* Before sampling the step's rows: for every planned running request with a grammar that wants
 * logits, fills its sampler's mask (status 0), or says why it must end (1: the grammar is complete,
 * finish "stop"; 2: error). Never finishes requests itself. */
void servd_guides_prepare(servd_model *m);
/* The request ended: its matcher is freed at the next prepare or flush. */
void servd_guide_end(servd_model *m, servd_request *r);
/* Frees the matchers of ended requests (a no-op when none). */
void servd_guides_flush(servd_model *m);
/* Counters for the model's stats. */
void servd_guides_stats(const servd_guides *g, uint64_t *rows, double *mask_seconds, int *live);

#endif
