/* Generic packages through the engine: servd_model_predict on an idle interpreter, and dynamic
 * batching (concurrent calls stacked along dimension 0, one predict, each caller gets its rows).
 * Oracle: the package doubles its input (y = x + x, exact in f32) and reports the batch rows it saw.
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
#include "mpk/writer.h"
#include "engine-test.h"

static char pkg_path[256], tmpdir[128];

static const char model_py[] = "import servd\n"
                               "from servd import ops\n"
                               "class Doubler:\n"
                               "    def predict(self, inputs):\n"
                               "        x = inputs['x']\n"
                               "        if x.shape[1] == 5:\n"
                               "            raise RuntimeError('five columns break the model')\n"
                               "        if x.shape[1] == 6:\n"
                               "            raise ValueError('x: expected 4 columns, got 6')\n"
                               "        y = servd.empty(x.shape)\n"
                               "        ops.add(y, x, x)\n"
                               "        n = x.shape[0]\n"
                               "        seen = servd.tensor([[float(n)] for _ in range(n)])\n"
                               "        return {'y': y, 'seen': seen}\n";

static int make_package(void) {
  mpk_writer *w = NULL;
  int rc = mpk_writer_create(pkg_path, &w);
  if (!rc) rc = mpk_writer_set(w, "name", json_string("doubler"));
  if (!rc) rc = mpk_writer_set(w, "model_version", json_string("1"));
  if (!rc) rc = mpk_writer_set(w, "kind", json_string("generic"));
  if (!rc) rc = mpk_writer_set(w, "entry_point", json_string("doubler.model:Doubler"));
  if (!rc) rc = mpk_writer_set(w, "config", json_object());
  if (!rc) rc = mpk_writer_add_file(w, "code/doubler/__init__.py", "", 0);
  if (!rc) rc = mpk_writer_add_file(w, "code/doubler/model.py", model_py, sizeof model_py - 1);
  if (!rc) rc = mpk_writer_finish(w);
  mpk_writer_destroy(w);
  return rc;
}

static servd_model *load(int max_batch_size, int delay_ms) {
  servd_model_options o;
  servd_model_options_default(&o);
  o.path = pkg_path;
  o.interpreters = 1;
  o.max_batch_size = max_batch_size;
  o.max_batch_delay_ms = delay_ms;
  servd_model *m = NULL;
  int rc = servd_model_load(&o, &m);
  if (rc) fprintf(stderr, "load: %s\n", servd_last_error());
  assert_int_equal(rc, 0);
  assert_int_equal(servd_model_get_kind(m), SERVD_MODEL_GENERIC);
  return m;
}

typedef struct call {
  servd_model *m;
  int id, rows;
  int rc;
  float y[3 * 4];
  float seen;
} call;

static void *do_call(void *arg) {
  call *c = arg;
  int64_t shape[2] = {c->rows, 4};
  servd_named_tensor in = {.name = "x"};
  in.tensor = servd_tensor_new(SERVD_F32, 2, shape);
  float *x = servd_tensor_data(in.tensor);
  for (int i = 0; i < c->rows * 4; i++) x[i] = (float)(c->id * 100 + i);
  servd_named_tensor *out = NULL;
  int n_out = 0;
  c->rc = servd_model_predict(c->m, &in, 1, &out, &n_out, 0, NULL);
  if (c->rc == 0) {
    for (int o = 0; o < n_out; o++) {
      const servd_tensor *t = out[o].tensor;
      if (!strcmp(out[o].name, "y") && t->shape[0] == c->rows && t->shape[1] == 4) {
        for (int r = 0; r < c->rows; r++) /* the view may be a row slice of a larger batch */
          memcpy(c->y + r * 4, (const char *)servd_tensor_data(t) + r * t->strides[0], 4 * sizeof(float));
      } else if (!strcmp(out[o].name, "seen")) {
        c->seen = *(const float *)servd_tensor_data(t);
      }
      servd_tensor_release(out[o].tensor);
    }
    free(out);
  }
  servd_tensor_release(in.tensor);
  return NULL;
}

static void run_calls(servd_model *m, call *c, int n) {
  pthread_t th[16];
  for (int i = 0; i < n; i++) {
    c[i].m = m;
    c[i].id = i;
    c[i].rows = 1 + i % 3;
    pthread_create(&th[i], NULL, do_call, &c[i]);
  }
  for (int i = 0; i < n; i++) pthread_join(th[i], NULL);
  for (int i = 0; i < n; i++) {
    assert_int_equal(c[i].rc, 0);
    for (int k = 0; k < c[i].rows * 4; k++) assert_true(c[i].y[k] == 2.0f * (float)(i * 100 + k));
  }
}

static void test_predict_direct(void **state) {
  (void)state;
  servd_model *m = load(1, 0);
  call c[4];
  memset(c, 0, sizeof c);
  run_calls(m, c, 4);
  for (int i = 0; i < 4; i++) assert_true(c[i].seen == (float)c[i].rows); /* never batched */
  servd_model_unload(m, 0);
}

static void test_dynamic_batching(void **state) {
  (void)state;
  /* A long delay so the 8 concurrent calls meet in batches of up to 4 rows-groups. */
  servd_model *m = load(4, 300);
  call c[8];
  memset(c, 0, sizeof c);
  run_calls(m, c, 8);
  int batched = 0;
  for (int i = 0; i < 8; i++) {
    assert_true(c[i].seen >= (float)c[i].rows);
    if (c[i].seen > (float)c[i].rows) batched++;
  }
  assert_true(batched >= 2);
  servd_model_unload(m, 0);
}

/* One predict with `cols` columns: its code and the exception reported. */
static int predict_cols(servd_model *m, int cols, servd_model_error *err) {
  int64_t shape[2] = {2, cols};
  servd_named_tensor in = {.name = "x"};
  in.tensor = servd_tensor_new(SERVD_F32, 2, shape);
  memset(servd_tensor_data(in.tensor), 0, sizeof(float) * 2 * (size_t)cols);
  servd_named_tensor *out = NULL;
  int n_out = 0;
  int rc = servd_model_predict(m, &in, 1, &out, &n_out, 0, err);
  for (int o = 0; o < n_out; o++) servd_tensor_release(out[o].tensor);
  free(out);
  servd_tensor_release(in.tensor);
  return rc;
}

/* A RuntimeError from predict is the model's failure (SERVD_EMODEL, with type and message); a
 * ValueError says the input was bad (SERVD_EINVAL); both directly and through the batcher, and the
 * model keeps serving. */
static void test_model_error_vs_bad_input(void **state) {
  (void)state;
  for (int batch = 1; batch <= 4; batch += 3) {
    servd_model *m = load(batch, 0);
    servd_model_error err;
    assert_int_equal(predict_cols(m, 5, &err), SERVD_EMODEL);
    assert_string_equal(err.type, "RuntimeError");
    assert_string_equal(err.message, "five columns break the model");
    assert_non_null(strstr(servd_last_error(), "RuntimeError: five columns"));
    assert_int_equal(predict_cols(m, 6, &err), SERVD_EINVAL);
    assert_string_equal(err.type, "ValueError");
    assert_int_equal(predict_cols(m, 4, &err), 0);
    assert_string_equal(err.type, "");
    assert_int_equal(predict_cols(m, 5, NULL), SERVD_EMODEL);
    servd_model_unload(m, 0);
  }
}

static void test_language_model_calls_refused(void **state) {
  (void)state;
  servd_model *m = load(1, 0);
  int32_t t = 1;
  servd_gen_params p;
  servd_gen_params_default(&p);
  servd_request *r;
  assert_int_equal(servd_model_submit(m, &t, 1, &p, (servd_event_cb)1, NULL, &r), SERVD_EUNSUPPORTED);
  servd_model_unload(m, 0);
}

int main(int argc, char **argv) {
  if (engine_test_start(argc, argv, "generic", tmpdir, sizeof tmpdir)) return 1;
  snprintf(pkg_path, sizeof pkg_path, "%s/doubler.mpk", tmpdir);
  if (make_package()) {
    fprintf(stderr, "package: %s\n", servd_last_error());
    return 1;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_predict_direct),
      cmocka_unit_test(test_dynamic_batching),
      cmocka_unit_test(test_model_error_vs_bad_input),
      cmocka_unit_test(test_language_model_calls_refused),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  unlink(pkg_path);
  rmdir(tmpdir);
  fflush(stdout);
  fflush(stderr);
  _exit(rc);
}
