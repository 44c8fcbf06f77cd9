/* servd_interp_early_init: make room for many namespaces before anything else runs. */
#include "interp-impl.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

#define NNS_TUNABLE "glibc.rtld.nns=16"
#define REEXEC_MARK "SERVD_INTERP_REEXEC"

int servd_interp_early_init(int argc, char **argv) {
  (void)argc;
  const char *cur = getenv("GLIBC_TUNABLES");
  if (cur && strstr(cur, NNS_TUNABLE)) {
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
    return servd_fail(SERVD_EUNSUPPORTED, "interp: re-executed with GLIBC_TUNABLES=%s but it is not set", NNS_TUNABLE);
  size_t n = (cur ? strlen(cur) + 1 : 0) + sizeof NNS_TUNABLE;
  char *v = malloc(n);
  if (!v)
    return servd_fail(SERVD_ENOMEM, "interp: early init");
  snprintf(v, n, "%s%s%s", cur ? cur : "", cur ? ":" : "", NNS_TUNABLE);
  setenv("GLIBC_TUNABLES", v, 1);
  free(v);
  setenv(REEXEC_MARK, "1", 1);
  fflush(NULL);
  execv("/proc/self/exe", argv);
  return servd_fail(SERVD_EIO, "interp: re-exec with GLIBC_TUNABLES=%s: %s", NNS_TUNABLE, strerror(errno));
}
