/* Optional components: the grammar engine (llguidance) of constrained decoding, a Python package the
 * interpreters import from servd's own directory (scripts/install-python-deps.sh) or from the
 * directory of Debian's Python packages. Without it every constrained request answers 501 naming the
 * script; this says so once at startup, before the first such request does. */
#include "components.h"

#include <dirent.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "engine/py_deps.h" /* where the engine puts servd's own Python packages on sys.path */

#define DEBIAN_PY_DIR "/usr/lib/python3/dist-packages"

static bool is_dir(const char *p) {
  struct stat st;
  return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

const char *servd_components_find_llguidance(const char *const *dirs, int n, char *version, size_t cap) {
  for (int i = 0; i < n; i++) {
    if (!dirs[i]) continue;
    char p[4096];
    snprintf(p, sizeof p, "%s/llguidance", dirs[i]);
    if (!is_dir(p)) continue;
    if (cap) version[0] = '\0';
    DIR *d = opendir(dirs[i]);
    struct dirent *e;
    while (d && (e = readdir(d))) { /* llguidance-1.9.1.dist-info */
      const char *dot = strstr(e->d_name, ".dist-info");
      if (strncmp(e->d_name, "llguidance-", 11) || !dot || dot[10]) continue;
      snprintf(version, cap, "%.*s", (int)(dot - e->d_name - 11), e->d_name + 11);
    }
    if (d) closedir(d);
    return dirs[i];
  }
  return NULL;
}

void servd_components_report(FILE *log) {
  const char *own = servd_py_deps_dir();
  const char *debian = getenv("SERVD_PY_ALLOW_DIR");
  if (!debian || !*debian) debian = DEBIAN_PY_DIR;
  const char *dirs[] = {own, debian};
  char version[64] = "";
  const char *where = servd_components_find_llguidance(dirs, 2, version, sizeof version);
  if (where) {
    fprintf(log, "servd: grammar engine: llguidance %s (%s)\n", version[0] ? version : "(version unknown)", where);
    return;
  }
  fprintf(log,
          "servd: grammar engine: llguidance is not installed (looked in %s%s%s): structured outputs "
          "(response_format json_schema/json_object, guided_json/regex/choice/grammar, structured_outputs) and "
          "forced tool calls (tool_choice \"required\" or named) answer 501; install it with "
          "scripts/install-python-deps.sh DIR, DIR being $SERVD_PY_DEPS or <servd's folder>/../python-deps "
          "(a build tree) or <servd's folder>/../lib/servd/python-deps (an installation)\n",
          own ? own : "", own ? " and " : "", debian);
}
