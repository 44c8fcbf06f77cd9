/* Link-map namespaces: one dlmopen'd libpython3.11 plus the servd module each. */
#include "interp-impl.h"
#include "heap_check-impl.h"

#include <limits.h>
#include <malloc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static servd_ns g_ns[SERVD_INTERP_MAX];
static int g_count;

/* bit k: this thread has run namespace k's __ctype_init */
static __thread uint32_t t_ctype_done;
static __thread servd_guest_thread t_threads[SERVD_INTERP_MAX];

servd_guest_thread *servd_ns__thread(const servd_ns *ns) {
  uint32_t bit = 1u << ns->slot;
  if (!(t_ctype_done & bit)) {
    ns->ctype_init();
    t_ctype_done |= bit;
  }
  return &t_threads[ns->slot];
}

/* Caps the namespace's malloc at one arena (its main arena), before a second thread allocates in it.
 *
 * A host thread that ends (the engine's interpreter thread at every unload, batcher and rank
 * workers) runs only the main libc's thread cleanup: the namespace's libc never learns the thread
 * is gone. With its default of up to 8 arenas per core, each new thread that allocated there had
 * been given an arena of its own, which then stayed attached to the dead thread, never reused, with
 * the thread's cached chunks (tcache) in it: ~0.22 MiB of RSS per such thread, 0.43 MiB per
 * repository load/unload of a generic model in servd (docs/performance.md, Reliability). With one
 * arena every thread shares it and what a dead thread freed is reused; only its tcache (a few KiB
 * to ~60 KiB) stays behind. One arena costs nothing worth measuring: the interpreter's GIL already
 * serializes nearly all of its allocations. */
static int one_arena(servd_ns *ns) {
  int (*ns_mallopt)(int, int) = (int (*)(int, int))dlsym(ns->py, "mallopt");
  if (!ns_mallopt || ns_mallopt(M_ARENA_MAX, 1) != 1)
    return servd_fail(SERVD_EUNSUPPORTED, "interp: mallopt(M_ARENA_MAX) in the namespace's libc failed");
  return 0;
}

static int load(servd_ns *ns, const servd_py_paths *paths) {
  const char *path = paths->pymod;
  int rc = 0;
  Lmid_t where = LM_ID_NEWLM;
  if (servd_heap_check__on() && (rc = servd_heap_check__open_ns(ns->slot, &where))) return rc;
  ns->py = dlmopen(where, paths->libpython, RTLD_NOW | RTLD_LOCAL);
  if (!ns->py) {
    const char *e = dlerror();
    const char *hint = e && strstr(e, "static TLS") ? " (call servd_interp_early_init() first in main, or start with "
                                                      "GLIBC_TUNABLES=glibc.rtld.nns=16)"
                                                    : "";
    return servd_fail(SERVD_EUNSUPPORTED, "interp: dlmopen %s: %s%s", paths->libpython, e ? e : "?", hint);
  }
  if (dlinfo(ns->py, RTLD_DI_LMID, &ns->lmid) != 0) {
    rc = servd_fail(SERVD_EUNSUPPORTED, "interp: dlinfo(RTLD_DI_LMID): %s", dlerror());
    goto fail;
  }
  ns->ctype_init = (void (*)(void))dlsym(ns->py, "__ctype_init");
  if (!ns->ctype_init) {
    rc = servd_fail(SERVD_EUNSUPPORTED, "interp: __ctype_init not found in the namespace's libc");
    goto fail;
  }
  ns->ctype_init(); /* this thread, before anything of the namespace runs here */
  if ((rc = servd_tls_keys__confine(ns->py, paths->libpython))) goto fail;
  if ((rc = one_arena(ns))) goto fail;
  ns->guest = dlmopen(ns->lmid, path, RTLD_NOW | RTLD_LOCAL);
  if (!ns->guest) {
    rc = servd_fail(SERVD_EIO, "interp: dlmopen %s: %s", path, dlerror());
    goto fail;
  }
  servd_guest_entry_fn entry = (servd_guest_entry_fn)dlsym(ns->guest, SERVD_GUEST_ENTRY);
  ns->api = entry ? entry() : NULL;
  if (!ns->api || ns->api->abi != SERVD_GUEST_ABI) {
    rc = servd_fail(SERVD_EFORMAT, "interp: %s: no %s of ABI %d", path, SERVD_GUEST_ENTRY, SERVD_GUEST_ABI);
    goto fail;
  }
  return 0;
fail:
  /* Nothing of CPython ran yet, but library destructors of a namespace are not trusted: keep the
   * handles loaded and leave the slot unusable. */
  ns->api = NULL;
  return rc;
}

int servd_ns__acquire(const servd_py_paths *paths, servd_ns **out) {
  *out = NULL;
  int rc = 0;
  pthread_mutex_lock(&g_mu);
  for (int i = 0; i < g_count; i++) {
    if (!g_ns[i].in_use && g_ns[i].api) {
      g_ns[i].in_use = true;
      *out = &g_ns[i];
      goto done;
    }
  }
  if (g_count == SERVD_INTERP_MAX) {
    rc = servd_fail(SERVD_ERANGE,
                    "interp: all %d interpreters of this process are in use (glibc has 16 link-map "
                    "namespaces and the program uses one; an interpreter needs its own)",
                    SERVD_INTERP_MAX);
    goto done;
  }
  servd_ns *ns = &g_ns[g_count];
  memset(ns, 0, sizeof *ns);
  ns->slot = g_count;
  rc = load(ns, paths);
  if (rc == 0 || ns->py)
    g_count++; /* a slot that failed after loading libpython stays taken: its libraries stay loaded */
  if (rc == 0) {
    ns->in_use = true;
    *out = ns;
  }
done:
  pthread_mutex_unlock(&g_mu);
  return rc;
}

int servd_interp_namespaces_free(void) {
  pthread_mutex_lock(&g_mu);
  int n = SERVD_INTERP_MAX - g_count;
  for (int i = 0; i < g_count; i++) n += !g_ns[i].in_use && g_ns[i].api; /* reusable */
  pthread_mutex_unlock(&g_mu);
  return n;
}

void servd_ns__release(servd_ns *ns) {
  if (!ns) return;
  pthread_mutex_lock(&g_mu);
  ns->in_use = false;
  pthread_mutex_unlock(&g_mu);
}
