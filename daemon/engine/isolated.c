/* Process isolation, servd's side: starting the child, calls over the socket, crash and restart.
 * See isolated.h.
 *
 * Threads: callers of servd_isolated_predict send their request (under send_mu) and wait on cv for
 * their pending entry; the monitor thread owns the child: it starts it, reads every answer and hands
 * it to its caller, and on EOF reaps the child, fails the calls in flight and starts another after
 * the backoff. mu guards everything but the socket's send side.
 */
#include "engine/isolated.h"
#include "engine/isolated_wire.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "servd/threadpool.h"

#define BACKOFF_MIN_S 0.1
#define BACKOFF_MAX_S 30.0
#define STABLE_S 60.0        /* a child that served this long resets the backoff */
#define ANSWER_GRACE_MS 1000 /* past a call's deadline, for the child's TimeoutError to arrive */
#define REAP_WAIT_MS 5000    /* after EOF or at stop, before SIGKILL */
/* Past the load timeout, how long servd waits for the child's answer before it kills the child: the
 * child's own engine abandons an import that cannot be interrupted 2 s after the timeout and then
 * reports the failure; the rest covers the exec and its start. */
#define LOAD_KILL_MARGIN_MS 5000

typedef struct pending {
  struct pending *next;
  uint64_t id;
  bool done;
  int rc; /* 0: f holds the answer; else the call failed (why) */
  iso_frame f;
  char why[512];
} pending;

struct servd_isolated {
  char *path, *name, *extra_sys_path, *exe;
  int interpreters, max_batch_size, max_batch_delay_ms, max_queue;
  double load_timeout_s; /* the child's import is bounded by it, as an in-process load is */
  pthread_mutex_t mu, send_mu;
  pthread_cond_t cv;
  pthread_t monitor;
  int sock;  /* -1 while no child serves */
  pid_t pid; /* 0: none */
  bool up, stopping, first_done;
  int first_rc;
  char first_err[1024];
  char down_why[384];
  int64_t up_since_ns, restart_at_ns;
  double backoff_s;
  int restarts;
  pending *calls;
  int n_calls;
  uint64_t next_id;
};

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Waits on cv until the monotonic time until_ns (0: no limit); false at the limit. */
static bool wait_until(servd_isolated *iso, int64_t until_ns) {
  if (!until_ns) {
    pthread_cond_wait(&iso->cv, &iso->mu);
    return true;
  }
  int64_t left = until_ns - now_ns();
  if (left <= 0) return false;
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  int64_t t = (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec + left;
  ts.tv_sec = t / 1000000000;
  ts.tv_nsec = t % 1000000000;
  return pthread_cond_timedwait(&iso->cv, &iso->mu, &ts) != ETIMEDOUT;
}

/* "was killed by signal 11 (SIGSEGV)" / "exited with status 3". */
static void describe_status(int status, char *buf, size_t cap) {
  if (WIFSIGNALED(status)) {
    int sig = WTERMSIG(status);
    const char *abbrev = sigabbrev_np(sig);
    snprintf(buf, cap, "was killed by signal %d (SIG%s)", sig, abbrev ? abbrev : "?");
  } else if (WIFEXITED(status)) {
    snprintf(buf, cap, "exited with status %d", WEXITSTATUS(status));
  } else {
    snprintf(buf, cap, "ended (wait status %#x)", status);
  }
}

/* Reaps the child: waits up to wait_ms for it to end by itself, then kills it. */
static void reap(pid_t pid, int wait_ms, char *why, size_t cap) {
  int status = 0;
  for (int waited = 0;; waited += 10) {
    pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) break;
    if (r < 0 && errno != EINTR) {
      snprintf(why, cap, "ended (waitpid: %s)", strerror(errno));
      return;
    }
    if (waited >= wait_ms) {
      kill(pid, SIGKILL);
      while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
      break;
    }
    usleep(10000);
  }
  describe_status(status, why, cap);
}

/* Forks and executes `servd isolated-worker 3` with the socket's other end as fd 3. */
static int spawn(servd_isolated *iso, int *sock_out, pid_t *pid_out) {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
    return servd_fail(SERVD_EIO, "isolated model '%s': socketpair: %s", iso->name, strerror(errno));
  char *argv[] = {iso->exe, "isolated-worker", "3", NULL};
  sigset_t none;
  sigemptyset(&none);
  pid_t pid = fork();
  if (pid < 0) {
    close(sv[0]);
    close(sv[1]);
    return servd_fail(SERVD_EIO, "isolated model '%s': fork: %s", iso->name, strerror(errno));
  }
  if (pid == 0) {
    /* Only async-signal-safe calls until execv: the parent has other threads. */
    if (sv[1] == 3) fcntl(3, F_SETFD, 0);
    else if (dup2(sv[1], 3) < 0) _exit(127);
    dup2(2, 1); /* servd's stdout carries its port line; the child writes to its log */
    close_range(4, ~0u, 0);
    prctl(PR_SET_PDEATHSIG, SIGKILL); /* the monitor thread forked: it lives as long as the child */
    sigprocmask(SIG_SETMASK, &none, NULL);
    execv(iso->exe, argv);
    _exit(127);
  }
  close(sv[1]);
  *sock_out = sv[0];
  *pid_out = pid;
  return 0;
}

/* Waits until the child's first message (its load's outcome) can be read: 0, SERVD_ETIMEDOUT past the
 * load timeout plus LOAD_KILL_MARGIN_MS, SERVD_ECANCELED when the model is stopped meanwhile (an
 * unload need not wait for a load it will throw away). */
static int wait_loaded(servd_isolated *iso, int sock) {
  int64_t until = iso->load_timeout_s > 0
                      ? now_ns() + (int64_t)(iso->load_timeout_s * 1e9) + (int64_t)LOAD_KILL_MARGIN_MS * 1000000
                      : 0;
  for (;;) {
    pthread_mutex_lock(&iso->mu);
    bool stopping = iso->stopping;
    pthread_mutex_unlock(&iso->mu);
    if (stopping) return SERVD_ECANCELED;
    if (until && now_ns() >= until) return SERVD_ETIMEDOUT;
    struct pollfd p = {.fd = sock, .events = POLLIN};
    int r = poll(&p, 1, 100);
    if (r > 0) return 0; /* readable, or EOF/error: iso_recv tells */
    if (r < 0 && errno != EINTR) return 0;
  }
}

/* Starts a child and waits until it has loaded the model. On failure err holds why. */
static int start_child(servd_isolated *iso, int *sock_out, pid_t *pid_out, char *err, size_t cap) {
  int sock = -1;
  pid_t pid = 0;
  int rc = spawn(iso, &sock, &pid);
  if (rc) {
    snprintf(err, cap, "%s", servd_last_error());
    return rc;
  }
  json_t *hello =
      json_pack("{s:s, s:s, s:i, s:i, s:i, s:i, s:i, s:f, s:s?}", "path", iso->path, "name", iso->name, "interpreters",
                iso->interpreters, "max_batch_size", iso->max_batch_size, "max_batch_delay_ms", iso->max_batch_delay_ms,
                "max_queue", iso->max_queue, "threads", servd_threadpool_size(), "load_timeout", iso->load_timeout_s,
                "extra_sys_path", iso->extra_sys_path);
  char *text = hello ? json_dumps(hello, JSON_COMPACT) : NULL;
  json_decref(hello);
  iso_frame f = {.fd = -1};
  if (!text) {
    rc = servd_fail(SERVD_ENOMEM, "isolated model '%s': options", iso->name);
  } else {
    rc = iso_send(sock, ISO_HELLO, 0, text, strlen(text), NULL, 0);
    free(text);
  }
  if (!rc) {
    rc = wait_loaded(iso, sock);
    if (rc == SERVD_ETIMEDOUT || rc == SERVD_ECANCELED) {
      kill(pid, SIGKILL);
      char why[256];
      reap(pid, 0, why, sizeof why);
      if (rc == SERVD_ETIMEDOUT)
        snprintf(err, cap,
                 "the load timeout (%g s) passed and its process (pid %d) had not finished loading %g s later: "
                 "the process is killed",
                 iso->load_timeout_s, (int)pid, LOAD_KILL_MARGIN_MS / 1000.0);
      else snprintf(err, cap, "the model is unloading: its process (pid %d) is killed while loading", (int)pid);
      close(sock);
      return servd_fail(rc, "%s", err);
    }
  }
  if (!rc) rc = iso_recv(sock, &f);
  if (rc) {
    char why[256];
    reap(pid, REAP_WAIT_MS, why, sizeof why);
    snprintf(err, cap, "its process %s while loading (see the log above)", why);
    close(sock);
    return servd_fail(SERVD_EMODEL, "%s", err);
  }
  const iso_status *st = f.payload;
  if (f.h.type != ISO_READY || f.h.len < sizeof *st) {
    rc = servd_fail(SERVD_EFORMAT, "isolated model '%s': unexpected first message %u", iso->name, f.h.type);
    snprintf(err, cap, "%s", servd_last_error());
  } else if (st->rc) {
    rc = st->rc;
    snprintf(err, cap, "%.*s", (int)sizeof st->error, st->error);
  }
  iso_frame_free(&f);
  if (rc) {
    char why[256];
    shutdown(sock, SHUT_RDWR);
    reap(pid, REAP_WAIT_MS, why, sizeof why);
    close(sock);
    return servd_fail(rc, "%s", err);
  }
  *sock_out = sock;
  *pid_out = pid;
  return 0;
}

static void fail_calls(servd_isolated *iso, int rc, const char *why) {
  for (pending *p = iso->calls; p; p = p->next) {
    if (p->done) continue;
    p->done = true;
    p->rc = rc;
    snprintf(p->why, sizeof p->why, "%s", why);
  }
  pthread_cond_broadcast(&iso->cv);
}

static void *monitor_main(void *arg) {
  servd_isolated *iso = arg;
  pthread_setname_np(pthread_self(), "servd-isolate");
  pthread_mutex_lock(&iso->mu);
  while (!iso->stopping) {
    if (!iso->up) {
      if (iso->first_done && wait_until(iso, iso->restart_at_ns)) continue; /* woken: stopping? */
      pthread_mutex_unlock(&iso->mu);
      char err[1024] = "";
      int sock = -1;
      pid_t pid = 0;
      int rc = start_child(iso, &sock, &pid, err, sizeof err);
      pthread_mutex_lock(&iso->mu);
      if (!iso->first_done) {
        iso->first_done = true;
        iso->first_rc = rc;
        snprintf(iso->first_err, sizeof iso->first_err, "%s", err);
        pthread_cond_broadcast(&iso->cv);
        if (rc) break;
      } else if (rc) {
        iso->backoff_s = iso->backoff_s * 2 > BACKOFF_MAX_S ? BACKOFF_MAX_S : iso->backoff_s * 2;
        iso->restart_at_ns = now_ns() + (int64_t)(iso->backoff_s * 1e9);
        snprintf(iso->down_why, sizeof iso->down_why, "its restart failed: %.340s", err);
        iso->restarts++;
        fprintf(stderr, "servd: model '%s': restart failed: %s; next try in %.1f s\n", iso->name, err, iso->backoff_s);
        continue;
      } else {
        fprintf(stderr, "servd: model '%s': restarted (process %d, restart %d)\n", iso->name, (int)pid, iso->restarts);
      }
      if (iso->stopping) { /* stop came while it loaded */
        iso->sock = sock;
        iso->pid = pid;
        break;
      }
      iso->sock = sock;
      iso->pid = pid;
      iso->up = true;
      iso->up_since_ns = now_ns();
      pthread_cond_broadcast(&iso->cv);
    }
    int sock = iso->sock;
    pthread_mutex_unlock(&iso->mu);
    iso_frame f;
    int rc = iso_recv(sock, &f);
    pthread_mutex_lock(&iso->mu);
    if (rc == 0 && f.h.type == ISO_RESULT) {
      pending *p = iso->calls;
      while (p && p->id != f.h.id) p = p->next;
      if (p && !p->done) { /* else the caller gave up at its deadline: drop the late answer */
        p->f = f;
        p->done = true;
        pthread_cond_broadcast(&iso->cv);
      } else {
        iso_frame_free(&f);
      }
      continue;
    }
    if (rc == 0) iso_frame_free(&f);
    if (iso->stopping) break;
    /* The child died (EOF) or spoke nonsense: either way it is gone. */
    pid_t pid = iso->pid;
    iso->up = false;
    pthread_mutex_unlock(&iso->mu);
    char how[256], why[384];
    if (rc == 0) kill(pid, SIGKILL);
    reap(pid, REAP_WAIT_MS, how, sizeof how);
    pthread_mutex_lock(&iso->mu);
    close(iso->sock);
    iso->sock = -1;
    iso->pid = 0;
    snprintf(why, sizeof why, "the model's process (pid %d) %s", (int)pid, how);
    snprintf(iso->down_why, sizeof iso->down_why, "%s", why);
    int in_flight = 0;
    for (pending *p = iso->calls; p; p = p->next) in_flight += !p->done;
    fail_calls(iso, SERVD_EMODEL, why);
    bool stable = (double)(now_ns() - iso->up_since_ns) / 1e9 >= STABLE_S;
    iso->backoff_s = stable || iso->backoff_s <= 0        ? BACKOFF_MIN_S
                     : iso->backoff_s * 2 > BACKOFF_MAX_S ? BACKOFF_MAX_S
                                                          : iso->backoff_s * 2;
    iso->restart_at_ns = now_ns() + (int64_t)(iso->backoff_s * 1e9);
    iso->restarts++;
    fprintf(stderr, "servd: model '%s': %s; %d call%s in flight failed; restarting in %.1f s\n", iso->name, why,
            in_flight, in_flight == 1 ? "" : "s", iso->backoff_s);
  }
  /* Stopping (or the first start failed). The child ends at EOF; a stuck one is killed. */
  pid_t pid = iso->pid;
  int sock = iso->sock;
  iso->up = false;
  iso->sock = -1;
  iso->pid = 0;
  fail_calls(iso, SERVD_ECANCELED, "the model is unloading");
  pthread_mutex_unlock(&iso->mu);
  if (sock >= 0) shutdown(sock, SHUT_RDWR);
  if (pid > 0) {
    char how[256];
    reap(pid, REAP_WAIT_MS, how, sizeof how);
  }
  if (sock >= 0) close(sock);
  return NULL;
}

int servd_isolated_start(const servd_model_options *o, const char *name, servd_isolated **out) {
  *out = NULL;
  servd_isolated *iso = calloc(1, sizeof *iso);
  if (!iso) return servd_fail(SERVD_ENOMEM, "isolated model: allocation");
  char exe[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n > 0) exe[n] = 0;
  iso->path = strdup(o->path);
  iso->name = strdup(name ? name : o->path);
  iso->extra_sys_path = o->extra_sys_path ? strdup(o->extra_sys_path) : NULL;
  iso->exe = n > 0 ? strdup(exe) : NULL;
  iso->interpreters = o->interpreters > 0 ? o->interpreters : 1;
  iso->max_batch_size = o->max_batch_size;
  iso->max_batch_delay_ms = o->max_batch_delay_ms;
  iso->max_queue = o->max_queue;
  iso->load_timeout_s = o->load_timeout_s > 0 ? o->load_timeout_s : 0;
  iso->sock = -1;
  pthread_mutex_init(&iso->mu, NULL);
  pthread_mutex_init(&iso->send_mu, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&iso->cv, &ca);
  pthread_condattr_destroy(&ca);
  if (!iso->path || !iso->name || (o->extra_sys_path && !iso->extra_sys_path) || !iso->exe) {
    servd_isolated_stop(iso, 0);
    return servd_fail(SERVD_ENOMEM, "isolated model: allocation (or /proc/self/exe unreadable)");
  }
  if (pthread_create(&iso->monitor, NULL, monitor_main, iso)) {
    iso->first_done = true; /* no thread to join */
    iso->monitor = 0;
    servd_isolated_stop(iso, 0);
    return servd_fail(SERVD_ENOMEM, "isolated model: starting its monitor thread");
  }
  pthread_mutex_lock(&iso->mu);
  while (!iso->first_done) pthread_cond_wait(&iso->cv, &iso->mu);
  int rc = iso->first_rc;
  char err[1024];
  snprintf(err, sizeof err, "%s", iso->first_err);
  pthread_mutex_unlock(&iso->mu);
  if (rc) {
    servd_isolated_stop(iso, 0);
    return servd_fail(rc, "%s", err);
  }
  fprintf(stderr, "servd: model '%s': isolated in process %d\n", iso->name, (int)iso->pid);
  *out = iso;
  return 0;
}

void servd_isolated_stop(servd_isolated *iso, int deadline_ms) {
  if (!iso) return;
  pthread_mutex_lock(&iso->mu);
  int64_t until = now_ns() + (int64_t)(deadline_ms > 0 ? deadline_ms : 0) * 1000000;
  while (iso->n_calls > 0 && deadline_ms > 0 && wait_until(iso, until)) {}
  iso->stopping = true;
  if (iso->sock >= 0) shutdown(iso->sock, SHUT_RDWR); /* wakes the monitor's read; the child sees EOF */
  pthread_cond_broadcast(&iso->cv);
  pthread_mutex_unlock(&iso->mu);
  if (iso->monitor) pthread_join(iso->monitor, NULL);
  /* Callers still waiting were failed by the monitor; wait until they have left. */
  pthread_mutex_lock(&iso->mu);
  while (iso->n_calls > 0) pthread_cond_wait(&iso->cv, &iso->mu);
  pthread_mutex_unlock(&iso->mu);
  pthread_mutex_destroy(&iso->mu);
  pthread_mutex_destroy(&iso->send_mu);
  pthread_cond_destroy(&iso->cv);
  free(iso->path);
  free(iso->name);
  free(iso->extra_sys_path);
  free(iso->exe);
  free(iso);
}

bool servd_isolated_ready(const servd_isolated *iso) {
  servd_isolated *m = (servd_isolated *)iso; /* the mutex is logically const */
  pthread_mutex_lock(&m->mu);
  bool up = m->up && !m->stopping;
  pthread_mutex_unlock(&m->mu);
  return up;
}

int servd_isolated_restarts(const servd_isolated *iso) {
  servd_isolated *m = (servd_isolated *)iso;
  pthread_mutex_lock(&m->mu);
  int n = m->restarts;
  pthread_mutex_unlock(&m->mu);
  return n;
}

bool servd_isolated_down(const servd_isolated *iso, char *why, size_t cap) {
  servd_isolated *m = (servd_isolated *)iso;
  pthread_mutex_lock(&m->mu);
  bool down = !m->up && !m->stopping && m->first_done && m->first_rc == 0;
  if (down && why && cap) {
    int64_t left_ms = (m->restart_at_ns - now_ns()) / 1000000;
    if (left_ms > 0) snprintf(why, cap, "%s; restart %d in %.1f s", m->down_why, m->restarts, (double)left_ms / 1000.0);
    else snprintf(why, cap, "%s; restart %d is loading", m->down_why, m->restarts);
  }
  pthread_mutex_unlock(&m->mu);
  return down;
}

int servd_isolated_predict(servd_isolated *iso, const servd_named_tensor *inputs, int n_inputs,
                           servd_named_tensor **outputs, int *n_outputs, int64_t deadline_ms, servd_model_error *err) {
  *outputs = NULL;
  *n_outputs = 0;
  if (err) memset(err, 0, sizeof *err);
  pending p = {.f = {.fd = -1}};
  pthread_mutex_lock(&iso->mu);
  if (!iso->up || iso->stopping) {
    int64_t left_ms = (iso->restart_at_ns - now_ns()) / 1000000;
    int rc = iso->stopping ? servd_fail(SERVD_ECANCELED, "predict: the model is unloading")
                           : servd_fail(SERVD_ECANCELED, "predict: the model is restarting: %s; next start in %.1f s",
                                        iso->down_why, left_ms > 0 ? (double)left_ms / 1000.0 : 0.0);
    pthread_mutex_unlock(&iso->mu);
    return rc;
  }
  p.id = ++iso->next_id;
  p.next = iso->calls;
  iso->calls = &p;
  iso->n_calls++;
  int sock = iso->sock;
  pthread_mutex_unlock(&iso->mu);

  iso_call_head head = {.deadline_ms = deadline_ms, .n = (uint32_t)(n_inputs > 0 ? n_inputs : 0)};
  int64_t until = deadline_ms > 0 ? now_ns() + (deadline_ms + ANSWER_GRACE_MS) * 1000000 : 0;
  pthread_mutex_lock(&iso->send_mu);
  int rc = iso_send(sock, ISO_PREDICT, p.id, &head, sizeof head, inputs, n_inputs);
  pthread_mutex_unlock(&iso->send_mu);
  char msg[sizeof p.why] = "";
  if (rc) snprintf(msg, sizeof msg, "%s", servd_last_error());

  pthread_mutex_lock(&iso->mu);
  /* A failed send (a bad tensor, or the child gone: then the monitor fails the call) */
  if (rc && rc != SERVD_EIO && !p.done) {
    p.done = true;
    p.rc = rc;
    snprintf(p.why, sizeof p.why, "%s", msg);
  }
  bool timed_out = false;
  while (!p.done)
    if (!wait_until(iso, until) && !p.done) {
      timed_out = true;
      break;
    }
  for (pending **pp = &iso->calls; *pp; pp = &(*pp)->next)
    if (*pp == &p) {
      *pp = p.next;
      break;
    }
  iso->n_calls--;
  pthread_cond_broadcast(&iso->cv); /* stop may wait for the calls to end */
  pthread_mutex_unlock(&iso->mu);

  if (timed_out)
    return servd_fail(SERVD_ETIMEDOUT, "predict: the model's process did not answer within the deadline (%lld ms)",
                      (long long)deadline_ms);
  if (p.rc) {
    if (p.rc == SERVD_EMODEL && err) {
      snprintf(err->type, sizeof err->type, "ModelProcessDied");
      snprintf(err->message, sizeof err->message, "%.400s while serving this request; servd restarts it", p.why);
    }
    return p.rc == SERVD_EMODEL ? servd_fail(p.rc, "predict: %s while serving this request; servd restarts it", p.why)
                                : servd_fail(p.rc, "%s", p.why);
  }
  const iso_status *st = p.f.payload;
  if (p.f.h.len < sizeof *st) {
    iso_frame_free(&p.f);
    return servd_fail(SERVD_EFORMAT, "predict: a short answer from the model's process");
  }
  iso_status s = *st;
  s.type[sizeof s.type - 1] = s.message[sizeof s.message - 1] = s.error[sizeof s.error - 1] = 0;
  if (s.rc) {
    iso_frame_free(&p.f);
    if (err) {
      snprintf(err->type, sizeof err->type, "%s", s.type);
      snprintf(err->message, sizeof err->message, "%s", s.message);
    }
    return servd_fail(s.rc, "%s", s.error);
  }
  servd_named_tensor *out = NULL;
  rc = iso_take_tensors(&p.f, sizeof(iso_status), s.n, &out);
  iso_frame_free(&p.f);
  if (rc) return rc;
  *outputs = out;
  *n_outputs = (int)s.n;
  return 0;
}
