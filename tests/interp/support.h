/* Shared helpers of the interpreter tests. */
#ifndef SERVD_TEST_INTERP_SUPPORT_H
#define SERVD_TEST_INTERP_SUPPORT_H

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <jansson.h>

#include "interp-impl.h"
#include "mpk/package.h"
#include "servd/interp.h"

/* Re-executes with the namespace tunable; exits the test on failure. */
void support_early_init(int argc, char **argv);
/* Runs code in interpreter it (package-free helper) and asserts success. */
void support_exec(servd_interp *it, const char *code);
/* Evaluates expr and returns its JSON (caller decrefs); asserts success. */
json_t *support_eval(servd_interp *it, const char *expr);
long long support_eval_int(servd_interp *it, const char *expr);
double support_seconds(void);
double support_cpu_seconds(void); /* CPU time of the whole process */
/* Resident set size of this process in bytes (from /proc/self/statm). */
size_t support_rss(void);
/* Runs a shell command; returns its exit status. */
int support_system(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
