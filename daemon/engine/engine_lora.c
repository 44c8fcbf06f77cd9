/* LoRA adapters of a language model: the engine's functions (engine.h) over its registry
 * (lora_registry.h), a request's adapter and the step's groups (engine_lora.h). */
#include "engine/engine_lora.h"

#include <string.h>

#include "servd/ops.h"

_Static_assert(MPK_LORA_MAX_RANK == SERVD_LORA_MAX_RANK,
               "the adapter reader and the lora op must agree on the rank limit");
_Static_assert(MPK_LORA_MODULES == 7, "batch.lora holds 7 projections per layer (interp.h)");

static int max_loras_default = SERVD_DEFAULT_MAX_LORAS;
void servd_engine_set_max_loras(int n) { max_loras_default = n > 0 ? n : SERVD_DEFAULT_MAX_LORAS; }
int servd__max_loras_default(void) { return max_loras_default; }

void servd__model_lora_init(servd_model *m) {
  lora_registry_init(&m->loras, m->pkg, m->o.max_loras > 0 ? m->o.max_loras : max_loras_default, NULL);
}

typedef struct hook_job {
  servd_model *m;
  json_t *res;
  servd_py_error err;
} hook_job;

static int hook_run(void *arg) {
  hook_job *j = arg;
  json_t *args = json_array();
  int rc =
      servd_interp_call_json(servd_pool_get(j->m->pool, j->m->chat_interp), "lora_info", args, &j->res, 10000, &j->err);
  json_decref(args);
  return rc;
}

/* Whether the package's model code applies batch.lora (its entry object's lora_info hook, on the
 * interpreter that renders templates): model code packed before adapters existed would run every
 * adapter's requests as the base alone. Asked once per model. */
static int check_model_code(servd_model *m) {
  if (m->loras.code_checked) return m->loras.code_rc;
  hook_job j = {.m = m};
  memset(&j.err, 0, sizeof j.err);
  int rc = m->chat_interp >= 0 && m->ithread ? 0 : SERVD_EUNSUPPORTED;
  if (rc == 0) {
    pthread_mutex_lock(&m->chat_mu);
    rc = servd_interp_thread_run(m->ithread, hook_run, &j);
    pthread_mutex_unlock(&m->chat_mu);
  }
  bool ok = rc == 0 && json_is_true(json_object_get(j.res, "batch_lora"));
  json_decref(j.res);
  m->loras.code_rc = ok ? 0
                        : servd_fail(SERVD_EUNSUPPORTED,
                                     "model %s: its package's model code applies no LoRA adapters (%s%s%s): repack it "
                                     "with this servd's modelpkg",
                                     m->name, j.err.type[0] ? j.err.type : "no lora_info hook",
                                     j.err.type[0] ? ": " : "", j.err.type[0] ? j.err.message : "");
  snprintf(m->loras.code_err, sizeof m->loras.code_err, "%s", ok ? "" : servd_last_error());
  m->loras.code_checked = true;
  return m->loras.code_rc;
}

int servd_model_lora_load(servd_model *m, const char *name, const char *path) {
  if (m->kind != SERVD_MODEL_CAUSAL_LM || !m->loras.max_loras)
    return servd_fail(SERVD_EUNSUPPORTED, "LoRA adapter %s: model %s is not a language model", name, m->name);
  if (m->tp > 1 || m->gpus > 0)
    return servd_fail(SERVD_EUNSUPPORTED,
                      "LoRA adapter %s: model %s runs %s; adapters are applied on one CPU rank only (--tp 1, no "
                      "--gpus)",
                      name, m->name, m->gpus > 0 ? "on GPUs" : "with tensor parallelism");
  int rc = check_model_code(m);
  if (rc) return servd_fail(rc, "LoRA adapter %s: %s", name, m->loras.code_err);
  return lora_register(&m->loras, name, path);
}

int servd_model_lora_unload(servd_model *m, const char *name) {
  if (!m->loras.max_loras) return servd_fail(SERVD_EINVAL, "LoRA adapter %s: model %s has no adapters", name, m->name);
  return lora_unregister(&m->loras, name);
}

bool servd_model_has_lora(servd_model *m, const char *name) { return name && lora_known(&m->loras, name); }

int servd_model_lora_list(servd_model *m, servd_lora_info *out, int cap, int *max_loras) {
  if (max_loras) *max_loras = m->loras.max_loras;
  return lora_list(&m->loras, out, cap);
}

int servd__request_lora(servd_model *m, servd_request *r, const char *name) {
  r->p.lora = NULL; /* the caller's string: the adapter keeps its name */
  if (!name || !name[0]) return 0;
  if (!m->loras.max_loras) return servd_fail(SERVD_EINVAL, "model: no LoRA adapter is named '%s'", name);
  int rc = lora_acquire(&m->loras, name, &r->lora);
  if (rc) return rc;
  r->seq.table.adapter = r->lora->key;
  return 0;
}

void servd__plan_lora_groups(servd_model *m, servd_lora_group *groups, servd_forward_batch *b) {
  servd_scheduler *s = &m->sched;
  b->n_lora = 0;
  b->lora = groups;
  if (!m->loras.head) return;
  pthread_mutex_lock(&m->loras.mu); /* the running counts are read by lora_list */
  for (lora_adapter *a = m->loras.head; a; a = a->next) a->running = 0;
  const lora_adapter *prev = NULL;
  for (int i = 0; i < s->n_planned; i++) {
    const servd_request *r = s->planned[i]->owner;
    lora_adapter *a = r->lora;
    int first = s->step.q_start[i], n = s->step.q_len[i];
    if (a) a->running++;
    if (!a || n == 0) {
      prev = NULL;
      continue;
    }
    if (a == prev && b->n_lora && groups[b->n_lora - 1].first + groups[b->n_lora - 1].n == first) {
      groups[b->n_lora - 1].n += n;
      continue;
    }
    groups[b->n_lora] = a->group; /* held by r: resident until it ends */
    groups[b->n_lora].first = first;
    groups[b->n_lora].n = n;
    b->n_lora++;
    prev = a;
  }
  pthread_mutex_unlock(&m->loras.mu);
}
