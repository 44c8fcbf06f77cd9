/* One native executor thread per device: the only threads that call CUDA, cuBLAS and NCCL.
 *
 * Why: the CUDA driver crashed under cuBLAS only once interpreter namespaces existed, and a thread
 * that runs interpreter code carries the namespace's libc state (TLS, pthread keys). So no thread
 * that runs interpreter code calls CUDA: each public device call made on another thread is turned
 * into a descriptor (a job, its arguments by value, the tensors it needs kept alive) on a bounded ring
 * of the device's executor, which owns the device's context (stream, cuBLAS handle, scratch), its
 * graph captures and its NCCL rank. Launches stay asynchronous: the caller returns once the
 * descriptor is queued. Calls that return something (a download, a sync, an allocation) wait.
 *
 * Errors: an asynchronous job that fails is remembered with its op; the jobs queued after it are
 * skipped (the step they belong to has failed) and the next waiting call on that device fails with
 * the failed op named, which clears it. Arguments are checked on the caller first (a dry run of the
 * public function up to the point where it would take its CUDA context), so bad arguments still fail
 * at once. SERVD_DEVICE_EXECUTOR=0 runs every call on the caller's thread as before (for A/B runs). */
#include <errno.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device_internal.h"

#define MAX_DEVICES 64
#define RING_SLOTS 1024

typedef struct waiter {
  bool done;
  int rc;
  char msg[512];
} waiter;

typedef struct slot {
  servd__dev_job job;
  const char *op;
  unsigned flags;
  void *args;  /* the caller's arguments (waiting calls) or inline below */
  waiter *w;   /* waiting calls: where the result goes */
  uint64_t id; /* enqueue order */
  int n_hold;
  servd_tensor *hold[SERVD__DEV_HOLD_MAX];
  _Alignas(16) unsigned char inline_args[SERVD__DEV_ARGS_MAX];
} slot;

typedef struct executor {
  int device;
  pthread_t thread;
  pthread_mutex_t mu;
  pthread_cond_t queued, room, finished, released;
  slot *ring;
  uint64_t head, tail; /* slots enqueued, slots taken */
  bool stopping, cancel;
  bool idle;        /* the executor sleeps on `queued`: an enqueue wakes it */
  int room_waiters; /* callers sleeping on `room`: a taken slot wakes them */
  int users;        /* callers inside a waiting call: a stop frees the executor after they left */
  /* the first failed asynchronous job since the last waiting call */
  int err_rc;
  char err_op[64], err_msg[512];
  /* a thread capturing a graph on this device: other callers wait until it ends */
  bool claimed;
  pthread_t claimer;
  servd_device_executor_figures st;
} executor;

static pthread_mutex_t executors_mu = PTHREAD_MUTEX_INITIALIZER;
static executor *executors[MAX_DEVICES];
static _Thread_local bool native_thread; /* an executor or a side thread: may call CUDA */
static _Thread_local bool dry_run;       /* checking arguments on the caller */
static _Thread_local int dry_device;

/* ---- the switch and the thread property ----------------------------------------------------------- */
static int enabled = -1;
static void read_switch(void) {
  const char *e = getenv("SERVD_DEVICE_EXECUTOR");
  enabled = !(e && strcmp(e, "0") == 0);
}

bool servd_device_executor_enabled(void) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, read_switch);
  return enabled;
}

bool servd_device_thread_is_native(void) { return native_thread; }

void servd__dev_executor_override(bool on) {
  servd_device_executor_enabled();
  enabled = on;
}

bool servd__dev_forwarding(void) { return !native_thread && !dry_run && servd_device_executor_enabled(); }

bool servd__dev_dry(int device) {
  if (!dry_run) return false;
  dry_device = device;
  return true;
}

/* ---- side calls: a fresh native thread for calls that belong to no single device's queue -------- */
typedef struct side {
  servd__dev_job job;
  void *args;
  int rc;
  char msg[512];
} side;

static void *side_main(void *p) {
  side *s = p;
  native_thread = true;
  s->rc = s->job(s->args);
  if (s->rc) snprintf(s->msg, sizeof s->msg, "%s", servd_last_error());
  return NULL;
}

int servd__dev_side(const char *op, servd__dev_job job, void *args) {
  if (!servd__dev_forwarding()) return job(args);
  side s = {.job = job, .args = args};
  pthread_t t;
  int e = pthread_create(&t, NULL, side_main, &s);
  if (e) return servd_fail(SERVD_ENOMEM, "%s: starting a device thread: %s", op, strerror(e));
  pthread_join(t, NULL);
  if (s.rc) return servd_fail(s.rc, "%s", s.msg);
  return SERVD_OK;
}

/* ---- the executor thread ------------------------------------------------------------------------ */
/* Runs the slot at the ring's tail; ex->mu is held on entry and on return, not while the job runs. */

/* Copies text into a fixed buffer, cut to fit: a message may be longer than the slot that carries
 * it (snprintf("%s") would say the same, but compilers warn about the cut it intends). */
static void copy_text(char *dst, size_t cap, const char *src) {
  size_t n = strnlen(src, cap - 1);
  memcpy(dst, src, n);
  dst[n] = 0;
}
static void run_slot(executor *ex, slot *s) {
  const bool always = s->flags & SERVD__DEV_ALWAYS;
  const bool cancel = ex->cancel && !always;
  const bool pending = ex->err_rc != 0;
  const bool skip = cancel || (pending && !always);
  int rc = 0;
  char msg[700];
  msg[0] = 0;
  if (cancel) {
    ex->st.cancelled++;
    rc = SERVD_ECANCELED;
    snprintf(msg, sizeof msg, "%s: cancelled: the cuda:%d executor stopped before it ran", s->op, ex->device);
  } else if (skip) {
    ex->st.skipped++;
    if (s->w) { /* the waiting call reports the failure and clears it */
      rc = ex->err_rc;
      snprintf(msg, sizeof msg, "%s: not run: %s failed before it on cuda:%d: %s", s->op, ex->err_op, ex->device,
               ex->err_msg);
      ex->err_rc = 0;
    }
  }
  pthread_mutex_unlock(&ex->mu);
  if (!skip) {
    rc = s->job(s->args);
    if (rc) snprintf(msg, sizeof msg, "%s", servd_last_error());
  }
  for (int i = 0; i < s->n_hold; i++) servd_tensor_release(s->hold[i]);
  pthread_mutex_lock(&ex->mu);
  if (!skip) {
    ex->st.ran++;
    /* A waiting call that ran anyway (ALWAYS) still reports an earlier failure unless told to keep it. */
    if (s->w && pending && !(s->flags & SERVD__DEV_KEEP) && ex->err_rc) {
      if (rc == 0) {
        rc = ex->err_rc;
        snprintf(msg, sizeof msg, "%s: %s failed before it on cuda:%d: %s", s->op, ex->err_op, ex->device, ex->err_msg);
      }
      ex->err_rc = 0;
    }
  }
  if (s->w) {
    s->w->rc = rc;
    if (rc) copy_text(s->w->msg, sizeof s->w->msg, msg);
    s->w->done = true;
    pthread_cond_broadcast(&ex->finished);
  } else if (rc && !cancel && !ex->err_rc) {
    ex->err_rc = rc;
    snprintf(ex->err_op, sizeof ex->err_op, "%s", s->op);
    copy_text(ex->err_msg, sizeof ex->err_msg, msg);
  }
}

static void *executor_main(void *p) {
  executor *ex = p;
  native_thread = true;
  char name[16];
  snprintf(name, sizeof name, "servd-cuda%d", ex->device);
  pthread_setname_np(pthread_self(), name); /* names in crash reports, top -H, gdb */
  pthread_mutex_lock(&ex->mu);
  for (;;) {
    while (ex->head == ex->tail && !ex->stopping) {
      ex->idle = true;
      pthread_cond_wait(&ex->queued, &ex->mu);
      ex->idle = false;
    }
    if (ex->head == ex->tail) break; /* stopping and drained */
    run_slot(ex, &ex->ring[ex->tail % RING_SLOTS]);
    ex->tail++;
    if (ex->room_waiters) pthread_cond_broadcast(&ex->room);
  }
  pthread_mutex_unlock(&ex->mu);
  servd_device_thread_release(); /* its contexts go while the thread lives */
  return NULL;
}

static void stop_all_at_exit(void) { servd_device_executors_stop(true); }

static int get_executor(const char *op, int device, executor **out) {
  int rc = servd__dev_valid(op, device);
  if (rc) return rc;
  executor *ex = __atomic_load_n(&executors[device], __ATOMIC_ACQUIRE); /* running: no lock */
  if (ex) {
    *out = ex;
    return SERVD_OK;
  }
  pthread_mutex_lock(&executors_mu);
  ex = executors[device];
  if (!ex) {
    static bool registered;
    ex = calloc(1, sizeof *ex);
    slot *ring = ex ? calloc(RING_SLOTS, sizeof *ring) : NULL;
    int e = ring ? 0 : ENOMEM;
    if (!e) {
      ex->ring = ring;
      ex->device = device;
      pthread_mutex_init(&ex->mu, NULL);
      pthread_cond_init(&ex->queued, NULL);
      pthread_cond_init(&ex->room, NULL);
      pthread_cond_init(&ex->finished, NULL);
      pthread_cond_init(&ex->released, NULL);
      e = pthread_create(&ex->thread, NULL, executor_main, ex);
    }
    if (e) {
      pthread_mutex_unlock(&executors_mu);
      if (ex) free(ex->ring);
      free(ex);
      return servd_fail(SERVD_ENOMEM, "%s: starting the cuda:%d executor: %s", op, device, strerror(e));
    }
    __atomic_store_n(&executors[device], ex, __ATOMIC_RELEASE);
    /* CUDA registered its own exit handler at discovery, before this one: ours runs first. */
    if (!registered) registered = atexit(stop_all_at_exit) == 0;
  }
  pthread_mutex_unlock(&executors_mu);
  *out = ex;
  return SERVD_OK;
}

/* Takes a slot (waiting for room and for another thread's capture to end); ex->mu held on return.
 * NULL (ex->mu released) when the executor is stopping. */
static slot *reserve(executor *ex) {
  pthread_t self = pthread_self();
  pthread_mutex_lock(&ex->mu);
  while (!ex->stopping && ((ex->claimed && !pthread_equal(ex->claimer, self)) || ex->head - ex->tail >= RING_SLOTS)) {
    if (ex->claimed && !pthread_equal(ex->claimer, self)) {
      pthread_cond_wait(&ex->released, &ex->mu);
      continue;
    }
    ex->st.full_waits++;
    ex->room_waiters++;
    pthread_cond_wait(&ex->room, &ex->mu);
    ex->room_waiters--;
  }
  if (ex->stopping) {
    pthread_mutex_unlock(&ex->mu);
    return NULL;
  }
  slot *s = &ex->ring[ex->head % RING_SLOTS];
  memset(s, 0, offsetof(slot, inline_args));
  s->id = ex->head;
  return s;
}

static void publish(executor *ex) {
  ex->head++;
  ex->st.enqueued++;
  if (ex->idle) pthread_cond_signal(&ex->queued); /* a busy executor finds it without a wake-up */
}

int servd__dev_forward(const char *op, int device, servd__dev_job job, void *args, size_t size, unsigned flags,
                       servd_tensor *const *hold, int n_hold) {
  if (device < 0) { /* learn the device, and check the arguments, from a dry run on this thread */
    dry_run = true;
    dry_device = -1;
    int rc = job(args);
    dry_run = false;
    if (rc != SERVD__DEV_CHECKED) return rc; /* an argument error, or nothing to do */
    device = dry_device;
  }
  if (size > SERVD__DEV_ARGS_MAX || n_hold > SERVD__DEV_HOLD_MAX)
    return servd_fail(SERVD_EINVAL, "%s: descriptor too large (%zu bytes, %d tensors)", op, size, n_hold);
  executor *ex;
  int rc = get_executor(op, device, &ex);
  if (rc) return rc;
  slot *s = reserve(ex);
  if (!s) return servd_fail(SERVD_ECANCELED, "%s: the cuda:%d executor is stopping", op, device);
  s->job = job;
  s->op = op;
  s->flags = flags;
  if (flags & SERVD__DEV_WAIT) {
    s->args = args; /* the caller waits: its arguments stay valid */
  } else {
    memcpy(s->inline_args, args, size);
    s->args = s->inline_args;
  }
  for (int i = 0; i < n_hold; i++)
    if (hold[i]) {
      servd_tensor_retain(hold[i]);
      s->hold[s->n_hold++] = hold[i];
    }
  waiter w = {0};
  if (flags & SERVD__DEV_WAIT) s->w = &w;
  publish(ex);
  if (!(flags & SERVD__DEV_WAIT)) {
    pthread_mutex_unlock(&ex->mu);
    return SERVD_OK;
  }
  ex->st.waits++;
  ex->users++;
  while (!w.done) pthread_cond_wait(&ex->finished, &ex->mu);
  if (--ex->users == 0 && ex->stopping) pthread_cond_broadcast(&ex->finished);
  pthread_mutex_unlock(&ex->mu);
  if (w.rc) return servd_fail(w.rc, "%s", w.msg);
  return SERVD_OK;
}

/* ---- captures: one caller owns the device's queue while it captures ------------------------------ */
int servd__dev_claim(const char *op, int device) {
  if (!servd__dev_forwarding()) return SERVD_OK;
  executor *ex;
  int rc = get_executor(op, device, &ex);
  if (rc) return rc;
  pthread_t self = pthread_self();
  pthread_mutex_lock(&ex->mu);
  while (ex->claimed && !pthread_equal(ex->claimer, self)) pthread_cond_wait(&ex->released, &ex->mu);
  ex->claimed = true;
  ex->claimer = self;
  pthread_mutex_unlock(&ex->mu);
  return SERVD_OK;
}

void servd__dev_unclaim(int device) {
  if (!servd__dev_forwarding() || device < 0 || device >= MAX_DEVICES) return;
  pthread_mutex_lock(&executors_mu);
  executor *ex = executors[device];
  pthread_mutex_unlock(&executors_mu);
  if (!ex) return;
  pthread_mutex_lock(&ex->mu);
  if (ex->claimed && pthread_equal(ex->claimer, pthread_self())) {
    ex->claimed = false;
    pthread_cond_broadcast(&ex->released);
  }
  pthread_mutex_unlock(&ex->mu);
}

/* ---- draining, stopping, figures --------------------------------------------------------------- */
static int nothing(void *args) {
  (void)args;
  return SERVD_OK;
}

int servd__dev_drain(int device, bool clear) {
  if (!servd__dev_forwarding()) return SERVD_OK;
  pthread_mutex_lock(&executors_mu);
  bool running = device >= 0 && device < MAX_DEVICES && executors[device];
  pthread_mutex_unlock(&executors_mu);
  if (!running) return SERVD_OK;
  unsigned flags = SERVD__DEV_WAIT | SERVD__DEV_ALWAYS | (clear ? 0 : SERVD__DEV_KEEP);
  return servd__dev_forward("device drain", device, nothing, NULL, 0, flags, NULL, 0);
}

void servd_device_executors_stop(bool drain) {
  if (native_thread) return; /* an executor cannot join itself */
  for (int d = 0; d < MAX_DEVICES; d++) {
    pthread_mutex_lock(&executors_mu);
    executor *ex = executors[d];
    if (ex) { /* marked stopping before it leaves the table: a caller finds a live one or none */
      pthread_mutex_lock(&ex->mu);
      ex->stopping = true;
      ex->cancel = !drain;
      pthread_cond_broadcast(&ex->queued);
      pthread_cond_broadcast(&ex->room);
      pthread_cond_broadcast(&ex->released);
      pthread_mutex_unlock(&ex->mu);
    }
    __atomic_store_n(&executors[d], NULL, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&executors_mu);
    if (!ex) continue;
    pthread_join(ex->thread, NULL);
    pthread_mutex_lock(&ex->mu); /* callers still waking from their waiting call */
    while (ex->users) pthread_cond_wait(&ex->finished, &ex->mu);
    pthread_mutex_unlock(&ex->mu);
    pthread_mutex_destroy(&ex->mu);
    pthread_cond_destroy(&ex->queued);
    pthread_cond_destroy(&ex->room);
    pthread_cond_destroy(&ex->finished);
    pthread_cond_destroy(&ex->released);
    free(ex->ring);
    free(ex);
  }
}

int servd_device_executor_stats(int device, servd_device_executor_figures *out) {
  memset(out, 0, sizeof *out);
  if (device < 0 || device >= MAX_DEVICES) return servd_fail(SERVD_EINVAL, "device executor stats: device %d", device);
  pthread_mutex_lock(&executors_mu);
  executor *ex = executors[device];
  if (ex) {
    pthread_mutex_lock(&ex->mu);
    *out = ex->st;
    out->queued = ex->head - ex->tail;
    pthread_mutex_unlock(&ex->mu);
  }
  pthread_mutex_unlock(&executors_mu);
  return SERVD_OK;
}
