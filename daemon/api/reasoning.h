/* Reasoning output (internal to daemon/api): a reasoning model writes its thought between two markers
 * its family defines (Qwen3, DeepSeek-R1, SmolLM3: <think> ... </think>; Magistral: [THINK] ...
 * [/THINK]), then its answer. The markers come from the package (models/llama/reasoning.py, through
 * the render hook); this splitter separates the thought from the answer as the text streams in, in
 * pieces of any size: a marker may arrive cut over several pieces.
 *
 * The rules (docs/http-api.md, "Reasoning"):
 * - The thought is the text between the start marker and the end marker. The start marker counts
 *   only at the very start of the output (after whitespace); when the prompt already opened the
 *   thought (DeepSeek-R1's templates end with "<think>\n"), the output starts inside it.
 * - Whitespace right after either marker and right before the end marker is dropped (models write
 *   "<think>\n...\n</think>\n\n"); the answer is otherwise the text as generated.
 * - An output that does not start with the start marker is all answer, byte for byte.
 * - An output that ends inside the thought (max_tokens, a stop) is all thought.
 * Text that could still become part of a marker, or whitespace that could still precede the end
 * marker, is held back until the next piece tells; the end of the output releases it. */
#ifndef SERVD_API_REASONING_H
#define SERVD_API_REASONING_H

#include <stdbool.h>
#include <stddef.h>

#include "http/buf.h"

typedef enum { THINK_MAYBE, THINK_IN, THINK_OUT } api_think_phase;

typedef struct api_think {
  char start[32], end[32]; /* the markers (start "" when the prompt opened the thought) */
  api_think_phase phase;
  bool skip_ws;   /* drop whitespace before the next emitted byte (after a marker) */
  bool done;      /* fed with final: later text is answer, passed through */
  bool thought;   /* a thought was found (opened or started): the output has a reasoning part */
  servd_buf pend; /* held back */
} api_think;

/* A piece of the output: thinking (the thought) or not (the answer); n > 0. */
typedef void (*api_think_emit)(void *ud, bool thinking, const char *s, size_t n);

/* start, end: the markers (each shorter than 32 bytes; false otherwise). opened: the prompt ended
 * with the start marker, the output starts inside the thought. */
bool api_think_init(api_think *t, const char *start, const char *end, bool opened);
void api_think_free(api_think *t); /* accepts a zeroed struct */
/* Feeds the next piece s[0, n) of the output; final: it is the last (n may be 0), everything held is
 * released. Emits the pieces ready, in order. -1: out of memory. */
int api_think_feed(api_think *t, const char *s, size_t n, bool final, api_think_emit emit, void *ud);
/* Whether the splitter is inside the thought (counts the thought's tokens). */
static inline bool api_think_thinking(const api_think *t) { return t->phase == THINK_IN && !t->done; }

#endif
