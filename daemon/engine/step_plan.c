/* The planning phase of a step (see step.h): drafts for the decoders, then the scheduler's plan as
 * rows of the step's kinds. */
#include "engine/engine_impl.h"
#include "engine/step.h"
#include "engine/engine_lora.h"

#include <stdlib.h>
#include <string.h>

#include "servd/clock.h"
#include "servd/status.h"

int step_plan_init(step_plan *p, int max_seqs) {
  memset(p, 0, sizeof *p);
  p->rows = calloc((size_t)(max_seqs > 0 ? max_seqs : 1), sizeof *p->rows);
  p->lora_groups = calloc((size_t)(max_seqs > 0 ? max_seqs : 1), sizeof *p->lora_groups);
  return p->rows && p->lora_groups ? 0 : servd_fail(SERVD_ENOMEM, "step plan of %d sequences", max_seqs);
}

void step_plan_free(step_plan *p) {
  free(p->rows);
  free(p->lora_groups);
  p->rows = NULL;
  p->lora_groups = NULL;
}

/* Drafts for the running decoders (engine/speculate.h), before the plan: the step verifies them. */
static void propose_drafts(servd_model *m) {
  if (m->spec.mode == SERVD_SPEC_OFF) return;
  servd_spec_step(&m->spec);
  int rows = 0;
  for (sched_seq *q = m->sched.running.head; q; q = q->next)
    if (!q->embed && q->n_tokens - q->n_draft - q->n_computed == 1) rows++;
  double step_ns = sched_decode_cost(&m->sched, rows), fixed_ns, token_ns;
  bool cost_known = sched_verify_cost(&m->sched, &fixed_ns, &token_ns);
  for (sched_seq *q = m->sched.running.head; q; q = q->next) {
    if (q->embed || q->n_tokens - q->n_draft - q->n_computed != 1) continue;
    servd_request *r = q->owner;
    /* Constrained rows get their mask for the first position only: they decode one token a step. */
    int room = 0;
    if (!r->guide.grammar && !r->p.prompt_only) {
      int n = q->n_tokens - q->n_draft;
      room = r->p.max_tokens - r->n_generated - 1;
      if (room > m->context_length - n - 1) room = m->context_length - n - 1;
    }
    servd_spec_propose(&m->spec, &r->spec, q, room, rows, step_ns, fixed_ns, token_ns, cost_known);
  }
}

/* Every sequence of the planned step that wants logits picks the arg max of its raw row: a GPU step
 * may then return picks (servd_forward_batch.want_picks). */
static bool all_plain_greedy(const servd_model *m) {
  for (int i = 0; i < m->sched.n_planned; i++) {
    const sched_seq *q = m->sched.planned[i];
    const servd_request *r = q->owner;
    if (q->n_rows != (q->wants_logits ? 1 : 0)) return false;
    if (q->wants_logits && !servd_sampler_plain_greedy(r->sampler)) return false;
  }
  return !m->sched.embed_step;
}

static step_row_kind row_kind(const sched_seq *q) {
  if (q->embed) return STEP_ROW_EMBED;
  if (q->n_draft > 0) return STEP_ROW_VERIFY;
  return q->n_tokens - q->n_computed == 1 ? STEP_ROW_DECODE : STEP_ROW_PREFILL;
}

void step_plan_make(servd_model *m, step_plan *p) {
  servd_scheduler *s = &m->sched;
  propose_drafts(m);
  int n = sched_plan(s);
  p->t_plan_ns = servd_now_ns();
  p->starved = s->starved;
  p->n_starved = s->n_starved;
  p->error = n < 0 ? n : 0;
  if (n < 0) snprintf(p->error_message, sizeof p->error_message, "%s", servd_last_error());
  p->n_tokens = n > 0 ? n : 0;
  p->n_rows = 0;
  for (int i = 0, out = 0; i < s->n_planned; i++) {
    sched_seq *q = s->planned[i];
    p->rows[p->n_rows++] = (step_row){.seq = q,
                                      .kind = row_kind(q),
                                      .chunk = q->chunk,
                                      .first = out,
                                      .n = q->n_rows,
                                      .n_draft = q->n_draft,
                                      .sample = q->wants_logits};
    out += q->n_rows;
    servd_request *r = q->owner;
    if (n > 0 && !r->t_scheduled_ns) r->t_scheduled_ns = p->t_plan_ns;
  }
  if (n <= 0) return;
  servd_forward_batch *b = &p->batch;
  memset(b, 0, sizeof *b);
  servd_step_arrays_point(&s->step, b, n, s->n_logit_rows, s->n_planned);
  b->want_picks = m->gpus > 0 && all_plain_greedy(m);
  b->want_hidden = s->embed_step;
  b->want_scores = s->embed_step && m->emb.n_labels > 0; /* a cross-encoder computes only scores */
  servd__plan_lora_groups(m, p->lora_groups, b);
}
