/* servd.Tensor: a Python handle on one reference of a servd_tensor (host or device); servd.empty,
 * servd.tensor, and the moves between host and device (upload, to_device, to_host, copy). */
#include "pymod.h"

#include <string.h>

PyObject *pm_raise(int code, const char *op) {
  const char *msg = pm_host->last_error();
  PyObject *type = PyExc_RuntimeError;
  switch (code) {
  case SERVD_EINVAL: type = PyExc_ValueError; break;
  case SERVD_ERANGE: type = PyExc_IndexError; break;
  case SERVD_ENOMEM: type = PyExc_MemoryError; break;
  case SERVD_EUNSUPPORTED: type = PyExc_NotImplementedError; break;
  case SERVD_ETIMEDOUT: type = PyExc_TimeoutError; break;
  default: break;
  }
  PyErr_Format(type, "%s: %s", op, msg && *msg ? msg : "failed");
  return NULL;
}

const char *pm_device_name(int device, char *buf, size_t cap) {
  if (device < 0) snprintf(buf, cap, "cpu");
  else snprintf(buf, cap, "cuda:%d", device);
  return buf;
}

int pm_host_only(const servd_tensor *t, PyObject *exc, const char *what) {
  if (t->device < 0) return 0;
  PyErr_Format(exc, "%s is on cuda:%d: copy it to the host with .to_host()", what, t->device);
  return -1;
}

PyObject *pm_tensor_wrap(servd_tensor *t) {
  if (!t) return pm_raise(SERVD_ENOMEM, "tensor");
  TensorObject *o = PyObject_New(TensorObject, (PyTypeObject *)pm.tensor_type);
  if (!o) {
    pm_host->tensor_release(t);
    return NULL;
  }
  o->t = t;
  return (PyObject *)o;
}

static void tensor_dealloc(TensorObject *self) {
  PyTypeObject *tp = Py_TYPE(self);
  pm_host->tensor_release(self->t);
  self->t = NULL;
  PyObject_Free(self);
  Py_DECREF(tp); /* heap type instances own a reference to their type */
}

static PyObject *tensor_shape(TensorObject *self, void *c) {
  (void)c;
  PyObject *tup = PyTuple_New(self->t->ndim);
  if (!tup) return NULL;
  for (int i = 0; i < self->t->ndim; i++) PyTuple_SET_ITEM(tup, i, PyLong_FromLongLong(self->t->shape[i]));
  return tup;
}

static PyObject *tensor_dtype(TensorObject *self, void *c) {
  (void)c;
  return PyUnicode_FromString(pm_host->dtype_name(self->t->dtype));
}

static PyObject *tensor_device(TensorObject *self, void *c) {
  (void)c;
  if (self->t->device < 0) return PyUnicode_FromString("cpu");
  return PyUnicode_FromFormat("cuda:%d", self->t->device);
}

static PyObject *tensor_ndim(TensorObject *self, void *c) {
  (void)c;
  return PyLong_FromLong(self->t->ndim);
}

static Py_ssize_t tensor_len(TensorObject *self) {
  if (self->t->ndim == 0) {
    PyErr_SetString(PyExc_TypeError, "len() of a 0-d tensor");
    return -1;
  }
  return (Py_ssize_t)self->t->shape[0];
}

static PyObject *tensor_repr(TensorObject *self) {
  char buf[160];
  int n = snprintf(buf, sizeof buf, "servd.Tensor(%s[", pm_host->dtype_name(self->t->dtype));
  for (int i = 0; i < self->t->ndim && n < (int)sizeof buf - 32; i++)
    n += snprintf(buf + n, sizeof buf - (size_t)n, i ? ",%lld" : "%lld", (long long)self->t->shape[i]);
  if (self->t->device < 0) snprintf(buf + n, sizeof buf - (size_t)n, "], cpu)");
  else snprintf(buf + n, sizeof buf - (size_t)n, "], cuda:%d)", self->t->device);
  return PyUnicode_FromString(buf);
}

/* ---- buffer protocol (host tensors) ---- */

static const char *buffer_format(servd_dtype d) {
  switch (d) {
  case SERVD_F32: return "f";
  case SERVD_F16: return "e";
  case SERVD_I32: return "i";
  default: return NULL; /* bf16 and block dtypes: flat bytes */
  }
}

static int tensor_getbuffer(TensorObject *self, Py_buffer *view, int flags) {
  const servd_tensor *t = self->t;
  if (pm_host_only(t, PyExc_BufferError, "servd.Tensor") < 0) return -1;
  /* Weights are mapped read-only from the package: only owned storage is writable. */
  int readonly = pm_host->storage_get_kind(t->storage) != SERVD_STORAGE_OWNED;
  if ((flags & PyBUF_WRITABLE) && readonly) {
    PyErr_SetString(PyExc_BufferError, "Tensor is read-only (borrowed storage, e.g. package weights)");
    return -1;
  }
  const char *fmt = buffer_format(t->dtype);
  Py_ssize_t *dims = PyMem_Malloc(sizeof(Py_ssize_t) * 2 * SERVD_MAX_DIMS);
  if (!dims) {
    PyErr_NoMemory();
    return -1;
  }
  view->buf = pm_tensor_data(t);
  view->readonly = readonly;
  view->suboffsets = NULL;
  view->internal = dims;
  if (fmt) {
    size_t esz = pm_host->dtype_block_bytes(t->dtype);
    view->itemsize = (Py_ssize_t)esz;
    view->format = (flags & PyBUF_FORMAT) ? (char *)fmt : NULL;
    view->ndim = t->ndim;
    view->shape = dims;
    view->strides = dims + SERVD_MAX_DIMS;
    Py_ssize_t n = 1;
    for (int i = 0; i < t->ndim; i++) {
      dims[i] = (Py_ssize_t)t->shape[i];
      dims[SERVD_MAX_DIMS + i] = (Py_ssize_t)t->strides[i];
      n *= dims[i];
    }
    view->len = n * view->itemsize;
    int contiguous = pm_host->tensor_is_contiguous(t);
    if (!contiguous && !(flags & PyBUF_STRIDES)) {
      PyMem_Free(dims);
      PyErr_SetString(PyExc_BufferError, "Tensor is not contiguous; ask for a strided buffer");
      return -1;
    }
  } else {
    if (!pm_host->tensor_is_contiguous(t)) {
      PyMem_Free(dims);
      PyErr_SetString(PyExc_BufferError, "bf16/quantized Tensor must be contiguous to export its bytes");
      return -1;
    }
    view->itemsize = 1;
    view->format = (flags & PyBUF_FORMAT) ? "B" : NULL;
    view->ndim = 1;
    dims[0] = (Py_ssize_t)pm_host->tensor_nbytes(t);
    dims[SERVD_MAX_DIMS] = 1;
    view->shape = dims;
    view->strides = dims + SERVD_MAX_DIMS;
    view->len = dims[0];
  }
  view->obj = Py_NewRef((PyObject *)self); /* keeps the host tensor alive while exported */
  return 0;
}

static void tensor_releasebuffer(TensorObject *self, Py_buffer *view) {
  (void)self;
  PyMem_Free(view->internal);
  view->internal = NULL;
}

/* ---- tolist ---- */

static PyObject *element(const servd_tensor *t, const char *p) {
  switch (t->dtype) {
  case SERVD_F32: {
    float v;
    memcpy(&v, p, 4);
    return PyFloat_FromDouble(v);
  }
  case SERVD_I32: {
    int32_t v;
    memcpy(&v, p, 4);
    return PyLong_FromLong(v);
  }
  case SERVD_F16: {
    float v;
    if (pm_host->row_to_f32(SERVD_F16, p, &v, 1) < 0) return pm_raise(SERVD_EINVAL, "tolist");
    return PyFloat_FromDouble(v);
  }
  case SERVD_BF16: {
    uint16_t h;
    memcpy(&h, p, 2);
    return PyFloat_FromDouble(servd_bf16_to_f32(h));
  }
  default: return NULL;
  }
}

static PyObject *tolist_dim(const servd_tensor *t, int d, const char *p, float *rowbuf) {
  int64_t n = t->shape[d];
  PyObject *list = PyList_New((Py_ssize_t)n);
  if (!list) return NULL;
  if (d == t->ndim - 1 && rowbuf) { /* block dtype: dequantize the packed row */
    int rc = pm_host->row_to_f32(t->dtype, p, rowbuf, n);
    if (rc < 0) {
      Py_DECREF(list);
      return pm_raise(rc, "tolist");
    }
    for (int64_t i = 0; i < n; i++) PyList_SET_ITEM(list, (Py_ssize_t)i, PyFloat_FromDouble(rowbuf[i]));
    return list;
  }
  for (int64_t i = 0; i < n; i++) {
    const char *q = p + i * t->strides[d];
    PyObject *v = d == t->ndim - 1 ? element(t, q) : tolist_dim(t, d + 1, q, rowbuf);
    if (!v) {
      Py_DECREF(list);
      return NULL;
    }
    PyList_SET_ITEM(list, (Py_ssize_t)i, v);
  }
  return list;
}

static PyObject *tensor_tolist(TensorObject *self, PyObject *unused) {
  (void)unused;
  const servd_tensor *t = self->t;
  if (pm_host_only(t, PyExc_ValueError, "Tensor.tolist: the tensor") < 0) return NULL;
  const char *p = pm_tensor_data(t);
  if (t->ndim == 0) {
    if (pm_host->dtype_block_elems(t->dtype) != 1) {
      PyErr_SetString(PyExc_ValueError, "tolist: 0-d quantized tensor");
      return NULL;
    }
    return element(t, p);
  }
  float *rowbuf = NULL;
  if (pm_host->dtype_block_elems(t->dtype) != 1) {
    rowbuf = PyMem_Malloc(sizeof(float) * (size_t)t->shape[t->ndim - 1]);
    if (!rowbuf) return PyErr_NoMemory();
  }
  PyObject *r = tolist_dim(t, 0, p, rowbuf);
  PyMem_Free(rowbuf);
  return r;
}

/* ---- views ---- */

static int parse_shape(PyObject *args, int64_t *shape, int *ndim) {
  PyObject *seq = args;
  if (PyTuple_GET_SIZE(args) == 1 &&
      (PyTuple_Check(PyTuple_GET_ITEM(args, 0)) || PyList_Check(PyTuple_GET_ITEM(args, 0))))
    seq = PyTuple_GET_ITEM(args, 0);
  PyObject *fast = PySequence_Fast(seq, "shape must be a sequence of ints");
  if (!fast) return -1;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
  if (n > SERVD_MAX_DIMS) {
    Py_DECREF(fast);
    PyErr_Format(PyExc_ValueError, "shape has %zd dims; at most %d", n, SERVD_MAX_DIMS);
    return -1;
  }
  for (Py_ssize_t i = 0; i < n; i++) {
    long long v = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(fast, i));
    if (v == -1 && PyErr_Occurred()) {
      Py_DECREF(fast);
      return -1;
    }
    shape[i] = v;
  }
  *ndim = (int)n;
  Py_DECREF(fast);
  return 0;
}

static PyObject *tensor_reshape(TensorObject *self, PyObject *args) {
  int64_t shape[SERVD_MAX_DIMS];
  int ndim;
  if (parse_shape(args, shape, &ndim) < 0) return NULL;
  /* one -1 dimension is inferred, as in numpy */
  int infer = -1;
  int64_t known = 1;
  for (int i = 0; i < ndim; i++) {
    if (shape[i] == -1 && infer < 0) infer = i;
    else known *= shape[i];
  }
  if (infer >= 0 && known > 0) shape[infer] = pm_host->tensor_numel(self->t) / known;
  servd_tensor *v = pm_host->tensor_reshape(self->t, ndim, shape);
  if (!v) return pm_raise(SERVD_EINVAL, "Tensor.view");
  return pm_tensor_wrap(v);
}

static PyObject *tensor_narrow(TensorObject *self, PyObject *args) {
  int dim;
  long long start, len;
  if (!PyArg_ParseTuple(args, "iLL:narrow", &dim, &start, &len)) return NULL;
  if (dim < 0) dim += self->t->ndim;
  servd_tensor *v = pm_host->tensor_narrow(self->t, dim, start, len);
  if (!v) return pm_raise(SERVD_EINVAL, "Tensor.narrow");
  return pm_tensor_wrap(v);
}

static PyObject *tensor_row(TensorObject *self, PyObject *arg) {
  long long i = PyLong_AsLongLong(arg);
  if (i == -1 && PyErr_Occurred()) return NULL;
  const servd_tensor *t = self->t;
  if (t->ndim < 1 || i < 0 || i >= t->shape[0]) {
    PyErr_Format(PyExc_IndexError, "Tensor.row(%lld) out of range", i);
    return NULL;
  }
  servd_tensor *n = pm_host->tensor_narrow(t, 0, i, 1);
  if (!n) return pm_raise(SERVD_EINVAL, "Tensor.row");
  if (t->ndim == 1) return pm_tensor_wrap(n);
  /* drop the leading 1: n is ours alone, so its dims can be shifted in place */
  for (int d = 1; d < n->ndim; d++) {
    n->shape[d - 1] = n->shape[d];
    n->strides[d - 1] = n->strides[d];
  }
  n->ndim--;
  return pm_tensor_wrap(n);
}

static PyGetSetDef tensor_getset[] = {
    {"shape", (getter)tensor_shape, NULL, "tuple of dims", NULL},
    {"dtype", (getter)tensor_dtype, NULL, "dtype name", NULL},
    {"device", (getter)tensor_device, NULL, "\"cpu\" or \"cuda:N\"", NULL},
    {"ndim", (getter)tensor_ndim, NULL, "number of dims", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyObject *tensor_to_host(TensorObject *self, PyObject *unused);

static PyMethodDef tensor_methods[] = {
    {"tolist", (PyCFunction)tensor_tolist, METH_NOARGS, "nested lists"},
    {"view", (PyCFunction)tensor_reshape, METH_VARARGS, "same data, new shape (contiguous only)"},
    {"reshape", (PyCFunction)tensor_reshape, METH_VARARGS, "same data, new shape (contiguous only)"},
    {"narrow", (PyCFunction)tensor_narrow, METH_VARARGS, "narrow(dim, start, length): view of a slice"},
    {"row", (PyCFunction)tensor_row, METH_O, "row(i): view of row i"},
    {"to_host", (PyCFunction)tensor_to_host, METH_NOARGS, "a host copy of a device tensor; a host tensor itself"},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot tensor_slots[] = {
    {Py_tp_dealloc, tensor_dealloc},
    {Py_tp_repr, tensor_repr},
    {Py_tp_getset, tensor_getset},
    {Py_tp_methods, tensor_methods},
    {Py_sq_length, tensor_len},
    {Py_mp_length, tensor_len},
    {Py_bf_getbuffer, tensor_getbuffer},
    {Py_bf_releasebuffer, tensor_releasebuffer},
    {Py_tp_doc, "A host or device tensor shared with the native kernels (one reference on servd_tensor)."},
    {0, NULL},
};

static PyType_Spec tensor_spec = {
    .name = "servd.Tensor",
    .basicsize = sizeof(TensorObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = tensor_slots,
};

/* ---- servd.empty / servd.tensor ---- */

static int parse_dtype(const char *name, servd_dtype *d) {
  if (pm_host->dtype_from_name(name, d) < 0) {
    PyErr_Format(PyExc_ValueError, "unknown dtype \"%s\"", name);
    return -1;
  }
  return 0;
}

/* The interpreter's GPU for a call that needs one; RuntimeError on a CPU interpreter. */
static int need_gpu(const char *fn) {
  if (pm.device >= 0) return pm.device;
  PyErr_Format(PyExc_RuntimeError, "%s: this interpreter runs on the CPU", fn);
  return -1;
}

/* device=: None or "cpu" -> -1 (host); "cuda" -> this interpreter's GPU; "cuda:N" -> N. Returns -2
 * with an exception set when it is anything else or names a GPU on a CPU interpreter. */
static int parse_device(PyObject *o, const char *fn) {
  if (o == Py_None) return -1;
  const char *s = PyUnicode_Check(o) ? PyUnicode_AsUTF8(o) : NULL;
  if (!s) {
    if (!PyErr_Occurred())
      PyErr_Format(PyExc_TypeError, "%s: device must be a str (\"cpu\", \"cuda\" or \"cuda:N\"), not %.100s", fn,
                   Py_TYPE(o)->tp_name);
    return -2;
  }
  if (!strcmp(s, "cpu")) return -1;
  int n = -1;
  if (!strcmp(s, "cuda")) {
    n = pm.device;
  } else if (!strncmp(s, "cuda:", 5) && s[5] >= '0' && s[5] <= '9') {
    char *end;
    long v = strtol(s + 5, &end, 10);
    if (*end || v > 1024) {
      n = -3;
    } else {
      n = (int)v;
    }
  } else {
    n = -3;
  }
  if (n == -3) {
    PyErr_Format(PyExc_ValueError, "%s: device must be \"cpu\", \"cuda\" or \"cuda:N\", not \"%s\"", fn, s);
    return -2;
  }
  if (need_gpu(fn) < 0) return -2;
  return n;
}

static PyObject *m_empty(PyObject *m, PyObject *args, PyObject *kw) {
  (void)m;
  static char *kwlist[] = {"shape", "dtype", "device", NULL};
  PyObject *shape_obj, *dev_obj = Py_None;
  const char *dtype = "f32";
  if (!PyArg_ParseTupleAndKeywords(args, kw, "O|sO:empty", kwlist, &shape_obj, &dtype, &dev_obj)) return NULL;
  servd_dtype d;
  if (parse_dtype(dtype, &d) < 0) return NULL;
  int device = parse_device(dev_obj, "servd.empty");
  if (device == -2) return NULL;
  int64_t shape[SERVD_MAX_DIMS];
  int ndim = 1;
  if (PyLong_Check(shape_obj)) { /* servd.empty(n) */
    shape[0] = PyLong_AsLongLong(shape_obj);
    if (shape[0] == -1 && PyErr_Occurred()) return NULL;
  } else {
    PyObject *tup = PyTuple_Pack(1, shape_obj);
    int rc = tup ? parse_shape(tup, shape, &ndim) : -1;
    Py_XDECREF(tup);
    if (rc < 0) return NULL;
  }
  if (device >= 0) {
    servd_tensor *t = NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS rc = pm_host->device_tensor_new(device, d, ndim, shape, &t);
    Py_END_ALLOW_THREADS if (rc < 0) return pm_raise(rc, "servd.empty");
    return pm_tensor_wrap(t);
  }
  servd_tensor *t = pm_host->tensor_new(d, ndim, shape);
  if (!t) return pm_raise(SERVD_EINVAL, "servd.empty");
  return pm_tensor_wrap(t);
}

static servd_tensor *tensor_arg(PyObject *o, const char *fn, const char *name) {
  if (pm_is_tensor(o)) return ((TensorObject *)o)->t;
  PyErr_Format(PyExc_TypeError, "%s: %s must be a servd.Tensor, not %.100s", fn, name, Py_TYPE(o)->tp_name);
  return NULL;
}

/* servd.upload(t): the shared read-only bf16 copy of host weight t on this interpreter's GPU. */
static PyObject *m_upload(PyObject *m, PyObject *arg) {
  (void)m;
  servd_tensor *t = tensor_arg(arg, "servd.upload", "t");
  int device = t ? need_gpu("servd.upload") : -1;
  if (device < 0) return NULL;
  if (t->device >= 0) {
    PyErr_Format(PyExc_ValueError, "servd.upload: t is on cuda:%d already (upload takes host weights)", t->device);
    return NULL;
  }
  servd_tensor *out = NULL;
  int rc;
  Py_BEGIN_ALLOW_THREADS rc = pm_host->device_weight(device, t, &out);
  Py_END_ALLOW_THREADS if (rc < 0) return pm_raise(rc, "servd.upload");
  return pm_tensor_wrap(out);
}

/* The device dtype a tensor keeps: plain dtypes the device has, bf16 for the rest (f16, blocks). */
static servd_dtype device_dtype(servd_dtype d) {
  return d == SERVD_F32 || d == SERVD_I32 || d == SERVD_BF16 ? d : SERVD_BF16;
}

/* servd.to_device(t, dtype=None): a new private copy of t on this interpreter's GPU. */
static PyObject *m_to_device(PyObject *m, PyObject *args, PyObject *kw) {
  (void)m;
  static char *kwlist[] = {"t", "dtype", NULL};
  PyObject *obj;
  const char *dtype = NULL;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "O|z:to_device", kwlist, &obj, &dtype)) return NULL;
  servd_tensor *t = tensor_arg(obj, "servd.to_device", "t");
  int device = t ? need_gpu("servd.to_device") : -1;
  if (device < 0) return NULL;
  servd_dtype d = device_dtype(t->dtype);
  if (dtype && parse_dtype(dtype, &d) < 0) return NULL;
  servd_tensor *out = NULL;
  int rc;
  if (t->device < 0) {
    /* synced: the copy may be read next by another thread's stream (a step on a rank thread) */
    Py_BEGIN_ALLOW_THREADS rc = pm_host->device_upload(device, t, d, &out);
    if (rc == 0 && (rc = pm_host->device_sync(device)) < 0) {
      pm_host->tensor_release(out);
      out = NULL;
    }
    Py_END_ALLOW_THREADS
  } else {
    if (d != t->dtype) {
      PyErr_Format(PyExc_ValueError,
                   "servd.to_device: t is a %s tensor on cuda:%d; dtype conversion between "
                   "devices is not supported",
                   pm_host->dtype_name(t->dtype), t->device);
      return NULL;
    }
    Py_BEGIN_ALLOW_THREADS rc = pm_host->device_tensor_new(device, d, t->ndim, t->shape, &out);
    if (rc == 0 && (rc = pm_host->copy(out, t)) < 0) {
      pm_host->tensor_release(out);
      out = NULL;
    }
    Py_END_ALLOW_THREADS
  }
  if (rc < 0) return pm_raise(rc, "servd.to_device");
  return pm_tensor_wrap(out);
}

/* Tensor.to_host(): a new host copy of a device tensor (same dtype); a host tensor is returned as is. */
static PyObject *tensor_to_host(TensorObject *self, PyObject *unused) {
  (void)unused;
  const servd_tensor *t = self->t;
  if (t->device < 0) return Py_NewRef((PyObject *)self);
  servd_tensor *out = pm_host->tensor_new(t->dtype, t->ndim, t->shape);
  if (!out) return pm_raise(SERVD_ENOMEM, "Tensor.to_host");
  int rc;
  Py_BEGIN_ALLOW_THREADS rc = pm_host->copy(out, t);
  Py_END_ALLOW_THREADS if (rc < 0) {
    pm_host->tensor_release(out);
    return pm_raise(rc, "Tensor.to_host");
  }
  return pm_tensor_wrap(out);
}

/* servd.copy(dst, src): same dtype and shape, any direction. */
static PyObject *m_copy(PyObject *m, PyObject *const *args, Py_ssize_t n) {
  (void)m;
  if (n != 2) {
    PyErr_Format(PyExc_TypeError, "servd.copy takes 2 arguments (%zd given)", n);
    return NULL;
  }
  servd_tensor *dst = tensor_arg(args[0], "servd.copy", "dst"),
               *src = dst ? tensor_arg(args[1], "servd.copy", "src") : NULL;
  if (!src) return NULL;
  int rc;
  Py_BEGIN_ALLOW_THREADS rc = pm_host->copy(dst, src);
  Py_END_ALLOW_THREADS if (rc < 0) return pm_raise(rc, "servd.copy");
  Py_RETURN_NONE;
}

/* Infers the shape of a nested list of numbers. */
static int infer_shape(PyObject *o, int64_t *shape, int *ndim) {
  *ndim = 0;
  while (PyList_Check(o) || PyTuple_Check(o)) {
    if (*ndim == SERVD_MAX_DIMS) {
      PyErr_Format(PyExc_ValueError, "servd.tensor: more than %d dims", SERVD_MAX_DIMS);
      return -1;
    }
    Py_ssize_t n = PySequence_Size(o);
    shape[(*ndim)++] = n;
    if (n == 0) break;
    o = PySequence_GetItem(o, 0);
    if (!o) return -1;
    Py_DECREF(o); /* the container keeps it alive */
  }
  return 0;
}

/* Flattens o (shape[d:]) into f (f32) or i (i32), checking the shape is rectangular. */
static int flatten(PyObject *o, const int64_t *shape, int ndim, int d, float *f, int32_t *iv, int64_t *pos) {
  if (d == ndim) {
    if (iv) {
      long v = PyLong_AsLong(o);
      if (v == -1 && PyErr_Occurred()) return -1;
      if (v < INT32_MIN || v > INT32_MAX) {
        PyErr_SetString(PyExc_OverflowError, "servd.tensor: value out of i32 range");
        return -1;
      }
      iv[(*pos)++] = (int32_t)v;
    } else {
      double v = PyFloat_AsDouble(o);
      if (v == -1.0 && PyErr_Occurred()) return -1;
      f[(*pos)++] = (float)v;
    }
    return 0;
  }
  PyObject *fast = PySequence_Fast(o, "servd.tensor: ragged nested list");
  if (!fast) return -1;
  if (PySequence_Fast_GET_SIZE(fast) != shape[d]) {
    Py_DECREF(fast);
    PyErr_Format(PyExc_ValueError, "servd.tensor: ragged nested list at dim %d (expected %lld items)", d,
                 (long long)shape[d]);
    return -1;
  }
  for (int64_t i = 0; i < shape[d]; i++) {
    if (flatten(PySequence_Fast_GET_ITEM(fast, i), shape, ndim, d + 1, f, iv, pos) < 0) {
      Py_DECREF(fast);
      return -1;
    }
  }
  Py_DECREF(fast);
  return 0;
}

static PyObject *m_tensor(PyObject *m, PyObject *args, PyObject *kw) {
  (void)m;
  static char *kwlist[] = {"data", "dtype", "shape", NULL};
  PyObject *data, *shape_obj = Py_None;
  const char *dtype = "f32";
  if (!PyArg_ParseTupleAndKeywords(args, kw, "O|sO:tensor", kwlist, &data, &dtype, &shape_obj)) return NULL;
  servd_dtype d;
  if (parse_dtype(dtype, &d) < 0) return NULL;
  int64_t shape[SERVD_MAX_DIMS];
  int ndim = 0;
  if (shape_obj != Py_None) {
    PyObject *tup = PyTuple_Pack(1, shape_obj);
    if (!tup) return NULL;
    int rc = parse_shape(tup, shape, &ndim);
    Py_DECREF(tup);
    if (rc < 0) return NULL;
  }

  if (PyObject_CheckBuffer(data)) { /* raw bytes of the dtype */
    if (shape_obj == Py_None) {
      PyErr_SetString(PyExc_ValueError, "servd.tensor: shape is required with bytes data");
      return NULL;
    }
    Py_buffer b;
    if (PyObject_GetBuffer(data, &b, PyBUF_C_CONTIGUOUS) < 0) return NULL;
    servd_tensor *t = pm_host->tensor_new(d, ndim, shape);
    if (!t) {
      PyBuffer_Release(&b);
      return pm_raise(SERVD_EINVAL, "servd.tensor");
    }
    size_t need = pm_host->tensor_nbytes(t);
    if ((size_t)b.len != need) {
      PyErr_Format(PyExc_ValueError, "servd.tensor: %zd bytes of data for a %s tensor of %zu bytes", b.len, dtype,
                   need);
      PyBuffer_Release(&b);
      pm_host->tensor_release(t);
      return NULL;
    }
    memcpy(pm_tensor_data(t), b.buf, need);
    PyBuffer_Release(&b);
    return pm_tensor_wrap(t);
  }

  int64_t lshape[SERVD_MAX_DIMS];
  int lndim;
  if (infer_shape(data, lshape, &lndim) < 0) return NULL;
  int64_t n = 1;
  for (int i = 0; i < lndim; i++) n *= lshape[i];
  if (shape_obj == Py_None) {
    memcpy(shape, lshape, sizeof lshape);
    ndim = lndim;
  }
  servd_tensor *t = pm_host->tensor_new(d, ndim, shape);
  if (!t) return pm_raise(SERVD_EINVAL, "servd.tensor");
  if (pm_host->tensor_numel(t) != n) {
    pm_host->tensor_release(t);
    PyErr_Format(PyExc_ValueError, "servd.tensor: %lld values do not fill the given shape", (long long)n);
    return NULL;
  }
  int64_t pos = 0;
  if (d == SERVD_I32) {
    if (flatten(data, lshape, lndim, 0, NULL, pm_tensor_data(t), &pos) < 0) {
      pm_host->tensor_release(t);
      return NULL;
    }
    return pm_tensor_wrap(t);
  }
  float *tmp = d == SERVD_F32 ? pm_tensor_data(t) : PyMem_Malloc(sizeof(float) * (size_t)(n ? n : 1));
  if (!tmp) {
    pm_host->tensor_release(t);
    return PyErr_NoMemory();
  }
  int rc = flatten(data, lshape, lndim, 0, tmp, NULL, &pos);
  if (rc == 0 && d != SERVD_F32) { /* convert/quantize row by row of the innermost dim */
    int64_t row = ndim ? shape[ndim - 1] : 1;
    size_t rb = pm_host->dtype_block_bytes(d) * (size_t)(row / (int64_t)pm_host->dtype_block_elems(d));
    for (int64_t r = 0; row && r < n / row && rc == 0; r++) {
      rc = pm_host->row_from_f32(d, tmp + r * row, (char *)pm_tensor_data(t) + (size_t)r * rb, row);
      if (rc < 0) pm_raise(rc, "servd.tensor");
    }
  }
  if (d != SERVD_F32) PyMem_Free(tmp);
  if (rc < 0) {
    pm_host->tensor_release(t);
    return NULL;
  }
  return pm_tensor_wrap(t);
}

static PyMethodDef tensor_functions[] = {
    {"empty", (PyCFunction)(void (*)(void))m_empty, METH_VARARGS | METH_KEYWORDS,
     "empty(shape, dtype='f32', device=None): zeroed tensor; device None/'cpu', 'cuda' (this interpreter's "
     "GPU) or 'cuda:N'"},
    {"upload", (PyCFunction)m_upload, METH_O,
     "upload(t): the shared read-only bf16 copy of host weight t on this interpreter's GPU"},
    {"to_device", (PyCFunction)(void (*)(void))m_to_device, METH_VARARGS | METH_KEYWORDS,
     "to_device(t, dtype=None): a new copy of t on this interpreter's GPU (default dtype: t's, bf16 for "
     "f16 and block dtypes)"},
    {"copy", (PyCFunction)(void (*)(void))m_copy, METH_FASTCALL, "copy(dst, src): same dtype and shape, any direction"},
    {"tensor", (PyCFunction)(void (*)(void))m_tensor, METH_VARARGS | METH_KEYWORDS,
     "tensor(data, dtype='f32', shape=None): from a nested list or from bytes"},
    {NULL, NULL, 0, NULL},
};

int pm_tensor_types_init(PyObject *module) {
  pm.tensor_type = PyType_FromModuleAndSpec(module, &tensor_spec, NULL);
  if (!pm.tensor_type || PyModule_AddObjectRef(module, "Tensor", pm.tensor_type) < 0) return -1;
  return PyModule_AddFunctions(module, tensor_functions);
}
