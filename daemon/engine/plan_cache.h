/* Step plans of the CPU runner (servd/plan.h): which decode steps replay a plan, which capture one.
 *
 * A decode step of b sequences (one new token each) is a bucket. Its first step is captured while
 * it runs; so is the second, and when both recorded the same ops on the same memory on every rank
 * (the model's Python took the same path twice), the bucket's plan is ready and its later steps
 * replay natively. Before each replay every rank's plan is checked (shape, KV cache, buffers still
 * the model's); a failed check drops the bucket's plans and the step captures again. A forward that
 * cannot be captured (or differs three times running) turns the bucket off, with the reason on
 * stderr. Prefill steps run eagerly. Used on the runner's calling thread, except capture and replay,
 * which each rank's thread runs for its own rank during a round.
 *
 * The environment: SERVD_PLANS=off turns plans off; SERVD_TRACE_PLAN=1 prints each plan when it
 * becomes ready (servd generate --no-plan, --trace-plan).
 */
#ifndef SERVD_ENGINE_PLAN_CACHE_H
#define SERVD_ENGINE_PLAN_CACHE_H

#include "servd/interp.h"

typedef struct servd_plan_cache servd_plan_cache;

/* The largest decode batch with a plan of its own (larger ones run eagerly). */
#define SERVD_PLAN_MAX_BATCH 64

typedef enum servd_plan_action {
  SERVD_PLAN_EAGER = 0, /* through Python, nothing recorded */
  SERVD_PLAN_CAPTURE,   /* through Python, recorded on every rank */
  SERVD_PLAN_REPLAY,    /* every rank replays its plan */
} servd_plan_action;

/* kv: each rank's cache (borrowed, outlives the cache). NULL in *out (and 0) when the environment
 * turns plans off. */
int servd_plan_cache_create(int world, servd_kv_cache *const *kv, int max_batch, servd_plan_cache **out);
void servd_plan_cache_destroy(servd_plan_cache *c); /* accepts NULL */

/* What the next step does; guards of a replay are checked here, for every rank. */
servd_plan_action servd_plan_cache_decide(servd_plan_cache *c, const servd_forward_batch *b);
/* A rank's part of the round decide chose (its own thread; the forward's contract). */
int servd_plan_cache_capture(servd_plan_cache *c, int rank, servd_interp *it, const servd_forward_batch *b,
                             int64_t timeout_ms, servd_tensor **logits, servd_py_error *err);
int servd_plan_cache_replay(servd_plan_cache *c, int rank, const servd_forward_batch *b, servd_tensor **logits);
/* After the round: rc is the round's result. */
void servd_plan_cache_done(servd_plan_cache *c, servd_plan_action a, int rc);

typedef struct servd_plan_stats {
  uint64_t captures, replays, ready, dropped, refused;
} servd_plan_stats;
void servd_plan_cache_stats(const servd_plan_cache *c, servd_plan_stats *s);

#endif
