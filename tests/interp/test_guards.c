/* Guards against process-wide calls in model code (interp/pymod/bootstrap.py, install_guards):
 * os._exit, os.abort, kills of the own process, signal handlers and timers, fork/exec/spawn,
 * faulthandler's handlers and its crash helpers, libc's fatal calls through ctypes. Each must raise
 * RuntimeError in the interpreter; before the guards most of these ended this test process, which
 * is the failure mode of this test. Also at import time: a package whose import calls os._exit fails
 * to load with that error, and sys.exit at import is a SystemExit error, not an exit. */
#include "support.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *const refused[] = {
    "import os\nos._exit(3)",
    "import os\nos.abort()",
    "import posix\nposix._exit(3)",
    "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)",
    "import os, signal\nos.kill(0, signal.SIGTERM)",
    "import os, signal\nos.killpg(os.getpgrp(), signal.SIGTERM)",
    "import signal\nsignal.signal(signal.SIGTERM, lambda *a: None)",
    "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)",
    "import signal\nsignal.alarm(1)",
    "import signal\nsignal.setitimer(signal.ITIMER_REAL, 0.5)",
    "import signal\nsignal.set_wakeup_fd(2)",
    "import signal\nsignal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})",
    "import signal, threading\nsignal.pthread_kill(threading.get_ident(), signal.SIGTERM)",
    "import signal\nsignal.raise_signal(signal.SIGTERM)",
    "import os\nos.fork()",
    "import os\nos.forkpty()",
    "import os\nos.execv('/bin/true', ['true'])",
    "import os\nos.execlp('true', 'true')",
    "import os\nos.posix_spawn('/bin/true', ['true'], {})",
    "import os\nos.system('true')",
    "import os\nos.popen('true')",
    "import subprocess\nsubprocess.run(['true'])",
    "import faulthandler\nfaulthandler.enable()",
    "import faulthandler, signal\nfaulthandler.register(signal.SIGUSR1)",
    "import faulthandler\nfaulthandler._sigsegv()",
    "import faulthandler\nfaulthandler.dump_traceback_later(1, exit=True)",
    "import ctypes\nctypes.CDLL(None)._exit(3)",
    "import ctypes\nctypes.CDLL(None).abort()",
    "import ctypes\nctypes.CDLL(None).kill(0, 15)",
    /* the audit hook keeps the guard when the module is imported again */
    "import sys, signal\ndel sys.modules['posix']\nimport posix\nposix.kill(posix.getpid(), signal.SIGTERM)",
};

static void test_refused_calls(void **state) {
  (void)state;
  servd_pool_options o = {.n_interpreters = 1, .world_size = 1};
  servd_pool *p = NULL;
  assert_int_equal(servd_pool_create(NULL, &o, &p), 0);
  servd_interp *it = servd_pool_get(p, 0);
  for (size_t i = 0; i < sizeof refused / sizeof *refused; i++)
    support_expect_raises(it, refused[i], "RuntimeError", "is not allowed in servd model code");
  support_expect_raises(it, "import os\nos._exit(3)", "RuntimeError",
                        "os._exit() is not allowed in servd model code: it would end the whole server");
  /* What stays allowed: signal 0 (does the process exist?), reading dispositions, a traceback dump
   * without exit, ctypes calls that are not process-wide, SystemExit as an exception. */
  support_exec(it, "import os, signal, faulthandler, ctypes\n"
                   "os.kill(os.getpid(), 0)\n"
                   "h = signal.getsignal(signal.SIGTERM)\n"
                   "faulthandler.dump_traceback_later(60)\n"
                   "faulthandler.cancel_dump_traceback_later()\n"
                   "assert ctypes.CDLL(None).getpid() == os.getpid()\n");
  support_expect_raises(it, "import sys\nsys.exit(3)", "SystemExit", "3");
  /* the interpreter keeps working */
  assert_int_equal(support_eval_int(it, "6 * 7"), 42);
  servd_pool_destroy(p);
}

static void write_file(const char *dir, const char *name, const char *text) {
  char path[1024];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs(text, f);
  fclose(f);
}

/* Packs a generic package whose model.py is `code` and tries to load it; returns the pool's rc. */
static int load_with(const char *tag, const char *code, servd_py_error *err) {
  char dir[600], out[700];
  snprintf(dir, sizeof dir, "%s/guard_%s", TEST_WORK_DIR, tag);
  snprintf(out, sizeof out, "%s.mpk", dir);
  mkdir(TEST_WORK_DIR, 0755);
  support_system("rm -rf %s", dir);
  mkdir(dir, 0755);
  write_file(dir, "__init__.py", "");
  write_file(dir, "model.py", code);
  char entry[64];
  snprintf(entry, sizeof entry, "guard_%s.model:Model", tag);
  assert_int_equal(support_system("%s pack --kind generic --code %s --entry-point %s -o %s --quiet >/dev/null",
                                  MODELPKG_EXE, dir, entry, out),
                   0);
  mpk_package *pkg = NULL;
  assert_int_equal(mpk_open(out, &pkg), 0);
  servd_pool_options o = {.n_interpreters = 1, .world_size = 1, .error = err};
  servd_pool *p = NULL;
  int rc = servd_pool_create(pkg, &o, &p);
  servd_pool_destroy(p);
  mpk_close(pkg);
  return rc;
}

static void test_import_time(void **state) {
  (void)state;
  servd_py_error err;
  assert_int_equal(load_with("exit", "import os\nos._exit(3)\nclass Model:\n    pass\n", &err), SERVD_EINVAL);
  assert_string_equal(err.type, "RuntimeError");
  assert_non_null(strstr(err.message, "os._exit() is not allowed in servd model code"));
  assert_non_null(strstr(servd_last_error(), "os._exit()"));
  assert_int_equal(load_with("handler",
                             "import signal\nclass Model:\n    def __init__(self):\n"
                             "        signal.signal(signal.SIGTERM, signal.SIG_DFL)\n",
                             &err),
                   SERVD_EINVAL);
  assert_non_null(strstr(err.message, "signal.signal() is not allowed"));
  /* sys.exit at import is an exception like any other: the load fails, the process lives on */
  assert_int_equal(load_with("sysexit", "import sys\nsys.exit(3)\nclass Model:\n    pass\n", &err), SERVD_EINVAL);
  assert_string_equal(err.type, "SystemExit");
}

int main(int argc, char **argv) {
  support_early_init(argc, argv);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_refused_calls),
      cmocka_unit_test(test_import_time),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
