/* The boundary between the host (main link-map namespace) and the `servd` extension module that runs
 * inside each interpreter's namespace (the "guest").
 *
 * The guest is loaded once per namespace, so it must not link servd_kernels or servd_package: it would
 * get a private copy of the tensor code and of every global. Instead the host hands it a table of
 * function pointers (servd_host_api) through servd_guest_entry(); tensors, weights, the thread pool
 * and devices live once, in the main namespace. In return the guest exposes servd_guest_api, through
 * which the host drives the interpreter (init, calls, interrupt, finalize) without touching a single
 * Python symbol itself.
 *
 * Memory rule: each namespace has its own libc and therefore its own malloc. Memory whose ownership
 * crosses the boundary is allocated with host->alloc and freed with host->free (the main libc's).
 */
#ifndef SERVD_INTERP_GUEST_H
#define SERVD_INTERP_GUEST_H

#include <stddef.h>
#include <stdbool.h>
#include <stdint.h>

#include "servd/device.h"
#include "servd/ops.h"
#include "servd/tensor.h"

#include "servd/interp.h"

/* 2: load_entry takes a call number (load deadlines); 3: the ops members come from servd/ops.def */
#define SERVD_GUEST_ABI 3

/* NOTE: append non-op members before the ops, ops as rows at the end of servd/ops.def; bump
 * SERVD_GUEST_ABI when the layout changes otherwise. The guest checks `abi`, then `size`. */
typedef struct servd_host_api {
  int abi;
  size_t size;

  void *(*alloc)(size_t bytes);
  void (*free)(void *p);
  const char *(*last_error)(void);
  int (*fail)(int code, const char *fmt, ...);

  const char *(*dtype_name)(servd_dtype t);
  int (*dtype_from_name)(const char *name, servd_dtype *out);
  size_t (*dtype_block_elems)(servd_dtype t);
  size_t (*dtype_block_bytes)(servd_dtype t);

  servd_storage *(*storage_alloc)(size_t bytes);
  void (*storage_release)(servd_storage *s);
  void *(*storage_data)(const servd_storage *s);
  servd_storage_kind (*storage_get_kind)(const servd_storage *s);

  servd_tensor *(*tensor_new)(servd_dtype t, int ndim, const int64_t *shape);
  servd_tensor *(*tensor_from_storage)(servd_storage *s, size_t offset, servd_dtype t, int ndim, const int64_t *shape);
  servd_tensor *(*tensor_narrow)(const servd_tensor *base, int dim, int64_t start, int64_t len);
  servd_tensor *(*tensor_reshape)(const servd_tensor *base, int ndim, const int64_t *shape);
  void (*tensor_retain)(servd_tensor *t);
  void (*tensor_release)(servd_tensor *t);
  int64_t (*tensor_numel)(const servd_tensor *t);
  bool (*tensor_is_contiguous)(const servd_tensor *t);
  size_t (*tensor_nbytes)(const servd_tensor *t);
  int (*row_to_f32)(servd_dtype t, const void *src, float *dst, int64_t n);
  int (*row_from_f32)(servd_dtype t, const float *src, void *dst, int64_t n);

  /* the package (pkg is an opaque mpk_package*); NULL members when there is no package */
  int (*pkg_tensor)(void *pkg, const char *name, servd_tensor **out);
  int (*pkg_file)(void *pkg, const char *path, const void **data, size_t *len);
  int (*pkg_tensor_count)(void *pkg);
  const char *(*pkg_tensor_name)(void *pkg, int i);
  int (*pkg_file_count)(void *pkg);
  const char *(*pkg_file_path)(void *pkg, int i);
  char *(*pkg_manifest_json)(void *pkg); /* host->alloc'd JSON text of the manifest, or NULL */

  /* ---- devices (servd/device.h) ---- */
  int (*device_tensor_new)(int device, servd_dtype dtype, int ndim, const int64_t *shape, servd_tensor **out);
  int (*device_upload)(int device, const servd_tensor *host, servd_dtype dtype, servd_tensor **out);
  int (*device_weight)(int device, const servd_tensor *host, servd_tensor **out); /* shared, read-only */
  int (*device_sync)(int device);
  int (*device_kv_device)(const servd_device_kv *kv);
  /* a view of one field of the step's device inputs (new reference), NULL on failure */
  servd_tensor *(*device_batch_tensor)(const servd_device_batch *db, servd_device_batch_field f);

  /* ---- ops: one member per row of servd/ops.def, in its order (servd_op__<name>, op_dispatch.h):
   * the CPU kernel for host tensors, the device op for tensors on one device, SERVD_EINVAL for a
   * mix; never NULL ---- */
#define SERVD_OP(name, dispatch, py, sig, names) int (*name)(SERVD__PARAMS(sig, names));
#include "servd/ops.def"
#undef SERVD_OP
} servd_host_api;

/* The ops part of the table is exactly one function pointer per registry row: a row added to
 * servd/ops.def without its member (or a member added by hand among the ops) fails here. */
_Static_assert(sizeof(servd_host_api) == offsetof(servd_host_api, device_batch_tensor) + sizeof(void *) +
                                             SERVD_OP_COUNT * sizeof(int (*)(void)),
               "servd_host_api: the ops members must match servd/ops.def");

/* What one interpreter is started with. Strings are borrowed for the duration of init. */
typedef struct servd_guest_config {
  const servd_host_api *host;          /* borrowed, outlives the interpreter */
  void *pkg;                           /* mpk_package*, or NULL (no package: code strings only) */
  const char *pkg_name;                /* for file names in tracebacks */
  const char *stdlib_dir;              /* e.g. /usr/lib/python3.11 */
  const char *dynload_dir;             /* e.g. /usr/lib/python3.11/lib-dynload */
  const char *allow_dir;               /* e.g. /usr/lib/python3/dist-packages */
  const char *allow_modules;           /* ','-separated top-level names importable from allow_dir */
  const char *extra_sys_path;          /* ':'-separated, or NULL */
  int index, rank, world_size, device; /* device: the GPU of this interpreter, -1: the CPU */
  servd_comm *comm;
  servd_device_comm *dcomm; /* collectives of device tensors (GPU ranks, world_size > 1), or NULL */
} servd_guest_config;

/* The calling OS thread's state in one namespace, kept by the host (per thread, per namespace) and
 * handed to every guest call: the guest needs a PyThreadState per OS thread, and keeping it in the
 * host avoids thread-local storage in the guest (dynamic TLS of a dlmopen'd library is allocated
 * lazily on first use, which AddressSanitizer cannot handle). `gen` tells a state of an earlier
 * start of CPython in that namespace (finalized since) from a live one. */
typedef struct servd_guest_thread {
  unsigned gen;
  void *tstate; /* PyThreadState* */
} servd_guest_thread;

/* Every call takes `seq`, the host's number for this call: interrupt(seq) raises TimeoutError in the
 * thread running call `seq` only, never in a later call. Calls return 0, or a negative SERVD_E* code
 * with *err filled (exception type, message, traceback). Calls take the GIL themselves. */
typedef struct servd_guest_api {
  int abi;
  int (*init)(servd_guest_thread *th, const servd_guest_config *c, servd_py_error *err);
  /* Imports the package's entry module and builds the entry object ("module:callable"); interrupt(seq)
   * ends it with TimeoutError like any other call (the load deadline). */
  int (*load_entry)(servd_guest_thread *th, uint64_t seq, const char *entry_point, servd_py_error *err);
  /* Package-free mode: runs code in __main__ (exec) or evaluates an expression to JSON text. */
  int (*exec)(servd_guest_thread *th, uint64_t seq, const char *code, servd_py_error *err);
  int (*eval_json)(servd_guest_thread *th, uint64_t seq, const char *expr, char **json_out, servd_py_error *err);
  int (*call_json)(servd_guest_thread *th, uint64_t seq, const char *method, const char *args_json, char **json_out,
                   servd_py_error *err);
  int (*predict)(servd_guest_thread *th, uint64_t seq, int n_in, const char *const *in_names,
                 servd_tensor *const *in_tensors, int *n_out, char ***out_names, servd_tensor ***out_tensors,
                 servd_py_error *err);
  int (*forward)(servd_guest_thread *th, uint64_t seq, const servd_forward_batch *b, servd_tensor **logits,
                 servd_py_error *err);
  void (*interrupt)(servd_guest_thread *th, uint64_t seq);
  void (*finalize)(servd_guest_thread *th);
} servd_guest_api;

typedef const servd_guest_api *(*servd_guest_entry_fn)(void);
#define SERVD_GUEST_ENTRY "servd_guest_entry"

#endif
