/* Classifies a failed call into the model's Python code (internal to the engine): the rule is in
 * engine/types.h at servd_model_error. */
#ifndef SERVD_ENGINE_MODEL_ERROR_H
#define SERVD_ENGINE_MODEL_ERROR_H

#include <stdbool.h>

#include "engine/types.h"
#include "servd/interp.h"

typedef enum servd_call_kind {
  SERVD_CALL_FORWARD = 0,  /* input built by the engine: every exception is the model's */
  SERVD_CALL_PREDICT = 1,  /* input from the request */
  SERVD_CALL_TEMPLATE = 2, /* input from the request; jinja2 TemplateError too */
} servd_call_kind;

/* The code to report for a call that returned rc with pe filled by the interpreter; copies the
 * exception into out (may be NULL; type "" when rc is not about a Python exception). */
int servd_model_error_code(int rc, const servd_py_error *pe, servd_call_kind kind, servd_model_error *out);

#endif
