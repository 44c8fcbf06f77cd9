/* Fatal-signal reports: see crash_report.h. Only async-signal-safe calls after the signal (write,
 * open, read, close), except backtrace(), which is loaded before any signal (its first call may
 * allocate). */
#include "crash_report.h"

#include <execinfo.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_FRAMES 48

static void put(const char *s) {
  size_t n = strlen(s);
  while (n > 0) {
    ssize_t w = write(STDERR_FILENO, s, n);
    if (w <= 0) return;
    s += w;
    n -= (size_t)w;
  }
}

static void put_hex(uintptr_t v) {
  char buf[2 + 2 * sizeof v + 1];
  int i = (int)sizeof buf - 1;
  buf[i] = 0;
  do {
    buf[--i] = "0123456789abcdef"[v & 15];
    v >>= 4;
  } while (v && i > 2);
  buf[--i] = 'x';
  buf[--i] = '0';
  put(buf + i);
}

static uintptr_t parse_hex(const char **p) {
  uintptr_t v = 0;
  for (;; (*p)++) {
    char c = **p;
    int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    if (d < 0) return v;
    v = v * 16 + (uintptr_t)d;
  }
}

/* Finds the mapping holding addr in /proc/self/maps: its file and the file offset of addr. */
static void describe(uintptr_t addr) {
  static char buf[1 << 18]; /* only the reporting thread gets here: see the handler */
  int fd = open("/proc/self/maps", O_RDONLY);
  if (fd < 0) return;
  size_t len = 0;
  ssize_t r;
  while (len < sizeof buf - 1 && (r = read(fd, buf + len, sizeof buf - 1 - len)) > 0) len += (size_t)r;
  close(fd);
  buf[len] = 0;
  for (char *line = buf; *line;) {
    char *end = strchr(line, '\n');
    if (end) *end = 0;
    const char *p = line;
    uintptr_t lo = parse_hex(&p);
    p++;
    uintptr_t hi = parse_hex(&p);
    if (addr >= lo && addr < hi) {
      while (*p && *p != ' ') p++; /* perms */
      while (*p == ' ') p++;
      while (*p && *p != ' ') p++;
      while (*p == ' ') p++;
      uintptr_t off = parse_hex(&p);
      const char *path = strchr(p, '/');
      put(" ");
      put(path ? path : "[anonymous]");
      put("+");
      put_hex(addr - lo + off);
      return;
    }
    if (!end) break;
    line = end + 1;
  }
}

static void on_fatal(int sig, siginfo_t *si, void *uc) {
  (void)uc;
  static volatile sig_atomic_t reporting;
  if (!reporting) { /* one report: a second thread faulting meanwhile just dies */
    reporting = 1;
    put("servd: fatal signal ");
    char num[8] = {0};
    num[0] = (char)('0' + sig / 10);
    num[1] = (char)('0' + sig % 10);
    put(sig < 10 ? num + 1 : num);
    put(" (");
    put(sig == SIGSEGV ? "SIGSEGV" : sig == SIGBUS ? "SIGBUS" : sig == SIGILL ? "SIGILL" : sig == SIGFPE ? "SIGFPE" : "SIGABRT");
    put("), address ");
    put_hex((uintptr_t)si->si_addr);
    put("; backtrace (file+offset: addr2line -e FILE OFFSET):\n");
    void *frames[MAX_FRAMES];
    int n = backtrace(frames, MAX_FRAMES);
    for (int i = 0; i < n; i++) {
      put("  ");
      put_hex((uintptr_t)frames[i]);
      describe((uintptr_t)frames[i]);
      put("\n");
    }
  }
  signal(sig, SIG_DFL);
  raise(sig);
}

void servd_crash_report_thread(void) {
  stack_t ss = {.ss_size = 64 * 1024};
  ss.ss_sp = malloc(ss.ss_size); /* lives as long as the thread; threads of servd live to exit */
  if (ss.ss_sp && sigaltstack(&ss, NULL) != 0) free(ss.ss_sp);
}

void servd_crash_report_install(void) {
  void *warm[1];
  (void)backtrace(warm, 1); /* loads the unwinder now, not inside the handler */
  servd_crash_report_thread();
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_fatal;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESETHAND;
  sigemptyset(&sa.sa_mask);
  int sigs[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT};
  for (size_t i = 0; i < sizeof sigs / sizeof *sigs; i++) sigaction(sigs[i], &sa, NULL);
}
