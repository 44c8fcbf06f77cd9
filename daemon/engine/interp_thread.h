/* One engine-owned thread per model that starts its interpreters, finalizes them, and (language
 * models) renders chat templates: the interpreter calls that are not forward steps or predicts
 * (internal to the engine).
 *
 * Why: CPython 3.11's `threading` module takes the OS thread that first imports it for its main
 * thread, and Py_FinalizeEx (threading._shutdown) waits for that thread's state to be deleted unless
 * it runs on that very thread. jinja2 imports `threading`, so a chat template rendered on an HTTP
 * worker thread made the later unload, on another thread, wait forever. Here the thread that starts,
 * renders and finalizes is one and the same, and it lives until the interpreters are gone. Package code
 * that imports `threading` at import time (logging does) is covered the same way. Not covered: code
 * that first imports it lazily inside forward or predict (other threads); that needs the interpreter
 * to release a foreign thread's `threading` main-thread lock before finalizing.
 */
#ifndef SERVD_ENGINE_INTERP_THREAD_H
#define SERVD_ENGINE_INTERP_THREAD_H

#include <stdbool.h>
#include <stdint.h>

typedef struct servd_interp_thread servd_interp_thread;

int servd_interp_thread_start(servd_interp_thread **out); /* *out owned by the caller */
/* Runs fn(arg) on the thread and returns its result; calls from several threads run one at a time. */
int servd_interp_thread_run(servd_interp_thread *t, int (*fn)(void *arg), void *arg);
/* servd_interp_thread_run in two halves, for a caller with work of its own meanwhile: post starts
 * fn(arg) and returns at once; wait returns its result. Every post is followed by one wait before the
 * thread takes any other job (a run from another caller waits until then). */
void servd_interp_thread_post(servd_interp_thread *t, int (*fn)(void *arg), void *arg);
int servd_interp_thread_wait(servd_interp_thread *t);
/* Accepts NULL. The thread releases its device contexts and is kept for the next start (a few are
 * kept, the others joined): a thread that ran interpreter code leaves memory behind when it ends
 * (see servd_interp_thread_stop). */
void servd_interp_thread_stop(servd_interp_thread *t);
/* servd_interp_thread_run that waits at most timeout_ms (0: no limit). When fn has not returned by
 * then, the thread is abandoned: *abandoned is set, SERVD_ETIMEDOUT returned, and t and arg belong to
 * the thread from then on (the caller never touches them again, not even to stop t). Should fn ever
 * return, the thread calls orphan(arg) (NULL: nothing), frees t and ends. */
int servd_interp_thread_run_for(servd_interp_thread *t, int (*fn)(void *arg), void *arg, int64_t timeout_ms,
                                void (*orphan)(void *arg), bool *abandoned);

#endif
