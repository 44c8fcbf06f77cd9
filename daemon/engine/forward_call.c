/* The forward step with a deadline: see forward_call.h.
 *
 * servd/interp.h gives deadlines to predict and call_json but not yet to forward, so this arms the
 * interpreter's deadline watchdog around the guest's forward itself, exactly as interp.c's calls
 * with a deadline do. When interp.h gains a forward with a deadline, this becomes that call. */
#include "engine/forward_call.h"

#include <stdio.h>
#include <string.h>

#include "../../interp/src/interp-impl.h"

int servd_engine_forward(servd_interp *it, const servd_forward_batch *b, int64_t timeout_ms, servd_tensor **logits,
                         servd_py_error *err) {
  if (timeout_ms <= 0) return servd_interp_forward(it, b, logits, err);
  *logits = NULL;
  if (err) err->type[0] = err->message[0] = err->traceback[0] = 0;
  if (!it || !it->ns) return servd_fail(SERVD_EINVAL, "forward: the interpreter is not running");
  if (!b || b->n_tokens < 0 || b->n_logit_rows < 0 || b->attn.n_seqs < 0)
    return servd_fail(SERVD_EINVAL, "forward: bad batch description");
  servd_guest_thread *th = servd_ns__thread(it->ns);
  uint64_t seq = atomic_fetch_add_explicit(&it->seq, 1, memory_order_relaxed) + 1;
  servd_wd_call wd;
  int rc = servd_wd__arm(&wd, it->ns, seq, timeout_ms);
  if (rc) return rc;
  int64_t t0 = servd_interp__now_ns();
  rc = it->ns->api->forward(th, seq, b, logits, err);
  atomic_fetch_add_explicit(&it->busy_ns, (uint64_t)(servd_interp__now_ns() - t0), memory_order_relaxed);
  servd_wd__disarm(&wd);
  if (rc == SERVD_ETIMEDOUT) {
    char msg[sizeof err->message];
    snprintf(msg, sizeof msg, "the forward step did not return within the step timeout of %.3g s (--step-timeout) "
             "and was interrupted", (double)timeout_ms / 1000.0);
    if (err) {
      snprintf(err->type, sizeof err->type, "%s", "TimeoutError");
      snprintf(err->message, sizeof err->message, "%s", msg);
    }
    rc = servd_fail(SERVD_ETIMEDOUT, "forward: %s", msg);
  }
  return rc;
}
