/* A request's lifecycle: see request.h. */
#include "engine/request.h"

#include <stdlib.h>
#include <string.h>

#include "servd/clock.h"

void request_unref(servd_request *r) {
  if (atomic_fetch_sub(&r->refs, 1) != 1) return;
  for (int i = 0; i < r->p.n_stop; i++) free(r->stop_copy ? r->stop_copy[i] : NULL);
  free(r->stop_copy);
  free(r->stop_ids_copy);
  free(r->seq.tokens);
  sched_seq_free(&r->seq);
  servd_detok_free(r->detok);
  servd_stop_matcher_free(r->stopper);
  servd_sampler_free(r->sampler);
  free(r->guide.grammar);
  free(r->pool.sum);
  free(r->embedding);
  if (r->lora) lora_release(&r->m->loras, r->lora);
  pthread_mutex_destroy(&r->cb_mu);
  free(r);
}

void request_deliver(servd_request *r, const servd_event *ev) {
  pthread_mutex_lock(&r->cb_mu);
  bool final = ev->kind == SERVD_EVENT_DONE || ev->kind == SERVD_EVENT_ERROR;
  if (!r->released && !r->finished) r->cb(r->ud, ev);
  if (final) r->finished = true;
  pthread_mutex_unlock(&r->cb_mu);
}

static double secs_between(int64_t from, int64_t to) { return from && to > from ? (double)(to - from) / 1e9 : 0.0; }

/* vLLM's request phases, for /metrics: a request ending before its first step (cancelled, deadline)
 * spent all its time queued. */
static void phase_times(const servd_request *r, servd_event *ev) {
  int64_t now = servd_now_ns();
  ev->queue_s = secs_between(r->t_queued_ns, r->t_scheduled_ns ? r->t_scheduled_ns : now);
  ev->prefill_s = secs_between(r->t_scheduled_ns, r->t_first_ns ? r->t_first_ns : now);
  ev->decode_s = secs_between(r->t_first_ns, r->t_last_ns);
}

void request_finish_ex(servd_model *m, servd_request *r, const char *reason, int error_code, const char *msg,
                       const char *error_type, bool flush) {
  if (flush && !error_code) {
    const char *t1 = "", *t2 = "";
    size_t l1 = 0, l2 = 0;
    bool stopped = false;
    if (r->detok && servd_detok_flush(r->detok, &t1, &l1) == 0 && l1)
      servd_stop_matcher_push(r->stopper, t1, l1, &t1, &l1, &stopped);
    else l1 = 0;
    if (!stopped && servd_stop_matcher_flush(r->stopper, &t2, &l2) == 0 && (l1 || l2)) {
      /* Two pieces at most: send them as one delta. */
      servd_event ev = {.kind = SERVD_EVENT_TOKEN,
                        .token = -1,
                        .prompt_tokens = r->n_prompt,
                        .cached_tokens = r->seq.n_cached,
                        .completion_tokens = r->n_generated};
      if (l1) {
        ev.text = t1;
        ev.text_len = l1;
        request_deliver(r, &ev);
      }
      if (l2) {
        ev.text = t2;
        ev.text_len = l2;
        request_deliver(r, &ev);
      }
    }
  }
  servd_event ev = {.kind = error_code ? SERVD_EVENT_ERROR : SERVD_EVENT_DONE,
                    .text = "",
                    .finish_reason = reason,
                    .prompt_tokens = r->n_prompt,
                    .cached_tokens = r->seq.n_cached,
                    .completion_tokens = r->n_generated,
                    .error_code = error_code,
                    .error_message = msg,
                    .token = -1,
                    .error_type = error_type};
  if (!error_code && r->embedding) {
    ev.embedding = r->embedding;
    ev.n_embedding = r->n_embedding;
  }
  phase_times(r, &ev);
  sched_remove(&m->sched, &r->seq);
  if (!error_code && !r->seq.embed && r->n_generated > 0) servd_spec_remember(&m->spec, r->seq.tokens, r->seq.n_tokens);
  servd_guide_end(m, r);
  /* Stats first: whoever sees the final event sees the freed blocks and counts. */
  pthread_mutex_lock(&m->mu);
  m->n_running = m->sched.running.n;
  m->n_waiting = m->sched.waiting.n;
  m->kv_used = sched_used_blocks(&m->sched);
  pthread_mutex_unlock(&m->mu);
  request_deliver(r, &ev);
  request_unref(r);
}

void request_finish(servd_model *m, servd_request *r, const char *reason, int error_code, const char *msg) {
  request_finish_ex(m, r, reason, error_code, msg, NULL,
                    strcmp(reason, "length") == 0 || strcmp(reason, "deadline") == 0);
}
