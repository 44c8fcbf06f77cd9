/* Continuous-batching scheduler over a real paged KV cache: budgets, chunked prefill, FCFS,
 * priorities, block allocation, preemption and starvation, latency-bounded steps, checked against
 * hand-computed plans and a fake step-cost model. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "engine/scheduler.h"

#define CTX 256

typedef struct fixture {
  servd_kv_cache *kv;
  servd_scheduler s;
  sched_seq seqs[8];
  int32_t toks[8][CTX];
} fixture;

static fixture *setup_fx(int block_size, int n_blocks, int budget, int max_seqs) {
  fixture *f = calloc(1, sizeof *f);
  assert_non_null(f);
  assert_int_equal(servd_kv_cache_create(&f->kv, 1, 1, 4, block_size, n_blocks, SERVD_F32), 0);
  sched_config c = {.max_batch_tokens = budget, .max_seqs = max_seqs, .max_seq_len = CTX};
  assert_int_equal(sched_init(&f->s, &c, f->kv), 0);
  return f;
}

static sched_seq *add_seq_prio(fixture *f, int i, int n_prompt, int priority) {
  sched_seq *q = &f->seqs[i];
  memset(q, 0, sizeof *q);
  q->priority = priority;
  for (int j = 0; j < n_prompt; j++) f->toks[i][j] = 1000 * i + j;
  q->tokens = f->toks[i];
  q->n_tokens = n_prompt;
  q->owner = (void *)(intptr_t)i;
  assert_int_equal(sched_seq_init(&f->s, q), 0);
  sched_add(&f->s, q);
  return q;
}

static sched_seq *add_seq(fixture *f, int i, int n_prompt) { return add_seq_prio(f, i, n_prompt, 0); }

/* Runs one step: plan, commit, append a token to every sequence that got logits. */
static int step(fixture *f) {
  int n = sched_plan(&f->s);
  assert_true(n >= 0);
  sched_commit(&f->s);
  for (int i = 0; i < f->s.n_planned; i++) {
    sched_seq *q = f->s.planned[i];
    if (q->wants_logits) q->tokens[q->n_tokens++] = 7;
  }
  return n;
}

static void teardown_fx(fixture *f) {
  for (int i = 0; i < 8; i++) {
    if (f->seqs[i].table.ids) sched_remove(&f->s, &f->seqs[i]);
    sched_seq_free(&f->seqs[i]);
  }
  assert_int_equal(servd_kv_cache_free_blocks(f->kv), servd_kv_cache_n_blocks(f->kv));
  sched_free(&f->s);
  servd_kv_cache_destroy(f->kv);
  free(f);
}

static void test_chunked_prefill(void **state) {
  (void)state;
  fixture *f = setup_fx(4, 64, 8, 4);
  sched_seq *q = add_seq(f, 0, 20);
  /* 20 prompt tokens at 8 per step: 8, 8, 4; logits only with the last chunk. */
  assert_int_equal(sched_plan(&f->s), 8);
  assert_false(q->wants_logits);
  assert_int_equal(f->s.n_logit_rows, 0);
  for (int t = 0; t < 8; t++) {
    assert_int_equal(f->s.step.positions[t], t);
    assert_int_equal(f->s.step.tokens[t], t);
    assert_int_equal(f->s.step.slots[t], q->table.ids[t / 4] * 4 + t % 4);
  }
  assert_int_equal(q->table.n, 2); /* blocks taken only as far as the chunk reaches */
  sched_commit(&f->s);
  assert_int_equal(step(f), 8);
  assert_int_equal(sched_plan(&f->s), 4);
  assert_true(q->wants_logits);
  assert_int_equal(f->s.n_logit_rows, 1);
  assert_int_equal(f->s.step.logit_rows[0], 3);
  servd_attn_batch b = servd_step_arrays_attn(&f->s.step, f->s.n_planned);
  assert_int_equal(b.n_seqs, 1);
  assert_int_equal(b.q_start[0], 0);
  assert_int_equal(b.q_len[0], 4);
  assert_int_equal(b.kv_len[0], 20);
  assert_ptr_equal(b.block_tables[0], q->table.ids);
  sched_commit(&f->s);
  q->tokens[q->n_tokens++] = 5;
  /* Decode: one token at position 20, a sixth block. */
  assert_int_equal(sched_plan(&f->s), 1);
  assert_int_equal(f->s.step.positions[0], 20);
  assert_int_equal(f->s.step.tokens[0], 5);
  assert_int_equal(q->table.n, 6);
  sched_commit(&f->s);
  teardown_fx(f);
}

static void test_decode_reserved_during_prefill(void **state) {
  (void)state;
  fixture *f = setup_fx(4, 64, 8, 4);
  sched_seq *a = add_seq(f, 0, 3);
  assert_int_equal(step(f), 3); /* a prefilled, now decoding */
  sched_seq *b = add_seq(f, 1, 50);
  sched_seq *c = add_seq(f, 2, 2);
  (void)c;
  /* Step: a decodes (1), b takes the remaining 7 of the budget; c must wait (budget spent). */
  assert_int_equal(sched_plan(&f->s), 8);
  assert_int_equal(f->s.n_planned, 2);
  assert_ptr_equal(f->s.planned[0], a);
  assert_int_equal(a->chunk, 1);
  assert_ptr_equal(f->s.planned[1], b);
  assert_int_equal(b->chunk, 7);
  sched_commit(&f->s);
  a->tokens[a->n_tokens++] = 9;
  /* Next: a (1) then b's chunk leaves no room for c: 1 + 7. */
  assert_int_equal(sched_plan(&f->s), 8);
  assert_int_equal(b->chunk, 7);
  assert_int_equal(f->s.waiting.n, 1);
  sched_commit(&f->s);
  teardown_fx(f);
}

static void test_fcfs_max_seqs(void **state) {
  (void)state;
  fixture *f = setup_fx(4, 64, 64, 2);
  sched_seq *a = add_seq(f, 0, 4), *b = add_seq(f, 1, 4), *c = add_seq(f, 2, 4);
  assert_int_equal(step(f), 8);
  assert_int_equal(f->s.running.n, 2);
  assert_int_equal(c->n_computed, 0);
  /* a finishes: c is admitted next step, after b's decode. */
  sched_remove(&f->s, a);
  assert_int_equal(step(f), 1 + 4);
  assert_ptr_equal(f->s.planned[0], b);
  assert_ptr_equal(f->s.planned[1], c);
  teardown_fx(f);
}

static void test_no_overtaking(void **state) {
  (void)state;
  /* 8 blocks of 4 slots. a holds 6 blocks; b needs 3 (does not fit); small c must not overtake b. */
  fixture *f = setup_fx(4, 8, 64, 4);
  sched_seq *a = add_seq(f, 0, 24);
  assert_int_equal(step(f), 24);
  sched_seq *b = add_seq(f, 1, 12);
  sched_seq *c = add_seq(f, 2, 2);
  assert_int_equal(sched_plan(&f->s), 1); /* a's decode only: b does not fit, c waits behind it */
  assert_int_equal(f->s.n_planned, 1);
  assert_ptr_equal(f->s.planned[0], a);
  assert_int_equal(b->state, SCHED_WAITING);
  assert_int_equal(c->state, SCHED_WAITING);
  sched_commit(&f->s);
  teardown_fx(f);
}

static void test_preemption_recompute(void **state) {
  (void)state;
  /* 4 blocks of 4 slots = 16 slots. a and b take 8 tokens (2 blocks) each; when a grows into a
   * third block, b (newer) is preempted, freed, and later recomputed with its generated tokens. */
  fixture *f = setup_fx(4, 4, 64, 4);
  sched_seq *a = add_seq(f, 0, 7), *b = add_seq(f, 1, 7);
  assert_int_equal(step(f), 14); /* both prefilled: 8 tokens each now, 2 blocks each */
  assert_int_equal(servd_kv_cache_free_blocks(f->kv), 0);
  assert_int_equal(a->n_tokens, 8);
  /* a's decode at position 7 still fits its second block; so does b's. */
  assert_int_equal(step(f), 2);
  assert_int_equal(a->n_tokens, 9);
  /* a's token at position 8 needs a third block: b is preempted. */
  assert_int_equal(sched_plan(&f->s), 1);
  assert_ptr_equal(f->s.planned[0], a);
  assert_int_equal(f->s.preemptions, 1);
  assert_int_equal(b->state, SCHED_WAITING);
  assert_int_equal(b->n_computed, 0);
  assert_int_equal(b->table.n, 0);
  assert_int_equal(b->n_tokens, 9); /* keeps its prompt and generated tokens */
  sched_commit(&f->s);
  a->tokens[a->n_tokens++] = 7;
  /* a finishes: b comes back and recomputes all 9 tokens in one chunk, with logits at the end. */
  sched_remove(&f->s, a);
  assert_int_equal(sched_plan(&f->s), 9);
  assert_ptr_equal(f->s.planned[0], b);
  assert_true(b->wants_logits);
  for (int t = 0; t < 9; t++) assert_int_equal(f->s.step.tokens[t], b->tokens[t]);
  sched_commit(&f->s);
  teardown_fx(f);
}

static void test_starved(void **state) {
  (void)state;
  fixture *f = setup_fx(4, 2, 64, 4); /* 8 slots in all */
  sched_seq *a = add_seq(f, 0, 12);
  sched_seq *b = add_seq(f, 1, 3);
  assert_int_equal(sched_plan(&f->s), 3);
  assert_int_equal(f->s.n_starved, 1);
  assert_ptr_equal(f->s.starved[0], a);
  assert_int_equal(a->state, SCHED_REMOVED);
  assert_ptr_equal(f->s.planned[0], b);
  sched_commit(&f->s);
  /* b grows until it alone needs more than the cache: then it is starved too. */
  b->tokens[b->n_tokens++] = 1;
  for (int i = 0; i < 5; i++) step(f);
  assert_int_equal(b->n_tokens, 9); /* position 8 needs a third block */
  assert_int_equal(sched_plan(&f->s), 0);
  assert_int_equal(f->s.n_starved, 1);
  assert_ptr_equal(f->s.starved[0], b);
  teardown_fx(f);
}

static void test_remove_frees(void **state) {
  (void)state;
  fixture *f = setup_fx(4, 16, 64, 4);
  sched_seq *a = add_seq(f, 0, 10);
  step(f);
  assert_int_equal(sched_used_blocks(&f->s), 3);
  sched_remove(&f->s, a);
  sched_remove(&f->s, a); /* idempotent */
  assert_int_equal(sched_used_blocks(&f->s), 0);
  assert_int_equal(sched_plan(&f->s), 0);
  teardown_fx(f);
}

/* ---- priorities ---- */

static void test_priority_order(void **state) {
  (void)state;
  /* One running slot: admission follows (priority, arrival). */
  fixture *f = setup_fx(4, 64, 64, 1);
  sched_seq *a = add_seq_prio(f, 0, 4, 0), *b = add_seq_prio(f, 1, 4, 5), *c = add_seq_prio(f, 2, 4, -1);
  sched_seq *d = add_seq_prio(f, 3, 4, -1), *e = add_seq_prio(f, 4, 4, 0);
  sched_seq *want[] = {c, d, a, e, b};
  for (int k = 0; k < 5; k++) {
    assert_int_equal(step(f), 4);
    assert_ptr_equal(f->s.planned[0], want[k]);
    /* Equal or worse priorities wait for the slot: nobody is preempted. */
    assert_int_equal(step(f), 1);
    assert_ptr_equal(f->s.planned[0], want[k]);
    sched_remove(&f->s, want[k]);
  }
  assert_int_equal(f->s.preemptions, 0);
  teardown_fx(f);
}

static void test_priority_preempts_for_blocks(void **state) {
  (void)state;
  /* 8 blocks of 4 slots. low holds 6 blocks and grows into a 7th; e (same priority) must wait, h
   * (better) takes low's blocks: low is preempted and returns ahead of e, its equal that came later. */
  fixture *f = setup_fx(4, 8, 64, 4);
  sched_seq *low = add_seq_prio(f, 0, 24, 3);
  assert_int_equal(step(f), 24);
  sched_seq *e = add_seq_prio(f, 1, 12, 3);
  assert_int_equal(step(f), 1); /* e does not fit next to low, and does not preempt an equal */
  assert_int_equal(e->state, SCHED_WAITING);
  assert_int_equal(f->s.preemptions, 0);
  sched_seq *h = add_seq_prio(f, 2, 12, 0);
  assert_int_equal(sched_plan(&f->s), 12);
  assert_int_equal(f->s.n_planned, 1);
  assert_ptr_equal(f->s.planned[0], h);
  assert_int_equal(f->s.preemptions, 1);
  assert_int_equal(low->state, SCHED_WAITING);
  assert_int_equal(low->table.n, 0);
  assert_ptr_equal(f->s.waiting.head, low);
  assert_ptr_equal(low->next, e);
  sched_commit(&f->s);
  teardown_fx(f);
}

static void test_priority_preempts_worst_newest(void **state) {
  (void)state;
  /* Three running slots, all taken: a better request preempts the worst priority, newest among equals. */
  fixture *f = setup_fx(4, 64, 64, 3);
  sched_seq *a = add_seq_prio(f, 0, 4, 1), *b = add_seq_prio(f, 1, 4, 1), *c = add_seq_prio(f, 2, 4, 0);
  assert_int_equal(step(f), 12);
  assert_ptr_equal(f->s.running.head, c); /* best first, then a and b in admission order */
  sched_seq *h = add_seq_prio(f, 3, 4, -1);
  assert_int_equal(sched_plan(&f->s), 2 + 4); /* c and a decode, h prefills */
  assert_int_equal(b->state, SCHED_WAITING);
  assert_int_equal(a->state, SCHED_RUNNING);
  assert_int_equal(f->s.preemptions, 1);
  assert_ptr_equal(f->s.planned[0], c);
  assert_ptr_equal(f->s.planned[1], a);
  assert_ptr_equal(f->s.planned[2], h);
  sched_commit(&f->s);
  teardown_fx(f);
}

/* ---- latency-bounded steps ---- */

static void test_step_bound_caps_prefill(void **state) {
  (void)state;
  fixture *f = setup_fx(4, 64, 64, 4);
  f->s.cfg.max_step_ns = 100;
  f->s.cost = (sched_cost){.decode_row_ns = 10, .prefill_token_ns = 2};
  sched_seq *b = add_seq(f, 1, 100);
  /* No decodes: the whole budget. */
  assert_int_equal(step(f), 64);
  sched_remove(&f->s, b);
  sched_seq *a = add_seq(f, 0, 3);
  assert_int_equal(step(f), 3);
  b = add_seq(f, 2, 250);
  /* a decodes: (100 - 10) / 2 = 45 prefill tokens fit the target, not the 63 the budget leaves. */
  assert_int_equal(sched_plan(&f->s), 1 + 45);
  assert_int_equal(f->s.prefill_cap, 45);
  assert_int_equal(b->chunk, 45);
  assert_int_equal(f->s.n_decode_rows, 1);
  assert_int_equal(f->s.n_prefill_tokens, 45);
  sched_commit(&f->s);
  a->tokens[a->n_tokens++] = 7;
  /* Decodes alone fill the target: it stretches to SCHED_STEP_STRETCH x their estimate, so prefill
   * gets (STRETCH - 1) x 100 of time at 4 a token, not one block. */
  f->s.cost = (sched_cost){.decode_row_ns = 100, .prefill_token_ns = 4};
  int cap = (int)((SCHED_STEP_STRETCH - 1) * 100 / 4);
  assert_true(cap >= 25 && cap < 63);
  assert_int_equal(sched_plan(&f->s), 1 + cap);
  assert_int_equal(f->s.prefill_cap, cap);
  assert_int_equal(b->chunk, cap);
  sched_commit(&f->s);
  a->tokens[a->n_tokens++] = 7;
  /* Prefill so costly that not one block fits: it still progresses by one block, the oldest first. */
  sched_seq *c = add_seq(f, 3, 100);
  f->s.cost = (sched_cost){.decode_row_ns = 10, .prefill_token_ns = 50};
  assert_int_equal(sched_plan(&f->s), 1 + 4);
  assert_int_equal(f->s.prefill_cap, 4);
  assert_int_equal(b->chunk, 4);
  assert_int_equal(c->chunk, 0);
  sched_commit(&f->s);
  a->tokens[a->n_tokens++] = 7;
  /* No target: the budget only. */
  f->s.cfg.max_step_ns = 0;
  assert_int_equal(sched_plan(&f->s), 1 + 63);
  sched_commit(&f->s);
  teardown_fx(f);
}

/* The rule over a grid of decode counts and costs (a prefill token costs 20): the prefill share is
 * never below the decodes' estimate (to one token), and the step's estimate stays within
 * max(target, SCHED_STEP_STRETCH x the decodes), or within the one-block floor when prefill is
 * that short. */
static void test_step_bound_prefill_share(void **state) {
  (void)state;
  const double tok = 20, target = 1000;
  for (int decoders = 1; decoders <= 6; decoders++) {
    fixture *f = setup_fx(4, 128, 256, 8);
    f->s.cfg.max_step_ns = (int64_t)target;
    for (int i = 0; i < decoders; i++) add_seq(f, i, 3);
    step(f);
    sched_seq *p = add_seq(f, 7, 250);
    for (int row = 1; row <= 400; row += 13) {
      f->s.cost = (sched_cost){.decode_row_ns = row, .prefill_token_ns = tok};
      int n = sched_plan(&f->s);
      assert_int_equal(n, decoders + p->chunk);
      assert_int_equal(f->s.n_decode_rows, decoders);
      double decodes = (double)row * decoders, prefill = tok * p->chunk;
      double bound = target > SCHED_STEP_STRETCH * decodes ? target : SCHED_STEP_STRETCH * decodes;
      assert_true(prefill + tok > decodes);
      assert_true(p->chunk == 4 || decodes + prefill <= bound);
      assert_true(decodes + prefill + tok > bound || p->chunk == 4);
    }
    teardown_fx(f);
  }
}

static void test_observe_learns_costs(void **state) {
  (void)state;
  fixture *f = setup_fx(4, 64, 64, 4);
  add_seq(f, 0, 3);
  add_seq(f, 1, 3);
  step(f);
  sched_observe(&f->s, 600); /* prefill only, no decode estimate yet: all of it is prefill */
  assert_true(f->s.cost.prefill_token_ns == 100);
  step(f);
  sched_observe(&f->s, 40); /* two decode rows */
  assert_true(f->s.cost.decode_row_ns == 20);
  step(f);
  sched_observe(&f->s, 60); /* 30 each: the average moves a fifth of the way */
  assert_true(f->s.cost.decode_row_ns > 22 - 1e-9 && f->s.cost.decode_row_ns < 22 + 1e-9);
  add_seq(f, 2, 10);
  step(f); /* 2 decode rows (44 estimated) and 10 prefill tokens */
  sched_observe(&f->s, 44 + 10 * 50);
  assert_true(f->s.cost.prefill_token_ns == 100 + 0.2 * (50 - 100));
  /* Decode-only steps of 4 and 32 rows costing 100 + 10 per row: the fixed cost is told apart, so
   * 32 rows are not charged 32 times the 4-row step's fixed share (35 per row). */
  f->s.n_prefill_tokens = 0;
  for (int i = 0; i < 40; i++) {
    int rows = i % 2 ? 32 : 4;
    f->s.n_decode_rows = f->s.n_tokens = rows;
    sched_observe(&f->s, 100 + 10 * rows);
  }
  assert_true(f->s.cost.decode_row_ns > 9.9 && f->s.cost.decode_row_ns < 10.1);
  assert_true(f->s.cost.decode_step_ns > 99 && f->s.cost.decode_step_ns < 101);
  f->s.n_planned = 0; /* the plan was overwritten: nothing to commit */
  teardown_fx(f);
}

/* Fake cost model: a step costs 1000 per decode row and 100 per prefill token. Four streams decode
 * while four long prompts arrive; the scheduler learns the costs from the steps it observes. Once it
 * has, no step carrying decodes exceeds max(target, SCHED_STEP_STRETCH x its decodes) beyond its
 * one-block floor, prefill progresses in every step that has any pending, and every request
 * finishes. */
static void test_step_bound_simulation(void **state) {
  (void)state;
  fixture *f = setup_fx(4, 256, 256, 8);
  const int64_t target = 10000;
  f->s.cfg.max_step_ns = target;
  for (int i = 0; i < 4; i++) add_seq(f, i, 3);
  int finished = 0, steps = 0, capped = 0, stretched = 0;
  bool done[8] = {false};
  while (finished < 8 && steps < 400) {
    if (steps == 3)
      for (int i = 4; i < 8; i++) add_seq(f, i, 200);
    bool learned = f->s.cost.prefill_token_ns > 0;
    int n = sched_plan(&f->s);
    assert_true(n > 0);
    steps++;
    int64_t t = 1000 * (int64_t)f->s.n_decode_rows + 100 * (int64_t)f->s.n_prefill_tokens;
    bool prefill_pending = false;
    for (int i = 0; i < 8; i++)
      if (!done[i] && f->seqs[i].state != SCHED_NEW && f->seqs[i].n_tokens - f->seqs[i].n_computed > 1)
        prefill_pending = true;
    if (prefill_pending) assert_true(f->s.n_prefill_tokens > 0);
    if (learned && f->s.n_decode_rows > 0) {
      assert_true(f->s.n_prefill_tokens <= f->s.prefill_cap);
      /* The step stays within max(target, twice its decodes): a decode waits at most that long. */
      int64_t decodes = 1000 * (int64_t)f->s.n_decode_rows;
      int64_t bound = (int64_t)(SCHED_STEP_STRETCH * (double)decodes);
      if (bound < target) bound = target;
      assert_true(t <= bound || f->s.n_prefill_tokens <= 4);
      if (SCHED_STEP_STRETCH * (double)decodes > (double)target) stretched++;
      if (f->s.n_prefill_tokens > 0 && f->s.n_prefill_tokens + f->s.n_decode_rows < 256) capped++;
    }
    sched_commit(&f->s);
    sched_observe(&f->s, t);
    for (int k = 0; k < f->s.n_planned; k++) {
      sched_seq *q = f->s.planned[k];
      if (!q->wants_logits) continue;
      q->tokens[q->n_tokens++] = 7;
      int i = (int)(q - f->seqs);
      if (q->n_tokens >= (i < 4 ? 3 : 200) + 16) {
        sched_remove(&f->s, q);
        done[i] = true;
        finished++;
      }
    }
  }
  assert_int_equal(finished, 8);
  assert_true(capped > 0);    /* the bound did act */
  assert_true(stretched > 0); /* and so did the stretch: decodes past 1/STRETCH of the target */
  assert_true(f->s.cost.decode_row_ns > 999 && f->s.cost.decode_row_ns < 1001);
  assert_true(f->s.cost.decode_step_ns < 1);
  assert_true(f->s.cost.prefill_token_ns > 99 && f->s.cost.prefill_token_ns < 101);
  teardown_fx(f);
}

/* Feeds one observed step of `rows` decode rows and `tokens` prefill tokens to the cost model. */
static void observe(fixture *f, int rows, int tokens, int64_t t) {
  f->s.n_decode_rows = rows;
  f->s.n_prefill_tokens = tokens;
  f->s.n_tokens = rows + tokens;
  sched_observe(&f->s, t);
}

static bool near(double x, double want, double rel) { return x > want * (1 - rel) && x < want * (1 + rel); }

/* Fake cost: a step costs 5000 plus 300 per decode row plus 100 per prefill token. Decode-only steps
 * at one row count (4 streams warming up) give a line through the origin, 1550 a row: 28 rows would
 * be charged 43400 for their 13400 and stretched steps would run about three times their share. Mixed steps of
 * varied rows and tokens (a burst of prompts, no decode-only step) define the plane, which then gives
 * the true fixed, row and token costs. Steps whose tokens track their rows do not define it: the old
 * estimates stay. Once decode-only steps of varied row counts come, their own line rules again. */
static void test_observe_plane_separates_fixed_cost(void **state) {
  (void)state;
  fixture *f = setup_fx(4, 64, 64, 4);
  for (int i = 0; i < 10; i++) observe(f, 4, 0, 5000 + 1200);
  assert_true(near(f->s.cost.decode_row_ns, 1550, 1e-9));
  assert_false(f->s.cost.joint);
  for (int i = 0; i < 40; i++) {
    int rows = 20 + (i * 7) % 13, tokens = 16 + (i * 37) % 200;
    observe(f, rows, tokens, 5000 + 300 * rows + 100 * tokens);
  }
  assert_true(f->s.cost.joint);
  assert_true(near(f->s.cost.decode_step_ns, 5000, 0.01));
  assert_true(near(f->s.cost.decode_row_ns, 300, 0.01));
  assert_true(near(f->s.cost.prefill_token_ns, 100, 0.01));
  /* decode-only steps of other row counts: their fitted line takes over from the plane */
  for (int i = 0; i < 20; i++) {
    int rows = i % 2 ? 30 : 10;
    observe(f, rows, 0, 5000 + 300 * rows);
  }
  assert_false(f->s.cost.joint);
  assert_true(f->s.cost.decode_line);
  assert_true(near(f->s.cost.decode_row_ns, 300, 0.01));
  assert_true(near(f->s.cost.decode_step_ns, 5000, 0.01));
  f->s.n_planned = 0; /* no plan to commit */
  teardown_fx(f);

  /* Tokens proportional to rows (a prefill cap that follows the decode estimate): no plane. */
  f = setup_fx(4, 64, 64, 4);
  for (int i = 0; i < 10; i++) observe(f, 4, 0, 6200);
  for (int i = 0; i < 40; i++) {
    int rows = 20 + (i * 7) % 13;
    observe(f, rows, 3 * rows, 5000 + 300 * rows + 100 * 3 * rows);
  }
  assert_false(f->s.cost.joint);
  assert_true(near(f->s.cost.decode_row_ns, 1550, 1e-9)); /* the warm-up's line, as before */
  teardown_fx(f);

  /* Noise that fits an implausible plane (a row at a fiftieth of a token): not believed. */
  f = setup_fx(4, 64, 64, 4);
  for (int i = 0; i < 10; i++) observe(f, 4, 0, 6200);
  for (int i = 0; i < 40; i++) {
    int rows = 20 + (i * 7) % 13, tokens = 16 + (i * 37) % 200;
    observe(f, rows, tokens, 5000 + 2 * rows + 100 * tokens);
  }
  assert_false(f->s.cost.joint);
  f->s.n_planned = 0;
  teardown_fx(f);
}

/* Embeddings run in steps of their own (the model returns hidden rows or logits, never both),
 * alternating with generation; their rows follow their pooling; they neither find nor leave blocks
 * in the prefix cache. A sequence that wants prompt logprobs computes its whole prompt. */
/* A text pair's tokens from pair_split on are of token type 1 in the step; the other sequences' are 0,
 * whichever sequences share the step. */
static void test_pair_token_types(void **state) {
  (void)state;
  fixture *f = setup_fx(4, 32, 64, 8);
  for (int i = 0; i < 3; i++) {
    sched_seq *q = &f->seqs[i];
    for (int j = 0; j < 7; j++) f->toks[i][j] = 100 * i + j;
    q->tokens = f->toks[i];
    q->n_tokens = 5 + i; /* 5, 6, 7 tokens */
    q->embed = true;
    q->rows = SCHED_ROWS_FIRST;
    q->pair_split = i == 1 ? 0 : 2 + i; /* the first: type 1 from 2, the second one text, the third from 4 */
    assert_int_equal(sched_seq_init(&f->s, q), 0);
    sched_add(&f->s, q);
  }
  assert_int_equal(sched_plan(&f->s), 18);
  static const int32_t want[18] = {0, 0, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1};
  for (int t = 0; t < 18; t++) assert_int_equal(f->s.step.token_types[t], want[t]);
  sched_commit(&f->s);
  teardown_fx(f);
}

static void test_embeddings_and_prompt_rows(void **state) {
  (void)state;
  fixture *f = calloc(1, sizeof *f);
  assert_non_null(f);
  assert_int_equal(servd_kv_cache_create(&f->kv, 1, 1, 4, 4, 64, SERVD_F32), 0);
  sched_config c = {.max_batch_tokens = 64, .max_seqs = 8, .max_seq_len = CTX, .prefix_cache = true};
  assert_int_equal(sched_init(&f->s, &c, f->kv), 0);
  sched_seq *gen = add_seq(f, 0, 8);
  sched_seq *mean = &f->seqs[1], *cls = &f->seqs[2];
  for (int i = 1; i <= 2; i++) {
    sched_seq *q = &f->seqs[i];
    for (int j = 0; j < 8; j++) f->toks[i][j] = f->toks[0][j]; /* the generation's prompt: no sharing */
    q->tokens = f->toks[i];
    q->n_tokens = i == 1 ? 6 : 5;
    q->embed = true;
    q->rows = i == 1 ? SCHED_ROWS_ALL : SCHED_ROWS_FIRST;
    assert_int_equal(sched_seq_init(&f->s, q), 0);
    sched_add(&f->s, q);
  }
  /* Generation first; its two full blocks are cached. */
  assert_int_equal(sched_plan(&f->s), 8);
  assert_false(f->s.embed_step);
  assert_int_equal(f->s.n_planned, 1);
  assert_int_equal(f->s.n_logit_rows, 1);
  sched_commit(&f->s);
  gen->tokens[gen->n_tokens++] = 7;
  assert_int_equal(sched_cached_blocks(&f->s), 2);
  /* Then the embeddings, whole prompts (no cache hit), rows by pooling. */
  assert_int_equal(sched_plan(&f->s), 11);
  assert_true(f->s.embed_step);
  assert_int_equal(f->s.n_planned, 2);
  assert_ptr_equal(f->s.planned[0], mean);
  assert_int_equal(mean->n_rows, 6);
  assert_int_equal(mean->row_pos, 0);
  assert_int_equal(cls->n_rows, 1);
  assert_int_equal(f->s.n_logit_rows, 7);
  assert_int_equal(f->s.step.logit_rows[6], 6); /* the CLS row: the first token of the second sequence */
  assert_true(mean->wants_logits && cls->wants_logits);
  sched_commit(&f->s);
  assert_int_equal(sched_cached_blocks(&f->s), 2); /* the embeddings registered nothing */
  sched_remove(&f->s, mean);
  sched_remove(&f->s, cls);
  /* Generation again: the decode. */
  assert_int_equal(sched_plan(&f->s), 1);
  assert_false(f->s.embed_step);
  sched_commit(&f->s);
  gen->tokens[gen->n_tokens++] = 7;
  /* Prompt logprobs: the same prompt computed whole, a row per token; without, the cache hit. */
  sched_seq *lp = &f->seqs[3], *plain = &f->seqs[4];
  for (int i = 3; i <= 4; i++) {
    sched_seq *q = &f->seqs[i];
    memcpy(f->toks[i], f->toks[0], 8 * sizeof(int32_t));
    q->tokens = f->toks[i];
    q->n_tokens = 8;
    if (i == 3) {
      q->rows = SCHED_ROWS_ALL;
      q->no_cache_hits = true;
    }
    assert_int_equal(sched_seq_init(&f->s, q), 0);
    sched_add(&f->s, q);
  }
  assert_int_equal(sched_plan(&f->s), 1 + 8 + 4);
  assert_int_equal(lp->chunk, 8);
  assert_int_equal(lp->n_rows, 8);
  assert_int_equal(plain->chunk, 4);
  assert_int_equal(plain->n_rows, 1);
  assert_int_equal(f->s.n_logit_rows, 1 + 8 + 1);
  sched_commit(&f->s);
  for (int i = 0; i < 5; i++) {
    sched_remove(&f->s, &f->seqs[i]);
    sched_seq_free(&f->seqs[i]);
  }
  assert_int_equal(sched_used_blocks(&f->s), 0); /* cached blocks stay, evictable */
  sched_free(&f->s);
  servd_kv_cache_destroy(f->kv);
  free(f);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_chunked_prefill),
      cmocka_unit_test(test_decode_reserved_during_prefill),
      cmocka_unit_test(test_fcfs_max_seqs),
      cmocka_unit_test(test_no_overtaking),
      cmocka_unit_test(test_preemption_recompute),
      cmocka_unit_test(test_starved),
      cmocka_unit_test(test_remove_frees),
      cmocka_unit_test(test_priority_order),
      cmocka_unit_test(test_priority_preempts_for_blocks),
      cmocka_unit_test(test_priority_preempts_worst_newest),
      cmocka_unit_test(test_step_bound_caps_prefill),
      cmocka_unit_test(test_observe_learns_costs),
      cmocka_unit_test(test_observe_plane_separates_fixed_cost),
      cmocka_unit_test(test_step_bound_prefill_share),
      cmocka_unit_test(test_step_bound_simulation),
      cmocka_unit_test(test_embeddings_and_prompt_rows),
      cmocka_unit_test(test_pair_token_types),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
