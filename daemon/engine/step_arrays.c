/* Host arrays of one forward step: see step_arrays.h. */
#include "engine/step_arrays.h"

#include <stdlib.h>
#include <string.h>

#include "servd/status.h"

int servd_step_arrays_init(servd_step_arrays *a, int max_tokens, int max_seqs, const char *what) {
  memset(a, 0, sizeof *a);
  if (max_tokens < 1 || max_seqs < 1)
    return servd_fail(SERVD_EINVAL, "%s: step arrays for %d tokens, %d sequences: expected both >= 1", what, max_tokens,
                      max_seqs);
  a->max_tokens = max_tokens;
  a->max_seqs = max_seqs;
  size_t t = (size_t)max_tokens, n = (size_t)max_seqs;
  int32_t **per_token[] = {&a->tokens, &a->positions, &a->slots, &a->logit_rows, &a->token_types};
  int32_t **per_seq[] = {&a->q_start, &a->q_len, &a->kv_len};
  for (size_t i = 0; i < sizeof per_token / sizeof *per_token; i++)
    if (!(*per_token[i] = calloc(t, sizeof(int32_t)))) goto fail;
  for (size_t i = 0; i < sizeof per_seq / sizeof *per_seq; i++)
    if (!(*per_seq[i] = calloc(n, sizeof(int32_t)))) goto fail;
  if (!(a->block_tables = calloc(n, sizeof *a->block_tables))) goto fail;
  return 0;
fail:
  servd_step_arrays_free(a);
  return servd_fail(SERVD_ENOMEM, "%s: step arrays for %d tokens, %d sequences", what, max_tokens, max_seqs);
}

void servd_step_arrays_free(servd_step_arrays *a) {
  if (!a) return;
  free(a->tokens);
  free(a->positions);
  free(a->slots);
  free(a->logit_rows);
  free(a->token_types);
  free(a->q_start);
  free(a->q_len);
  free(a->kv_len);
  free(a->block_tables);
  memset(a, 0, sizeof *a);
}

servd_attn_batch servd_step_arrays_attn(const servd_step_arrays *a, int n_seqs) {
  return (servd_attn_batch){.n_seqs = n_seqs,
                            .q_start = a->q_start,
                            .q_len = a->q_len,
                            .kv_len = a->kv_len,
                            .block_tables = a->block_tables};
}

void servd_step_arrays_point(const servd_step_arrays *a, servd_forward_batch *b, int n_tokens, int n_logit_rows,
                             int n_seqs) {
  b->n_tokens = n_tokens;
  b->tokens = a->tokens;
  b->positions = a->positions;
  b->slots = a->slots;
  b->token_types = a->token_types;
  b->n_logit_rows = n_logit_rows;
  b->logit_rows = a->logit_rows;
  b->attn = servd_step_arrays_attn(a, n_seqs);
}
