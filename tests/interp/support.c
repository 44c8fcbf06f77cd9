#include "support.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

void support_early_init(int argc, char **argv) {
  if (servd_interp_early_init(argc, argv) < 0) {
    fprintf(stderr, "early init: %s\n", servd_last_error());
    exit(1);
  }
}

void support_exec(servd_interp *it, const char *code) {
  servd_py_error err;
  int rc = servd_interp__exec(it, code, 0, &err);
  if (rc < 0) fprintf(stderr, "exec failed: %s: %s\n%s\n", err.type, err.message, err.traceback);
  assert_int_equal(rc, 0);
}

json_t *support_eval(servd_interp *it, const char *expr) {
  servd_py_error err;
  json_t *r = NULL;
  int rc = servd_interp__eval_json(it, expr, &r, 0, &err);
  if (rc < 0) fprintf(stderr, "eval %s failed: %s: %s\n%s\n", expr, err.type, err.message, err.traceback);
  assert_int_equal(rc, 0);
  assert_non_null(r);
  return r;
}

long long support_eval_int(servd_interp *it, const char *expr) {
  json_t *r = support_eval(it, expr);
  assert_true(json_is_integer(r));
  long long v = json_integer_value(r);
  json_decref(r);
  return v;
}

void support_expect_true(servd_interp *it, const char *expr) {
  json_t *r = support_eval(it, expr);
  if (!json_is_true(r)) fprintf(stderr, "expected true: %s\n", expr);
  assert_true(json_is_true(r));
  json_decref(r);
}

static void expect_raises(servd_interp *it, const char *code, const char *type, const char *msg, bool prefix) {
  servd_py_error err;
  int rc = servd_interp__exec(it, code, 0, &err);
  assert_int_not_equal(rc, 0);
  bool found = prefix ? strncmp(err.message, msg, strlen(msg)) == 0 : strstr(err.message, msg) != NULL;
  if (strcmp(err.type, type) || !found) fprintf(stderr, "%s -> %s: %s\n", code, err.type, err.message);
  assert_string_equal(err.type, type);
  if (prefix) assert_memory_equal(err.message, msg, strlen(msg));
  else assert_non_null(strstr(err.message, msg));
}

void support_expect_raises(servd_interp *it, const char *code, const char *type, const char *msg_part) {
  expect_raises(it, code, type, msg_part, false);
}

void support_expect_raises_prefix(servd_interp *it, const char *code, const char *type, const char *prefix) {
  expect_raises(it, code, type, prefix, true);
}

int support_make_dir_with(char *dir_template, const char *file, const char *text) {
  if (!mkdtemp(dir_template)) return -1;
  char path[512];
  snprintf(path, sizeof path, "%s/%s", dir_template, file);
  FILE *f = fopen(path, "w");
  if (!f) return -1;
  fputs(text, f);
  fclose(f);
  return 0;
}

int support_pool_with_entry(char *dir_template, const char *file, const char *text, const char *entry,
                            servd_pool **pool) {
  if (support_make_dir_with(dir_template, file, text) < 0) return -1;
  servd_pool_options o = {.n_interpreters = 1, .world_size = 1, .extra_sys_path = dir_template};
  if (servd_pool_create(NULL, &o, pool) < 0) {
    fprintf(stderr, "%s\n", servd_last_error());
    return -1;
  }
  servd_py_error err;
  if (servd_interp__load_entry(servd_pool_get(*pool, 0), entry, &err) < 0) {
    fprintf(stderr, "%s: %s\n%s\n", err.type, err.message, err.traceback);
    return -1;
  }
  return 0;
}

double support_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

double support_cpu_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

size_t support_rss(void) {
  FILE *f = fopen("/proc/self/statm", "r");
  unsigned long size = 0, res = 0;
  if (f) {
    if (fscanf(f, "%lu %lu", &size, &res) != 2) res = 0;
    fclose(f);
  }
  return (size_t)res * (size_t)sysconf(_SC_PAGESIZE);
}

int support_system(const char *fmt, ...) {
  char cmd[4096];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(cmd, sizeof cmd, fmt, ap);
  va_end(ap);
  return system(cmd);
}
