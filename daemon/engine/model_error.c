/* Bad input or broken model: see model_error.h and the rule at SERVD_EMODEL in engine.h. */
#include "engine/model_error.h"

#include <stdio.h>
#include <string.h>

static bool is_input_error(const char *type, servd_call_kind kind) {
  static const char *const input_types[] = {"ValueError", "TypeError", "KeyError", "IndexError"};
  if (kind == SERVD_CALL_FORWARD) return false;
  for (size_t i = 0; i < sizeof input_types / sizeof *input_types; i++)
    if (strcmp(type, input_types[i]) == 0) return true;
  /* raise_exception() in a template; TemplateSyntaxError (a broken template) is the model's */
  return kind == SERVD_CALL_TEMPLATE && strcmp(type, "TemplateError") == 0;
}

int servd_model_error_code(int rc, const servd_py_error *pe, servd_call_kind kind, servd_model_error *out) {
  if (out) memset(out, 0, sizeof *out);
  /* The interpreter reports an exception raised by the code as SERVD_EINVAL with its type; other
   * codes (timeouts, allocation, a result it could not convert) keep their meaning. */
  bool python = pe && pe->type[0] && rc == SERVD_EINVAL;
  /* A forward step interrupted at the step timeout: the model's code hung, not the request. */
  bool step_timeout = kind == SERVD_CALL_FORWARD && rc == SERVD_ETIMEDOUT && pe && pe->type[0];
  if (step_timeout) {
    if (out) {
      snprintf(out->type, sizeof out->type, "%s", pe->type);
      snprintf(out->message, sizeof out->message, "%s", pe->message);
    }
    return SERVD_EMODEL;
  }
  if (!python) return rc;
  if (out) {
    snprintf(out->type, sizeof out->type, "%s", pe->type);
    snprintf(out->message, sizeof out->message, "%s", pe->message);
  }
  /* The interpreter's own TypeErrors about what predict returned are the model's fault. */
  if (kind == SERVD_CALL_PREDICT && strcmp(pe->type, "TypeError") == 0 &&
      (strncmp(pe->message, "predict must return", 19) == 0 || strncmp(pe->message, "predict output ", 15) == 0))
    return SERVD_EMODEL;
  return is_input_error(pe->type, kind) ? SERVD_EINVAL : SERVD_EMODEL;
}
