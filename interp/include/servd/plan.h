/* Step plans: a forward step captured once from the model's Python and replayed natively.
 *
 * The model's forward(batch) runs once in recording mode: every servd.ops call runs as usual and
 * also appends a node (op, tensors, scalars) to a plan. The step's inputs (token ids, positions, KV
 * slots, logit rows) are the plan's own host tensors at fixed addresses, which the capture hands to
 * the model as batch.tokens and friends; a replay copies the next step's arrays into them and walks
 * the nodes without Python. The attention layout (block tables, lengths) is bound by reference: the
 * replay points the attention nodes at the step's own.
 *
 * A plan is valid for steps of its shape (tokens, logit rows, sequences) on the same KV cache while
 * the model still holds the buffers it recorded (servd_plan_check). Whether the model's Python
 * takes the same path every step is the caller's question: capture twice and compare
 * (servd_plan_same), as the engine does (daemon/engine/plan_cache.c).
 */
#ifndef SERVD_PLAN_H
#define SERVD_PLAN_H

#include <stdio.h>

#include "servd/interp.h"

typedef struct servd_plan servd_plan;

/* Runs b's forward on `it` (servd_interp_forward_deadline's contract: *logits, *err, the deadline)
 * while recording it. *plan: the new plan (the caller destroys it), or NULL when the forward was not
 * capturable, with the reason in why (an op the executor does not run, a device tensor, ...): the
 * step itself still ran and its logits are valid. On a failed forward nothing is kept. */
SERVD_API int servd_plan_capture(servd_interp *it, const servd_forward_batch *b, int64_t timeout_ms,
                                 servd_tensor **logits, servd_py_error *err, servd_plan **plan, char *why,
                                 size_t why_cap);
/* Whether a and b record the same step: the same ops with the same scalars on the same memory (the
 * step inputs by role). When not, why names the first node that differs. */
SERVD_API bool servd_plan_same(const servd_plan *a, const servd_plan *b, char *why, size_t why_cap);
/* Whether p can run b: the same shape and KV cache, and every buffer it recorded still held by
 * someone besides the plan (a model that replaced its buffers, e.g. grown for a larger step, has
 * dropped them). 0, or SERVD_EINVAL with the reason in why. */
SERVD_API int servd_plan_check(const servd_plan *p, const servd_forward_batch *b, char *why, size_t why_cap);
/* Runs p over b's inputs without Python (after servd_plan_check). *logits: a new reference to the
 * logits tensor the capture returned (NULL when it returned none). */
SERVD_API int servd_plan_replay(servd_plan *p, const servd_forward_batch *b, servd_tensor **logits);
/* Nodes, fusions and bytes touched per node, one line each. */
SERVD_API void servd_plan_print(const servd_plan *p, FILE *f);
SERVD_API int servd_plan_node_count(const servd_plan *p);
SERVD_API void servd_plan_destroy(servd_plan *p); /* accepts NULL */

#endif
