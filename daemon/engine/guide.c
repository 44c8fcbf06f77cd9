/* Constrained decoding in the engine: see guide.h. */
#include "engine/guide.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine_impl.h"
#include "engine/model_error.h"

struct servd_guides {
  uint64_t next_id;
  uint64_t *ended; /* ids of started matchers whose requests ended */
  int n_ended, cap_ended;
  int live; /* matchers started and not yet freed (scheduler thread only) */
  /* read by get_stats on other threads */
  _Atomic uint64_t rows;
  _Atomic uint64_t mask_ns;
  _Atomic int live_pub;
};

int servd_guides_create(servd_guides **out) {
  *out = calloc(1, sizeof **out);
  return *out ? 0 : servd_fail(SERVD_ENOMEM, "guided decoding: out of memory");
}

void servd_guides_free(servd_guides *g) {
  if (!g) return;
  free(g->ended);
  free(g);
}

void servd_guides_stats(const servd_guides *g, uint64_t *rows, double *mask_seconds, int *live) {
  *rows = g ? atomic_load(&g->rows) : 0;
  *mask_seconds = g ? (double)atomic_load(&g->mask_ns) / 1e9 : 0;
  *live = g ? atomic_load(&g->live_pub) : 0;
}

/* ---- compiling a request's constraint (on the interpreter thread, like chat templates) ---------- */

typedef struct compile_job {
  servd_model *m;
  json_t *args, *res;
  servd_py_error err;
} compile_job;

static int compile_run(void *arg) {
  compile_job *j = arg;
  return servd_interp_call_json(servd_pool_get(j->m->pool, j->m->chat_interp), "guide_compile", j->args, &j->res, 30000,
                                &j->err);
}

int servd_model_guide_compile(servd_model *m, servd_guide_kind kind, const char *spec, char **grammar) {
  *grammar = NULL;
  if (m->kind != SERVD_MODEL_CAUSAL_LM || m->chat_interp < 0 || !m->ithread || !m->guides)
    return servd_fail(SERVD_EUNSUPPORTED, "guided decoding: model %s is not a language model", m->name);
  if (kind <= SERVD_GUIDE_NONE || kind > SERVD_GUIDE_TOOLS || !spec)
    return servd_fail(SERVD_EINVAL, "guided decoding: no constraint");
  json_t *eos = json_array();
  for (int i = 0; i < m->n_eos; i++) json_array_append_new(eos, json_integer(m->eos[i]));
  compile_job j = {.m = m, .args = json_pack("[i, s, i, o]", (int)kind, spec, m->vocab, eos)};
  if (!j.args) return servd_fail(SERVD_ENOMEM, "guided decoding: arguments");
  memset(&j.err, 0, sizeof j.err);
  int rc = servd_interp_thread_run(m->ithread, compile_run, &j);
  json_decref(j.args);
  if (rc) {
    json_decref(j.res);
    /* A package packed before these hooks existed: the request asks for what this model lacks. */
    if (!strcmp(j.err.type, "AttributeError") && strstr(j.err.message, "guide_compile"))
      return servd_fail(SERVD_EUNSUPPORTED,
                        "guided decoding: the package of model %s has no guided decoding "
                        "hooks (repack it with this servd's model code)",
                        m->name);
    int code = servd_model_error_code(rc, &j.err, SERVD_CALL_TEMPLATE, NULL);
    if (!j.err.type[0]) {
      char msg[512];
      snprintf(msg, sizeof msg, "%s", servd_last_error());
      return servd_fail(code, "guided decoding: %s", msg);
    }
    if (code == SERVD_EINVAL) return servd_fail(code, "guided decoding: %s", j.err.message);
    return servd_fail(code, "guided decoding: %s: %s", j.err.type, j.err.message);
  }
  if (!json_is_string(j.res)) {
    json_decref(j.res);
    return servd_fail(SERVD_EFORMAT, "guided decoding: guide_compile() returned a non-string");
  }
  *grammar = strdup(json_string_value(j.res));
  json_decref(j.res);
  return *grammar ? 0 : servd_fail(SERVD_ENOMEM, "guided decoding: grammar");
}

/* ---- per step (scheduler thread) --------------------------------------------------------------- */

static json_t *ended_ids(servd_guides *g) {
  json_t *a = json_array();
  for (int i = 0; i < g->n_ended; i++) json_array_append_new(a, json_integer((json_int_t)g->ended[i]));
  return a;
}

/* After a call that took the ended ids: they are gone in the interpreter. */
static void ended_done(servd_guides *g) {
  g->live -= g->n_ended;
  g->n_ended = 0;
  atomic_store(&g->live_pub, g->live);
}

static void fail_rows(servd_request **rows, int n, const char *fmt, const char *a, const char *b) {
  for (int i = 0; i < n; i++) {
    rows[i]->guide.status = 2;
    snprintf(rows[i]->guide.error, sizeof rows[i]->guide.error, fmt, a, b);
  }
}

void servd_guides_prepare(servd_model *m) {
  servd_guides *g = m->guides;
  if (!g) return;
  servd_request *stack[64], **rows = stack;
  int n = 0;
  if (m->sched.n_planned > 64 && !(rows = malloc((size_t)m->sched.n_planned * sizeof *rows))) rows = stack;
  int cap = rows == stack ? 64 : m->sched.n_planned;
  for (int i = 0; i < m->sched.n_planned && n < cap; i++) {
    sched_seq *q = m->sched.planned[i];
    servd_request *r = q->owner;
    if (q->wants_logits && q->state == SCHED_RUNNING && r->guide.grammar) rows[n++] = r;
  }
  if (!n) goto out;
  int64_t t0 = servd_now_ns();
  json_t *jrows = json_array();
  for (int i = 0; i < n; i++) {
    servd_request *r = rows[i];
    servd_guide_seq *gs = &r->guide;
    if (!gs->started) gs->id = ++g->next_id;
    json_t *toks = json_array();
    int gen = r->seq.n_tokens - r->n_prompt;
    for (int k = gs->fed; k < gen; k++) json_array_append_new(toks, json_integer(r->seq.tokens[r->n_prompt + k]));
    int nw;
    uint32_t *mask = servd_sampler_mask(r->sampler, &nw);
    json_array_append_new(jrows, json_pack("[I, o, o, I, i]", (json_int_t)gs->id,
                                           gs->started ? json_null() : json_string(gs->grammar), toks,
                                           (json_int_t)(uintptr_t)mask, nw * 4));
  }
  json_t *args = json_pack("[o, o]", jrows, ended_ids(g));
  json_t *res = NULL;
  servd_py_error err;
  memset(&err, 0, sizeof err);
  int rc = args ? servd_interp_call_json(servd_pool_get(m->pool, m->chat_interp), "guide_step", args, &res, 10000, &err)
                : servd_fail(SERVD_ENOMEM, "guided decoding: arguments");
  json_decref(args);
  if (rc) {
    /* Which matchers exist is unknown now: the rows fail, and their ids are freed with them. */
    if (err.type[0]) fail_rows(rows, n, "guided decoding: %.60s: %.400s", err.type, err.message);
    else fail_rows(rows, n, "guided decoding: %.400s%s", servd_last_error(), "");
    for (int i = 0; i < n; i++) rows[i]->guide.started = true;
    g->live += n;
    goto done;
  }
  ended_done(g);
  for (int i = 0; i < n; i++) {
    servd_request *r = rows[i];
    servd_guide_seq *gs = &r->guide;
    json_t *e = json_array_get(res, (size_t)i);
    if (!gs->started) g->live++;
    gs->started = true;
    gs->fed = r->seq.n_tokens - r->n_prompt;
    json_t *st = json_array_get(e, 0);
    gs->status = json_is_integer(st) ? (int)json_integer_value(st) : 2;
    if (gs->status == 0) servd_sampler_mask_ready(r->sampler);
    else if (gs->status == 2) {
      const char *msg = json_string_value(json_array_get(e, 1));
      snprintf(gs->error, sizeof gs->error, "guided decoding: %.480s",
               msg && *msg ? msg : "guide_step() gave no result");
    }
  }
done:
  json_decref(res);
  atomic_fetch_add(&g->rows, (uint64_t)n);
  atomic_fetch_add(&g->mask_ns, (uint64_t)(servd_now_ns() - t0));
  atomic_store(&g->live_pub, g->live);
out:
  if (rows != stack) free(rows);
}

void servd_guide_end(servd_model *m, servd_request *r) {
  servd_guides *g = m->guides;
  servd_guide_seq *gs = &r->guide;
  if (!g || !gs->started) return;
  gs->started = false;
  if (g->n_ended == g->cap_ended) {
    int c = g->cap_ended ? g->cap_ended * 2 : 16;
    uint64_t *p = realloc(g->ended, (size_t)c * sizeof *p);
    if (!p) return; /* the matcher leaks in the interpreter until the model unloads */
    g->ended = p;
    g->cap_ended = c;
  }
  g->ended[g->n_ended++] = gs->id;
}

void servd_guides_flush(servd_model *m) {
  servd_guides *g = m->guides;
  if (!g || !g->n_ended) return;
  json_t *args = json_pack("[[], o]", ended_ids(g));
  json_t *res = NULL;
  if (args &&
      servd_interp_call_json(servd_pool_get(m->pool, m->chat_interp), "guide_step", args, &res, 10000, NULL) == 0)
    ended_done(g);
  json_decref(args);
  json_decref(res);
}
