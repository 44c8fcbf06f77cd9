/* Deadlines of loads and forwards: a package whose import never returns fails servd_pool_create at
 * the load timeout; a forward with a deadline is interrupted; and one interpreter holding its GIL in
 * native code does not delay the deadlines of the others. Packages are built here with modelpkg.
 *
 * Every test would hang on a build without these deadlines: alarm() bounds the whole program. */
#include "support.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char g_work[400];

static void write_file(const char *dir, const char *name, const char *text) {
  char path[1024];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs(text, f);
  fclose(f);
}

/* Packs g_work/<name>/ (a Python package: __init__.py and model.py holding `model`) with tiny
 * synthetic weights into g_work/<name>.mpk and opens it. */
static mpk_package *make_package(const char *name, const char *model) {
  char dir[600], out[600];
  snprintf(dir, sizeof dir, "%s/%s", g_work, name);
  snprintf(out, sizeof out, "%s/%s.mpk", g_work, name);
  mkdir(dir, 0755);
  write_file(dir, "__init__.py", "");
  write_file(dir, "model.py", model);
  assert_int_equal(
      support_system("cd %s && rm -rf hf-%s && %s synth tiny --hf-out hf-%s -o /dev/null --quiet >/dev/null && "
                     "%s pack hf-%s --name %s --code %s --entry-point %s.model:Model -o %s --quiet >/dev/null",
                     g_work, name, MODELPKG_EXE, name, MODELPKG_EXE, name, name, dir, name, out),
      0);
  mpk_package *pkg = NULL;
  assert_int_equal(mpk_open(out, &pkg), 0);
  return pkg;
}

static int setup(void **state) {
  (void)state;
  snprintf(g_work, sizeof g_work, "%s/load_deadline", TEST_WORK_DIR);
  support_system("mkdir -p %s", g_work);
  return 0;
}

/* A pool creation that must fail with the load timeout, quickly, with a TimeoutError. */
static void expect_load_timeout(const char *name, const char *model, int n) {
  mpk_package *pkg = make_package(name, model);
  servd_py_error err;
  servd_pool_options o = {.n_interpreters = n, .world_size = 1, .error = &err, .load_timeout_ms = 500};
  servd_pool *p = NULL;
  double t0 = support_seconds();
  int rc = servd_pool_create(pkg, &o, &p);
  double took = support_seconds() - t0;
  if (rc != SERVD_ETIMEDOUT) fprintf(stderr, "%s: rc %d: %s\n", name, rc, servd_last_error());
  assert_int_equal(rc, SERVD_ETIMEDOUT);
  assert_null(p);
  assert_true(took >= 0.45 && took < 3.0);
  assert_string_equal(err.type, "TimeoutError");
  const char *msg = servd_last_error();
  assert_non_null(strstr(msg, "load timeout of 0.5 s"));
  assert_non_null(strstr(msg, name));
  mpk_close(pkg);
}

/* The module body loops forever: interrupted at the load timeout; the namespaces are given back. */
static void test_import_loops(void **state) {
  (void)state;
  expect_load_timeout("loops", "while True:\n    pass\n", 2);
  /* the failed pool finalized its interpreters: all of them can be started again */
  servd_pool_options o = {.n_interpreters = SERVD_INTERP_MAX, .world_size = 1};
  servd_pool *p = NULL;
  assert_int_equal(servd_pool_create(NULL, &o, &p), 0);
  servd_pool_destroy(p);
}

/* The entry object's construction sleeps in a loop, swallowing the first TimeoutError: the
 * interrupt is raised again until it ends. */
static void test_init_sleeps(void **state) {
  (void)state;
  expect_load_timeout("sleeps",
                      "import time\n"
                      "class Model:\n"
                      "    def __init__(self):\n"
                      "        try:\n"
                      "            while True: time.sleep(0.02)\n"
                      "        except TimeoutError:\n"
                      "            pass\n"
                      "        while True: time.sleep(0.02)\n",
                      1);
}

/* An import that finishes in time is not disturbed by the deadline, in any interpreter. */
static void test_in_time(void **state) {
  (void)state;
  mpk_package *pkg = make_package("quick", "class Model:\n    def predict(self, inputs):\n        return {}\n");
  servd_pool_options o = {.n_interpreters = 3, .world_size = 1, .load_timeout_ms = 20000};
  servd_pool *p = NULL;
  assert_int_equal(servd_pool_create(pkg, &o, &p), 0);
  json_t *r = support_eval(servd_pool_get(p, 2), "6 * 7");
  assert_int_equal(json_integer_value(r), 42);
  json_decref(r);
  servd_pool_destroy(p);
  mpk_close(pkg);
}

static servd_pool *code_pool(int n, const char *file, const char *code, const char *entry) {
  char dir[512];
  snprintf(dir, sizeof dir, "%s/code-XXXXXX", g_work);
  assert_int_equal(support_make_dir_with(dir, file, code), 0);
  servd_pool_options o = {.n_interpreters = n, .world_size = 1, .extra_sys_path = dir};
  servd_pool *p = NULL;
  assert_int_equal(servd_pool_create(NULL, &o, &p), 0);
  servd_py_error err;
  for (int i = 0; entry && i < n; i++) assert_int_equal(servd_interp__load_entry(servd_pool_get(p, i), entry, &err), 0);
  return p;
}

/* servd_interp_forward_deadline: a forward stuck in Python ends at its deadline; the interpreter
 * stays usable. */
static void test_forward_deadline(void **state) {
  (void)state;
  servd_pool *p = code_pool(1, "stuck.py",
                            "class Stuck:\n"
                            "    def forward(self, batch):\n"
                            "        if batch.n_tokens == 2:\n"
                            "            return None\n"
                            "        while True: pass\n",
                            "stuck:Stuck");
  int32_t ids[2] = {1, 2}, pos[2] = {0, 1}, slots[2] = {0, 1}, rows[1] = {0};
  servd_forward_batch b =
      {.n_tokens = 1, .tokens = ids, .positions = pos, .slots = slots, .n_logit_rows = 1, .logit_rows = rows};
  servd_tensor *logits = NULL;
  servd_py_error err;
  double t0 = support_seconds();
  int rc = servd_interp_forward_deadline(servd_pool_get(p, 0), &b, 200, &logits, &err);
  assert_int_equal(rc, SERVD_ETIMEDOUT);
  assert_true(support_seconds() - t0 < 3.0);
  assert_string_equal(err.type, "TimeoutError");
  assert_null(logits);
  b.n_tokens = 2;
  assert_int_equal(servd_interp_forward_deadline(servd_pool_get(p, 0), &b, 200, &logits, &err), 0);
  servd_pool_destroy(p);
}

typedef struct holder {
  servd_interp *it;
  char code[128];
  int rc;
} holder;

static void *hold_gil(void *arg) {
  holder *h = arg;
  servd_py_error err;
  h->rc = servd_interp__exec(h->it, h->code, 50, &err);
  return NULL;
}

/* Interpreter 0 runs native code that holds its GIL for seconds (sum over a range never returns to
 * the eval loop), past its deadline: the watchdog's interrupt of it waits for that GIL. The deadline
 * of a call in interpreter 1 must still be enforced on time. Before interrupts had a thread per
 * namespace, the one watchdog thread waited for interpreter 0's GIL and interpreter 1 ran on. */
static void test_gil_holder_does_not_delay_others(void **state) {
  (void)state;
  servd_pool *p = code_pool(2, "empty.py", "", NULL);
  servd_interp *a = servd_pool_get(p, 0), *b = servd_pool_get(p, 1);
  /* calibrate: about 3 s of holding the GIL on this machine */
  double t0 = support_seconds();
  support_exec(a, "sum(range(10**7))");
  double per = support_seconds() - t0;
  long long n = (long long)(3.0 / (per > 1e-4 ? per : 1e-4) * 1e7);
  holder h = {.it = a};
  snprintf(h.code, sizeof h.code, "sum(range(%lld))", n);
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, hold_gil, &h), 0);
  usleep(300 * 1000); /* past interpreter 0's deadline: its interrupt is waiting for the GIL */
  servd_py_error err;
  t0 = support_seconds();
  int rc = servd_interp__exec(b, "while True:\n  pass\n", 200, &err);
  double took = support_seconds() - t0;
  assert_int_equal(rc, SERVD_ETIMEDOUT);
  pthread_join(t, NULL);
  double held = support_seconds() - t0;
  fprintf(stderr, "interpreter 1 interrupted after %.2f s while interpreter 0 held its GIL for %.2f s\n", took, held);
  assert_int_equal(h.rc, SERVD_ETIMEDOUT); /* it ends at the interrupt once back in Python */
  assert_true(took < 1.5);
  assert_true(held > took + 0.5); /* the holder really outlasted the other's deadline */
  servd_pool_destroy(p);
}

int main(int argc, char **argv) {
  support_early_init(argc, argv);
  alarm(240); /* a deadline that is not enforced hangs: end as a failure instead */
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_import_loops),
      cmocka_unit_test(test_init_sleeps),
      cmocka_unit_test(test_in_time),
      cmocka_unit_test(test_forward_deadline),
      cmocka_unit_test(test_gil_holder_does_not_delay_others),
  };
  return cmocka_run_group_tests(tests, setup, NULL);
}
