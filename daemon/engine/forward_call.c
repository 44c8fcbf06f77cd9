/* The forward step with a deadline: see forward_call.h. The deadline itself is the interpreter's
 * (servd_interp_forward_deadline); this names the step timeout in the error. */
#include "engine/forward_call.h"

#include <stdio.h>

int servd_engine_forward(servd_interp *it, const servd_forward_batch *b, int64_t timeout_ms, servd_tensor **logits,
                         servd_py_error *err) {
  int rc = servd_interp_forward_deadline(it, b, timeout_ms > 0 ? timeout_ms : 0, logits, err);
  if (rc == SERVD_ETIMEDOUT) {
    char msg[sizeof err->message];
    snprintf(msg, sizeof msg,
             "the forward step did not return within the step timeout of %.3g s (--step-timeout) "
             "and was interrupted",
             (double)timeout_ms / 1000.0);
    if (err) {
      snprintf(err->type, sizeof err->type, "%s", "TimeoutError");
      snprintf(err->message, sizeof err->message, "%s", msg);
    }
    rc = servd_fail(SERVD_ETIMEDOUT, "forward: %s", msg);
  }
  return rc;
}
