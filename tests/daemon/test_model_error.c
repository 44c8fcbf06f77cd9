/* Which failures of the model's Python code are the client's (SERVD_EINVAL, HTTP 400) and which the
 * model's (SERVD_EMODEL, HTTP 500): the rule written at SERVD_EMODEL in daemon/engine/engine.h,
 * checked case by case against that text. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "engine/model_error.h"

static int classify(int rc, const char *type, const char *msg, servd_call_kind kind, servd_model_error *out) {
  servd_py_error pe;
  memset(&pe, 0, sizeof pe);
  snprintf(pe.type, sizeof pe.type, "%s", type);
  snprintf(pe.message, sizeof pe.message, "%s", msg);
  return servd_model_error_code(rc, &pe, kind, out);
}

static void test_rule(void **state) {
  (void)state;
  static const struct {
    int rc;
    const char *type, *msg;
    servd_call_kind kind;
    int want;
  } cases[] = {
      /* predict: input validation errors are the client's, anything else the model's */
      {SERVD_EINVAL, "ValueError", "x must be 2-d", SERVD_CALL_PREDICT, SERVD_EINVAL},
      {SERVD_EINVAL, "TypeError", "expected f32", SERVD_CALL_PREDICT, SERVD_EINVAL},
      {SERVD_EINVAL, "KeyError", "'x'", SERVD_CALL_PREDICT, SERVD_EINVAL},
      {SERVD_EINVAL, "IndexError", "out of range", SERVD_CALL_PREDICT, SERVD_EINVAL},
      {SERVD_EINVAL, "RuntimeError", "boom", SERVD_CALL_PREDICT, SERVD_EMODEL},
      {SERVD_EINVAL, "ZeroDivisionError", "division by zero", SERVD_CALL_PREDICT, SERVD_EMODEL},
      {SERVD_EINVAL, "AttributeError", "no attribute", SERVD_CALL_PREDICT, SERVD_EMODEL},
      {SERVD_EINVAL, "TemplateError", "bad roles", SERVD_CALL_PREDICT, SERVD_EMODEL},
      /* the interpreter's TypeErrors about what predict returned: the model's */
      {SERVD_EINVAL, "TypeError", "predict must return a dict of servd.Tensor, not list", SERVD_CALL_PREDICT,
       SERVD_EMODEL},
      {SERVD_EINVAL, "TypeError", "predict output 'y' must map a str to a servd.Tensor, not int", SERVD_CALL_PREDICT,
       SERVD_EMODEL},
      /* forward: every exception is the model's */
      {SERVD_EINVAL, "ValueError", "shapes", SERVD_CALL_FORWARD, SERVD_EMODEL},
      {SERVD_EINVAL, "RuntimeError", "boom", SERVD_CALL_FORWARD, SERVD_EMODEL},
      /* chat template: raise_exception() is the conversation's fault, a broken template the model's */
      {SERVD_EINVAL, "TemplateError", "Conversation roles must alternate", SERVD_CALL_TEMPLATE, SERVD_EINVAL},
      {SERVD_EINVAL, "TypeError", "can only concatenate str", SERVD_CALL_TEMPLATE, SERVD_EINVAL},
      {SERVD_EINVAL, "TemplateSyntaxError", "unexpected end", SERVD_CALL_TEMPLATE, SERVD_EMODEL},
      {SERVD_EINVAL, "UndefinedError", "'foo' is undefined", SERVD_CALL_TEMPLATE, SERVD_EMODEL},
      /* other codes keep their meaning */
      {SERVD_ETIMEDOUT, "TimeoutError", "deadline exceeded", SERVD_CALL_PREDICT, SERVD_ETIMEDOUT},
      /* ... except a forward interrupted at the step timeout: the model's code hung */
      {SERVD_ETIMEDOUT, "TimeoutError", "the forward step did not return", SERVD_CALL_FORWARD, SERVD_EMODEL},
      {SERVD_ENOMEM, "MemoryError", "predict outputs", SERVD_CALL_PREDICT, SERVD_ENOMEM},
      {SERVD_EINVAL, "", "", SERVD_CALL_PREDICT, SERVD_EINVAL}, /* not a Python exception */
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    servd_model_error e;
    int got = classify(cases[i].rc, cases[i].type, cases[i].msg, cases[i].kind, &e);
    if (got != cases[i].want) fprintf(stderr, "case %zu (%s: %s): got %d\n", i, cases[i].type, cases[i].msg, got);
    assert_int_equal(got, cases[i].want);
    bool python =
        (cases[i].rc == SERVD_EINVAL || (cases[i].rc == SERVD_ETIMEDOUT && cases[i].kind == SERVD_CALL_FORWARD)) &&
        cases[i].type[0];
    assert_string_equal(e.type, python ? cases[i].type : "");
    assert_string_equal(e.message, python ? cases[i].msg : "");
    assert_int_equal(classify(cases[i].rc, cases[i].type, cases[i].msg, cases[i].kind, NULL), cases[i].want);
  }
  assert_int_equal(servd_model_error_code(SERVD_EINVAL, NULL, SERVD_CALL_PREDICT, NULL), SERVD_EINVAL);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_rule)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
