/* Constrained decoding in the engine (internal): a request with a grammar (servd_gen_params.guide)
 * gets a masked sampler. A row's mask for a step depends only on the tokens it generated before
 * that step, so it is computed while the step's forward runs, as vLLM overlaps it with the GPU: just
 * before the forward, one call into the model's Python hooks (models/llama/guided.py, llguidance)
 * is handed to the guide worker, a thread of its own on the interpreter that renders chat
 * templates. It feeds every constrained row the tokens it generated since the last step and writes
 * each row's next allowed-token bitmask into its sampler. After the forward the scheduler collects
 * the results; it waits only for what the forward did not cover. A grammar never blocks another
 * model, and the forward ranks never wait for it.
 *
 * One thread, rows one after another: the forward already keeps every core of the compute pool
 * busy, so more mask threads only take cores from it. llguidance's parallel executor (rayon) was
 * measured on 2 cores at 32 constrained streams: 0.80-0.92x of free decoding where the single
 * worker gave 0.99x (regex), and 0.73-0.81x against 0.84-0.94x (JSON strings of at most 12
 * characters, ~0.3 ms a mask).
 *
 * Why one batched call per step: a call into an interpreter costs ~20 us of JSON and thread-state
 * switching; the masks themselves are computed by llguidance with the GIL dropped.
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
/* Ends the guide worker (before the interpreters finalize); accepts NULL. */
void servd_guides_stop(servd_guides *g);
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

/* Before the step's forward: starts computing the masks of every planned running request with a
 * grammar that wants logits. */
void servd_guides_begin(servd_model *m);
/* After the forward, before any row samples or finishes: waits for those masks and fills each row's
 * sampler mask (status 0), or says why it must end (1: the grammar is complete, finish "stop";
 * 2: error). Never finishes requests itself. A no-op when nothing was begun. */
void servd_guides_collect(servd_model *m);
/* The request ended: its matcher is freed at the next prepare or flush. */
void servd_guide_end(servd_model *m, servd_request *r);
/* Frees the matchers of ended requests (a no-op when none). */
void servd_guides_flush(servd_model *m);
/* Counters for the model's stats. */
/* mask_seconds: the worker's time in the grammar engine; wait_seconds: the part the steps waited for. */
void servd_guides_stats(const servd_guides *g, uint64_t *rows, double *mask_seconds, double *wait_seconds, int *live);

#endif
