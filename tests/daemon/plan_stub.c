/* servd/plan.h for tests that build the model runner from its sources without the interpreter
 * library: a capture runs the step (the test's servd_engine_forward) and records nothing, so every
 * decode bucket falls back to the forward, as a model that cannot be captured does. */
#include <stdio.h>

#include "engine/forward_call.h"
#include "servd/plan.h"

int servd_plan_capture(servd_interp *it, const servd_forward_batch *b, int64_t timeout_ms, servd_tensor **logits,
                       servd_py_error *err, servd_plan **plan, char *why, size_t why_cap) {
  *plan = NULL;
  snprintf(why, why_cap, "step plans are not in this test build");
  return servd_engine_forward(it, b, timeout_ms, logits, err);
}

bool servd_plan_same(const servd_plan *a, const servd_plan *b, char *why, size_t why_cap) {
  (void)a;
  (void)b;
  snprintf(why, why_cap, "no plans");
  return false;
}

int servd_plan_check(const servd_plan *p, const servd_forward_batch *b, char *why, size_t why_cap) {
  (void)p;
  (void)b;
  snprintf(why, why_cap, "no plans");
  return SERVD_EINVAL;
}

int servd_plan_replay(servd_plan *p, const servd_forward_batch *b, servd_tensor **logits) {
  (void)p;
  (void)b;
  *logits = NULL;
  return servd_fail(SERVD_EINVAL, "no step plans in this test build");
}

void servd_plan_print(const servd_plan *p, FILE *f) {
  (void)p;
  (void)f;
}

int servd_plan_node_count(const servd_plan *p) {
  (void)p;
  return 0;
}

void servd_plan_destroy(servd_plan *p) { (void)p; }
