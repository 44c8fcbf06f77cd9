/* One compute thread pool for the whole process.
 *
 * Sized once (servd_threadpool_init); every op of every interpreter runs its parallel loops here, so
 * however many callers issue ops at once, no more than the configured number of threads compute.
 * Calls from many threads are serialized per job in FIFO order; a caller blocks until its job is done.
 */
#ifndef SERVD_THREADPOOL_H
#define SERVD_THREADPOOL_H

#include <stdint.h>
#include "servd/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Task body: process items [begin, end). `thread` is in [0, servd_threadpool_size()). */
typedef void (*servd_task_fn)(void *ctx, int64_t begin, int64_t end, int thread);

/* Sets the number of compute threads (0: number of online CPUs). Call once before the first op;
 * a later call with another size returns SERVD_EBUSY. Without it, the first op sizes the pool to the
 * online CPUs (or SERVD_THREADS from the environment). */
SERVD_API int servd_threadpool_init(int n_threads);
SERVD_API int servd_threadpool_size(void);
/* Runs fn over [0, n) split into chunks of at least `grain` items on the pool; returns when all are
 * done. Small jobs (n <= grain) run inline on the caller's thread only if no other job is running. */
SERVD_API void servd_parallel_for(int64_t n, int64_t grain, servd_task_fn fn, void *ctx);
SERVD_API void servd_threadpool_shutdown(void);

#ifdef __cplusplus
}
#endif
#endif
