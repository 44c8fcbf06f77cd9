/* Batch invariance on the CPU: a request's numbers do not depend on what else is in the batch.
 *
 * A probe request (prompt logprobs and the top 5 logprobs of every generated token, greedy) runs alone,
 * one request at a time with speculation off; then again among 31 other requests of every length, some
 * sampled, with a small token budget so that its prompt is cut into other chunks and shares steps with
 * other prefills and decodes, with speculation on (its verify rows put several of its own positions in
 * one chunk). Every logprob it receives must be bit-identical: same floats, not merely the same tokens.
 * Checked for f32, q8_0, q4_0 and q4_1 weights over the default f16 KV cache.
 *
 * Integration (interpreters are loaded with dlmopen, which the sanitizers cannot follow).
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "engine/engine.h"
#include "engine-test.h"

#define NTOP 5
#define MAXV 512 /* logprob values kept per request */
#define OTHERS 31
#define GEN 16

typedef struct trace {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  bool done;
  int error_code;
  char error[256];
  int n; /* values in v */
  uint32_t v[MAXV];
  int32_t tok[MAXV];
} trace;

static char tmpdir[128];

static uint32_t bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

static void push(trace *t, int32_t token, float value) {
  if (t->n < MAXV) {
    t->tok[t->n] = token;
    t->v[t->n++] = bits(value);
  }
}

static void on_event(void *ud, const servd_event *ev) {
  trace *t = ud;
  pthread_mutex_lock(&t->mu);
  if (ev->kind == SERVD_EVENT_TOKEN || ev->kind == SERVD_EVENT_PROMPT_TOKEN) {
    push(t, ev->token, ev->logprob);
    for (int i = 0; i < ev->n_top; i++) push(t, ev->top[i].token, ev->top[i].logprob);
  } else {
    t->done = true;
    t->error_code = ev->error_code;
    if (ev->error_message) snprintf(t->error, sizeof t->error, "%s", ev->error_message);
    pthread_cond_signal(&t->cv);
  }
  pthread_mutex_unlock(&t->mu);
}

static void trace_init(trace *t) {
  memset(t, 0, sizeof *t);
  pthread_mutex_init(&t->mu, NULL);
  pthread_cond_init(&t->cv, NULL);
}

static void trace_wait(trace *t) {
  pthread_mutex_lock(&t->mu);
  while (!t->done) pthread_cond_wait(&t->cv, &t->mu);
  pthread_mutex_unlock(&t->mu);
  if (t->error_code) fprintf(stderr, "request failed: %s\n", t->error);
  assert_int_equal(t->error_code, 0);
}

static servd_model *load(const char *pkg, int speculative) {
  servd_model_options o;
  servd_model_options_default(&o);
  o.path = pkg;
  o.max_batch_tokens = 48; /* prompts are chunked and share steps with decodes */
  o.max_seqs = OTHERS + 1;
  o.max_queue = 64;
  o.speculative = speculative;
  servd_model *m = NULL;
  int rc = servd_model_load(&o, &m);
  if (rc) fprintf(stderr, "load: %s\n", servd_last_error());
  assert_int_equal(rc, 0);
  return m;
}

/* A prompt of n tokens from a text cycled over, so that some repeat (speculation proposes drafts). */
static servd_request *submit(servd_model *m, const char *text, int n, const servd_gen_params *p, trace *t) {
  int32_t *ids, *cyc = malloc(sizeof *cyc * (size_t)n);
  int nt;
  assert_int_equal(servd_model_tokenize(m, text, strlen(text), false, &ids, &nt), 0);
  for (int i = 0; i < n; i++) cyc[i] = ids[i % nt];
  free(ids);
  trace_init(t);
  servd_request *req = NULL;
  int rc = servd_model_submit(m, cyc, n, p, on_event, t, &req);
  free(cyc);
  if (rc) fprintf(stderr, "submit: %s\n", servd_last_error());
  assert_int_equal(rc, 0);
  return req;
}

static const char *probe_text = "The quick brown fox jumps over the lazy dog. The quick brown fox";

static servd_gen_params probe_params(void) {
  servd_gen_params p;
  servd_gen_params_default(&p);
  p.temperature = 0;
  p.max_tokens = GEN;
  p.ignore_eos = true;
  p.logprobs = NTOP;
  p.prompt_logprobs = true;
  return p;
}

static void check_dtype(servd_dtype dt) {
  char pkg[256];
  mpk_import_options io;
  mpk_import_options_init(&io);
  io.dtype = dt;
  io.convert_all = dt != SERVD_F32;
  char file[64];
  snprintf(file, sizeof file, "tiny-%s.mpk", servd_dtype_name(dt));
  assert_int_equal(engine_test_synth_tiny(tmpdir, file, pkg, sizeof pkg, &io), 0);
  const servd_gen_params pp = probe_params();

  static trace alone;
  servd_model *m = load(pkg, 1 /* off */);
  servd_request *q = submit(m, probe_text, 40, &pp, &alone);
  trace_wait(&alone);
  servd_request_release(q);
  servd_model_unload(m, 0);
  assert_int_equal(alone.n, (40 - 1 + GEN) * (NTOP + 1));

  static const char *texts[] = {"zz", "Once upon a time in a land far away", "0123456789 abc",
                                "Hello there, how are you today?"};
  for (int spec = 0; spec <= 2; spec += 2) { /* auto, then ngram */
    m = load(pkg, spec);
    static trace others[OTHERS], probe;
    servd_request *oq[OTHERS];
    for (int i = 0; i < OTHERS; i++) {
      servd_gen_params p;
      servd_gen_params_default(&p);
      p.max_tokens = 4 + (i * 7) % 24;
      p.ignore_eos = true;
      p.logprobs = i % 3 == 0 ? NTOP : -1;
      if (i % 2) {
        p.temperature = 1.0f;
        p.has_seed = true;
        p.seed = (uint64_t)i;
      } else {
        p.temperature = 0;
      }
      oq[i] = submit(m, texts[i % 4], 1 + (i * 13) % 90, &p, &others[i]);
      if (i == OTHERS / 2) q = submit(m, probe_text, 40, &pp, &probe); /* arrives mid-batch */
    }
    trace_wait(&probe);
    servd_request_release(q);
    for (int i = 0; i < OTHERS; i++) {
      trace_wait(&others[i]);
      servd_request_release(oq[i]);
    }
    assert_int_equal(probe.n, alone.n);
    for (int i = 0; i < alone.n; i++) {
      if (probe.tok[i] != alone.tok[i] || probe.v[i] != alone.v[i]) {
        float a, b;
        memcpy(&a, &alone.v[i], sizeof a);
        memcpy(&b, &probe.v[i], sizeof b);
        fail_msg("%s weights, speculation %s: value %d (token %d) is %.9g in the batch, %.9g alone (token %d)",
                 servd_dtype_name(dt), spec ? "ngram" : "auto", i, probe.tok[i], (double)b, (double)a, alone.tok[i]);
      }
    }
    servd_model_stats s;
    servd_model_get_stats(m, &s);
    assert_int_equal(s.kv_blocks_used, 0);
    servd_model_unload(m, 0);
  }
}

static void test_f32(void **state) {
  (void)state;
  check_dtype(SERVD_F32);
}
static void test_q8_0(void **state) {
  (void)state;
  check_dtype(SERVD_Q8_0);
}
static void test_q4_0(void **state) {
  (void)state;
  check_dtype(SERVD_Q4_0);
}
static void test_q4_1(void **state) {
  (void)state;
  check_dtype(SERVD_Q4_1);
}

int main(int argc, char **argv) {
  if (engine_test_start(argc, argv, "batch-inv", tmpdir, sizeof tmpdir)) return 1;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_f32),
      cmocka_unit_test(test_q8_0),
      cmocka_unit_test(test_q4_0),
      cmocka_unit_test(test_q4_1),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
