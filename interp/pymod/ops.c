/* servd.ops: the native kernels, called through the host table with the GIL released. The host's ops
 * pick the CPU or the device kernel from where the tensors are and refuse a mix; the KV cache and the
 * collectives are chosen here (batch.kv's device cache, pm.dcomm). */
#include "pymod.h"

#include <stddef.h>
#include <string.h>

/* Runs `call` (an int expression) without the GIL; raises on failure. The argument objects are held
 * by the caller's frame, so the host tensors stay alive while the GIL is released. */
#define PM_RUN(opname, fn, call) \
  do { \
    if (!pm_host->fn) { \
      PyErr_SetString(PyExc_NotImplementedError, "servd.ops." opname ": not in this build"); \
      return NULL; \
    } \
    int rc_; \
    Py_BEGIN_ALLOW_THREADS rc_ = (call); \
    Py_END_ALLOW_THREADS if (rc_ < 0) return pm_raise(rc_, "servd.ops." opname); \
    Py_RETURN_NONE; \
  } while (0)

static int nargs_ok(Py_ssize_t n, Py_ssize_t want, const char *op) {
  if (n == want) return 1;
  PyErr_Format(PyExc_TypeError, "servd.ops.%s takes %zd arguments (%zd given)", op, want, n);
  return 0;
}

static servd_tensor *targ(PyObject *o, int i, const char *op) {
  if (!pm_is_tensor(o)) {
    PyErr_Format(PyExc_TypeError, "servd.ops.%s: argument %d must be a servd.Tensor, not %.100s", op, i + 1,
                 Py_TYPE(o)->tp_name);
    return NULL;
  }
  return ((TensorObject *)o)->t;
}

static KVCacheObject *kvarg(PyObject *o, const char *op) {
  if (!PyObject_TypeCheck(o, (PyTypeObject *)pm.kv_type)) {
    PyErr_Format(PyExc_TypeError, "servd.ops.%s: kv must be a servd.KVCache (batch.kv)", op);
    return NULL;
  }
  KVCacheObject *kv = (KVCacheObject *)o;
  if (!kv->kv && !kv->dkv) {
    PyErr_Format(PyExc_ValueError, "servd.ops.%s: this servd.KVCache has no cache", op);
    return NULL;
  }
  return kv;
}

/* Checks the argument count, then that args[first .. first+count) are servd.Tensors, stored in t[0 ..
 * count) (borrowed from the argument objects). Returns 0 with a Python exception set on failure. */
static int targs(PyObject *const *args, Py_ssize_t n, Py_ssize_t want, int first, int count, const char *op,
                 servd_tensor **t) {
  if (!nargs_ok(n, want, op)) return 0;
  for (int i = 0; i < count; i++)
    if (!(t[i] = targ(args[first + i], first + i, op))) return 0;
  return 1;
}

static PyObject *op_embedding(PyObject *m, PyObject *args, PyObject *kw) {
  (void)m;
  static char *kwlist[] = {"out", "table", "ids", "row_offset", NULL};
  PyObject *o, *tab, *ids;
  long long off = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "OOO|L:embedding", kwlist, &o, &tab, &ids, &off)) return NULL;
  servd_tensor *t0 = targ(o, 0, "embedding"), *t1, *t2;
  if (!t0 || !(t1 = targ(tab, 1, "embedding")) || !(t2 = targ(ids, 2, "embedding"))) return NULL;
  PM_RUN("embedding", embedding, pm_host->embedding(t0, t1, t2, off));
}

static PyObject *op_rope(PyObject *m, PyObject *const *args, Py_ssize_t n) {
  (void)m;
  servd_tensor *t[2];
  if (!targs(args, n, 3, 0, 2, "rope", t)) return NULL;
  if (!PyObject_TypeCheck(args[2], (PyTypeObject *)pm.rope_type)) {
    PyErr_SetString(PyExc_TypeError, "servd.ops.rope: argument 3 must be a servd.Rope");
    return NULL;
  }
  const servd_rope_params *p = &((RopeObject *)args[2])->p;
  PM_RUN("rope", rope, pm_host->rope(t[0], t[1], p));
}

static PyObject *op_add_rmsnorm(PyObject *m, PyObject *const *args, Py_ssize_t n) {
  (void)m;
  servd_tensor *t[4];
  if (!targs(args, n, 5, 0, 4, "add_rmsnorm", t)) return NULL;
  double eps = PyFloat_AsDouble(args[4]);
  if (eps == -1.0 && PyErr_Occurred()) return NULL;
  PM_RUN("add_rmsnorm", add_rmsnorm, pm_host->add_rmsnorm(t[0], t[1], t[2], t[3], (float)eps));
}

static PyObject *op_matmul_many(PyObject *m, PyObject *const *args, Py_ssize_t n) {
  (void)m;
  if (n < 3 || n % 2 == 0 || (n - 1) / 2 > SERVD_DEVICE_MATMUL_MANY_MAX)
    return PyErr_Format(PyExc_TypeError,
                        "servd.ops.matmul_many(x, out0, w0, out1, w1, ...) takes x and 1 to %d (out, w) pairs "
                        "(%zd arguments given)",
                        SERVD_DEVICE_MATMUL_MANY_MAX, n);
  servd_tensor *t[1 + 2 * SERVD_DEVICE_MATMUL_MANY_MAX];
  if (!targs(args, n, n, 0, (int)n, "matmul_many", t)) return NULL;
  const int count = (int)(n - 1) / 2;
  servd_tensor *outs[SERVD_DEVICE_MATMUL_MANY_MAX];
  const servd_tensor *ws[SERVD_DEVICE_MATMUL_MANY_MAX];
  for (int i = 0; i < count; i++) {
    outs[i] = t[1 + 2 * i];
    ws[i] = t[2 + 2 * i];
  }
  PM_RUN("matmul_many", matmul_many, pm_host->matmul_many(count, outs, t[0], ws));
}

/* lora_sgmv(out, x, segs, abs): segs a sequence of (first, n, scale), abs as many ab tensors or None
 * (no adapter on that projection). */
static PyObject *op_lora_sgmv(PyObject *m, PyObject *const *args, Py_ssize_t n) {
  (void)m;
  servd_tensor *t[2];
  if (!targs(args, n, 4, 0, 2, "lora_sgmv", t)) return NULL;
  PyObject *segs = PySequence_Fast(args[2], "servd.ops.lora_sgmv: segs must be a sequence of (first, n, scale)");
  if (!segs) return NULL;
  PyObject *abs = PySequence_Fast(args[3], "servd.ops.lora_sgmv: abs must be a sequence of tensors or None");
  if (!abs) {
    Py_DECREF(segs);
    return NULL;
  }
  Py_ssize_t ns = PySequence_Fast_GET_SIZE(segs);
  servd_lora_seg stack[32], *sg = stack;
  PyObject *ret = NULL;
  if (PySequence_Fast_GET_SIZE(abs) != ns) {
    PyErr_Format(PyExc_ValueError, "servd.ops.lora_sgmv: %zd segments but %zd adapter tensors", ns,
                 PySequence_Fast_GET_SIZE(abs));
    goto done;
  }
  if (ns > (Py_ssize_t)(sizeof stack / sizeof stack[0]) && !(sg = PyMem_Malloc(sizeof *sg * (size_t)ns))) {
    PyErr_NoMemory();
    goto done;
  }
  for (Py_ssize_t i = 0; i < ns; i++) {
    long long first, rows;
    double scale;
    PyObject *ab = PySequence_Fast_GET_ITEM(abs, i);
    if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(segs, i), "LLd;servd.ops.lora_sgmv: a segment is (first, n, scale)",
                          &first, &rows, &scale))
      goto done;
    sg[i] = (servd_lora_seg){first, rows, NULL, (float)scale};
    if (ab != Py_None && !(sg[i].ab = targ(ab, 3, "lora_sgmv"))) goto done;
  }
  {
    int rc;
    Py_BEGIN_ALLOW_THREADS rc = pm_host->lora_sgmv(t[0], t[1], (int)ns, sg);
    Py_END_ALLOW_THREADS if (rc < 0) {
      pm_raise(rc, "servd.ops.lora_sgmv");
      goto done;
    }
  }
  ret = Py_None;
  Py_INCREF(ret);
done:
  if (sg != stack) PyMem_Free(sg);
  Py_DECREF(segs);
  Py_DECREF(abs);
  return ret;
}

static PyObject *op_softmax(PyObject *m, PyObject *args, PyObject *kw) {
  (void)m;
  static char *kwlist[] = {"x", "scale", NULL};
  PyObject *x;
  double scale = 1.0;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "O|d:softmax", kwlist, &x, &scale)) return NULL;
  servd_tensor *t0 = targ(x, 0, "softmax");
  if (!t0) return NULL;
  PM_RUN("softmax", softmax, pm_host->softmax(t0, (float)scale));
}

static PyObject *op_kv_write(PyObject *m, PyObject *const *args, Py_ssize_t n) {
  (void)m;
  if (!nargs_ok(n, 5, "kv_write")) return NULL;
  KVCacheObject *kv = kvarg(args[0], "kv_write");
  if (!kv) return NULL;
  int layer = pm_as_int(args[1]);
  if (layer == -1 && PyErr_Occurred()) return NULL;
  servd_tensor *t[3];
  if (!targs(args, n, 5, 2, 3, "kv_write", t)) return NULL; /* repeats the count check: harmless */
  /* a GPU rank's keys and values live in the device cache (the host one keeps the blocks only) */
  if (kv->dkv) PM_RUN("kv_write", device_kv_write, pm_host->device_kv_write(kv->dkv, layer, t[0], t[1], t[2]));
  PM_RUN("kv_write", kv_write, pm_host->kv_write(kv->kv, layer, t[0], t[1], t[2]));
}

static PyObject *op_attention(PyObject *m, PyObject *const *args, Py_ssize_t n) {
  (void)m;
  servd_tensor *t[2];
  /* an 8th argument is the sliding window (0: none) */
  if (!targs(args, n, n == 8 ? 8 : 7, 0, 2, "attention", t)) return NULL;
  KVCacheObject *kv = kvarg(args[2], "attention");
  if (!kv) return NULL;
  int layer = pm_as_int(args[3]);
  if (layer == -1 && PyErr_Occurred()) return NULL;
  if (!PyObject_TypeCheck(args[4], (PyTypeObject *)pm.batch_type)) {
    PyErr_SetString(PyExc_TypeError, "servd.ops.attention: argument 5 must be the servd.Batch of this step");
    return NULL;
  }
  BatchObject *b = (BatchObject *)args[4];
  if (!b->valid) {
    PyErr_SetString(PyExc_RuntimeError, "servd.ops.attention: this servd.Batch belongs to a finished step");
    return NULL;
  }
  int heads = pm_as_int(args[5]);
  if (heads == -1 && PyErr_Occurred()) return NULL;
  double scale = PyFloat_AsDouble(args[6]);
  if (scale == -1.0 && PyErr_Occurred()) return NULL;
  int window = n == 8 ? pm_as_int(args[7]) : 0;
  if (window == -1 && PyErr_Occurred()) return NULL;
  if (kv->dkv) {
    if (!b->dbatch) {
      PyErr_SetString(PyExc_ValueError, "servd.ops.attention: the cache is on a device but this servd.Batch has "
                                        "no device inputs");
      return NULL;
    }
    if (window)
      PM_RUN("attention", device_attention_window,
             pm_host->device_attention_window(t[0], t[1], kv->dkv, layer, b->dbatch, heads, (float)scale, window));
    PM_RUN("attention", device_attention,
           pm_host->device_attention(t[0], t[1], kv->dkv, layer, b->dbatch, heads, (float)scale));
  }
  if (window)
    PM_RUN("attention", attention_window,
           pm_host->attention_window(t[0], t[1], kv->kv, layer, &b->attn, heads, (float)scale, window));
  PM_RUN("attention", attention, pm_host->attention(t[0], t[1], kv->kv, layer, &b->attn, heads, (float)scale));
}

static PyObject *op_allreduce_sum(PyObject *m, PyObject *const *args, Py_ssize_t n) {
  (void)m;
  servd_tensor *t[1];
  if (!targs(args, n, 1, 0, 1, "allreduce", t)) return NULL;
  if (pm.world_size <= 1) Py_RETURN_NONE;
  if (t[0]->device >= 0) {
    if (!pm.dcomm)
      return PyErr_Format(PyExc_RuntimeError, "servd.ops.allreduce: world size %d but no device communicator",
                          pm.world_size);
    PM_RUN("allreduce", device_allreduce_sum, pm_host->device_allreduce_sum(pm.dcomm, pm.rank, t[0]));
  }
  if (!pm.comm) {
    PyErr_SetString(PyExc_RuntimeError, "servd.ops.allreduce: world size > 1 but no communicator");
    return NULL;
  }
  PM_RUN("allreduce", allreduce_sum, pm_host->allreduce_sum(pm.comm, pm.rank, t[0]));
}

static PyObject *op_allgather_cols(PyObject *m, PyObject *const *args, Py_ssize_t n) {
  (void)m;
  servd_tensor *t[2];
  if (!targs(args, n, 2, 0, 2, "allgather_cols", t)) return NULL;
  int on_device = t[0]->device >= 0 || t[1]->device >= 0;
  if (pm.world_size > 1 && on_device) {
    if (!pm.dcomm)
      return PyErr_Format(PyExc_RuntimeError, "servd.ops.allgather_cols: world size %d but no device communicator",
                          pm.world_size);
    PM_RUN("allgather_cols", device_allgather_cols, pm_host->device_allgather_cols(pm.dcomm, pm.rank, t[0], t[1]));
  }
  if (pm.world_size > 1 && pm.comm)
    PM_RUN("allgather_cols", allgather_cols, pm_host->allgather_cols(pm.comm, pm.rank, t[0], t[1]));
  /* one rank: the gather is a copy of the only shard (a device copy when it is on a device) */
  if (t[0]->ndim != t[1]->ndim || t[0]->ndim != 2 || t[0]->shape[0] != t[1]->shape[0] ||
      t[0]->shape[1] != t[1]->shape[1] || t[0]->dtype != SERVD_F32 || t[1]->dtype != SERVD_F32) {
    PyErr_SetString(PyExc_ValueError, "servd.ops.allgather_cols: out and x must be f32 (m,n) of one shape");
    return NULL;
  }
  if (t[0]->device != t[1]->device) {
    char a[24], b[24];
    return PyErr_Format(PyExc_ValueError, "servd.ops.allgather_cols: out is on %s but x is on %s",
                        pm_device_name(t[0]->device, a, sizeof a), pm_device_name(t[1]->device, b, sizeof b));
  }
  PM_RUN("allgather_cols", copy, pm_host->copy(t[0], t[1]));
}

/* ---- PY rows of servd/ops.def: the binding follows from the signature kind -------------------------
 * PM_BIND_<kind>(name): parses args[0..n) (servd.Tensors first, then the scalars) and runs the op. */
#define PM_BIND_T2(name) \
  servd_tensor *t[2]; \
  if (!targs(args, n, 2, 0, 2, #name, t)) return NULL; \
  PM_RUN(#name, name, pm_host->name(t[0], t[1]));
#define PM_BIND_T3(name) \
  servd_tensor *t[3]; \
  if (!targs(args, n, 3, 0, 3, #name, t)) return NULL; \
  PM_RUN(#name, name, pm_host->name(t[0], t[1], t[2]));
#define PM_BIND_T3F(name) \
  servd_tensor *t[3]; \
  if (!targs(args, n, 4, 0, 3, #name, t)) return NULL; \
  double f = PyFloat_AsDouble(args[3]); \
  if (f == -1.0 && PyErr_Occurred()) return NULL; \
  PM_RUN(#name, name, pm_host->name(t[0], t[1], t[2], (float)f));
#define PM_BIND_TOPK(name) \
  servd_tensor *t[3]; \
  if (!targs(args, n, 4, 0, 3, #name, t)) return NULL; \
  int k = pm_as_int(args[3]); \
  if (k == -1 && PyErr_Occurred()) return NULL; \
  PM_RUN(#name, name, pm_host->name(t[0], t[1], t[2], k));

#define SERVD_OP(name, dispatch, py, sig, names) \
  SERVD__IF_PY_##py(static PyObject *op_##name(PyObject *m, PyObject *const *args, Py_ssize_t n) { \
    (void)m; \
    PM_BIND_##sig(name) \
  })
#include "servd/ops.def"
#undef SERVD_OP

#define FAST(name, fn, doc) \
  { name, (PyCFunction)(void (*)(void))fn, METH_FASTCALL, doc }
#define KW(name, fn, doc) \
  { name, (PyCFunction)(void (*)(void))fn, METH_VARARGS | METH_KEYWORDS, doc }

/* "matmul(out, x, w)": the row's parameter names */
#define PM_STR_(x) #x
#define PM_STR(x) PM_STR_(x)
static PyMethodDef ops_methods[] = {
#define SERVD_OP(name, dispatch, py, sig, names) SERVD__IF_PY_##py(FAST(#name, op_##name, #name PM_STR(names)), )
#include "servd/ops.def"
#undef SERVD_OP
    {NULL, NULL, 0, NULL},
};

/* PYHAND rows: one entry each (a row without its op_<name> does not compile). */
static PyMethodDef hand_methods[] = {
    KW("embedding", op_embedding, "embedding(out, table, ids, row_offset=0)"),
    FAST("rope", op_rope, "rope(x, positions, rope): in place"),
    KW("softmax", op_softmax, "softmax(x, scale=1.0): rows, in place"),
    FAST("kv_write", op_kv_write, "kv_write(kv, layer, k, v, slots)"),
    FAST("attention", op_attention, "attention(out, q, kv, layer, batch, n_heads, scale, window=0)"),
    FAST("allreduce", op_allreduce_sum, "allreduce(x): sum over the tensor-parallel ranks, in place"),
    FAST("allgather_cols", op_allgather_cols, "allgather_cols(out, x)"),
    FAST("add_rmsnorm", op_add_rmsnorm, "add_rmsnorm(x, o, out, weight, eps): x += o; out = rmsnorm(x) * weight"),
    FAST("matmul_many", op_matmul_many,
         "matmul_many(x, out0, w0, out1, w1, ...): out_i = x @ w_i^T for 1 to 4 weights (one launch on a GPU)"),
    FAST("lora_sgmv", op_lora_sgmv,
         "lora_sgmv(out, x, segs, abs): out[rows] += scale * (x[rows] A^T) B^T per segment (first, n, scale) "
         "with its ab (or None)"),
    {NULL, NULL, 0, NULL},
};
/* Every PYHAND row has its binding (an op_<name> missing does not compile), and the hand table lists
 * as many: the static assertion catches a row added without its entry. */
#define SERVD_OP(name, dispatch, py, sig, names) SERVD__IF_PYHAND_##py((void (*)(void))op_##name, )
static void (*const hand_bindings[])(void) = {
#include "servd/ops.def"
};
#undef SERVD_OP
_Static_assert(sizeof hand_methods / sizeof hand_methods[0] == sizeof hand_bindings / sizeof hand_bindings[0] + 1,
               "interp/pymod/ops.c: hand_methods must list every PYHAND row of servd/ops.def");

int pm_ops_init(PyObject *module) {
  PyObject *ops = PyModule_New("servd.ops");
  if (!ops) return -1;
  if (PyModule_AddFunctions(ops, ops_methods) < 0 || PyModule_AddFunctions(ops, hand_methods) < 0 ||
      PyModule_AddObjectRef(module, "ops", ops) < 0) {
    Py_DECREF(ops);
    return -1;
  }
  /* `import servd.ops` works too */
  PyObject *mods = PyImport_GetModuleDict();
  int rc = PyDict_SetItemString(mods, "servd.ops", ops);
  Py_DECREF(ops);
  return rc;
}
