/* The process-wide compute pool.
 *
 * N compute slots: N-1 worker threads plus the caller whose job is running. Jobs run one at a time,
 * in FIFO order of arrival (a ticket lock), so at most N threads ever compute, however many callers
 * there are. The running caller publishes its job and claims chunks alongside the workers. When no
 * chunk is left it closes the job and waits only for workers that joined it: a worker that was not
 * scheduled in time (an oversubscribed machine) never holds the caller up. Workers spin briefly
 * after a job before sleeping, because a decode step issues hundreds of small ops back to back and
 * a futex wake per op would dominate them.
 */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "servd/threadpool.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#else
#define cpu_relax() ((void)0)
#endif

#define WORKER_SPIN_NS 1000000L /* a worker stays hot this long after its last job */
#define CALLER_SPIN_NS 100000L  /* a caller spins this long for its turn or for workers */

typedef struct job {
  servd_task_fn fn;
  void *ctx;
  int64_t n, chunk;
  atomic_llong next;    /* next unclaimed item */
  atomic_ulong open;    /* the generation of the job while workers may join it, else 0 */
  atomic_int active;    /* workers inside the job */
} job;

static struct {
  pthread_mutex_t mu;
  pthread_cond_t cv_work; /* workers: a new job or stop */
  pthread_cond_t cv_turn; /* callers: the turn moved */
  pthread_cond_t cv_done; /* the running caller: the last worker checked out */
  int size;               /* compute slots, 0 until initialized */
  int n_workers;
  pthread_t *threads;
  atomic_ulong gen; /* bumped once per published job; 64 bits never wrap, so 0 means "closed" */
  atomic_int stop;
  job job;
  atomic_ulong ticket_next, ticket_serving;
  int sleepers, waiters, caller_sleeping; /* under mu */
} pool = {
    .mu = PTHREAD_MUTEX_INITIALIZER,
    .cv_work = PTHREAD_COND_INITIALIZER,
    .cv_turn = PTHREAD_COND_INITIALIZER,
    .cv_done = PTHREAD_COND_INITIALIZER,
};

static pthread_mutex_t init_mu = PTHREAD_MUTEX_INITIALIZER;
static unsigned long start_gen; /* pool.gen when the workers were started */
static _Thread_local int tls_thread = -1; /* slot index while computing a job, else -1 */

static long now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1000000000L + ts.tv_nsec;
}

static void run_chunks(job *j, int thread) {
  for (;;) {
    int64_t b = atomic_fetch_add_explicit(&j->next, j->chunk, memory_order_relaxed);
    if (b >= j->n) break;
    int64_t e = b + j->chunk < j->n ? b + j->chunk : j->n;
    j->fn(j->ctx, b, e, thread);
  }
}

static void *worker_main(void *arg) {
  int thread = (int)(intptr_t)arg;
  unsigned long seen = start_gen; /* not pool.gen: a job may be published before this thread runs */
  tls_thread = thread;
  for (;;) {
    unsigned long g = atomic_load_explicit(&pool.gen, memory_order_acquire);
    if (g == seen && !atomic_load_explicit(&pool.stop, memory_order_relaxed)) {
      long deadline = now_ns() + WORKER_SPIN_NS;
      for (int i = 1;; i++) {
        cpu_relax();
        g = atomic_load_explicit(&pool.gen, memory_order_acquire);
        if (g != seen || atomic_load_explicit(&pool.stop, memory_order_relaxed)) break;
        /* No sched_yield here: on a busy machine it hands the core away for a whole time slice,
         * and the next job (microseconds away in a decode step) then runs without this thread. */
        if ((i & 255) == 0 && now_ns() > deadline) break;
      }
    }
    if (g == seen) {
      pthread_mutex_lock(&pool.mu);
      while ((g = atomic_load(&pool.gen)) == seen && !atomic_load(&pool.stop)) {
        pool.sleepers++;
        pthread_cond_wait(&pool.cv_work, &pool.mu);
        pool.sleepers--;
      }
      pthread_mutex_unlock(&pool.mu);
    }
    if (atomic_load(&pool.stop)) break;
    seen = g;
    /* Join, then check the job is still open (both seq_cst, pairing with the caller's close then
     * read of active): either the caller sees us and waits, or we see it closed and touch nothing. */
    atomic_fetch_add(&pool.job.active, 1);
    if (atomic_load(&pool.job.open) == g) run_chunks(&pool.job, thread);
    if (atomic_fetch_sub(&pool.job.active, 1) == 1) {
      pthread_mutex_lock(&pool.mu);
      if (pool.caller_sleeping) pthread_cond_signal(&pool.cv_done);
      pthread_mutex_unlock(&pool.mu);
    }
  }
  return NULL;
}

static int default_size(void) {
  const char *env = getenv("SERVD_THREADS");
  if (env) {
    char *end;
    long v = strtol(env, &end, 10);
    if (*end == 0 && v > 0 && v <= 1024) return (int)v;
  }
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? (int)n : 1;
}

/* Starts the workers; init_mu held. */
static int pool_start(int size) {
  pool.threads = calloc((size_t)size, sizeof *pool.threads);
  if (!pool.threads) return servd_fail(SERVD_ENOMEM, "threadpool_init: out of memory");
  atomic_store(&pool.stop, 0);
  start_gen = atomic_load(&pool.gen);
  pool.n_workers = 0;
  for (int i = 1; i < size; i++) {
    if (pthread_create(&pool.threads[i - 1], NULL, worker_main, (void *)(intptr_t)i) != 0) break;
    pool.n_workers++;
  }
  /* With fewer workers than asked the pool still works, just with fewer slots. */
  __atomic_store_n(&pool.size, pool.n_workers + 1, __ATOMIC_RELEASE);
  return 0;
}

int servd_threadpool_init(int n_threads) {
  if (n_threads < 0 || n_threads > 1024)
    return servd_fail(SERVD_EINVAL, "threadpool_init: %d threads outside [0, 1024]", n_threads);
  long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
  int want = n_threads ? n_threads : (ncpu > 0 ? (int)ncpu : 1), rc = 0;
  pthread_mutex_lock(&init_mu);
  if (pool.size == 0) {
    rc = pool_start(want);
  } else if (pool.size != want) {
    rc = servd_fail(SERVD_EBUSY, "threadpool_init: the pool already runs %d threads (asked %d)", pool.size, want);
  }
  pthread_mutex_unlock(&init_mu);
  return rc;
}

static int pool_ensure(void) {
  if (__atomic_load_n(&pool.size, __ATOMIC_ACQUIRE) > 0) return 0;
  pthread_mutex_lock(&init_mu);
  int rc = pool.size == 0 ? pool_start(default_size()) : 0;
  pthread_mutex_unlock(&init_mu);
  return rc;
}

int servd_threadpool_size(void) {
  if (pool_ensure() != 0) return 1;
  return pool.size;
}

static void take_turn(void) {
  unsigned long t = atomic_fetch_add(&pool.ticket_next, 1);
  if (atomic_load_explicit(&pool.ticket_serving, memory_order_acquire) == t) return;
  long deadline = now_ns() + CALLER_SPIN_NS;
  for (int i = 1; atomic_load_explicit(&pool.ticket_serving, memory_order_acquire) != t; i++) {
    cpu_relax();
    if ((i & 255) == 0) sched_yield();
    if ((i & 255) == 0 && now_ns() > deadline) {
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

void servd_parallel_for(int64_t n, int64_t grain, servd_task_fn fn, void *ctx) {
  if (n <= 0) return;
  if (grain < 1) grain = 1;
  if (tls_thread >= 0) { /* called from inside a task: this thread already holds a slot */
    fn(ctx, 0, n, tls_thread);
    return;
  }
  if (pool_ensure() != 0) { /* no pool: compute on the caller alone, still one at a time */
    take_turn();
    tls_thread = 0;
    fn(ctx, 0, n, 0);
    tls_thread = -1;
    give_turn();
    return;
  }
  take_turn();
  tls_thread = 0;
  if (n <= grain || pool.n_workers == 0) {
    fn(ctx, 0, n, 0);
  } else {
    job *j = &pool.job;
    int64_t parts = (int64_t)pool.size * 4;
    int64_t chunk = (n + parts - 1) / parts;
    j->fn = fn;
    j->ctx = ctx;
    j->n = n;
    j->chunk = chunk > grain ? chunk : grain;
    atomic_store_explicit(&j->next, 0, memory_order_relaxed);
    const unsigned long g = atomic_load_explicit(&pool.gen, memory_order_relaxed) + 1;
    atomic_store(&j->open, g);
    atomic_store(&pool.gen, g); /* publishes the job fields above */
    pthread_mutex_lock(&pool.mu);
    if (pool.sleepers) pthread_cond_broadcast(&pool.cv_work);
    pthread_mutex_unlock(&pool.mu);
    run_chunks(j, 0);
    /* Every chunk is claimed: close the job, then wait for the workers still inside it. */
    atomic_store(&j->open, 0);
    long deadline = now_ns() + CALLER_SPIN_NS;
    for (int i = 1; atomic_load(&j->active) != 0; i++) {
      cpu_relax();
      if ((i & 255) == 0) sched_yield();
      if ((i & 255) == 0 && now_ns() > deadline) {
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
  tls_thread = -1;
  give_turn();
}

void servd_threadpool_shutdown(void) {
  pthread_mutex_lock(&init_mu);
  if (pool.size > 0) {
    take_turn(); /* no job runs while the workers go */
    pthread_mutex_lock(&pool.mu);
    atomic_store(&pool.stop, 1);
    pthread_cond_broadcast(&pool.cv_work);
    pthread_mutex_unlock(&pool.mu);
    for (int i = 0; i < pool.n_workers; i++) pthread_join(pool.threads[i], NULL);
    free(pool.threads);
    pool.threads = NULL;
    pool.n_workers = 0;
    __atomic_store_n(&pool.size, 0, __ATOMIC_RELEASE);
    give_turn();
  }
  pthread_mutex_unlock(&init_mu);
}
