/* The host's side of the heap checking mode: where the checker is, and putting it in front of the
 * main heap (LD_PRELOAD at the early re-exec) and of each namespace's heap (dlmopen'd first). */
#include "heap_check-impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "heap_check.h"
#include "interp-impl.h"

bool servd_heap_check__on(void) {
  const char *v = getenv("SERVD_HEAP_CHECK");
  return v && strcmp(v, "1") == 0;
}

static const char *lib_path(void) {
  const char *v = getenv("SERVD_HEAPCHECK_LIB");
  return v && *v ? v : SERVD_HEAPCHECK_PATH;
}

/* the namespace's copy needs libpython3.11.so.1.0 (found by the loader's search) */
static const char *ns_lib_path(void) {
  const char *v = getenv("SERVD_HEAPCHECK_NS_LIB");
  return v && *v ? v : SERVD_HEAPCHECK_NS_PATH;
}

typedef void (*set_name_fn)(const char *);

static set_name_fn main_checker(void) { return (set_name_fn)dlsym(RTLD_DEFAULT, SERVD_HEAP_CHECK_NAME_FN); }

int servd_heap_check__preload_env(void) {
  if (!servd_heap_check__on()) return 0;
  set_name_fn set = main_checker();
  if (set) {
    set("main program");
    return 0;
  }
  const char *lib = lib_path();
  const char *cur = getenv("LD_PRELOAD");
  size_t n = strlen(lib) + (cur ? strlen(cur) + 1 : 0) + 1;
  char *v = malloc(n);
  if (!v) return servd_fail(SERVD_ENOMEM, "interp: heap check");
  snprintf(v, n, "%s%s%s", lib, cur && *cur ? ":" : "", cur ? cur : ""); /* first: in front of libc */
  setenv("LD_PRELOAD", v, 1);
  free(v);
  return 1;
}

int servd_heap_check__open_ns(int slot, Lmid_t *lmid) {
  set_name_fn set = main_checker();
  if (!set)
    return servd_fail(SERVD_EUNSUPPORTED,
                      "interp: SERVD_HEAP_CHECK=1 but the main program's heap has no checker: call "
                      "servd_interp_early_init() first in main, or start with LD_PRELOAD=%s",
                      lib_path());
  set("main program");
  void *h = dlmopen(LM_ID_NEWLM, ns_lib_path(), RTLD_NOW | RTLD_LOCAL);
  if (!h) return servd_fail(SERVD_EIO, "interp: heap check: dlmopen %s: %s", ns_lib_path(), dlerror());
  if (dlinfo(h, RTLD_DI_LMID, lmid) != 0)
    return servd_fail(SERVD_EUNSUPPORTED, "interp: heap check: dlinfo(RTLD_DI_LMID): %s", dlerror());
  set_name_fn set_ns = (set_name_fn)dlsym(h, SERVD_HEAP_CHECK_NAME_FN);
  if (!set_ns)
    return servd_fail(SERVD_EFORMAT, "interp: heap check: %s has no %s", ns_lib_path(), SERVD_HEAP_CHECK_NAME_FN);
  char name[64];
  snprintf(name, sizeof name, "interpreter namespace %d (lmid %ld)", slot, (long)*lmid);
  set_ns(name);
  return 0;
}
