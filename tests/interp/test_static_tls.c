/* Static TLS left after interpreter namespaces exist. Each namespace's libc takes static TLS from
 * the surplus that glibc reserves at startup (sized by glibc.rtld.nns and glibc.rtld.optional_static_tls: early_init.c); what remains is all a library
 * with initial-exec TLS loaded later (the CUDA driver, loaded at the first CUDA call) can get. The
 * remaining amount is measured, not computed: a forked child dlopens distinct copies of a probe
 * library with TLS_PROBE_BYTES of initial-exec TLS until one fails. */
#include "support.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* The least static TLS that must remain with SERVD_INTERP_MAX interpreters started (docs/cuda.md). */
#define MARGIN_BYTES (16 * 1024)
#define MAX_PROBES 256

static char g_dir[] = "/tmp/servd-tls-XXXXXX";

/* Bytes of initial-exec TLS that can still be loaded (in multiples of TLS_PROBE_BYTES). */
static long remaining(void) {
  int fds[2];
  assert_int_equal(pipe(fds), 0);
  fflush(NULL);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    long n = 0;
    char path[128];
    for (; n < MAX_PROBES; n++) {
      snprintf(path, sizeof path, "%s/probe%ld.so", g_dir, n);
      void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
      if (!h) {
        const char *e = dlerror();
        if (!e || !strstr(e, "static TLS")) n = -1 - n; /* another failure: the figure is meaningless */
        break;
      }
    }
    long bytes = n < 0 ? n : n * TLS_PROBE_BYTES;
    ssize_t w = write(fds[1], &bytes, sizeof bytes);
    _exit(w == sizeof bytes ? 0 : 1);
  }
  close(fds[1]);
  long bytes = -1;
  assert_int_equal(read(fds[0], &bytes, sizeof bytes), (ssize_t)sizeof bytes);
  close(fds[0]);
  int st;
  waitpid(pid, &st, 0);
  assert_true(bytes >= 0);
  assert_true(bytes < (long)MAX_PROBES * TLS_PROBE_BYTES); /* enough probes to run out */
  return bytes;
}

/* Starts n interpreters (namespaces are kept after destroy and reused by the next pool) with the
 * imports of a serving interpreter (chat templates, json, threads), then measures. */
static long after(int n) {
  servd_pool_options o = {.n_interpreters = n, .world_size = 1};
  servd_pool *p = NULL;
  if (servd_pool_create(NULL, &o, &p) < 0) fail_msg("pool of %d: %s", n, servd_last_error());
  for (int i = 0; i < n; i++)
    support_exec(servd_pool_get(p, i), "import json, threading, hashlib, decimal, ctypes, jinja2\n"
                                       "jinja2.Template('{{ x }}').render(x=1)\n");
  long r = remaining();
  servd_pool_destroy(p);
  return r;
}

static void test_static_tls_left(void **state) {
  (void)state;
  const int counts[] = {1, 4, SERVD_INTERP_MAX};
  long before = remaining(), left[3];
  printf("static TLS free for initial-exec libraries loaded later (GLIBC_TUNABLES=%s%s):\n", getenv("GLIBC_TUNABLES"),
         getenv("SERVD_HEAP_CHECK") ? ", heap checker on" : "");
  printf("  0 interpreters: %ld bytes\n", before);
  for (int i = 0; i < 3; i++) {
    left[i] = after(counts[i]);
    printf("  %d interpreters: %ld bytes\n", counts[i], left[i]);
  }
  assert_true(left[0] <= before);
  assert_true(left[2] <= left[1] && left[1] <= left[0]);
  if (left[2] < MARGIN_BYTES)
    fail_msg("only %ld bytes of static TLS remain after %d interpreters (at least %d must, for the CUDA "
             "driver's libraries loaded later: docs/cuda.md)",
             left[2], SERVD_INTERP_MAX, MARGIN_BYTES);
}

int main(int argc, char **argv) {
  support_early_init(argc, argv);
  if (!mkdtemp(g_dir)) return 1;
  /* distinct files: dlopen of one file twice loads it once */
  if (support_system("for i in $(seq 0 %d); do cp %s %s/probe$i.so || exit 1; done", MAX_PROBES - 1, TLS_PROBE_LIB,
                     g_dir))
    return 1;
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_static_tls_left)};
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  support_system("rm -rf %s", g_dir);
  fflush(NULL);
  _exit(rc);
}
