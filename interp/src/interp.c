/* One interpreter: start/stop in a namespace and the calls into it. */
#include "interp-impl.h"

#include <stdlib.h>
#include <string.h>

#include "mpk/package.h"

/* importable from SERVD_PY_ALLOW_DIR: chat templates need jinja2 (which needs markupsafe) */
#define SERVD_PY_ALLOW_MODULES "jinja2,markupsafe"

static void clear_error(servd_py_error *err) {
  if (err) err->type[0] = err->message[0] = err->traceback[0] = 0;
}

int servd_interp__init(servd_interp *it, const servd_interp_config *c, servd_py_error *err) {
  clear_error(err);
  memset(it, 0, sizeof *it);
  it->index = c->index;
  /* resolved per start: the environment is read when an interpreter starts, not at build time */
  servd_py_paths *paths = malloc(sizeof *paths);
  if (!paths) return servd_fail(SERVD_ENOMEM, "interp: paths");
  servd_ns *ns = NULL;
  int rc = servd_py_paths__resolve(paths);
  if (rc == 0) rc = servd_ns__acquire(paths, &ns);
  if (rc < 0) {
    free(paths);
    return rc;
  }
  servd_guest_thread *th = servd_ns__thread(ns);
  servd_guest_config gc = {
      .host = c->host ? c->host : servd_host_api__get(),
      .pkg = c->pkg,
      .pkg_name = c->pkg ? mpk_name(c->pkg) : NULL,
      .stdlib_dir = paths->stdlib,
      .dynload_dir = paths->dynload,
      .allow_dir = paths->allow_dir,
      .allow_modules = SERVD_PY_ALLOW_MODULES,
      .extra_sys_path = c->extra_sys_path,
      .index = c->index,
      .rank = c->rank,
      .world_size = c->world_size,
      .device = c->device,
      .comm = c->comm,
      .dcomm = c->dcomm,
  };
  rc = ns->api->init(th, &gc, err);
  free(paths); /* the config's strings are borrowed for the duration of init only */
  if (rc < 0) {
    /* CPython may be half started: finalize what there is before the slot is reused */
    ns->api->finalize(th);
    servd_ns__release(ns);
    return rc;
  }
  it->ns = ns;
  return 0;
}

void servd_interp__fini(servd_interp *it) {
  if (!it || !it->ns) return;
  it->ns->api->finalize(servd_ns__thread(it->ns));
  servd_ns__release(it->ns);
  it->ns = NULL;
}

int servd_interp_index(const servd_interp *it) { return it ? it->index : -1; }

double servd_interp_busy_seconds(const servd_interp *it) {
  return it ? (double)atomic_load_explicit(&it->busy_ns, memory_order_relaxed) * 1e-9 : 0.0;
}

/* Common prologue/epilogue of a call: thread setup, call number, deadline, busy time. */
typedef struct call_ctx {
  servd_guest_thread *th;
  servd_wd_call wd;
  int armed;
  uint64_t seq;
  int64_t t0;
} call_ctx;

static int call_begin(servd_interp *it, call_ctx *cc, int64_t deadline_ms, servd_py_error *err) {
  clear_error(err);
  if (!it || !it->ns) return servd_fail(SERVD_EINVAL, "interp: call on an interpreter that is not running");
  cc->th = servd_ns__thread(it->ns);
  cc->seq = atomic_fetch_add_explicit(&it->seq, 1, memory_order_relaxed) + 1;
  cc->armed = 0;
  if (deadline_ms > 0) {
    int rc = servd_wd__arm(&cc->wd, it->ns, cc->seq, deadline_ms);
    if (rc < 0) return rc;
    cc->armed = 1;
  }
  cc->t0 = servd_interp__now_ns();
  return 0;
}

static void call_end(servd_interp *it, call_ctx *cc) {
  atomic_fetch_add_explicit(&it->busy_ns, (uint64_t)(servd_interp__now_ns() - cc->t0), memory_order_relaxed);
  if (cc->armed) servd_wd__disarm(&cc->wd);
}

int servd_interp_predict(servd_interp *it, int n_in, const char *const *in_names, servd_tensor *const *in_tensors,
                         int *n_out, char ***out_names, servd_tensor ***out_tensors, int64_t deadline_ms,
                         servd_py_error *err) {
  *n_out = 0;
  *out_names = NULL;
  *out_tensors = NULL;
  if (n_in < 0 || (n_in > 0 && (!in_names || !in_tensors)))
    return servd_fail(SERVD_EINVAL, "interp predict: %d inputs without names/tensors", n_in);
  call_ctx cc;
  int rc = call_begin(it, &cc, deadline_ms, err);
  if (rc < 0) return rc;
  rc = it->ns->api->predict(cc.th, cc.seq, n_in, in_names, in_tensors, n_out, out_names, out_tensors, err);
  call_end(it, &cc);
  return rc;
}

static int parse_json(char *text, json_t **result) {
  json_error_t je;
  *result = json_loads(text, JSON_DECODE_ANY, &je);
  free(text); /* host->alloc is malloc */
  if (!*result) return servd_fail(SERVD_EFORMAT, "interp: result JSON from Python: %s", je.text);
  return 0;
}

int servd_interp_call_json(servd_interp *it, const char *method, json_t *args, json_t **result, int64_t deadline_ms,
                           servd_py_error *err) {
  *result = NULL;
  if (!method || (args && !json_is_array(args)))
    return servd_fail(SERVD_EINVAL, "interp call_json: method and a JSON array of arguments expected");
  char *text = args ? json_dumps(args, JSON_COMPACT) : NULL;
  if (args && !text) return servd_fail(SERVD_ENOMEM, "interp call_json: encoding arguments");
  call_ctx cc;
  int rc = call_begin(it, &cc, deadline_ms, err);
  if (rc == 0) {
    char *out = NULL;
    rc = it->ns->api->call_json(cc.th, cc.seq, method, text ? text : "[]", &out, err);
    call_end(it, &cc);
    if (rc == 0) rc = parse_json(out, result);
  }
  free(text);
  return rc;
}

int servd_interp_forward(servd_interp *it, const servd_forward_batch *b, servd_tensor **logits, servd_py_error *err) {
  return servd_interp_forward_deadline(it, b, 0, logits, err);
}

int servd_interp_forward_deadline(servd_interp *it, const servd_forward_batch *b, int64_t timeout_ms,
                                  servd_tensor **logits, servd_py_error *err) {
  *logits = NULL;
  if (!b || b->n_tokens < 0 || b->n_logit_rows < 0 || b->attn.n_seqs < 0)
    return servd_fail(SERVD_EINVAL, "interp forward: bad batch description");
  call_ctx cc;
  int rc = call_begin(it, &cc, timeout_ms, err);
  if (rc < 0) return rc;
  rc = it->ns->api->forward(cc.th, cc.seq, b, logits, err);
  call_end(it, &cc);
  return rc;
}

int servd_interp__exec(servd_interp *it, const char *code, int64_t deadline_ms, servd_py_error *err) {
  call_ctx cc;
  int rc = call_begin(it, &cc, deadline_ms, err);
  if (rc < 0) return rc;
  rc = it->ns->api->exec(cc.th, cc.seq, code, err);
  call_end(it, &cc);
  return rc;
}

int servd_interp__eval_json(servd_interp *it, const char *expr, json_t **result, int64_t deadline_ms,
                            servd_py_error *err) {
  *result = NULL;
  call_ctx cc;
  int rc = call_begin(it, &cc, deadline_ms, err);
  if (rc < 0) return rc;
  char *out = NULL;
  rc = it->ns->api->eval_json(cc.th, cc.seq, expr, &out, err);
  call_end(it, &cc);
  return rc < 0 ? rc : parse_json(out, result);
}

int servd_interp__load_entry(servd_interp *it, const char *entry_point, servd_py_error *err) {
  return servd_interp__import_entry(it, entry_point, 0, err);
}

int servd_interp__import_entry(servd_interp *it, const char *entry_point, int64_t deadline_ms, servd_py_error *err) {
  call_ctx cc;
  int rc = call_begin(it, &cc, deadline_ms, err);
  if (rc < 0) return rc;
  rc = it->ns->api->load_entry(cc.th, cc.seq, entry_point, err);
  call_end(it, &cc);
  return rc;
}
