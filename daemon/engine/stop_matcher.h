/* Stop strings of one request (internal to the engine).
 *
 * A servd_stop_matcher is fed the detokenized text deltas and finds stop strings even when they span
 * token boundaries. Text that could still be the start of a stop string is held back; when a stop
 * string appears, the text before it is released and the rest dropped (the stop string is not
 * returned, as in the OpenAI API). Allocated at create; no allocation per token unless a delta is
 * longer than any before.
 */
#ifndef SERVD_ENGINE_STOP_MATCHER_H
#define SERVD_ENGINE_STOP_MATCHER_H

#include <stdbool.h>
#include <stddef.h>

typedef struct servd_stop_matcher servd_stop_matcher;

/* Copies the strings (empty ones are ignored). *out owned by the caller. */
int servd_stop_matcher_create(const char *const *stops, int n, servd_stop_matcher **out);
void servd_stop_matcher_free(servd_stop_matcher *m); /* accepts NULL */
/* text, text_len: what may be released now (borrowed until the next call); *stopped: a stop string
 * was found, feed nothing more. Grows its buffers only when a delta is longer than any before. */
int servd_stop_matcher_push(servd_stop_matcher *m, const char *delta, size_t len, const char **text, size_t *text_len,
                            bool *stopped);
/* End of generation (length, eos): releases what was held back. */
int servd_stop_matcher_flush(servd_stop_matcher *m, const char **text, size_t *text_len);

#endif
