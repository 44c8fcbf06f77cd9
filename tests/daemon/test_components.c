/* The startup report of optional components: llguidance found (with its version) in the first of
 * the interpreters' package folders that has it, and the not-installed line naming what it disables
 * and the command that installs it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cmocka.h>

#include "components.h"

static char root[] = "/tmp/servd-components-XXXXXX";

static void mkdirf(const char *fmt, const char *a) {
  char p[512];
  snprintf(p, sizeof p, fmt, root, a);
  assert_int_equal(mkdir(p, 0755), 0);
}

static void found_and_version(void **st) {
  (void)st;
  mkdirf("%s/%s", "own");
  mkdirf("%s/%s", "debian");
  mkdirf("%s/%s/llguidance", "debian");
  mkdirf("%s/%s/llguidance-1.9.1.dist-info", "debian");
  char own[512], debian[512], version[32];
  snprintf(own, sizeof own, "%s/own", root);
  snprintf(debian, sizeof debian, "%s/debian", root);
  const char *dirs[] = {NULL, own, debian};
  assert_string_equal(servd_components_find_llguidance(dirs, 3, version, sizeof version), debian);
  assert_string_equal(version, "1.9.1");
  assert_null(servd_components_find_llguidance(dirs, 2, version, sizeof version)); /* own has none */
  mkdirf("%s/%s/llguidance", "own"); /* servd's own folder comes first; no dist-info: version unknown */
  assert_string_equal(servd_components_find_llguidance(dirs, 3, version, sizeof version), own);
  assert_string_equal(version, "");
}

static void not_installed_line(void **st) {
  (void)st;
  char own[512], empty[512];
  snprintf(own, sizeof own, "%s/none", root);
  snprintf(empty, sizeof empty, "%s/empty", root);
  mkdirf("%s/%s", "none");
  mkdirf("%s/%s", "empty");
  setenv("SERVD_PY_DEPS", own, 1); /* read once, at the first call */
  setenv("SERVD_PY_ALLOW_DIR", empty, 1);
  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  servd_components_report(f);
  fclose(f);
  assert_non_null(strstr(text, "llguidance is not installed"));
  assert_non_null(strstr(text, own));
  assert_non_null(strstr(text, "answer 501"));
  assert_non_null(strstr(text, "scripts/install-python-deps.sh"));
  assert_non_null(strstr(text, "structured outputs"));
  assert_int_equal(strchr(text, '\n') - text + 1, (long)len); /* one line */
  free(text);
}

int main(void) {
  if (!mkdtemp(root)) return 1;
  const struct CMUnitTest tests[] = {cmocka_unit_test(found_and_version), cmocka_unit_test(not_installed_line)};
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf %s", root);
  if (system(cmd) != 0) rc = 1;
  return rc;
}
