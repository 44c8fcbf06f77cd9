/* The run phase of a step (see step.h): the plan's forward on every rank, its output checked. */
#include "engine/engine_impl.h"
#include "engine/step.h"

#include <stdio.h>
#include <string.h>

#include "engine/model_error.h"
#include "servd/clock.h"
#include "servd/status.h"

void step_run(servd_model *m, const step_plan *p, step_result *r) {
  memset(r, 0, sizeof *r);
  const servd_forward_batch *b = &p->batch;
  servd_py_error err;
  memset(&err, 0, sizeof err);
  int failed_rank = -1;
  r->t_start_ns = servd_now_ns();
  servd_guides_begin(m); /* the constrained rows' token masks, computed while the forward runs */
  int rc = servd_runner_step(m->runner, b, &r->out, &err, &failed_rank);
  servd_guides_collect(m); /* before any row samples or finishes */
  const servd_tensor *out = r->out;
  r->picked = rc == 0 && b->want_picks && out && out->dtype == SERVD_I32 && out->ndim == 2 &&
              out->shape[0] == b->n_logit_rows && out->shape[1] == 2;
  int row_len = b->want_scores ? m->emb.n_labels : b->want_hidden ? m->emb.dim : m->vocab;
  bool bad_out = rc == 0 && b->n_logit_rows > 0 && !r->picked &&
                 (!out || out->dtype != SERVD_F32 || out->ndim != 2 || out->shape[0] != b->n_logit_rows ||
                  out->shape[1] < row_len || (b->want_hidden && out->shape[1] != row_len));
  if (bad_out) {
    if (b->want_hidden && out && out->ndim == 2 && out->shape[1] >= m->vocab)
      rc = servd_fail(SERVD_EMODEL, "forward: the package's model code returned logits where embeddings need its final "
                                    "hidden states (batch.hidden): the code predates embeddings; repack the model with "
                                    "this modelpkg");
    else if (b->want_scores && out && out->ndim == 2 && out->shape[1] == m->emb.dim)
      rc = servd_fail(SERVD_EMODEL, "forward: the package's model code returned hidden states where a cross-encoder's "
                                    "scores need its classifier's outputs (batch.scores): the code predates "
                                    "cross-encoders; repack the model with this modelpkg");
    else
      rc = servd_fail(SERVD_EMODEL, "forward: expected %s f32 (%d, %d)",
                      b->want_scores   ? "classifier outputs (batch.scores)"
                      : b->want_hidden ? "hidden states"
                                       : "logits",
                      b->n_logit_rows, row_len);
    snprintf(err.type, sizeof err.type, "%s", "TypeError");
    snprintf(err.message, sizeof err.message, "%s", servd_last_error());
  }
  if (!rc) return;
  /* The step fails its requests only; the runner has already reset the ranks' communicator. */
  r->rc = rc;
  r->code = bad_out ? SERVD_EMODEL : servd_model_error_code(rc, &err, SERVD_CALL_FORWARD, NULL);
  char where[24] = "";
  if (m->tp > 1 && failed_rank >= 0) snprintf(where, sizeof where, " (rank %d)", failed_rank);
  /* With several ranks the runner's message already names the rank ("rank 1: ..."). */
  if (err.type[0]) snprintf(r->message, sizeof r->message, "%s%s: %s", err.type, where, err.message);
  else snprintf(r->message, sizeof r->message, "forward: %s", servd_last_error());
  if (r->code == SERVD_EMODEL && err.type[0]) snprintf(r->error_type, sizeof r->error_type, "%s", err.type);
}
