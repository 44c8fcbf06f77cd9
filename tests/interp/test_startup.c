/* Interpreter start-up checks that fail before any Python is loaded: the run-time path overrides
 * (SERVD_LIBPYTHON, SERVD_PY_STDLIB, SERVD_PY_ALLOW_DIR, SERVD_PYMOD_PATH) and the pool's device
 * options. Nothing here starts an interpreter, so it runs under the sanitizers too. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "interp-impl.h"

static const char *const g_vars[] = {"SERVD_LIBPYTHON", "SERVD_PY_STDLIB", "SERVD_PY_ALLOW_DIR", "SERVD_PYMOD_PATH",
                                     "SERVD_PYMOD"};
static char g_dir[64];

static int setup(void **state) {
  (void)state;
  snprintf(g_dir, sizeof g_dir, "/tmp/servd-startup-XXXXXX");
  if (!mkdtemp(g_dir)) return -1;
  char path[128];
  snprintf(path, sizeof path, "%s/notstdlib", g_dir); /* a directory without os.py */
  return mkdir(path, 0700);
}

static int teardown(void **state) {
  (void)state;
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
  return system(cmd) == 0 ? 0 : -1;
}

static void clear_env(void) {
  for (size_t i = 0; i < sizeof g_vars / sizeof g_vars[0]; i++) unsetenv(g_vars[i]);
}

static void expect_fail(int rc, const char *part) {
  if (rc >= 0 || !strstr(servd_last_error(), part))
    fprintf(stderr, "rc %d; message: %s; expected to contain: %s\n", rc, servd_last_error(), part);
  assert_true(rc < 0);
  assert_non_null(strstr(servd_last_error(), part));
}

/* Without overrides the built-in paths resolve (this build's Python and module exist). */
static void test_defaults(void **state) {
  (void)state;
  clear_env();
  servd_py_paths *p = malloc(sizeof *p);
  int rc = servd_py_paths__resolve(p);
  if (rc < 0) fprintf(stderr, "%s\n", servd_last_error());
  assert_int_equal(rc, 0);
  assert_non_null(strstr(p->libpython, "libpython3.11"));
  assert_non_null(strstr(p->pymod, "servd.cpython-311"));
  char want[PATH_MAX + 16];
  snprintf(want, sizeof want, "%s/lib-dynload", p->stdlib);
  assert_string_equal(p->dynload, want);
  free(p);
}

/* Overrides replace the built-in paths; SERVD_PY_STDLIB brings its own lib-dynload. */
static void test_overrides_used(void **state) {
  (void)state;
  clear_env();
  servd_py_paths *p = malloc(sizeof *p);
  assert_int_equal(servd_py_paths__resolve(p), 0);
  char lib[PATH_MAX], std[PATH_MAX], mod[PATH_MAX], link[PATH_MAX + 64];
  snprintf(lib, sizeof lib, "%s", p->libpython);
  snprintf(std, sizeof std, "%s", p->stdlib);
  snprintf(mod, sizeof mod, "%s", p->pymod);
  /* a relocated tree: links under g_dir */
  snprintf(link, sizeof link, "%s/stdlib", g_dir);
  unlink(link);
  assert_int_equal(symlink(std, link), 0);
  setenv("SERVD_PY_STDLIB", link, 1);
  snprintf(link, sizeof link, "%s/libpython.so", g_dir);
  unlink(link);
  assert_int_equal(symlink(lib, link), 0);
  setenv("SERVD_LIBPYTHON", link, 1);
  snprintf(link, sizeof link, "%s/servd.so", g_dir);
  unlink(link);
  assert_int_equal(symlink(mod, link), 0);
  setenv("SERVD_PYMOD_PATH", link, 1);
  setenv("SERVD_PY_ALLOW_DIR", g_dir, 1);
  assert_int_equal(servd_py_paths__resolve(p), 0);
  char want[PATH_MAX + 64];
  snprintf(want, sizeof want, "%s/stdlib", g_dir);
  assert_string_equal(p->stdlib, want);
  snprintf(want, sizeof want, "%s/stdlib/lib-dynload", g_dir);
  assert_string_equal(p->dynload, want);
  snprintf(want, sizeof want, "%s/libpython.so", g_dir);
  assert_string_equal(p->libpython, want);
  snprintf(want, sizeof want, "%s/servd.so", g_dir);
  assert_string_equal(p->pymod, want);
  assert_string_equal(p->allow_dir, g_dir);
  clear_env();
  free(p);
}

/* A bad override is an error naming the variable and the path, both from servd_py_paths__resolve and
 * from servd_pool_create (which fails before loading anything). */
static void test_bad_overrides(void **state) {
  (void)state;
  servd_py_paths *p = malloc(sizeof *p);
  clear_env();
  setenv("SERVD_PY_STDLIB", "/nonexistent/python3.11", 1);
  expect_fail(servd_py_paths__resolve(p), "SERVD_PY_STDLIB=/nonexistent/python3.11: no such directory");
  servd_pool_options o = {.n_interpreters = 1, .world_size = 1};
  servd_pool *pool = NULL;
  expect_fail(servd_pool_create(NULL, &o, &pool), "SERVD_PY_STDLIB=/nonexistent/python3.11: no such directory");
  assert_null(pool);

  char dir[128];
  snprintf(dir, sizeof dir, "%s/notstdlib", g_dir);
  setenv("SERVD_PY_STDLIB", dir, 1);
  expect_fail(servd_py_paths__resolve(p), "has no os.py");
  clear_env();

  setenv("SERVD_LIBPYTHON", "/nonexistent/libpython3.11.so.1.0", 1);
  expect_fail(servd_py_paths__resolve(p), "SERVD_LIBPYTHON=/nonexistent/libpython3.11.so.1.0: no such readable file");
  expect_fail(servd_pool_create(NULL, &o, &pool), "SERVD_LIBPYTHON=/nonexistent/libpython3.11.so.1.0");
  clear_env();

  setenv("SERVD_PYMOD_PATH", "/nonexistent/servd.so", 1);
  expect_fail(servd_py_paths__resolve(p), "SERVD_PYMOD_PATH=/nonexistent/servd.so: no such readable file");
  clear_env();
  setenv("SERVD_PYMOD", "/nonexistent/servd.so", 1);
  expect_fail(servd_py_paths__resolve(p), "SERVD_PYMOD=/nonexistent/servd.so");
  clear_env();

  setenv("SERVD_PY_ALLOW_DIR", "/nonexistent/dist-packages", 1);
  expect_fail(servd_py_paths__resolve(p), "SERVD_PY_ALLOW_DIR=/nonexistent/dist-packages: no such directory");
  clear_env();
  /* an empty variable means unset */
  setenv("SERVD_PY_STDLIB", "", 1);
  assert_int_equal(servd_py_paths__resolve(p), 0);
  clear_env();
  free(p);
}

/* Device options are checked before any interpreter starts. */
static void test_pool_device_options(void **state) {
  (void)state;
  clear_env();
  servd_pool *pool = NULL;
  const int devs[2] = {999, 998};
  servd_pool_options o = {.n_interpreters = 1, .world_size = 1, .rank_devices = devs};
  expect_fail(servd_pool_create(NULL, &o, &pool), "interp pool: rank 0 on GPU 999, but");
  assert_null(pool);
  const int neg[1] = {-1};
  o.rank_devices = neg;
  expect_fail(servd_pool_create(NULL, &o, &pool), "rank 0 on GPU -1");
  /* two GPU ranks need a device communicator (or a host one) */
  servd_pool_options o2 = {.n_interpreters = 2, .world_size = 2, .rank_devices = devs};
  expect_fail(servd_pool_create(NULL, &o2, &pool), "world_size 2 needs a communicator");
  assert_null(pool);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_defaults),
      cmocka_unit_test(test_overrides_used),
      cmocka_unit_test(test_bad_overrides),
      cmocka_unit_test(test_pool_device_options),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
