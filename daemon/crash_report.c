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
#include <sys/syscall.h>
#include <sys/uio.h>
#include <ucontext.h>
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

static void put_dec(long v) {
  char buf[24];
  int i = (int)sizeof buf - 1;
  buf[i] = 0;
  unsigned long u = v < 0 ? -(unsigned long)v : (unsigned long)v;
  do buf[--i] = (char)('0' + u % 10);
  while ((u /= 10) && i > 1);
  if (v < 0) buf[--i] = '-';
  put(buf + i);
}

/* The faulting thread: its id and name (servd names its threads: scheduler, rank workers, ...). */
static void put_thread(void) {
  put("  thread ");
  put_dec((long)syscall(SYS_gettid));
  char name[32];
  int fd = open("/proc/thread-self/comm", O_RDONLY);
  ssize_t n = fd >= 0 ? read(fd, name, sizeof name - 1) : -1;
  if (fd >= 0) close(fd);
  if (n > 0) {
    name[n] = 0;
    if (name[n - 1] == '\n') name[n - 1] = 0;
    put(" \"");
    put(name);
    put("\"");
  }
  put("\n");
}

#if defined(__x86_64__)
/* Registers, each naming the file it points into, and the code bytes around the faulting
 * instruction (read with process_vm_readv, which fails rather than faults on unmapped memory), so
 * that a crash inside a library without symbols can still be disassembled: see docs/operations.md. */
static void put_machine_state(const ucontext_t *uc) {
  static const struct {
    const char *name;
    int reg;
  } regs[] = {{"rip", REG_RIP}, {"rsp", REG_RSP}, {"rbp", REG_RBP}, {"rax", REG_RAX}, {"rbx", REG_RBX},
              {"rcx", REG_RCX}, {"rdx", REG_RDX}, {"rsi", REG_RSI}, {"rdi", REG_RDI}, {"r8", REG_R8},
              {"r9", REG_R9},   {"r10", REG_R10}, {"r11", REG_R11}, {"r12", REG_R12}, {"r13", REG_R13},
              {"r14", REG_R14}, {"r15", REG_R15}};
  put("  registers:\n");
  for (size_t i = 0; i < sizeof regs / sizeof *regs; i++) {
    put("    ");
    put(regs[i].name);
    put(" ");
    uintptr_t v = (uintptr_t)uc->uc_mcontext.gregs[regs[i].reg];
    put_hex(v);
    describe(v);
    put("\n");
  }
  enum { BEFORE = 48, AFTER = 16 };
  uintptr_t pc = (uintptr_t)uc->uc_mcontext.gregs[REG_RIP];
  unsigned char code[BEFORE + AFTER];
  struct iovec local = {code, sizeof code}, remote = {(void *)(pc - BEFORE), sizeof code};
  ssize_t got = syscall(SYS_process_vm_readv, (long)getpid(), &local, 1L, &remote, 1L, 0L);
  size_t start = 0;
  if (got != (ssize_t)sizeof code) { /* the bytes before pc may be unmapped: from pc on */
    remote = (struct iovec){(void *)pc, AFTER};
    local = (struct iovec){code + BEFORE, AFTER};
    got = syscall(SYS_process_vm_readv, (long)getpid(), &local, 1L, &remote, 1L, 0L);
    start = BEFORE;
    if (got != AFTER) return;
  }
  put("  code at rip-");
  put_dec((long)(BEFORE - start));
  put(" (rip is the byte after '|'): ");
  for (size_t i = start; i < sizeof code; i++) {
    if (i == BEFORE) put("|");
    char hx[3] = {"0123456789abcdef"[code[i] >> 4], "0123456789abcdef"[code[i] & 15], 0};
    put(hx);
  }
  put("\n");
}
#endif

static void on_fatal(int sig, siginfo_t *si, void *uc) {
  static volatile sig_atomic_t reporting;
  if (!reporting) { /* one report: a second thread faulting meanwhile just dies */
    reporting = 1;
    put("servd: fatal signal ");
    char num[8] = {0};
    num[0] = (char)('0' + sig / 10);
    num[1] = (char)('0' + sig % 10);
    put(sig < 10 ? num + 1 : num);
    put(" (");
    put(sig == SIGSEGV  ? "SIGSEGV"
        : sig == SIGBUS ? "SIGBUS"
        : sig == SIGILL ? "SIGILL"
        : sig == SIGFPE ? "SIGFPE"
                        : "SIGABRT");
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
    put_thread();
#if defined(__x86_64__)
    if (uc) put_machine_state(uc);
#endif
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
