/* The fatal-signal report (daemon/crash_report.c) of a real fault: a thread named "faulter" reads
 * address 0x1bd9 (a field of a NULL struct pointer, the way library crashes look).
 *
 * Oracle: the report names the signal, the address and the thread; its backtrace and its rip name
 * this executable; and the code bytes it prints from rip on are the bytes of this executable's file
 * at the file offset the report gives for rip (read here independently, from /proc/self/exe). */
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "crash_report.h"

/* Reads a byte at 0x1bd9, the way a field of a NULL struct pointer is read (not sanitized: the
 * sanitizers would report the NULL member access before the fault). */
__attribute__((no_sanitize("address", "undefined"))) static void *faulter(void *arg) {
  volatile const char *field = (volatile const char *)((uintptr_t)arg + 0x1bd9);
  pthread_setname_np(pthread_self(), "faulter"); /* by itself: named before it faults, whatever runs first */
  servd_crash_report_thread();
  return (void *)(intptr_t)*field;
}

static void child(int out_fd) {
  dup2(out_fd, STDERR_FILENO);
  servd_crash_report_install();
  pthread_t t;
  if (pthread_create(&t, NULL, faulter, NULL) != 0) _exit(3); /* arg: the NULL struct pointer */
  pthread_join(t, NULL);
  _exit(4); /* not reached: the fault kills the process */
}

static char *run_child(int *status) {
  int fds[2];
  assert_int_equal(pipe(fds), 0);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    close(fds[0]);
    child(fds[1]);
  }
  close(fds[1]);
  size_t cap = 1 << 16, len = 0;
  char *buf = calloc(1, cap);
  ssize_t r;
  while (len < cap - 1 && (r = read(fds[0], buf + len, cap - 1 - len)) > 0) len += (size_t)r;
  close(fds[0]);
  assert_int_equal(waitpid(pid, status, 0), pid);
  return buf; /* caller frees */
}

static void test_real_fault(void **state) {
  (void)state;
  int status = 0;
  char *rep = run_child(&status);
  printf("%s", rep);
  if (!(WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV)) {
    free(rep);
    fail_msg("the child ended with status %#x, not SIGSEGV", status);
  }
  assert_non_null(strstr(rep, "servd: fatal signal 11 (SIGSEGV), address 0x1bd9;"));
  assert_non_null(strstr(rep, "thread "));
  assert_non_null(strstr(rep, "\"faulter\""));
#if defined(__x86_64__)
  /* "    rip 0x... /path/to/exe+0xOFF" */
  const char *rip = strstr(rep, "    rip 0x");
  assert_non_null(rip);
  const char *file = strchr(rip + 10, ' ');
  assert_non_null(file);
  file++;
  const char *plus = strstr(file, "+0x");
  assert_non_null(plus);
  char path[512];
  snprintf(path, sizeof path, "%.*s", (int)(plus - file), file);
  char self[512];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  assert_true(n > 0);
  self[n] = 0;
  assert_string_equal(path, self);
  unsigned long long off = strtoull(plus + 3, NULL, 16);
  /* the bytes after '|' */
  const char *code = strstr(rep, "code at rip-");
  assert_non_null(code);
  const char *bytes = strstr(code, "): ");
  assert_non_null(bytes);
  const char *bar = strchr(bytes, '|');
  assert_non_null(bar);
  unsigned char want[16];
  int fd = open("/proc/self/exe", O_RDONLY);
  assert_true(fd >= 0);
  assert_int_equal(pread(fd, want, sizeof want, (off_t)off), (ssize_t)sizeof want);
  close(fd);
  for (size_t i = 0; i < sizeof want; i++) {
    unsigned v = 0;
    assert_int_equal(sscanf(bar + 1 + 2 * i, "%2x", &v), 1);
    assert_int_equal(v, want[i]);
  }
#endif
  free(rep);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_real_fault)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
