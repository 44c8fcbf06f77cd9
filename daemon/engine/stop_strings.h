/* Stop strings over a stream of text deltas (internal to the engine).
 *
 * Text that could still be the start of a stop string is held back; when a stop string appears,
 * the text before it is released and the rest dropped (OpenAI semantics: the stop string itself is
 * not returned). No allocation per token once the buffers have grown.
 */
#ifndef SERVD_ENGINE_STOP_STRINGS_H
#define SERVD_ENGINE_STOP_STRINGS_H

#include <stdbool.h>
#include <stddef.h>

typedef struct servd_stopper {
  char **stops; /* owned copies */
  size_t *lens;
  int n;
  char *held; /* text not yet released */
  size_t n_held, cap_held;
  char *out; /* released text of the last call */
  size_t cap_out;
} servd_stopper;

/* Copies the n stop strings (empty ones are ignored). */
int servd_stopper_init(servd_stopper *s, const char *const *stops, int n);
void servd_stopper_free(servd_stopper *s); /* accepts a zeroed struct */
/* Feeds a delta; *text and *len: the text safe to release now (borrowed until the next call); *stopped:
 * a stop string was found (nothing more should be fed). */
int servd_stopper_push(servd_stopper *s, const char *delta, size_t len, const char **text, size_t *text_len,
                       bool *stopped);
/* End of stream: releases what was held. */
int servd_stopper_flush(servd_stopper *s, const char **text, size_t *text_len);

#endif
