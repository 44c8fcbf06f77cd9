/* Shared pieces of the engine's GPU tests (test_engine_gpu.c, test_engine_fakegpu.c): greedy requests
 * whose tokens and top-2 logprob gaps are recorded, the model options they load with, and the
 * comparison that allows a difference only on a near tie of the reference. */
#ifndef SERVD_ENGINE_GPU_TEST_H
#define SERVD_ENGINE_GPU_TEST_H

#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "engine/speculate.h"
#include "engine/engine.h"

#define ENGINE_GPU_MAXTOK 64
/* bf16 activations against f32 (or bf16 partial sums rounded apart across ranks): logits move by
 * ~1e-2 on these models; a wrong computation moves them by > 1. */
#define NEAR_TIE 0.25f

typedef struct engine_gpu_result {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  bool done;
  int32_t tokens[ENGINE_GPU_MAXTOK];
  float gap[ENGINE_GPU_MAXTOK]; /* top-1 minus top-2 logprob at each step */
  int n;
  int error_code;
  char error[512];
  /* Optional: called with mu held after each token event (bump_tokens is for its own use). */
  void (*on_token)(struct engine_gpu_result *r);
  int bump_tokens;
} engine_gpu_result;

static inline void engine_gpu_on_event(void *ud, const servd_event *ev) {
  engine_gpu_result *r = ud;
  pthread_mutex_lock(&r->mu);
  if (ev->kind == SERVD_EVENT_TOKEN) {
    if (ev->token >= 0 && r->n < ENGINE_GPU_MAXTOK) {
      r->gap[r->n] = ev->n_top >= 2 ? ev->top[0].logprob - ev->top[1].logprob : 1e9f;
      r->tokens[r->n++] = ev->token;
    }
    if (r->on_token) r->on_token(r);
  } else {
    r->done = true;
    r->error_code = ev->error_code;
    if (ev->error_message) snprintf(r->error, sizeof r->error, "%s", ev->error_message);
    pthread_cond_signal(&r->cv);
  }
  pthread_mutex_unlock(&r->mu);
}

/* Clears r for a new request (set on_token/bump_tokens after this, before submitting). */
static inline void engine_gpu_result_init(engine_gpu_result *r) {
  memset(r, 0, sizeof *r);
  pthread_mutex_init(&r->mu, NULL);
  pthread_cond_init(&r->cv, NULL);
}

/* Submits ids as a greedy request of max_tokens (logprobs 2 when logprobs) recording into r. */
static inline int engine_gpu_submit_ids(servd_model *m, const int32_t *ids, int n, int max_tokens, bool logprobs,
                                        engine_gpu_result *r, servd_request **req) {
  servd_gen_params p;
  servd_gen_params_default(&p);
  p.temperature = 0;
  p.max_tokens = max_tokens;
  if (logprobs) {
    p.ignore_eos = true;
    p.logprobs = 2;
  }
  return servd_model_submit(m, ids, n, &p, engine_gpu_on_event, r, req);
}

/* Tokenizes prompt and submits it: max_tokens greedy tokens, EOS ignored, top-2 logprobs (or none:
 * a plain greedy request, whose GPU steps hand back picks rather than logits). */
static inline int engine_gpu_submit_prompt_ex(servd_model *m, const char *prompt, int max_tokens, bool logprobs,
                                              engine_gpu_result *r, servd_request **req) {
  int32_t *ids;
  int n;
  int rc = servd_model_tokenize(m, prompt, strlen(prompt), true, &ids, &n);
  if (rc) return rc;
  servd_gen_params p;
  servd_gen_params_default(&p);
  p.temperature = 0;
  p.max_tokens = max_tokens;
  p.ignore_eos = true;
  p.logprobs = logprobs ? 2 : -1;
  rc = servd_model_submit(m, ids, n, &p, engine_gpu_on_event, r, req);
  free(ids);
  return rc;
}

static inline int engine_gpu_submit_prompt(servd_model *m, const char *prompt, int max_tokens, engine_gpu_result *r,
                                           servd_request **req) {
  return engine_gpu_submit_prompt_ex(m, prompt, max_tokens, true, r, req);
}

/* Waits until r's request is done and releases it. */
static inline void engine_gpu_wait(engine_gpu_result *r, servd_request *req) {
  pthread_mutex_lock(&r->mu);
  while (!r->done) pthread_cond_wait(&r->cv, &r->mu);
  pthread_mutex_unlock(&r->mu);
  servd_request_release(req);
}

/* The options both tests load with: up to 8 sequences, 256-token batches, 512-token contexts, graphs
 * up to batch 8; gpus 0 runs on the CPU (tp 1). */
static inline void engine_gpu_options(servd_model_options *o, const char *path, int gpus, bool graphs) {
  servd_model_options_default(o);
  o->path = path;
  o->max_seqs = 8;
  o->max_batch_tokens = 256;
  o->max_context = 512;
  o->gpus = gpus;
  o->tp = gpus > 0 ? gpus : 1;
  o->cuda_graphs = graphs;
  o->cuda_graph_max_batch = 8;
  /* Steps as the token budget makes them, whatever the machine's speed: the fault tests' packages
   * fail on a step of a given size, which a time-bounded prefill chunk could also make. */
  o->max_step_ms = 0;
  /* Steps of one token per sequence, as the graph and fault counts expect; speculation's verify rows
   * have a run of their own. */
  o->speculative = SERVD_SPEC_OFF;
}

/* Equal until the first difference, which is allowed only where the reference's top two logprobs
 * are within NEAR_TIE; after it the sequences differ legitimately and are not compared further. */
static inline void engine_gpu_close_to(const char *what, const engine_gpu_result *ref, const engine_gpu_result *got,
                                       int nreq) {
  for (int i = 0; i < nreq; i++)
    for (int t = 0; t < ref[i].n; t++) {
      if (ref[i].tokens[t] == got[i].tokens[t]) continue;
      if (ref[i].gap[t] > NEAR_TIE)
        fail_msg("%s: request %d token %d: %d, expected %d (the reference's top-2 gap %g is no near tie)", what, i, t,
                 got[i].tokens[t], ref[i].tokens[t], ref[i].gap[t]);
      printf("%s: request %d differs from token %d on a near tie (gap %g)\n", what, i, t, ref[i].gap[t]);
      break;
    }
}

#endif
