/* Continuous-batching scheduler (internal to the engine): which sequences run in the next step and
 * how many of their tokens, with KV blocks allocated as sequences grow.
 *
 * Policy (iteration-level, as in vLLM/Orca):
 *  - Priority, then FCFS by arrival order (priority: lower runs first, 0 by default, vLLM's
 *    `priority`). Running sequences are served first, best priority first and oldest first among
 *    equals; waiting ones are admitted in (priority, arrival) order while the token budget, the
 *    running-sequence limit and free KV blocks allow (a waiting sequence that does not fit stops
 *    admission: nobody overtakes it). When the head of the queue lacks blocks or a running slot and
 *    a running sequence has a worse priority, the worst one (newest among equals) is preempted for it.
 *  - A sequence needs n_tokens - n_computed tokens computed. A decoding sequence needs one; a
 *    prefilling one gets a chunk of its prompt up to what the budget leaves after reserving one
 *    token for every running decoder, so long prompts never stall decodes (chunked prefill).
 *  - KV blocks for a chunk are taken just before it runs. When none are left, the newest running
 *    sequence is preempted: its blocks are freed, n_computed returns to 0 and it goes back to the
 *    waiting queue in its arrival place, to be recomputed later (prompt plus tokens generated so far).
 *  - Prefix caching (prefix_cache.h, cfg.prefix_cache): at admission a sequence shares every cached
 *    full block its tokens start with and computes only the rest (at least its last token, whose
 *    logits are needed); only computed tokens count against the budget. After each step, the full
 *    blocks it completed are registered. A released block stays cached until memory is needed, so
 *    a preempted sequence finds its own blocks again when they survived. A waiting sequence whose
 *    next full block a running one is about to compute waits for it (one admission stop, as when
 *    blocks are short) instead of computing it too.
 *
 *  - Embeddings (sched_seq.embed) and generation never share a step: the model returns either
 *    hidden rows or logits. When both have work, their steps alternate.
 *  - Latency-bounded steps (cfg.max_step_ns): the scheduler learns an exponentially weighted cost
 *    per decode row and per prefill token from the steps the engine times (sched_observe). A step
 *    that carries decodes gets only the prefill tokens that fit its target next to its decodes, but
 *    at least one block's worth; the target is max_step_ns, or SCHED_STEP_STRETCH x the decodes'
 *    estimate when that is longer, so prefill never gets less time than the decodes and prompts keep
 *    their pace when decodes alone fill max_step_ns. A step without decodes uses the whole budget (no
 *    inter-token latency is at stake). A decode then waits at most about max(target, STRETCH decode
 *    steps) for its next token instead of behind a max_batch_tokens prefill chunk.
 *
 * Blocks come from the block manager (block_manager.h), which owns the tables, the prefix cache and
 * the way to the allocator; with tensor parallelism the other ranks' caches use the same ids.
 * Not thread-safe: the engine calls it from its scheduler thread only.
 */
#ifndef SERVD_ENGINE_SCHEDULER_H
#define SERVD_ENGINE_SCHEDULER_H

#include <stdbool.h>
#include <stdint.h>

#include "engine/block_manager.h"
#include "engine/step_arrays.h"
#include "servd/ops.h"

typedef enum sched_state { SCHED_NEW = 0, SCHED_WAITING, SCHED_RUNNING, SCHED_REMOVED } sched_state;

/* The rows of a sequence's chunk whose logits (or hidden states) a step returns. */
typedef enum sched_rows {
  SCHED_ROWS_LAST = 0, /* the last token's, once the chunk reaches it (sampling; last-token pooling) */
  SCHED_ROWS_ALL = 1,  /* every computed token's (mean pooling, prompt logprobs) */
  SCHED_ROWS_FIRST = 2 /* position 0's (CLS pooling) */
} sched_rows;

typedef struct sched_seq {
  /* Owned by the caller, read by the scheduler. tokens holds the prompt then the generated tokens;
   * the caller appends after sampling (capacity >= the context length). */
  int32_t *tokens;
  int n_tokens;
  void *owner;

  /* Managed by the scheduler. */
  int n_computed;    /* tokens whose K/V are in the cache */
  block_table table; /* its blocks (allocated by sched_seq_init) */
  uint64_t order;    /* arrival order (FCFS) */
  int priority;      /* lower runs first; set by the caller before sched_add */
  sched_state state;
  int n_preempted;
  struct sched_seq *prev, *next;

  int n_cached; /* tokens of the prompt found in the prefix cache at its first admission */
  /* Set by the caller before sched_add. embed: an embedding (a prefill whose hidden rows are pooled):
   * it runs in steps of its own kind (servd_forward_batch.want_hidden), never shares cached blocks
   * and never registers its own. rows: which of its chunk's rows the step returns. no_cache_hits:
   * computes its whole prompt (prompt logprobs need every position's logits). */
  bool embed;
  sched_rows rows;
  bool no_cache_hits;
  /* Set by the caller before sched_add: > 0, its tokens from this position on are of token type 1
   * (a text pair's second text: servd_forward_batch.token_types), those before of type 0. */
  int pair_split;
  /* Speculation (engine/speculate.h): the last n_draft of tokens are drafts to verify. Set by the
   * caller before sched_plan, on a decoding sequence only; the step then computes them with its last
   * token and returns a row for each (a verify row). A plan short of room cuts them; preemption and
   * removal drop them; sched_truncate ends them. */
  int n_draft;

  /* Plan of the current step (valid after sched_plan). */
  int chunk;         /* tokens computed this step */
  bool wants_logits; /* the chunk ends at the last token: the caller samples the next one */
  int n_rows;        /* rows of the step's output that are this sequence's (see rows), in batch order */
  int row_pos;       /* the position of the first of them */
} sched_seq;

typedef struct sched_list {
  sched_seq *head, *tail;
  int n;
} sched_list;

typedef struct sched_config {
  int max_batch_tokens;  /* token budget per step */
  int max_seqs;          /* running sequences at most */
  int max_seq_len;       /* context length: tokens of one sequence at most */
  bool prefix_cache;     /* share cached full blocks between sequences with a common prefix */
  uint64_t cache_key;    /* the model's key: blocks are only found by sequences of the same key */
  int64_t max_step_ns;   /* target duration of a step that carries decodes; 0: no bound */
  bool whole_embeddings; /* an encoder's: an embedding's prompt is computed in one step, never in chunks */
  int max_logit_rows;    /* output rows of a generation step at most (a GPU step's buffers); 0: no bound.
                         * At least max_seqs: every sequence keeps its one row; verify rows' drafts and
                         * prompt-logprob chunks are cut to what is left */
} sched_config;

/* How much longer than its decodes alone a step carrying decodes may run: its target is
 * max(max_step_ns, SCHED_STEP_STRETCH x the decodes' estimate), so prefill gets at least
 * (SCHED_STEP_STRETCH - 1) x the decodes' time and a decode's step grows at most that many times.
 * With the target alone, 32 decoders of the default model on a 2-core host nearly filled 100 ms by
 * themselves, prompts advanced one block per step and TTFT p50 rose 3.8x over the unbounded
 * scheduler (4.8 s to 18.4 s). With 2, TTFT p50 measured 1.3-1.5x the unbounded one and ITL p99
 * 2-3x shorter; 3 gave TTFT 1.0x but ITL p99/p50 6.1 (docs/performance.md, "Latency-bounded steps"). */
#define SCHED_STEP_STRETCH 2.0

/* Tokens at most in one chunk of a sequence that wants logits for all its rows (prompt logprobs). */
#define SCHED_MAX_LOGIT_CHUNK 128

/* What steps cost, learned from sched_observe (nanoseconds; 0 until a step of that kind was seen). */
typedef struct sched_cost {
  double decode_row_ns;    /* per decoding sequence, beyond decode_step_ns */
  double decode_step_ns;   /* a decode step's fixed cost, beyond its rows (0 until row counts varied) */
  double prefill_token_ns; /* per prefill token, beyond the decode rows' estimate */
  /* Exponentially weighted sums over decode-only steps (weight, rows, rows^2, time, rows x time): the
   * least-squares line time = decode_step_ns + decode_row_ns x rows. */
  double w, r, rr, t, rt;
  bool decode_line; /* the decode-only steps had varied row counts: the line above is fitted */
  /* Exponentially weighted sums over every step, for the plane time = fixed + row x rows + token x
   * tokens (decode rows, prefill tokens): weight, the means of rows, tokens and time, and the
   * co-moments (rows, rows), (tokens, tokens), (rows, tokens), (rows, time), (tokens, time). It gives
   * the decode line while decode-only steps had one row count (a burst of prompts runs mixed steps
   * only). */
  double jw, jr, jk, jt, jrr, jkk, jrk, jrt, jkt;
  int joint_steps;
  bool joint; /* the estimates above came from the plane */
  /* Exponentially weighted sums over steps with verify rows (weight, drafts, drafts^2, the time
   * beyond the estimate of their decode rows and prefill, drafts x that): sched_verify_cost's line. */
  double vw, vx, vxx, vy, vxy;
} sched_cost;

typedef struct servd_scheduler {
  sched_config cfg;
  block_manager bm; /* every block of every sequence */
  sched_list waiting, running;
  uint64_t next_order;
  uint64_t preemptions;

  /* Plan of the step: scheduled sequences in batch order and the batch layout, preallocated. */
  sched_seq **planned;
  int n_planned;
  int n_tokens;
  int n_logit_rows;
  servd_step_arrays step; /* the step's inputs: max_batch_tokens tokens, max_seqs sequences */
  sched_seq **starved;    /* sequences that can never fit the cache (max_seqs) */
  int n_starved;
  int n_decode_rows;    /* of the plan: decoding sequences */
  int n_prefill_tokens; /* of the plan: tokens of prefilling (or recomputing) sequences */
  int n_verify_tokens;  /* of the plan: drafts of verify rows (each row counts as a decode row) */
  int prefill_cap;      /* of the plan: prefill tokens allowed by max_step_ns (INT32_MAX: unbounded) */
  sched_cost cost;
  bool embed_step; /* of the plan: a step of embeddings only (their hidden rows, no logits) */
  bool embed_turn; /* embeddings and generation alternate steps when both have work */
} servd_scheduler;

int sched_init(servd_scheduler *s, const sched_config *cfg, servd_kv_cache *kv);
void sched_free(servd_scheduler *s); /* accepts a zeroed struct */

/* Allocates the block table of a sequence (once per request); tokens/n_tokens/owner set by caller. */
int sched_seq_init(servd_scheduler *s, sched_seq *q);
void sched_seq_free(sched_seq *q);

/* Queues a sequence at the tail of the waiting queue. */
void sched_add(servd_scheduler *s, sched_seq *q);
/* Takes a sequence out (finished or cancelled) and frees its blocks. Idempotent. */
void sched_remove(servd_scheduler *s, sched_seq *q);

/* Plans the next step: fills planned and step (tokens, positions, slots, logit rows and the attention
 * layout; n_tokens, n_logit_rows and n_planned count them). Sequences that can never be served
 * (their tokens need more blocks than the whole cache) are listed in starved[] and already removed;
 * the caller fails them. Returns the number of tokens planned (0: idle) or a negative SERVD_E* code. */
int sched_plan(servd_scheduler *s);
/* After the step ran: advances n_computed of every planned sequence. The blocks of a verify row
 * are registered in the prefix cache by sched_truncate, once its drafts are judged. */
void sched_commit(servd_scheduler *s);
/* The block manager's truncate: q keeps the K/V of its first n_kv tokens (n_kv <= n_computed; the
 * caller has set n_tokens, n_tokens >= n_kv) and gives back the blocks past what n_tokens needs:
 * rejected drafts' K/V goes, blocks shared through the prefix cache (below n_kv) stay intact. Its
 * full blocks are then registered. Ends the sequence's drafts. */
void sched_truncate(servd_scheduler *s, sched_seq *q, int n_kv);
/* While a verify row is sampled: q's full blocks whose K/V is final below n_kv (its real tokens and
 * the drafts accepted so far) become findable now, since q may end at the next token, before
 * sched_truncate (its blocks are then released, and unregistered ones are not cached). */
void sched_register_final(servd_scheduler *s, sched_seq *q, int n_kv);
/* The estimated cost in nanoseconds of a step of `rows` decode rows, and of one more token in a
 * step (a prefill token's); 0 until learned. */
double sched_decode_cost(const servd_scheduler *s, int rows);
/* A verify row's cost in a step: the step's extra fixed cost and one draft token's (nanoseconds),
 * learned from the steps that verified drafts (true); before any, 0 and a prefill token's cost. */
bool sched_verify_cost(const servd_scheduler *s, double *fixed_ns, double *token_ns);
/* After the planned step ran in step_ns (the whole step: forward and sampling): updates the cost
 * model the next plans bound their prefill with. Call before the next sched_plan. */
void sched_observe(servd_scheduler *s, int64_t step_ns);

/* Blocks held by sequences (cached blocks nobody holds count as free: they are evicted on demand). */
int sched_used_blocks(const servd_scheduler *s);
/* Full blocks in the prefix cache (held or evictable). */
int sched_cached_blocks(const servd_scheduler *s);

#endif
