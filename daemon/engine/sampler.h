/* Token sampling for one request (internal to the engine); stop strings are stop_matcher.h's.
 *
 * A servd_sampler holds everything one request needs to pick its tokens, allocated once at create
 * (no allocation per token). Per step: servd_sampler_sample(logits) -> token (+ logprobs), then
 * servd_sampler_accept(token), then servd_sampler_finish(token) tells whether generation ends.
 *
 * Processing order (that of Hugging Face transformers' logits processors and warpers):
 *   0. logit_bias added to the logits (OpenAI); while fewer than min_tokens tokens are generated, the
 *      end-of-sequence (unless ignore_eos) and stop token ids get -inf (vLLM's min_tokens);
 *   1. repetition penalty r over every token seen in the prompt or the output: a positive logit is
 *      divided by r, a negative one multiplied by r;
 *   2. presence / frequency penalties over output tokens (OpenAI): logit -= presence (once a token has
 *      appeared) + count * frequency;
 *   3. temperature below 1e-5 (or top_k 1): greedy (arg max, lowest id on ties), steps 4-6 skipped;
 *   4. logits / temperature;
 *   5. top-k (k largest), then top-p (smallest prefix of the sorted distribution whose mass reaches p:
 *      a token is kept when the mass ranked strictly above it is < p), then min-p (probability at least
 *      min_p times the largest);
 *   6. one draw from the renormalized remaining distribution with the request's xoshiro256** stream,
 *      seeded by splitmix64(seed): the same seed and logits give the same tokens.
 * Ties in the sorted order are broken by the lower token id, so the kept sets are exact.
 *
 * Logprobs: SERVD_LOGPROBS_RAW (default) reports the log-softmax of the model's logits as given
 * (what the OpenAI API and vLLM report); SERVD_LOGPROBS_PROCESSED the log-softmax after steps 1-2 and
 * 4 (temperature, not applied when greedy), before truncation: the distribution the draw is taken
 * from before top-k/top-p/min-p.
 */
#ifndef SERVD_ENGINE_SAMPLER_H
#define SERVD_ENGINE_SAMPLER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/types.h"

#define SERVD_SAMPLER_MAX_TOP 20 /* OpenAI's top_logprobs limit */

typedef enum servd_logprob_mode {
  SERVD_LOGPROBS_RAW = 0,
  SERVD_LOGPROBS_PROCESSED = 1,
} servd_logprob_mode;

/* Per-step scratch (about 20 bytes per vocabulary entry). Samplers that are only ever used from one
 * thread (the scheduler's) can share one instead of owning 1 MB each. */
typedef struct servd_sampler_scratch servd_sampler_scratch;
int servd_sampler_scratch_create(int n_vocab, servd_sampler_scratch **out); /* *out owned by the caller */
void servd_sampler_scratch_free(servd_sampler_scratch *x);                  /* accepts NULL */

typedef struct servd_sampler_config {
  int n_vocab;                    /* length of each logits row */
  const servd_gen_params *params; /* copied; stop strings are not used here (stop_matcher.h) */
  const int32_t *eos_ids;         /* end-of-sequence ids (copied), ignored when params->ignore_eos */
  int n_eos;
  servd_logprob_mode logprob_mode;
  servd_sampler_scratch *scratch; /* NULL: the sampler owns its scratch; else borrowed, must outlive
                                     the sampler, and its samplers are used from one thread at a time */
  bool masked;                    /* constrained decoding: the sampler owns a token mask (servd_sampler_mask) */
} servd_sampler_config;

typedef struct servd_sampler servd_sampler;

typedef struct servd_sampled {
  int32_t token;
  float logprob;                /* of token; 0 when params->logprobs < 0 */
  const servd_top_logprob *top; /* n_top best, descending (borrowed until the next sample call) */
  int n_top;
} servd_sampled;

typedef enum servd_finish {
  SERVD_FINISH_NONE = 0,
  SERVD_FINISH_EOS = 1,        /* an end-of-sequence token: finish_reason "stop" */
  SERVD_FINISH_STOP_TOKEN = 2, /* one of params->stop_token_ids: finish_reason "stop" */
  SERVD_FINISH_LENGTH = 3,     /* max_tokens reached: finish_reason "length" */
} servd_finish;

/* SERVD_EINVAL for bad parameters (negative temperature, top_p outside (0, 1], min_p outside [0, 1],
 * repetition_penalty <= 0, logprobs > SERVD_SAMPLER_MAX_TOP, stop or logit_bias ids outside the
 * vocabulary, more than SERVD_MAX_LOGIT_BIAS biases).
 * *out owned by the caller. Without params->has_seed the stream is seeded from the system. */
int servd_sampler_create(const servd_sampler_config *c, servd_sampler **out);
void servd_sampler_free(servd_sampler *s); /* accepts NULL */

/* Records prompt tokens for the repetition penalty (ids outside the vocabulary are ignored). */
void servd_sampler_add_prompt(servd_sampler *s, const int32_t *ids, int n);
/* Picks the next token from one row of n_vocab logits (read only). */
int servd_sampler_sample(servd_sampler *s, const float *logits, servd_sampled *out);
/* Whether the next token is the arg max of the raw logits alone (greedy, no penalties, no logprobs):
 * then the first row index of the largest logit is the token (NaN counting as -inf; a row with no
 * logit above -inf gives 0), which the engine may take from a device's top-1 instead of a whole row. */
bool servd_sampler_plain_greedy(const servd_sampler *s);
/* Constrained decoding (config.masked): the allowed-token bitmask, ceil(n_vocab / 32) words, bit
 * (i % 32) of word i / 32 set when token i may be sampled, written in place by the grammar engine
 * before each step (borrowed; NULL when the sampler is not masked). servd_sampler_mask_ready says it
 * holds this step's mask: the next sample (or kept) call gives every other token -inf right after
 * the NaN check, before penalties and temperature, and then forgets it, so a stale mask never
 * applies twice. A masked sampler is never plain greedy (the whole row is needed). */
uint32_t *servd_sampler_mask(servd_sampler *s, int *n_words);
void servd_sampler_mask_ready(servd_sampler *s);
/* Records a generated token (penalties, count). */
void servd_sampler_accept(servd_sampler *s, int32_t token);
/* After accept: whether generation ends with this token (never by a stop or end-of-sequence id within
 * the first min_tokens tokens). */
servd_finish servd_sampler_finish(const servd_sampler *s, int32_t token);
int servd_sampler_n_generated(const servd_sampler *s);
/* The tokens a draw could pick from for these logits, in ascending id order, without drawing (for
 * tests and diagnostics). ids has room for n_vocab. Tokens whose probability underflows float (more
 * than 87 below the maximum after temperature) are never candidates. */
int servd_sampler_kept(servd_sampler *s, const float *logits, int32_t *ids, int *n_ids);

#endif
