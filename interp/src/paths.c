/* Where Python and the servd module are: build-time defaults, overridable at run time so that servd
 * runs from a relocated directory (a bundle carrying its own libpython and standard library to a
 * machine whose OS has no Python 3.11). */
#include "interp-impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#ifndef SERVD_LIBPYTHON
#define SERVD_LIBPYTHON "/usr/lib/x86_64-linux-gnu/libpython3.11.so.1.0"
#endif
#ifndef SERVD_PY_STDLIB
#define SERVD_PY_STDLIB "/usr/lib/python3.11"
#endif
#ifndef SERVD_PY_DYNLOAD
#define SERVD_PY_DYNLOAD SERVD_PY_STDLIB "/lib-dynload"
#endif
#ifndef SERVD_PY_ALLOW_DIR
#define SERVD_PY_ALLOW_DIR "/usr/lib/python3/dist-packages"
#endif
#ifndef SERVD_PYMOD_PATH
#define SERVD_PYMOD_PATH ""
#endif
#define PYMOD_NAME "servd.cpython-311-x86_64-linux-gnu.so"

static const char *env(const char *name) {
  const char *v = getenv(name);
  return v && *v ? v : NULL;
}

static bool is_dir(const char *p) {
  struct stat st;
  return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

static bool is_file(const char *p) {
  struct stat st;
  return stat(p, &st) == 0 && S_ISREG(st.st_mode) && access(p, R_OK) == 0;
}

static int set(char *dst, const char *var, const char *src) {
  if (strlen(src) >= PATH_MAX) return servd_fail(SERVD_EINVAL, "interp: %s is longer than %d bytes", var, PATH_MAX - 1);
  strcpy(dst, src);
  size_t n = strlen(dst);
  while (n > 1 && dst[n - 1] == '/') /* "/opt/b/lib/python3.11/" names the same directory */
    dst[--n] = 0;
  return 0;
}

/* `what` says where a bad path came from: "SERVD_X=/p" (the environment) or "/p (built in; set SERVD_X)". */
static void origin(char *buf, size_t cap, const char *var, const char *path, bool from_env) {
  if (from_env) snprintf(buf, cap, "%s=%s", var, path);
  else snprintf(buf, cap, "%s (the built-in default; set %s to override it)", path, var);
}

static int libpython(servd_py_paths *p) {
  const char *e = env("SERVD_LIBPYTHON");
  int rc = set(p->libpython, "SERVD_LIBPYTHON", e ? e : SERVD_LIBPYTHON);
  if (rc == 0 && !is_file(p->libpython)) {
    char o[PATH_MAX + 96];
    origin(o, sizeof o, "SERVD_LIBPYTHON", p->libpython, e);
    rc = servd_fail(SERVD_EIO, "interp: %s: no such readable file (expected libpython3.11.so.1.0)", o);
  }
  return rc;
}

static int stdlib(servd_py_paths *p) {
  const char *e = env("SERVD_PY_STDLIB");
  int rc = set(p->stdlib, "SERVD_PY_STDLIB", e ? e : SERVD_PY_STDLIB);
  if (rc == 0) {
    if (e && strlen(e) + sizeof "/lib-dynload" > PATH_MAX)
      return servd_fail(SERVD_EINVAL, "interp: SERVD_PY_STDLIB is longer than %d bytes", PATH_MAX - 16);
    if (e) {
      if (snprintf(p->dynload, sizeof p->dynload, "%s/lib-dynload", p->stdlib) >= (int)sizeof p->dynload)
        return servd_fail(SERVD_EINVAL, "interp: SERVD_PY_STDLIB is longer than %d bytes", PATH_MAX - 16);
    } else rc = set(p->dynload, "SERVD_PY_STDLIB", SERVD_PY_DYNLOAD);
  }
  if (rc < 0) return rc;
  char o[PATH_MAX + 96], landmark[PATH_MAX + 16];
  origin(o, sizeof o, "SERVD_PY_STDLIB", p->stdlib, e);
  if (!is_dir(p->stdlib))
    return servd_fail(SERVD_EIO,
                      "interp: %s: no such directory (expected the Python 3.11 standard library, "
                      "like /usr/lib/python3.11)",
                      o);
  snprintf(landmark, sizeof landmark, "%s/os.py", p->stdlib);
  if (!is_file(landmark)) return servd_fail(SERVD_EIO, "interp: %s has no os.py: not a Python standard library", o);
  if (!is_dir(p->dynload)) return servd_fail(SERVD_EIO, "interp: %s has no lib-dynload directory (%s)", o, p->dynload);
  return 0;
}

static int allow_dir(servd_py_paths *p) {
  const char *e = env("SERVD_PY_ALLOW_DIR");
  int rc = set(p->allow_dir, "SERVD_PY_ALLOW_DIR", e ? e : SERVD_PY_ALLOW_DIR);
  /* the default may be missing (then jinja2 is not importable); a directory asked for must exist */
  if (rc == 0 && e && !is_dir(e))
    rc = servd_fail(SERVD_EIO,
                    "interp: SERVD_PY_ALLOW_DIR=%s: no such directory (expected the directory "
                    "holding jinja2 and markupsafe, like /usr/lib/python3/dist-packages)",
                    e);
  return rc;
}

/* $SERVD_PYMOD_PATH (or $SERVD_PYMOD), else the build tree's, else <exe dir>/../lib/servd/. */
static int pymod(servd_py_paths *p) {
  const char *var = "SERVD_PYMOD_PATH", *e = env(var);
  if (!e) {
    var = "SERVD_PYMOD";
    e = env(var);
  }
  if (e) {
    int rc = set(p->pymod, var, e);
    if (rc == 0 && !is_file(e))
      rc = servd_fail(SERVD_EIO, "interp: %s=%s: no such readable file (expected the servd module %s)", var, e,
                      PYMOD_NAME);
    return rc;
  }
  if (SERVD_PYMOD_PATH[0] && is_file(SERVD_PYMOD_PATH)) return set(p->pymod, var, SERVD_PYMOD_PATH);
  char exe[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n > 0) {
    exe[n] = 0;
    char *slash = strrchr(exe, '/');
    if (slash) {
      *slash = 0;
      if (snprintf(p->pymod, sizeof p->pymod, "%s/../lib/servd/%s", exe, PYMOD_NAME) < (int)sizeof p->pymod &&
          is_file(p->pymod))
        return 0;
    }
  }
  return servd_fail(SERVD_EIO, "interp: the servd Python module (%s) was not found: set SERVD_PYMOD_PATH", PYMOD_NAME);
}

int servd_py_paths__resolve(servd_py_paths *p) {
  memset(p, 0, sizeof *p);
  int rc = libpython(p);
  if (rc == 0) rc = stdlib(p);
  if (rc == 0) rc = allow_dir(p);
  if (rc == 0) rc = pymod(p);
  return rc;
}
