/* Sleep, level 1 (vLLM's POST /sleep?level=1): a language model with nothing to run empties its
 * prefix cache and gives its KV cache's memory back, keeping its weights and interpreters, so that
 * the next request runs at once (its blocks come back zeroed as they are written). The scheduler
 * thread does it, between steps, since the prefix cache is that thread's alone: the caller asks and
 * waits on the model's condition variable. On GPUs the device's KV memory stays allocated (only the
 * host cache's pages go): freeing and re-creating device memory is for a later change. */
#include "engine/engine.h"
#include "engine/engine_impl.h"

#include <pthread.h>
#include <stdio.h>

#include "servd/status.h"

enum { KV_RELEASE_NONE, KV_RELEASE_ASKED, KV_RELEASE_DONE };

int servd_model_release_kv(servd_model *m) {
  if (!m || m->kind != SERVD_MODEL_CAUSAL_LM || !m->thread_started) return 0;
  pthread_mutex_lock(&m->mu);
  while (m->kv_release != KV_RELEASE_NONE && !m->quit) pthread_cond_wait(&m->wake, &m->mu); /* another caller's */
  m->kv_release = KV_RELEASE_ASKED;
  pthread_cond_broadcast(&m->wake);
  while (m->kv_release == KV_RELEASE_ASKED && !m->quit) pthread_cond_wait(&m->wake, &m->mu);
  int rc = m->kv_release == KV_RELEASE_DONE ? m->kv_release_rc : SERVD_EBUSY;
  char msg[512];
  snprintf(msg, sizeof msg, "%s", m->kv_release_err);
  m->kv_release = KV_RELEASE_NONE;
  pthread_cond_broadcast(&m->wake);
  pthread_mutex_unlock(&m->mu);
  return rc ? servd_fail(rc, "model %s: releasing the KV cache: %s", m->name, msg) : 0;
}

void servd__kv_release_service(servd_model *m) {
  if (m->kv_release != KV_RELEASE_ASKED) return;
  int rc = 0;
  m->kv_release_err[0] = '\0';
  prefix_cache_clear(&m->sched.bm.pc);
  for (int r = 0; r < m->tp && !rc; r++) rc = servd_kv_cache_discard(m->kv[r]);
  if (rc) snprintf(m->kv_release_err, sizeof m->kv_release_err, "%s", servd_last_error());
  m->kv_cached = 0;
  m->kv_release_rc = rc;
  m->kv_release = KV_RELEASE_DONE;
  pthread_cond_broadcast(&m->wake);
}
