/* Internal interface of servd_interp (not installed). */
#ifndef SERVD_INTERP_IMPL_H
#define SERVD_INTERP_IMPL_H

#include <dlfcn.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "guest.h"
#include "servd/interp.h"

/* ---- where Python is (paths.c) -------------------------------------------------------------------
 * Build-time defaults, each overridable by an environment variable so that servd runs from a
 * relocated directory: SERVD_LIBPYTHON, SERVD_PY_STDLIB (its lib-dynload with it),
 * SERVD_PY_ALLOW_DIR, SERVD_PYMOD_PATH (or SERVD_PYMOD). A path that does not exist is an error
 * naming its variable (the built-in allow_dir may be missing: jinja2 is then not importable). */
typedef struct servd_py_paths {
  char libpython[PATH_MAX], stdlib[PATH_MAX], dynload[PATH_MAX], allow_dir[PATH_MAX], pymod[PATH_MAX];
} servd_py_paths;
int servd_py_paths__resolve(servd_py_paths *p);

/* ---- link-map namespaces (namespace.c) ---------------------------------------------------------
 * A namespace holds one libpython3.11 and one servd module. Namespaces are never unloaded (library
 * destructors of secondary namespaces crash): a finalized interpreter leaves its namespace free for
 * the next one, which starts CPython again in it. */
typedef struct servd_ns {
  int slot; /* 0 .. SERVD_INTERP_MAX-1 */
  Lmid_t lmid;
  void *py;    /* dlmopen handle of libpython */
  void *guest; /* dlmopen handle of the servd module */
  const servd_guest_api *api;
  void (*ctype_init)(void);
  bool in_use;
} servd_ns;

/* ---- pthread key slots shared by the namespaces' libcs (tls_keys.c) ----------------------------
 * Slots below SERVD_GUEST_KEYS are reserved for the interpreters; every other slot is the main
 * program's. reserve_main takes the reserved ones in the main libc (once; early_init calls it first
 * thing) and returns them as a mask; confine makes a new namespace's libc use only them. A namespace
 * needs a few (CPython 2, OpenSSL about 4); SERVD_GUEST_KEYS_MIN is the least it may be left with. */
#define SERVD_GUEST_KEYS 16
#define SERVD_GUEST_KEYS_MIN 8
uint32_t servd_tls_keys__reserve_main(void);
int servd_tls_keys__confine(void *ns_handle, const char *what); /* before CPython starts in it */

/* A free namespace, loading a new one (from paths) when none is. SERVD_ERANGE past SERVD_INTERP_MAX. */
int servd_ns__acquire(const servd_py_paths *paths, servd_ns **out);
void servd_ns__release(servd_ns *ns); /* after the guest's finalize */
/* Makes the calling OS thread ready to run code of ns (its libc's per-thread ctype tables) and
 * returns this thread's state in ns for the guest calls. Cheap after the first time per thread. */
servd_guest_thread *servd_ns__thread(const servd_ns *ns);

/* ---- host function table (host_api.c) ---- */
const servd_host_api *servd_host_api__get(void);

/* ---- deadline watchdog (watchdog.c) ------------------------------------------------------------
 * One thread for the process. A call with a deadline arms a record on its stack; past the deadline
 * the watchdog asks the guest to raise TimeoutError in that call (again every 100 ms until the call
 * returns, in case the code swallows it), through a helper thread per namespace: an interrupt waits
 * for that interpreter's GIL, which code blocked in native code may hold indefinitely. */
typedef struct servd_wd_call {
  struct servd_wd_call *next;
  const servd_ns *ns;
  uint64_t seq;
  int64_t fire_ns; /* CLOCK_MONOTONIC */
} servd_wd_call;

int servd_wd__arm(servd_wd_call *c, const servd_ns *ns, uint64_t seq, int64_t deadline_ms);
void servd_wd__disarm(servd_wd_call *c);
int64_t servd_interp__now_ns(void);

/* ---- interpreters (interp.c) ---- */
struct servd_interp {
  /* hot, written on every call: alone on its cache lines */
  _Alignas(64) _Atomic uint64_t seq;
  _Atomic uint64_t busy_ns;
  _Atomic int in_use; /* acquired by a pool caller */
  /* read-mostly */
  _Alignas(64) int index;
  servd_ns *ns;
  struct servd_interp *next_free; /* pool free list */
  char pad_[64 - sizeof(int) - 2 * sizeof(void *)];
};

typedef struct servd_interp_config {
  int index, rank, world_size, device; /* device -1: the CPU */
  servd_comm *comm;
  servd_device_comm *dcomm;
  mpk_package *pkg;           /* NULL: package-free (code strings only) */
  const char *extra_sys_path; /* NULL or ':'-separated */
  const servd_host_api *host; /* NULL: servd_host_api__get(); tests give a table with stand-ins */
} servd_interp_config;

/* Starts CPython in a free namespace. On failure *err holds the Python error when there is one. */
int servd_interp__init(servd_interp *it, const servd_interp_config *c, servd_py_error *err);
void servd_interp__fini(servd_interp *it);
/* Package-free helpers (tests, benchmarks): exec code in __main__, evaluate an expression to JSON,
 * build the entry object from "module:callable" found on sys.path (extra_sys_path). */
int servd_interp__exec(servd_interp *it, const char *code, int64_t deadline_ms, servd_py_error *err);
int servd_interp__load_entry(servd_interp *it, const char *entry_point, servd_py_error *err);
/* load_entry under a deadline (ms, 0: none): SERVD_ETIMEDOUT when interrupted there (pool.c). */
int servd_interp__import_entry(servd_interp *it, const char *entry_point, int64_t deadline_ms, servd_py_error *err);
int servd_interp__eval_json(servd_interp *it, const char *expr, json_t **result, int64_t deadline_ms,
                            servd_py_error *err);

#endif
