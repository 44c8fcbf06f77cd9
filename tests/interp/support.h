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
/* Asserts that expr evaluates to True in it (printing expr when not). */
void support_expect_true(servd_interp *it, const char *expr);
/* Asserts that code raises type in it with a message that contains msg_part (support_expect_raises) or
 * starts with it (support_expect_raises_prefix); prints the error when it does not. */
void support_expect_raises(servd_interp *it, const char *code, const char *type, const char *msg_part);
void support_expect_raises_prefix(servd_interp *it, const char *code, const char *type, const char *prefix);
/* Makes a new folder from dir_template (".../NAME-XXXXXX", rewritten in place) holding file with text;
 * 0 or -1. */
int support_make_dir_with(char *dir_template, const char *file, const char *text);
/* A one-interpreter pool whose sys.path holds a new folder made from dir_template (rewritten in
 * place) with file = text, and whose entry object is entry ("module:Class"); 0, or -1 after printing
 * why. The caller destroys the pool and removes the folder. */
int support_pool_with_entry(char *dir_template, const char *file, const char *text, const char *entry,
                            servd_pool **pool);
/* Resident set size of this process in bytes (from /proc/self/statm). */
size_t support_rss(void);
/* Runs a shell command; returns its exit status. */
int support_system(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
