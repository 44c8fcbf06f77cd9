/* Host arrays of one forward step (internal to the engine): the per-token and per-sequence inputs a
 * servd_forward_batch points at. The scheduler's plan, the GPU warm-up steps and the padded decode
 * steps of CUDA graphs each hold one set, allocated once at their capacities so that no step
 * allocates. */
#ifndef SERVD_ENGINE_STEP_ARRAYS_H
#define SERVD_ENGINE_STEP_ARRAYS_H

#include <stdint.h>

#include "servd/interp.h"

typedef struct servd_step_arrays {
  int max_tokens, max_seqs;
  /* Owned; zeroed at init. */
  int32_t *tokens, *positions, *slots, *logit_rows; /* (max_tokens) */
  int32_t *token_types;                             /* (max_tokens); zeros where nothing sets them */
  int32_t *q_start, *q_len, *kv_len;                /* (max_seqs) */
  const int32_t **block_tables;                     /* (max_seqs); the tables themselves are borrowed */
} servd_step_arrays;

/* Allocates every array zeroed, at max_tokens and max_seqs (both >= 1, else SERVD_EINVAL). `what`
 * names the owner in the error message. On failure *a is zeroed. */
int servd_step_arrays_init(servd_step_arrays *a, int max_tokens, int max_seqs, const char *what);
void servd_step_arrays_free(servd_step_arrays *a); /* accepts NULL and a zeroed struct */

/* The attention layout of the first n_seqs sequences (points into a). */
servd_attn_batch servd_step_arrays_attn(const servd_step_arrays *a, int n_seqs);
/* Points b's step fields (tokens, positions, slots, token types, logit rows, attention layout) at a, with the
 * given counts; b's other fields (kv, dbatch, dkv, capacities) are left as they are. */
void servd_step_arrays_point(const servd_step_arrays *a, servd_forward_batch *b, int n_tokens, int n_logit_rows,
                             int n_seqs);

#endif
