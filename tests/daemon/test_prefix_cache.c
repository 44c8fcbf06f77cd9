/* Automatic prefix caching: the cache alone (lookups, LRU eviction, forced hash collisions, orphaned
 * chains, keys) and inside the scheduler (hits and partial hits at admission, blocks shared between
 * running sequences, a shared block outliving the sequence that computed it, preemption of a
 * sequence whose blocks are shared, eviction under memory pressure). Block size 4 throughout. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "engine/scheduler.h"

#define BS 4
#define CTX 128

static uint64_t same_hash(uint64_t parent, const int32_t *tokens, int n, uint64_t key) {
  (void)parent, (void)tokens, (void)n, (void)key;
  return 42; /* every block collides with every other */
}

/* ---- the cache alone ---------------------------------------------------------------------------- */

typedef struct pcfx {
  servd_kv_cache *kv;
  servd_prefix_cache pc;
} pcfx;

static void pc_setup(pcfx *f, int n_blocks, bool collide) {
  assert_int_equal(servd_kv_cache_create_blocks_only(&f->kv, 1, 1, 4, BS, n_blocks), 0);
  assert_int_equal(prefix_cache_init(&f->pc, f->kv, true), 0);
  if (collide) f->pc.hash_fn = same_hash;
}

static void pc_teardown(pcfx *f) {
  /* Everything released: all blocks are free or evictable, and evicting them frees them all. */
  int n = servd_kv_cache_n_blocks(f->kv);
  assert_int_equal(prefix_cache_available(&f->pc), n);
  int32_t *ids = malloc((size_t)n * sizeof *ids);
  assert_int_equal(prefix_cache_alloc(&f->pc, n, ids), 0);
  assert_int_equal(f->pc.n_cached, 0);
  servd_kv_cache_free(f->kv, n, ids);
  assert_int_equal(servd_kv_cache_free_blocks(f->kv), n);
  free(ids);
  prefix_cache_free(&f->pc);
  servd_kv_cache_destroy(f->kv);
}

/* Allocates and registers nb full blocks of toks as one chain under key; ids out. */
static void computed(pcfx *f, uint64_t key, const int32_t *toks, int nb, int32_t *ids) {
  assert_int_equal(prefix_cache_alloc(&f->pc, nb, ids), 0);
  prefix_chain c = {0};
  for (int i = 0; i < nb; i++) prefix_cache_register(&f->pc, key, &c, ids[i], toks + i * BS);
  assert_int_equal(c.n, nb);
}

static int match(pcfx *f, uint64_t key, const int32_t *toks, int nb, int32_t *ids) {
  return prefix_cache_match(&f->pc, key, toks, nb, ids, NULL, NULL);
}

static void check_lookups(bool collide) {
  pcfx f;
  pc_setup(&f, 16, collide);
  int32_t a[12] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
  int32_t ida[3], got[3];
  computed(&f, 7, a, 3, ida);
  assert_int_equal(f.pc.n_cached, 3);
  /* The whole chain, a part of it, a different second block, another key, another first block. */
  assert_int_equal(match(&f, 7, a, 3, got), 3);
  assert_memory_equal(got, ida, sizeof ida);
  assert_int_equal(match(&f, 7, a, 2, got), 2);
  int32_t b[12] = {1, 2, 3, 4, 5, 6, 7, 99, 9, 10, 11, 12};
  assert_int_equal(match(&f, 7, b, 3, got), 1);
  assert_int_equal(got[0], ida[0]);
  assert_int_equal(match(&f, 8, a, 3, got), 0);
  /* Block 2 of a again, after a different first block: equal tokens, another parent. */
  int32_t c[12] = {0, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
  assert_int_equal(match(&f, 7, c, 3, got), 0);
  int32_t idc[3];
  computed(&f, 7, c, 3, idc);
  assert_int_equal(match(&f, 7, c, 3, got), 3);
  assert_memory_equal(got, idc, sizeof idc);
  assert_int_equal(match(&f, 7, a, 3, got), 3);
  assert_memory_equal(got, ida, sizeof ida);
  /* Held by their computing sequences: nothing is evictable yet. */
  assert_int_equal(f.pc.n_evictable, 0);
  assert_int_equal(prefix_cache_available(&f.pc), 10);
  prefix_cache_release(&f.pc, 3, ida);
  prefix_cache_release(&f.pc, 3, idc);
  assert_int_equal(f.pc.n_evictable, 6);
  pc_teardown(&f);
}

static void test_lookups(void **state) {
  (void)state;
  check_lookups(false);
}

/* Every hash equal: the content comparison alone keeps prompts apart. */
static void test_forced_collisions(void **state) {
  (void)state;
  check_lookups(true);
}

static void test_lru_eviction(void **state) {
  (void)state;
  pcfx f;
  pc_setup(&f, 6, false);
  int32_t a[12] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, b[12] = {21, 22, 23, 24, 25, 26, 27, 28};
  int32_t ida[3], idb[2], got[3], x[6];
  computed(&f, 1, a, 3, ida);
  computed(&f, 1, b, 2, idb);
  prefix_cache_release(&f.pc, 2, idb); /* b released first: older in the LRU list */
  prefix_cache_release(&f.pc, 3, ida);
  assert_int_equal(f.pc.n_evictable, 5);
  assert_int_equal(prefix_cache_available(&f.pc), 6);
  /* Two blocks: the free one, then b's tail (a sequence's last block goes first). */
  assert_int_equal(prefix_cache_alloc(&f.pc, 2, x), 0);
  assert_int_equal(f.pc.evictions, 1);
  assert_int_equal(match(&f, 1, b, 2, got), 1);
  assert_int_equal(match(&f, 1, a, 3, got), 3);
  /* A hit takes a reference: that block is no longer evictable, so the next ones go instead. */
  int ev = -1;
  prefix_chain ch;
  assert_int_equal(prefix_cache_match(&f.pc, 1, a, 3, got, &ch, &ev), 3);
  assert_int_equal(ev, 3);
  assert_int_equal(prefix_cache_acquire(&f.pc, 3, got), 0);
  assert_int_equal(prefix_cache_available(&f.pc), 1);
  assert_int_equal(prefix_cache_alloc(&f.pc, 2, x + 2), SERVD_EBUSY); /* takes and evicts nothing */
  assert_int_equal(f.pc.n_cached, 4);
  assert_int_equal(prefix_cache_alloc(&f.pc, 1, x + 2), 0); /* b's head */
  assert_int_equal(match(&f, 1, b, 2, got), 0);
  assert_int_equal(match(&f, 1, a, 3, got), 3);
  prefix_cache_release(&f.pc, 3, x);
  prefix_cache_release(&f.pc, 3, ida);
  pc_teardown(&f);
}

/* A parent evicted and its block reused for other tokens: the child it leaves behind is never found
 * under the new content, even with all hashes equal. */
static void test_orphaned_child(void **state) {
  (void)state;
  pcfx f;
  pc_setup(&f, 2, true);
  int32_t a[8] = {1, 2, 3, 4, 5, 6, 7, 8}, x[8] = {9, 9, 9, 9, 5, 6, 7, 8};
  int32_t ida[2], got[2], idx;
  computed(&f, 1, a, 2, ida);
  prefix_cache_release(&f.pc, 1, ida); /* the parent first in line */
  prefix_cache_release(&f.pc, 1, ida + 1);
  assert_int_equal(prefix_cache_alloc(&f.pc, 1, &idx), 0);
  assert_int_equal(idx, ida[0]);
  prefix_chain c = {0};
  prefix_cache_register(&f.pc, 1, &c, idx, x);
  assert_int_equal(match(&f, 1, x, 2, got), 1); /* x's first block, but not a's orphaned second */
  assert_int_equal(match(&f, 1, a, 2, got), 0);
  prefix_cache_release(&f.pc, 1, &idx);
  pc_teardown(&f);
}

/* The same prefix computed twice at once: the second copy is not registered, and the chain after it
 * follows the first copy's entry, so its next block is still found. */
static void test_duplicate_register(void **state) {
  (void)state;
  pcfx f;
  pc_setup(&f, 8, false);
  int32_t a[8] = {1, 2, 3, 4, 5, 6, 7, 8}, b[8] = {1, 2, 3, 4, 50, 60, 70, 80};
  int32_t ida[1], idb[2], got[2];
  computed(&f, 1, a, 1, ida);
  assert_int_equal(prefix_cache_alloc(&f.pc, 2, idb), 0);
  prefix_chain c = {0};
  prefix_cache_register(&f.pc, 1, &c, idb[0], b);
  prefix_cache_register(&f.pc, 1, &c, idb[1], b + BS);
  assert_int_equal(f.pc.n_cached, 2);
  assert_int_equal(match(&f, 1, b, 2, got), 2);
  assert_int_equal(got[0], ida[0]);
  assert_int_equal(got[1], idb[1]);
  prefix_cache_release(&f.pc, 1, ida);
  prefix_cache_release(&f.pc, 2, idb);
  assert_int_equal(f.pc.n_evictable, 2); /* idb[0] was never cached: free again */
  pc_teardown(&f);
}

static void test_disabled(void **state) {
  (void)state;
  servd_kv_cache *kv;
  servd_prefix_cache pc;
  assert_int_equal(servd_kv_cache_create_blocks_only(&kv, 1, 1, 4, BS, 4), 0);
  assert_int_equal(prefix_cache_init(&pc, kv, false), 0);
  int32_t a[8] = {1, 2, 3, 4, 5, 6, 7, 8}, id[2], got[2];
  assert_int_equal(prefix_cache_alloc(&pc, 2, id), 0);
  prefix_chain c = {0};
  prefix_cache_register(&pc, 1, &c, id[0], a);
  assert_int_equal(prefix_cache_match(&pc, 1, a, 2, got, NULL, NULL), 0);
  prefix_cache_release(&pc, 2, id);
  assert_int_equal(servd_kv_cache_free_blocks(kv), 4);
  prefix_cache_free(&pc);
  servd_kv_cache_destroy(kv);
}

/* ---- inside the scheduler ----------------------------------------------------------------------- */

typedef struct fixture {
  servd_kv_cache *kv;
  servd_scheduler s;
  sched_seq seqs[4];
  int32_t toks[4][CTX];
} fixture;

static fixture *setup_fx(int n_blocks, int budget) {
  fixture *f = calloc(1, sizeof *f);
  assert_non_null(f);
  assert_int_equal(servd_kv_cache_create_blocks_only(&f->kv, 1, 1, 4, BS, n_blocks), 0);
  sched_config c = {.max_batch_tokens = budget,
                    .max_seqs = 4,
                    .max_seq_len = CTX,
                    .prefix_cache = true,
                    .cache_key = 5};
  assert_int_equal(sched_init(&f->s, &c, f->kv), 0);
  return f;
}

/* Sequence i: the first `shared` tokens are common to all sequences, the rest its own. */
static sched_seq *add_seq(fixture *f, int i, int n_prompt, int shared) {
  sched_seq *q = &f->seqs[i];
  memset(q, 0, sizeof *q);
  for (int j = 0; j < n_prompt; j++) f->toks[i][j] = j < shared ? 100 + j : 1000 * (i + 1) + j;
  q->tokens = f->toks[i];
  q->n_tokens = n_prompt;
  assert_int_equal(sched_seq_init(&f->s, q), 0);
  sched_add(&f->s, q);
  return q;
}

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
  for (int i = 0; i < 4; i++) {
    if (f->seqs[i].table.ids) sched_remove(&f->s, &f->seqs[i]);
    sched_seq_free(&f->seqs[i]);
  }
  assert_int_equal(sched_used_blocks(&f->s), 0);
  assert_int_equal(prefix_cache_available(&f->s.bm.pc), servd_kv_cache_n_blocks(f->kv));
  sched_free(&f->s);
  servd_kv_cache_destroy(f->kv);
  free(f);
}

static void test_sched_hits(void **state) {
  (void)state;
  fixture *f = setup_fx(32, 64);
  sched_seq *a = add_seq(f, 0, 18, 18);
  assert_int_equal(step(f), 18); /* nothing cached yet */
  assert_int_equal(a->n_cached, 0);
  assert_int_equal(f->s.bm.pc.n_cached, 4); /* its 4 full blocks, registered after the step */
  sched_remove(&f->s, a);
  assert_int_equal(sched_used_blocks(&f->s), 0);
  assert_int_equal(sched_cached_blocks(&f->s), 4);

  /* The same 16-token beginning then 6 of its own: 4 blocks found, 6 tokens computed. */
  sched_seq *b = add_seq(f, 1, 22, 16);
  assert_int_equal(step(f), 6);
  assert_int_equal(b->n_cached, 16);
  assert_int_equal(f->s.step.positions[0], 16);
  assert_int_equal(f->s.step.kv_len[0], 22);
  /* Partial: 10 tokens in common, so 2 full blocks. */
  sched_seq *c = add_seq(f, 2, 12, 10);
  assert_int_equal(step(f), 1 + 4); /* b decodes; c computes tokens 8..11 */
  assert_int_equal(c->n_cached, 8);
  assert_int_equal(c->table.ids[0], b->table.ids[0]);
  assert_int_equal(c->table.ids[1], b->table.ids[1]);
  assert_int_not_equal(c->table.ids[2], b->table.ids[2]);
  /* The whole prompt cached, block-aligned: the last block is computed again for its logits. */
  sched_seq *d = add_seq(f, 3, 16, 16);
  assert_int_equal(step(f), 1 + 1 + 4);
  assert_int_equal(d->n_cached, 12);
  assert_int_equal(servd_kv_cache_refcount(f->kv, b->table.ids[0]), 4); /* b, c, d and the cache */
  assert_int_equal(f->s.bm.pc.queries, 18u + 22 + 12 + 16);
  assert_int_equal(f->s.bm.pc.hits, 16u + 8 + 12);
  teardown_fx(f);
}

/* The sequence that computed a shared block finishes first: the block stays with the others, is not
 * evictable, and memory pressure preempts rather than take it. */
static void test_shared_block_outlives_owner(void **state) {
  (void)state;
  fixture *f = setup_fx(8, 64);
  sched_seq *a = add_seq(f, 0, 9, 8);
  step(f);
  sched_seq *b = add_seq(f, 1, 10, 8);
  step(f);
  assert_int_equal(b->n_cached, 8);
  int32_t shared0 = a->table.ids[0];
  sched_remove(&f->s, a); /* a's third block is free again, its two full ones still b's */
  assert_int_equal(servd_kv_cache_refcount(f->kv, shared0), 2);
  assert_int_equal(f->s.bm.pc.n_evictable, 0);
  /* A stranger wanting every other block: 5 are free; it waits rather than evict b's. */
  sched_seq *c = add_seq(f, 2, 24, 0);
  for (int i = 0; i < 3; i++) step(f);
  assert_int_equal(c->state, SCHED_WAITING);
  assert_int_equal(b->table.ids[0], shared0);
  assert_int_equal(servd_kv_cache_refcount(f->kv, shared0), 2);
  assert_int_equal(b->n_tokens, 14);
  sched_remove(&f->s, b);
  assert_int_equal(f->s.bm.pc.n_evictable, 3); /* the shared two and b's own full third */
  step(f); /* c gets in: 5 free blocks and one evicted, b's tail (the last block goes first) */
  assert_int_equal(c->state, SCHED_RUNNING);
  assert_int_equal(f->s.bm.pc.evictions, 1);
  assert_int_equal(f->s.bm.pc.n_cached, 2 + 6); /* and c's, registered after its step */
  int32_t got[3];
  assert_int_equal(prefix_cache_match(&f->s.bm.pc, 5, f->toks[1], 3, got, NULL, NULL), 2);
  assert_int_equal(got[0], shared0);
  teardown_fx(f);
}

/* b shares a's prefix and is preempted when blocks run out: its release leaves the shared blocks
 * with a, and on readmission it finds them (and its own cached ones) again. */
static void test_preempt_shared(void **state) {
  (void)state;
  fixture *f = setup_fx(9, 64);
  sched_seq *a = add_seq(f, 0, 13, 12);
  step(f); /* a: 4 blocks, 3 of them full and cached */
  sched_seq *b = add_seq(f, 1, 15, 12);
  step(f); /* b: shares 3, takes 1 */
  assert_int_equal(b->n_cached, 12);
  int32_t shared[3] = {a->table.ids[0], a->table.ids[1], a->table.ids[2]};
  /* Decode until the cache runs out: 9 blocks, a and b grow into 4 of their own each. */
  uint64_t pre = f->s.preemptions;
  for (int i = 0; i < 16 && f->s.preemptions == pre; i++) step(f);
  assert_true(f->s.preemptions > pre);
  assert_int_equal(b->state, SCHED_WAITING);
  assert_int_equal(b->table.n, 0);
  for (int i = 0; i < 3; i++) {
    assert_int_equal(a->table.ids[i], shared[i]);
    assert_int_equal(servd_kv_cache_refcount(f->kv, shared[i]), 2); /* a and the cache */
  }
  uint64_t hits = f->s.bm.pc.hits;
  int b_tokens = b->n_tokens;
  sched_remove(&f->s, a); /* room again */
  step(f);
  assert_int_equal(b->state, SCHED_RUNNING);
  for (int i = 0; i < 3; i++) assert_int_equal(b->table.ids[i], shared[i]);
  /* Everything but its last token found: the shared blocks and its own full blocks that survived. */
  assert_true(f->s.bm.pc.hits - hits >= 12);
  assert_int_equal(b->n_computed, b_tokens);
  assert_int_equal(b->n_cached, 12); /* reported: the first admission's */
  teardown_fx(f);
}

/* Two requests with one prompt arriving together (a burst, or n choices): the second waits while
 * the first computes the common blocks, then finds them all; with chunked prefill it waits chunk by
 * chunk. Everything else in the queue waits behind it, as for blocks. */
static void test_burst_computes_once(void **state) {
  (void)state;
  fixture *f = setup_fx(32, 8);
  sched_seq *a = add_seq(f, 0, 18, 18);
  sched_seq *b = add_seq(f, 1, 18, 18);
  assert_int_equal(step(f), 8); /* a's first chunk only */
  assert_int_equal(b->state, SCHED_WAITING);
  assert_int_equal(step(f), 8);
  assert_int_equal(b->state, SCHED_WAITING); /* finds 2 blocks, a is computing the third */
  assert_int_equal(step(f), 2 + 2);          /* a's last 2; b: 4 blocks found, its last 2 */
  assert_int_equal(b->state, SCHED_RUNNING);
  assert_int_equal(b->n_cached, 16);
  for (int i = 0; i < 4; i++) assert_int_equal(b->table.ids[i], a->table.ids[i]);
  teardown_fx(f);
}

/* Requests cancelled (a client gone) in the middle of a shared prefill: the one computing the common
 * blocks, the one waiting for them, and one holding blocks another shares. Those still queued go on
 * with what was registered before the cancellation, and once all are gone no block is held and every
 * block is available again (the engine's KV usage returns to its idle value). */
static void test_cancel_mid_shared_prefill(void **state) {
  (void)state;
  fixture *f = setup_fx(32, 8);
  sched_seq *a = add_seq(f, 0, 18, 18);
  sched_seq *b = add_seq(f, 1, 18, 18);
  sched_seq *c = add_seq(f, 2, 22, 16);
  assert_int_equal(step(f), 8); /* a's first chunk; b waits for it, c behind b */
  assert_int_equal(b->state, SCHED_WAITING);
  sched_remove(&f->s, a); /* a's client goes away: its 2 registered blocks stay cached, unheld */
  assert_int_equal(sched_used_blocks(&f->s), 0);
  assert_int_equal(sched_cached_blocks(&f->s), 2);
  /* b no longer waits for a: it finds those 2 blocks and computes the rest itself */
  assert_int_equal(step(f), 8);
  assert_int_equal(b->state, SCHED_RUNNING);
  assert_int_equal(b->n_cached, 8);
  assert_int_equal(c->state, SCHED_WAITING); /* b is computing c's third block */
  sched_remove(&f->s, c);                    /* cancelled while waiting: it held nothing */
  assert_int_equal(c->table.n, 0);
  sched_seq *d = add_seq(f, 3, 30, 16);
  assert_int_equal(step(f), 2 + 6); /* b's last 2; d: 4 blocks found (b's), 6 of its 14 own */
  assert_int_equal(d->state, SCHED_RUNNING);
  assert_int_equal(d->n_cached, 16);
  for (int i = 0; i < 4; i++) assert_int_equal(d->table.ids[i], b->table.ids[i]);
  sched_remove(&f->s, b); /* b goes while d shares its blocks: d keeps them, nothing else is held */
  assert_int_equal(sched_used_blocks(&f->s), d->table.n);
  assert_int_equal(d->n_computed, 22);
  sched_remove(&f->s, d); /* d goes mid-prefill too */
  assert_int_equal(f->s.running.n, 0);
  assert_int_equal(f->s.waiting.n, 0);
  assert_int_equal(sched_used_blocks(&f->s), 0);
  assert_int_equal(prefix_cache_available(&f->s.bm.pc), servd_kv_cache_n_blocks(f->kv));
  teardown_fx(f);
}

/* Speculation's verify rows: drafts are computed with the last token as one chunk with a row each;
 * their blocks are registered only once accepted, and sched_truncate gives back the blocks of
 * rejected ones while blocks shared through the cache stay. */
static void add_drafts(sched_seq *q, int n) {
  for (int j = 0; j < n; j++) q->tokens[q->n_tokens + j] = 500 + j;
  q->n_tokens += n;
  q->n_draft = n;
}

/* What the engine does after a verify row: drafts off, `accepted` of them and one token taken. */
static void judge(fixture *f, sched_seq *q, int accepted) {
  int n_draft = q->n_draft, n_kv = q->n_computed - n_draft + accepted;
  q->n_tokens -= n_draft;
  q->n_draft = 0;
  for (int j = 0; j < accepted; j++) q->tokens[q->n_tokens++] = 500 + j;
  q->tokens[q->n_tokens++] = 9;
  sched_truncate(&f->s, q, n_kv);
}

static void test_verify_rows_truncate(void **state) {
  (void)state;
  fixture *f = setup_fx(16, 64);
  sched_seq *a = add_seq(f, 0, 6, 0);
  step(f); /* 6 computed, a 7th token appended; block 0 registered */
  assert_int_equal(f->s.bm.pc.n_cached, 1);

  add_drafts(a, 5); /* positions 6..11: the last token and 5 drafts */
  assert_int_equal(sched_plan(&f->s), 6);
  assert_int_equal(a->chunk, 6);
  assert_true(a->wants_logits);
  assert_int_equal(a->n_rows, 6);
  assert_int_equal(a->row_pos, 6);
  assert_int_equal(f->s.n_logit_rows, 6);
  assert_int_equal(f->s.n_decode_rows, 1);
  assert_int_equal(f->s.n_prefill_tokens, 0);
  assert_int_equal(f->s.n_verify_tokens, 5);
  assert_int_equal(a->table.n, 3);
  sched_commit(&f->s);
  assert_int_equal(f->s.bm.pc.n_cached, 1); /* block 1 (4..7) holds drafts: not yet */
  judge(f, a, 2);                           /* tokens 0..8 have K/V, the 10th is the new one */
  assert_int_equal(a->n_computed, 9);
  assert_int_equal(a->n_tokens, 10);
  assert_int_equal(f->s.bm.pc.n_cached, 2); /* block 1 now holds accepted tokens */
  assert_int_equal(a->table.n, 3);

  add_drafts(a, 6); /* positions 9..15: a fourth block */
  assert_int_equal(sched_plan(&f->s), 7);
  assert_int_equal(a->table.n, 4);
  assert_int_equal(sched_used_blocks(&f->s), 4);
  sched_commit(&f->s);
  judge(f, a, 0); /* the first draft rejected: the fourth block goes back */
  assert_int_equal(a->n_computed, 10);
  assert_int_equal(a->n_tokens, 11);
  assert_int_equal(a->table.n, 3);
  assert_int_equal(sched_used_blocks(&f->s), 3);
  assert_int_equal(f->s.bm.pc.n_cached, 2); /* block 2 (8..11) is not full of accepted tokens */
  assert_int_equal(step(f), 1);             /* a plain decode after it */

  /* Drafts of a sequence that is removed (or preempted) before its step leave it. */
  add_drafts(a, 3);
  int n = a->n_tokens;
  sched_remove(&f->s, a);
  assert_int_equal(a->n_tokens, n - 3);
  assert_int_equal(a->n_draft, 0);

  /* A new sequence with a's beginning finds the blocks of accepted tokens only. */
  sched_seq *b = &f->seqs[1];
  memset(b, 0, sizeof *b);
  memcpy(f->toks[1], f->toks[0], sizeof(int32_t) * 12);
  b->tokens = f->toks[1];
  b->n_tokens = 12;
  assert_int_equal(sched_seq_init(&f->s, b), 0);
  sched_add(&f->s, b);
  step(f);
  assert_int_equal(b->n_cached, 8);
  teardown_fx(f);
}

/* A verify row cut by the token budget keeps only the drafts that fit. */
static void test_verify_row_cut_by_budget(void **state) {
  (void)state;
  fixture *f = setup_fx(16, 4);
  sched_seq *a = add_seq(f, 0, 4, 0);
  step(f);
  add_drafts(a, 6);
  assert_int_equal(sched_plan(&f->s), 4); /* the budget: the last token and 3 drafts */
  assert_int_equal(a->n_draft, 3);
  assert_int_equal(a->n_tokens, 8);
  assert_int_equal(a->n_rows, 4);
  sched_commit(&f->s);
  judge(f, a, 3);
  assert_int_equal(a->n_computed, 8);
  assert_int_equal(a->n_tokens, 9);
  teardown_fx(f);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_lookups),
      cmocka_unit_test(test_forced_collisions),
      cmocka_unit_test(test_lru_eviction),
      cmocka_unit_test(test_orphaned_child),
      cmocka_unit_test(test_duplicate_register),
      cmocka_unit_test(test_disabled),
      cmocka_unit_test(test_sched_hits),
      cmocka_unit_test(test_shared_block_outlives_owner),
      cmocka_unit_test(test_preempt_shared),
      cmocka_unit_test(test_burst_computes_once),
      cmocka_unit_test(test_cancel_mid_shared_prefill),
      cmocka_unit_test(test_verify_rows_truncate),
      cmocka_unit_test(test_verify_row_cut_by_budget),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
