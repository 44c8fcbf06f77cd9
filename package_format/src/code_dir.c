/* Where a family's model code is found at run time. No source-tree path is compiled in: an
 * installed or relocated modelpkg finds <prefix>/share/servd/models/<family> from its own
 * location, and the build tree has share/servd/models (a link to the source's models/, made by
 * CMake) above every executable it builds. */
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "arch.h"
#include "mpk/import.h"
#include "servd/status.h"

#define MAX_UP 3 /* build-tree executables sit at most this deep below the build folder */

int mpk__code_dir_for(const mpk_arch *a, char *out, size_t cap) {
  char exe[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n <= 0)
    return servd_fail(
        SERVD_EINVAL,
        "cannot find this executable (/proc/self/exe: %s) to locate models/%s; set --code or SERVD_MODEL_CODE",
        strerror(errno), a->code);
  exe[n] = 0;
  char *slash = strrchr(exe, '/');
  if (slash) *slash = 0;
  char dir[PATH_MAX];
  snprintf(dir, sizeof dir, "%s", exe);
  for (int up = 0; up <= MAX_UP; up++) {
    struct stat st;
    int k = snprintf(out, cap, "%s/share/servd/models/%s", dir, a->code);
    if (k > 0 && (size_t)k < cap && stat(out, &st) == 0 && S_ISDIR(st.st_mode)) return 0;
    if (!(slash = strrchr(dir, '/')) || slash == dir) break;
    *slash = 0;
  }
  return servd_fail(SERVD_EINVAL,
                    "no model code for architecture %s: %s/share/servd/models/%s and the same under its %d parent "
                    "folders do not exist (set --code DIR or SERVD_MODEL_CODE)",
                    a->name, exe, a->code, MAX_UP);
}

static char default_dir[PATH_MAX];
static const char *default_ptr;
static pthread_once_t default_once = PTHREAD_ONCE_INIT;

static void find_default(void) {
  if (mpk__code_dir_for(&mpk__arch_llama, default_dir, sizeof default_dir) == 0) default_ptr = default_dir;
}

const char *mpk_default_code_dir(void) {
  const char *e = getenv("SERVD_MODEL_CODE");
  if (e && *e) return e;
  pthread_once(&default_once, find_default);
  return default_ptr;
}
