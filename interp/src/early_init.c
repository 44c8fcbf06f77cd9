/* servd_interp_early_init: make room for many namespaces before anything else runs. */
#include "interp-impl.h"
#include "heap_check-impl.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

/* nns=16: static TLS for 15 namespaces' libcs (about 150 bytes each). optional_static_tls adds to the
 * same surplus, which is also all a library with initial-exec TLS loaded later (the CUDA driver) can
 * get: with nns=16 alone only 2816 bytes were left after 15 interpreters (tests/interp/test_static_tls.c,
 * docs/cuda.md). */
#define NNS_TUNABLE "glibc.rtld.nns=16:glibc.rtld.optional_static_tls=16384"
#define REEXEC_MARK "SERVD_INTERP_REEXEC"

int servd_interp_early_init(int argc, char **argv) {
  (void)argc;
  const char *cur = getenv("GLIBC_TUNABLES");
  int heap_check = servd_heap_check__preload_env(); /* 1: re-exec with the checker preloaded */
  if (heap_check < 0) return heap_check;
  bool has_nns = cur && strstr(cur, NNS_TUNABLE);
  if (has_nns && !heap_check) {
    if (getenv(REEXEC_MARK) && argv && argv[0]) {
      /* exec of /proc/self/exe named the process "exe": give it back its own name (ps, pkill, top) */
      const char *base = strrchr(argv[0], '/');
      prctl(PR_SET_NAME, base ? base + 1 : argv[0], 0, 0, 0);
    }
    unsetenv(REEXEC_MARK);
    servd_tls_keys__reserve_main(); /* before any library of the main program makes a key */
    return 0;
  }
  if (getenv(REEXEC_MARK))
    return servd_fail(SERVD_EUNSUPPORTED, "interp: re-executed with GLIBC_TUNABLES=%s%s but %s", NNS_TUNABLE,
                      heap_check ? " and the heap checker preloaded" : "",
                      has_nns ? "the heap checker did not load (SERVD_HEAPCHECK_LIB?)" : "the tunable is not set");
  if (has_nns) goto reexec;
  size_t n = (cur ? strlen(cur) + 1 : 0) + sizeof NNS_TUNABLE;
  char *v = malloc(n);
  if (!v) return servd_fail(SERVD_ENOMEM, "interp: early init");
  snprintf(v, n, "%s%s%s", cur ? cur : "", cur ? ":" : "", NNS_TUNABLE);
  setenv("GLIBC_TUNABLES", v, 1);
  free(v);
reexec:
  setenv(REEXEC_MARK, "1", 1);
  fflush(NULL);
  execv("/proc/self/exe", argv);
  return servd_fail(SERVD_EIO, "interp: re-exec with GLIBC_TUNABLES=%s: %s", NNS_TUNABLE, strerror(errno));
}
