/* Running from a relocated directory: libpython, the standard library (with lib-dynload), the servd
 * module and the allowed modules' directory all come from the environment's paths, not from the
 * build's. The bundle is a temporary tree: copies of libpython and of the module (so that the process
 * maps show them at the bundle's paths) and links to the standard library and dist-packages. */
#include "support.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char g_dir[64];

static void test_relocated_bundle(void **state) {
  (void)state;
  servd_py_paths *built = malloc(sizeof *built);
  assert_int_equal(servd_py_paths__resolve(built), 0); /* the build's paths: the bundle's sources */
  snprintf(g_dir, sizeof g_dir, "/tmp/servd-bundle-XXXXXX");
  assert_non_null(mkdtemp(g_dir));
  assert_int_equal(support_system("mkdir -p %s/lib/servd && cp %s %s/lib/libpython3.11.so.1.0 && cp %s "
                                  "%s/lib/servd/servd.cpython-311-x86_64-linux-gnu.so && ln -s %s %s/lib/python3.11",
                                  g_dir, built->libpython, g_dir, built->pymod, g_dir, built->stdlib, g_dir),
                   0);
  struct stat st;
  int have_allow = stat(built->allow_dir, &st) == 0 && S_ISDIR(st.st_mode);
  if (have_allow) assert_int_equal(support_system("ln -s %s %s/dist", built->allow_dir, g_dir), 0);
  char v[128];
  snprintf(v, sizeof v, "%s/lib/libpython3.11.so.1.0", g_dir);
  setenv("SERVD_LIBPYTHON", v, 1);
  snprintf(v, sizeof v, "%s/lib/python3.11/", g_dir); /* a trailing slash names the same directory */
  setenv("SERVD_PY_STDLIB", v, 1);
  snprintf(v, sizeof v, "%s/lib/servd/servd.cpython-311-x86_64-linux-gnu.so", g_dir);
  setenv("SERVD_PYMOD_PATH", v, 1);
  if (have_allow) {
    snprintf(v, sizeof v, "%s/dist", g_dir);
    setenv("SERVD_PY_ALLOW_DIR", v, 1);
  }
  free(built);

  servd_pool_options o = {.n_interpreters = 1, .world_size = 1};
  servd_pool *p = NULL;
  int rc = servd_pool_create(NULL, &o, &p);
  if (rc < 0) fprintf(stderr, "pool: %s\n", servd_last_error());
  assert_int_equal(rc, 0);
  servd_interp *it = servd_pool_get(p, 0);
  char code[512];
  snprintf(code, sizeof code, "import sys, json, _json, servd\nD = '%s'\nmaps = open('/proc/self/maps').read()\n",
           g_dir);
  support_exec(it, code);
  support_expect_true(it, "sys.prefix == D");
  support_expect_true(it, "json.__file__ == D + '/lib/python3.11/json/__init__.py'");
  support_expect_true(it, "_json.__file__.startswith(D + '/lib/python3.11/lib-dynload/')");
  support_expect_true(it, "sys.path[:2] == [D + '/lib/python3.11', D + '/lib/python3.11/lib-dynload']");
  support_expect_true(it, "(D + '/lib/libpython3.11.so.1.0') in maps");
  support_expect_true(it, "(D + '/lib/servd/servd.cpython-311-x86_64-linux-gnu.so') in maps");
  support_expect_true(it, "servd.device() == 'cpu'");
  if (have_allow) {
    support_exec(it, "import jinja2\n");
    support_expect_true(it, "jinja2.__file__.startswith(D + '/dist/jinja2/')");
  }
  servd_pool_destroy(p);
  support_system("rm -rf %s", g_dir);
}

int main(int argc, char **argv) {
  support_early_init(argc, argv);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_relocated_bundle),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
