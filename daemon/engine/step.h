/* One engine step as three phases passing values (internal to the engine), the shape of vLLM's v1
 * engine (schedule() -> SchedulerOutput, the runner -> ModelRunnerOutput, update_from_output()):
 *
 *   step_plan_make   (step_plan.c)   drafts for the decoders, then the scheduler's plan as rows: which
 *                                    sequence, what kind of work, which rows of the output are its
 *   step_run         (step_run.c)    the forward over every rank (model_runner), checked -> step_result
 *   step_update      (step_update.c) the result applied: tokens sampled and accepted, stop checks,
 *                                    detokenization, events, the blocks of rejected drafts given back
 *
 * engine.c's scheduler thread is the loop that calls them. A new kind of row (e.g. a LoRA adapter
 * group) is a step_row_kind, the plan's rows of that kind, what the runner does with them and how the
 * update applies their output rows.
 */
#ifndef SERVD_ENGINE_STEP_H
#define SERVD_ENGINE_STEP_H

#include <stdbool.h>
#include <stdint.h>

#include "engine/scheduler.h"
#include "engine/types.h"
#include "servd/interp.h"

typedef enum step_row_kind {
  STEP_ROW_PREFILL, /* a chunk of the prompt (or of a preempted sequence's tokens) */
  STEP_ROW_DECODE,  /* one token: its logits sample the next */
  STEP_ROW_VERIFY,  /* the last token and n_draft drafts: a row each, sampled in turn (speculate.h) */
  STEP_ROW_EMBED,   /* a chunk of an embedding's input: hidden rows pooled */
} step_row_kind;

typedef struct step_row {
  sched_seq *seq; /* borrowed from the scheduler */
  step_row_kind kind;
  int chunk;    /* tokens computed */
  int first, n; /* its rows of the output: [first, first + n) */
  int n_draft;  /* STEP_ROW_VERIFY */
  bool sample;  /* the chunk reaches the last token: the last row samples the next (PREFILL, DECODE) */
} step_row;

typedef struct step_plan {
  step_row *rows; /* in batch order; capacity: the scheduler's max_seqs */
  int n_rows;
  int n_tokens;              /* tokens computed (0: nothing to run) */
  servd_forward_batch batch; /* the runner's input; arrays borrowed from the scheduler */
  sched_seq **starved;       /* can never fit the cache: the update fails them (borrowed) */
  int n_starved;
  int error; /* planning failed (SERVD_E*): the update fails the rows */
  char error_message[512];
  int64_t t_plan_ns;             /* servd_now_ns() when planned */
  servd_lora_group *lora_groups; /* batch.lora's storage; capacity: max_seqs */
} step_plan;

typedef struct step_result {
  int rc;              /* 0, or the step failed: every row's request ends with code and message */
  int code;            /* SERVD_E* the requests end with */
  char message[1400];  /* "Type (rank r): message" */
  char error_type[64]; /* the Python exception's type of a SERVD_EMODEL failure; "": the code's default */
  servd_tensor *out;   /* f32 (rows, vocab) logits, (rows, dim) hidden states, or i32 (rows, 2) picks; owned */
  bool picked;         /* out holds each row's (token, logit) arg max (GPU steps of plain greedy rows) */
  int64_t t_start_ns;  /* servd_now_ns() when the forward began */
} step_result;

int step_plan_init(step_plan *p, int max_seqs);
void step_plan_free(step_plan *p); /* accepts a zeroed struct */

/* Proposes drafts for the decoders, then plans the step. */
void step_plan_make(servd_model *m, step_plan *p);
/* Runs the plan's forward (p->n_tokens > 0); *r is filled, r->out owned by the caller (release it). */
void step_run(servd_model *m, const step_plan *p, step_result *r);
/* Applies r to the plan's requests: the starved and a failed step's end with an error; else every
 * row's output is taken. Then the step's cost is learned. Releases r->out. */
void step_update(servd_model *m, step_plan *p, step_result *r);

#endif
