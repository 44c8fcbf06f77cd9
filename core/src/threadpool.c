/* The process-wide compute pool.
 *
 * N compute slots (a bitmask of free slot indices) bound the threads that compute at once, however
 * many callers there are. A thread computes only while it holds a slot, and the slot's index is the
 * `thread` its task bodies see, so no two concurrent bodies share one.
 *
 * - A small job (n <= grain, or any job of a pool without workers) claims one slot and runs inline
 *   on its caller. It takes no turn: interpreters issuing many small ops at once run side by side
 *   as long as slots are free, with no hand-off between them.
 * - A parallel job takes the pool's single FIFO turn (a ticket lock: one shared job description),
 *   claims a slot for its caller, publishes the job and claims chunks alongside the workers. A
 *   worker joins only if it can claim a free slot, and gives it back when no chunk is left, so the
 *   job gets as many helpers as there are slots not busy with small jobs. When no chunk is left the
 *   caller closes the job and waits only for workers that joined it: a worker that was not
 *   scheduled in time (an oversubscribed machine) never holds the caller up.
 * - A caller that finds no free slot spins (yielding the core) for a while, then sleeps until a
 *   slot is released.
 * - Workers spin after a job before sleeping, holding no slot, because a decode step issues
 *   hundreds of small ops back to back and a futex wake per op would dominate them. A worker spins
 *   only while that pays: it keeps running means of the time it computes per job and the time it
 *   spins before one. While it computes at least as long as it spins (SPIN_PER_WORK), it spins up
 *   to WORKER_SPIN_NS and then sleeps until the next job wakes it. Otherwise (jobs too small for a
 *   second thread: a tiny model's ops gave the worker 0.5 us of work per 4 us of spinning) it
 *   spins only the credit its own computing earned, then sleeps "deep": callers do not wake it,
 *   since a futex wake per job costs them more than its help is worth. It looks again every
 *   DEEP_SLEEP_NS and, if jobs came meanwhile, joins them with a probe's credit, which measures
 *   anew. Idle with no jobs at all, it sleeps until the next job.
 * - servd_threadpool_quiesce() ends the spinning at once, for callers that know no job follows
 *   soon (the end of a forward step); the next job wakes the workers as after any sleep.
 */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "servd/clock.h"
#include "servd/threadpool.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#else
#define cpu_relax() ((void)0)
#endif

#define MAX_THREADS 1024
#define SLOT_WORDS (MAX_THREADS / 64)
#define WORKER_SPIN_NS \
  200000L                      /* a worker stays hot at most this long after its last job: covers
                                   * the gaps inside and between decode steps, without burning a core
                                   * while the server does other work (1 ms spun ~30% of a busy server) */
#define SPIN_PER_WORK 1        /* ns a worker may spin per ns it computes */
#define DEEP_SLEEP_NS 2000000L /* a worker not worth its spinning looks for jobs this often */
#define PROBE_SPIN_NS 20000L   /* credit of a worker that found jobs after a deep sleep */
#define CALLER_SPIN_NS 100000L /* a caller spins this long for the turn or for workers */
#define SLOT_SPIN_NS 500000L   /* a caller spins (yielding) this long for a free slot */

typedef struct job {
  servd_task_fn fn;
  void *ctx;
  int64_t n, chunk;
  atomic_llong next; /* next unclaimed item */
  atomic_ulong open; /* the generation of the job while workers may join it, else 0 */
  atomic_int active; /* workers inside the job */
} job;

static struct {
  pthread_mutex_t mu;
  pthread_cond_t cv_work; /* workers: a new job or stop */
  pthread_cond_t cv_turn; /* callers: the turn moved */
  pthread_cond_t cv_done; /* the running caller: the last worker checked out */
  pthread_cond_t cv_slot; /* callers: a slot was released, or the pool stopped */
  atomic_int size;        /* compute slots, 0 while stopped */
  atomic_int n_workers;
  atomic_ulong free_slots[SLOT_WORDS]; /* bit set: that slot is free */
  atomic_int slot_waiters;             /* callers asleep on cv_slot (changed under mu) */
  atomic_ulong gen;                    /* bumped once per published job; 64 bits never wrap, so 0 means "closed" */
  atomic_ulong park;                   /* bumped by servd_threadpool_quiesce: spinning workers go to sleep */
  atomic_int sleepers;                 /* workers asleep until the next job (raised under mu; a waker zeroes it) */
  atomic_long deep_sleeps;             /* for tests */
  atomic_int stop;
  job job;
  atomic_ulong ticket_next, ticket_serving;
  int waiters, caller_sleeping; /* under mu */
} pool = {
    .mu = PTHREAD_MUTEX_INITIALIZER,
    .cv_work = PTHREAD_COND_INITIALIZER,
    .cv_turn = PTHREAD_COND_INITIALIZER,
    .cv_done = PTHREAD_COND_INITIALIZER,
    .cv_slot = PTHREAD_COND_INITIALIZER,
};

/* Static, so that starting the pool cannot fail for memory (8 KiB). */
static pthread_t workers[MAX_THREADS - 1];
static pthread_mutex_t init_mu = PTHREAD_MUTEX_INITIALIZER;
static unsigned long start_gen;           /* pool.gen when the workers were started */
static _Thread_local int tls_thread = -1; /* the slot held while computing, else -1 */

/* ---- slots ------------------------------------------------------------------------------------ */

/* Claims a free slot without waiting; -1 if none is free (or the pool is stopped). */
static int slot_try(void) {
  const int words = (atomic_load_explicit(&pool.size, memory_order_acquire) + 63) / 64;
  for (int w = 0; w < words; w++) {
    unsigned long m = atomic_load_explicit(&pool.free_slots[w], memory_order_relaxed);
    while (m) {
      const int b = __builtin_ctzl(m);
      if (atomic_compare_exchange_weak_explicit(&pool.free_slots[w], &m, m & ~(1UL << b), memory_order_acquire,
                                                memory_order_relaxed))
        return w * 64 + b;
    }
  }
  return -1;
}

static void slot_release(int s) {
  /* seq_cst, pairing with the sleeper's count then retry: either it sees the slot or we see it. */
  atomic_fetch_or(&pool.free_slots[s / 64], 1UL << (s % 64));
  if (atomic_load(&pool.slot_waiters)) {
    pthread_mutex_lock(&pool.mu);
    pthread_cond_signal(&pool.cv_slot);
    pthread_mutex_unlock(&pool.mu);
  }
}

/* Claims a slot, spinning briefly and then sleeping; -1 if the pool stopped meanwhile. */
static int slot_acquire(void) {
  int s = slot_try();
  if (s >= 0) return s;
  /* Every slot computes. A slot is usually back within microseconds, so spin, but yield every few
   * microseconds: on a busy machine a holder may be waiting for this very core. Sleeping comes last,
   * because a futex wake-up on such a machine takes milliseconds. */
  const long deadline = servd_now_ns() + SLOT_SPIN_NS;
  for (int i = 1;; i++) {
    cpu_relax();
    if ((s = slot_try()) >= 0) return s;
    if (!atomic_load_explicit(&pool.size, memory_order_relaxed)) return -1;
    if ((i & 63) == 0) {
      if (servd_now_ns() > deadline) break;
      sched_yield();
    }
  }
  pthread_mutex_lock(&pool.mu);
  atomic_fetch_add(&pool.slot_waiters, 1);
  atomic_thread_fence(memory_order_seq_cst); /* the retry below reads the slots after the count */
  while ((s = slot_try()) < 0 && atomic_load(&pool.size) > 0) pthread_cond_wait(&pool.cv_slot, &pool.mu);
  atomic_fetch_sub(&pool.slot_waiters, 1);
  pthread_mutex_unlock(&pool.mu);
  return s;
}

/* ---- workers ---------------------------------------------------------------------------------- */

static void run_chunks(job *j, int thread) {
  for (;;) {
    int64_t b = atomic_fetch_add_explicit(&j->next, j->chunk, memory_order_relaxed);
    if (b >= j->n) break;
    int64_t e = b + j->chunk < j->n ? b + j->chunk : j->n;
    j->fn(j->ctx, b, e, thread);
  }
}

/* Sleeps until a job newer than `seen` is published or the pool stops; returns pool.gen. Deep: not
 * woken by callers, back after DEEP_SLEEP_NS; if no job came meanwhile, sleeps on as a light sleeper
 * (woken by the next job), so an idle pool does not wake every DEEP_SLEEP_NS. *probe is set when a
 * deep sleep ended with jobs published. A light sleeper that leaves without sleeping stays counted
 * until the next job zeroes the count (one needless broadcast), since only wakers may lower it. */
static unsigned long worker_sleep(unsigned long seen, int deep, int *probe) {
  unsigned long g;
  *probe = 0;
  pthread_mutex_lock(&pool.mu);
  if (deep) {
    atomic_fetch_add_explicit(&pool.deep_sleeps, 1, memory_order_relaxed);
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_nsec += DEEP_SLEEP_NS;
    ts.tv_sec += ts.tv_nsec / 1000000000L;
    ts.tv_nsec %= 1000000000L;
    while ((g = atomic_load(&pool.gen)) == seen && !atomic_load(&pool.stop))
      if (pthread_cond_clockwait(&pool.cv_work, &pool.mu, CLOCK_MONOTONIC, &ts) == ETIMEDOUT) break;
    if (g != seen || atomic_load(&pool.stop)) {
      *probe = 1;
      pthread_mutex_unlock(&pool.mu);
      return g;
    }
  }
  /* Count ourselves, then read gen (both seq_cst), pairing with the caller's store of gen then read
   * of the count: either the caller sees us and wakes us (under mu, so not before we wait) or we see
   * its job. */
  while (atomic_fetch_add(&pool.sleepers, 1), (g = atomic_load(&pool.gen)) == seen && !atomic_load(&pool.stop))
    pthread_cond_wait(&pool.cv_work, &pool.mu);
  pthread_mutex_unlock(&pool.mu);
  return g;
}

static void *worker_main(void *arg) {
  (void)arg;
  pthread_setname_np(pthread_self(), "servd-pool"); /* names in crash reports, top -H, gdb */
  unsigned long seen = start_gen;                   /* not pool.gen: a job may be published before this thread runs */
  unsigned long park = atomic_load(&pool.park);
  /* Means over the last jobs (weight 1/64 each) of the ns computed per job and the ns spun before
   * it, a spin that ran out included (one ended by servd_threadpool_quiesce is not: the caller
   * said no job was coming). A worker is worth its spinning while it computes at least as long as
   * it spins. The window is long enough that the end of one decode step (a spin run out) does not
   * tip a worker that computes most of the step. */
  long mean_work = 0, mean_spin = 0;
  long credit = PROBE_SPIN_NS;      /* the spin allowed to a worker not worth it (earned by computing) */
  long idle_since = servd_now_ns(); /* when the last job ended */
  for (;;) {
    unsigned long g = atomic_load_explicit(&pool.gen, memory_order_acquire);
    const int worth = mean_work * SPIN_PER_WORK >= mean_spin;
    long spun = 0;
    if (g == seen && !atomic_load_explicit(&pool.stop, memory_order_relaxed)) {
      const long limit = worth ? WORKER_SPIN_NS : credit, deadline = idle_since + limit;
      for (int i = 1; limit > 0; i++) {
        cpu_relax();
        g = atomic_load_explicit(&pool.gen, memory_order_acquire);
        if (g != seen || atomic_load_explicit(&pool.stop, memory_order_relaxed)) break;
        if (atomic_load_explicit(&pool.park, memory_order_relaxed) != park) break;
        /* No sched_yield here: on a busy machine it hands the core away for a whole time slice,
         * and the next job (microseconds away in a decode step) then runs without this thread. */
        if ((i & 31) == 0 && servd_now_ns() > deadline) break;
      }
      /* Beyond the limit it was preemption, not spinning: not charged. */
      spun = servd_now_ns() - idle_since;
      if (spun > limit) spun = limit;
      credit = spun < credit ? credit - spun : 0;
    }
    if (g == seen) {
      if (atomic_load_explicit(&pool.park, memory_order_relaxed) != park) spun = -1;
      int probe;
      g = worker_sleep(seen, !worth, &probe);
      if (probe) credit = PROBE_SPIN_NS;
    }
    if (atomic_load(&pool.stop)) break;
    seen = g;
    park = atomic_load_explicit(&pool.park, memory_order_relaxed); /* earlier hints are not for us */
    /* Join, then check the job is still open (both seq_cst, pairing with the caller's close then
     * read of active): either the caller sees us and waits, or we see it closed and touch nothing.
     * Compute only with a slot; small jobs of other callers may hold them all. */
    atomic_fetch_add(&pool.job.active, 1);
    long worked = 0;
    if (atomic_load(&pool.job.open) == g && atomic_load_explicit(&pool.job.next, memory_order_relaxed) < pool.job.n) {
      const int s = slot_try();
      if (s >= 0) {
        const long t0 = servd_now_ns();
        tls_thread = s;
        run_chunks(&pool.job, s);
        tls_thread = -1;
        worked = servd_now_ns() - t0;
        slot_release(s);
      }
    }
    if (atomic_fetch_sub(&pool.job.active, 1) == 1) {
      pthread_mutex_lock(&pool.mu);
      if (pool.caller_sleeping) pthread_cond_signal(&pool.cv_done);
      pthread_mutex_unlock(&pool.mu);
    }
    idle_since = servd_now_ns();
    mean_work += (worked - mean_work) / 64;
    if (spun >= 0) mean_spin += (spun - mean_spin) / 64;
    credit += worked * SPIN_PER_WORK;
    if (credit > WORKER_SPIN_NS) credit = WORKER_SPIN_NS;
  }
  return NULL;
}

/* ---- sizing ----------------------------------------------------------------------------------- */

static int default_size(void) {
  const char *env = getenv("SERVD_THREADS");
  if (env) {
    char *end;
    long v = strtol(env, &end, 10);
    if (*end == 0 && v > 0 && v <= MAX_THREADS) return (int)v;
  }
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? (n < MAX_THREADS ? (int)n : MAX_THREADS) : 1;
}

/* Starts the workers and frees the slots; init_mu held, the pool stopped (every slot bit clear). */
static void pool_start(int size) {
  atomic_store(&pool.stop, 0);
  start_gen = atomic_load(&pool.gen);
  int n_workers = 0;
  for (int i = 1; i < size; i++) {
    if (pthread_create(&workers[i - 1], NULL, worker_main, NULL) != 0) break;
    n_workers++;
  }
  /* With fewer workers than asked the pool still works, just with fewer slots. */
  size = n_workers + 1;
  for (int s = 0; s < size; s++) atomic_fetch_or(&pool.free_slots[s / 64], 1UL << (s % 64));
  atomic_store(&pool.n_workers, n_workers);
  atomic_store_explicit(&pool.size, size, memory_order_release);
}

int servd_threadpool_init(int n_threads) {
  if (n_threads < 0 || n_threads > MAX_THREADS)
    return servd_fail(SERVD_EINVAL, "threadpool_init: %d threads outside [0, %d]", n_threads, MAX_THREADS);
  long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
  int want = n_threads ? n_threads : (ncpu > 0 ? (ncpu < MAX_THREADS ? (int)ncpu : MAX_THREADS) : 1), rc = 0;
  pthread_mutex_lock(&init_mu);
  if (atomic_load(&pool.size) == 0) {
    pool_start(want);
  } else if (atomic_load(&pool.size) != want) {
    rc = servd_fail(SERVD_EBUSY, "threadpool_init: the pool already runs %d threads (asked %d)",
                    atomic_load(&pool.size), want);
  }
  pthread_mutex_unlock(&init_mu);
  return rc;
}

static void pool_ensure(void) {
  if (atomic_load_explicit(&pool.size, memory_order_acquire) > 0) return;
  pthread_mutex_lock(&init_mu);
  if (atomic_load(&pool.size) == 0) pool_start(default_size());
  pthread_mutex_unlock(&init_mu);
}

int servd_threadpool_size(void) {
  pool_ensure();
  return atomic_load(&pool.size);
}

/* ---- jobs ------------------------------------------------------------------------------------- */

static void take_turn(void) {
  unsigned long t = atomic_fetch_add(&pool.ticket_next, 1);
  if (atomic_load_explicit(&pool.ticket_serving, memory_order_acquire) == t) return;
  long deadline = servd_now_ns() + CALLER_SPIN_NS;
  for (int i = 1; atomic_load_explicit(&pool.ticket_serving, memory_order_acquire) != t; i++) {
    cpu_relax();
    if ((i & 255) == 0) sched_yield();
    if ((i & 255) == 0 && servd_now_ns() > deadline) {
      pthread_mutex_lock(&pool.mu);
      while (atomic_load(&pool.ticket_serving) != t) {
        pool.waiters++;
        pthread_cond_wait(&pool.cv_turn, &pool.mu);
        pool.waiters--;
      }
      pthread_mutex_unlock(&pool.mu);
      return;
    }
  }
}

static void give_turn(void) {
  atomic_fetch_add_explicit(&pool.ticket_serving, 1, memory_order_release);
  pthread_mutex_lock(&pool.mu);
  if (pool.waiters) pthread_cond_broadcast(&pool.cv_turn);
  pthread_mutex_unlock(&pool.mu);
}

/* Runs a job with the turn and slot `s` held: publishes it, computes, waits for joined workers. */
static void run_parallel(int64_t n, int64_t grain, servd_task_fn fn, void *ctx, int s) {
  job *j = &pool.job;
  int64_t parts = (int64_t)atomic_load_explicit(&pool.size, memory_order_relaxed) * 4;
  int64_t chunk = (n + parts - 1) / parts;
  j->fn = fn;
  j->ctx = ctx;
  j->n = n;
  j->chunk = chunk > grain ? chunk : grain;
  atomic_store_explicit(&j->next, 0, memory_order_relaxed);
  const unsigned long g = atomic_load_explicit(&pool.gen, memory_order_relaxed) + 1;
  atomic_store(&j->open, g);
  atomic_store(&pool.gen, g); /* publishes the job fields above */
  /* Wake light sleepers (see worker_sleep); a worker that is spinning, or deep asleep, is not. */
  if (atomic_load(&pool.sleepers)) {
    pthread_mutex_lock(&pool.mu);
    atomic_store(&pool.sleepers, 0);
    pthread_cond_broadcast(&pool.cv_work);
    pthread_mutex_unlock(&pool.mu);
  }
  run_chunks(j, s);
  /* Every chunk is claimed: close the job, then wait for the workers still inside it. */
  atomic_store(&j->open, 0);
  long deadline = servd_now_ns() + CALLER_SPIN_NS;
  for (int i = 1; atomic_load(&j->active) != 0; i++) {
    cpu_relax();
    if ((i & 255) == 0) sched_yield();
    if ((i & 255) == 0 && servd_now_ns() > deadline) {
      pthread_mutex_lock(&pool.mu);
      while (atomic_load(&j->active) != 0) {
        pool.caller_sleeping = 1;
        pthread_cond_wait(&pool.cv_done, &pool.mu);
      }
      pool.caller_sleeping = 0;
      pthread_mutex_unlock(&pool.mu);
      break;
    }
  }
}

void servd_parallel_for(int64_t n, int64_t grain, servd_task_fn fn, void *ctx) {
  if (n <= 0) return;
  if (grain < 1) grain = 1;
  if (tls_thread >= 0) { /* called from inside a task: this thread already holds a slot */
    fn(ctx, 0, n, tls_thread);
    return;
  }
  for (;;) { /* more than once only if the pool was shut down under us */
    pool_ensure();
    const int small = n <= grain || atomic_load_explicit(&pool.n_workers, memory_order_relaxed) == 0;
    if (!small) take_turn();
    const int s = slot_acquire();
    if (s < 0) {
      if (!small) give_turn();
      continue;
    }
    tls_thread = s;
    /* Holding a slot, the pool cannot stop: n_workers is current. */
    if (small || atomic_load(&pool.n_workers) == 0) fn(ctx, 0, n, s);
    else run_parallel(n, grain, fn, ctx, s);
    tls_thread = -1;
    slot_release(s);
    if (!small) give_turn();
    return;
  }
}

void servd_threadpool_quiesce(void) {
  /* Relaxed: a hint; a worker that misses it spins out its credit as without it. */
  atomic_fetch_add_explicit(&pool.park, 1, memory_order_relaxed);
}

void servd_threadpool_shutdown(void) {
  pthread_mutex_lock(&init_mu);
  const int size = atomic_load(&pool.size);
  if (size > 0) {
    take_turn(); /* no parallel job runs while the workers go */
    /* Wait for running small jobs: own every slot, so nothing computes. */
    for (int held = 0; held < size; held++) (void)slot_acquire();
    pthread_mutex_lock(&pool.mu);
    atomic_store(&pool.size, 0);
    atomic_store(&pool.stop, 1);
    pthread_cond_broadcast(&pool.cv_work);
    pthread_cond_broadcast(&pool.cv_slot); /* sleepers for a slot retry, restarting the pool */
    pthread_mutex_unlock(&pool.mu);
    const int n_workers = atomic_load(&pool.n_workers);
    for (int i = 0; i < n_workers; i++) pthread_join(workers[i], NULL);
    atomic_store(&pool.n_workers, 0);
    give_turn();
  }
  pthread_mutex_unlock(&init_mu);
}

/* For tests only (no header): callers waiting for the turn behind the running parallel job. */
int servd__threadpool_queued(void);
int servd__threadpool_queued(void) {
  const unsigned long next = atomic_load(&pool.ticket_next), serving = atomic_load(&pool.ticket_serving);
  return next > serving ? (int)(next - serving - 1) : 0;
}

/* For tests only (no header): how many times a worker went to sleep without callers waking it. */
long servd__threadpool_deep_sleeps(void);
long servd__threadpool_deep_sleeps(void) { return atomic_load(&pool.deep_sleeps); }
