/* The guest side of the host boundary: starts and stops this namespace's CPython, and runs the
 * host's calls into it (entry object, predict, call_json, forward, deadlines).
 *
 * Thread states: the PyGILState_* API cannot be used here. Every namespace has its own libc, and
 * each libc numbers its pthread keys from 0, but the per-thread key slots live in the one thread
 * descriptor they share: on a thread that enters two namespaces, namespace B's gilstate key reads
 * namespace A's thread state (verified: it crashes). So each OS thread gets its own PyThreadState
 * per namespace, kept by the host (servd_guest_thread), and calls switch to it with
 * PyEval_RestoreThread / PyEval_SaveThread.
 */
#include "pymod.h"

#include <string.h>

#include "bootstrap.h"

static PyInterpreterState *g_interp;
static unsigned g_gen; /* bumped by every init: thread states of an older run are gone */
static PyObject *g_entry;
static PyObject *g_boot; /* the bootstrap module's dict */
static PyObject *g_json_loads, *g_json_dumps;

/* A call in progress, for interrupt(seq). Linked while the GIL is held only. */
typedef struct active_call {
  struct active_call *next;
  uint64_t seq;
  unsigned long tid;
  int interrupted;
} active_call;
static active_call *g_active;

static void enter(servd_guest_thread *th) {
  if (!th->tstate || th->gen != g_gen) {
    th->tstate = PyThreadState_New(g_interp);
    th->gen = g_gen;
  }
  PyEval_RestoreThread(th->tstate);
}

static void leave(void) { PyEval_SaveThread(); }

static void begin_call(active_call *c, uint64_t seq) {
  c->seq = seq;
  c->tid = PyThread_get_thread_ident();
  c->interrupted = 0;
  c->next = g_active;
  g_active = c;
}

static void end_call(active_call *c) {
  for (active_call **pp = &g_active; *pp; pp = &(*pp)->next) {
    if (*pp == c) {
      *pp = c->next;
      break;
    }
  }
  /* An interrupt that arrived after the Python code finished must not hit a later call. */
  if (c->interrupted) PyThreadState_SetAsyncExc(c->tid, NULL);
}

static void copy_str(char *dst, size_t cap, const char *src) {
  if (!src) src = "";
  size_t n = strlen(src);
  if (n >= cap) n = cap - 1;
  memcpy(dst, src, n);
  dst[n] = 0;
}

/* Moves the pending Python exception into err (type, message, traceback) and clears it. */
static int take_error(servd_py_error *err, const char *what, const active_call *c) {
  PyObject *type, *value, *tb;
  PyErr_Fetch(&type, &value, &tb);
  PyErr_NormalizeException(&type, &value, &tb);
  if (tb && value) PyException_SetTraceback(value, tb);
  int timed_out = c && c->interrupted && type && PyErr_GivenExceptionMatches(type, PyExc_TimeoutError);
  char tname[64] = "Exception", msg[512] = "", tbtext[4096] = "";
  if (type && PyType_Check(type)) {
    PyObject *n = PyType_GetName((PyTypeObject *)type);
    if (n) copy_str(tname, sizeof tname, PyUnicode_AsUTF8(n));
    Py_XDECREF(n);
  }
  if (value) {
    PyObject *s = PyObject_Str(value);
    if (s) copy_str(msg, sizeof msg, PyUnicode_AsUTF8(s));
    Py_XDECREF(s);
  }
  if (timed_out && !msg[0]) copy_str(msg, sizeof msg, "deadline exceeded: interrupted by servd");
  PyObject *fmt = g_boot ? PyDict_GetItemString(g_boot, "format_exception") : NULL;
  PyObject *text = fmt && value ? PyObject_CallOneArg(fmt, value) : NULL;
  if (text && PyUnicode_Check(text)) {
    /* keep the innermost frames: they say where it failed */
    const char *s = PyUnicode_AsUTF8(text);
    size_t len = s ? strlen(s) : 0;
    copy_str(tbtext, sizeof tbtext, s && len >= sizeof tbtext ? s + len - (sizeof tbtext - 1) : s);
  }
  Py_XDECREF(text);
  PyErr_Clear();
  Py_XDECREF(type);
  Py_XDECREF(value);
  Py_XDECREF(tb);
  if (err) {
    copy_str(err->type, sizeof err->type, tname);
    copy_str(err->message, sizeof err->message, msg);
    copy_str(err->traceback, sizeof err->traceback, tbtext);
  }
  return pm_host->fail(timed_out ? SERVD_ETIMEDOUT : SERVD_EINVAL, "%s: %s: %s", what, tname, msg);
}

static int plain_error(servd_py_error *err, int code, const char *type, const char *msg) {
  if (err) {
    copy_str(err->type, sizeof err->type, type);
    copy_str(err->message, sizeof err->message, msg);
    err->traceback[0] = 0;
  }
  return pm_host->fail(code, "%s: %s", type, msg);
}

static int append_wide(PyWideStringList *l, const char *s) {
  wchar_t *w = Py_DecodeLocale(s, NULL);
  if (!w) return -1;
  PyStatus st = PyWideStringList_Append(l, w);
  PyMem_RawFree(w);
  return PyStatus_Exception(st) ? -1 : 0;
}

static int g_init(servd_guest_thread *th, const servd_guest_config *c, servd_py_error *err) {
  if (!c || !c->host || c->host->abi != SERVD_GUEST_ABI ||
      c->host->size < offsetof(servd_host_api, fail) + sizeof c->host->fail)
    return -1; /* no host to report through */
  pm_host = c->host;
  if (c->host->size < sizeof(servd_host_api)) /* a program of an older build: its table lacks members */
    return plain_error(err, SERVD_EUNSUPPORTED, "RuntimeError",
                       "the servd module is newer than the servd program (its host table is too small): use "
                       "the module of the same build (SERVD_PYMOD_PATH)");
  pm_host = c->host;
  pm_cfg = c;
  memset(&pm, 0, sizeof pm);
  pm.pkg = c->pkg;
  pm.rank = c->rank;
  pm.world_size = c->world_size > 0 ? c->world_size : 1;
  pm.device = c->device;
  pm.index = c->index;
  pm.comm = c->comm;
  pm.dcomm = c->dcomm;

  /* must precede every Py_Initialize: finalization drops the extended table */
  if (PyImport_AppendInittab("servd", PyInit_servd) < 0)
    return plain_error(err, SERVD_ENOMEM, "RuntimeError", "PyImport_AppendInittab failed");

  PyConfig cfg;
  PyConfig_InitIsolatedConfig(&cfg);
  cfg.site_import = 0;             /* site.py would add /usr/local/... and dist-packages */
  cfg.install_signal_handlers = 0; /* signals belong to the daemon */
  cfg.write_bytecode = 0;
  cfg.user_site_directory = 0;
  cfg.configure_c_stdio = 0;
  cfg.parse_argv = 0;
  cfg.module_search_paths_set = 1;
  /* home (sys.prefix) two levels above the standard library: /usr for /usr/lib/python3.11, the
   * bundle's root for a relocated one (SERVD_PY_STDLIB) */
  char home[4096], exe[4096 + 32];
  snprintf(home, sizeof home, "%s", c->stdlib_dir);
  for (int up = 0; up < 2; up++) {
    size_t n = strlen(home);
    while (n > 1 && home[n - 1] == '/') /* "/opt/b/lib/python3.11/" names the same directory */
      home[--n] = 0;
    char *slash = strrchr(home, '/');
    if (slash) *slash = 0;
  }
  if (!home[0]) snprintf(home, sizeof home, "/");
  snprintf(exe, sizeof exe, "%s/bin/python3.11", strcmp(home, "/") ? home : "");
  PyStatus st = PyConfig_SetBytesString(&cfg, &cfg.home, home);
  if (!PyStatus_Exception(st)) st = PyConfig_SetBytesString(&cfg, &cfg.program_name, exe);
  if (!PyStatus_Exception(st)) /* not searched in PATH, where another Python may come first */
    st = PyConfig_SetBytesString(&cfg, &cfg.executable, exe);
  if (PyStatus_Exception(st) || append_wide(&cfg.module_search_paths, c->stdlib_dir) < 0 ||
      append_wide(&cfg.module_search_paths, c->dynload_dir) < 0) {
    PyConfig_Clear(&cfg);
    return plain_error(err, SERVD_ENOMEM, "RuntimeError", "PyConfig setup failed");
  }
  st = Py_InitializeFromConfig(&cfg);
  PyConfig_Clear(&cfg);
  if (PyStatus_Exception(st)) {
    char msg[512];
    snprintf(msg, sizeof msg, "Py_InitializeFromConfig: %s%s%s", st.func ? st.func : "", st.func ? ": " : "",
             st.err_msg ? st.err_msg : "failed");
    return plain_error(err, SERVD_EUNSUPPORTED, "RuntimeError", msg);
  }
  g_interp = PyInterpreterState_Get();
  g_gen++;
  th->tstate = PyThreadState_Get();
  th->gen = g_gen;

  int rc = 0;
  PyObject *boot = PyModule_New("_servd_bootstrap");
  PyObject *r = NULL;
  if (boot) {
    g_boot = PyModule_GetDict(boot);
    Py_INCREF(g_boot);
    PyDict_SetItemString(g_boot, "__builtins__", PyEval_GetBuiltins());
    r = PyRun_String(servd_bootstrap_py, Py_file_input, g_boot, g_boot);
    Py_XDECREF(r);
  }
  if (r) {
    PyObject *setup = PyDict_GetItemString(g_boot, "setup");
    r = setup ? PyObject_CallFunction(setup, "zzzzzO", c->pkg_name, c->allow_dir, c->allow_modules, c->extra_sys_path,
                                      "code/", c->pkg ? Py_True : Py_False)
              : NULL;
    Py_XDECREF(r);
  }
  if (r) {
    g_json_loads = PyDict_GetItemString(g_boot, "json_loads");
    g_json_dumps = PyDict_GetItemString(g_boot, "json_dumps");
    Py_XINCREF(g_json_loads);
    Py_XINCREF(g_json_dumps);
  }
  if (!r || !g_json_loads || !g_json_dumps)
    rc = PyErr_Occurred() ? take_error(err, "interpreter setup", NULL)
                          : plain_error(err, SERVD_EINVAL, "RuntimeError", "bootstrap failed");
  Py_XDECREF(boot);
  pm_cfg = NULL;
  leave(); /* release the GIL: calls come from any thread */
  return rc;
}

static int g_load_entry(servd_guest_thread *th, uint64_t seq, const char *entry_point, servd_py_error *err) {
  enter(th);
  active_call c; /* the import runs under the load deadline: interrupt(seq) ends it */
  begin_call(&c, seq);
  int rc = 0;
  PyObject *load = PyDict_GetItemString(g_boot, "load_entry");
  Py_CLEAR(g_entry);
  g_entry = load ? PyObject_CallFunction(load, "s", entry_point) : NULL;
  if (g_entry && pm.device >= 0) {
    /* Device work of the load (zeroed buffers, private copies) ran on this thread's stream; the steps
     * run on other threads' streams, so it must be complete before load returns. */
    int src;
    Py_BEGIN_ALLOW_THREADS src = pm_host->device_sync(pm.device);
    Py_END_ALLOW_THREADS if (src < 0) {
      pm_raise(src, "loading the entry object: device work");
      Py_CLEAR(g_entry);
    }
  }
  if (!g_entry) rc = take_error(err, "loading the entry object", &c);
  end_call(&c);
  leave();
  return rc;
}

static int to_json_text(PyObject *v, char **out, servd_py_error *err, active_call *c) {
  PyObject *s = PyObject_CallOneArg(g_json_dumps, v);
  if (!s) return take_error(err, "result to JSON", c);
  Py_ssize_t n;
  const char *u = PyUnicode_AsUTF8AndSize(s, &n);
  char *copy = u ? pm_host->alloc((size_t)n + 1) : NULL;
  if (!copy) {
    Py_DECREF(s);
    return plain_error(err, SERVD_ENOMEM, "MemoryError", "result JSON");
  }
  memcpy(copy, u, (size_t)n + 1);
  Py_DECREF(s);
  *out = copy;
  return 0;
}

static PyObject *main_dict(void) {
  PyObject *m = PyImport_AddModule("__main__"); /* borrowed */
  return m ? PyModule_GetDict(m) : NULL;
}

static int g_exec(servd_guest_thread *th, uint64_t seq, const char *code, servd_py_error *err) {
  enter(th);
  active_call c;
  begin_call(&c, seq);
  int rc = 0;
  PyObject *d = main_dict();
  PyObject *r = d ? PyRun_String(code, Py_file_input, d, d) : NULL;
  if (!r) rc = take_error(err, "exec", &c);
  Py_XDECREF(r);
  end_call(&c);
  leave();
  return rc;
}

static int g_eval_json(servd_guest_thread *th, uint64_t seq, const char *expr, char **json_out, servd_py_error *err) {
  enter(th);
  active_call c;
  begin_call(&c, seq);
  int rc = 0;
  PyObject *d = main_dict();
  PyObject *r = d ? PyRun_String(expr, Py_eval_input, d, d) : NULL;
  if (!r) rc = take_error(err, "eval", &c);
  else rc = to_json_text(r, json_out, err, &c);
  Py_XDECREF(r);
  end_call(&c);
  leave();
  return rc;
}

static int no_entry(servd_py_error *err) {
  return plain_error(err, SERVD_EINVAL, "RuntimeError", "no entry object (package not loaded)");
}

static int g_call_json(servd_guest_thread *th, uint64_t seq, const char *method, const char *args_json, char **json_out,
                       servd_py_error *err) {
  enter(th);
  active_call c;
  begin_call(&c, seq);
  int rc = 0;
  PyObject *args = NULL, *tuple = NULL, *fn = NULL, *r = NULL;
  if (!g_entry) {
    rc = no_entry(err);
    goto out;
  }
  PyObject *text = PyUnicode_FromString(args_json ? args_json : "[]");
  args = text ? PyObject_CallOneArg(g_json_loads, text) : NULL;
  Py_XDECREF(text);
  if (!args || !(tuple = PySequence_Tuple(args)) || !(fn = PyObject_GetAttrString(g_entry, method)) ||
      !(r = PyObject_Call(fn, tuple, NULL))) {
    rc = take_error(err, method, &c);
    goto out;
  }
  rc = to_json_text(r, json_out, err, &c);
out:
  Py_XDECREF(args);
  Py_XDECREF(tuple);
  Py_XDECREF(fn);
  Py_XDECREF(r);
  end_call(&c);
  leave();
  return rc;
}

static int g_predict(servd_guest_thread *th, uint64_t seq, int n_in, const char *const *in_names,
                     servd_tensor *const *in_tensors, int *n_out, char ***out_names, servd_tensor ***out_tensors,
                     servd_py_error *err) {
  *n_out = 0;
  *out_names = NULL;
  *out_tensors = NULL;
  enter(th);
  active_call c;
  begin_call(&c, seq);
  int rc = 0;
  char **names = NULL;
  servd_tensor **tensors = NULL;
  int n = 0;
  PyObject *inputs = NULL, *r = NULL;
  if (!g_entry) {
    rc = no_entry(err);
    goto out;
  }
  inputs = PyDict_New();
  for (int i = 0; inputs && i < n_in; i++) {
    pm_host->tensor_retain(in_tensors[i]);
    PyObject *t = pm_tensor_wrap(in_tensors[i]);
    if (!t) {
      Py_CLEAR(inputs);
      break;
    }
    int bad = PyDict_SetItemString(inputs, in_names[i], t) < 0;
    Py_DECREF(t);
    if (bad) {
      Py_CLEAR(inputs);
      break;
    }
  }
  if (!inputs || !(r = PyObject_CallMethod(g_entry, "predict", "O", inputs))) {
    rc = take_error(err, "predict", &c);
    goto out;
  }
  if (!PyDict_Check(r)) {
    PyErr_Format(PyExc_TypeError, "predict must return a dict of servd.Tensor, not %.100s", Py_TYPE(r)->tp_name);
    rc = take_error(err, "predict", &c);
    goto out;
  }
  Py_ssize_t count = PyDict_Size(r), pos = 0;
  names = pm_host->alloc(sizeof(char *) * (size_t)(count ? count : 1));
  tensors = pm_host->alloc(sizeof(servd_tensor *) * (size_t)(count ? count : 1));
  if (!names || !tensors) {
    rc = plain_error(err, SERVD_ENOMEM, "MemoryError", "predict outputs");
    goto out;
  }
  PyObject *k, *v;
  while (PyDict_Next(r, &pos, &k, &v)) {
    const char *name = PyUnicode_Check(k) ? PyUnicode_AsUTF8(k) : NULL;
    if (!name || !pm_is_tensor(v)) {
      PyErr_Format(PyExc_TypeError, "predict output %R must map a str to a servd.Tensor, not %.100s", k,
                   Py_TYPE(v)->tp_name);
      rc = take_error(err, "predict", &c);
      goto out;
    }
    /* the caller reads outputs on the host */
    if (pm_host_only(((TensorObject *)v)->t, PyExc_ValueError, "predict output") < 0) {
      rc = take_error(err, "predict", &c);
      goto out;
    }
    size_t len = strlen(name);
    names[n] = pm_host->alloc(len + 1);
    if (!names[n]) {
      rc = plain_error(err, SERVD_ENOMEM, "MemoryError", "predict outputs");
      goto out;
    }
    memcpy(names[n], name, len + 1);
    tensors[n] = ((TensorObject *)v)->t;
    pm_host->tensor_retain(tensors[n]);
    n++;
  }
  *n_out = n;
  *out_names = names;
  *out_tensors = tensors;
  names = NULL;
  tensors = NULL;
out:
  if (names || tensors) {
    for (int i = 0; i < n; i++) {
      pm_host->free(names[i]);
      pm_host->tensor_release(tensors[i]);
    }
    pm_host->free(names);
    pm_host->free(tensors);
  }
  Py_XDECREF(inputs);
  Py_XDECREF(r);
  end_call(&c);
  leave();
  return rc;
}

static int g_forward(servd_guest_thread *th, uint64_t seq, const servd_forward_batch *b, servd_tensor **logits,
                     servd_py_error *err) {
  *logits = NULL;
  enter(th);
  active_call c;
  begin_call(&c, seq);
  int rc = 0;
  PyObject *batch = NULL, *r = NULL;
  if (!g_entry) {
    rc = no_entry(err);
    goto out;
  }
  batch = pm_batch_new(b);
  if (!batch || !(r = PyObject_CallMethod(g_entry, "forward", "O", batch))) {
    rc = take_error(err, "forward", &c);
    goto out;
  }
  if (r != Py_None) {
    if (!pm_is_tensor(r)) {
      PyErr_Format(PyExc_TypeError, "forward must return a servd.Tensor or None, not %.100s", Py_TYPE(r)->tp_name);
      rc = take_error(err, "forward", &c);
      goto out;
    }
    *logits = ((TensorObject *)r)->t;
    pm_host->tensor_retain(*logits);
  }
out:
  pm_batch_invalidate(batch);
  Py_XDECREF(batch);
  Py_XDECREF(r);
  end_call(&c);
  leave();
  return rc;
}

static void g_interrupt(servd_guest_thread *th, uint64_t seq) {
  if (!g_interp) return;
  enter(th);
  for (active_call *c = g_active; c; c = c->next) {
    if (c->seq == seq) {
      PyThreadState_SetAsyncExc(c->tid, PyExc_TimeoutError);
      c->interrupted = 1;
    }
  }
  leave();
}

static void g_finalize(servd_guest_thread *th) {
  if (!g_interp) return;
  enter(th);
  Py_CLEAR(g_entry);
  Py_CLEAR(g_boot);
  Py_CLEAR(g_json_loads);
  Py_CLEAR(g_json_dumps);
  /* CPython 3.11 takes the thread that first imported threading for its main thread, and
   * threading._shutdown() in Py_FinalizeEx waits for that thread's state to be deleted. When model
   * code imported threading on another thread (a server worker, which lives on), release that
   * sentinel here so finalization does not wait for a thread that will not end. Releasing it early
   * is safe: CPython releases the sentinel only if it is still held. */
  PyRun_SimpleString("import sys as _servd_sys\n"
                     "_servd_t = _servd_sys.modules.get('threading')\n"
                     "if _servd_t is not None and _servd_t._main_thread.ident != _servd_t.get_ident():\n"
                     "    _servd_l = _servd_t._main_thread._tstate_lock\n"
                     "    if _servd_l is not None and _servd_l.locked():\n"
                     "        _servd_l.release()\n");
  Py_FinalizeEx();
  g_interp = NULL;
  g_active = NULL;
  th->tstate = NULL;
  memset(&pm, 0, sizeof pm);
}

static const servd_guest_api guest_api = {
    .abi = SERVD_GUEST_ABI,
    .init = g_init,
    .load_entry = g_load_entry,
    .exec = g_exec,
    .eval_json = g_eval_json,
    .call_json = g_call_json,
    .predict = g_predict,
    .forward = g_forward,
    .interrupt = g_interrupt,
    .finalize = g_finalize,
};

__attribute__((visibility("default"))) const servd_guest_api *servd_guest_entry(void) { return &guest_api; }
