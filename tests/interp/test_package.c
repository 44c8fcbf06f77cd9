/* Interpreters serving real packages: code imported from the package, package API, load failures,
 * weights shared by all interpreters. Packages are built here with modelpkg. */
#include "support.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static char g_work[512];

static void write_file(const char *dir, const char *name, const char *text) {
  char path[1024];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs(text, f);
  fclose(f);
}

/* Makes g_work/name, a Python package folder holding an empty __init__.py, in dir, and names its
 * package file g_work/mpk in out (both of 600 bytes). */
static void new_code_dir(const char *name, const char *mpk, char dir[600], char out[600]) {
  snprintf(dir, 600, "%s/%s", g_work, name);
  snprintf(out, 600, "%s/%s", g_work, mpk);
  mkdir(dir, 0755);
  write_file(dir, "__init__.py", "");
}

/* Packs code folder `code` (a Python package named after the folder) with tiny synthetic weights. */
static void pack(const char *code, const char *entry, const char *out) {
  assert_int_equal(support_system("cd %s && rm -rf hf && %s synth tiny --hf-out hf -o /dev/null --quiet >/dev/null && "
                                  "%s pack hf --name testpkg --code %s --entry-point %s -o %s --quiet >/dev/null",
                                  g_work, MODELPKG_EXE, MODELPKG_EXE, code, entry, out),
                   0);
}

static int setup(void **state) {
  (void)state;
  snprintf(g_work, sizeof g_work, "%s", TEST_WORK_DIR);
  mkdir(g_work, 0755);
  return 0;
}

static const char *good_model =
    "import servd\n"
    "from . import util\n"
    "class Model:\n"
    "    def __init__(self):\n"
    "        self.w = servd.package.tensor('lm_head.weight')\n"
    "        self.name = __name__\n"
    "    def predict(self, inputs):\n"
    "        return {'w': self.w}\n"
    "    def describe(self):\n"
    "        return {'file': __file__, 'util': util.answer(), 'shape': list(self.w.shape),\n"
    "                'hidden': servd.package.config['hidden_size'], 'n': len(servd.package.tensor_names())}\n"
    "    def fail(self):\n"
    "        return util.divide(1, 0)\n";

static const char *good_util = "def answer():\n    return 42\n\ndef divide(a, b):\n    return a / b\n";

static void test_package_code(void **state) {
  (void)state;
  char dir[600], out[600];
  new_code_dir("goodpkg", "good.mpk", dir, out);
  write_file(dir, "model.py", good_model);
  write_file(dir, "util.py", good_util);
  pack(dir, "goodpkg.model:Model", out);
  /* the code folder is gone: imports can only come from the package */
  support_system("rm -rf %s", dir);

  mpk_package *pkg = NULL;
  assert_int_equal(mpk_open(out, &pkg), 0);
  servd_pool_options o = {.n_interpreters = 2, .world_size = 1};
  servd_pool *p = NULL;
  int rc = servd_pool_create(pkg, &o, &p);
  if (rc < 0) fprintf(stderr, "%s\n", servd_last_error());
  assert_int_equal(rc, 0);

  servd_interp *it = servd_pool_acquire(p);
  json_t *res = NULL;
  servd_py_error err;
  assert_int_equal(servd_interp_call_json(it, "describe", NULL, &res, 0, &err), 0);
  assert_string_equal(json_string_value(json_object_get(res, "file")), "testpkg/code/goodpkg/model.py");
  assert_int_equal(json_integer_value(json_object_get(res, "util")), 42);
  assert_int_equal(json_integer_value(json_array_get(json_object_get(res, "shape"), 0)), 320);
  assert_int_equal(json_integer_value(json_object_get(res, "hidden")), 64);
  assert_int_equal(json_integer_value(json_object_get(res, "n")), mpk_tensor_count(pkg));
  json_decref(res);

  /* tracebacks show the lines of package code although no file exists on disk */
  assert_int_equal(servd_interp_call_json(it, "fail", NULL, &res, 0, &err), SERVD_EINVAL);
  assert_string_equal(err.type, "ZeroDivisionError");
  assert_non_null(strstr(err.traceback, "goodpkg/util.py\", line 5, in divide"));
  assert_non_null(strstr(err.traceback, "return a / b"));

  /* package tensors are views of the mapping: the same host storage in every interpreter */
  servd_tensor *direct = NULL;
  assert_int_equal(mpk_tensor(pkg, "lm_head.weight", &direct), 0);
  for (int round = 0; round < 2; round++) {
    int n_out;
    char **names;
    servd_tensor **outs;
    servd_interp *jt = round ? servd_pool_get(p, 1 - servd_interp_index(it)) : it;
    assert_int_equal(servd_interp_predict(jt, 0, NULL, NULL, &n_out, &names, &outs, 0, &err), 0);
    assert_int_equal(n_out, 1);
    assert_ptr_equal(servd_tensor_data(outs[0]), servd_tensor_data(direct));
    assert_ptr_equal(outs[0]->storage, direct->storage);
    servd_tensor_release(outs[0]);
    free(names[0]);
    free(names);
    free(outs);
  }
  servd_tensor_release(direct);
  /* read-only: the mapping must not be written through Python */
  servd_interp__exec(it, "import servd\nt = servd.package.tensor('lm_head.weight')\n", 0, &err);
  assert_int_equal(servd_interp__exec(it, "memoryview(t)[0, 0] = 1.0", 0, &err), SERVD_EINVAL);
  assert_non_null(strstr(err.message, "read-only"));
  assert_int_equal(support_eval_int(it, "int(servd.package.tensor('lm_head.weight') is t)"), 1);
  json_t *names = support_eval(it, "[n for n in servd.package.file_names() if n.startswith('code/')]");
  assert_int_equal(json_array_size(names), 3);
  json_decref(names);
  assert_int_equal(support_eval_int(it, "int(len(servd.package.read_file('tokenizer.json')) > 100)"), 1);
  servd_pool_release(p, it);
  servd_pool_destroy(p);
  mpk_close(pkg);
}

/* A package whose import fails is reported at load time with the exception and its traceback. */
static void test_bad_package(void **state) {
  (void)state;
  char dir[600], out[600];
  new_code_dir("badpkg", "bad.mpk", dir, out);
  write_file(dir, "model.py", "from . import helper\nclass Model:\n    pass\n");
  write_file(dir, "helper.py", "def load():\n    import no_such_module_xyz\n\nload()\n");
  pack(dir, "badpkg.model:Model", out);
  mpk_package *pkg = NULL;
  assert_int_equal(mpk_open(out, &pkg), 0);
  servd_py_error err;
  servd_pool_options o = {.n_interpreters = 2, .world_size = 1, .error = &err};
  servd_pool *p = NULL;
  assert_int_equal(servd_pool_create(pkg, &o, &p), SERVD_EINVAL);
  assert_null(p);
  assert_string_equal(err.type, "ModuleNotFoundError");
  assert_non_null(strstr(err.message, "no_such_module_xyz"));
  assert_non_null(strstr(err.traceback, "badpkg/helper.py\", line 2, in load"));
  const char *msg = servd_last_error();
  assert_non_null(strstr(msg, "badpkg.model:Model"));
  assert_non_null(strstr(msg, "ModuleNotFoundError"));
  assert_non_null(strstr(msg, "helper.py"));
  /* an entry that does not exist */
  mpk_close(pkg);
  snprintf(dir, sizeof dir, "%s/nopkg", g_work);
  snprintf(out, sizeof out, "%s/noentry.mpk", g_work);
  mkdir(dir, 0755);
  write_file(dir, "__init__.py", "");
  write_file(dir, "model.py", "class Model:\n    def __init__(self):\n        raise RuntimeError('weights missing')\n");
  pack(dir, "nopkg.model:Model", out);
  assert_int_equal(mpk_open(out, &pkg), 0);
  assert_int_equal(servd_pool_create(pkg, &o, &p), SERVD_EINVAL);
  assert_string_equal(err.type, "RuntimeError");
  assert_string_equal(err.message, "weights missing");
  mpk_close(pkg);
  /* the failed pools gave their namespaces back */
  o.n_interpreters = SERVD_INTERP_MAX;
  o.error = NULL;
  assert_int_equal(servd_pool_create(NULL, &o, &p), 0);
  servd_pool_destroy(p);
}

/* Weights are mapped once: every interpreter reads all 200 MB of weights, and RSS grows by far less
 * than the model per added interpreter. Bound: 25% of the model per interpreter; the true cost is
 * the interpreter itself (~10-15 MB), while a private copy would be 100%. */
static void test_weight_sharing(void **state) {
  (void)state;
  char out[600];
  snprintf(out, sizeof out, "%s/synth-200mb.mpk", g_work);
  struct stat st;
  if (stat(out, &st) != 0)
    assert_int_equal(support_system("%s synth 200mb -o %s --quiet >/dev/null", MODELPKG_EXE, out), 0);
  mpk_package *pkg = NULL;
  assert_int_equal(mpk_open(out, &pkg), 0);
  double model = 0;
  for (int i = 0; i < mpk_tensor_count(pkg); i++) {
    servd_tensor *t = NULL;
    assert_int_equal(mpk_tensor(pkg, mpk_tensor_name(pkg, i), &t), 0);
    model += (double)servd_tensor_nbytes(t);
    servd_tensor_release(t);
  }
  assert_true(model > 150e6);
  /* touches every page of every tensor from Python, through the buffer protocol */
  const char *touch = "import servd\n"
                      "total = 0\n"
                      "for n in servd.package.tensor_names():\n"
                      "    m = memoryview(servd.package.tensor(n)).cast('B')\n"
                      "    total += sum(m[::4096]) + m[-1]\n";
  enum { N = 4 };
  servd_interp its[N];
  size_t rss[N + 1];
  rss[0] = support_rss();
  for (int i = 0; i < N; i++) {
    servd_interp_config c = {.index = i, .rank = 0, .world_size = 1, .device = -1, .pkg = pkg};
    servd_py_error err;
    assert_int_equal(servd_interp__init(&its[i], &c, &err), 0);
    support_exec(&its[i], touch);
    rss[i + 1] = support_rss();
    fprintf(stderr, "weight sharing: %d interpreter(s): RSS %+.1f MB\n", i + 1, (double)(rss[i + 1] - rss[0]) / 1e6);
  }
  long long sum0 = support_eval_int(&its[0], "total"), sum3 = support_eval_int(&its[N - 1], "total");
  assert_int_equal(sum0, sum3);
  assert_true((double)(rss[1] - rss[0]) > 0.8 * model); /* the first one really made it resident */
  double per = (double)(rss[N] - rss[1]) / (N - 1);
  fprintf(stderr, "weight sharing: model %.1f MB, %.1f MB per added interpreter\n", model / 1e6, per / 1e6);
  assert_true(per < 0.25 * model);
  for (int i = 0; i < N; i++) servd_interp__fini(&its[i]);
  mpk_close(pkg);
}

int main(int argc, char **argv) {
  support_early_init(argc, argv);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_package_code),
      cmocka_unit_test(test_bad_package),
      cmocka_unit_test(test_weight_sharing),
  };
  return cmocka_run_group_tests(tests, setup, NULL);
}
