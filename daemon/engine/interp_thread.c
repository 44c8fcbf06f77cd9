/* The engine's interpreter-owning thread: see interp_thread.h. */
#include "engine/interp_thread.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "servd/device.h"
#include "servd/status.h"

struct servd_interp_thread {
  pthread_t thread;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  pthread_mutex_t callers; /* one job at a time */
  int (*fn)(void *);
  void *arg;
  int rc;
  char err[1024]; /* the job's servd_last_error, carried to the caller's thread */
  bool pending, done, quit;
  bool abandoned;            /* the caller gave up waiting: t and the job are the thread's */
  void (*orphan)(void *arg); /* called with the abandoned job's arg when it returns */
};

static void destroy(servd_interp_thread *t) {
  pthread_mutex_destroy(&t->mu);
  pthread_cond_destroy(&t->cv);
  pthread_mutex_destroy(&t->callers);
  free(t);
}

static void *thread_main(void *p) {
  servd_interp_thread *t = p;
  pthread_setname_np(pthread_self(), "servd-interp"); /* names in crash reports, top -H, gdb */
  pthread_mutex_lock(&t->mu);
  for (;;) {
    while (!t->pending && !t->quit) pthread_cond_wait(&t->cv, &t->mu);
    if (!t->pending) break;
    pthread_mutex_unlock(&t->mu);
    int rc = t->fn(t->arg);
    pthread_mutex_lock(&t->mu);
    t->rc = rc;
    snprintf(t->err, sizeof t->err, "%s", rc ? servd_last_error() : "");
    t->pending = false;
    t->done = true;
    if (t->abandoned) {
      /* Nobody waits: the job returned after its caller gave up on it (see run_for). */
      pthread_mutex_unlock(&t->mu);
      fprintf(stderr,
              "servd: an abandoned interpreter job returned after all (status %d); its "
              "interpreters stay quarantined\n",
              rc);
      if (t->orphan) t->orphan(t->arg);
      destroy(t);
      servd_device_thread_release();
      return NULL;
    }
    pthread_cond_broadcast(&t->cv);
  }
  pthread_mutex_unlock(&t->mu);
  servd_device_thread_release(); /* weights were uploaded here: contexts go while the thread lives */
  return NULL;
}

/* Stopped threads kept for the next model (see servd_interp_thread_stop). */
#define MAX_PARKED 4
static pthread_mutex_t g_parked_mu = PTHREAD_MUTEX_INITIALIZER;
static servd_interp_thread *g_parked[MAX_PARKED];
static int g_n_parked;

int servd_interp_thread_start(servd_interp_thread **out) {
  *out = NULL;
  pthread_mutex_lock(&g_parked_mu);
  servd_interp_thread *t = g_n_parked ? g_parked[--g_n_parked] : NULL;
  pthread_mutex_unlock(&g_parked_mu);
  if (t) {
    *out = t;
    return 0;
  }
  t = calloc(1, sizeof *t);
  if (!t) return servd_fail(SERVD_ENOMEM, "engine: interpreter thread");
  pthread_mutex_init(&t->mu, NULL);
  pthread_cond_init(&t->cv, NULL);
  pthread_mutex_init(&t->callers, NULL);
  if (pthread_create(&t->thread, NULL, thread_main, t)) {
    pthread_mutex_destroy(&t->mu);
    pthread_cond_destroy(&t->cv);
    pthread_mutex_destroy(&t->callers);
    free(t);
    return servd_fail(SERVD_ENOMEM, "engine: starting the interpreter thread");
  }
  *out = t;
  return 0;
}

void servd_interp_thread_post(servd_interp_thread *t, int (*fn)(void *arg), void *arg) {
  pthread_mutex_lock(&t->callers); /* held until the wait */
  pthread_mutex_lock(&t->mu);
  t->fn = fn;
  t->arg = arg;
  t->done = false;
  t->pending = true;
  pthread_cond_broadcast(&t->cv);
  pthread_mutex_unlock(&t->mu);
}

int servd_interp_thread_wait(servd_interp_thread *t) {
  pthread_mutex_lock(&t->mu);
  while (!t->done) pthread_cond_wait(&t->cv, &t->mu);
  int rc = t->rc;
  if (rc) servd_fail(rc, "%s", t->err);
  pthread_mutex_unlock(&t->mu);
  pthread_mutex_unlock(&t->callers);
  return rc;
}

int servd_interp_thread_run(servd_interp_thread *t, int (*fn)(void *arg), void *arg) {
  servd_interp_thread_post(t, fn, arg);
  return servd_interp_thread_wait(t);
}

static int release_devices_job(void *arg) {
  (void)arg;
  servd_device_thread_release(); /* as at the thread's end: the next model starts without contexts */
  return 0;
}

void servd_interp_thread_stop(servd_interp_thread *t) {
  if (!t) return;
  /* Kept alive for the next model rather than ended: a thread that ran interpreter code and ends
   * strands what it cached in each namespace's malloc (its tcache: the namespace's libc never runs
   * its thread cleanup for host threads), and the finalize that ran here filled that cache. One
   * parked thread per model loaded at once bounds it. Measured per repository load/unload of a
   * generic model: 0.18 MiB of RSS left behind with the thread ended, 0.02 with it kept
   * (docs/performance.md, Reliability). */
  servd_interp_thread_run(t, release_devices_job, NULL);
  pthread_mutex_lock(&g_parked_mu);
  if (g_n_parked < MAX_PARKED) {
    g_parked[g_n_parked++] = t;
    t = NULL;
  }
  pthread_mutex_unlock(&g_parked_mu);
  if (!t) return;
  pthread_mutex_lock(&t->mu);
  t->quit = true;
  pthread_cond_broadcast(&t->cv);
  pthread_mutex_unlock(&t->mu);
  pthread_join(t->thread, NULL);
  destroy(t);
}

int servd_interp_thread_run_for(servd_interp_thread *t, int (*fn)(void *arg), void *arg, int64_t timeout_ms,
                                void (*orphan)(void *arg), bool *abandoned) {
  *abandoned = false;
  if (timeout_ms <= 0) return servd_interp_thread_run(t, fn, arg);
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until); /* pthread_cond_timedwait's default clock */
  until.tv_sec += (time_t)(timeout_ms / 1000);
  until.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
  if (until.tv_nsec >= 1000000000L) {
    until.tv_sec++;
    until.tv_nsec -= 1000000000L;
  }
  pthread_mutex_lock(&t->callers);
  pthread_mutex_lock(&t->mu);
  t->fn = fn;
  t->arg = arg;
  t->orphan = orphan;
  t->done = false;
  t->pending = true;
  pthread_cond_broadcast(&t->cv);
  while (!t->done)
    if (pthread_cond_timedwait(&t->cv, &t->mu, &until) == ETIMEDOUT && !t->done) break;
  if (!t->done) {
    t->abandoned = true;
    pthread_detach(t->thread);
    pthread_mutex_unlock(&t->mu);
    pthread_mutex_unlock(&t->callers); /* nobody else holds t: the caller was its only user */
    *abandoned = true;
    return servd_fail(SERVD_ETIMEDOUT, "interpreter job did not return within %lld ms; abandoned",
                      (long long)timeout_ms);
  }
  int rc = t->rc;
  if (rc) servd_fail(rc, "%s", t->err);
  pthread_mutex_unlock(&t->mu);
  pthread_mutex_unlock(&t->callers);
  return rc;
}
