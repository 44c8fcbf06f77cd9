/* The deadline watchdog: one thread for the process, armed by calls that have a deadline. */
#include "interp-impl.h"

#include <pthread.h>
#include <time.h>

#define RETRY_NS (100 * 1000000LL)

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cv;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static int g_started = -1; /* 0 ok, else pthread_create failed */
static servd_wd_call *g_calls;
static const servd_wd_call *g_firing; /* the call the watchdog is interrupting right now */
static pthread_cond_t g_fired_cv;

int64_t servd_interp__now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void *watchdog_main(void *arg) {
  (void)arg;
  pthread_setname_np(pthread_self(), "servd-watchdog"); /* names in crash reports, top -H, gdb */
  pthread_mutex_lock(&g_mu);
  for (;;) {
    int64_t now = servd_interp__now_ns(), next = INT64_MAX;
    servd_wd_call *due = NULL;
    for (servd_wd_call *c = g_calls; c; c = c->next) {
      if (c->fire_ns <= now && !due)
        due = c;
      else if (c->fire_ns < next)
        next = c->fire_ns;
    }
    if (due) {
      const servd_ns *ns = due->ns;
      uint64_t seq = due->seq;
      due->fire_ns = now + RETRY_NS;
      g_firing = due;
      pthread_mutex_unlock(&g_mu);
      /* The guest checks seq under the GIL, so a call that already returned is never hit; disarm
       * waits for g_firing so that the namespace is not finalized under us. */
      ns->api->interrupt(servd_ns__thread(ns), seq);
      pthread_mutex_lock(&g_mu);
      g_firing = NULL;
      pthread_cond_broadcast(&g_fired_cv);
      continue;
    }
    if (next == INT64_MAX) {
      pthread_cond_wait(&g_cv, &g_mu);
    } else {
      struct timespec ts = {.tv_sec = next / 1000000000LL, .tv_nsec = next % 1000000000LL};
      pthread_cond_timedwait(&g_cv, &g_mu, &ts);
    }
  }
  return NULL;
}

static void start(void) {
  pthread_condattr_t a;
  pthread_condattr_init(&a);
  pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
  pthread_cond_init(&g_cv, &a);
  pthread_condattr_destroy(&a);
  pthread_cond_init(&g_fired_cv, NULL);
  pthread_t t;
  pthread_attr_t ta;
  pthread_attr_init(&ta);
  pthread_attr_setdetachstate(&ta, PTHREAD_CREATE_DETACHED);
  g_started = pthread_create(&t, &ta, watchdog_main, NULL);
  pthread_attr_destroy(&ta);
}

int servd_wd__arm(servd_wd_call *c, const servd_ns *ns, uint64_t seq, int64_t deadline_ms) {
  pthread_once(&g_once, start);
  if (g_started != 0)
    return servd_fail(SERVD_ENOMEM, "interp: the deadline watchdog thread could not start");
  c->ns = ns;
  c->seq = seq;
  c->fire_ns = servd_interp__now_ns() + deadline_ms * 1000000LL;
  pthread_mutex_lock(&g_mu);
  c->next = g_calls;
  g_calls = c;
  pthread_cond_signal(&g_cv);
  pthread_mutex_unlock(&g_mu);
  return 0;
}

void servd_wd__disarm(servd_wd_call *c) {
  pthread_mutex_lock(&g_mu);
  for (servd_wd_call **pp = &g_calls; *pp; pp = &(*pp)->next) {
    if (*pp == c) {
      *pp = c->next;
      break;
    }
  }
  while (g_firing == c)
    pthread_cond_wait(&g_fired_cv, &g_mu);
  pthread_mutex_unlock(&g_mu);
}
