/* One compute thread pool for the whole process.
 *
 * Sized once (servd_threadpool_init) to N compute slots; every op of every interpreter runs here, so
 * however many callers issue ops at once, no more than N threads compute. A small job runs inline on
 * its caller as soon as a slot is free, beside other callers' small jobs; parallel jobs take turns in
 * FIFO order and each gets its caller plus the workers of the slots then free. A caller blocks
 * until its job is done.
 */
#ifndef SERVD_THREADPOOL_H
#define SERVD_THREADPOOL_H

#include <stdint.h>
#include "servd/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Task body: process items [begin, end). `thread` is in [0, servd_threadpool_size()): the compute slot
 * running it, never the same for two bodies on different threads at once. */
typedef void (*servd_task_fn)(void *ctx, int64_t begin, int64_t end, int thread);

/* Sets the number of compute threads (0: number of online CPUs). Call once before the first op;
 * a later call with another size returns SERVD_EBUSY. Without it, the first op sizes the pool to the
 * online CPUs (or SERVD_THREADS from the environment). */
SERVD_API int servd_threadpool_init(int n_threads);
SERVD_API int servd_threadpool_size(void);
/* Runs fn over [0, n) split into chunks of at least `grain` items on the pool; returns when all are
 * done. Small jobs (n <= grain, or any job when N is 1) run inline on the caller's thread in one
 * slot, without waiting for other callers' jobs unless every slot is busy. A call from inside a task
 * runs inline in the slot of that task. */
SERVD_API void servd_parallel_for(int64_t n, int64_t grain, servd_task_fn fn, void *ctx);
/* A hint that the calling thread issues no parallel job for a while (e.g. after a forward step): idle
 * workers stop spinning and sleep until the next job, instead of spinning for it. Never needed for
 * correctness; cheap (one atomic increment), safe from any thread at any time, also before init. */
SERVD_API void servd_threadpool_quiesce(void);
/* Waits for running jobs and stops the workers; idempotent. A later op or init starts a new pool.
 * Not from inside a task. */
SERVD_API void servd_threadpool_shutdown(void);

#ifdef __cplusplus
}
#endif
#endif
