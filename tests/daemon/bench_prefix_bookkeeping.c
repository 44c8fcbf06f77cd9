/* What the prefix cache's bookkeeping costs a scheduler step, with no model: 32 sequences of random
 * 128-token prompts (no two share a block, so the cache never hits) each generating 64 tokens, then
 * replaced by a new one, over the default model's 5825 blocks of 16 (cached blocks are evicted once
 * the pool is full). Each round times the same steps (plan, commit, the sampled token appended) with
 * the cache on and off, in alternating order; prints the median nanoseconds per step of each and
 * their difference, which scripts/bench/traffic.sh sets against a decode step of the model measured
 * in the same run. A benchmark, not a test: nothing is asserted about times.
 * Usage: bench_prefix_bookkeeping [STEPS per round (4000)] [ROUNDS (5)] */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/scheduler.h"

#define SEQS 32
#define PROMPT 128
#define GEN 64
#define BLOCKS 5825
#define BLOCK 16

static uint64_t rng_state = 88172645463325252ull;
static int32_t next_token(void) { /* xorshift64: token ids of a 49152 vocabulary */
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return (int32_t)(rng_state % 49152);
}

static double now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

static void start_seq(servd_scheduler *s, sched_seq *q, int32_t *tokens) {
  for (int j = 0; j < PROMPT; j++) tokens[j] = next_token();
  sched_seq_free(q);
  memset(q, 0, sizeof *q);
  q->tokens = tokens;
  q->n_tokens = PROMPT;
  if (sched_seq_init(s, q)) exit(1);
  sched_add(s, q);
}

/* ns per step over `steps` steps with the cache on or off. */
static double run(bool cache, int steps) {
  servd_kv_cache *kv;
  if (servd_kv_cache_create_blocks_only(&kv, 1, 1, 4, BLOCK, BLOCKS)) exit(1);
  sched_config c = {.max_batch_tokens = 512,
                    .max_seqs = SEQS,
                    .max_seq_len = 1024,
                    .prefix_cache = cache,
                    .cache_key = 1};
  servd_scheduler s;
  if (sched_init(&s, &c, kv)) exit(1);
  static sched_seq seqs[SEQS];
  static int32_t tokens[SEQS][PROMPT + GEN];
  memset(seqs, 0, sizeof seqs);
  rng_state = 88172645463325252ull; /* the same prompts on and off */
  for (int i = 0; i < SEQS; i++) start_seq(&s, &seqs[i], tokens[i]);
  double t0 = now_ns();
  for (int step = 0; step < steps; step++) {
    if (sched_plan(&s) < 0) exit(1);
    sched_commit(&s);
    for (int i = 0; i < s.n_planned; i++) {
      sched_seq *q = s.planned[i];
      if (!q->wants_logits) continue;
      q->tokens[q->n_tokens++] = next_token();
      if (q->n_tokens == PROMPT + GEN) {
        sched_remove(&s, q);
        start_seq(&s, q, q->tokens);
      }
    }
  }
  double ns = (now_ns() - t0) / steps;
  for (int i = 0; i < SEQS; i++) {
    sched_remove(&s, &seqs[i]);
    sched_seq_free(&seqs[i]);
  }
  sched_free(&s);
  servd_kv_cache_destroy(kv);
  return ns;
}

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

int main(int argc, char **argv) {
  int steps = argc > 1 ? atoi(argv[1]) : 4000, rounds = argc > 2 ? atoi(argv[2]) : 5;
  if (steps < 1 || rounds < 1 || rounds > 100) {
    fprintf(stderr, "usage: bench_prefix_bookkeeping [STEPS >= 1] [ROUNDS 1-100]\n");
    return 2;
  }
  double on[100], off[100];
  for (int r = 0; r < rounds; r++) {
    if (r % 2) {
      off[r] = run(false, steps);
      on[r] = run(true, steps);
    } else {
      on[r] = run(true, steps);
      off[r] = run(false, steps);
    }
  }
  qsort(on, (size_t)rounds, sizeof *on, cmp);
  qsort(off, (size_t)rounds, sizeof *off, cmp);
  double m_on = on[rounds / 2], m_off = off[rounds / 2];
  printf("step_ns_cache_on %.0f\nstep_ns_cache_off %.0f\nbookkeeping_ns_per_step %.0f\n", m_on, m_off, m_on - m_off);
  return 0;
}
