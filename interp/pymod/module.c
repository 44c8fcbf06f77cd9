/* The servd module: Rope, KVCache, Batch, the package object, rank/world_size/device. */
#include "pymod.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

const servd_host_api *pm_host;
const servd_guest_config *pm_cfg;
pm_state pm;

/* ---- servd.Rope ---- */

/* A sequence of head_dim/2 positive finite floats into out; -1 with a ValueError naming `what`. */
static int rope_table(PyObject *seq, int head_dim, const char *what, float *out) {
  PyObject *f = PySequence_Fast(seq, "servd.Rope: an inverse-frequency table must be a sequence of floats");
  if (!f) return -1;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(f);
  int rc = 0;
  if (n != head_dim / 2 || head_dim > 2 * SERVD_ROPE_TABLE_MAX) {
    PyErr_Format(PyExc_ValueError, "servd.Rope: %s has %zd values, expected head_dim/2 = %d (head_dim <= %d)", what, n,
                 head_dim / 2, 2 * SERVD_ROPE_TABLE_MAX);
    rc = -1;
  }
  for (Py_ssize_t i = 0; i < n && !rc; i++) {
    double v = PyFloat_AsDouble(PySequence_Fast_GET_ITEM(f, i));
    if (v == -1.0 && PyErr_Occurred()) rc = -1;
    else if (!(v > 0.0) || !isfinite(v)) {
      PyErr_Format(PyExc_ValueError, "servd.Rope: %s[%zd] = %g, expected a positive finite value", what, i, v);
      rc = -1;
    } else out[i] = (float)v;
  }
  Py_DECREF(f);
  return rc;
}

static PyObject *rope_new(PyTypeObject *tp, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"layout",
                           "head_dim",
                           "theta",
                           "factor",
                           "low_freq_factor",
                           "high_freq_factor",
                           "original_max_positions",
                           "inv_freq",
                           "inv_freq_long",
                           "long_from",
                           "attn_factor",
                           NULL};
  const char *layout;
  int head_dim, orig = 8192, long_from = 0;
  double theta, factor = 1.0, lo = 1.0, hi = 4.0, attn = 0.0;
  PyObject *inv = Py_None, *inv_long = Py_None;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "sid|dddiOOid:Rope", kwlist, &layout, &head_dim, &theta, &factor, &lo, &hi,
                                   &orig, &inv, &inv_long, &long_from, &attn))
    return NULL;
  servd_rope_layout l;
  if (!strcmp(layout, "half")) l = SERVD_ROPE_HALF;
  else if (!strcmp(layout, "interleaved")) l = SERVD_ROPE_INTERLEAVED;
  else {
    PyErr_Format(PyExc_ValueError, "servd.Rope: layout must be \"half\" or \"interleaved\", not \"%s\"", layout);
    return NULL;
  }
  if (head_dim <= 0 || head_dim % 2 || theta <= 0) {
    PyErr_Format(PyExc_ValueError, "servd.Rope: head_dim %d must be even and positive, theta %g positive", head_dim,
                 theta);
    return NULL;
  }
  if ((inv_long != Py_None && (inv == Py_None || long_from < 0)) || !(attn >= 0.0) || !isfinite(attn)) {
    PyErr_SetString(PyExc_ValueError, "servd.Rope: inv_freq_long needs inv_freq and long_from >= 0; attn_factor "
                                      "must be finite and >= 0");
    return NULL;
  }
  RopeObject *o = (RopeObject *)tp->tp_alloc(tp, 0);
  if (!o) return NULL;
  o->p = (servd_rope_params){.layout = l,
                             .head_dim = head_dim,
                             .theta = (float)theta,
                             .scaling_factor = (float)factor,
                             .low_freq_factor = (float)lo,
                             .high_freq_factor = (float)hi,
                             .original_max_positions = orig,
                             .long_from = long_from,
                             .attn_factor = (float)attn};
  if ((inv != Py_None && rope_table(inv, head_dim, "inv_freq", o->inv)) ||
      (inv_long != Py_None && rope_table(inv_long, head_dim, "inv_freq_long", o->inv_long))) {
    Py_DECREF(o);
    return NULL;
  }
  o->p.inv_freq = inv != Py_None ? o->inv : NULL;
  o->p.inv_freq_long = inv_long != Py_None ? o->inv_long : NULL;
  return (PyObject *)o;
}

static void plain_dealloc(PyObject *self) {
  PyTypeObject *tp = Py_TYPE(self);
  tp->tp_free(self);
  Py_DECREF(tp);
}

static PyObject *rope_repr(RopeObject *self) {
  char buf[128];
  snprintf(buf, sizeof buf, "servd.Rope(%s, head_dim=%d, theta=%g, factor=%g)",
           self->p.layout == SERVD_ROPE_HALF ? "half" : "interleaved", self->p.head_dim, self->p.theta,
           self->p.scaling_factor);
  return PyUnicode_FromString(buf);
}

static PyType_Slot rope_slots[] = {
    {Py_tp_new, rope_new},
    {Py_tp_dealloc, plain_dealloc},
    {Py_tp_repr, rope_repr},
    {Py_tp_doc, "Rope(layout, head_dim, theta, factor=1.0, low_freq_factor=1.0, high_freq_factor=4.0, "
                "original_max_positions=8192, inv_freq=None, inv_freq_long=None, long_from=0, attn_factor=0.0)"},
    {0, NULL},
};
static PyType_Spec rope_spec = {"servd.Rope", sizeof(RopeObject), 0, Py_TPFLAGS_DEFAULT, rope_slots};

/* ---- servd.KVCache (a handle the engine passes in batch.kv) ---- */

static PyObject *kv_device(KVCacheObject *self, void *c) {
  (void)c;
  char buf[24];
  return PyUnicode_FromString(pm_device_name(self->dkv ? pm_host->device_kv_device(self->dkv) : -1, buf, sizeof buf));
}

static PyObject *kv_repr(KVCacheObject *self) {
  char buf[24];
  return PyUnicode_FromFormat("servd.KVCache(%s)",
                              pm_device_name(self->dkv ? pm_host->device_kv_device(self->dkv) : -1, buf, sizeof buf));
}

static PyGetSetDef kv_getset[] = {
    {"device", (getter)kv_device, NULL, "where the keys and values are: \"cpu\" or \"cuda:N\"", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot kv_slots[] = {
    {Py_tp_dealloc, plain_dealloc},
    {Py_tp_getset, kv_getset},
    {Py_tp_repr, kv_repr},
    {Py_tp_doc, "The KV cache of this rank (from batch.kv)."},
    {0, NULL},
};
static PyType_Spec kv_spec = {"servd.KVCache", sizeof(KVCacheObject), 0,
                              Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION, kv_slots};

/* ---- servd.Batch ---- */

static void batch_dealloc(BatchObject *self) {
  PyTypeObject *tp = Py_TYPE(self);
  Py_CLEAR(self->dict);
  tp->tp_free((PyObject *)self);
  Py_DECREF(tp);
}

static PyObject *batch_getattro(BatchObject *self, PyObject *name) {
  PyObject *v = self->dict ? PyDict_GetItemWithError(self->dict, name) : NULL;
  if (v) return Py_NewRef(v);
  if (PyErr_Occurred()) return NULL;
  return PyObject_GenericGetAttr((PyObject *)self, name);
}

static PyObject *batch_repr(BatchObject *self) {
  return PyUnicode_FromFormat("servd.Batch(n_seqs=%d%s)", self->attn.n_seqs, self->valid ? "" : ", finished");
}

static PyType_Slot batch_slots[] = {
    {Py_tp_dealloc, batch_dealloc},
    {Py_tp_getattro, batch_getattro},
    {Py_tp_repr, batch_repr},
    {Py_tp_doc, "One forward step: n_tokens, tokens, positions, slots, logit_rows, kv, n_seqs, max_tokens, "
                "max_seqs, hidden, scores, lora, token_types, seq_offsets and whole_seqs (CPU)."},
    {0, NULL},
};
static PyType_Spec batch_spec = {"servd.Batch", sizeof(BatchObject), 0,
                                 Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION, batch_slots};

/* A small i32 copy of an engine array: the step's arrays are reused by the engine after the call,
 * and a copy of n_tokens ints costs nothing next to the step. */
static PyObject *i32_tensor(const int32_t *src, int n) {
  int64_t shape[1] = {n};
  servd_tensor *t = pm_host->tensor_new(SERVD_I32, 1, shape);
  if (!t) return pm_raise(SERVD_ENOMEM, "servd.Batch");
  if (n > 0 && src) memcpy(pm_tensor_data(t), src, sizeof(int32_t) * (size_t)n);
  return pm_tensor_wrap(t);
}

/* Sequence boundaries for encoders, whose attention stays within a sequence and needs all of it:
 * offsets i32 (n_seqs + 1), sequence s being rows offsets[s] .. offsets[s+1]; and whether every
 * sequence is whole in this step (its rows are in order, back to back, and are all its tokens). */
static PyObject *seq_offsets(const servd_forward_batch *b, bool *whole) {
  const servd_attn_batch *at = &b->attn;
  int n = at->n_seqs > 0 && at->q_start && at->q_len ? at->n_seqs : 0;
  int32_t *off = malloc(sizeof(int32_t) * (size_t)(n + 1));
  if (!off) return pm_raise(SERVD_ENOMEM, "servd.Batch");
  *whole = true;
  for (int s = 0; s < n; s++) {
    off[s] = at->q_start[s];
    int end = at->q_start[s] + at->q_len[s], next = s + 1 < n ? at->q_start[s + 1] : b->n_tokens;
    if (end != next || (at->kv_len && at->kv_len[s] != at->q_len[s])) *whole = false;
  }
  off[n] = b->n_tokens;
  if (n == 0 && b->n_tokens) *whole = false;
  PyObject *t = i32_tensor(off, n + 1);
  free(off);
  return t;
}

/* One i32 input of the step: on a GPU rank a view of the uploaded device inputs (the buffers stay
 * at one address, which CUDA graphs rely on), on the CPU a host copy. */
static PyObject *batch_i32(const servd_forward_batch *b, servd_device_batch_field f, const int32_t *src, int n) {
  if (b->host_inputs[f]) { /* a plan capture's inputs: the nodes it records name them */
    pm_host->tensor_retain(b->host_inputs[f]);
    return pm_tensor_wrap(b->host_inputs[f]);
  }
  if (!b->dbatch) return i32_tensor(src, n);
  servd_tensor *t = pm_host->device_batch_tensor(b->dbatch, f);
  return t ? pm_tensor_wrap(t) : pm_raise(SERVD_EDEVICE, "servd.Batch");
}

static int set_item(PyObject *d, const char *k, PyObject *v) {
  if (!v) return -1;
  int rc = PyDict_SetItemString(d, k, v);
  Py_DECREF(v);
  return rc;
}

/* batch.lora: [(first, n, scale, abs)] per adapter group, abs a tuple of n_layers * 7 tensors or
 * None (q k v o gate up down per layer). The tuples are kept per adapter id, so a step wraps only
 * the weights of adapters it has not seen; ids of adapters absent from a step are dropped once more
 * than a few are kept (an id is never reused, so a kept tuple is never stale). */
static PyObject *lora_abs_cache;

static PyObject *lora_abs(const servd_lora_group *g) {
  PyObject *key = PyLong_FromLongLong(g->id);
  if (!key) return NULL;
  PyObject *t = PyDict_GetItemWithError(lora_abs_cache, key);
  if (t || PyErr_Occurred()) {
    Py_DECREF(key);
    return t ? Py_NewRef(t) : NULL;
  }
  int n = g->n_layers * 7;
  if (!(t = PyTuple_New(n))) goto fail;
  for (int i = 0; i < n; i++) {
    PyObject *w = Py_None;
    if (g->ab[i]) {
      pm_host->tensor_retain(g->ab[i]);
      if (!(w = pm_tensor_wrap(g->ab[i]))) goto fail;
    } else {
      Py_INCREF(w);
    }
    PyTuple_SET_ITEM(t, i, w);
  }
  if (PyDict_SetItem(lora_abs_cache, key, t) < 0) goto fail;
  Py_DECREF(key);
  return t;
fail:
  Py_DECREF(key);
  Py_XDECREF(t);
  return NULL;
}

static PyObject *batch_lora(const servd_forward_batch *b) {
  if (!lora_abs_cache && !(lora_abs_cache = PyDict_New())) return NULL;
  if (PyDict_Size(lora_abs_cache) > 16 + 2 * b->n_lora) PyDict_Clear(lora_abs_cache);
  PyObject *l = PyList_New(b->n_lora);
  for (int i = 0; l && i < b->n_lora; i++) {
    const servd_lora_group *g = &b->lora[i];
    PyObject *abs = lora_abs(g), *it = abs ? Py_BuildValue("(iidN)", g->first, g->n, (double)g->scale, abs) : NULL;
    if (!it) {
      Py_CLEAR(l);
      break;
    }
    PyList_SET_ITEM(l, i, it);
  }
  return l;
}

PyObject *pm_batch_new(const servd_forward_batch *b) {
  PyTypeObject *tp = (PyTypeObject *)pm.batch_type;
  BatchObject *o = (BatchObject *)tp->tp_alloc(tp, 0);
  if (!o) return NULL;
  o->dict = PyDict_New();
  if (!o->dict) goto fail;
  o->attn = b->attn;
  o->dbatch = b->dbatch;
  o->valid = 1;
  if (set_item(o->dict, "n_tokens", PyLong_FromLong(b->n_tokens)) < 0 ||
      set_item(o->dict, "tokens", batch_i32(b, SERVD_DB_TOKENS, b->tokens, b->n_tokens)) < 0 ||
      set_item(o->dict, "positions", batch_i32(b, SERVD_DB_POSITIONS, b->positions, b->n_tokens)) < 0 ||
      set_item(o->dict, "slots", batch_i32(b, SERVD_DB_SLOTS, b->slots, b->n_tokens)) < 0 ||
      set_item(o->dict, "logit_rows", batch_i32(b, SERVD_DB_LOGIT_ROWS, b->logit_rows, b->n_logit_rows)) < 0 ||
      set_item(o->dict, "n_seqs", PyLong_FromLong(b->attn.n_seqs)) < 0 ||
      set_item(o->dict, "max_tokens", PyLong_FromLong(b->max_tokens > 0 ? b->max_tokens : 0)) < 0 ||
      set_item(o->dict, "max_seqs", PyLong_FromLong(b->max_seqs > 0 ? b->max_seqs : 0)) < 0 ||
      set_item(o->dict, "hidden", PyBool_FromLong(b->want_hidden)) < 0 ||
      set_item(o->dict, "scores", PyBool_FromLong(b->want_scores)) < 0 || set_item(o->dict, "lora", batch_lora(b)) < 0)
    goto fail;
  /* Token types only where the model reads host arrays (encoders run on the CPU). */
  if (b->token_types && !b->dbatch ? set_item(o->dict, "token_types", i32_tensor(b->token_types, b->n_tokens)) < 0
                                   : PyDict_SetItemString(o->dict, "token_types", Py_None) < 0)
    goto fail;
  bool whole = false;
  if (!b->dbatch && (set_item(o->dict, "seq_offsets", seq_offsets(b, &whole)) < 0 ||
                     set_item(o->dict, "whole_seqs", PyBool_FromLong(whole)) < 0))
    goto fail;
  if (b->kv || b->dkv) {
    PyTypeObject *kt = (PyTypeObject *)pm.kv_type;
    KVCacheObject *kv = (KVCacheObject *)kt->tp_alloc(kt, 0);
    if (!kv) goto fail;
    kv->kv = b->kv;
    kv->dkv = b->dkv;
    if (set_item(o->dict, "kv", (PyObject *)kv) < 0) goto fail;
  } else if (PyDict_SetItemString(o->dict, "kv", Py_None) < 0) {
    goto fail;
  }
  return (PyObject *)o;
fail:
  Py_DECREF(o);
  return NULL;
}

void pm_batch_invalidate(PyObject *batch) {
  if (batch) ((BatchObject *)batch)->valid = 0;
}

/* ---- servd.package ---- */

typedef struct PackageObject {
  PyObject_HEAD PyObject *manifest; /* dict, loaded on first use */
  PyObject *tensors;                /* name -> Tensor, so every caller shares one view object */
} PackageObject;

static void package_dealloc(PackageObject *self) {
  PyTypeObject *tp = Py_TYPE(self);
  Py_CLEAR(self->manifest);
  Py_CLEAR(self->tensors);
  tp->tp_free((PyObject *)self);
  Py_DECREF(tp);
}

static int need_pkg(void) {
  if (pm.pkg && pm_host->pkg_file) return 0;
  PyErr_SetString(PyExc_RuntimeError, "servd.package: this interpreter has no package");
  return -1;
}

static PyObject *package_manifest(PackageObject *self, void *c) {
  (void)c;
  if (self->manifest) return Py_NewRef(self->manifest);
  if (need_pkg() < 0) return NULL;
  char *text = pm_host->pkg_manifest_json(pm.pkg);
  if (!text) return pm_raise(SERVD_EFORMAT, "servd.package.manifest");
  PyObject *json = PyImport_ImportModule("json");
  PyObject *d = json ? PyObject_CallMethod(json, "loads", "s", text) : NULL;
  Py_XDECREF(json);
  pm_host->free(text);
  if (!d) return NULL;
  self->manifest = d;
  return Py_NewRef(d);
}

static PyObject *package_config(PackageObject *self, void *c) {
  PyObject *m = package_manifest(self, c);
  if (!m) return NULL;
  PyObject *cfg = PyDict_Check(m) ? PyDict_GetItemString(m, "config") : NULL;
  if (!cfg) cfg = Py_None;
  Py_INCREF(cfg);
  Py_DECREF(m);
  if (cfg == Py_None) {
    Py_DECREF(cfg);
    return PyDict_New();
  }
  return cfg;
}

static PyObject *package_tensor(PackageObject *self, PyObject *name) {
  if (need_pkg() < 0) return NULL;
  if (!PyUnicode_Check(name)) {
    PyErr_SetString(PyExc_TypeError, "servd.package.tensor(name): name must be a str");
    return NULL;
  }
  PyObject *hit = PyDict_GetItemWithError(self->tensors, name);
  if (hit) return Py_NewRef(hit);
  if (PyErr_Occurred()) return NULL;
  servd_tensor *t = NULL;
  int rc = pm_host->pkg_tensor(pm.pkg, PyUnicode_AsUTF8(name), &t);
  if (rc < 0) {
    PyErr_Format(PyExc_KeyError, "servd.package.tensor: %s", pm_host->last_error());
    return NULL;
  }
  PyObject *o = pm_tensor_wrap(t);
  if (!o || PyDict_SetItem(self->tensors, name, o) < 0) {
    Py_XDECREF(o);
    return NULL;
  }
  return o;
}

static PyObject *package_tensor_names(PackageObject *self, PyObject *unused) {
  (void)self, (void)unused;
  if (need_pkg() < 0) return NULL;
  int n = pm_host->pkg_tensor_count(pm.pkg);
  PyObject *l = PyList_New(n > 0 ? n : 0);
  for (int i = 0; l && i < n; i++) {
    PyObject *s = PyUnicode_FromString(pm_host->pkg_tensor_name(pm.pkg, i));
    if (!s) {
      Py_CLEAR(l);
      break;
    }
    PyList_SET_ITEM(l, i, s);
  }
  return l;
}

static PyObject *package_file_names(PackageObject *self, PyObject *unused) {
  (void)self, (void)unused;
  if (need_pkg() < 0) return NULL;
  int n = pm_host->pkg_file_count(pm.pkg);
  PyObject *l = PyList_New(n > 0 ? n : 0);
  for (int i = 0; l && i < n; i++) {
    PyObject *s = PyUnicode_FromString(pm_host->pkg_file_path(pm.pkg, i));
    if (!s) {
      Py_CLEAR(l);
      break;
    }
    PyList_SET_ITEM(l, i, s);
  }
  return l;
}

static PyObject *package_read_file(PackageObject *self, PyObject *arg) {
  (void)self;
  if (need_pkg() < 0) return NULL;
  const char *path = PyUnicode_AsUTF8(arg);
  if (!path) return NULL;
  const void *data;
  size_t len;
  if (pm_host->pkg_file(pm.pkg, path, &data, &len) < 0) {
    PyErr_Format(PyExc_FileNotFoundError, "servd.package.read_file: %s", pm_host->last_error());
    return NULL;
  }
  return PyBytes_FromStringAndSize(data, (Py_ssize_t)len);
}

static PyGetSetDef package_getset[] = {
    {"manifest", (getter)package_manifest, NULL, "the package manifest (dict)", NULL},
    {"config", (getter)package_config, NULL, "the model config of the manifest (dict)", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef package_methods[] = {
    {"tensor", (PyCFunction)package_tensor, METH_O, "tensor(name): view into the mapped package"},
    {"tensor_names", (PyCFunction)package_tensor_names, METH_NOARGS, "names of the package's tensors"},
    {"file_names", (PyCFunction)package_file_names, METH_NOARGS, "paths of the package's entries"},
    {"read_file", (PyCFunction)package_read_file, METH_O, "read_file(path): bytes of an entry"},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot package_slots[] = {
    {Py_tp_dealloc, package_dealloc},
    {Py_tp_getset, package_getset},
    {Py_tp_methods, package_methods},
    {Py_tp_doc, "The package this interpreter serves."},
    {0, NULL},
};
static PyType_Spec package_spec = {"servd.Package", sizeof(PackageObject), 0,
                                   Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION, package_slots};

/* ---- module ---- */

static PyObject *m_rank(PyObject *m, PyObject *u) {
  (void)m, (void)u;
  return PyLong_FromLong(pm.rank);
}
static PyObject *m_world_size(PyObject *m, PyObject *u) {
  (void)m, (void)u;
  return PyLong_FromLong(pm.world_size);
}
static PyObject *m_device(PyObject *m, PyObject *u) {
  (void)m, (void)u;
  if (pm.device < 0) return PyUnicode_FromString("cpu");
  return PyUnicode_FromFormat("cuda:%d", pm.device);
}
/* Waits for the device work this thread enqueued (no-op on the CPU): needed before a device tensor
 * written here is read by a call on another thread. */
static PyObject *m_sync(PyObject *m, PyObject *u) {
  (void)m, (void)u;
  if (pm.device < 0) Py_RETURN_NONE;
  int rc;
  Py_BEGIN_ALLOW_THREADS rc = pm_host->device_sync(pm.device);
  Py_END_ALLOW_THREADS if (rc < 0) return pm_raise(rc, "servd.sync");
  Py_RETURN_NONE;
}

static PyObject *m_interpreter_index(PyObject *m, PyObject *u) {
  (void)m, (void)u;
  return PyLong_FromLong(pm.index);
}

static PyMethodDef module_methods[] = {
    {"rank", m_rank, METH_NOARGS, "tensor-parallel rank of this interpreter"},
    {"world_size", m_world_size, METH_NOARGS, "number of tensor-parallel ranks"},
    {"device", m_device, METH_NOARGS, "\"cpu\" or \"cuda:N\""},
    {"interpreter_index", m_interpreter_index, METH_NOARGS, "index of this interpreter in its pool"},
    {"sync", m_sync, METH_NOARGS, "waits for the device work of this thread (no-op on the CPU)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef servd_module = {
    PyModuleDef_HEAD_INIT,
    "servd",
    "servd: tensors, native ops and the package, shared with the host.",
    -1,
    module_methods,
    NULL,
    NULL,
    NULL,
    NULL,
};

static int add_type(PyObject *m, PyType_Spec *spec, const char *name, PyObject **slot) {
  *slot = PyType_FromModuleAndSpec(m, spec, NULL);
  return *slot ? PyModule_AddObjectRef(m, name, *slot) : -1;
}

PyMODINIT_FUNC PyInit_servd(void) {
  PyObject *m = PyModule_Create(&servd_module);
  if (!m) return NULL;
  if (pm_tensor_types_init(m) < 0 || add_type(m, &rope_spec, "Rope", &pm.rope_type) < 0 ||
      add_type(m, &kv_spec, "KVCache", &pm.kv_type) < 0 || add_type(m, &batch_spec, "Batch", &pm.batch_type) < 0 ||
      add_type(m, &package_spec, "Package", &pm.package_type) < 0 || pm_ops_init(m) < 0)
    goto fail;
  PyTypeObject *pt = (PyTypeObject *)pm.package_type;
  PackageObject *p = (PackageObject *)pt->tp_alloc(pt, 0);
  if (!p) goto fail;
  p->tensors = PyDict_New();
  if (!p->tensors || PyModule_AddObject(m, "package", (PyObject *)p) < 0) {
    Py_DECREF(p);
    goto fail;
  }
  pm.module = m;
  return m;
fail:
  Py_DECREF(m);
  return NULL;
}
