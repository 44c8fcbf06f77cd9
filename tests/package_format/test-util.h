/* A scratch folder per test program, shared by the package tests that write files: created by the
 * group setup, removed with everything in it by the group teardown.
 * Define TEST_DIR_TEMPLATE (a mkdtemp template) before including. */
#ifndef SERVD_TEST_PACKAGE_UTIL_H
#define SERVD_TEST_PACKAGE_UTIL_H

#include <stdio.h>
#include <stdlib.h>

#ifndef TEST_DIR_TEMPLATE
#error "define TEST_DIR_TEMPLATE before including test-util.h"
#endif

static char dir[256];

static int setup(void **state) {
  (void)state;
  snprintf(dir, sizeof dir, "%s", TEST_DIR_TEMPLATE);
  return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state) {
  (void)state;
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  return system(cmd) == 0 ? 0 : -1;
}

#endif
