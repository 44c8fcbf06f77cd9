/* The deadline watchdog: one thread for the process, armed by calls that have a deadline.
 *
 * Raising TimeoutError in a call takes that interpreter's GIL (the guest's interrupt), and code
 * blocked in native code while holding the GIL (a C extension's loop, a catastrophic regular
 * expression) keeps it for as long as it likes. So the watchdog never interrupts itself: it hands
 * each interrupt to a helper thread of that interpreter's namespace, and one helper stuck waiting
 * for a GIL delays only the deadlines of that interpreter, never those of the others. */
#include "interp-impl.h"
#include "servd/clock.h"

#include <pthread.h>
#include <stdbool.h>
#include <time.h>

#define RETRY_NS (100 * 1000000LL)
#define BUSY_RETRY_NS (10 * 1000000LL) /* a due call whose namespace's helper is still interrupting */

/* The interrupting helper of one namespace slot, started at its first interrupt. */
typedef struct wd_slot {
  pthread_cond_t cv;           /* signals `firing` to the helper */
  const servd_wd_call *firing; /* the call the helper is interrupting now (NULL: idle) */
  const servd_ns *ns;
  uint64_t seq;
  int started; /* 0 not yet, 1 running, -1 pthread_create failed */
} wd_slot;

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cv;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static int g_started = -1; /* 0 ok, else pthread_create failed */
static servd_wd_call *g_calls;
static pthread_cond_t g_fired_cv; /* a helper finished an interrupt */
static wd_slot g_slots[SERVD_INTERP_MAX];

int64_t servd_interp__now_ns(void) { return servd_now_ns(); }

static void *slot_main(void *arg) {
  wd_slot *s = arg;
  pthread_setname_np(pthread_self(), "servd-watchdog");
  pthread_mutex_lock(&g_mu);
  for (;;) {
    while (!s->firing) pthread_cond_wait(&s->cv, &g_mu);
    const servd_ns *ns = s->ns;
    uint64_t seq = s->seq;
    pthread_mutex_unlock(&g_mu);
    /* The guest checks seq under the GIL, so a call that already returned is never hit; disarm
     * waits while `firing` is its call, so the namespace is not finalized under us. */
    ns->api->interrupt(servd_ns__thread(ns), seq);
    pthread_mutex_lock(&g_mu);
    s->firing = NULL;
    pthread_cond_broadcast(&g_fired_cv);
  }
  return NULL;
}

static int start_detached(void *(*fn)(void *), void *arg) {
  pthread_t t;
  pthread_attr_t ta;
  pthread_attr_init(&ta);
  pthread_attr_setdetachstate(&ta, PTHREAD_CREATE_DETACHED);
  int rc = pthread_create(&t, &ta, fn, arg);
  pthread_attr_destroy(&ta);
  return rc;
}

/* Under g_mu: hands c to its namespace's helper unless that one is busy. False: try again soon. */
static bool dispatch(servd_wd_call *c) {
  wd_slot *s = &g_slots[c->ns->slot];
  if (s->firing) return false;
  if (s->started == 0) {
    pthread_cond_init(&s->cv, NULL);
    s->started = start_detached(slot_main, s) == 0 ? 1 : -1;
  }
  if (s->started < 0) return true; /* no thread for a helper: this namespace's deadlines are not enforced */
  s->firing = c;
  s->ns = c->ns;
  s->seq = c->seq;
  pthread_cond_signal(&s->cv);
  return true;
}

static void *watchdog_main(void *arg) {
  (void)arg;
  pthread_setname_np(pthread_self(), "servd-watchdog"); /* names in crash reports, top -H, gdb */
  pthread_mutex_lock(&g_mu);
  for (;;) {
    int64_t now = servd_interp__now_ns(), next = INT64_MAX;
    for (servd_wd_call *c = g_calls; c; c = c->next) {
      if (c->fire_ns <= now) c->fire_ns = now + (dispatch(c) ? RETRY_NS : BUSY_RETRY_NS);
      if (c->fire_ns < next) next = c->fire_ns;
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
  g_started = start_detached(watchdog_main, NULL);
}

int servd_wd__arm(servd_wd_call *c, const servd_ns *ns, uint64_t seq, int64_t deadline_ms) {
  pthread_once(&g_once, start);
  if (g_started != 0) return servd_fail(SERVD_ENOMEM, "interp: the deadline watchdog thread could not start");
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
  while (g_slots[c->ns->slot].firing == c) pthread_cond_wait(&g_fired_cv, &g_mu);
  pthread_mutex_unlock(&g_mu);
}
