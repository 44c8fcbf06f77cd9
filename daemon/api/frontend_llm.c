/* Text generation for non-HTTP front ends (frontend.h): a prompt tokenized on a worker thread, as
 * /v1/completions tokenizes it, submitted to the engine, and the engine's text pieces (already
 * detokenized incrementally, stop strings applied) handed to the front end's callback on the loop.
 *
 * A generation is one engine request (a gen without an OpenAI owner), submitted with engine_cb, whose
 * events the loop hands to generation_event.
 * It lives until both sides are done with it: the front end (until the final event or a cancel) and
 * the engine (until its final event), so a cancelled request is freed when the engine lets go. */
#include "api/frontend-impl.h"
#include "api/respond.h" /* api_status_for, api_user_cause */
#include "api/route.h"   /* API_MODEL_VERSION */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "servd/status.h"

struct servd_api_generation {
  gen g; /* first: the engine's events carry &g */
  servd_api *a;
  api_model *am;
  api_generate_cb cb; /* NULL once cancelled */
  void *ud;
  char *prompt;
  size_t prompt_len;
  char lora[128]; /* the LoRA adapter the model name meant ("": none); gp.lora points here */
  int32_t *ids;
  int n_ids;
  servd_gen_params gp;
  char **stop; /* gp.stop, owned */
  int32_t *stop_ids;
  uv_work_t w;
  bool work_pending, submitted;
  int err_rc;
  char err[512];
  uint64_t t_start;
};

static void generation_free(servd_api_generation *x) {
  for (api_event *e = x->g.ev_cache, *n; e; e = n) { /* normally handed back by the final event */
    n = e->next;
    free(e->text);
    free(e);
  }
  for (int i = 0; i < x->gp.n_stop; i++) free(x->stop[i]);
  free(x->stop);
  free(x->stop_ids);
  free(x->ids);
  free(x->prompt);
  api_model_release_ref(x->a, x->am);
  free(x);
}

/* The final event to the front end (when it is still there), then x is gone. */
static void finish(servd_api_generation *x, int status, const char *message, const char *why) {
  if (x->cb) {
    servd_api_gen_event ev = {.final = true,
                              .text = "",
                              .status = status,
                              .message = message,
                              .finish_reason = why,
                              .prompt_tokens = x->g.prompt_tokens,
                              .completion_tokens = x->g.completion_tokens};
    x->cb(x->ud, &ev);
  }
  generation_free(x);
}

bool servd_api_is_language_model(servd_api *a, const char *name) {
  api_model *am = name && name[0] ? api_model_resolve(a, name, NULL) : NULL;
  return am && am->m && am->state == M_READY && a->ops->kind(am->m) == SERVD_MODEL_CAUSAL_LM;
}

void servd_api_generate_defaults(servd_api *a, const char *model, servd_gen_params *gp) {
  api_model *am = model && model[0] ? api_model_resolve(a, model, NULL) : NULL;
  if (am && am->m && am->state == M_READY && a->ops->model_gen_params_default)
    a->ops->model_gen_params_default(am->m, gp);
  else a->ops->gen_params_default(gp);
}

static void engine_cb(void *ud, const servd_event *ev);

/* ---- tokenizing on a worker thread ------------------------------------------------------------ */

static void tokenize_work(uv_work_t *w) {
  servd_api_generation *x = w->data;
  int rc = x->a->ops->tokenize(x->am->m, x->prompt, x->prompt_len, true, &x->ids, &x->n_ids);
  if (rc != 0) {
    x->err_rc = rc;
    snprintf(x->err, sizeof x->err, "the prompt cannot be tokenized: %s", api_user_cause(servd_last_error()));
  }
}

static void submit(servd_api_generation *x) {
  servd_api *a = x->a;
  api_model *am = x->am;
  char msg[768];
  if (am->state != M_READY || a->draining) {
    finish(x, 503, "the model is not available (loading, unloading or the server is draining)", NULL);
    return;
  }
  if (x->n_ids == 0) {
    finish(x, 400, "the prompt is empty after tokenization", NULL);
    return;
  }
  int ctx = a->ops->context_length(am->m);
  long long need = (long long)x->n_ids + (x->gp.max_tokens > 0 ? x->gp.max_tokens : 1);
  if (ctx > 0 && need > ctx) {
    snprintf(msg, sizeof msg,
             "This model's maximum context length is %d tokens. However, you requested %lld tokens (%d in the "
             "prompt, %d for the completion). Please reduce the prompt or max_tokens.",
             ctx, need, x->n_ids, x->gp.max_tokens > 0 ? x->gp.max_tokens : 1);
    finish(x, 400, msg, NULL);
    return;
  }
  x->g.t_submit = api_now_ns();
  int rc = a->ops->submit(am->m, x->ids, x->n_ids, &x->gp, engine_cb, &x->g, &x->g.r);
  if (rc != 0) {
    if (rc == SERVD_EBUSY)
      snprintf(msg, sizeof msg, "the server is at capacity for model '%s': queue full; retry later", am->name);
    else if (rc == SERVD_ECANCELED) snprintf(msg, sizeof msg, "model '%s' is unloading; retry later", am->name);
    else snprintf(msg, sizeof msg, "the generation could not start: %s", api_user_cause(servd_last_error()));
    finish(x, rc == SERVD_EBUSY ? 429 : rc == SERVD_ECANCELED ? 503 : api_status_for(rc), msg, NULL);
    return;
  }
  x->submitted = true;
  /* On the API's list, so that draining and unloading cancel it as they cancel HTTP's. */
  x->g.next = a->gens;
  if (a->gens) a->gens->prev = &x->g;
  a->gens = &x->g;
}

static void tokenize_after(uv_work_t *w, int status) {
  (void)status;
  servd_api_generation *x = w->data;
  x->a->works--;
  x->work_pending = false;
  if (!x->cb) generation_free(x);
  else if (x->err_rc) finish(x, api_status_for(x->err_rc), x->err, NULL);
  else submit(x);
}

/* ---- engine events ---------------------------------------------------------------------------- */

static void generation_event(servd_api *a, api_event *ev) {
  servd_api_generation *x = (servd_api_generation *)ev->g;
  gen *g = &x->g;
  api_model *am = g->am;
  if (ev->kind == SERVD_EVENT_TOKEN) {
    bool first = !g->t_first;
    double secs = (double)(ev->t_ns - (first ? x->t_start : g->t_last)) / 1e9;
    if (first) g->t_first = ev->t_ns;
    api_hist_observe(first ? &am->ttft : &am->itl, secs);
    api_vllm_token(am, first, secs);
    g->t_last = ev->t_ns;
    if (x->cb && ev->text_len) {
      servd_api_gen_event e = {.text = ev->text, .len = ev->text_len};
      x->cb(x->ud, &e);
    }
    return;
  }
  g->done = true;
  if (ev->completion_tokens > 0) g->completion_tokens = ev->completion_tokens;
  if (ev->prompt_tokens > 0) g->prompt_tokens = ev->prompt_tokens;
  double e2e = (double)(ev->t_ns - x->t_start) / 1e9;
  api_hist_observe(&am->e2e, e2e);
  api_vllm_finished(a, am, ev, e2e, x->gp.max_tokens);
  if (g->r) a->ops->release(g->r);
  g->r = NULL;
  if (g->prev) g->prev->next = g->next;
  else if (a->gens == g) a->gens = g->next;
  if (g->next) g->next->prev = g->prev;
  if (ev->kind == SERVD_EVENT_ERROR) {
    int st = ev->error_code ? api_status_for(ev->error_code) : 500;
    finish(x, st < 500 && st != 429 ? 500 : st, ev->error[0] ? ev->error : "the model failed", NULL);
  } else {
    finish(x, 200, NULL, ev->finish[0] ? ev->finish : "stop");
  }
}

/* The engine callback of a front end's generation (engine thread): queues the event for the loop,
 * which hands it to generation_event. */
static void engine_cb(void *ud, const servd_event *ev) { api_event_push(ud, ev, generation_event); }

/* ---- entry points ----------------------------------------------------------------------------- */

int servd_api_generate(servd_api *a, const char *model, const char *version, const char *prompt, size_t len,
                       const servd_gen_params *gp, api_generate_cb cb, void *ud, servd_api_generation **out, char *msg,
                       size_t cap) {
  *out = NULL;
  msg[0] = '\0';
  const char *lora = NULL;
  api_model *am = model && model[0] ? api_model_resolve(a, model, &lora) : NULL;
  if (!am || (version && version[0] && strcmp(version, API_MODEL_VERSION) != 0)) {
    snprintf(msg, cap, "model '%s' (version '%s') is not served here", model ? model : "", version ? version : "");
    return 404;
  }
  const int st = api_model_usable(a, am, msg, cap);
  if (st != 200) return st;
  if (a->ops->kind(am->m) != SERVD_MODEL_CAUSAL_LM) {
    snprintf(msg, cap, "model '%s' is not a language model", am->name);
    return 400;
  }
  servd_api_generation *x = calloc(1, sizeof *x);
  if (!x || !(x->prompt = malloc(len ? len : 1))) goto oom;
  memcpy(x->prompt, prompt, len);
  x->prompt_len = len;
  x->gp = *gp;
  x->gp.guide = NULL;
  x->gp.stop = NULL;
  x->gp.n_stop = 0;
  x->gp.stop_token_ids = NULL;
  x->gp.n_stop_token_ids = 0;
  snprintf(x->lora, sizeof x->lora, "%s", lora ? lora : "");
  x->gp.lora = x->lora[0] ? x->lora : NULL;
  if (gp->n_stop > 0) {
    if (!(x->stop = calloc((size_t)gp->n_stop, sizeof *x->stop))) goto oom;
    for (; x->gp.n_stop < gp->n_stop; x->gp.n_stop++)
      if (!(x->stop[x->gp.n_stop] = strdup(gp->stop[x->gp.n_stop]))) goto oom;
    x->gp.stop = (const char *const *)x->stop;
  }
  if (gp->n_stop_token_ids > 0) {
    if (!(x->stop_ids = malloc((size_t)gp->n_stop_token_ids * sizeof *x->stop_ids))) goto oom;
    memcpy(x->stop_ids, gp->stop_token_ids, (size_t)gp->n_stop_token_ids * sizeof *x->stop_ids);
    x->gp.stop_token_ids = x->stop_ids;
    x->gp.n_stop_token_ids = gp->n_stop_token_ids;
  }
  x->a = a;
  x->am = am;
  x->cb = cb;
  x->ud = ud;
  x->g.api = a;
  x->g.am = am;
  x->t_start = api_now_ns();
  am->inflight++;
  a->inflight++;
  x->w.data = x;
  if (uv_queue_work(a->loop, &x->w, tokenize_work, tokenize_after) != 0) {
    x->cb = NULL;
    generation_free(x);
    snprintf(msg, cap, "cannot queue work");
    return 500;
  }
  x->work_pending = true;
  a->works++;
  *out = x;
  return 0;
oom:
  if (x) {
    for (int i = 0; i < x->gp.n_stop; i++) free(x->stop[i]);
    free(x->stop);
    free(x->prompt);
    free(x);
  }
  snprintf(msg, cap, "out of memory");
  return 500;
}

void servd_api_generate_cancel(servd_api_generation *x) {
  if (!x || !x->cb) return;
  x->cb = NULL;
  /* Tokenizing: freed when the work returns. Submitted: the engine's final event frees it. */
  if (x->submitted && !x->g.done && x->g.r) x->a->ops->cancel(x->g.r);
}
