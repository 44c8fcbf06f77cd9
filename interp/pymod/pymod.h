/* Internal header of the `servd` extension module (the guest side of interp/src/guest.h).
 *
 * One copy of this module is loaded per interpreter namespace, so its globals are per interpreter:
 * that is what makes plain C statics safe here. Types are heap types, created anew by every
 * Py_Initialize (an interpreter slot can be finalized and started again).
 */
#ifndef SERVD_PYMOD_H
#define SERVD_PYMOD_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <limits.h>

#include "guest.h"

extern const servd_host_api *pm_host;
extern const servd_guest_config *pm_cfg; /* valid during init only */

typedef struct pm_state {
  void *pkg;
  int rank, world_size, device, index;
  servd_comm *comm;
  servd_device_comm *dcomm; /* collectives of device tensors, or NULL */
  PyObject *tensor_type;    /* servd.Tensor */
  PyObject *rope_type;      /* servd.Rope */
  PyObject *batch_type;     /* servd.Batch */
  PyObject *kv_type;        /* servd.KVCache */
  PyObject *package_type;   /* type of servd.package */
  PyObject *module;         /* the servd module (borrowed from sys.modules after import) */
} pm_state;

extern pm_state pm;

typedef struct TensorObject {
  PyObject_HEAD servd_tensor *t; /* one reference, released on dealloc */
} TensorObject;

typedef struct RopeObject {
  PyObject_HEAD servd_rope_params p;
  float inv[SERVD_ROPE_TABLE_MAX], inv_long[SERVD_ROPE_TABLE_MAX]; /* p's tables, when given */
} RopeObject;

typedef struct KVCacheObject {
  PyObject_HEAD
      /* borrowed from the engine, which keeps them for the model's lifetime. On a GPU rank dkv holds the
   * keys and values and kv only the block bookkeeping; on the CPU dkv is NULL. */
      servd_kv_cache *kv;
  servd_device_kv *dkv;
} KVCacheObject;

typedef struct BatchObject {
  PyObject_HEAD PyObject *dict;     /* attributes: n_tokens, tokens, positions, slots, logit_rows, kv, ... */
  servd_attn_batch attn;            /* valid while `valid` (during the forward call that built it) */
  const servd_device_batch *dbatch; /* the step's device inputs (GPU rank), else NULL; same validity */
  int valid;
} BatchObject;

/* Raises the Python exception matching a SERVD_E* code with the host's last error message. */
PyObject *pm_raise(int code, const char *op);
/* New Tensor object taking ownership of t (one reference); releases t on failure. */
PyObject *pm_tensor_wrap(servd_tensor *t);
static inline int pm_as_int(PyObject *o) {
  long v = PyLong_AsLong(o);
  if (v == -1 && PyErr_Occurred()) return -1;
  if (v < INT_MIN || v > INT_MAX) {
    PyErr_SetString(PyExc_OverflowError, "value out of int range");
    return -1;
  }
  return (int)v;
}
static inline int pm_is_tensor(PyObject *o) { return PyObject_TypeCheck(o, (PyTypeObject *)pm.tensor_type); }
/* Host tensors only: the data of a device tensor is a device address, which the host must never
 * read or write. Every caller checks t->device < 0 first (pm_host_only). */
static inline void *pm_tensor_data(const servd_tensor *t) {
  return (char *)pm_host->storage_data(t->storage) + t->offset;
}
/* "cpu" or "cuda:N" into buf (>= 16 bytes); returns buf. */
const char *pm_device_name(int device, char *buf, size_t cap);
/* 0 for a host tensor; else raises `exc` ("<what> is on cuda:N: copy it to the host with .to_host()")
 * and returns -1. */
int pm_host_only(const servd_tensor *t, PyObject *exc, const char *what);

int pm_tensor_types_init(PyObject *module);
int pm_ops_init(PyObject *module);
int pm_package_init(PyObject *module);
int pm_batch_init(PyObject *module);
PyObject *pm_batch_new(const servd_forward_batch *b); /* new ref; attn valid until pm_batch_invalidate */
void pm_batch_invalidate(PyObject *batch);

PyMODINIT_FUNC PyInit_servd(void);

#endif
