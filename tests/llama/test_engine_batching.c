/* The engine end to end on a synthesized tiny Llama (f32 weights and KV cache): continuous batching
 * must not change what a request generates. Oracle: the same request run alone, one at a time
 * (greedy), which tests/llama/test_llama.py checks against the numpy reference.
 *
 * Checks: concurrent requests with a small token budget (chunked prefill mixed with decode) and a
 * KV cache too small for all of them (preemption and recompute) produce the same tokens as alone;
 * stop strings; cancel frees the KV blocks; deadline; bounded queue (SERVD_EBUSY); bad parameters;
 * the chat template.
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
#include <unistd.h>

#include <cmocka.h>

#include "engine/engine.h"
#include "engine-test.h"

#define MAXTOK 256

typedef struct result {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  bool done;
  int32_t tokens[MAXTOK];
  int n;
  char text[4096];
  size_t text_len;
  char reason[32];
  int error_code;
  char error[512];
} result;

static char pkg_path[256];
static char tmpdir[128];

static void on_event(void *ud, const servd_event *ev) {
  result *r = ud;
  pthread_mutex_lock(&r->mu);
  if (ev->kind == SERVD_EVENT_TOKEN) {
    if (ev->token >= 0 && r->n < MAXTOK) r->tokens[r->n++] = ev->token;
    if (ev->text_len && r->text_len + ev->text_len < sizeof r->text) {
      memcpy(r->text + r->text_len, ev->text, ev->text_len);
      r->text_len += ev->text_len;
    }
  } else {
    r->done = true;
    r->error_code = ev->error_code;
    if (ev->error_message) snprintf(r->error, sizeof r->error, "%s", ev->error_message);
    snprintf(r->reason, sizeof r->reason, "%s", ev->finish_reason ? ev->finish_reason : "");
    pthread_cond_signal(&r->cv);
  }
  pthread_mutex_unlock(&r->mu);
}

static void result_init(result *r) {
  memset(r, 0, sizeof *r);
  pthread_mutex_init(&r->mu, NULL);
  pthread_cond_init(&r->cv, NULL);
}

static void result_wait(result *r) {
  pthread_mutex_lock(&r->mu);
  while (!r->done) pthread_cond_wait(&r->cv, &r->mu);
  pthread_mutex_unlock(&r->mu);
}

static servd_model *load(int max_batch_tokens, int max_seqs, int kv_blocks, int max_queue) {
  servd_model_options o;
  servd_model_options_default(&o);
  o.path = pkg_path;
  o.max_batch_tokens = max_batch_tokens;
  o.max_seqs = max_seqs;
  o.kv_blocks = kv_blocks;
  o.block_size = 4;
  o.max_queue = max_queue;
  o.kv_dtype = SERVD_F32;
  servd_model *m = NULL;
  int rc = servd_model_load(&o, &m);
  if (rc) fprintf(stderr, "load: %s\n", servd_last_error());
  assert_int_equal(rc, 0);
  return m;
}

static const char *prompts[] = {"Hello there, how are you?",
                                "abc",
                                "The quick brown fox jumps over the lazy dog",
                                "0123456789",
                                "zz top",
                                "Once upon a time in a land far away, there lived"};
#define NP (int)(sizeof prompts / sizeof *prompts)
#define GEN 20

static servd_request *submit(servd_model *m, const char *text, const servd_gen_params *p, result *r) {
  int32_t *ids;
  int n;
  assert_int_equal(servd_model_tokenize(m, text, strlen(text), false, &ids, &n), 0);
  result_init(r);
  servd_request *req = NULL;
  int rc = servd_model_submit(m, ids, n, p, on_event, r, &req);
  free(ids);
  if (rc) fprintf(stderr, "submit: %s\n", servd_last_error());
  assert_int_equal(rc, 0);
  return req;
}

static servd_gen_params greedy(int max_tokens) {
  servd_gen_params p;
  servd_gen_params_default(&p);
  p.temperature = 0;
  p.max_tokens = max_tokens;
  p.ignore_eos = true;
  return p;
}

static result alone[NP];

static void run_alone(void) {
  servd_model *m = load(512, 1, 0, 16);
  servd_gen_params p = greedy(GEN);
  for (int i = 0; i < NP; i++) {
    servd_request *q = submit(m, prompts[i], &p, &alone[i]);
    result_wait(&alone[i]);
    servd_request_release(q);
    assert_int_equal(alone[i].n, GEN);
    assert_string_equal(alone[i].reason, "length");
  }
  servd_model_unload(m, 0);
}

static void check_batched(int budget, int max_seqs, int kv_blocks, bool expect_preemption) {
  servd_model *m = load(budget, max_seqs, kv_blocks, 64);
  servd_gen_params p = greedy(GEN);
  static result r[NP];
  servd_request *q[NP];
  for (int i = 0; i < NP; i++) q[i] = submit(m, prompts[i], &p, &r[i]);
  for (int i = 0; i < NP; i++) {
    result_wait(&r[i]);
    servd_request_release(q[i]);
    if (r[i].error_code) fprintf(stderr, "request %d: %s\n", i, r[i].error);
    assert_string_equal(r[i].reason, "length");
    assert_int_equal(r[i].n, GEN);
    assert_memory_equal(r[i].tokens, alone[i].tokens, sizeof(int32_t) * GEN);
    assert_int_equal(r[i].text_len, alone[i].text_len);
    assert_memory_equal(r[i].text, alone[i].text, r[i].text_len);
  }
  servd_model_stats s;
  servd_model_get_stats(m, &s);
  if (expect_preemption) assert_true(s.preemptions > 0);
  assert_int_equal(s.kv_blocks_used, 0);
  assert_int_equal(s.generation_tokens, (uint64_t)NP * GEN);
  servd_model_unload(m, 0);
}

static void test_continuous_batching_matches_alone(void **state) {
  (void)state;
  run_alone();
  /* Budget 8: prompts are prefilled in chunks while others decode. */
  check_batched(8, 8, 0, false);
  /* 14 blocks of 4 slots for six sequences growing to ~30 tokens: preemption and recompute. */
  check_batched(64, 8, 14, true);
}

static void test_stop_string(void **state) {
  (void)state;
  servd_model *m = load(64, 4, 0, 16);
  /* Take a stop string from the middle of the unconstrained output. */
  const result *a = &alone[0];
  assert_true(a->text_len > 8);
  char stop[4];
  size_t at = a->text_len / 2;
  memcpy(stop, a->text + at, 3);
  stop[3] = 0;
  const char *found = memmem(a->text, a->text_len, stop, 3);
  size_t expect = (size_t)(found - a->text);
  servd_gen_params p = greedy(GEN);
  const char *stops[] = {stop};
  p.stop = stops;
  p.n_stop = 1;
  result r;
  servd_request *q = submit(m, prompts[0], &p, &r);
  result_wait(&r);
  servd_request_release(q);
  assert_string_equal(r.reason, "stop");
  assert_int_equal(r.text_len, expect);
  assert_memory_equal(r.text, a->text, expect);
  servd_model_unload(m, 0);
}

static void test_cancel_frees_blocks(void **state) {
  (void)state;
  servd_model *m = load(64, 4, 0, 16);
  servd_gen_params p = greedy(400);
  result r;
  servd_request *q = submit(m, prompts[5], &p, &r);
  for (;;) { /* wait for a few tokens */
    pthread_mutex_lock(&r.mu);
    int n = r.n;
    pthread_mutex_unlock(&r.mu);
    if (n >= 3) break;
    usleep(1000);
  }
  servd_request_cancel(q);
  result_wait(&r);
  servd_request_release(q);
  assert_string_equal(r.reason, "cancelled");
  servd_model_stats s;
  servd_model_get_stats(m, &s);
  assert_int_equal(s.kv_blocks_used, 0);
  assert_int_equal(s.running, 0);
  servd_model_unload(m, 0);
}

static void test_deadline(void **state) {
  (void)state;
  servd_model *m = load(64, 4, 0, 16);
  servd_gen_params p = greedy(450);
  p.deadline_ms = 1;
  result r;
  servd_request *q = submit(m, prompts[5], &p, &r);
  result_wait(&r);
  servd_request_release(q);
  assert_string_equal(r.reason, "deadline");
  servd_model_unload(m, 0);
}

static void test_queue_bound(void **state) {
  (void)state;
  servd_model *m = load(64, 1, 0, 2);
  servd_gen_params p = greedy(400);
  int32_t *ids;
  int n;
  assert_int_equal(servd_model_tokenize(m, "abc", 3, false, &ids, &n), 0);
  static result r[20];
  servd_request *q[20];
  int accepted = 0, busy = 0;
  for (int i = 0; i < 20; i++) {
    result_init(&r[i]);
    int rc = servd_model_submit(m, ids, n, &p, on_event, &r[i], &q[accepted]);
    if (rc == SERVD_EBUSY) busy++;
    else if (rc == 0) accepted++;
    else fail_msg("submit: %s", servd_last_error());
  }
  free(ids);
  /* One runs, at most two wait: the rest are refused. */
  assert_true(busy >= 20 - 3);
  for (int i = 0; i < accepted; i++) servd_request_cancel(q[i]);
  for (int i = 0; i < 20; i++)
    if (i < accepted) {
      result_wait(&r[i]);
      servd_request_release(q[i]);
    }
  servd_model_unload(m, 0);
}

static void test_bad_params(void **state) {
  (void)state;
  servd_model *m = load(64, 4, 0, 16);
  servd_gen_params p = greedy(4);
  int32_t ids[600];
  for (int i = 0; i < 600; i++) ids[i] = 40;
  servd_request *q;
  result r;
  result_init(&r);
  assert_int_equal(servd_model_submit(m, ids, 600, &p, on_event, &r, &q), SERVD_EINVAL); /* > context 512 */
  assert_int_equal(servd_model_submit(m, ids, 0, &p, on_event, &r, &q), SERVD_EINVAL);
  ids[0] = 1 << 20;
  assert_int_equal(servd_model_submit(m, ids, 4, &p, on_event, &r, &q), SERVD_EINVAL);
  ids[0] = 40;
  p.temperature = -1;
  assert_int_equal(servd_model_submit(m, ids, 4, &p, on_event, &r, &q), SERVD_EINVAL);
  p.temperature = 0;
  p.top_p = 0;
  assert_int_equal(servd_model_submit(m, ids, 4, &p, on_event, &r, &q), SERVD_EINVAL);
  servd_model_unload(m, 0);
}

static void test_chat_template(void **state) {
  (void)state;
  servd_model *m = load(64, 4, 0, 16);
  json_t *msgs =
      json_pack("[{s:s,s:s},{s:s,s:s}]", "role", "system", "content", "Be brief.", "role", "user", "content", "Hi");
  char *text = NULL;
  int rc = servd_model_apply_chat_template(m, msgs, true, &text);
  if (rc) fprintf(stderr, "chat: %s\n", servd_last_error());
  assert_int_equal(rc, 0);
  assert_string_equal(text, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                            "<|im_start|>assistant\n");
  free(text);
  json_decref(msgs);
  servd_model_unload(m, 0);
}

int main(int argc, char **argv) {
  if (engine_test_start(argc, argv, "engine", tmpdir, sizeof tmpdir) ||
      engine_test_synth_tiny(tmpdir, "tiny.mpk", pkg_path, sizeof pkg_path, NULL))
    return 1;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_continuous_batching_matches_alone),
      cmocka_unit_test(test_stop_string),
      cmocka_unit_test(test_cancel_frees_blocks),
      cmocka_unit_test(test_deadline),
      cmocka_unit_test(test_queue_bound),
      cmocka_unit_test(test_bad_params),
      cmocka_unit_test(test_chat_template),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  unlink(pkg_path);
  rmdir(tmpdir);
  fflush(stdout);
  fflush(stderr);
  _exit(rc); /* interpreters' namespaces must not run library destructors at exit */
}
