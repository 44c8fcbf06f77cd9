/* Where servd's own Python packages are: see py_deps.h. */
#include "engine/py_deps.h"

#include <limits.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static pthread_once_t once = PTHREAD_ONCE_INIT;
static char dir[PATH_MAX];
static const char *found;

static bool is_dir(const char *p) {
  struct stat st;
  return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

static void resolve(void) {
  const char *env = getenv("SERVD_PY_DEPS");
  if (env && *env) {
    snprintf(dir, sizeof dir, "%s", env);
    found = dir;
    return;
  }
  char exe[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n <= 0) return;
  exe[n] = 0;
  char *slash = strrchr(exe, '/');
  if (!slash) return;
  *slash = 0;
  static const char *const rel[] = {"/../python-deps", "/../lib/servd/python-deps"};
  for (size_t i = 0; i < sizeof rel / sizeof rel[0]; i++) {
    char p[PATH_MAX];
    if (snprintf(p, sizeof p, "%s%s", exe, rel[i]) >= (int)sizeof p || !is_dir(p)) continue;
    if (!realpath(p, dir)) continue;
    found = dir;
    return;
  }
}

const char *servd_py_deps_dir(void) {
  pthread_once(&once, resolve);
  return found;
}
