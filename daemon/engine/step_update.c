/* The update phase of a step (see step.h): each row's output applied to its request. A sampled token
 * is accepted, detokenized, matched against the stop strings and streamed; a verify row's rows are
 * sampled in turn while they agree with the drafts (speculate.h); embeddings pool their hidden rows;
 * prompt logprobs are read off prefill rows. */
#include "engine/engine_impl.h"
#include "engine/step.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "engine/request.h"
#include "servd/clock.h"
#include "servd/status.h"

static void emit(servd_model *m, servd_request *r, const servd_sampled *s);

/* After the step that produced logits row `row` for r: sample, stream, check the end. */
static void advance(servd_model *m, servd_request *r, const float *row) {
  servd_sampled s;
  if (r->guide.grammar && r->guide.status == 1) { /* the grammar is complete: the text is too */
    request_finish_ex(m, r, "stop", 0, NULL, NULL, true);
    return;
  }
  if (r->guide.grammar && r->guide.status) {
    request_finish_ex(m, r, "error", SERVD_EMODEL, r->guide.error, NULL, false);
    return;
  }
  int rc = servd_sampler_sample(r->sampler, row, &s);
  if (rc) {
    request_finish(m, r, "error", rc, servd_last_error());
    return;
  }
  emit(m, r, &s);
}

/* A plain-greedy request's token from the device's top-1 of its row (token, logit): what
 * servd_sampler_sample picks from the whole row (no logit above -inf: token 0, its first index). */
static void advance_pick(servd_model *m, servd_request *r, int32_t token, float logit) {
  servd_sampled s = {.token = logit > -INFINITY ? token : 0};
  emit(m, r, &s);
}

/* The request takes token s->token: accept, detokenize, stop strings, deliver, finish. */
static void emit(servd_model *m, servd_request *r, const servd_sampled *sp) {
  const servd_sampled s = *sp;
  int rc;
  int32_t t = s.token;
  servd_sampler_accept(r->sampler, t);
  servd_finish fin = servd_sampler_finish(r->sampler, t);
  r->seq.tokens[r->seq.n_tokens++] = t;
  r->n_generated++;
  r->t_last_ns = servd_now_ns();
  if (!r->t_first_ns) r->t_first_ns = r->t_last_ns;
  pthread_mutex_lock(&m->mu);
  m->generation_tokens++;
  pthread_mutex_unlock(&m->mu);

  /* An end-of-sequence or stop token ends the text without adding its own. */
  bool stop_tok = fin == SERVD_FINISH_EOS || fin == SERVD_FINISH_STOP_TOKEN;
  const char *text = "";
  size_t len = 0;
  bool stopped = false;
  if (!stop_tok) {
    const char *d;
    size_t dl;
    if ((rc = servd_detok_push(r->detok, t, &d, &dl)) == 0 && r->n_generated <= r->p.min_tokens) {
      text = d; /* stop strings count only after min_tokens (vLLM): the matcher has held nothing yet */
      len = dl;
    } else if (rc == 0) {
      rc = servd_stop_matcher_push(r->stopper, d, dl, &text, &len, &stopped);
    }
    if (rc) {
      request_finish(m, r, "error", rc, servd_last_error());
      return;
    }
  }
  servd_event ev = {.kind = SERVD_EVENT_TOKEN,
                    .text = text,
                    .text_len = len,
                    .token = t,
                    .logprob = s.logprob,
                    .top = s.top,
                    .n_top = s.n_top,
                    .prompt_tokens = r->n_prompt,
                    .cached_tokens = r->seq.n_cached,
                    .completion_tokens = r->n_generated};
  request_deliver(r, &ev);

  if (stopped) request_finish_ex(m, r, "stop", 0, NULL, NULL, false);
  else if (stop_tok) request_finish_ex(m, r, "stop", 0, NULL, NULL, true); /* end of sequence: release what was held */
  else if (fin == SERVD_FINISH_LENGTH || r->n_generated >= r->p.max_tokens || r->seq.n_tokens >= m->context_length)
    request_finish(m, r, "length", 0, NULL);
}

/* A verify row's logits rows first.. (its last token's, then each draft's): row i is sampled as a
 * plain decode step would; the next row counts while the token equals the draft (speculate.h). The
 * rejected drafts' K/V goes back to the block manager. */
static void verify_rows(servd_model *m, sched_seq *q, const servd_tensor *logits, int first) {
  servd_request *r = q->owner;
  int n_draft = q->n_draft, accepted = 0;
  int n_kv = q->n_computed - n_draft; /* the last real token's K/V and those before it */
  q->n_tokens -= n_draft;
  q->n_draft = 0;
  atomic_fetch_add(&r->refs, 1); /* r outlives a finish in the loop */
  for (int i = 0; i <= n_draft; i++) {
    sched_register_final(&m->sched, q, n_kv); /* the request may end at this token */
    advance(m, r, (const float *)((const char *)servd_tensor_data(logits) + (int64_t)(first + i) * logits->strides[0]));
    if (q->state != SCHED_RUNNING || i == n_draft || q->tokens[q->n_tokens - 1] != r->spec.draft[i]) break;
    accepted++;
    n_kv++;
  }
  r->spec.n_draft = n_draft; /* the plan may have cut some */
  pthread_mutex_lock(&m->mu);
  servd_spec_observe(&m->spec, &r->spec, accepted);
  pthread_mutex_unlock(&m->mu);
  sched_truncate(&m->sched, q, n_kv);
  request_unref(r);
}

/* An embedding's rows of this step: pooled; once its prompt is done, the vector and the end. */
static void embed_rows(servd_model *m, servd_request *r, const servd_tensor *hidden, int row, int n_rows) {
  const sched_seq *q = &r->seq;
  /* A row from the prompt's start begins the sum (again, after a preemption); last-token and CLS
   * pooling take one row. */
  if (n_rows > 0 && (q->rows != SCHED_ROWS_ALL || q->row_pos == 0)) servd_pool_sum_reset(&r->pool);
  for (int j = 0; j < n_rows; j++)
    servd_pool_sum_add(
        &r->pool, (const float *)((const char *)servd_tensor_data(hidden) + (int64_t)(row + j) * hidden->strides[0]));
  if (!q->wants_logits) return;
  r->n_embedding = r->p.dimensions > 0 && r->p.dimensions < r->pool.dim ? r->p.dimensions : r->pool.dim;
  r->embedding = malloc(sizeof(float) * (size_t)r->pool.dim);
  if (!r->embedding) {
    request_finish(m, r, "error", SERVD_ENOMEM, "embedding: out of memory");
    return;
  }
  if (r->p.score) servd_scores_finish(r->pool.sum, r->pool.dim, m->emb.activation, r->embedding); /* one row */
  else servd_pool_sum_finish(&r->pool, r->n_embedding, r->embedding);
  r->t_first_ns = r->t_last_ns = servd_now_ns();
  request_finish_ex(m, r, "stop", 0, NULL, NULL, false);
}

/* Prompt logprobs: row j holds the logits after position row_pos + j, which score the prompt token
 * that follows it. Positions reported before (a preempted request computes them again) are not. */
static void prompt_rows(servd_model *m, servd_request *r, const servd_tensor *logits, int row, int n_rows) {
  const sched_seq *q = &r->seq;
  int n_top = r->p.logprobs > 0 ? r->p.logprobs : 0;
  for (int j = 0; j < n_rows; j++) {
    int target = q->row_pos + j + 1;
    if (target >= r->n_prompt) break;
    if (target < r->lp_next) continue;
    const float *lr =
        (const float *)((const char *)servd_tensor_data(logits) + (int64_t)(row + j) * logits->strides[0]);
    servd_event ev = {.kind = SERVD_EVENT_PROMPT_TOKEN,
                      .text = "",
                      .token = q->tokens[target],
                      .top = m->lp_top,
                      .n_top = n_top,
                      .prompt_tokens = r->n_prompt};
    ev.logprob = servd_row_logprob(lr, m->vocab, ev.token, n_top, m->lp_top);
    request_deliver(r, &ev);
    r->lp_next = target + 1;
  }
}

/* A decode or the last chunk of a prompt: its last row samples the next token. */
static void sample_row(servd_model *m, servd_request *r, const step_row *w, const step_result *res) {
  const char *lr = (const char *)servd_tensor_data(res->out) + (int64_t)(w->first + w->n - 1) * res->out->strides[0];
  if (res->picked) {
    float logit;
    memcpy(&logit, lr + sizeof(int32_t), sizeof logit);
    advance_pick(m, r, *(const int32_t *)lr, logit);
  } else {
    advance(m, r, (const float *)lr);
  }
}

void step_update(servd_model *m, step_plan *p, step_result *res) {
  for (int i = 0; i < p->n_starved; i++)
    request_finish(m, p->starved[i]->owner, "error", SERVD_EBUSY,
                   "the KV cache is too small for this request's prompt and max_tokens");
  if (p->error) {
    /* A planning failure is a bug or exhausted memory: fail what was planned and go on. */
    for (int i = 0; i < p->n_rows; i++) request_finish(m, p->rows[i].seq->owner, "error", p->error, p->error_message);
    return;
  }
  if (p->n_tokens == 0) return;
  if (res->rc) {
    for (int i = 0; i < p->n_rows; i++)
      request_finish_ex(m, p->rows[i].seq->owner, "error", res->code, res->message,
                        res->error_type[0] ? res->error_type : NULL, false);
  } else {
    sched_commit(&m->sched);
    for (int i = 0; i < p->n_rows; i++) {
      const step_row *w = &p->rows[i];
      sched_seq *q = w->seq;
      if (q->state != SCHED_RUNNING) continue;
      servd_request *r = q->owner;
      if (w->kind == STEP_ROW_EMBED) { /* a chunk may have no row of its own (CLS pooling past position 0) */
        embed_rows(m, r, res->out, w->first, w->n);
        continue;
      }
      if (w->n == 0) continue;
      if (r->p.prompt_logprobs) prompt_rows(m, r, res->out, w->first, w->n);
      if (!w->sample) continue;
      if (r->p.prompt_only) {
        request_finish(m, r, "length", 0, NULL);
        continue;
      }
      if (w->kind == STEP_ROW_VERIFY && !res->picked) verify_rows(m, q, res->out, w->first);
      else sample_row(m, r, w, res);
    }
    if (res->picked) {
      pthread_mutex_lock(&m->mu);
      m->pick_steps++;
      pthread_mutex_unlock(&m->mu);
    }
    /* What a decode waited for: the forward and the sampling, the cost the next plans bound. */
    sched_observe(&m->sched, servd_now_ns() - res->t_start_ns);
  }
  servd_tensor_release(res->out);
  res->out = NULL;
  pthread_mutex_lock(&m->mu);
  m->steps++;
  m->last_progress_ns = servd_now_ns();
  pthread_mutex_unlock(&m->mu);
}
