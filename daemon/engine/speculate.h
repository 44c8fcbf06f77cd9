/* Speculative decoding (internal to the engine): draft tokens proposed without a model, verified by
 * the target model in the same forward as the step's other rows.
 *
 * A decoding sequence with drafts d1..dk is a verify row: the step computes its last token and the
 * k drafts (a short prefill chunk: one weight read for k + 1 tokens) and returns logits for all k + 1
 * positions. The update phase samples row 0 exactly as a plain decode step would, with the request's
 * own sampler; while the sampled token equals the next draft it goes on to the next row. Each row's
 * token is therefore drawn from the same distribution, with the same sampler state (penalties,
 * min_tokens, the seeded generator: one draw per emitted token), as without speculation: greedy
 * output is token-identical, and sampling keeps its distribution. For a proposer that drafts one
 * token deterministically, "sample, then compare" is the standard rejection rule (accept d with
 * probability p(d), else draw from p without d). The KV of rejected drafts is given back with
 * sched_truncate; blocks are registered in the prefix cache only once their tokens are accepted.
 *
 * Proposers: the request's own prompt and output (prompt lookup: the most recent earlier occurrence
 * of its last tokens, and what followed), and a suffix index over recent requests of the model
 * (bounded: a ring of tokens and a hash of their trigrams), for agent loops and multi-turn chats that
 * repeat spans across requests.
 *
 * Draft length (auto): per request, the decayed share of drafts accepted gives the expected tokens a
 * k-draft verify row yields, E(k) = 1 + a + ... + a^k; the step's cost model (sched_cost) prices its
 * k extra tokens. A row drafts the k that maximizes the step's tokens per second, and none when no k
 * beats the step without drafts (random text, large compute-bound batches).
 * Not thread-safe: the scheduler thread calls everything here.
 */
#ifndef SERVD_ENGINE_SPECULATE_H
#define SERVD_ENGINE_SPECULATE_H

#include <stdbool.h>
#include <stdint.h>

#include "engine/scheduler.h"

/* Drafts per verify row at most (vLLM's num_speculative_tokens). */
#define SERVD_SPEC_MAX_DRAFT 16
/* Default draft bound. */
#define SERVD_SPEC_DEFAULT_DRAFT 8

typedef enum servd_spec_mode {
  SERVD_SPEC_AUTO = 0, /* both proposers, draft length chosen by the cost model (the default) */
  SERVD_SPEC_OFF,
  SERVD_SPEC_NGRAM,  /* the request's own tokens only, always num_speculative_tokens when found */
  SERVD_SPEC_SUFFIX, /* own tokens, then the suffix index; always num_speculative_tokens when found */
} servd_spec_mode;

/* "auto", "off", "ngram", "suffix" -> mode; -1 for anything else. */
int servd_spec_mode_parse(const char *s);
const char *servd_spec_mode_name(servd_spec_mode m);

/* ---- proposers (pure) ---------------------------------------------------------------------------- */

/* Prompt lookup: the most recent earlier occurrence of the longest suffix of tokens[0..n) of
 * SPEC_NGRAM_MIN..SPEC_NGRAM_MAX tokens, and up to k of the tokens that followed it, into out.
 * Returns their count (0: no occurrence). *match gets the suffix length matched. */
#define SPEC_NGRAM_MIN 2
#define SPEC_NGRAM_MAX 4
int spec_ngram_propose(const int32_t *tokens, int n, int k, int32_t *out, int *match);

/* Recent requests' tokens: a ring of cap tokens (sequences separated by -1) and a hash table of the
 * ring position following each trigram. Memory: 4 bytes per ring token and 8 per table slot. */
typedef struct spec_suffix_index spec_suffix_index;
int spec_suffix_index_create(int cap_tokens, spec_suffix_index **out);
void spec_suffix_index_free(spec_suffix_index *x); /* accepts NULL */
/* Appends one finished sequence (prompt and output). */
void spec_suffix_index_add(spec_suffix_index *x, const int32_t *tokens, int n);
/* Up to k tokens that followed the last trigram of tokens[0..n) in the most recent sequence that
 * held it; returns their count. */
int spec_suffix_index_propose(const spec_suffix_index *x, const int32_t *tokens, int n, int k, int32_t *out);

/* Expected tokens a verify row of k drafts yields when each draft is accepted with probability a. */
double spec_expected_tokens(double a, int k);
/* The draft length in [0, k_max] that maximizes tokens per nanosecond of a step of base_rows rows
 * costing step_ns, which a verify row makes fixed_ns longer plus token_ns per draft; 0 when no draft
 * pays. */
int spec_choose_length(double a, int k_max, int base_rows, double step_ns, double fixed_ns, double token_ns);

/* ---- per model ----------------------------------------------------------------------------------- */

typedef struct servd_spec_counters {
  uint64_t drafts, draft_tokens, accepted_tokens; /* vLLM's spec_decode_num_* */
  uint64_t accepted_per_pos[SERVD_SPEC_MAX_DRAFT];
} servd_spec_counters;

/* A request's speculation state (lives in the request). */
typedef struct servd_spec_seq {
  int32_t draft[SERVD_SPEC_MAX_DRAFT]; /* the drafts appended for the planned step */
  int n_draft;
  int kind;            /* of the drafts: the n-gram match length, 0 for the suffix index */
  double hits, trials; /* decayed accepted drafts and drafts reached (accepted + the first rejected) */
} servd_spec_seq;

typedef struct servd_spec {
  servd_spec_mode mode;
  int max_draft;
  spec_suffix_index *suffix; /* NULL: mode ngram or off */
  /* Decayed accepted drafts and drafts reached by proposal kind (servd_spec_seq.kind): the prior of
   * a request's acceptance. */
  double kind_hits[SPEC_NGRAM_MAX + 1], kind_trials[SPEC_NGRAM_MAX + 1];
  int quiet_steps;       /* steps since a row drafted (auto: exploration, see speculate.c) */
  servd_spec_counters c; /* read under the model's lock by the stats */
} servd_spec;

int servd_spec_init(servd_spec *sp, servd_spec_mode mode, int max_draft);
void servd_spec_free(servd_spec *sp); /* accepts a zeroed struct */

/* Drafts for q (a decoding sequence: one token to compute) whose request allows at most `room`
 * more tokens beyond the next: appends them to q->tokens (capacity must hold room more), sets
 * q->n_draft and ss. step_rows, step_ns: the step's decode rows and their cost; fixed_ns, token_ns:
 * what a verify row adds (sched_verify_cost), cost_known: measured on verify steps already. */
void servd_spec_propose(servd_spec *sp, servd_spec_seq *ss, sched_seq *q, int room, int step_rows, double step_ns,
                        double fixed_ns, double token_ns, bool cost_known);
/* Before a step's proposals. */
void servd_spec_step(servd_spec *sp);
/* After the verify row: n_accepted of ss->n_draft drafts were taken. */
void servd_spec_observe(servd_spec *sp, servd_spec_seq *ss, int n_accepted);
/* A finished request's tokens, for the suffix index. */
void servd_spec_remember(servd_spec *sp, const int32_t *tokens, int n);

#endif
