/* A model's forward step with a deadline (internal to the engine): the step timeout.
 *
 * Past the deadline the interpreter raises TimeoutError inside the running forward (again every
 * 100 ms until it returns), so code stuck in a Python loop, or one blocked in a collective that is
 * then aborted, ends as a failed step. Native code that never returns to Python cannot be
 * interrupted (readiness reports the model stuck).
 */
#ifndef SERVD_ENGINE_FORWARD_CALL_H
#define SERVD_ENGINE_FORWARD_CALL_H

#include <stdint.h>

#include "servd/interp.h"

/* servd_interp_forward with a deadline (timeout_ms 0: none). Past it: SERVD_ETIMEDOUT, err->type
 * "TimeoutError" and a message naming the step timeout. Only the calling rank's thread may make
 * calls on `it` while this runs (the rank interpreters are the runner's alone). */
int servd_engine_forward(servd_interp *it, const servd_forward_batch *b, int64_t timeout_ms, servd_tensor **logits,
                         servd_py_error *err);

#endif
