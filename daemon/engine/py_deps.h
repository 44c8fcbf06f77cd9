/* Where servd's own Python packages (llguidance: constrained decoding) are installed, for the
 * interpreters' sys.path (internal to the engine). scripts/install-python-deps.sh puts them there. */
#ifndef SERVD_ENGINE_PY_DEPS_H
#define SERVD_ENGINE_PY_DEPS_H

/* $SERVD_PY_DEPS when set and not empty; else <executable dir>/../python-deps (a build tree:
 * build/daemon/servd -> build/python-deps) when it exists; else <executable dir>/../lib/servd/python-deps
 * (an installed tree) when it exists; else NULL. Resolved once; the string lives as long as the process. */
const char *servd_py_deps_dir(void);

#endif
