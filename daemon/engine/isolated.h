/* Process isolation of a generic model: its interpreters run in a child process, so a crash of its
 * code (a segfault through ctypes, a C extension's abort) ends only that process.
 *
 * servd forks a child from a thread of this model's own (the monitor) and the child executes servd
 * again (`servd isolated-worker FD`): it starts clean, with none of the parent's threads, locks, libuv
 * loop or interpreter namespaces (so it has its own 15 interpreters). The child loads the package
 * as an in-process generic model (servd_model_load), then serves predict calls read from a
 * socketpair (isolated_wire.h: small tensors inline, large ones in a memfd mapped by both sides).
 *
 * When the child dies (EOF on the socket; waitpid says why) the calls in flight fail with
 * SERVD_EMODEL naming the signal or exit status, the model is not ready, calls meanwhile get
 * SERVD_ECANCELED (503), and the monitor starts a new child after a backoff (0.1 s doubling to
 * 30 s; back to 0.1 s once a child has served for 60 s). The child's load is bounded by the load
 * timeout as an in-process load is; a child that has not answered 5 s after it is killed.
 * Design and costs: docs/operations.md.
 */
#ifndef SERVD_ENGINE_ISOLATED_H
#define SERVD_ENGINE_ISOLATED_H

#include <stdbool.h>
#include <stddef.h>

#include "engine/types.h"

typedef struct servd_isolated servd_isolated;

/* Starts the child and waits until it has loaded the package (o->path; name: the served name, for
 * logs). On failure the child's load error is returned. *out owned by the caller. */
int servd_isolated_start(const servd_model_options *o, const char *name, servd_isolated **out);
/* Waits up to deadline_ms for calls in flight, then ends the child (EOF, then SIGKILL after 5 s) and
 * frees everything. Accepts NULL. */
void servd_isolated_stop(servd_isolated *iso, int deadline_ms);
/* Same contract as servd_model_predict. While the child is down: SERVD_ECANCELED. A call past its
 * deadline (plus 1 s for the child's own TimeoutError to arrive) returns SERVD_ETIMEDOUT. */
int servd_isolated_predict(servd_isolated *iso, const servd_named_tensor *inputs, int n_inputs,
                           servd_named_tensor **outputs, int *n_outputs, int64_t deadline_ms, servd_model_error *err);
/* The child is up and serving. */
bool servd_isolated_ready(const servd_isolated *iso);
/* Children started after the first (restarts, failed ones included). */
int servd_isolated_restarts(const servd_isolated *iso);
/* The child died and servd is restarting it (backoff, or the new child loading); not while stopping.
 * why (may be NULL): the cause and the restart's progress, e.g. "the model's process (pid 812) was
 * killed by signal 11 (SIGSEGV); restart 3 in 0.4 s". */
bool servd_isolated_down(const servd_isolated *iso, char *why, size_t cap);

/* The child's main: `servd isolated-worker FD` (argv[0] "isolated-worker"). Returns the exit status. */
int servd_isolated_worker_main(int argc, char **argv);

#endif
