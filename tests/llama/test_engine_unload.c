/* Unloading a language model after a chat template was rendered from another thread (as the HTTP
 * layer does, on a libuv worker that outlives the model) must not hang in Py_FinalizeEx: the template
 * imports jinja2, which imports `threading`, which takes its importing thread for the main thread and
 * makes finalization on any other thread wait for that thread's state. Checked with a wide margin
 * (60 s; it takes well under a second) so that a regression fails instead of hanging ctest.
 *
 * Integration (interpreters are loaded with dlmopen, which the sanitizers cannot follow).
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "engine/engine.h"
#include "engine-test.h"

static char tmpdir[128], pkg_path[256];

/* A worker like libuv's: renders on request, then stays alive until told to leave. */
typedef struct worker {
  servd_model *m;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  bool rendered, leave;
  int rc;
  char text[256];
} worker;

static void *worker_main(void *p) {
  worker *w = p;
  json_t *msgs = json_pack("[{s:s, s:s}]", "role", "user", "content", "hi");
  char *text = NULL;
  int rc = servd_model_apply_chat_template(w->m, msgs, true, &text);
  json_decref(msgs);
  pthread_mutex_lock(&w->mu);
  w->rc = rc;
  snprintf(w->text, sizeof w->text, "%s", text ? text : servd_last_error());
  w->rendered = true;
  pthread_cond_broadcast(&w->cv);
  while (!w->leave) pthread_cond_wait(&w->cv, &w->mu);
  pthread_mutex_unlock(&w->mu);
  free(text);
  return NULL;
}

typedef struct unloader {
  servd_model *m;
  atomic_int done;
} unloader;

static void *unload_main(void *p) {
  unloader *u = p;
  servd_model_unload(u->m, 0);
  atomic_store(&u->done, 1);
  return NULL;
}

static void test_unload_after_chat_on_another_thread(void **state) {
  (void)state;
  servd_model_options o;
  servd_model_options_default(&o);
  o.path = pkg_path;
  o.kv_dtype = SERVD_F32;
  servd_model *m = NULL;
  int rc = servd_model_load(&o, &m);
  if (rc) fprintf(stderr, "load: %s\n", servd_last_error());
  assert_int_equal(rc, 0);

  worker w = {.m = m};
  pthread_mutex_init(&w.mu, NULL);
  pthread_cond_init(&w.cv, NULL);
  pthread_t wt;
  assert_int_equal(pthread_create(&wt, NULL, worker_main, &w), 0);
  pthread_mutex_lock(&w.mu);
  while (!w.rendered) pthread_cond_wait(&w.cv, &w.mu);
  pthread_mutex_unlock(&w.mu);
  if (w.rc) fprintf(stderr, "chat template: %s\n", w.text);
  assert_int_equal(w.rc, 0);
  assert_non_null(strstr(w.text, "hi"));

  unloader u = {.m = m};
  pthread_t ut;
  assert_int_equal(pthread_create(&ut, NULL, unload_main, &u), 0);
  for (int i = 0; i < 6000 && !atomic_load(&u.done); i++) {
    struct timespec ts = {0, 10 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
  if (!atomic_load(&u.done)) fail_msg("servd_model_unload has not returned after 60 s");
  pthread_join(ut, NULL);

  pthread_mutex_lock(&w.mu);
  w.leave = true;
  pthread_cond_broadcast(&w.cv);
  pthread_mutex_unlock(&w.mu);
  pthread_join(wt, NULL);
}

int main(int argc, char **argv) {
  if (engine_test_start(argc, argv, "unload", tmpdir, sizeof tmpdir) ||
      engine_test_synth_tiny(tmpdir, "tiny.mpk", pkg_path, sizeof pkg_path, NULL))
    return 1;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_unload_after_chat_on_another_thread),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  unlink(pkg_path);
  rmdir(tmpdir);
  fflush(stdout);
  fflush(stderr);
  _exit(rc); /* interpreters' namespaces must not run library destructors at exit */
}
