/* A request's lifecycle on the scheduler thread (internal to the engine): events delivered to its
 * callback, its end (the final event, its blocks and matcher given back), its references. */
#ifndef SERVD_ENGINE_REQUEST_H
#define SERVD_ENGINE_REQUEST_H

#include <stdbool.h>

#include "engine/engine_impl.h"

/* Calls r's callback with ev unless the caller released r or r already ended. */
void request_deliver(servd_request *r, const servd_event *ev);
/* Ends r with a final event (error_code 0: done with reason, else an error of error_type, NULL for
 * the code's default). flush: text held back (a possible stop-string prefix, an incomplete UTF-8
 * sequence) goes out first; not after a stop string matched, a cancel or an error. Drops the
 * engine's reference: r may be freed on return. */
void request_finish_ex(servd_model *m, servd_request *r, const char *reason, int error_code, const char *msg,
                       const char *error_type, bool flush);
/* request_finish_ex flushing held text for "length" and "deadline". */
void request_finish(servd_model *m, servd_request *r, const char *reason, int error_code, const char *msg);
/* Drops one reference; the last frees r. */
void request_unref(servd_request *r);

#endif
