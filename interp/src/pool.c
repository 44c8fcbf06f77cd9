/* The interpreter pool of one loaded package. */
#include "interp-impl.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mpk/package.h"

struct servd_pool {
  servd_interp *its; /* n, each on its own cache lines */
  int n;
  mpk_package *pkg;
  /* free list (FIFO, so load spreads over all interpreters): its own cache line */
  _Alignas(64) pthread_mutex_t mu;
  pthread_cond_t cv;
  servd_interp *head, *tail;
};

/* The last line(s) of a traceback, for the one-line error message. */
static const char *tail_lines(const char *tb, int lines) {
  const char *end = tb + strlen(tb);
  while (end > tb && end[-1] == '\n') end--;
  const char *p = end;
  while (p > tb && lines > 0) {
    p--;
    if (*p == '\n' && --lines == 0) return p + 1;
  }
  return tb;
}

/* Imports the package in `it` within what is left of the pool's load deadline (deadline_ns 0: none).
 * Timed out: SERVD_ETIMEDOUT, err a TimeoutError whose message names the load timeout. */
static int import_entry(servd_interp *it, mpk_package *pkg, const char *entry, int64_t timeout_ms, int64_t deadline_ns,
                        servd_py_error *err) {
  int64_t left_ms = 0;
  if (deadline_ns) {
    left_ms = (deadline_ns - servd_interp__now_ns()) / 1000000LL;
    if (left_ms <= 0) { /* the interpreters started before it took all of it */
      snprintf(err->type, sizeof err->type, "TimeoutError");
      err->traceback[0] = 0;
      snprintf(err->message, sizeof err->message, "was not imported within the load timeout of %.3g s",
               (double)timeout_ms / 1000.0);
      return servd_fail(SERVD_ETIMEDOUT, "package %s: load timeout", mpk_name(pkg));
    }
  }
  int rc = servd_interp__import_entry(it, entry, left_ms, err);
  if (rc == SERVD_ETIMEDOUT) {
    snprintf(err->type, sizeof err->type, "TimeoutError");
    snprintf(err->message, sizeof err->message,
             "did not load within the load timeout of %.3g s and was interrupted (TimeoutError raised in "
             "the import)",
             (double)timeout_ms / 1000.0);
  }
  return rc;
}

/* Every rank's GPU must exist: a clear error here rather than a failing device call in model code. */
static int check_devices(const servd_pool_options *o, int ws) {
  if (!o->rank_devices) return 0;
  int n = 0;
  char why[160] = "";
  int rc = servd_device_count(&n, why, sizeof why);
  if (rc < 0) return rc;
  for (int r = 0; r < ws; r++) {
    int d = o->rank_devices[r];
    if (d < 0 || d >= n)
      return servd_fail(SERVD_EDEVICE, "interp pool: rank %d on GPU %d, but %d GPU%s visible%s%s%s", r, d, n,
                        n == 1 ? " is" : "s are", why[0] ? " (" : "", why, why[0] ? ")" : "");
  }
  return 0;
}

int servd_pool_create(mpk_package *pkg, const servd_pool_options *o, servd_pool **out) {
  *out = NULL;
  if (!o) return servd_fail(SERVD_EINVAL, "interp pool: options are required");
  if (o->n_interpreters < 1 || o->n_interpreters > SERVD_INTERP_MAX)
    return servd_fail(SERVD_ERANGE,
                      "interp pool: %d interpreters requested; 1..%d per process are possible (each needs a "
                      "glibc link-map namespace of its own: glibc has 16, the program uses one)",
                      o->n_interpreters, SERVD_INTERP_MAX);
  int ws = o->world_size > 0 ? o->world_size : 1;
  if (ws > 1 && !o->comm && !(o->rank_devices && o->dcomm))
    return servd_fail(SERVD_EINVAL, "interp pool: world_size %d needs a communicator", ws);
  int rc = check_devices(o, ws);
  if (rc < 0) return rc;
  const char *entry = pkg ? mpk_entry_point(pkg) : NULL;
  if (pkg && (!entry || !*entry))
    return servd_fail(SERVD_EFORMAT, "interp pool: package %s has no entry_point", mpk_path(pkg));

  servd_pool *p = aligned_alloc(64, sizeof *p); /* its lock sits on its own cache line */
  if (!p) return servd_fail(SERVD_ENOMEM, "interp pool");
  memset(p, 0, sizeof *p);
  pthread_mutex_init(&p->mu, NULL);
  pthread_cond_init(&p->cv, NULL);
  p->pkg = pkg;
  p->its = aligned_alloc(64, sizeof(servd_interp) * (size_t)o->n_interpreters);
  if (!p->its) {
    rc = servd_fail(SERVD_ENOMEM, "interp pool: %d interpreters", o->n_interpreters);
    goto fail;
  }
  memset(p->its, 0, sizeof(servd_interp) * (size_t)o->n_interpreters);
  servd_py_error local, *err = o->error ? o->error : &local;
  /* one deadline for the whole pool: each import gets what the earlier ones left */
  int64_t deadline_ns = o->load_timeout_ms > 0 ? servd_interp__now_ns() + o->load_timeout_ms * 1000000LL : 0;
  for (int i = 0; i < o->n_interpreters; i++) {
    int rank = i % ws;
    servd_interp_config c = {.index = i,
                             .rank = rank,
                             .world_size = ws,
                             .device = o->rank_devices ? o->rank_devices[rank] : -1,
                             .comm = o->comm,
                             .dcomm = o->dcomm,
                             .pkg = pkg,
                             .extra_sys_path = o->extra_sys_path};
    rc = servd_interp__init(&p->its[i], &c, err);
    if (rc < 0) {
      if (err->type[0]) rc = servd_fail(rc, "interp %d: starting Python: %s: %s", i, err->type, err->message);
      goto fail;
    }
    p->n = i + 1;
    if (pkg) {
      rc = import_entry(&p->its[i], pkg, entry, o->load_timeout_ms, deadline_ns, err);
      if (rc == SERVD_ETIMEDOUT) {
        rc = servd_fail(rc, "interp %d: package %s: entry '%s' %s%s%s", i, mpk_name(pkg), entry, err->message,
                        err->traceback[0] ? ":\n" : "", tail_lines(err->traceback, 4));
        goto fail;
      }
      if (rc < 0) {
        rc = servd_fail(rc, "interp %d: package %s: entry '%s' failed to load: %s: %s\n%s", i, mpk_name(pkg), entry,
                        err->type, err->message, tail_lines(err->traceback, 4));
        goto fail;
      }
    }
    servd_pool_release(p, &p->its[i]);
  }
  *out = p;
  return 0;
fail : {
  /* keep the failure's message: destroying the started interpreters may overwrite it */
  char msg[512];
  snprintf(msg, sizeof msg, "%s", servd_last_error());
  servd_pool_destroy(p);
  servd_fail(rc, "%s", msg);
}
  return rc;
}

void servd_pool_destroy(servd_pool *p) {
  if (!p) return;
  for (int i = 0; i < p->n; i++) servd_interp__fini(&p->its[i]);
  free(p->its);
  pthread_mutex_destroy(&p->mu);
  pthread_cond_destroy(&p->cv);
  free(p);
}

int servd_pool_size(const servd_pool *p) { return p ? p->n : 0; }

servd_interp *servd_pool_acquire(servd_pool *p) {
  pthread_mutex_lock(&p->mu);
  while (!p->head) pthread_cond_wait(&p->cv, &p->mu);
  servd_interp *it = p->head;
  p->head = it->next_free;
  if (!p->head) p->tail = NULL;
  it->next_free = NULL;
  atomic_store_explicit(&it->in_use, 1, memory_order_relaxed);
  pthread_mutex_unlock(&p->mu);
  return it;
}

servd_interp *servd_pool_get(servd_pool *p, int index) {
  if (!p || index < 0 || index >= p->n) return NULL;
  return &p->its[index];
}

void servd_pool_release(servd_pool *p, servd_interp *it) {
  if (!p || !it) return;
  pthread_mutex_lock(&p->mu);
  atomic_store_explicit(&it->in_use, 0, memory_order_relaxed);
  it->next_free = NULL;
  if (p->tail) p->tail->next_free = it;
  else p->head = it;
  p->tail = it;
  pthread_cond_signal(&p->cv);
  pthread_mutex_unlock(&p->mu);
}
