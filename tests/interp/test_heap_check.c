/* The heap checking mode (SERVD_HEAP_CHECK=1, interp/heapcheck): a block freed by a heap other than
 * the one that allocated it aborts the process with a report naming both; blocks that stay in their
 * heap, through real interpreter work, do not. The crossings run in a child (this program again,
 * with a mode argument) whose death and report the test reads. */
#include "support.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static const char *(*owner)(const void *);

static servd_pool *make_pool(int n) {
  servd_pool_options o = {.n_interpreters = n, .world_size = 1};
  servd_pool *p = NULL;
  int rc = servd_pool_create(NULL, &o, &p);
  if (rc < 0) fprintf(stderr, "pool: %s\n", servd_last_error());
  assert_int_equal(rc, 0);
  return p;
}

/* A block of namespace 0's heap, made by its libpython's malloc (bound to that namespace's checker). */
#define NS_RAW \
  "import ctypes\n_py = ctypes.CDLL('libpython3.11.so.1.0')\n_py.PyMem_RawMalloc.restype = ctypes.c_void_p\n" \
  "_py.PyMem_RawFree.argtypes = [ctypes.c_void_p]\n"
#define NS_MALLOC "_py.PyMem_RawMalloc(24)"

static servd_interp *raw_ready(servd_pool *p) {
  servd_interp *it = servd_pool_get(p, 0);
  support_exec(it, NS_RAW);
  return it;
}

/* ---- child modes: each ends in the crossing it is named for ---- */
static int child(const char *mode) {
  if (strcmp(mode, "ns-to-host") == 0) { /* malloc'd in a namespace through the guest, freed by the host */
    servd_pool *p = make_pool(1);
    void *b = (void *)(uintptr_t)support_eval_int(raw_ready(p), NS_MALLOC);
    free(b);
    return 0;
  }
  if (strcmp(mode, "host-to-ns") == 0) { /* malloc'd by the host, freed by a namespace's libc */
    servd_pool *p = make_pool(1);
    void *b = malloc(40);
    char code[160];
    snprintf(code, sizeof code, "_py.PyMem_RawFree(%llu)", (unsigned long long)(uintptr_t)b);
    support_exec(raw_ready(p), code);
    return 0;
  }
  if (strcmp(mode, "ns-realloc") == 0) { /* realloc'd by the host */
    servd_pool *p = make_pool(1);
    void *b = (void *)(uintptr_t)support_eval_int(raw_ready(p), NS_MALLOC);
    b = realloc(b, 4096);
    return b != NULL;
  }
  return 2;
}

/* Runs this program in mode; returns its stderr (caller frees) and its wait status in *status. */
static char *run_child(const char *mode, int *status) {
  char out[] = "/tmp/servd-heapcheck-XXXXXX";
  int fd = mkstemp(out);
  assert_true(fd >= 0);
  close(fd);
  char cmd[512];
  snprintf(cmd, sizeof cmd, "exec /proc/%d/exe --child %s 2>%s >/dev/null", (int)getpid(), mode, out);
  fflush(NULL);
  *status = system(cmd);
  FILE *f = fopen(out, "r");
  assert_non_null(f);
  char *text = calloc(1, 65536);
  size_t n = fread(text, 1, 65535, f);
  text[n] = 0;
  fclose(f);
  unlink(out);
  return text;
}

static void expect_crossing(const char *mode, const char *first_line) {
  int st;
  char *err = run_child(mode, &st);
  if (!(WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT) /* sh execs the child: its own status */ ||
      !strstr(err, first_line) || !strstr(err, "backtrace"))
    fail_msg("%s: status %#x, expected SIGABRT and \"%s\"; stderr:\n%s", mode, st, first_line, err);
  free(err);
}

static void test_namespace_block_freed_by_host(void **state) {
  (void)state;
  expect_crossing("ns-to-host", "in heap \"main program\": block allocated by heap \"interpreter namespace 0");
}

static void test_host_block_freed_in_namespace(void **state) {
  (void)state;
  expect_crossing("host-to-ns", "\": block allocated by heap \"main program\"");
}

static void test_namespace_block_realloced_by_host(void **state) {
  (void)state;
  expect_crossing("ns-realloc", "realloc(");
}

/* The checker is in front of both heaps, and work that keeps blocks in their heaps passes: imports
 * of C extension modules, threads, a chat template, the host table's alloc/free, a block freed
 * where it was made. */
static void test_blocks_stay_in_their_heap(void **state) {
  (void)state;
  void *h = malloc(8);
  assert_string_equal(owner(h), "main program");
  free(h);
  servd_pool *p = make_pool(2);
  servd_interp *a = raw_ready(p);
  long long b = support_eval_int(a, NS_MALLOC);
  assert_true(strncmp(owner((void *)(uintptr_t)b), "interpreter namespace 0 ", 24) == 0);
  char code[160];
  snprintf(code, sizeof code, "_py.PyMem_RawFree(%lld)", b);
  support_exec(a, code);
  for (int i = 0; i < 2; i++) {
    servd_interp *it = servd_pool_get(p, i);
    support_exec(
        it, "import json, threading, hashlib, decimal, datetime, re\n"
            "def work():\n"
            "    for k in range(200): json.loads(json.dumps({'k': [k] * 50})); hashlib.sha256(b'x' * k).hexdigest()\n"
            "ts = [threading.Thread(target=work) for _ in range(3)]\n"
            "[t.start() for t in ts]; [t.join() for t in ts]\n"
            "import jinja2\n"
            "out = jinja2.Template('{% for m in ms %}<{{ m.role }}>{{ m.content }}{% endfor %}').render("
            "ms=[{'role': 'user', 'content': 'hi'}] * 20)\n");
    assert_int_equal(support_eval_int(it, "len(out)"), 20 * 8); /* "<user>hi" */
  }
  servd_pool_destroy(p);
}

int main(int argc, char **argv) {
  setenv("SERVD_HEAP_CHECK", "1", 1);
  support_early_init(argc, argv);
  owner = (const char *(*)(const void *))dlsym(RTLD_DEFAULT, "servd_heap_check_owner");
  if (!owner) {
    fprintf(stderr, "the heap checker is not preloaded\n");
    return 1;
  }
  if (argc == 3 && strcmp(argv[1], "--child") == 0) {
    int rc = child(argv[2]);
    fflush(NULL);
    _exit(rc);
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_blocks_stay_in_their_heap),
      cmocka_unit_test(test_namespace_block_freed_by_host),
      cmocka_unit_test(test_host_block_freed_in_namespace),
      cmocka_unit_test(test_namespace_block_realloced_by_host),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  fflush(NULL);
  _exit(rc);
}
